"""The chaos suite's short subset (the long one: scripts/chaos).

The fault proxy against a real TCP server, then one chaos round per fault family through real
Spark drivers, under ``-m long`` (CI time: CI runs the group round below): a zombie driver
thawed on the same state after its successor took the query over (SQLite), the server SIGKILLed
mid-batch (PostgreSQL), the server SIGKILLed mid-batch and the network to it cut (MariaDB), the
network to a Kafka broker cut (the broker advertises the proxy), the HTTP receiver SIGKILLed
mid-batch. Each round ends with every row visible exactly once and nothing in doubt.

Then sink groups: in CI, MariaDB then Kafka (the outbox) with a member's server killed and the
network to a member cut, and (``-m long``) Kafka down for longer than a batch: no batch decided
while it is down, the table not ahead of what was decided as it went down; every round ends with
every row once in both members and no event seen in the topic (read_committed) before its row
in the table. Under ``-m long`` (a round takes minutes) a Delta table between them (MariaDB,
Delta, Kafka), and an Iceberg table between PostgreSQL and Kafka: the lake's faults, driver
kills (between two members' commits too) and a zombie driver; every row once in each of the
three, no split batch.
"""

from __future__ import annotations

import contextlib
import random
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from chaos.proxy import HOST, FaultProxy
from chaos.scenario import Round
from chaos.systems import DRIVER_KILL, MEMBER_DOWN, NETWORK_CUT, SERVER_KILL, SYSTEMS, ZOMBIE

SLOW_DELAY_S = 0.3
#: Faults strike at once after a run's first batch, so that the run has batches left.
PROMPT = (0.0, 0.2)
#: A member down stays down this long: several batches' time (a batch here takes about one
#: second once Spark is warm).
DOWN_S = (5.0, 6.0)


class _Echo(socketserver.BaseRequestHandler):
    open_connections: ClassVar[set[int]] = set()

    def handle(self) -> None:
        self.open_connections.add(id(self))
        try:
            with contextlib.suppress(ConnectionError):
                while data := self.request.recv(4096):
                    self.request.sendall(data)
        finally:
            self.open_connections.discard(id(self))


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A real TCP echo server on a loopback port."""
    server = socketserver.ThreadingTCPServer((HOST, 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _echo(port: int, payload: bytes = b"ping") -> bytes:
    with socket.create_connection((HOST, port), timeout=5) as connection:
        connection.sendall(payload)
        return connection.recv(4096)


def test_the_proxy_forwards_until_cut_and_again_once_healed(echo_port: int) -> None:
    with FaultProxy((HOST, echo_port)) as proxy:
        assert _echo(proxy.port) == b"ping"
        held = socket.create_connection((HOST, proxy.port), timeout=5)
        held.sendall(b"a")
        assert held.recv(16) == b"a"
        proxy.cut()
        with pytest.raises(ConnectionError):  # the open connection is reset...
            held.sendall(b"b")
            held.recv(16)
        held.close()
        with pytest.raises(ConnectionError):  # ...and new ones too
            _echo(proxy.port)
        proxy.heal()
        assert _echo(proxy.port) == b"ping"


def test_the_proxy_resets_open_connections_and_slows_chunks(echo_port: int) -> None:
    with FaultProxy((HOST, echo_port)) as proxy:
        held = socket.create_connection((HOST, proxy.port), timeout=5)
        held.sendall(b"a")
        assert held.recv(16) == b"a"
        proxy.reset()
        with pytest.raises(ConnectionError):
            held.sendall(b"b")
            held.recv(16)
        held.close()
        assert _echo(proxy.port) == b"ping"  # a reset is not a cut
        proxy.slow(SLOW_DELAY_S)
        started = time.monotonic()
        assert _echo(proxy.port) == b"ping"
        assert time.monotonic() - started >= 2 * SLOW_DELAY_S  # there and back
        proxy.heal()


def test_a_client_that_dies_ends_its_connection_to_the_server(echo_port: int) -> None:
    """A killed client's socket is reset; the proxy must not keep the server's side open (a
    database would keep the dead client's transaction and its locks)."""
    with FaultProxy((HOST, echo_port)) as proxy:
        client = socket.create_connection((HOST, proxy.port), timeout=5)
        client.sendall(b"a")
        assert client.recv(16) == b"a" and _Echo.open_connections
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # RST, as the kernel sends for a SIGKILLed process with unread data
        deadline = time.monotonic() + 5
        while _Echo.open_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _Echo.open_connections, "the server's side of a dead client stayed open"


@pytest.mark.spark
@pytest.mark.crash
@pytest.mark.parametrize(("sink", "kinds", "budget"), [
    # CI time: one chaos round in CI, the group round below (server kills, network cuts, driver
    # runs ended by them); a zombie run fenced through real Spark in CI by the Connect takeover
    # (tests/spark/test_connect.py::TestSQLiteTakeovers), zombies of every sink in the model
    pytest.param("sqlite", (ZOMBIE,), 1, marks=pytest.mark.long),
    pytest.param("postgres", (SERVER_KILL,), 1, marks=pytest.mark.long),
    # CI time: MariaDB's server killed and the network to it and to Kafka cut run in CI in the
    # group round below
    pytest.param("mysql", (SERVER_KILL, NETWORK_CUT), 2, marks=pytest.mark.long),
    pytest.param("kafka", (NETWORK_CUT,), 1, marks=pytest.mark.long),
    pytest.param("http", (SERVER_KILL,), 1, marks=pytest.mark.long),
])
def test_a_chaos_round_delivers_every_row_exactly_once(
        sink: str, kinds: tuple[str, ...], budget: int, tmp_path: Path) -> None:
    with SYSTEMS[sink](tmp_path).running() as system:
        result = Round(system, tmp_path / "round", random.Random(sink), batches=8,
                       rows_per_batch=100, budget=budget, kinds=kinds,
                       fault_delay_s=PROMPT).play()
    # a zombie's successor may be armed at a crash point too
    assert result.crash_runs >= 1 and set(result.faults) <= {*kinds, DRIVER_KILL}, result
    if ZOMBIE in kinds:
        assert result.zombies_fenced == result.faults[ZOMBIE] == 1, result
    assert result.exactly_once, result


@pytest.mark.spark
@pytest.mark.crash
@pytest.mark.server  # the round starts its own servers (chaos.systems)
@pytest.mark.mysql
@pytest.mark.kafka
def test_a_group_round_keeps_the_table_ahead_of_the_topic(tmp_path: Path) -> None:
    """Each batch committing behind the next (the table's, then the topic's, transactions)."""
    with SYSTEMS["mysql+kafka"](tmp_path).running() as system:
        result = Round(system, tmp_path / "round", random.Random("mysql+kafka"), batches=4,
                       rows_per_batch=100, budget=2, kinds=(SERVER_KILL, NETWORK_CUT),
                       fault_delay_s=PROMPT, commits_behind=True).play()
    assert result.crash_runs >= 1 and set(result.faults) <= {SERVER_KILL, NETWORK_CUT}, result
    assert result.adapter.endswith("commits behind"), result
    assert result.before_their_row == result.split_batches == result.out_of_order == 0, result
    assert result.exactly_once, result


@pytest.mark.spark
@pytest.mark.crash
@pytest.mark.server  # the round starts its own servers (chaos.systems)
@pytest.mark.mysql
@pytest.mark.kafka
@pytest.mark.long  # CI time: the rule runs in CI in tests/spark/test_group_member_down.py
def test_no_batch_is_decided_while_a_member_is_down(tmp_path: Path) -> None:
    """The topic's broker down for longer than a batch: the table must not run ahead by a
    decided batch (read while the broker is down); once it is back, every row once in both."""
    with SYSTEMS["mysql+kafka"](tmp_path).running() as system:
        result = Round(system, tmp_path / "round", random.Random("member down"), batches=4,
                       rows_per_batch=100, budget=1, kinds=(MEMBER_DOWN,),
                       fault_delay_s=PROMPT, down_s=DOWN_S, strike="kafka").play()
    assert result.faults == {MEMBER_DOWN: 1} and result.checks_while_down >= 3, result
    assert result.ahead_while_down == 0, result
    assert result.exactly_once, result


@pytest.mark.spark
@pytest.mark.crash
@pytest.mark.server  # the round starts its own servers (chaos.systems)
@pytest.mark.mysql
@pytest.mark.delta
@pytest.mark.kafka
@pytest.mark.long  # minutes: the full run is scripts/chaos --sinks mysql+delta+kafka
def test_a_group_round_with_a_delta_table_between_its_members(tmp_path: Path) -> None:
    """The lake between the table and the topic: a Delta table has no server, so its faults
    are the driver's (killed at any point of a group, a zombie thawed beside its successor)."""
    with SYSTEMS["mysql+delta+kafka"](tmp_path).running() as system:
        result = Round(system, tmp_path / "round", random.Random("mysql+delta+kafka"),
                       batches=6, rows_per_batch=100, budget=3, kinds=(DRIVER_KILL, ZOMBIE),
                       fault_delay_s=PROMPT).play()
    assert result.crash_runs >= 2 and set(result.faults) <= {DRIVER_KILL, ZOMBIE}, result
    assert result.before_their_row == result.split_batches == 0, result
    assert result.exactly_once, result


@pytest.mark.spark
@pytest.mark.crash
@pytest.mark.server  # the round starts its own servers (chaos.systems)
@pytest.mark.postgres
@pytest.mark.iceberg
@pytest.mark.kafka
@pytest.mark.long  # minutes: the full run is scripts/chaos --sinks postgres+iceberg+kafka
def test_a_group_round_with_an_iceberg_table_between_its_members(tmp_path: Path) -> None:
    """An Iceberg table (the embedded SQL catalog) between PostgreSQL and the topic: it has no
    server of its own, so its faults are the driver's (killed at any point of a group, a
    zombie thawed beside its successor)."""
    with SYSTEMS["postgres+iceberg+kafka"](tmp_path).running() as system:
        result = Round(system, tmp_path / "round", random.Random("postgres+iceberg+kafka"),
                       batches=6, rows_per_batch=100, budget=3, kinds=(DRIVER_KILL, ZOMBIE),
                       fault_delay_s=PROMPT).play()
    assert result.crash_runs >= 2 and set(result.faults) <= {DRIVER_KILL, ZOMBIE}, result
    assert result.before_their_row == result.split_batches == 0, result
    assert result.exactly_once, result
