"""What a query needs before its first batch, checked one thing at a time: the preflight.

Each check is a small function returning a :class:`CheckResult` (what was checked, its
outcome, the cause, the fix); :func:`run_checks` runs those that apply, each guarded so that
one failing never hides the others. ``python -m twophase.check`` prints them; a query's start
runs the executors' imports check (:func:`require_executor_imports`), raising if it fails.

===============  ==========================================================================
check            how it probes
===============  ==========================================================================
imports          twophase and the sink's client libraries (the distributions of the extras
                 ``sink.client_extras()`` names: a group's, each member's) import here; with
                 Spark, on every executor too
                 (one task each, shipped by value: it runs where twophase is missing),
                 their versions and pyspark's and pyarrow's equal the driver's
target           ``sink.check_schema(columns)`` if columns are given, then the committer's
                 ``list_in_doubt(namespace)``: the target answers, TLS verifies, the
                 in-doubt listing works
grants           a probe transaction (:meth:`TxnId.probe`: a reserved query id no run or
                 cleanup takes for its own) begun, written with no rows, pre-committed and
                 aborted; then the in-doubt listing holds no probe. A sink whose probe would
                 be visible (``invisible_probe = False``) is reported as not verified
executors'       with Spark, once the executors' imports passed ("target (executors)"): the
target           same probe made by every executor, each under its own id (``attempt`` 1,
                 2, ...), as its tasks begin and pre-commit theirs; then none left in doubt
state location   a probe file beside the state file, written by the state store's own
                 storage: created, replaced naming its version, and (with conditional
                 writes, S3) a create over it and a replace naming a stale version refused;
                 then removed
clocks           with Spark: each executor's clock within :data:`MAX_CLOCK_SKEW_S` of the
                 driver's
===============  ==========================================================================
"""

from __future__ import annotations

import enum
import functools
import importlib
import importlib.metadata
import logging
import re
import socket
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twophase._handle import Handle, TxnId
from twophase._retry import RetryPolicy
from twophase._storage import Storage, is_s3, storage_at
from twophase._task import rows_delivery, run_transaction
from twophase.errors import ConfigurationError, TwoPhaseError
from twophase.sink import (
    AbortOutcome,
    Column,
    Committer,
    TransactionContext,
    TwoPhaseCommitSink,
)

log = logging.getLogger(__name__)

#: Distributions whose versions must agree between the driver and every executor.
FRAMEWORK_DISTRIBUTIONS = ("twophase", "pyspark", "pyarrow")
#: The furthest an executor's clock may be from the driver's: transaction ids carry their
#: creation time, which cleanup ages orphans by, and Kafka's commit deadlines are counted
#: from it (S3 refuses requests signed 15 minutes off).
MAX_CLOCK_SKEW_S = 30.0
#: The probe transaction's begin is tried once: a preflight reports, it does not wait.
PROBE_RETRY = RetryPolicy(max_attempts=1)
#: The file the state location's probe writes and removes, beside the state file.
PROBE_FILE_NAME = "preflight.probe"
PROBE_BODY = b'{"twophase": "preflight probe: safe to delete"}'
#: A version no object has: a conditional replace naming it must be refused.
#: The state location check's name (its cause names the location).
STATE_CHECK = "state location"
STALE_VERSION = '"00000000000000000000000000000000"'

FIX_INSTALL = "pip install 'twophase[{extra}]' (the same versions as the driver's)"
FIX_SHIP = ("ship twophase and the sink's client libraries to every executor, at the driver's "
            "versions: installed in the executors' image or as a cluster library "
            "(pip install 'twophase[{extra}]'), the twophase wheel by --py-files / "
            "spark.submit.pyFiles (pure-Python clients), or a packed virtualenv by "
            "spark.archives (the docs, docs/deploying.md)")
FIX_SAME_VERSIONS = ("install the same versions on the driver and every executor (one "
                     "environment: a packed venv or image shipped with the job)")
FIX_CONDITIONAL = ("keep the state on a store that honours conditional writes (PutObject "
                   "with If-None-Match and If-Match: AWS S3, MinIO, ...) or on a local or "
                   "mounted file system")
FIX_PROBE_LEFT = ("python -m twophase.cleanup --sink ... --options ... aborts them once they "
                  "are older than its orphan age")
FIX_VISIBLE_PROBE = ("the first batch verifies it: watch its commit (python -m twophase.status "
                     "LOCATION)")
EXECUTOR_IMPORTS_CHECK = "imports (executors)"
EXECUTOR_TARGET_CHECK = "target (executors)"
FIX_CLOCKS = "synchronise the clocks of the driver and every executor (NTP)"
FIX_UNEXPECTED = "an unclassified error: see the log above, fix the cause"
_EXTRA_RE = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class Outcome(enum.Enum):
    PASSED = "pass"
    FAILED = "FAIL"
    UNVERIFIED = "not verified"


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict: what it saw (or why it failed) and, unless it passed, the fix."""

    check: str
    outcome: Outcome
    cause: str
    fix: str = ""


def passed(check: str, cause: str) -> CheckResult:
    return CheckResult(check, Outcome.PASSED, cause)


def failed(check: str, cause: str, fix: str) -> CheckResult:
    return CheckResult(check, Outcome.FAILED, cause, fix)


def guarded(check: str, run: Callable[[], CheckResult]) -> CheckResult:
    """``run()``, with an error turned into the check's failure (cause and fix)."""
    try:
        return run()
    except TwoPhaseError as exc:
        return failed(check, exc.cause, exc.fix or FIX_UNEXPECTED)
    except Exception as exc:
        log.exception("check %s failed unexpectedly", check)
        return failed(check, f"{type(exc).__name__}: {exc}", FIX_UNEXPECTED)


# -- imports and versions ----------------------------------------------------------------------


def client_distributions(kind: str) -> tuple[str, ...]:
    """The distributions of twophase's extra named ``kind`` (a sink's client libraries)."""
    try:
        requires = importlib.metadata.requires("twophase") or []
    except importlib.metadata.PackageNotFoundError:
        return ()
    names = []
    for requirement in requires:
        extra, name = _EXTRA_RE.search(requirement), _NAME_RE.match(requirement)
        if extra and name and extra.group(1) == kind and name.group(1) != "twophase":
            names.append(name.group(1))
    return tuple(names)


def sink_clients(sink: TwoPhaseCommitSink[Any]) -> tuple[str, ...]:
    """The client libraries (distributions) of ``sink``'s extras."""
    return tuple(dict.fromkeys(name for extra in sink.client_extras()
                               for name in client_distributions(extra)))


def install_extras(sink: TwoPhaseCommitSink[Any]) -> str:
    """What goes between the brackets of ``pip install 'twophase[...]'`` for ``sink``."""
    return ",".join(sink.client_extras())


def versions(distributions: Iterable[str]) -> dict[str, str | None]:
    """Each distribution's installed version (None: not installed). One without package
    metadata (pyspark from the ``pyspark.zip`` Spark puts on its workers' path) is asked its
    module's ``__version__``. (Shipped by value to executors: stdlib only, no helpers.)"""
    found: dict[str, str | None] = {}
    for name in distributions:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            try:
                version = getattr(importlib.import_module(name.replace("-", "_")),
                                  "__version__", None)
            except Exception:  # any failure to import it: not installed
                version = None
            found[name] = version if isinstance(version, str) else None
    return found


def import_failures(distributions: Iterable[str]) -> dict[str, str]:
    """Why each distribution that does not import fails (missing, or its import raises)."""
    modules: dict[str, list[str]] = {}
    for module, owners in importlib.metadata.packages_distributions().items():
        for owner in owners:
            modules.setdefault(owner.lower().replace("_", "-"), []).append(module)
    failures = {}
    for name in distributions:
        # no package metadata (pyspark from Spark's pyspark.zip): the module named alike
        found = modules.get(name.lower().replace("_", "-")) or [name.replace("-", "_")]
        for module in found:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                failures[name] = ("not installed" if exc.name == module else
                                  f"import {module}: {type(exc).__name__}: {exc}")
                break
            except Exception as exc:
                failures[name] = f"import {module}: {type(exc).__name__}: {exc}"
                break
    return failures


def check_driver_imports(sink: TwoPhaseCommitSink[Any]) -> CheckResult:
    """twophase and the sink's client libraries import in this process."""
    clients = sink_clients(sink)
    failures = import_failures(("twophase", *clients))
    if failures:
        return failed("imports (driver)", "; ".join(f"{name}: {why}"
                                                    for name, why in failures.items()),
                      FIX_INSTALL.format(extra=install_extras(sink)))
    return passed("imports (driver)", _listed(versions(("twophase", *clients))))


def _listed(found: Mapping[str, str | None]) -> str:
    return ", ".join(f"{name} {version or '(none)'}" for name, version in found.items())


# -- executors (Spark) -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutorReport:
    """What one task saw on its executor."""

    host: str
    versions: dict[str, str | None]
    failures: dict[str, str]
    clock: float


#: What :func:`report_here` yields (plain values: the executor may not import twophase).
Seen = tuple[str, dict[str, str | None], dict[str, str], float]


def report_here(distributions: tuple[str, ...], _rows: Iterable[Any]) -> Iterator[Seen]:
    """The task of the executors' job: this worker's host, versions, import failures and
    clock. Shipped by value (:func:`shipped_by_value`), it runs where twophase is missing."""
    yield (socket.gethostname(), versions(distributions), import_failures(distributions),
           time.time())


def shipped_by_value(function: Callable[..., Any],
                     *callees: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of ``function`` that cloudpickle sends by value rather than by its module's
    name, the functions of this module it calls (``callees``) copied likewise: an executor
    runs it without importing twophase (its other globals must be stdlib modules)."""
    scope = {name: function.__globals__[name] for name in function.__code__.co_names
             if name in function.__globals__}
    scope.update({callee.__name__: shipped_by_value(callee) for callee in callees})
    copy = types.FunctionType(function.__code__, scope, function.__name__,
                              function.__defaults__, function.__closure__)
    copy.__qualname__ = function.__qualname__
    return copy


@dataclass(frozen=True)
class ExecutorsSeen:
    """The executors' reports, and the driver's clock before and after the job."""

    reports: tuple[ExecutorReport, ...]
    started: float
    ended: float


def executor_tasks(spark: Any) -> int:
    """As many tasks as ``spark`` has executors (local mode: one), one for each (as Spark
    spreads them: a check's best effort)."""
    context = spark.sparkContext
    # the block managers: every executor's and the driver's (one in local mode)
    managers = int(context._jsc.sc().getExecutorMemoryStatus().size())
    return 1 if context.master.startswith("local") else max(1, managers - 1)


def ask_executors(spark: Any, distributions: tuple[str, ...]) -> ExecutorsSeen:
    """One task per executor (local mode: one), each reporting :class:`ExecutorReport`."""
    context, tasks = spark.sparkContext, executor_tasks(spark)
    task = shipped_by_value(report_here, versions, import_failures)
    started = time.time()
    seen = (context.parallelize(range(tasks), tasks)
            .mapPartitions(functools.partial(task, distributions)).collect())
    return ExecutorsSeen(tuple(ExecutorReport(*report) for report in seen), started,
                         time.time())


def check_executor_imports(seen: ExecutorsSeen, driver: Mapping[str, str | None],
                           extras: str) -> CheckResult:
    """Every executor imports what the driver does, at the driver's versions."""
    problems: list[str] = []
    for report in seen.reports:
        problems.extend(f"{report.host}: {name}: {why}" for name, why in report.failures.items())
        problems.extend(f"{report.host}: {name} {version or '(none)'}, the driver has "
                        f"{driver[name] or '(none)'}"
                        for name, version in report.versions.items()
                        if version != driver[name] and name not in report.failures)
    if problems:
        fix = FIX_SHIP.format(extra=extras) if any(r.failures for r in seen.reports) \
            else FIX_SAME_VERSIONS
        return failed(EXECUTOR_IMPORTS_CHECK, "; ".join(sorted(set(problems))), fix)
    return passed(EXECUTOR_IMPORTS_CHECK, f"{len(seen.reports)} executor(s) as the driver: "
                  f"{_listed(driver)}")


def clock_skew_s(clock: float, started: float, ended: float) -> float:
    """How far ``clock``, read during the driver's ``[started, ended]``, is outside it."""
    return max(started - clock, clock - ended, 0.0)


def check_executor_clocks(seen: ExecutorsSeen) -> CheckResult:
    skews = {report.host: clock_skew_s(report.clock, seen.started, seen.ended)
             for report in seen.reports}
    off = {host: skew for host, skew in skews.items() if skew > MAX_CLOCK_SKEW_S}
    if off:
        return failed("clocks (executors)", "; ".join(
            f"{host} is {skew:.1f}s off the driver's clock" for host, skew in off.items())
            + f" (at most {MAX_CLOCK_SKEW_S:.0f}s)", FIX_CLOCKS)
    return passed("clocks (executors)", f"{len(skews)} executor(s) within "
                  f"{max(skews.values(), default=0.0):.1f}s of the driver (the job took "
                  f"{seen.ended - seen.started:.1f}s)")


def check_executors(spark: Any, sink: TwoPhaseCommitSink[Any]) -> list[CheckResult]:
    """The executors' imports, versions and clocks, by one small job."""
    names, extras = (*FRAMEWORK_DISTRIBUTIONS, *sink_clients(sink)), install_extras(sink)
    try:
        seen = ask_executors(spark, names)
    except Exception as exc:  # the job itself failed: an executor cannot run a Python task
        log.warning("the executors' check job failed", exc_info=True)
        return [failed(EXECUTOR_IMPORTS_CHECK, f"the check's job failed: "
                       f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                       FIX_SHIP.format(extra=extras))]
    return [check_executor_imports(seen, versions(names), extras),
            check_executor_clocks(seen)]


def require_executor_imports(spark: Any, sink: TwoPhaseCommitSink[Any]) -> None:
    """Raise :class:`ConfigurationError` at a query's start, before anything is written,
    unless every executor imports twophase and ``sink``'s client libraries at the driver's
    versions (the cause names each executor's host and what it lacks). Not checked over
    Spark Connect (no SparkContext: the server's Python workers are the driver's), nor in
    local mode on the driver's own Python (the driver imported them)."""
    if not _executors_elsewhere(spark):
        return
    for result in check_executors(spark, sink):
        if result.outcome is not Outcome.FAILED:
            log.info("%s: %s", result.check, result.cause)
        elif result.check == EXECUTOR_IMPORTS_CHECK:
            raise ConfigurationError(f"the executors cannot run the {sink.kind} sink: "
                                     f"{result.cause}.", fix=result.fix)
        else:
            log.warning("%s: %s. Fix: %s", result.check, result.cause, result.fix)


def _executors_elsewhere(spark: Any) -> bool:
    """Do ``spark``'s executors run another Python than this process's?"""
    from twophase._spark import is_connect  # noqa: PLC0415 - pyspark: only with a session

    if is_connect(spark):
        return False
    context = spark.sparkContext
    return not (context.master.startswith("local") and context.pythonExec == sys.executable)


# -- the target ---------------------------------------------------------------------------------


def check_target(sink: TwoPhaseCommitSink[Any], namespace: str,
                 columns: Sequence[Column]) -> CheckResult:
    """The target answers (TLS verified): its schema check if columns are given, and the
    committer's in-doubt listing of ``namespace``."""
    if columns:
        sink.check_schema(columns)
    with sink.committer() as committer:
        listed = committer.list_in_doubt(namespace)
    schema = f"schema of {len(columns)} columns checked, " if columns else ""
    return passed("target", f"{sink!r} answers: {schema}{len(listed)} transaction(s) of "
                  f"namespace {namespace!r} in doubt")


def check_probe(sink: TwoPhaseCommitSink[Any], namespace: str,
                columns: Sequence[Column]) -> CheckResult:
    """A probe transaction begun, pre-committed with no rows and aborted; none left."""
    if not sink.invisible_probe:
        return CheckResult("grants (probe)", Outcome.UNVERIFIED,
                           f"a {sink.kind} sink's transaction is not probed: it would be a "
                           f"visible write to {sink!r} (or would not reach it), so what its "
                           "commits need of the target (access, authorization) is not "
                           "verified before the first batch", FIX_VISIBLE_PROBE)
    txn_id = TxnId.probe(namespace)
    with sink.committer() as committer:
        try:
            outcome = probe_transaction(sink, committer, txn_id, columns)
        finally:
            left = probes_left(committer, namespace)
    if left:
        return probes_still_in_doubt("grants (probe)", left)
    return passed("grants (probe)", f"probe {txn_id} begun, pre-committed and aborted "
                  f"({outcome.value}); no probe left in doubt")


def probe_transaction(sink: TwoPhaseCommitSink[Any], committer: Committer, txn_id: TxnId,
                      columns: Sequence[Column]) -> AbortOutcome:
    """The transaction ``txn_id`` begun, pre-committed with no rows and aborted."""
    handle = run_transaction(sink, TransactionContext(txn_id, tuple(columns)),
                             rows_delivery(()), retry=PROBE_RETRY)
    return committer.abort(handle)


#: What an executor's probe reports: its host, and its result there.
ExecutorProbe = tuple[str, CheckResult]


def check_executor_targets(spark: Any, sink: TwoPhaseCommitSink[Any], namespace: str,
                           columns: Sequence[Column]) -> CheckResult:
    """From every executor, what its tasks need of the target: a probe transaction of its own
    (``TxnId.probe(attempt=k)``) begun, pre-committed with no rows and aborted there, as its
    tasks begin and pre-commit theirs (the network, TLS, the credentials and grants as the
    executor sees them); then, from here, no probe left in doubt."""
    if not sink.invisible_probe:
        return CheckResult(EXECUTOR_TARGET_CHECK, Outcome.UNVERIFIED,
                           f"a {sink.kind} sink's transaction is not probed from the executors "
                           "either", FIX_VISIBLE_PROBE)
    tasks = executor_tasks(spark)

    def probe_here(index: int, _rows: Iterable[Any]) -> Iterator[ExecutorProbe]:
        def probe() -> CheckResult:
            with sink.committer() as committer:
                outcome = probe_transaction(sink, committer,
                                            TxnId.probe(namespace, attempt=index + 1), columns)
            return passed(EXECUTOR_TARGET_CHECK, outcome.value)

        yield socket.gethostname(), guarded(EXECUTOR_TARGET_CHECK, probe)

    reports: list[ExecutorProbe] = (spark.sparkContext.parallelize(range(tasks), tasks)
                                    .mapPartitionsWithIndex(probe_here).collect())
    with sink.committer() as committer:
        left = probes_left(committer, namespace)
    refused = {host: result for host, result in reports if result.outcome is Outcome.FAILED}
    if refused:
        return failed(EXECUTOR_TARGET_CHECK, "; ".join(
            f"{host}: {result.cause}" for host, result in sorted(refused.items())),
            "; ".join(sorted({result.fix for result in refused.values() if result.fix})))
    if left:
        return probes_still_in_doubt(EXECUTOR_TARGET_CHECK, left)
    return passed(EXECUTOR_TARGET_CHECK, f"{len(reports)} executor(s) began, pre-committed "
                  f"and aborted a probe transaction of their own; no probe left in doubt")


def probes_still_in_doubt(check: str, left: Sequence[Handle]) -> CheckResult:
    """``check`` failed: probe transactions ``left`` in doubt after their abort."""
    return failed(check, f"probe transaction(s) still in doubt after their abort: "
                  f"{', '.join(str(h.txn_id) for h in left)}", FIX_PROBE_LEFT)


def probes_left(committer: Committer, namespace: str) -> list[Handle]:
    """Abort every probe transaction the in-doubt listing holds; those still listed after."""
    for handle in _probes(committer, namespace):
        log.info("aborting probe transaction %s", handle.txn_id)
        committer.abort(handle)
    return _probes(committer, namespace)


def _probes(committer: Committer, namespace: str) -> list[Handle]:
    return [h for h in committer.list_in_doubt(namespace) if h.txn_id.is_probe]


# -- the state location -------------------------------------------------------------------------


def check_state_location(location: str, options: Mapping[str, Any] | None) -> CheckResult:
    """A probe file beside the state file, through the state store's storage (see the
    module docstring); an S3 store that ignores conditional writes fails."""
    storage = storage_at(location, PROBE_FILE_NAME, options)
    check = STATE_CHECK
    with storage.exclusive():
        found = storage.read()
        version = storage.replace(PROBE_BODY, None if found is None else found.version)
        if version is None:
            return failed(check, f"writing {storage.location} naming its current version was "
                          "refused", FIX_CONDITIONAL)
        if storage.conditional and (ignored := _conditions_ignored(storage)):
            return failed(check, f"{storage.location}: the store accepted {ignored}: it "
                          "ignores conditional writes, so two runs could both write the "
                          "state", FIX_CONDITIONAL)
        written = storage.read()
    if written is None or written.data != PROBE_BODY:
        return failed(check, f"{storage.location} does not read back what was written",
                      FIX_CONDITIONAL)
    how = "conditional writes honoured" if storage.conditional else "locked, replaced atomically"
    return passed(check, f"{location}: probe file written and read back, {how}; "
                  f"{_removed(storage)}")


def _conditions_ignored(storage: Storage) -> str | None:
    """Which of the writes that must be refused the store accepted (None: both refused)."""
    if storage.replace(PROBE_BODY, None) is not None:
        return "a create (If-None-Match: *) over an existing object"
    if storage.replace(PROBE_BODY, STALE_VERSION) is not None:
        return "a replace naming a stale version (If-Match)"
    return None


def _removed(storage: Storage) -> str:
    """Remove the probe file; a refused delete leaves it (harmless: the next check reuses it)."""
    try:
        storage.remove()
    except TwoPhaseError as exc:
        log.info("probe file %s not removed: %s", storage.location, exc)
        return f"probe file left ({exc.cause}): harmless, reused by the next check"
    return "probe file removed"


# -- all of them --------------------------------------------------------------------------------


def run_checks(sink: TwoPhaseCommitSink[Any], namespace: str, *,
               states: Sequence[str] = (), state_options: Mapping[str, Any] | None = None,
               columns: Sequence[Column] = (), spark: Any = None) -> list[CheckResult]:
    """Every check that applies, in order; each runs whatever the others found."""
    results = [guarded("imports (driver)", lambda: check_driver_imports(sink))]
    if spark is not None:
        results.extend(check_executors(spark, sink))
    results.append(guarded("target", lambda: check_target(sink, namespace, columns)))
    results.append(guarded("grants (probe)", lambda: check_probe(sink, namespace, columns)))
    if spark is not None and all(r.outcome is not Outcome.FAILED for r in results
                                 if r.check == EXECUTOR_IMPORTS_CHECK):
        results.append(guarded(EXECUTOR_TARGET_CHECK, lambda: check_executor_targets(
            spark, sink, namespace, columns)))
    results.extend(guarded(STATE_CHECK, functools.partial(
        check_state_location, location, state_options if is_s3(location) else None))
        for location in states)
    return results
