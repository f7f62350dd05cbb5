"""Security of the MySQL/MariaDB and PostgreSQL sinks against secured servers of the setups.

Each test runs for both sinks over their secured server (a certificate of the run's private
CA; MariaDB with ``require_secure_transport=ON``, PostgreSQL with ``hostssl`` lines only):

* TLS as the server itself sees it on the sink's session (``Ssl_cipher``, ``pg_stat_ssl``),
  and plain text refused by the server;
* verified TLS by default: a certificate of another CA, or for another host name, refused
  before anything is written, the error naming the cause and the option that relaxes it; a
  server without TLS refused by the default options (never a fall back to plain text);
* least privilege: one grant missing is refused at the start, named with its GRANT (the crash
  suites of both sinks, tests/sinks/mysql/test_mysql_crash.py and
  tests/sinks/postgres/test_postgres_crash.py, run as a user holding exactly the README's
  grants, on verified TLS, its password a ``Secret(file=...)``);
* secrets by reference: the pickled sink holds the reference only, a connection works with
  ``Secret(env=...)`` and ``Secret(file=...)``, and no error carries a password.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from setups import MySQLSetup, PostgresSetup, SinkSetup
from setups.least_privilege import least_privileged_target
from setups.servers.tls import WRONG_HOST, CertificateAuthority
from sinks.mysql import MySQLXASink
from sinks.postgres import PostgresSink
from twophase import ConfigurationError, Secret, TwoPhaseCommitSink, TwoPhaseError
from twophase.testing import Target
from twophase.testing.contract import ORDER_COLUMNS, context, orders

SECURED = ("secured_mysql_setup", "secured_postgres_setup")
PLAIN = ("mysql_setup", "postgres_setup")
#: The server's own view of the session's TLS: one row, (name, cipher).
TLS_VIEW = {
    "mysql": "SHOW SESSION STATUS LIKE 'Ssl_cipher'",
    "postgres": "SELECT 'cipher', cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
}
#: The option that turns TLS off, and the one that relaxes verification (named in errors).
TLS_OFF = {"mysql": {"tls": "off", "ca_bundle": None},
           "postgres": {"tls": "off", "ca_bundle": None}}
RELAXED = {"mysql": "tls='require'", "postgres": "tls='require'"}
#: How each TLS library words a refused certificate: (another CA, another host name).
REFUSED_BECAUSE = {
    "mysql": ("certificate verify failed", "mismatch, certificate is not valid for"),
    "postgres": ("certificate verify failed", f'"{WRONG_HOST}"'),
}
PASSWORD_ENV = "TWOPHASE_TEST_SQL_PASSWORD"
CANARY = "canary-9d3f1b-not-the-password"


@pytest.fixture(params=SECURED)
def secured(request: pytest.FixtureRequest) -> MySQLSetup | PostgresSetup:
    """The secured setup of each sink in turn."""
    setup: MySQLSetup | PostgresSetup = request.getfixturevalue(request.param)
    return setup


def _sink(target: Target, **changes: Any) -> TwoPhaseCommitSink[Any]:
    """The target's sink with ``changes`` over its options."""
    return replace(target, options={**target.options, **changes}).build()


def _attempt_write(sink: TwoPhaseCommitSink[Any]) -> None:
    """What a query does first: check the schema, then open, write and prepare a partition."""
    sink.check_schema(ORDER_COLUMNS)
    txn = sink.begin_transaction(context(columns=ORDER_COLUMNS))
    sink.write(txn, orders(0, 3))
    sink.pre_commit(txn)


def _refusal(sink: TwoPhaseCommitSink[Any]) -> str:
    """The ConfigurationError of a write attempt, with everything chained to it."""
    with pytest.raises(ConfigurationError) as refused:
        _attempt_write(sink)
    return "".join(traceback.format_exception(refused.value))


def _nothing_written(target: Target) -> None:
    assert target.visible() == [], "rows were written"
    assert target.in_doubt() == [], "a transaction was prepared"


# -- TLS -----------------------------------------------------------------------------------


def test_the_server_sees_tls_on_the_sinks_session_and_refuses_plain_text(
        secured: MySQLSetup | PostgresSetup) -> None:
    target = secured.new_target()
    sink: Any = target.build()
    with sink.server.session("reading the session's TLS") as conn, conn.cursor() as cursor:
        cursor.execute(TLS_VIEW[secured.name])
        (_name, cipher), = cursor.fetchall()
    assert cipher.startswith("TLS_"), f"the server sees no TLS on the sink's session: {cipher!r}"
    message = _refusal(_sink(target, **TLS_OFF[secured.name]))
    assert "tls='verify'" in message or "hostssl" in message
    _nothing_written(target)


@pytest.mark.parametrize("case", ["another CA", "another host name"])
def test_a_certificate_that_does_not_verify_is_refused_before_anything_is_written(
        secured: MySQLSetup | PostgresSetup, case: str, tls_ca: CertificateAuthority,
        other_ca: CertificateAuthority) -> None:
    target = secured.new_target()
    if case == "another CA":
        message = _refusal(_sink(target, ca_bundle=str(other_ca.cafile)))
    else:
        secured.server.present(tls_ca.issue("wrong-host", (WRONG_HOST,)))
        try:
            message = _refusal(target.build())
        finally:
            secured.server.present(tls_ca.issue("right-host"))
    because = REFUSED_BECAUSE[secured.name][case == "another host name"]
    assert because in message, f"the cause is not named: {message}"
    assert "ca_bundle=" in message and RELAXED[secured.name] in message, message
    _nothing_written(target)


@pytest.mark.parametrize("plain_setup", PLAIN)
def test_by_default_a_server_without_tls_is_refused_never_plain_text(
        plain_setup: str, request: pytest.FixtureRequest) -> None:
    setup: SinkSetup = request.getfixturevalue(plain_setup)
    target = setup.new_target()
    defaults = {name: value for name, value in target.options.items()
                if name not in ("tls", "ca_bundle")}
    message = _refusal(replace(target, options=defaults).build())
    assert "TLS" in message or "SSL" in message
    assert "tls='off'" in message, message
    _nothing_written(target)


# -- least privilege -----------------------------------------------------------------------


@pytest.mark.parametrize(("missing", "mode"), [
    (("table", "INSERT"), "insert"), (("markers", "UPDATE"), "insert"),
    (("table", "SELECT"), "upsert")])
def test_a_user_lacking_one_grant_is_refused_at_the_start_with_the_grant_named(
        secured: MySQLSetup | PostgresSetup, missing: tuple[str, str], mode: str) -> None:
    upsert = {"mode": mode} if secured.name == "mysql" else {"mode": mode, "key": ["event_id"]}
    target = least_privileged_target(secured, without=missing,
                                     **(upsert if mode == "upsert" else {}))
    message = _refusal(target.build())
    privilege = missing[1]
    assert f"lacks {privilege} ON" in message and f"GRANT {privilege} ON" in message, message
    _nothing_written(target)


# -- secrets -------------------------------------------------------------------------------


def test_a_password_by_reference_connects_and_is_never_pickled_nor_shown(
        secured: MySQLSetup | PostgresSetup, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    target = secured.new_target()
    password = target.options["password"]
    monkeypatch.setenv(PASSWORD_ENV, password)
    password_file = tmp_path / "password"
    password_file.write_text(password + "\n")
    for secret in (Secret(env=PASSWORD_ENV), Secret(file=str(password_file))):
        sink = _sink(target, password=secret)
        sink.check_schema(ORDER_COLUMNS)  # connects, reading the secret now
        assert password.encode() not in pickle.dumps(sink)
        assert password not in repr(sink) and repr(secret) in repr(sink)


def test_no_error_shows_the_password(secured: MySQLSetup | PostgresSetup) -> None:
    target = secured.new_target()
    sink = _sink(target, password=CANARY)
    with pytest.raises(TwoPhaseError) as denied:
        sink.check_schema(ORDER_COLUMNS)
    shown = "".join(traceback.format_exception(denied.value)) + repr(sink)
    assert CANARY not in shown
    assert "password" in shown.lower()


# -- options -------------------------------------------------------------------------------


@pytest.mark.parametrize(("factory", "options", "named"), [
    (MySQLXASink, {"tls": "preferred"}, "unknown tls='preferred'"),
    (MySQLXASink, {"tls": "require", "ca_bundle": "ca.pem"}, "tls='require' does not verify"),
    (MySQLXASink, {"connect_args": {"ssl_disabled": True}}, "connect_args ['ssl_disabled']"),
    (PostgresSink, {"tls": "prefer"}, "unknown tls='prefer'"),
    (PostgresSink, {"tls": "off", "client_cert": "c.pem"}, "tls='off' sends no certificate"),
    (PostgresSink, {"connect_args": {"sslmode": "allow"}}, "connect_args ['sslmode']"),
    (PostgresSink, {"connect_args": {"sslrootcert": "ca.pem"}}, "connect_args ['sslrootcert']"),
])
def test_no_option_turns_verification_into_a_silent_fall_back(
        factory: type[TwoPhaseCommitSink[Any]], options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        factory(host="db", user="etl", password="pw", database="shop", table="orders",
                **options)
    assert named in str(refused.value)
