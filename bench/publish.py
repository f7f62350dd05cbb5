"""The one benchmark command: every sink against what users would pick instead, each contest in
its own environment, and the latency table; the docs' tables and plots regenerated from one
results file, so a published number always names its run.

Run from the repository root on a quiet machine (never in CI; about 40 minutes on 2 cores)::

    python -m bench.publish [--rounds 3] [--only mysql delta keyed latency ...] [--render]

What it runs, each as a process of its own, in turn:

* :data:`ENVIRONMENTS`: ``bench.spark_peers`` (alternating rounds of the sink, its peer and
  Spark's ``noop``; medians, every round, CPU per row by process) for the sinks whose peer runs
  on the project's PySpark (``.venv``), then Delta on PySpark 4.2 (``scripts/bench-spark42``)
  and Iceberg on PySpark 4.1 (``scripts/bench-spark41``), the only ones their Spark writers
  run on; every session at full JIT (``bench.session``).
* :data:`KEYED_PART`: ``bench.keyed``, the keyed mode into MySQL and PostgreSQL against the
  hand-written ``foreachBatch`` upsert users write instead (with the insert mode and Spark's
  ``noop``, plain and routed by key), on the project's PySpark.
* ``bench.latency`` for every target at each trigger of :data:`LATENCY_ROUNDS`, with its
  rounds (at the default trigger the first round against the second: the cold first minute).

Each part writes its results (``--json`` of those modules) into :data:`RESULTS` under its own
key, so ``--only`` reruns a part and keeps the others; then :func:`render` rewrites the
generated sections of :data:`DOC` (between :func:`begin` and :data:`END` markers) and the plots
from that file alone. ``--render`` only renders. ``tests/repo/test_bench_publish.py`` checks
that the docs say what the results file says.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import keyed
from bench.session import describe
from bench.spark_peers import NOOP, PEER, TWOPHASE, floor_mark, measured, rounds_of

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "benchmarks.json"
DOC = ROOT / "docs" / "benchmarks.md"
PEERS_PLOT = ROOT / "docs" / "peers.png"
LATENCY_PLOT = ROOT / "docs" / "latency.png"
DEFAULT_ROUNDS = 3
LATENCY_TARGETS = ("kafka", "mysql", "postgres", "sqlite", "s3", "http", "delta", "iceberg")
#: The rounds of each trigger: at the default trigger the first round against the second is
#: the cold first minute's measure; at 1 s the trigger dominates, one round tells.
LATENCY_ROUNDS = {"default": 2, "1s": 1}
LATENCY = "latency"
#: The floor (exactly-once never slower than the peer) and the goal, as ratios to the peer.
FLOOR, GOAL = 1.0, 1.25
#: How much worse than the second round the first may be at the default trigger.
COLD_TOLERANCE = 1.20
END = "<!-- end of generated -->"


@dataclass(frozen=True)
class Environment:
    """Where a group of contests runs: a PySpark its peers' Spark writers run on."""

    key: str
    label: str
    #: The command that runs the benchmark there (``bench.spark_peers``), before its
    #: arguments: the contests, ``--rounds`` and ``--json``.
    command: tuple[str, ...]
    contests: tuple[str, ...]


ENVIRONMENTS = (
    Environment("spark43", "PySpark 4.3 (.venv)",
                ("nice", sys.executable, "-m", "bench.spark_peers"),
                ("kafka", "mysql", "mysql_tls", "postgres", "s3", "sqlite", "http", "redis",
                 "nats")),
    Environment("spark42", "PySpark 4.2 (scripts/bench-spark42)",
                (str(ROOT / "scripts" / "bench-spark42"),), ("delta",)),
    Environment("spark41", "PySpark 4.1 (scripts/bench-spark41)",
                (str(ROOT / "scripts" / "bench-spark41"),), ("iceberg",)),
)
#: The keyed mode's part: ``bench.keyed`` over its databases, kept under its own key.
KEYED_PART = Environment("keyed", "PySpark 4.3 (.venv)",
                         ("nice", sys.executable, "-m", "bench.keyed"), ("mysql", "postgres"))


# --- running ----------------------------------------------------------------------------------

def run_part(environment: Environment, contests: Iterable[str], rounds: int
             ) -> tuple[dict[str, Any], str | None]:
    """``environment``'s benchmark over ``contests``: its results file (the contests that
    ended, if it failed) and its failure, if any."""
    with tempfile.TemporaryDirectory(prefix="twophase-publish-") as tmp:
        out = Path(tmp) / "peers.json"
        done = subprocess.run([*environment.command, *contests, "--rounds", str(rounds),
                               "--json", str(out)], cwd=ROOT, check=False)
        found: dict[str, Any] = (json.loads(out.read_text()) if out.exists()
                                 else {"contests": []})
    failure = f"{environment.label}: exit status {done.returncode}" if done.returncode else None
    return {**found, "environment": environment.label}, failure


def run_latency(targets: Iterable[str]) -> tuple[dict[str, Any] | None, str | None]:
    """``bench.latency`` over ``targets`` at each of :data:`LATENCY_ROUNDS`' triggers: their
    summaries as one (None if no run counted) and the failures, if any (a run that failed,
    the rest kept)."""
    parts, failures = [], []
    for trigger, rounds in LATENCY_ROUNDS.items():
        with tempfile.TemporaryDirectory(prefix="twophase-publish-") as tmp:
            out = Path(tmp) / "latency.json"
            done = subprocess.run(["nice", sys.executable, "-m", "bench.latency", *targets,
                                   "--trigger", trigger, "--rounds", str(rounds), "--out", tmp,
                                   "--json", str(out)], cwd=ROOT, check=False)
            if out.exists():
                parts.append(json.loads(out.read_text()))
        if done.returncode:
            failures.append(f"latency at trigger {trigger}: exit status {done.returncode}")
    combined = ({**parts[0], "runs": [run for part in parts for run in part["runs"]],
                 "cdf": [line for part in parts for line in part["cdf"]]} if parts else None)
    return combined, "; ".join(failures) or None


def load_results(path: Path = RESULTS) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return found


def save_results(results: dict[str, Any], path: Path = RESULTS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def measure(only: set[str], rounds: int) -> list[str]:
    """Every part ``only`` names (all if empty), each saved into :data:`RESULTS` as it ends;
    the failures (what ended of a failed part is kept)."""
    failures = []
    for environment in ENVIRONMENTS:
        contests = [name for name in environment.contests if not only or name in only]
        if contests:
            failures += measure_part(environment, contests, rounds, "peers")
    if not only or KEYED_PART.key in only:
        failures += measure_part(KEYED_PART, KEYED_PART.contests, rounds)
    if not only or LATENCY in only:
        summary, failure = run_latency(LATENCY_TARGETS)
        if summary is not None:
            results = load_results()
            results[LATENCY] = summary
            save_results(results)
        failures += [failure] if failure else []
    return failures


def measure_part(environment: Environment, contests: Iterable[str], rounds: int, *within: str
                 ) -> list[str]:
    """``contests`` run in ``environment``, saved into :data:`RESULTS` under its key (in the
    part ``within`` names, if any) as :func:`merged` keeps them; its failure, if any."""
    found, failure = run_part(environment, contests, rounds)
    results = load_results()
    parts = results
    for key in within:
        parts = parts.setdefault(key, {})
    if found["contests"]:
        parts[environment.key] = merged(parts.get(environment.key), found)
    save_results(results)
    return [failure] if failure else []


def merged(kept: dict[str, Any] | None, found: dict[str, Any]) -> dict[str, Any]:
    """An environment's contests: those ``found`` by a new run, and those ``kept`` from an
    earlier one that it did not rerun, each with the provenance of the run that measured it."""
    def measured(part: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"provenance": part.get("provenance"), **contest} for contest in part["contests"]]

    new = measured(found)
    names = {contest["name"] for contest in new}
    older = [contest for contest in (measured(kept) if kept else [])
             if contest["name"] not in names]
    return {"environment": found["environment"], "contests": older + new}


# --- rendering --------------------------------------------------------------------------------

def begin(section: str) -> str:
    return f"<!-- generated by python -m bench.publish from {RESULTS.relative_to(ROOT)}: " \
           f"{section} -->"


@dataclass(frozen=True)
class Contest:
    """One sink against its peer, from the results file: rates and CPU per writer, paired."""

    name: str
    sink: str
    peer: str
    rows: int
    #: Per writer, every round's rows/s, in round order.
    rates: dict[str, list[float]]
    #: Per writer, the median CPU seconds per 1M rows of each process.
    cpu: dict[str, dict[str, float]]

    @classmethod
    def of(cls, record: dict[str, Any]) -> Contest:
        found = measured(record)
        return cls(record["name"], record["sink"], record["peer"], record["rows"],
                   {writer: runs.rates for writer, runs in found.items()},
                   {writer: runs.cpu for writer, runs in found.items()})

    @property
    def ratios(self) -> list[float]:
        """Each round's sink / peer."""
        return self.paired(TWOPHASE, PEER)

    def paired(self, writer: str, other: str) -> list[float]:
        """Each round's ``writer`` / ``other``."""
        return [a / b for a, b in zip(self.rates[writer], self.rates[other], strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    def median_rate(self, writer: str) -> float:
        return statistics.median(self.rates[writer])

    def cpu_total(self, writer: str) -> float:
        return sum(self.cpu[writer].values())


def contests(results: dict[str, Any]) -> list[Contest]:
    """Every contest of the results file, in :data:`ENVIRONMENTS`' order."""
    return [Contest.of(record) for part in environments(results) for record in part["contests"]]


def environments(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The results' environments in :data:`ENVIRONMENTS`' order."""
    found = results.get("peers", {})
    return [found[environment.key] for environment in ENVIRONMENTS
            if environment.key in found]


def peers_section(results: dict[str, Any]) -> str:
    """The peers table, each environment's provenance under it."""
    lines = ["| sink / what users would pick instead | ratio: median (every round) | rows/s: "
             "sink / peer / Spark `noop` | CPU s per 1M rows, all processes: sink / peer | "
             "the sink's by process: JVM / Python workers / driver / server |",
             "|---|---|---|---|---|"]
    for contest in contests(results):
        lines.append(
            f"| `{contest.sink}` / {contest.peer} | **{contest.ratio:.2f}**"
            f"{floor_mark(contest.ratio, FLOOR)} "
            f"({', '.join(f'{value:.2f}' for value in contest.ratios)}) | "
            f"{contest.median_rate(TWOPHASE):,.0f} / {contest.median_rate(PEER):,.0f} / "
            f"{contest.median_rate(NOOP):,.0f} | {contest.cpu_total(TWOPHASE):.1f} / "
            f"{contest.cpu_total(PEER):.1f} | "
            f"{' / '.join(f'{value:.1f}' for value in contest.cpu[TWOPHASE].values())} |")
    lines.append("")
    for part in environments(results):
        lines += provenance_lines(part, lambda record: f"{record['rows']:,} rows")
    return "\n".join(lines)


def provenance_lines(part: dict[str, Any], size: Callable[[dict[str, Any]], str]
                     ) -> list[str]:
    """A line per run that measured ``part``'s contests: their names, the ``size`` of what
    they wrote, their partitions and rounds, and the run's provenance."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for record in part["contests"]:
        runs.setdefault(json.dumps(record["provenance"], sort_keys=True), []).append(record)
    return [f"- {part['environment']}: {', '.join(r['name'] for r in records)} "
            f"({size(records[0])}, {records[0]['partitions']} partitions, "
            f"{rounds_of(records[0])} rounds after a warm-up): "
            f"{describe(records[0]['provenance'], markdown=True)}."
            for records in runs.values()]


def keyed_section(results: dict[str, Any]) -> str:
    """A table per database of the keyed part (``bench.keyed``'s own), its provenance under
    them."""
    part = results.get(KEYED_PART.key)
    if not part:
        return "No keyed run in the results file yet: run python -m bench.publish --only keyed."
    lines = []
    for record in part["contests"]:
        lines += [f"`{record['sink']}` ({record['name']}):", "",
                  *keyed.table(record, FLOOR), ""]
    lines += provenance_lines(part, lambda record: f"{record['rows']:,} changes to "
                                                   f"{record['keys']:,} keys")
    return "\n".join(lines)


def keyed_contests(results: dict[str, Any]) -> list[Contest]:
    """The keyed part's contests, a database each."""
    part = results.get(KEYED_PART.key)
    return [Contest.of(record) for record in part["contests"]] if part else []


def pooled(latency: dict[str, Any], target: str, writer: str, trigger: str
           ) -> list[float] | None:
    """A writer's CDF quantiles over its rounds (0-100 %), or None if it did not run."""
    return next((line["ms"] for line in latency["cdf"] if (line["target"], line["writer"],
                 line["trigger"]) == (target, writer, trigger)), None)


def first_and_second(latency: dict[str, Any], target: str, trigger: str
                     ) -> tuple[dict[str, float], dict[str, float]] | None:
    """The twophase writer's first and second rounds' percentiles."""
    by_round = {run["round"]: run["ms"] for run in latency["runs"]
                if (run["target"], run["writer"], run["trigger"]) == (target, TWOPHASE,
                                                                      trigger)}
    return (by_round[0], by_round[1]) if {0, 1} <= set(by_round) else None


def latency_section(results: dict[str, Any]) -> str:
    """The latency table (p50 / p99 pooled over the rounds, the first round against the second)
    and its provenance."""
    latency = results.get(LATENCY)
    if not latency:
        return "No latency run in the results file yet."
    lines = ["| target | trigger | twophase p50 / p99 (ms) | what users would pick instead | "
             "its p50 / p99 | p50 ratio | twophase's first round / second, p50 and p99 |",
             "|---|---|---|---|---|---|---|"]
    for target in dict.fromkeys(run["target"] for run in latency["runs"]):
        for trigger in dict.fromkeys(run["trigger"] for run in latency["runs"]):
            ours, theirs = (pooled(latency, target, writer, trigger) for writer in (TWOPHASE,
                                                                                    PEER))
            if ours is None or theirs is None:
                continue
            rounds = first_and_second(latency, target, trigger)
            cold = (f"{rounds[0]['p50'] / rounds[1]['p50']:.2f}, "
                    f"{rounds[0]['p99'] / rounds[1]['p99']:.2f}" if rounds else "-")
            lines.append(f"| {target} | {trigger} | {ours[50]:,.0f} / {ours[99]:,.0f} | "
                         f"{latency['peers'][target]} | {theirs[50]:,.0f} / {theirs[99]:,.0f} "
                         f"| {ours[50] / theirs[50]:.2f} | {cold} |")
    once = all(not run["missing"] and (run["writer"] == PEER or not run["repeated"])
               for run in latency["runs"])
    lines += ["", f"{latency['events']:,} events at {latency['rate']:,.0f}/s per run, the "
              f"first {latency['warmup_s']:g} s left out, "
              f"{', '.join(f'{n} round(s) at the {t} trigger' for t, n in LATENCY_ROUNDS.items())}"
              f", the writers' order turning; {len(latency['runs'])} runs, "
              f"{SEEN[once]}"
              f"; {describe(latency['provenance'], markdown=True)}."]
    return "\n".join(lines)


#: How the latency section says whether every run saw every event, each once where it must.
SEEN = {True: "every event seen, each once by the exactly-once writers",
        False: "NOT every event seen once: see the results file"}
SECTIONS = {"peers": peers_section, LATENCY: latency_section, KEYED_PART.key: keyed_section}


def rendered(doc: str, results: dict[str, Any]) -> str:
    """``doc`` with each generated section replaced by what ``results`` says."""
    for section, make in SECTIONS.items():
        pattern = re.compile(re.escape(begin(section)) + r"\n.*?" + re.escape(END), re.S)
        found = pattern.search(doc)
        if found is None:
            raise SystemExit(f"{DOC.relative_to(ROOT)} lacks the markers of {section!r}: "
                             f"{begin(section)} ... {END}")
        doc = f"{doc[:found.start()]}{begin(section)}\n{make(results)}\n{END}{doc[found.end():]}"
    return doc


def plot_peers(results: dict[str, Any], path: Path) -> None:
    """Each contest's ratio, its rounds' spread as error bars, the floor and the goal."""
    import matplotlib  # noqa: PLC0415 - only the renderer plots
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    found = contests(results)
    figure, axes = plt.subplots(figsize=(9, 4.5))
    medians = [contest.ratio for contest in found]
    axes.bar([contest.name for contest in found], medians,
             yerr=[[m - min(c.ratios) for m, c in zip(medians, found, strict=True)],
                   [max(c.ratios) - m for m, c in zip(medians, found, strict=True)]],
             capsize=4, color=["tab:green" if m >= FLOOR else "tab:red" for m in medians])
    axes.axhline(FLOOR, color="black", linewidth=1, label=f"floor {FLOOR:g} x")
    axes.axhline(GOAL, color="grey", linestyle="--", linewidth=1, label=f"goal {GOAL:g} x")
    axes.set(ylabel="rows/s of the sink / of its peer", title="Each sink against what users "
             "would pick instead (median, spread of rounds)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(figure)


def plot_latency(results: dict[str, Any], path: Path) -> None:
    """Each target's CDF, a line per writer and trigger."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    latency = results[LATENCY]
    targets = list(dict.fromkeys(line["target"] for line in latency["cdf"]))
    columns = 4
    figure, grid = plt.subplots((len(targets) + columns - 1) // columns, columns,
                                figsize=(16, 7.5), squeeze=False, sharex=True, sharey=True)
    for axes, target in zip(grid.flat, targets, strict=False):
        for line in latency["cdf"]:
            if line["target"] == target:
                writer = latency["peers"][target] if line["writer"] == PEER else line["writer"]
                shares = [n / (len(line["ms"]) - 1) for n in range(len(line["ms"]))]
                axes.plot(line["ms"], shares, label=f"{writer}, {line['trigger']}")
        axes.set(xscale="log", title=f"Kafka -> {target}")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=7)
    for axes in grid[-1]:
        axes.set_xlabel("latency (ms)")
    for axes in grid[:, 0]:
        axes.set_ylabel("share of events")
    figure.tight_layout()
    figure.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(figure)


def render(results: dict[str, Any]) -> None:
    """The docs' generated sections and plots, from ``results``."""
    DOC.write_text(rendered(DOC.read_text(), results))
    if results.get("peers"):
        plot_peers(results, PEERS_PLOT)
    if results.get(LATENCY):
        plot_latency(results, LATENCY_PLOT)


def below_goal(results: dict[str, Any]) -> list[str]:
    """What the run did not reach: ratios under the floor, first rounds over the tolerance."""
    found = [f"{contest.name}: {contest.ratio:.2f} x its peer, below the floor"
             for contest in contests(results) if contest.ratio < FLOOR]
    found += [f"keyed {contest.name}: {ratio:.2f} x its peer, below the floor"
              for contest in keyed_contests(results)
              if (ratio := statistics.median(contest.paired(keyed.KEYED, PEER))) < FLOOR]
    latency = results.get(LATENCY)
    for target in LATENCY_TARGETS if latency else ():
        rounds = first_and_second(latency or {}, target, "default")
        if rounds and any(rounds[0][key] > COLD_TOLERANCE * rounds[1][key]
                          for key in ("p50", "p99")):
            found.append(f"{target}: the first round's latency more than "
                         f"{COLD_TOLERANCE - 1:.0%} over the second's")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [name for environment in ENVIRONMENTS for name in environment.contests]
    parser.add_argument("--only", nargs="+", default=[],
                        choices=[*names, KEYED_PART.key, LATENCY],
                        help="rerun only these parts (the others' results are kept)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--render", action="store_true",
                        help="only regenerate the docs from the results file")
    args = parser.parse_args()
    failures = [] if args.render else measure(set(args.only), args.rounds)
    results = load_results()
    render(results)
    for line in below_goal(results):
        print(line, file=sys.stderr)
    if failures:
        raise SystemExit("Failed (their results are not in the docs):\n" + "\n".join(failures))


if __name__ == "__main__":
    main()
