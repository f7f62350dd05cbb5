"""Every benchmark's JVM runs at full JIT (``bench.session.bench_session``), never with the
tests' C1-only cap, and prints the run's provenance: a number measured against a handicapped
peer, or that names no run, is not published."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.session import C1_CAP, bench_session

BENCH = Path(__file__).resolve().parents[2] / "bench"
#: A Spark session made any other way than the benchmarks' own.
OTHER_SESSION = re.compile(r"\blocal_session\(|SparkSession\.builder|" + re.escape(C1_CAP))


def test_no_benchmark_makes_its_own_session_or_caps_the_jit() -> None:
    offending = [f"{path.name}:{number}" for path in sorted(BENCH.glob("*.py"))
                 if path.name != "session.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if OTHER_SESSION.search(line) and not line.lstrip().startswith(("#", "``"))]
    assert offending == [], f"benchmarks with a session of their own: {offending}"


def test_every_benchmark_session_prints_its_provenance() -> None:
    for path in sorted(BENCH.glob("*.py")):
        text = path.read_text()
        if "bench_session(" in text and path.name != "session.py":
            assert "provenance(" in text or "latency_runner" in path.name, path.name


def test_a_capped_jit_is_refused() -> None:
    with pytest.raises(ValueError, match="full JIT"):
        bench_session("refused", conf={"spark.driver.extraJavaOptions": f"-XX:{C1_CAP}"})
