"""Mutual TLS: the MySQL/MariaDB, PostgreSQL and Kafka sinks present a client certificate to a
server that requires one, over the session's secured servers (a certificate of the run's CA,
verified by the sink):

* MariaDB: the sink's user is created ``REQUIRE SUBJECT '/CN=<user>'`` and the server verifies
  client certificates against the run's CA (``--ssl-ca``);
* PostgreSQL: the sink's user logs in by a ``hostssl ... clientcert=verify-full`` line of
  ``pg_hba.conf`` (a member of its client-certificate role);
* Kafka: a SASL_SSL listener of the secured broker with ``ssl.client.auth=required``.

Each sink is given the certificate the same way, by every prebuilt sink's TLS options
``client_cert=`` and ``client_key=`` (:func:`client_certificate`).

Each server: with the certificate the sink's round trip commits rows seen exactly once by the
server itself, nothing left in doubt; without one, or with one of another CA, the sink refuses
at its check, naming the cause and the option, and nothing is written. No Spark: the sink is
driven as a task and the driver's committer drive it (:mod:`twophase.testing.contract`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from setups import MySQLSetup, PostgresSetup
from setups.base import Target
from setups.kafka import SecuredKafkaSetup
from setups.least_privilege import least_privileged_target
from setups.servers.kafka import APP_USER, HOST
from setups.servers.tls import CertificateAuthority, Issued
from twophase import CommitOutcome, ConfigurationError, RetryableError, TwoPhaseError
from twophase.testing.contract import ORDER_COLUMNS, commit, orders, prepare

ROWS = 3


def client_certificate(issued: Issued) -> dict[str, Any]:
    """Every sink's options for a client certificate (one TLS vocabulary)."""
    return {"client_cert": str(issued.certfile), "client_key": str(issued.keyfile)}


@dataclass(frozen=True)
class MutualTls:
    """One server that requires a client certificate of the sink's user: the target the sink
    writes, the user the certificate must name, how the sink is given a certificate, and what
    its refusals must say (regular expressions over the error)."""

    target: Target
    user: str
    certificate_options: Callable[[Issued], dict[str, Any]]
    #: The cause and the fix when no certificate is given.
    missing: str
    #: The cause and the fix when the certificate is of a CA the server does not trust.
    untrusted: str
    #: The errors then: a ConfigurationError on the server's TLS alert. MariaDB's alert may be
    #: overtaken by the reset of the socket it closes (the login unread): a lost connection
    #: then, as a crash is, so retryable, its fix naming the certificate too.
    untrusted_errors: tuple[type[TwoPhaseError], ...] = (ConfigurationError,)

    def sink(self, issued: Issued | None) -> Any:
        """The target's sink, presenting ``issued`` (None: no client certificate)."""
        extra = {} if issued is None else self.certificate_options(issued)
        return replace(self.target, options={**self.target.options, **extra}).build()


def _sql_case(setup: MySQLSetup | PostgresSetup, options: Callable[[Issued], dict[str, Any]],
              missing: str, untrusted: str,
              untrusted_errors: tuple[type[TwoPhaseError], ...] = (ConfigurationError,)
              ) -> MutualTls:
    """A least-privileged target whose user the server lets in with a client certificate
    only."""
    target = least_privileged_target(setup)
    user = target.options["user"]
    setup.server.require_client_certificate(user)
    return MutualTls(target, user, options, missing, untrusted, untrusted_errors)


def _mysql(request: pytest.FixtureRequest) -> MutualTls:
    return _sql_case(
        request.getfixturevalue("secured_mysql_setup"),
        client_certificate,
        missing=r"no client certificate.*\[1045\] Access denied.*Fix: .*the server requires a "
                r"client certificate.*pass client_cert= .* and client_key=",
        untrusted=r"client_cert=.*\[20(06|13)\] .*(ALERT_UNKNOWN_CA|SSLEOFError).*Fix: .*the "
                  r"server does not accept (the|that) client certificate.*pass client_cert= and "
                  r"client_key= a certificate issued",
        untrusted_errors=(ConfigurationError, RetryableError))


def _postgres(request: pytest.FixtureRequest) -> MutualTls:
    return _sql_case(
        request.getfixturevalue("secured_postgres_setup"),
        client_certificate,
        missing=r"requires a valid client certificate.*Fix: .*pass client_cert= .* and "
                r"client_key=",
        untrusted=r"alert unknown ca.*Fix: the server does not accept the client certificate.*"
                  r"client_cert=")


def _kafka(request: pytest.FixtureRequest) -> MutualTls:
    setup: SecuredKafkaSetup = request.getfixturevalue("kafka_secured_setup")
    port = setup.broker.client_cert_port
    assert port is not None, "the secured broker has no client-certificate listener"
    target = setup.new_target(bootstrap_servers=f"{HOST}:{port}")
    return MutualTls(
        target, APP_USER,
        client_certificate,
        missing=r"requires a client certificate and none was given.*Fix: .*pass client_cert= "
                r".* and client_key=",
        untrusted=r"refuses the client certificate client_cert=.*not issued by a CA the broker "
                  r"trusts.*Fix: pass client_cert=")


CASES = {"mysql": _mysql, "postgres": _postgres, "kafka": _kafka}


@pytest.fixture(params=sorted(CASES))
def mutual(request: pytest.FixtureRequest) -> MutualTls:
    """Each server in turn, requiring a client certificate of the sink's user."""
    return CASES[request.param](request)


def _nothing_written(target: Target) -> None:
    assert target.visible() == [], "rows were written"
    assert target.in_doubt() == [], "a transaction was left in doubt"


def test_with_its_client_certificate_the_sink_commits_exactly_once(
        mutual: MutualTls, tls_ca: CertificateAuthority) -> None:
    sink = mutual.sink(tls_ca.issue_client(mutual.user))
    sink.check_schema(ORDER_COLUMNS)
    handle = prepare(sink, orders(0, ROWS))
    assert mutual.target.visible() == [], "rows visible before the commit"
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert mutual.target.visible() == list(range(ROWS))
    assert mutual.target.in_doubt() == []


def test_without_a_client_certificate_the_sink_is_refused_at_its_check(
        mutual: MutualTls) -> None:
    with pytest.raises(ConfigurationError, match=mutual.missing):
        mutual.sink(None).check_schema(ORDER_COLUMNS)
    _nothing_written(mutual.target)


def test_a_client_certificate_of_another_ca_is_refused_at_the_check(
        mutual: MutualTls, other_ca: CertificateAuthority) -> None:
    with pytest.raises(mutual.untrusted_errors, match=mutual.untrusted):
        mutual.sink(other_ca.issue_client(mutual.user)).check_schema(ORDER_COLUMNS)
    _nothing_written(mutual.target)
