"""Every TLS and connection error of the SQL sinks, its fix followed: never a circle.

For each way a connection to a private server of the setups is refused (PostgreSQL's and
MariaDB's, plain and secured), the test takes the error's fix at its word and does what it
says: every ``tls='...'`` it names (found in the text, so a mode added to a
fix later is followed too; a verifying mode with ``ca_bundle=`` the CA that issued the
server's certificate), and each other way out it names (``ca_bundle=``, a host name the
certificate holds, TLS turned on at the server, a ``pg_hba.conf`` line, the right password or
database), done for real on the server where the fix says the server must change. After each,
the error must have changed (another fix, or no error), and at least one way out connects.
A fix that names a mode giving the same error (``tls='require'`` to a server without TLS)
fails here.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from setups.servers.mariadb import MariaDBServer
from setups.servers.postgres import HOSTSSL_ONLY_HBA, PostgresServer
from setups.servers.tls import CertificateAuthority
from sinks.mysql.connection import Server as MySQLServer
from sinks.mysql.connection import close_quietly
from sinks.postgres.connection import Server as PgServer
from sinks.postgres.connection import tls_settings as pg_tls_settings
from twophase import TwoPhaseError
from twophase.kit import Tls

#: A mode a fix names: ``tls='off'``.
NAMED_MODE = re.compile(r"\b(tls)='([a-z-]+)'")
#: The sinks' default modes (verified TLS).
PG_DEFAULT = MYSQL_DEFAULT = "verify"
#: The secured PostgreSQL's pg_hba.conf with no line a TCP client matches.
NO_TCP_LINE_HBA = "local all all trust\n"


@dataclass(frozen=True)
class Refusal:
    """A refused connection as its user sees it: the kind of error and the fix."""

    kind: str
    fix: str


#: What a connection attempt ends in: None if it connected.
Outcome = Refusal | None
#: The other ways out of a case: what the fix must say, and doing it (the outcome after).
WaysOut = Mapping[str, Callable[[], Outcome]]


def _attempt(connect: Callable[[], Any], close: Callable[[Any], None]) -> Outcome:
    try:
        close(connect())
    except TwoPhaseError as error:
        return Refusal(type(error).__name__, error.fix or "")
    return None


def pg_attempt(server: PostgresServer, **options: Any) -> Outcome:
    """Connect as the sink does to ``server``, ``options`` over the test user's."""
    settings = {**server.params.sink_options(), "ca_bundle": None, **options}
    settings.update(pg_tls_settings(settings.pop("tls"), settings.pop("ca_bundle"), None, None))
    return _attempt(PgServer(**settings).connect, lambda conn: conn.close())


def pg_attempt_on(server: PostgresServer) -> Callable[..., Outcome]:
    return lambda **options: pg_attempt(server, **options)


def mysql_attempt(server: MariaDBServer, *, tls: str = MYSQL_DEFAULT,
                  ca_bundle: str | None = None, **options: Any) -> Outcome:
    """Connect as the sink does to ``server``, ``options`` over the test user's."""
    settings = {**server.params.kwargs(), **options}
    settings.pop("ca_bundle", None)
    settings["tls"] = Tls(tls, ca_bundle)  # type: ignore[arg-type]
    return _attempt(MySQLServer(**settings).connect, close_quietly)


def mysql_attempt_on(server: MariaDBServer) -> Callable[..., Outcome]:
    return lambda **options: mysql_attempt(server, **options)


def follow_every_fix(attempt: Callable[..., Outcome], refused: dict[str, Any], *,
                     ca: CertificateAuthority, ways_out: WaysOut | None = None) -> None:
    """``attempt(**refused)`` is refused; each mode its fix names and each of ``ways_out``
    (its words must be in the fix) changes the error, and at least one connects."""
    before = attempt(**refused)
    assert before is not None, f"connected with {refused}"
    outcomes = {}
    for words, follow in (ways_out or {}).items():
        assert words in before.fix, f"the fix does not say {words!r}: {before.fix}"
        outcomes[words] = follow()
    for option, mode in NAMED_MODE.findall(before.fix):
        if mode != refused[option]:
            verified = mode.startswith("verify")
            outcomes[f"{option}={mode!r}"] = attempt(
                **{**refused, option: mode, "ca_bundle": str(ca.cafile) if verified else None})
    for followed, after in outcomes.items():
        assert after != before, (
            f"following {followed} gives the same error and fix again: {before.fix}")
    assert None in outcomes.values(), f"no way out of {before.fix} connects: {outcomes}"


@contextlib.contextmanager
def presenting(server: PostgresServer | MariaDBServer, ca: CertificateAuthority,
               hosts: tuple[str, ...]) -> Iterator[None]:
    """The secured ``server`` presents a certificate for ``hosts`` only in the block."""
    server.present(ca.issue(f"only-{'-'.join(hosts)}", hosts))
    try:
        yield
    finally:
        server.present(ca.issue("right-host"))


# -- PostgreSQL ------------------------------------------------------------------------------


def test_pg_a_server_without_tls(postgres: PostgresServer, tls_ca: CertificateAuthority) -> None:
    def tls_on_at_the_server() -> Outcome:
        with postgres.tls_turned_on(tls_ca.issue("turned-on")):
            return pg_attempt(postgres, tls=PG_DEFAULT, ca_bundle=str(tls_ca.cafile))

    attempt = pg_attempt_on(postgres)
    follow_every_fix(attempt, {"tls": "require"}, ca=tls_ca)
    follow_every_fix(attempt, {"tls": PG_DEFAULT}, ca=tls_ca,
                     ways_out={"'hostssl' line": tls_on_at_the_server})


def test_pg_no_ca_given(secured_postgres: PostgresServer, tls_ca: CertificateAuthority) -> None:
    attempt = pg_attempt_on(secured_postgres)
    follow_every_fix(attempt, {"tls": PG_DEFAULT}, ca=tls_ca, ways_out={
        "ca_bundle=": lambda: attempt(tls=PG_DEFAULT, ca_bundle=str(tls_ca.cafile))})


def test_pg_a_certificate_of_another_ca(secured_postgres: PostgresServer,
                                        tls_ca: CertificateAuthority,
                                        other_ca: CertificateAuthority) -> None:
    attempt = pg_attempt_on(secured_postgres)
    follow_every_fix(attempt, {"tls": PG_DEFAULT, "ca_bundle": str(other_ca.cafile)},
                     ca=tls_ca, ways_out={"ca_bundle=": lambda: attempt(
                         tls=PG_DEFAULT, ca_bundle=str(tls_ca.cafile))})


def test_pg_a_certificate_for_another_host_name(secured_postgres: PostgresServer,
                                                tls_ca: CertificateAuthority) -> None:
    attempt = pg_attempt_on(secured_postgres)
    with presenting(secured_postgres, tls_ca, ("localhost",)):
        follow_every_fix(attempt, {"tls": PG_DEFAULT, "ca_bundle": str(tls_ca.cafile)},
                         ca=tls_ca, ways_out={"connect by a name it holds": lambda: attempt(
                             host="localhost", ca_bundle=str(tls_ca.cafile))})


def test_pg_plain_text_to_a_server_that_takes_tls_only(secured_postgres: PostgresServer,
                                                       tls_ca: CertificateAuthority) -> None:
    follow_every_fix(pg_attempt_on(secured_postgres), {"tls": "off"}, ca=tls_ca)


def test_pg_no_pg_hba_line_for_tls(secured_postgres: PostgresServer,
                                   tls_ca: CertificateAuthority) -> None:
    attempt = pg_attempt_on(secured_postgres)

    def hostssl_line_added() -> Outcome:
        with secured_postgres.hba(HOSTSSL_ONLY_HBA):
            return attempt(tls=PG_DEFAULT, ca_bundle=str(tls_ca.cafile))

    with secured_postgres.hba(NO_TCP_LINE_HBA):
        follow_every_fix(attempt, {"tls": PG_DEFAULT, "ca_bundle": str(tls_ca.cafile)},
                         ca=tls_ca, ways_out={"'hostssl": hostssl_line_added})


@pytest.mark.parametrize(("wrong", "fix_says"), [
    ({"password": "not-the-password"}, "user and password"),
    ({"database": "no_such_database"}, "database=")])
def test_pg_a_wrong_login(postgres: PostgresServer, tls_ca: CertificateAuthority,
                          wrong: dict[str, str], fix_says: str) -> None:
    attempt = pg_attempt_on(postgres)
    follow_every_fix(attempt, {"tls": "off", **wrong}, ca=tls_ca,
                     ways_out={fix_says: lambda: attempt(tls="off")})


# -- MySQL (MariaDB) -------------------------------------------------------------------------


def test_mysql_a_server_without_tls(mariadb: MariaDBServer,
                                    tls_ca: CertificateAuthority) -> None:
    attempt = mysql_attempt_on(mariadb)

    def tls_on_at_the_server() -> Outcome:
        with mariadb.tls_turned_on(tls_ca.issue("mariadb-turned-on")):
            return attempt(tls=MYSQL_DEFAULT, ca_bundle=str(tls_ca.cafile))

    follow_every_fix(attempt, {"tls": "require"}, ca=tls_ca)
    follow_every_fix(attempt, {"tls": MYSQL_DEFAULT}, ca=tls_ca,
                     ways_out={"configure TLS on the server": tls_on_at_the_server})


def test_mysql_no_ca_given_or_another_ca(secured_mariadb: MariaDBServer,
                                         tls_ca: CertificateAuthority,
                                         other_ca: CertificateAuthority) -> None:
    attempt = mysql_attempt_on(secured_mariadb)
    for given in (None, str(other_ca.cafile)):
        follow_every_fix(attempt, {"tls": MYSQL_DEFAULT, "ca_bundle": given}, ca=tls_ca,
                         ways_out={"ca_bundle=": lambda: attempt(
                             tls=MYSQL_DEFAULT, ca_bundle=str(tls_ca.cafile))})


def test_mysql_a_certificate_for_another_host_name(secured_mariadb: MariaDBServer,
                                                   tls_ca: CertificateAuthority) -> None:
    attempt = mysql_attempt_on(secured_mariadb)
    with presenting(secured_mariadb, tls_ca, ("localhost",)):
        follow_every_fix(attempt, {"tls": MYSQL_DEFAULT, "ca_bundle": str(tls_ca.cafile)},
                         ca=tls_ca, ways_out={"connect by a name it holds": lambda: attempt(
                             host="localhost", ca_bundle=str(tls_ca.cafile))})


def test_mysql_plain_text_to_a_server_that_takes_tls_only(
        secured_mariadb: MariaDBServer, tls_ca: CertificateAuthority) -> None:
    follow_every_fix(mysql_attempt_on(secured_mariadb), {"tls": "off"}, ca=tls_ca)


def test_mysql_a_wrong_password(mariadb: MariaDBServer, tls_ca: CertificateAuthority) -> None:
    attempt = mysql_attempt_on(mariadb)
    follow_every_fix(attempt, {"tls": "off", "password": "not-the-password"}, ca=tls_ca,
                     ways_out={"user and password": lambda: attempt(tls="off")})


def test_mysql_a_database_that_does_not_exist(mariadb: MariaDBServer,
                                              tls_ca: CertificateAuthority) -> None:
    """MariaDB answers 1044 (access denied), not 1049, to a user without privileges there."""
    attempt = mysql_attempt_on(mariadb)
    missing, user = "no_such_database", mariadb.params.user

    def granted() -> Outcome:
        mariadb.root_sql(f"GRANT ALL ON `{missing}`.* TO '{user}'@'%'")
        try:
            return attempt(tls="off", database=missing)
        finally:
            mariadb.root_sql(f"REVOKE ALL ON `{missing}`.* FROM '{user}'@'%'")

    follow_every_fix(attempt, {"tls": "off", "database": missing}, ca=tls_ca, ways_out={
        "GRANT": granted, "database name": lambda: attempt(tls="off")})
