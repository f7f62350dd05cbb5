"""The keyed lake apply cost (issue 49): what the driver's apply of ONE batch of changes costs
a Delta and an Iceberg table in ``mode="keyed"`` as the table grows, keys uniformly spread and
keys clustered, against the plain append of the same rows. No Spark: the sinks' own code, as
an executor and the driver call it.

Run from the repository root (never in CI; on 2 cores about a minute up to 1,000,000 rows,
four more for 10,000,000)::

    nice .venv/bin/python -m bench.keyed_lake [delta iceberg] [--sizes 100000 1000000]
        [--rounds 3] [--rows-per-file 100000] [--changes 10000] [--json RESULTS] [--quick]

Per format and size ``N``:

* **The table**: created by the keyed sink's ``check_schema`` (``id`` the key, ``version``,
  two payload columns ``status`` and ``amount``), then filled with keys ``0 .. N-1`` in key
  order, version 1, by plain appends of ``--rows-per-file`` rows, one data file each (what a
  stream appending batches of that many rows writes; default 100,000 rows, about 1.2 MB): each
  file holds one narrow key range, the layout an append-mostly change stream leaves. Delta:
  ``write_deltalake`` per file; Iceberg (the embedded SQL catalog on SQLite, local files):
  ``Table.append`` per file (a snapshot and a manifest each).
* **One batch** of ``--changes`` changes (10 % deletes and 50 % updates of distinct existing
  keys, 40 % inserts of new keys above the largest), version 2, in two key shapes:
  ``uniform``, the existing keys drawn over the whole key range; ``clustered``, drawn among the
  newest keys (the newest 1 %, at least ``--changes`` keys: at 100,000 rows the newest 10 %),
  the usual shape of a change stream. The changes are handed to two tasks by key (as
  ``route_by_key`` does) and staged by the sink as an executor does
  (:func:`twophase.testing.contract.prepare`: begin, write, pre-commit); then the driver's
  committer (its table loaded already, as a running query's is) settles the batch:
  ``committer.settle(handles)`` is what is timed (wall and the process's CPU), and its parts:
  the staged changes read, the versions of their keys read from the table and from the
  tombstone table, the plan, the tombstones written, the table's one commit (Delta: the MERGE;
  Iceberg: delete + append + proof in one catalog commit).
* **append**: the same rows (without the delete marker) through the sink in ``mode="append"``
  into the same table: the driver's commit of files the tasks wrote, for scale.

Files: Delta, the MERGE's own metrics (files added, removed; rows copied; its files scanned
and skipped are kept but wrong from 100,000 rows up: 0 scanned, every file skipped),
and how many files the table's pyarrow dataset keeps for the read of the keys' versions
(:func:`sinks.delta.keyed.row_versions`, counted apart, outside the clock); Iceberg, the files
pyiceberg's scan planning returned for the versions' read and for the delete (the files it
reads), and the data files the commit's snapshots added and deleted (their summaries).

Every case runs on the same table: before each one the table (and its tombstone table) is put
back to the built version (Delta ``restore``, Iceberg ``rollback_to_snapshot``; both metadata
only: the files stay), and each case is a query of its own (a fresh query id: the proofs of
the previous case do not apply). ``--rounds`` rounds, the order of the three cases turning
every round; medians. The load average before and after each case is kept: the machine may
be shared. The results go to ``--json`` (default ``docs/results/keyed_lake.json``; entries of
other sizes and formats already there are kept), with the run's provenance
(:func:`bench.session.machine`); the tables are printed as markdown.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyiceberg
from deltalake import DeltaTable, write_deltalake
from pyiceberg.table import DataScan
from pyiceberg.table import Table as IcebergTable

import sinks.delta.committer as delta_committer
import sinks.iceberg.committer as iceberg_committer
import sinks.iceberg.keyed as iceberg_keyed
from bench.session import describe, machine
from sinks.delta import DeltaSink
from sinks.delta.keyed import TOMBSTONES_PATH, DeltaTombstones, merge_batch, row_versions
from sinks.iceberg import IcebergSink
from sinks.iceberg.keyed import IcebergTombstones
from twophase import Handle, TwoPhaseCommitSink
from twophase.kit import Keyed
from twophase.kit.lake import LakeCommitter, plan_batch
from twophase.sink import Column
from twophase.testing.contract import NAMESPACE, prepare, use_query_id

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "keyed_lake.json"
#: What the results file says it holds.
WHAT = "keyed lake apply cost (issue 49): python -m bench.keyed_lake"
FORMATS = ("delta", "iceberg")
DEFAULT_SIZES = (100_000, 1_000_000, 10_000_000)
DEFAULT_ROUNDS = 3
DEFAULT_ROWS_PER_FILE = 100_000
DEFAULT_CHANGES = 10_000
#: --quick: a smoke run (small tables, one round, nothing written unless --json): sizes, rounds,
#: rows per file, changes.
QUICK: tuple[list[int], int, int, int] = ([20_000, 50_000], 1, 10_000, 2_000)
#: The batch's mix, in tenths: deletes and updates of existing keys, inserts of new ones.
DELETES, UPDATES, INSERTS = 1, 5, 4
#: Clustered: the existing keys drawn among the newest 1 % of the table (at least a batch's).
CLUSTER_SHARE = 100
TASKS = 2
BASE_VERSION, CHANGE_VERSION = 1, 2
UNIFORM, CLUSTERED, APPEND = "uniform", "clustered", "append"
SHAPES = (CLUSTERED, UNIFORM, APPEND)
STATUSES = ("placed", "paid", "shipped", "delivered")
TABLE_COLUMNS = (Column("id", "bigint", False), Column("status", "string", True),
                 Column("amount", "double", True), Column("version", "bigint", False))
CHANGE_COLUMNS = (*TABLE_COLUMNS, Column("op", "string", True))
KEYED_OPTIONS: dict[str, Any] = {"mode": "keyed", "key": ("id",), "version": "version",
                                 "deleted": "op"}
KEYED = Keyed(("id",), "version")
#: The parts of a keyed settle, as timed.
READ_STAGED, ROW_VERSIONS, TOMBSTONE_VERSIONS = "read staged", "row versions", "tombstone versions"
PLAN, WRITE_TOMBSTONES, COMMIT = "plan", "write tombstones", "commit"
PARTS = (READ_STAGED, ROW_VERSIONS, TOMBSTONE_VERSIONS, PLAN, WRITE_TOMBSTONES, COMMIT)
Row = tuple[Any, ...]


def load() -> list[float]:
    """The load averages (1, 5, 15 minutes), as ``uptime`` prints them."""
    return [round(value, 2) for value in os.getloadavg()]


# --- the data ------------------------------------------------------------------------------------

def base_rows(first: int, count: int) -> pa.Table:
    """Rows ``first .. first+count-1`` of the built table (key order, version 1)."""
    ids = pa.array(range(first, first + count), pa.int64())
    return pa.table({
        "id": ids,
        "status": pc.take(pa.array(STATUSES), pc.cast(pc.bit_wise_and(ids, 3), pa.int32())),
        "amount": pc.multiply(pc.cast(ids, pa.float64()), 0.01),
        "version": pa.repeat(pa.scalar(BASE_VERSION, pa.int64()), count),
    })


def conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns under ``schema`` (its nullability and field metadata)."""
    return pa.Table.from_arrays([table.column(f.name).cast(f.type) for f in schema],
                                schema=schema)


def a_tombstone(schema: pa.Schema) -> pa.Table:
    """One tombstone of a key no batch touches (-1): what a tombstone table that has seen a
    delete holds, so that every case reads a table with a file (an empty one is skipped)."""
    return conformed(pa.table({"id": [-1], "version": [BASE_VERSION],
                               "deleted_at": pa.array([datetime.now(UTC)],
                                                      pa.timestamp("us", tz="UTC"))}), schema)


def changes(rows: int, shape: str, count: int, seed: int) -> list[Row]:
    """One batch (module docstring): rows of :data:`CHANGE_COLUMNS`."""
    generator = random.Random(seed)
    existing = count * (DELETES + UPDATES) // 10
    window = rows if shape == UNIFORM else min(rows, max(rows // CLUSTER_SHARE, count))
    drawn = generator.sample(range(rows - window, rows), existing)
    deletes = count * DELETES // 10
    batch: list[Row] = [(key, None, None, CHANGE_VERSION, "d") for key in drawn[:deletes]]
    batch += [(key, "updated", key * 0.02, CHANGE_VERSION, "u") for key in drawn[deletes:]]
    batch += [(key, "new", key * 0.01, CHANGE_VERSION, "c")
              for key in range(rows, rows + count - existing)]
    generator.shuffle(batch)
    return batch


def tasks(batch: Sequence[Row]) -> list[list[Row]]:
    """The batch in :data:`TASKS` tasks by key, as ``route_by_key`` hands it over."""
    return [[row for row in batch if row[0] % TASKS == task] for task in range(TASKS)]


# --- timing a settle's parts ----------------------------------------------------------------------

@dataclass
class Parts:
    """The seconds of a settle's parts (the outermost timed call counts), the files counted,
    and the time spent counting (taken out of the settle's)."""

    seconds: dict[str, float] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    counting_s: float = 0.0
    counting_cpu_s: float = 0.0
    active: list[str] = field(default_factory=list)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        outermost = not self.active
        self.active.append(name)
        started, counted = time.perf_counter(), self.counting_s
        try:
            yield
        finally:
            self.active.pop()
            if outermost:
                spent = time.perf_counter() - started - (self.counting_s - counted)
                self.seconds[name] = self.seconds.get(name, 0.0) + spent

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        started, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.counting_s += time.perf_counter() - started
            self.counting_cpu_s += time.process_time() - cpu

    def count(self, name: str, files: int) -> None:
        self.files[name] = self.files.get(name, 0) + files

    def timed(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            with self.part(name):
                return function(*args, **kwargs)
        return timed_call


def patch(stack: contextlib.ExitStack, owner: Any, name: str, new: Any) -> None:
    """``owner.name`` replaced by ``new`` until ``stack`` closes."""
    old = getattr(owner, name)
    setattr(owner, name, new)
    stack.callback(setattr, owner, name, old)


class CountedDataset:
    """A pyarrow dataset whose ``to_table`` first counts the files its filter keeps (their
    statistics, as the scan prunes them; outside the clock)."""

    def __init__(self, dataset: Any, parts: Parts, name: str) -> None:
        self.dataset, self.parts, self.name = dataset, parts, name

    def to_table(self, *args: Any, **kwargs: Any) -> pa.Table:
        with self.parts.counting():
            kept = self.dataset.get_fragments(filter=kwargs.get("filter"))
            self.parts.count(self.name, sum(1 for _ in kept))
        return self.dataset.to_table(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dataset, name)


# --- the formats ---------------------------------------------------------------------------------

class Lake:
    """One format's table of ``rows`` rows: built once, put back before every case."""

    name: str
    rows: int
    files: int = 0
    #: The data files' size as built (MB).
    built_mb: float = 0.0

    def sink(self, *, keyed: bool) -> TwoPhaseCommitSink[Any]:
        raise NotImplementedError

    def build(self, rows_per_file: int) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """The table and its tombstones as built."""
        raise NotImplementedError

    def instrument(self, stack: contextlib.ExitStack, parts: Parts) -> None:
        """Time the parts of a keyed settle (and count files) until ``stack`` closes."""
        raise NotImplementedError

    def before_commit(self) -> Any:
        """What :meth:`commit_files` compares against (read before the settle)."""
        return None

    def commit_files(self, before: Any) -> dict[str, int]:
        """The files the settle's commit read, added and removed (where the format says)."""
        raise NotImplementedError

    def size_bytes(self) -> int:
        raise NotImplementedError

    def common(self, parts: Parts, stack: contextlib.ExitStack) -> None:
        patch(stack, LakeCommitter, "staged_changes",
              parts.timed(READ_STAGED, LakeCommitter.staged_changes))


def directory_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*.parquet")
               if "_twophase" not in entry.parts)


class DeltaLake(Lake):
    name = "Delta"

    def __init__(self, workdir: Path, rows: int) -> None:
        self.rows = rows
        self.uri = str(workdir / f"delta-{rows}")
        self.tombstones_uri = f"{self.uri}/{TOMBSTONES_PATH}"
        self.base = self.tombstones_base = 0
        self.clean: tuple[int, int] = (0, 0)

    def sink(self, *, keyed: bool) -> TwoPhaseCommitSink[Any]:
        sink = DeltaSink(self.uri, create=True, **(KEYED_OPTIONS if keyed else {}))
        sink.check_schema(CHANGE_COLUMNS if keyed else TABLE_COLUMNS)
        return sink

    def build(self, rows_per_file: int) -> None:
        self.sink(keyed=True)
        schema = pa.schema([pa.field("id", pa.int64(), nullable=False),
                            pa.field("status", pa.string()), pa.field("amount", pa.float64()),
                            pa.field("version", pa.int64(), nullable=False)])
        for first in range(0, self.rows, rows_per_file):
            write_deltalake(self.uri, conformed(base_rows(first, min(
                rows_per_file, self.rows - first)), schema), mode="append")
        write_deltalake(self.tombstones_uri, a_tombstone(pa.schema([
            pa.field("id", pa.int64(), nullable=False),
            pa.field("version", pa.int64(), nullable=False),
            pa.field("deleted_at", pa.timestamp("us", tz="UTC"), nullable=False)])),
            mode="append")
        table = DeltaTable(self.uri)
        self.base, self.files = table.version(), len(table.file_uris())
        self.tombstones_base = DeltaTable(self.tombstones_uri).version()
        self.clean = (self.base, self.tombstones_base)

    def reset(self) -> None:
        table, tombstones = DeltaTable(self.uri), DeltaTable(self.tombstones_uri)
        if (table.version(), tombstones.version()) == self.clean:
            return
        if table.version() != self.clean[0]:
            table.restore(self.base)
        if tombstones.version() != self.clean[1]:
            tombstones.restore(self.tombstones_base)
        self.clean = (DeltaTable(self.uri).version(), DeltaTable(self.tombstones_uri).version())

    def instrument(self, stack: contextlib.ExitStack, parts: Parts) -> None:
        self.common(parts, stack)
        patch(stack, delta_committer, "row_versions", parts.timed(ROW_VERSIONS, row_versions))
        to_dataset = DeltaTable.to_pyarrow_dataset

        def counted_dataset(table: DeltaTable, *args: Any, **kwargs: Any) -> Any:
            dataset = to_dataset(table, *args, **kwargs)
            if parts.active[:1] != [ROW_VERSIONS]:
                return dataset
            return CountedDataset(dataset, parts, "row versions: files read")

        patch(stack, DeltaTable, "to_pyarrow_dataset", counted_dataset)
        patch(stack, delta_committer, "plan_batch",
              parts.timed(PLAN, plan_batch))
        patch(stack, delta_committer, "merge_batch",
              parts.timed(COMMIT, merge_batch))
        patch(stack, DeltaTombstones, "versions",
              parts.timed(TOMBSTONE_VERSIONS, DeltaTombstones.versions))
        patch(stack, DeltaTombstones, "write",
              parts.timed(WRITE_TOMBSTONES, DeltaTombstones.write))

    def before_commit(self) -> Any:
        return DeltaTable(self.uri).version()

    def commit_files(self, before: Any) -> dict[str, int]:
        table = DeltaTable(self.uri)
        found: dict[str, int] = {"data files after": len(table.file_uris())}
        for entry in table.history(table.version() - int(before)):
            if entry.get("operation") != "MERGE":
                continue
            metrics = entry.get("operationMetrics", {})
            for name in ("num_target_files_scanned", "num_target_files_skipped_during_scan",
                         "num_target_files_added", "num_target_files_removed",
                         "num_target_rows_copied", "num_target_rows_updated",
                         "num_target_rows_inserted", "num_target_rows_deleted"):
                if name in metrics:
                    found[name] = int(metrics[name])
        return found

    def size_bytes(self) -> int:
        return directory_bytes(Path(self.uri))


class IcebergLake(Lake):
    name = "Iceberg"

    def __init__(self, workdir: Path, rows: int) -> None:
        self.rows = rows
        self.identifier = f"bench.orders_{rows}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.catalog_properties = {
            "type": "sql", "uri": f"sqlite:///{(workdir / 'catalog.db').absolute()}",
            "warehouse": f"file://{(workdir / 'warehouse').absolute()}"}
        self.base = self.tombstones_base = 0
        self.location = ""

    def sink(self, *, keyed: bool) -> TwoPhaseCommitSink[Any]:
        sink = IcebergSink(self.identifier, catalog=self.catalog_properties, create=True,
                           **(KEYED_OPTIONS if keyed else {}))
        sink.check_schema(CHANGE_COLUMNS if keyed else TABLE_COLUMNS)
        return sink

    def table(self) -> IcebergTable:
        sink = IcebergSink(self.identifier, catalog=self.catalog_properties)
        return sink.catalog().load_table(self.identifier)

    def tombstone_table(self) -> IcebergTable:
        sink = IcebergSink(self.identifier, catalog=self.catalog_properties)
        catalog = sink.catalog()
        return catalog.load_table(IcebergTombstones(catalog, self.identifier, KEYED).identifier)

    def build(self, rows_per_file: int) -> None:
        self.sink(keyed=True)
        table = self.table()
        schema = table.schema().as_arrow()
        for first in range(0, self.rows, rows_per_file):
            table.append(conformed(base_rows(first, min(rows_per_file, self.rows - first)),
                                   schema))
        snapshot = table.current_snapshot()
        assert snapshot is not None
        self.base, self.location = snapshot.snapshot_id, table.location()
        self.files = sum(1 for _ in table.scan().plan_files())
        tombstones = self.tombstone_table()
        tombstones.append(a_tombstone(tombstones.schema().as_arrow()))
        primed = tombstones.current_snapshot()
        assert primed is not None
        self.tombstones_base = primed.snapshot_id

    @staticmethod
    def current(table: IcebergTable) -> int | None:
        snapshot = table.current_snapshot()
        return None if snapshot is None else snapshot.snapshot_id

    def reset(self) -> None:
        table = self.table()
        if self.current(table) != self.base:
            table.manage_snapshots().rollback_to_snapshot(self.base).commit()
        tombstones = self.tombstone_table()
        if self.current(tombstones) != self.tombstones_base:
            tombstones.manage_snapshots().rollback_to_snapshot(self.tombstones_base).commit()

    def instrument(self, stack: contextlib.ExitStack, parts: Parts) -> None:
        self.common(parts, stack)
        patch(stack, iceberg_keyed, "row_versions",
              parts.timed(ROW_VERSIONS, iceberg_keyed.row_versions))
        patch(stack, iceberg_keyed, "apply_batch",
              parts.timed(COMMIT, iceberg_keyed.apply_batch))
        patch(stack, iceberg_committer, "plan_batch",
              parts.timed(PLAN, plan_batch))
        patch(stack, IcebergTombstones, "versions",
              parts.timed(TOMBSTONE_VERSIONS, IcebergTombstones.versions))
        patch(stack, IcebergTombstones, "write",
              parts.timed(WRITE_TOMBSTONES, IcebergTombstones.write))
        plan_files = DataScan.plan_files
        location = self.location

        def counted_plan(scan: DataScan) -> list[Any]:
            planned = list(plan_files(scan))
            if scan.table_metadata.location == location and parts.active:
                parts.count(f"{parts.active[0]}: files planned", len(planned))
            return planned

        patch(stack, DataScan, "plan_files", counted_plan)

    def before_commit(self) -> Any:
        return {snapshot.snapshot_id for snapshot in self.table().metadata.snapshots}

    def commit_files(self, before: Any) -> dict[str, int]:
        table = self.table()
        found: dict[str, int] = {"snapshots": 0}
        for snapshot in table.metadata.snapshots:
            if snapshot.snapshot_id in before or snapshot.summary is None:
                continue
            found["snapshots"] += 1
            for name in ("added-data-files", "deleted-data-files", "added-records",
                         "deleted-records"):
                found[name] = found.get(name, 0) + int(snapshot.summary.get(name) or 0)
        found["data files after"] = sum(1 for _ in table.scan().plan_files())
        return found

    def size_bytes(self) -> int:
        return directory_bytes(Path(self.location.removeprefix("file://")))


LAKES: dict[str, Callable[[Path, int], Lake]] = {"delta": DeltaLake, "iceberg": IcebergLake}


# --- the cases -----------------------------------------------------------------------------------

@dataclass
class Round:
    seconds: float
    cpu_s: float
    prepare_s: float
    parts: dict[str, float]
    files: dict[str, int]
    load_before: list[float]
    load_after: list[float]

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 4), "cpu_s": round(self.cpu_s, 4),
                "prepare_s": round(self.prepare_s, 4),
                "parts_s": {name: round(value, 4) for name, value in self.parts.items()},
                "files": self.files, "load_before": self.load_before,
                "load_after": self.load_after}


def run_case(lake: Lake, shape: str, batch: Sequence[Row]) -> Round:
    """One case (module docstring): the table put back, the batch staged, its settle timed."""
    lake.reset()
    load_before = load()
    use_query_id(str(uuid.uuid4()))
    keyed = shape != APPEND
    sink = lake.sink(keyed=keyed)
    rows = batch if keyed else [row[:-1] for row in batch]
    columns = CHANGE_COLUMNS if keyed else TABLE_COLUMNS
    started = time.perf_counter()
    handles: tuple[Handle, ...] = tuple(
        prepare(sink, task, batch=0, partition=number, columns=columns)
        for number, task in enumerate(tasks(rows)))
    prepare_s = time.perf_counter() - started
    parts = Parts()
    before = lake.before_commit()
    with sink.committer() as committer:
        committer.list_in_doubt(NAMESPACE)  # the table loaded, as a running query's committer
        with contextlib.ExitStack() as stack:
            if keyed:
                lake.instrument(stack, parts)
            started, cpu = time.perf_counter(), time.process_time()
            outcomes = committer.settle(handles)  # type: ignore[attr-defined]
            seconds = time.perf_counter() - started - parts.counting_s
            cpu_s = time.process_time() - cpu - parts.counting_cpu_s
        committer.finish_batch(NAMESPACE, 0, handles)
    assert {outcome.name for outcome in outcomes.values()} == {"COMMITTED"}, outcomes
    files = {**parts.files, **lake.commit_files(before)}
    return Round(seconds, cpu_s, prepare_s, parts.seconds, files, load_before, load())


def check(lake: Lake, rows: int, batch: Sequence[Row]) -> None:
    """After a keyed case: the table as the batch leaves it (counted, not our reader's word
    alone: the row count and the updated keys' versions)."""
    deleted = sum(1 for row in batch if row[-1] == "d")
    inserted = sum(1 for row in batch if row[-1] == "c")
    if isinstance(lake, DeltaLake):
        table = DeltaTable(lake.uri).to_pyarrow_table(columns=["id", "version"])
    else:
        assert isinstance(lake, IcebergLake)
        table = lake.table().scan(selected_fields=("id", "version")).to_arrow()
    expected = rows - deleted + inserted
    newer = pc.sum(pc.equal(table.column("version"), CHANGE_VERSION)).as_py()
    if table.num_rows != expected or newer != len(batch) - deleted:
        raise SystemExit(f"{lake.name} at {rows:,}: {table.num_rows:,} rows ({expected:,} "
                         f"expected), {newer:,} at the batch's version "
                         f"({len(batch) - deleted:,} expected)")


def measure(lake: Lake, rounds: int, count: int) -> dict[str, list[Round]]:
    """``rounds`` rounds of the three cases, the order turning every round."""
    results: dict[str, list[Round]] = {shape: [] for shape in SHAPES}
    for number in range(rounds):
        turn = number % len(SHAPES)
        for shape in SHAPES[turn:] + SHAPES[:turn]:
            batch = changes(lake.rows, CLUSTERED if shape == APPEND else shape, count,
                            seed=lake.rows * 100 + SHAPES.index(shape) * 10 + number)
            result = run_case(lake, shape, batch)
            if shape != APPEND and number == 0:
                check(lake, lake.rows, batch)
            results[shape].append(result)
            print(f"  {lake.name} {lake.rows:,} {shape} round {number + 1}: "
                  f"{result.seconds:.3f} s, CPU {result.cpu_s:.2f} s, "
                  f"{ {k: round(v, 3) for k, v in result.parts.items()} } {result.files}, "
                  f"load {result.load_before} -> {result.load_after}", flush=True)
    lake.reset()
    return results


def summary(lake: Lake, build_s: float, results: dict[str, list[Round]], run: dict[str, Any]
            ) -> dict[str, Any]:
    cases = {}
    for shape, rounds in results.items():
        median = statistics.median(round_.seconds for round_ in rounds)
        cases[shape] = {
            "median_s": round(median, 4),
            "median_cpu_s": round(statistics.median(r.cpu_s for r in rounds), 4),
            "median_prepare_s": round(statistics.median(r.prepare_s for r in rounds), 4),
            "median_parts_s": {name: round(statistics.median(r.parts.get(name, 0.0)
                                                             for r in rounds), 4)
                               for name in PARTS if any(name in r.parts for r in rounds)},
            "rounds": [r.to_json() for r in rounds]}
    return {"format": lake.name, "rows": lake.rows, "files": lake.files,
            "built_mb": lake.built_mb, "build_s": round(build_s, 1), "run": run,
            "cases": cases}


# --- the report ----------------------------------------------------------------------------------

def files_cell(entry: dict[str, Any], shape: str) -> str:
    """What the median round's commit read and rewrote."""
    rounds = entry["cases"][shape]["rounds"]
    files = sorted(rounds, key=lambda r: r["seconds"])[len(rounds) // 2]["files"]
    if entry["format"] == "Delta":
        return (f"versions read {files.get('row versions: files read', '?')}; MERGE removed "
                f"{files.get('num_target_files_removed', '?')}, added "
                f"{files.get('num_target_files_added', '?')}, rows copied "
                f"{files.get('num_target_rows_copied', 0):,} (reported scanned "
                f"{files.get('num_target_files_scanned', '?')})")
    return (f"versions read {files.get('row versions: files planned', '?')}; delete read "
            f"{files.get('commit: files planned', '?')}, deleted "
            f"{files.get('deleted-data-files', 0)}, added {files.get('added-data-files', 0)}")


def markdown(entries: Sequence[dict[str, Any]]) -> str:
    lines = ["| format | table rows (files) | keys | apply s, median (rounds) | CPU s | "
             "versions read / tombstones / commit s | files |", "|---|---|---|---|---|---|---|"]
    for entry in entries:
        for shape in (CLUSTERED, UNIFORM, APPEND):
            case = entry["cases"][shape]
            every = ", ".join(f"{r['seconds']:.3f}" for r in case["rounds"])
            parts = case["median_parts_s"]
            split = (f"{parts.get(ROW_VERSIONS, 0):.3f} / "
                     f"{parts.get(TOMBSTONE_VERSIONS, 0) + parts.get(WRITE_TOMBSTONES, 0):.3f}"
                     f" / {parts.get(COMMIT, 0):.3f}") if shape != APPEND else ""
            lines.append(f"| {entry['format']} | {entry['rows']:,} ({entry['files']}) | "
                         f"{shape} | {case['median_s']:.3f} ({every}) | "
                         f"{case['median_cpu_s']:.2f} | {split} | "
                         f"{files_cell(entry, shape) if shape != APPEND else ''} |")
    return "\n".join(lines)


def merged(path: Path | None, entries: list[dict[str, Any]], settings: dict[str, Any]
           ) -> dict[str, Any]:
    """The results file with ``entries`` in place of those of the same format and size."""
    old: dict[str, Any] = {}
    if path is not None and path.exists():
        old = json.loads(path.read_text())
    fresh = {(entry["format"], entry["rows"]) for entry in entries}
    kept = [entry for entry in old.get("tables", [])
            if (entry["format"], entry["rows"]) not in fresh]
    tables = sorted([*kept, *entries], key=lambda entry: (entry["format"], entry["rows"]))
    return {"what": WHAT,
            "settings": settings, "tables": tables}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("formats", nargs="*", choices=[*FORMATS, []],
                        help="default: both")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--rows-per-file", type=int, default=DEFAULT_ROWS_PER_FILE)
    parser.add_argument("--changes", type=int, default=DEFAULT_CHANGES)
    parser.add_argument("--json", type=Path, default=None,
                        help=f"results file (default {RESULTS.relative_to(ROOT)}; "
                             "with --quick: none)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the tables are built (default: a temporary directory)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 20,000 and 50,000 rows in files of 10,000, batches "
                             "of 2,000, one round")
    args = parser.parse_args()
    args.formats = args.formats or list(FORMATS)
    if args.quick:
        args.sizes, args.rounds, args.rows_per_file, args.changes = QUICK
    output = args.json if args.json is not None or args.quick else RESULTS
    settings = {"changes": args.changes, "mix": {"deletes": DELETES / 10,
                                                 "updates": UPDATES / 10,
                                                 "inserts": INSERTS / 10},
                "rows_per_file": args.rows_per_file, "tasks": TASKS,
                "clustered": f"existing keys among the newest max(1 %, {args.changes:,}) keys",
                "versions": {"deltalake": deltalake.__version__,
                             "pyiceberg": pyiceberg.__version__, "pyarrow": pa.__version__}}
    entries = []
    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="twophase-keyed-lake-")))
        else:
            workdir = args.workdir
            workdir.mkdir(parents=True, exist_ok=True)
        for rows in args.sizes:
            for name in args.formats:
                run = machine()
                print(f"{name} at {rows:,} rows: {describe(run)}", flush=True)
                lake = LAKES[name](workdir / name, rows)
                started = time.perf_counter()
                lake.build(args.rows_per_file)
                build_s = time.perf_counter() - started
                lake.built_mb = round(lake.size_bytes() / 1e6, 1)
                print(f"  built in {build_s:.1f} s: {lake.files} files, {lake.built_mb} MB",
                      flush=True)
                entries.append(summary(lake, build_s, measure(lake, args.rounds, args.changes),
                                       run))
                if output is not None:
                    output.write_text(json.dumps(merged(output, entries, settings), indent=1)
                                      + "\n")
                if isinstance(lake, DeltaLake):
                    shutil.rmtree(lake.uri, ignore_errors=True)
    print()
    print(markdown(entries), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
