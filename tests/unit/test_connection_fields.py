"""``connection=`` of the Kafka and S3 sinks (0.5.0): their connection options as one value,
read in one place (:class:`twophase.kit.ConnectionFields`, whose mappings and refusals the MySQL
and PostgreSQL sinks' :class:`twophase.kit.sql.ConnectionUrl` takes too): a mapping of the
sink's own option names, or a :class:`twophase.Secret` holding a JSON object of them whose
secret fields stay references (:class:`twophase.kit.SecretField`) read at every connection.
The separate options keep working beside it. No server: the settings are read as the sink is
made (the real servers' tests write through such sinks: ``test_a_connection_in_a_secret_*``
in tests/sinks/kafka/test_kafka_security.py and tests/sinks/s3/test_s3_sink.py).
"""

from __future__ import annotations

import json
import logging
import pickle
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sinks.kafka import KafkaSink
from sinks.kafka.connection import CONNECTION_OPTIONS as KAFKA_OPTIONS
from sinks.mysql import MySQLXASink
from sinks.postgres import PostgresSink
from sinks.s3 import S3Sink
from sinks.s3.sink import CONNECTION_OPTIONS as S3_CONNECTION_OPTIONS
from twophase import ConfigurationError, Secret
from twophase.kit import ConnectionFields, Credentials, SecretField, Tls, reveal

ENV = "TWOPHASE_TEST_CONNECTION"
PASSWORD = 'pa"ss\\w0rd-7f3e'  # JSON escapes it: found neither as written nor as escaped
ROTATED = "rotated-pw-91c2"


@dataclass(frozen=True)
class System:
    """A sink with ``connection=``: how to make one, a full connection of it (its secret
    fields :data:`PASSWORD`), the settings it reads them into, and one secret field."""

    name: str
    make: Callable[..., Any]
    connection: Mapping[str, Any]
    secret: str

    def held(self, **changed: Any) -> str:
        """The connection as the JSON object a secret holds."""
        return json.dumps({**self.connection, **changed})


def kafka(**options: Any) -> KafkaSink:
    return KafkaSink(topic="orders", **options)


def s3(**options: Any) -> S3Sink:
    return S3Sink("bucket", "orders", **options)


SYSTEMS = {
    "kafka": System("KafkaSink", kafka, {"bootstrap_servers": "b1:9093,b2:9093", "tls": "verify",
                            "ca_bundle": "/etc/ssl/kafka-ca.pem",
                            "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "etl",
                            "sasl_plain_password": PASSWORD, "connect_timeout_ms": 5000},
                    "sasl_plain_password"),
    "s3": System("S3Sink", s3, {"endpoint_url": "https://store:9000", "region": "eu-west-1",
                      "path_style": True, "access_key_id": "AKIDEXAMPLE",
                      "secret_access_key": PASSWORD, "session_token": f"token-{PASSWORD}",
                      "ca_bundle": "/etc/ssl/store-ca.pem"},
                 "secret_access_key"),
}


@pytest.fixture(params=list(SYSTEMS.values()), ids=list(SYSTEMS))
def system(request: pytest.FixtureRequest) -> System:
    """Each system (a parameter that is no sink's name: no server is marked as taken)."""
    system: System = request.param
    return system


def separately(system: System, **changed: Any) -> Any:
    """The sink of ``system``'s connection given as separate options."""
    return system.make(**{**system.connection, **changed})


def leaked(sink: Any, *texts: str) -> list[str]:
    """Where the clear password shows: the sink's and its settings' repr, its pickle, ``texts``."""
    shown = [repr(sink), repr(sink.settings), pickle.dumps(sink).decode("latin-1"), *texts]
    return [text for text in shown for clear in (PASSWORD, json.dumps(PASSWORD)[1:-1])
            if clear in text]


# -- a mapping -------------------------------------------------------------------------------

def test_a_mapping_gives_the_separate_options_by_name(system: System) -> None:
    secret = Secret(env=ENV)
    by_mapping = system.make(connection={**system.connection, system.secret: secret})
    assert by_mapping.settings == separately(system, **{system.secret: secret}).settings


def test_connection_text_is_the_json_object_in_clear(system: System) -> None:
    """A config file's ``connection = { env = "..." }`` reaches the sink read (``cleanup``,
    ``status`` resolve every reference): the JSON text itself."""
    assert system.make(connection=system.held()).settings == separately(system).settings


def test_the_options_a_connection_takes_are_the_sinks_own_names() -> None:
    assert KAFKA_OPTIONS == ("bootstrap_servers", "tls", "ca_bundle", "client_cert",
                             "client_key", "sasl_mechanism", "sasl_plain_username",
                             "sasl_plain_password", "ssl_password", "ssl_check_hostname",
                             "client_id", "request_timeout_ms", "connect_timeout_ms",
                             "max_block_ms", "extra")
    assert S3_CONNECTION_OPTIONS == ("endpoint_url", "region", "path_style", "access_key_id",
                                     "secret_access_key", "session_token", "tls", "ca_bundle",
                                     "client_cert", "client_key")


# -- a Secret holding a JSON object: its secret fields stay references -----------------------

def test_a_secrets_options_are_read_now_and_its_secret_fields_where_they_are_used(
        system: System, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(ENV, system.held())
    sink = system.make(connection=Secret(env=ENV))
    settings = sink.settings
    assert getattr(settings, system.secret) == SecretField(env=ENV, key=system.secret)
    assert settings == separately(system, **{
        name: SecretField(env=ENV, key=name) for name in ("sasl_plain_password",
                                                          "access_key_id", "secret_access_key",
                                                          "session_token")
        if name in system.connection}).settings
    assert reveal(getattr(settings, system.secret)) == PASSWORD
    assert leaked(sink, caplog.text) == []

    pickled = pickle.dumps(sink)
    used = Credentials(*settings.secrets)
    monkeypatch.setenv(ENV, system.held(**{system.secret: ROTATED}))
    assert used.rotated()  # a client made with the old one is made again if refused
    assert reveal(getattr(pickle.loads(pickled).settings, system.secret)) == ROTATED


def test_the_clients_are_made_with_the_secrets_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, SYSTEMS["kafka"].held())
    settings = kafka(connection=Secret(env=ENV)).settings
    assert settings.client_configs()["sasl_plain_password"] == PASSWORD
    assert settings.librdkafka_configs()["sasl.password"] == PASSWORD
    assert settings.client_configs()["bootstrap_servers"] == ["b1:9093", "b2:9093"]
    monkeypatch.setenv(ENV, SYSTEMS["s3"].held())
    secrets = s3(connection=Secret(env=ENV)).settings.secrets
    assert [reveal(secret) for secret in secrets] == ["AKIDEXAMPLE", PASSWORD,
                                                      f"token-{PASSWORD}"]


def test_a_secret_file_works_as_a_password_file_does(system: System, tmp_path: Path) -> None:
    held = tmp_path / "connection.json"
    held.write_text(system.held() + "\n")
    sink = system.make(connection=Secret(file=str(held)))
    assert reveal(getattr(sink.settings, system.secret)) == PASSWORD
    assert leaked(sink) == []
    held.write_text(system.held(**{system.secret: ROTATED}))
    assert reveal(getattr(sink.settings, system.secret)) == ROTATED


def test_a_secret_without_a_password_takes_one_apart(system: System,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, json.dumps({name: value for name, value in system.connection.items()
                                        if name != system.secret}))
    apart = Secret(env="TWOPHASE_TEST_PASSWORD_APART")
    sink = system.make(connection=Secret(env=ENV), **{system.secret: apart})
    assert getattr(sink.settings, system.secret) == apart


def test_a_secret_field_gone_or_unreadable_at_a_connection_is_named_not_quoted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    field = SecretField(env=ENV, key="sasl_plain_password")
    monkeypatch.setenv(ENV, json.dumps({"sasl_plain_username": PASSWORD}))
    with pytest.raises(ConfigurationError, match=rf"the connection settings in Secret\(env="
                                                 rf"'{ENV}', file=None\) hold no "
                                                 r"sasl_plain_password \(a JSON string\)") as gone:
        field.reveal()
    monkeypatch.setenv(ENV, f'{{"sasl_plain_password": "{PASSWORD}"')
    with pytest.raises(ConfigurationError, match=r"is not valid JSON") as broken:
        field.reveal()
    for refused in (gone, broken):
        assert PASSWORD not in str(refused.value) and refused.value.__context__ is None
    with pytest.raises(ConfigurationError, match="names the key"):
        SecretField(env=ENV)


# -- refusals: named, never quoting a value --------------------------------------------------

def test_an_option_given_in_both_is_refused_naming_it_and_the_fix(
        system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    name = next(iter(system.connection))
    value = system.connection[name]
    with pytest.raises(ConfigurationError, match=rf"connection= gives {name}, and {name}= is "
                                                 rf"given too\. Fix: give {name} once: in "
                                                 r"connection=, or \(kept apart\) as"):
        system.make(connection=system.connection, **{name: value})
    monkeypatch.setenv(ENV, system.held())
    with pytest.raises(ConfigurationError, match=rf"the connection settings in Secret\(env="
                                                 rf"'{ENV}', file=None\) gives {system.secret}, "
                                                 rf"and {system.secret}= is given too") as both:
        system.make(connection=Secret(env=ENV), **{system.secret: PASSWORD})
    assert PASSWORD not in f"{both.value} {both.value.fix}"


def test_an_unknown_option_is_refused_listing_those_it_takes(system: System) -> None:
    names = ", ".join(KAFKA_OPTIONS if system.make is kafka else S3_CONNECTION_OPTIONS)
    with pytest.raises(ConfigurationError, match=r"connection= has \['hots', 'verify'\], which "
                                                 r"are not connection options\. Fix: use only "
                                                 + re.escape(names)):
        system.make(connection={**system.connection, "hots": "x", "verify": False})


def test_a_former_option_name_is_no_connection_option() -> None:
    with pytest.raises(ConfigurationError, match=r"has \['security_protocol'\], which are not"):
        kafka(connection={"bootstrap_servers": "b:9092", "security_protocol": "SSL"})


def test_json_that_is_no_object_names_the_secret_and_never_quotes_it(
        system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    value = json.dumps(PASSWORD)
    for held, refusal in ((f'{{"{system.secret}": {value}, }}', r"is not valid JSON \("
                           r"Expecting property name enclosed in double quotes: line 1 column"),
                          (f"[{value}]", "is a JSON list, not an object"),
                          ("", r"is not valid JSON \(Expecting value: line 1 column 1\)")):
        monkeypatch.setenv(ENV, held)
        with pytest.raises(ConfigurationError, match=rf"{system.name}: the connection settings "
                                                     rf"in Secret\(env='{ENV}', file=None\) "
                                                     rf"{refusal}") as bad:
            system.make(connection=Secret(env=ENV))
        message = f"{bad.value} {bad.value.fix}"
        assert PASSWORD not in message and bad.value.__context__ is None
    with pytest.raises(ConfigurationError, match=r"connection= is not valid JSON"):
        system.make(connection="bootstrap_servers=b:9092")


def test_a_secret_field_that_is_no_string_is_refused_without_its_value(
        system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, system.held(**{system.secret: 731_902}))
    with pytest.raises(ConfigurationError, match=rf"give {system.secret} as a JSON int, not a "
                                                 "string") as refused:
        system.make(connection=Secret(env=ENV))
    assert "731902" not in str(refused.value)


def test_a_secret_is_taken_only_for_a_secret_option(system: System) -> None:
    name = next(iter(system.connection))
    with pytest.raises(ConfigurationError, match=rf"gives \['{name}'\] as a twophase\.Secret"):
        system.make(connection={**system.connection, name: Secret(env=ENV)})


def test_a_connection_of_another_kind_is_refused(system: System) -> None:
    with pytest.raises(ConfigurationError, match=r"connection= is a list\. Fix: pass a mapping"):
        system.make(connection=["b:9092"])


def test_an_unset_secret_names_its_variable(system: System) -> None:
    with pytest.raises(ConfigurationError, match=rf"\${ENV} is not set"):
        system.make(connection=Secret(env=ENV))


# -- the separate options, as before ---------------------------------------------------------

def test_kafkas_brokers_come_first_or_from_the_connection() -> None:
    by_position = KafkaSink("b:9092", "orders")
    assert by_position.settings == kafka(connection={"bootstrap_servers": "b:9092"}).settings
    assert KafkaSink(None, "orders", connection={"bootstrap_servers": "b:9092"}).shape.topic \
        == "orders"
    with pytest.raises(ConfigurationError, match=r"no bootstrap_servers: neither the first "
                                                 r"argument nor connection= names the brokers"):
        kafka(connection={"tls": "verify"})
    with pytest.raises(ConfigurationError, match="no bootstrap_servers"):
        KafkaSink(topic="orders")


def test_the_separate_options_work_as_before(system: System) -> None:
    sink = separately(system)
    assert getattr(sink.settings, system.secret) == PASSWORD
    assert PASSWORD not in repr(sink) + repr(sink.settings)
    assert S3Sink("bucket").settings.tls == "verify"
    assert S3Sink("bucket").settings.path_style is False
    plain = KafkaSink("b:9092", "orders")
    assert (plain.settings.security_protocol, plain.settings.ssl_verify) == ("PLAINTEXT", True)


def test_the_separate_tls_options_go_beside_a_connection_without_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, json.dumps({"bootstrap_servers": "b:9093"}))
    sink = kafka(connection=Secret(env=ENV), tls="verify", ca_bundle="/ca.pem")
    assert (sink.settings.security_protocol, sink.settings.ssl_cafile) == ("SSL", "/ca.pem")
    store = s3(connection={"endpoint_url": "https://store:9000"}, tls="require")
    assert store.settings.tls_verify is False


def test_kafkas_former_option_names_still_warn_at_the_callers_line() -> None:
    with pytest.warns(DeprecationWarning, match="ssl_cafile") as caught:
        sink = KafkaSink("b:9092", "orders", ssl_cafile="/ca.pem", tls="verify")
    assert caught[0].filename == __file__
    assert sink.settings.ssl_cafile == "/ca.pem"


def test_the_tls_options_in_a_connection_are_checked_as_the_separate_ones(
        system: System) -> None:
    with pytest.raises(ConfigurationError, match="unknown tls='preferred'"):
        system.make(connection={**system.connection, "tls": "preferred"})
    with pytest.raises(ConfigurationError, match="client_key= is given without client_cert="):
        system.make(connection={**system.connection, "client_key": "/k.pem"})


# -- one reader for every sink's connection= -------------------------------------------------

@pytest.mark.parametrize("make", [kafka, s3, lambda **options: MySQLXASink(
    table="orders", **options), lambda **options: PostgresSink(table="orders", **options)])
def test_every_sinks_connection_mapping_is_read_alike(make: Callable[..., Any]) -> None:
    with pytest.raises(ConfigurationError, match=r"connection= has \['hots'\], which are not "
                                                 r"connection options\. Fix: use only "):
        make(connection={"hots": "db"})


def test_the_database_sinks_read_their_mappings_with_the_same_reader() -> None:
    sink = MySQLXASink(table="orders", connection={"host": "db", "user": "etl",
                                                   "database": "shop", "tls": "require"})
    assert (sink.server.host, sink.server.tls) == ("db", Tls("require"))
    fields = ConnectionFields("X", ("host", "password"), secrets=frozenset({"password"}),
                              beside=frozenset({"password"}))
    with pytest.raises(ConfigurationError, match=r"X: connection= and host= are both given"):
        fields.read({"password": "pw"}, {"host": "db"})
    assert fields.read({"host": "db"}, {"password": "pw"}) == {"host": "db", "password": "pw"}
    assert fields.read(None, {"host": "db", "password": None}) == {"host": "db"}
