"""IcebergSink's driver-side costs as a table ages: the "already committed?" proof and the
listing in doubt at snapshot 10 and at snapshot 1,000, the metadata load reported apart. One run.

Run from the repository root (a few minutes on a local path with the embedded SQL catalog)::

    nice .venv/bin/python -m bench.iceberg_proof [--batches 1000] [--partitions 2]

Batches of ``--partitions`` transactions (10 rows each) are pre-committed and committed as the
driver does (one snapshot each); at each checkpoint (batch 10, then ``--batches``) the next
batch is left pre-committed (its intents present, as during a batch) and, ``--repeats`` times
each, timed:

- ``load``: loading the table's current metadata through the catalog (the metadata file grows
  with the snapshots it lists: Iceberg's own cost, reported apart);
- ``proof, in flight``: the proof of the batch being committed, on the loaded table (the
  property below the batch: nothing walked; the commit path);
- ``proof, committed``: the proof of the last committed batch (the walk from the current
  snapshot to the batch's predecessor and the manifests of the batch's snapshot: recovery);
- ``list in doubt``: the committer's whole listing (intents, a table load, the proof per query);
- ``re-commit``: committing the previous, committed batch again through a new committer, as a
  restarted driver's recovery does (ALREADY_COMMITTED);
- ``commit``: committing the batch in flight (once): pyiceberg builds the new metadata (it
  copies the table's metadata per update, and the metadata lists every snapshot) and the
  catalog swaps it in: Iceberg's own cost, which grows with the snapshots the table keeps.

Prints the medians at both checkpoints and their ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.delta_proof import median_ms, prepared, report, run
from setups.lake import commit_decided
from sinks.iceberg import IcebergSink
from sinks.iceberg.snapshots import app_id_of, proof
from twophase import CommitOutcome, Committer, Handle
from twophase.testing.contract import NAMESPACE


def measure(sink: IcebergSink, committer: Committer, batch: int, partitions: int, repeats: int,
            last: list[Handle]) -> dict[str, float]:
    """The costs with batch ``batch`` pre-committed (in flight), through the run's committer."""
    in_flight = prepared(sink, batch, partitions)
    app_id = app_id_of(in_flight[0].txn_id)
    table = sink.load_table()
    listed = committer.list_in_doubt(NAMESPACE)
    assert {handle.txn_id for handle in listed} == {h.txn_id for h in in_flight}, listed
    assert proof(table, app_id, batch - 1).holds(batch - 1, [
        sink.storage.uri(f["path"]) for h in last for f in h.data["files"]])

    def recommit() -> None:
        with sink.committer() as fresh:
            assert set(commit_decided(fresh, last)) == {CommitOutcome.ALREADY_COMMITTED}

    costs = {
        "load": median_ms(sink.load_table, repeats),
        "proof, in flight": median_ms(lambda: proof(table, app_id, batch), repeats),
        "proof, committed": median_ms(lambda: proof(table, app_id, batch - 1), repeats),
        "list in doubt": median_ms(lambda: committer.list_in_doubt(NAMESPACE), repeats),
        "re-commit": median_ms(recommit, repeats),
    }
    costs["commit (one sample)"] = median_ms(lambda: commit_decided(committer, in_flight), 1)
    last[:] = in_flight
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        catalog = {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db",
                   "warehouse": Path(workdir, "warehouse").as_uri()}
        sink = IcebergSink("db.orders", catalog=catalog, create=True)
        started = time.perf_counter()
        results = run(sink, args.batches, args.partitions, args.repeats, measure)
        elapsed = time.perf_counter() - started
    print(f"IcebergSink, embedded SQL catalog, local path: {args.batches} batches of "
          f"{args.partitions} transactions in {elapsed:.0f} s; medians of {args.repeats}")
    print(report(results, args.batches, "snapshot"))


if __name__ == "__main__":
    main()
