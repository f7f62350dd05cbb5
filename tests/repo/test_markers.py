"""The markers derived at collection (:mod:`tests.markers`): a test's room and its setup
fixtures name its sinks, its fixtures whether it takes a server or Spark. The whole derivation
runs on every collection (and a test that starts a server or Spark without its marker fails at
the fixture's start: :func:`tests.markers.check_marked`); here its rules."""

from __future__ import annotations

from setups import SETUPS
from tests import REPO
from tests.markers import room_of, server_fixtures, sink_of_fixture, sink_of_room, without_long


def test_a_room_is_its_directory_and_a_sinks_room_names_the_sink() -> None:
    tests = REPO / "tests"
    assert room_of(tests / "unit" / "test_state.py") == "unit"
    assert room_of(tests / "sinks" / "kafka" / "test_kafka_sink.py") == "sinks/kafka"
    assert room_of(tests / "sinks" / "test_rotation.py") == "sinks"
    assert sink_of_room("sinks/kafka") == "kafka"
    assert sink_of_room("sinks") is None and sink_of_room("spark") is None


def test_a_setup_fixture_names_its_sink_first() -> None:
    assert sink_of_fixture("mysql_setup") == "mysql"
    assert sink_of_fixture("least_privileged_postgres_setup") == "postgres"
    assert sink_of_fixture("delta_s3_setup") == "delta"  # a Delta table on S3: Delta's
    assert sink_of_fixture("iceberg_pg_setup") == "iceberg"
    assert sink_of_fixture("plain_setup") is None
    assert sink_of_fixture("mysql_table") is None


def test_every_setups_servers_and_the_plugins_servers_are_server_fixtures() -> None:
    names = server_fixtures()
    assert {server for setup in SETUPS.values() for server in setup.servers} <= names
    assert {"mariadb_server", "postgres_server", "kafka_broker", "moto_server", "http_receiver",
            "prometheus_server", "iceberg_rest_server", "connect_server", "spark_cluster",
            "secured_mariadb_server", "kafka_secured_broker", "moto_secured"} <= names
    assert "tls_ca" not in names and "spark" not in names


def test_a_selection_that_names_no_long_leaves_the_long_tests_out() -> None:
    assert without_long("not long") == "not long"
    assert without_long("kafka") == "(kafka) and not long"
    assert without_long("not server and not spark") == "(not server and not spark) and not long"
    assert without_long("long and kafka") == "long and kafka"
    assert without_long("") == ""
