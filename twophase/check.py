"""``python -m twophase.check``: what is wrong, before the first batch.

Names a sink and its state locations as cleanup does (``--sink``, ``--options``, ``--state``,
``--namespace``, or ``--config`` with ``[[target]]`` tables; secrets by reference:
``{"password": {"env": "DB_PASSWORD"}}``), and prints one row per check with its result,
its cause and its fix:

* imports: twophase and the sink's client libraries import on the driver; with ``--master``
  (or a session, from Python), on every executor too, at the driver's versions of twophase,
  pyspark, pyarrow and the client libraries;
* target: the sink's schema check (with ``--columns``) and its in-doubt listing answer, over
  verified TLS;
* grants: a probe transaction under the namespace, with a reserved query id no run or cleanup
  takes for its own, begun, pre-committed with no rows and aborted, and none left in doubt (a
  sink whose probe would be visible, HTTP, says what it could not verify instead);
* target (executors): with ``--master``, the same probe made by every executor, each its own;
* state location: a probe file beside the state file takes the state store's writes
  (conditional writes on S3), then is removed;
* clocks: with Spark, every executor's clock near the driver's.

Exit codes: 0 every check passed (or could not be verified: read the table), 1 one failed,
2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import textwrap
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from twophase._preflight import CheckResult, Outcome, run_checks
from twophase._secrets import resolved
from twophase.cleanup import target_from
from twophase.errors import ConfigurationError, TwoPhaseError
from twophase.sink import Column

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Widths of the table's columns (the cause and fix wrap within theirs).
CHECK_WIDTH, RESULT_WIDTH, TEXT_WIDTH = 24, 12, 60
HEADER = ("check", "result", "cause", "fix")
APP_NAME = "twophase-check"


def parse_columns(text: str) -> tuple[Column, ...]:
    """``"id bigint not null, price decimal(12,2), tags array<string>"`` as columns (types as
    Spark's ``simpleString``; commas inside parentheses or angle brackets stay in the type)."""
    columns = []
    for field in _top_level_fields(text):
        name, _, rest = field.strip().partition(" ")
        kind = rest.strip()
        not_null = kind.lower().endswith(" not null")
        kind = kind[:-len(" not null")].strip() if not_null else kind
        if not name or not kind:
            raise ConfigurationError(f"cannot read column {field.strip()!r} of --columns.",
                                     fix="write each column as 'name type [not null]', "
                                     "comma-separated")
        columns.append(Column(name, kind, nullable=not not_null))
    return tuple(columns)


def _top_level_fields(text: str) -> Iterator[str]:
    depth, start = 0, 0
    for index, char in enumerate(text):
        depth += (char in "(<") - (char in ")>")
        if char == "," and depth == 0:
            yield text[start:index]
            start = index + 1
    if text[start:].strip():
        yield text[start:]


def format_table(results: Sequence[CheckResult]) -> str:
    """The results as a text table: check, result, cause, fix (the last two wrapped)."""
    lines = [_row(HEADER), _row(("-" * CHECK_WIDTH, "-" * RESULT_WIDTH, "-" * TEXT_WIDTH,
                                 "-" * TEXT_WIDTH))]
    for result in results:
        cause, fix, check = (_wrapped(result.cause, TEXT_WIDTH), _wrapped(result.fix, TEXT_WIDTH),
                             _wrapped(result.check, CHECK_WIDTH))
        for index in range(max(len(cause), len(fix), len(check))):
            lines.append(_row((_at(check, index), result.outcome.value if index == 0 else "",
                               _at(cause, index), _at(fix, index))))
    return "\n".join(lines)


def _wrapped(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def _row(cells: Sequence[str]) -> str:
    check, result, cause, fix = cells
    return (f"{check:<{CHECK_WIDTH}}  {result:<{RESULT_WIDTH}}  {cause:<{TEXT_WIDTH}}  "
            f"{fix}").rstrip()


def _at(lines: list[str], index: int) -> str:
    return lines[index] if index < len(lines) else ""


def exit_code(results: Sequence[CheckResult]) -> int:
    return EXIT_FAILED if any(r.outcome is Outcome.FAILED for r in results) else EXIT_OK


def _entries(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The targets to check, as cleanup's config tables."""
    if args.config:
        entries: list[dict[str, Any]] = tomllib.loads(
            Path(args.config).read_text()).get("target", [])
        if not entries:
            raise ConfigurationError(f"{args.config} has no [[target]] table.",
                                     fix="see `python -m twophase.cleanup --help`")
        return entries
    if not args.sink:
        raise ConfigurationError("no sink given.", fix="pass --sink and --state, or --config FILE")
    return [{"sink": args.sink, "options": json.loads(args.options), "states": args.state,
             "state_options": json.loads(args.state_options), "namespace": args.namespace,
             "columns": args.columns}]


def check_entry(entry: Mapping[str, Any], spark: Any = None) -> list[CheckResult]:
    """Every check of one target (a cleanup config table, with ``columns`` optional)."""
    target = target_from(entry)
    return run_checks(target.sink, target.namespace,
                      states=[store.location for store in target.states],
                      state_options=resolved(entry.get("state_options", {})),
                      columns=parse_columns(entry.get("columns") or ""), spark=spark)


@contextmanager
def spark_session(master: str | None) -> Iterator[Any]:
    """A Spark session on ``master`` for the executors' checks (None: no Spark)."""
    if master is None:
        yield None
        return
    try:
        from pyspark.sql import SparkSession  # noqa: PLC0415 - only with --master
    except ImportError as exc:
        raise ConfigurationError("--master needs pyspark.",
                                 fix="pip install 'twophase[spark]'") from exc
    session = SparkSession.builder.master(master).appName(APP_NAME).getOrCreate()
    try:
        yield session
    finally:
        session.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m twophase.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="TOML file with [[target]] tables (as cleanup's; "
                        "each may add columns = \"...\")")
    parser.add_argument("--sink", help="module:Class of the sink")
    parser.add_argument("--options", default="{}", help="JSON keyword arguments of the sink; "
                        'a secret as a reference: {"password": {"env": "DB_PASSWORD"}}')
    parser.add_argument("--state", action="append", default=[],
                        help="a state location: a directory or s3://bucket/prefix")
    parser.add_argument("--state-options", default="{}",
                        help="JSON options of an S3 state location (endpoint_url, region, ...)")
    parser.add_argument("--namespace", help="the query's namespace (default: its state's, "
                        "else the sink's default)")
    parser.add_argument("--columns", help="the query's columns, 'name type [not null], ...' "
                        "(Spark's type names): the sink checks its schema against them")
    parser.add_argument("--master", help="a Spark master URL: also check every executor")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        entries = _entries(args)
        with spark_session(args.master) as spark:
            results = [result for entry in entries for result in check_entry(entry, spark)]
    except (TwoPhaseError, tomllib.TOMLDecodeError, json.JSONDecodeError, OSError) as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    sys.stdout.write(format_table(results) + "\n")
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
