"""``connection=`` (0.5.0): where and how the MySQL and PostgreSQL sinks connect, as one value,
read in one place (:class:`twophase.kit.sql.ConnectionUrl`): a URL, a :class:`twophase.Secret`
holding one (its password kept a reference, :class:`twophase.kit.sql.UrlPassword`, read at
every connection), or a mapping of the separate options, which keep working beside it. No
server: the settings are read as the sink is made, and a connection is faked where one is
opened (the real servers' tests write through such sinks: ``test_a_connection_url_*`` in
tests/sinks/mysql/test_mysql_sink.py and tests/sinks/postgres/test_postgres_sink.py).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

import sinks.mysql.connection
from sinks.mysql import MySQLXASink
from sinks.postgres import PostgresSink
from twophase import ConfigurationError, Secret
from twophase.kit import Credentials, Tls, reveal
from twophase.kit.sql import URL_QUERY_OPTIONS, UrlPassword

PASSWORD = "s3cr@t:/?#pw"
#: ``PASSWORD`` percent-encoded, as a URL holds it.
ENCODED = "s3cr%40t%3A%2F%3F%23pw"
ENV = "TWOPHASE_TEST_ORDERS_DB"

Make = Callable[..., Any]


def mysql(**options: Any) -> MySQLXASink:
    return MySQLXASink(table="orders", **options)


def postgres(**options: Any) -> PostgresSink:
    return PostgresSink(table="orders", **options)


#: Each system: its sink, its two schemes, its default port (the sinks themselves, not their
#: names, as parameters: a parameter naming a sink marks a test as needing its server).
SYSTEMS = [(mysql, ("mysql", "mariadb"), 3306), (postgres, ("postgresql", "postgres"), 5432)]


@pytest.fixture(params=SYSTEMS, ids=lambda system: system[0].__name__ + "-url")
def system(request: pytest.FixtureRequest) -> tuple[Make, tuple[str, str], int]:
    system: tuple[Make, tuple[str, str], int] = request.param
    return system


@pytest.fixture
def make(system: tuple[Make, tuple[str, str], int]) -> Make:
    return system[0]


@pytest.fixture
def scheme(system: tuple[Make, tuple[str, str], int]) -> str:
    return system[1][0]


# -- a URL -----------------------------------------------------------------------------------

def test_a_url_gives_every_connection_option_percent_decoded(
        system: tuple[Make, tuple[str, str], int]) -> None:
    make, schemes, _port = system
    for scheme in schemes:
        sink = make(connection=f"{scheme}://etl%2Bbot:{ENCODED}@DB.example:6000/shop%20eu"
                               "?tls=verify&ca_bundle=/etc/ssl/ca+1.pem&client_cert=/c.pem"
                               "&client_key=/k.pem&connect_timeout_s=2.5")
        server = sink.server
        assert (server.host, server.port, server.user, server.password, server.database) == (
            "db.example", 6000, "etl+bot", PASSWORD, "shop eu")
        assert server.tls == Tls("verify", "/etc/ssl/ca+1.pem", "/c.pem", "/k.pem")
        assert server.connect_timeout_s == 2.5


def test_a_url_leaves_out_what_has_a_default(system: tuple[Make, tuple[str, str], int]) -> None:
    make, (scheme, _other), port = system
    server = make(connection=f"{scheme}://etl@db/shop").server
    assert (server.host, server.port, server.user, server.password, server.database) == (
        "db", port, "etl", None, "shop")
    assert (server.tls, server.connect_timeout_s) == (Tls("verify"), 10)
    assert make(connection=f"{scheme.upper()}://etl:@[::1]/shop?tls=off").server.host == "::1"


def test_a_url_is_read_as_the_separate_options_are(make: Make, scheme: str) -> None:
    by_url = make(connection=f"{scheme}://etl:pw@db:7000/shop?tls=require")
    separate = make(host="db", port=7000, user="etl", password="pw", database="shop",
                    tls="require")
    assert by_url.server == separate.server
    assert repr(by_url) == repr(separate)
    assert by_url.default_namespace() == separate.default_namespace()  # names the database


@pytest.mark.parametrize(("url", "refusal"), [
    ("http://etl@db/shop", r"is not a .*:// URL \(its scheme is 'http'\).*Fix: write"),
    ("db:3306/shop", "is not a .*:// URL"),
    ("{scheme}://db/shop", r"names no user \(user@host\)"),
    ("{scheme}://etl@/shop", "names no host"),
    ("{scheme}://etl@db1,db2/shop", "names more than one host"),
    ("{scheme}://etl@db:99999/shop", "has a port that is no number"),
    ("{scheme}://etl:pa/ss@db/shop", r"names no user.*percent-encode"),
    ("{scheme}://etl:pa#ss@db/shop", r"is not a valid URL.*percent-encode"),
    ("{scheme}://etl@db", "names no database"),
    ("{scheme}://etl@db/shop/more", "names no database"),
    ("{scheme}://etl@db/shop?sslmode=verify-full",
     r"gives 'sslmode', which is not an option of its query\. Fix: use only tls, ca_bundle, "
     r"client_cert, client_key, connect_timeout_s"),
    ("{scheme}://etl@db/shop?tls=off&tls=verify", "gives tls twice or without a value"),
    ("{scheme}://etl@db/shop?ca_bundle=", "gives ca_bundle twice or without a value"),
    ("{scheme}://etl@db/shop?connect_timeout_s=soon", "connect_timeout_s='soon', not a positive"),
    ("{scheme}://etl@db/shop?connect_timeout_s=0", "connect_timeout_s='0', not a positive"),
    ("{scheme}://etl@db/shop?tls=preferred", "unknown tls='preferred'"),
    ("{scheme}://etl@db/shop?tls=off&ca_bundle=/ca.pem", "tls='off' does not verify"),
])
def test_a_url_that_cannot_be_read_is_refused_without_quoting_it(
        make: Make, scheme: str, url: str, refusal: str) -> None:
    with pytest.raises(ConfigurationError, match=refusal) as refused:
        make(connection=url.format(scheme=scheme))
    assert "pa/ss" not in str(refused.value) and "pa#ss" not in str(refused.value)


def test_the_query_takes_the_sinks_own_option_names() -> None:
    assert URL_QUERY_OPTIONS == ("tls", "ca_bundle", "client_cert", "client_key",
                                 "connect_timeout_s")


# -- a mapping -------------------------------------------------------------------------------

def test_a_mapping_gives_the_separate_options_by_name(make: Make) -> None:
    secret = Secret(env=ENV)
    sink = make(connection={"host": "db", "port": 7000, "user": "etl", "password": secret,
                            "database": "shop", "tls": "require", "connect_timeout_s": 3})
    assert sink.server == make(host="db", port=7000, user="etl", password=secret,
                               database="shop", tls="require", connect_timeout_s=3).server
    with pytest.raises(ConfigurationError, match=r"connection= has \['hots'\], which are not "
                                                 r"connection options.*Fix: use only host, port"):
        make(connection={"hots": "db", "user": "etl", "database": "shop"})
    with pytest.raises(ConfigurationError, match=r"connection= has no user, database\. Fix: "):
        make(connection={"host": "db"})
    with pytest.raises(ConfigurationError, match=r"connection= is a list"):
        make(connection=["db"])


# -- clashes, missing ------------------------------------------------------------------------

@pytest.mark.parametrize("option", [
    {"host": "db"}, {"port": 3306}, {"user": "etl"}, {"database": "shop"}, {"tls": "verify"},
    {"ca_bundle": "/ca.pem"}, {"client_cert": "/c.pem"}, {"client_key": "/k.pem"}])
def test_a_connection_and_a_separate_option_of_it_are_refused(
        make: Make, scheme: str, option: dict[str, Any]) -> None:
    name = next(iter(option))
    for connection in (f"{scheme}://etl@db/shop", {"host": "db", "user": "u", "database": "d"}):
        with pytest.raises(ConfigurationError, match=rf"connection= and {name}= are both given"
                                                     rf".*Fix: put {name}= into connection="):
            make(connection=connection, **option)


def test_a_former_tls_option_beside_a_connection_is_refused_too() -> None:
    with pytest.warns(DeprecationWarning, match="sslmode"), \
            pytest.raises(ConfigurationError, match="connection= and sslmode= are both given"):
        postgres(connection="postgresql://etl@db/shop", sslmode="require")
    with pytest.warns(DeprecationWarning, match="ssl_cert"), \
            pytest.raises(ConfigurationError, match="connection= and client_cert= are both"):
        mysql(connection="mysql://etl@db/shop", ssl_cert="/c.pem")


def test_a_password_apart_goes_with_a_connection_that_has_none(make: Make, scheme: str) -> None:
    secret = Secret(env=ENV)
    assert make(connection=f"{scheme}://etl@db/shop", password=secret).server.password == secret
    with pytest.raises(ConfigurationError, match=r"connection= gives password, and password= "
                                                 r"is given too\. Fix: give password once"):
        make(connection=f"{scheme}://etl:pw@db/shop", password=secret)
    with pytest.raises(ConfigurationError, match="connection= gives password, and password="):
        make(connection={"host": "db", "user": "etl", "password": "pw", "database": "shop"},
             password="pw")
    assert make(connection=f"{scheme}://etl@db/shop",
                connect_timeout_s=4).server.connect_timeout_s == 4
    with pytest.raises(ConfigurationError, match="gives connect_timeout_s, and connect_timeout"):
        make(connection=f"{scheme}://etl@db/shop?connect_timeout_s=2", connect_timeout_s=4)


def test_no_connection_and_no_host_names_both_ways(make: Make) -> None:
    with pytest.raises(ConfigurationError, match=r"neither connection= nor host= is given.*"
                                                 r"Fix: pass connection='.*://user@host"):
        make(user="etl", password="pw", database="shop")
    with pytest.raises(ConfigurationError, match=r"user=, database= not given\. Fix: pass them"):
        make(host="db")


def test_the_separate_options_work_as_before(
        system: tuple[Make, tuple[str, str], int]) -> None:
    make, _schemes, port = system
    sink = make(host="db", user="etl", password="pw", database="shop")
    assert (sink.server.port, sink.server.tls, sink.server.connect_timeout_s) == (
        port, Tls("verify"), 10)
    assert "host='db'" in repr(sink) and "password='***'" in repr(sink)


# -- a Secret holding the URL: the password stays a reference --------------------------------

def test_a_secret_url_is_read_now_and_its_password_where_it_is_used(
        make: Make, scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, f"{scheme}://etl:{ENCODED}@db:7000/shop?tls=require")
    sink = make(connection=Secret(env=ENV))
    server = sink.server
    assert (server.host, server.port, server.user, server.database, server.tls.mode) == (
        "db", 7000, "etl", "shop", "require")
    assert server.password == UrlPassword(env=ENV)
    assert reveal(server.password) == PASSWORD

    pickled = pickle.dumps(sink)
    for part in (PASSWORD, ENCODED, "s3cr"):
        assert part.encode() not in pickled
        assert part not in repr(sink)
    assert repr(sink).startswith(f"{type(sink).__name__}(connection=Secret(env='{ENV}', "
                                 "file=None), table=")
    assert "'db'" not in repr(sink) and "'etl'" not in repr(sink)

    used = Credentials(server.password)
    monkeypatch.setenv(ENV, f"{scheme}://etl:rotated@db:7000/shop?tls=require")
    assert used.rotated()
    assert reveal(pickle.loads(pickled).server.password) == "rotated"


def test_a_secret_url_file_works_as_a_password_file_does(make: Make, scheme: str,
                                                         tmp_path: Path) -> None:
    url = tmp_path / "orders-db"
    url.write_text(f"{scheme}://etl:{ENCODED}@db/shop\n")
    sink = make(connection=Secret(file=str(url)))
    assert reveal(sink.server.password) == PASSWORD
    assert repr(sink).startswith(f"{type(sink).__name__}(connection=Secret(env=None, "
                                 f"file='{url}'), table=")
    url.write_text(f"{scheme}://etl@db/shop")
    assert reveal(sink.server.password) == ""


def test_a_secret_url_without_a_password_takes_one_apart(
        make: Make, scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, f"{scheme}://etl@db/shop")
    monkeypatch.setenv("TWOPHASE_TEST_PW", PASSWORD)
    sink = make(connection=Secret(env=ENV), password=Secret(env="TWOPHASE_TEST_PW"))
    assert reveal(sink.server.password) == PASSWORD
    assert f"connection=Secret(env='{ENV}', file=None), password=Secret(env='TWOPHASE_TEST_PW'" \
        in repr(sink)
    monkeypatch.setenv(ENV, f"{scheme}://etl:pw@db/shop")
    with pytest.raises(ConfigurationError, match=rf"the connection URL in Secret\(env='{ENV}'"
                                                 r".*gives password, and password= is given"):
        make(connection=Secret(env=ENV), password="pw")


def test_a_secret_url_that_cannot_be_read_names_the_secret_not_the_url(
        make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "ftp://etl:hidden@db/shop")
    with pytest.raises(ConfigurationError, match=rf"the connection URL in Secret\(env='{ENV}', "
                                                 r"file=None\) is not a") as refused:
        make(connection=Secret(env=ENV))
    assert "hidden" not in str(refused.value)
    monkeypatch.delenv(ENV)
    with pytest.raises(ConfigurationError, match=rf"\${ENV} is not set"):
        make(connection=Secret(env=ENV))


def test_mysql_reads_a_rotated_secret_url_when_its_login_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As a rotated password Secret: the login refused with the old password is tried once more
    with the URL's new one (the fake server takes only the new)."""
    monkeypatch.setenv(ENV, "mysql://etl:old@db/shop")
    sink = mysql(connection=Secret(env=ENV))
    tried: list[str] = []

    def connect(tls: Tls, **options: Any) -> str:
        tried.append(options["password"])
        if options["password"] != "new":
            monkeypatch.setenv(ENV, "mysql://etl:new@db/shop")  # rotated meanwhile
            raise pymysql.err.OperationalError(1045, "Access denied for user 'etl'@'x'")
        return "connection"

    monkeypatch.setattr(sinks.mysql.connection, "open_connection", connect)
    assert sink.server.connect() == "connection"
    assert tried == ["old", "new"]


def test_postgres_reads_a_secret_urls_password_at_each_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "postgresql://etl:first@db/shop?tls=off")
    sink = postgres(connection=Secret(env=ENV))
    used: list[tuple[str, str]] = []

    def connect(**options: Any) -> str:
        used.append((options["password"], options["dbname"]))
        return "connection"

    monkeypatch.setattr(psycopg, "connect", connect)
    sink.server.connect()
    monkeypatch.setenv(ENV, "postgresql://etl:second@db/shop?tls=off")
    sink.server.connect()
    assert used == [("first", "shop"), ("second", "shop")]
