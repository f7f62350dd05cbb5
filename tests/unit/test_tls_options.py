"""One TLS vocabulary for every prebuilt sink (0.5.0): ``tls=``, ``ca_bundle=``,
``client_cert=``, ``client_key=``, read the same way by MySQL, PostgreSQL, Kafka, S3 and HTTP;
the former spellings still work with a DeprecationWarning naming the new option, and both given
at once is refused. No server: the options are checked and translated into each client
library's own as the sink is made (the secured servers' suites, ``test_mutual_tls``,
``test_sql_security``, ``test_error_fixes`` and the Kafka, S3 and HTTP security tests, connect
with them).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sinks.http import HttpSink
from sinks.kafka import KafkaSink
from sinks.mysql import MySQLXASink
from sinks.postgres import PostgresSink
from sinks.s3 import S3Sink
from twophase.errors import ConfigurationError
from twophase.kit import Tls, TlsMode

SQL: dict[str, Any] = {"host": "db", "user": "etl", "password": "pw", "database": "shop",
                       "table": "orders"}


def mysql(**options: Any) -> MySQLXASink:
    return MySQLXASink(**SQL, **options)


def postgres(**options: Any) -> PostgresSink:
    return PostgresSink(**SQL, **options)


def kafka(**options: Any) -> KafkaSink:
    return KafkaSink("broker:9093", "orders", **options)


def s3(**options: Any) -> S3Sink:
    return S3Sink("bucket", "orders", **{"endpoint_url": "https://store:9000", **options})


def http(staging: Path, **options: Any) -> HttpSink:
    return HttpSink("https://receiver/orders", staging=str(staging), **options)


def tls_of(sink: Any) -> Tls:
    """The sink's TLS settings, wherever its connection settings keep them."""
    settings = getattr(sink, "server", None) or sink.settings
    if isinstance(tls := getattr(settings, "tls", None), Tls):
        return tls
    if hasattr(settings, "ssl_cafile"):  # Kafka keeps kafka-python's fields
        mode: TlsMode = ("off" if "SSL" not in settings.security_protocol
                         else "verify" if settings.ssl_verify else "require")
        return Tls(mode, settings.ssl_cafile, settings.ssl_certfile, settings.ssl_keyfile)
    return Tls(settings.tls, settings.ca_bundle, settings.client_cert, settings.client_key)


@pytest.fixture(params=["mysql", "postgres", "kafka", "s3", "http"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    factories: dict[str, Callable[..., Any]] = {
        "mysql": mysql, "postgres": postgres, "kafka": kafka, "s3": s3,
        "http": lambda **options: http(tmp_path, **options)}
    return factories[request.param]


def test_every_prebuilt_sink_takes_the_same_four_tls_options() -> None:
    for sink in (MySQLXASink, PostgresSink, KafkaSink, S3Sink, HttpSink):
        parameters = inspect.signature(sink.__init__).parameters
        assert {"tls", "ca_bundle", "client_cert", "client_key"} <= set(parameters), sink


def test_each_sink_reads_them_alike(make: Callable[..., Any]) -> None:
    sink = make(tls="verify", ca_bundle="/ca.pem", client_cert="/c.pem", client_key="/k.pem")
    assert tls_of(sink) == Tls("verify", "/ca.pem", "/c.pem", "/k.pem")
    assert tls_of(make(tls="require")).mode == "require"


@pytest.mark.parametrize(("options", "refusal"), [
    ({"tls": "preferred"}, "unknown tls='preferred'"),
    ({"tls": "require", "ca_bundle": "/ca.pem"}, "tls='require' does not verify"),
    ({"client_key": "/k.pem"}, "client_key= is given without client_cert="),
])
def test_contradicting_tls_options_are_refused_by_every_sink(
        make: Callable[..., Any], options: dict[str, Any], refusal: str) -> None:
    with pytest.raises(ConfigurationError, match=refusal):
        make(**options)


def test_plain_text_is_refused_for_an_https_address(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="tls='off' but 'https://store:9000'"):
        s3(tls="off")
    with pytest.raises(ConfigurationError, match="https:// address"):
        http(tmp_path, tls="off")
    assert tls_of(S3Sink("bucket", endpoint_url="http://store:9000", tls="off")).mode == "off"


def test_kafka_is_plain_text_unless_told_and_sasl_is_its_own_option() -> None:
    assert kafka().settings.security_protocol == "PLAINTEXT"
    assert kafka(tls="verify").settings.security_protocol == "SSL"
    secured = kafka(tls="verify", sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="etl",
                    sasl_plain_password="pw")
    assert secured.settings.security_protocol == "SASL_SSL"
    assert kafka(sasl_mechanism="PLAIN").settings.security_protocol == "SASL_PLAINTEXT"
    unverified = kafka(tls="require").settings
    assert unverified.librdkafka_configs()["enable.ssl.certificate.verification"] == "false"
    assert unverified.client_configs()["ssl_check_hostname"] is False


@pytest.mark.parametrize(("make_former", "former", "expected"), [
    (lambda: mysql(ssl_cert="/c.pem", ssl_key="/k.pem"), "ssl_cert",
     Tls("verify", None, "/c.pem", "/k.pem")),
    (lambda: postgres(sslmode="require"), "sslmode", Tls("require")),
    (lambda: postgres(sslmode="disable"), "sslmode", Tls("off")),
    (lambda: postgres(connect_args={"sslcert": "/c.pem", "sslkey": "/k.pem"}),
     "connect_args['sslcert']", Tls("verify", None, "/c.pem", "/k.pem")),
    (lambda: kafka(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", ssl_cafile="/ca.pem",
                   ssl_certfile="/c.pem", ssl_keyfile="/k.pem"), "ssl_cafile",
     Tls("verify", "/ca.pem", "/c.pem", "/k.pem")),
    (lambda: s3(verify=False), "verify=", Tls("require")),
], ids=["mysql", "postgres-require", "postgres-disable", "postgres-connect-args", "kafka",
        "s3"])
def test_the_former_spellings_work_and_warn_naming_the_new_option(
        make_former: Callable[[], Any], former: str, expected: Tls) -> None:
    with pytest.warns(DeprecationWarning,
                      match=f"{re.escape(former)}.*deprecated.*0.6.0") as warned:
        sink = make_former()
    assert tls_of(sink) == expected
    assert all(__file__ == w.filename for w in warned), \
        [(w.filename, str(w.message)) for w in warned]


def test_the_former_verify_of_http_works_and_warns(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match="verify=.*deprecated.*pass tls="):
        sink = http(tmp_path, verify=False)
    assert sink.settings.tls_options == {"verify": False, "cert": None}


def test_postgres_verify_ca_keeps_its_meaning() -> None:
    with pytest.warns(DeprecationWarning):
        sink = postgres(sslmode="verify-ca", ca_bundle="/ca.pem")
    assert sink.server.libpq_tls() == {"sslmode": "verify-ca", "sslrootcert": "/ca.pem"}
    assert postgres(client_cert="/c.pem", client_key="/k.pem").server.libpq_tls() == {
        "sslmode": "verify-full", "sslcert": "/c.pem", "sslkey": "/k.pem"}


@pytest.mark.parametrize("make_both", [
    lambda: mysql(ssl_cert="/a.pem", client_cert="/b.pem"),
    lambda: kafka(ssl_cafile="/a.pem", ca_bundle="/b.pem"),
    lambda: kafka(security_protocol="SSL", tls="verify"),
])
def test_a_former_and_a_new_name_at_once_are_refused(make_both: Callable[[], Any]) -> None:
    with pytest.raises(ConfigurationError, match="both given"):
        make_both()
