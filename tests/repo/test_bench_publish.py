"""The benchmark page says what its results file says (``bench/publish.py``): every published
number comes from one run that the page names, never typed by hand."""

from __future__ import annotations

from typing import Any

import pytest

from bench.publish import (
    DOC,
    KEYED_PART,
    LATENCY,
    LATENCY_TARGETS,
    RESULTS,
    Contest,
    below_goal,
    load_results,
    merged,
    rendered,
)

MACHINE = {"commit": "abc1234", "dirty": False, "cpus": 2, "load": ["0.10", "0.20", "0.30"],
           "python": "3.11.7", "spark": "4.3.0", "java": "17.0.15", "at": "2026-11-29 04:00 UTC"}


def contest(name: str, seconds: dict[str, list[float]], rows: int = 1_000) -> dict[str, Any]:
    return {"name": name, "sink": f"{name}Sink", "peer": f"{name} peer", "rows": rows,
            "partitions": 2, "options": {}, "provenance": {**MACHINE, "jit": "full JIT"},
            "runs": [{"writer": writer, "round": number, "seconds": value,
                      "cpu": {"JVM": value, "Python workers": 0.5, "driver": 0.1, "server": 0.0}}
                     for writer, values in seconds.items()
                     for number, value in enumerate(values, 1)]}


def latency_run(target: str, number: int, p50: float, writer: str = "twophase"
                ) -> dict[str, Any]:
    return {"target": target, "writer": writer, "trigger": "default", "round": number,
            "events": 100, "repeated": 0, "missing": 0, "batches": 10, "add_batch_ms": 50.0,
            "ms": {"p50": p50, "p90": 2 * p50, "p99": 3 * p50, "p100": 4 * p50}}


def results(first_p50: float) -> dict[str, Any]:
    return {"peers": {"spark43": {
        "environment": "PySpark 4.3 (.venv)",
        "contests": [contest("fast", {"twophase": [1.0, 2.0, 1.0], "peer": [2.0, 2.0, 2.0],
                                      "noop": [0.5, 0.5, 0.5]}),
                     contest("slow", {"twophase": [4.0, 4.0, 4.0], "peer": [2.0, 2.0, 2.0],
                                      "noop": [0.5, 0.5, 0.5]})]}},
        LATENCY: {"provenance": MACHINE, "events": 100, "rate": 10.0, "warmup_s": 1.0,
                  "peers": {"kafka": "Spark's Kafka sink"},
                  "runs": [latency_run("kafka", 0, first_p50), latency_run("kafka", 1, 100.0),
                           latency_run("kafka", 0, 50.0, "peer")],
                  "cdf": [{"target": "kafka", "writer": writer, "trigger": "default",
                           "ms": [float(n) * scale for n in range(101)]}
                          for writer, scale in (("twophase", 2.0), ("peer", 1.0))]}}


def keyed_part(keyed: list[float]) -> dict[str, Any]:
    """The keyed part of a results file: one database whose keyed writer took ``keyed``."""
    record = contest("mysql", {"keyed": keyed, "insert": [2.0, 2.0], "peer": [2.0, 2.0],
                               "noop": [0.5, 0.5], "noop routed": [0.6, 0.6]})
    return {"environment": "PySpark 4.3 (.venv)",
            "contests": [{**record, "sink": "MySQLXASink", "keys": 100}]}


def test_the_page_says_what_the_checked_in_results_file_says() -> None:
    assert RESULTS.exists(), "run python -m bench.publish: the page has no results file"
    text = DOC.read_text()
    assert rendered(text, load_results()) == text, (
        "docs/benchmarks.md differs from its results file: run python -m bench.publish "
        "--render (never edit the generated sections by hand)")


def test_the_checked_in_run_covers_every_contest_and_target() -> None:
    found = load_results()
    names = {record["name"] for part in found["peers"].values() for record in part["contests"]}
    assert {"kafka", "mysql", "mysql_tls", "postgres", "s3", "sqlite", "http", "delta",
            "iceberg"} <= names
    assert {run["target"] for run in found[LATENCY]["runs"]} == set(LATENCY_TARGETS)
    assert all(record["provenance"]["jit"] == "full JIT" and not record["provenance"]["dirty"]
               for part in found["peers"].values() for record in part["contests"])


def test_the_checked_in_run_has_the_keyed_part() -> None:
    part = load_results().get(KEYED_PART.key)
    assert part, "run python -m bench.publish --only keyed: the results file has no keyed part"
    assert {record["name"] for record in part["contests"]} == set(KEYED_PART.contests)
    assert all(record["provenance"]["jit"] == "full JIT" and not record["provenance"]["dirty"]
               for record in part["contests"])


def test_ratios_are_paired_by_round_and_cpu_is_per_million_rows() -> None:
    fast = Contest.of(results(100.0)["peers"]["spark43"]["contests"][0])
    assert fast.ratios == [2.0, 1.0, 2.0]
    assert fast.ratio == 2.0
    assert fast.cpu["twophase"]["JVM"] == pytest.approx(1_000.0)  # 1 s over 1,000 rows
    assert fast.cpu_total("peer") == pytest.approx(2_600.0)


def test_the_page_names_each_run_and_flags_what_is_short_of_the_floor() -> None:
    page = rendered(DOC.read_text(), results(100.0))
    assert "commit `abc1234`, 2026-11-29 04:00 UTC, 2 CPUs, load 0.10 0.20 0.30" in page
    assert "| `slowSink` / slow peer | **0.50** (below the floor) (0.50, 0.50, 0.50) |" in page
    assert "| kafka | default | 100 / 198 | Spark's Kafka sink | 50 / 99 | 2.00 | 1.00, 1.00 |" \
        in page


def test_the_keyed_section_names_its_run_and_flags_what_is_short_of_the_floor() -> None:
    page = rendered(DOC.read_text(), {**results(100.0), KEYED_PART.key: keyed_part([4.0, 2.0])})
    assert "| **ratio keyed / peer** | **0.750** (below the floor) | 0.500, 1.000 | |" in page
    assert "| MySQLXASink mode='keyed' (routed by key) | 375 | 250, 500 | 3000.0 / 500.0 / " \
        "100.0 / 0.0 |" in page
    assert "- PySpark 4.3 (.venv): mysql (1,000 changes to 100 keys, 2 partitions, 2 rounds " \
        "after a warm-up): commit `abc1234`" in page
    assert below_goal({KEYED_PART.key: keyed_part([4.0, 2.0])}) == [
        "keyed mysql: 0.75 x its peer, below the floor"]
    assert below_goal({KEYED_PART.key: keyed_part([1.0, 2.0])}) == []


def test_a_first_round_slower_than_the_tolerance_is_reported() -> None:
    assert below_goal(results(100.0)) == ["slow: 0.50 x its peer, below the floor"]
    assert below_goal(results(121.0))[1:] == [
        "kafka: the first round's latency more than 20% over the second's"]


def test_a_rerun_replaces_its_contests_and_keeps_the_others_with_their_own_run() -> None:
    first = {"environment": "PySpark 4.3 (.venv)", "provenance": {**MACHINE, "commit": "old"},
             "contests": [{"name": "kafka"}, {"name": "mysql"}]}
    rerun = {"environment": "PySpark 4.3 (.venv)", "provenance": {**MACHINE, "commit": "new"},
             "contests": [{"name": "mysql"}, {"name": "http"}]}
    part = merged(merged(None, first), rerun)
    assert [(c["name"], c["provenance"]["commit"]) for c in part["contests"]] == [
        ("kafka", "old"), ("mysql", "new"), ("http", "new")]
