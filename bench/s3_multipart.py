"""S3Sink against raw boto3 multipart uploads of the same bytes, same moto endpoint, one run.

Run from the repository root (about a minute on 2 cores)::

    .venv/bin/python -m bench.s3_multipart [--mib 200] [--rounds 3] [--memory-mib 300]

A private ``moto_server`` (``setups.servers.moto``) on loopback. The input: Arrow record batches
of order rows with a 200-character random payload (Parquet cannot squeeze it), made before the
clock starts and cycled. Each round, after one warm-up round:

* ``S3Sink``: ``begin_transaction``, ``write_arrow`` of ``--mib`` MiB of batches (encoded as
  Parquet into the part buffer, parts uploaded by ``max_in_flight`` threads while encoding goes
  on), ``pre_commit``, ``commit``: one object, as one partition's task and the driver make it.
* ``raw boto3``: the very bytes that object holds, uploaded with ``create_multipart_upload``,
  ``upload_part`` (same part size, same number of threads) and ``complete_multipart_upload``:
  what a hand-written at-least-once uploader does, with no encoding at all. The two take
  turns going first.

Ratio: median over rounds of the sink's MiB/s over raw's MiB/s (goal >= 0.9). Then the memory
of one task: a fresh process writes ``--memory-mib`` MiB through the sink; its peak RSS
(``VmHWM``, reset through ``/proc/self/clear_refs`` just before the first batch) minus its RSS
at that moment is what the partition's size costs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from setups.servers.moto import MotoServer, private_server
from sinks.s3 import S3Sink
from twophase.testing.contract import commit, context

MIB = 1024 * 1024
ROWS_PER_BATCH = 20_000
PAYLOAD_CHARS = 200
SCHEMA = pa.schema([("event_id", pa.int64()), ("order_id", pa.int64()),
                    ("status", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
                    ("payload", pa.string())])


def make_batches(count: int) -> list[pa.RecordBatch]:
    out = []
    for b in range(count):
        ids = range(b * ROWS_PER_BATCH, (b + 1) * ROWS_PER_BATCH)
        blob = os.urandom(ROWS_PER_BATCH * PAYLOAD_CHARS // 2).hex()
        payload = [blob[i * PAYLOAD_CHARS:(i + 1) * PAYLOAD_CHARS] for i in range(len(ids))]
        out.append(pa.record_batch([
            pa.array(ids, pa.int64()), pa.array(ids, pa.int64()),
            pa.array(["paid"] * len(ids)),
            pa.array([1_700_000_000_000_000 + i for i in ids], pa.timestamp("us", tz="UTC")),
            pa.array(payload)], schema=SCHEMA))
    return out


def stream(batches: list[pa.RecordBatch], mib: int) -> Iterator[pa.RecordBatch]:
    """Batches cycled until ``mib`` MiB of Arrow data went out."""
    sent = 0
    for batch in itertools.cycle(batches):
        if sent >= mib * MIB:
            return
        sent += batch.nbytes
        yield batch


def sink_for(server: MotoServer, bucket: str, part_size: int, in_flight: int) -> S3Sink:
    return S3Sink(bucket, "bench", **{**server.options(), "part_size": part_size,
                                      "max_in_flight": in_flight})


def run_sink(sink: S3Sink, batches: list[pa.RecordBatch], mib: int,
             batch_no: int) -> tuple[float, str, int]:
    start = time.perf_counter()
    txn = sink.begin_transaction(context(batch=batch_no, columns=()))
    sink.write_arrow(txn, stream(batches, mib))
    handle = sink.pre_commit(txn)
    commit(sink, handle)
    return time.perf_counter() - start, handle.data["key"], handle.data["size"]


def run_raw(client: Any, bucket: str, body: bytes, part_size: int, in_flight: int) -> float:
    start = time.perf_counter()
    key = f"raw/{time.monotonic_ns()}.parquet"
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

    def part(number: int) -> dict[str, Any]:
        chunk = body[(number - 1) * part_size:number * part_size]
        etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id,
                                  PartNumber=number, Body=chunk)["ETag"]
        return {"PartNumber": number, "ETag": etag}

    numbers = range(1, -(-len(body) // part_size) + 1)
    with ThreadPoolExecutor(max_workers=max(1, in_flight)) as pool:
        parts = list(pool.map(part, numbers))
    client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                     MultipartUpload={"Parts": parts})
    elapsed = time.perf_counter() - start
    client.delete_object(Bucket=bucket, Key=key)
    return elapsed


_MEMORY_CHILD = """
import json, pickle, sys
from bench.s3_multipart import make_batches, rss_kib, stream
from twophase.testing.contract import commit, context
sink = pickle.loads(bytes.fromhex(sys.argv[1]))
mib = int(sys.argv[2])
batches = make_batches(2)
txn = sink.begin_transaction(context(batch=999, columns=()))
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # resets VmHWM, the peak RSS, to the RSS now
before = rss_kib("VmRSS")
sink.write_arrow(txn, stream(batches, mib))
handle = sink.pre_commit(txn)
commit(sink, handle)
print(json.dumps({"before_kib": before, "peak_kib": rss_kib("VmHWM"),
                  "size": handle.data["size"], "parts": len(handle.data["parts"])}))
"""


def rss_kib(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_memory(sink: S3Sink, mib: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, pickle.dumps(sink).hex(),
                           str(mib)], capture_output=True, text=True, env=env, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--part-mib", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=2)
    parser.add_argument("--memory-mib", type=int, default=300)
    args = parser.parse_args()
    part_size = args.part_mib * MIB
    batches = make_batches(8)
    with tempfile.TemporaryDirectory() as tmp, private_server(Path(tmp)) as server:
        client, bucket = server.client(), server.new_bucket("bench")
        sink = sink_for(server, bucket, part_size, args.in_flight)
        seconds, key, size = run_sink(sink, batches, args.mib, 0)  # warm-up; its bytes
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()  # are raw's input
        client.delete_object(Bucket=bucket, Key=key)
        run_raw(client, bucket, body, part_size, args.in_flight)
        sink_rates, raw_rates = [], []
        for round_no in range(1, args.rounds + 1):
            raw_first = round_no % 2 == 0  # alternate, so neither always meets a fuller moto
            if raw_first:
                raw_seconds = run_raw(client, bucket, body, part_size, args.in_flight)
            seconds, key, size = run_sink(sink, batches, args.mib, round_no)
            client.delete_object(Bucket=bucket, Key=key)
            if not raw_first:
                raw_seconds = run_raw(client, bucket, body, part_size, args.in_flight)
            sink_rates.append(size / MIB / seconds)
            raw_rates.append(len(body) / MIB / raw_seconds)
            print(f"round {round_no}: {size / MIB:.0f} MiB object; S3Sink {sink_rates[-1]:.1f} "
                  f"MiB/s, raw boto3 {raw_rates[-1]:.1f} MiB/s"
                  f"{' (raw first)' if raw_first else ''}", flush=True)
        ratios = [s / r for s, r in zip(sink_rates, raw_rates, strict=True)]
        print(f"median S3Sink {statistics.median(sink_rates):.1f} MiB/s, raw boto3 "
              f"{statistics.median(raw_rates):.1f} MiB/s, ratio {statistics.median(ratios):.2f}"
              f" (rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
        memory = measure_memory(sink, args.memory_mib)
        grew = (memory["peak_kib"] - memory["before_kib"]) / 1024
        print(f"memory: a task writing {memory['size'] / MIB:.0f} MiB ({memory['parts']} parts "
              f"of {args.part_mib} MiB, {args.in_flight} in flight): RSS before "
              f"{memory['before_kib'] / 1024:.0f} MiB, peak {memory['peak_kib'] / 1024:.0f} MiB,"
              f" grew {grew:.0f} MiB; bound (in_flight + 1) x part = "
              f"{(args.in_flight + 1) * args.part_mib} MiB + one record batch")


if __name__ == "__main__":
    main()
