"""The alert rules shipped in deploy/prometheus: ``promtool check rules`` and ``promtool test
rules`` (each alert fires on the series that should trigger it and stays silent otherwise),
and the unit tests catch a rule that is missing or fires too eagerly; the rules and the
Grafana dashboard name only metrics that twophase exports."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from setups.servers.prometheus import promtool
from tests import REPO
from twophase import cleanup
from twophase._metrics import MEMBERS_LOST, key, retry_key
from twophase._state import BatchRecord, StateStore
from twophase.metrics import StateCollector

RULES_DIR = REPO / "deploy" / "prometheus"
RULES = RULES_DIR / "twophase-rules.yml"
RULE_TESTS = RULES_DIR / "twophase-rules.test.yml"
DASHBOARD = RULES_DIR.parent / "grafana" / "twophase.json"

#: Per alert: its condition, and a looser one that also fires where it must stay silent.
LOOSENED = {
    "TwoPhaseTransactionLost": ("transactions_lost_total[1h]) > 0",
                                "transactions_lost_total[1h]) >= 0"),
    "TwoPhaseGroupBatchSplit": ("members_lost_total[1h]) > 0", "members_lost_total[1h]) >= 0"),
    "TwoPhaseBatchPendingTooLong": ("_seconds > 600", "_seconds > -1"),
    "TwoPhaseOrphansOlderThanCleanupAge": ("_seconds > twophase_cleanup", "_seconds >= 0 * "
                                           "twophase_cleanup"),
    "TwoPhaseQueryFencedRepeatedly": ("[1h]) > 1", "[1h]) > 0"),
    "TwoPhaseCommitsFallingBehind": ("count[10m]) > 1", "count[10m]) > -1"),
    "TwoPhaseNoBatchCommitted": ("> 3600", "> -1"),
    "TwoPhaseCleanupFailing": ("exit_code > 0", "exit_code >= 0"),
}


def test_the_rules_are_valid_and_their_unit_tests_pass() -> None:
    checked = promtool("check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(LOOSENED)} rules found" in checked.stdout
    tested = promtool("test", "rules", RULE_TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def mutated_rules(tmp_path: Path, old: str, new: str) -> Path:
    """The unit tests beside a copy of the rules with ``old`` replaced by ``new`` once."""
    text = RULES.read_text()
    assert text.count(old) == 1, f"{old!r} is not one place in the rules"
    (tmp_path / RULES.name).write_text(text.replace(old, new))
    return Path(shutil.copy(RULE_TESTS, tmp_path))


@pytest.mark.parametrize("alert", sorted(LOOSENED))
def test_the_unit_tests_catch_an_alert_that_is_missing_or_too_eager(alert: str,
                                                                    tmp_path: Path) -> None:
    missing = promtool("test", "rules", mutated_rules(tmp_path, f"alert: {alert}\n",
                                                      f"alert: {alert}Renamed\n"))
    assert missing.returncode != 0 and alert in missing.stdout + missing.stderr
    eager = promtool("test", "rules", mutated_rules(tmp_path, *LOOSENED[alert]))
    assert eager.returncode != 0 and alert in eager.stdout + eager.stderr


def exported_names(tmp_path: Path) -> set[str]:
    """Every metric name twophase exports: a query's (every count set) and cleanup's."""
    store = StateStore(tmp_path / "state")
    store.start_run("orders", {"sink": "sqlite"})
    done = BatchRecord(batch=0, epoch=1, txns=1, rows=1, already_committed=0, decided_at=1.0,
                       done_at=2.0, decision_ms=1.0, commit_ms=1.0)
    store.update(lambda state: replace(state, history=(done,)).counted(
        {retry_key("commit", TimeoutError()): 1, key(MEMBERS_LOST, "events"): 1}), epoch=None)
    registry = CollectorRegistry()
    registry.register(StateCollector([store]))
    names = {sample.name for family in text_string_to_metric_families(
        generate_latest(registry).decode()) for sample in family.samples}
    cleanup_names = ("last_run_timestamp_seconds", "exit_code", "actions",
                     *(name for name, _ in cleanup._IN_DOUBT_GAUGES))
    return names | {cleanup.METRICS_PREFIX + name for name in cleanup_names}


@pytest.mark.parametrize("path", [RULES, DASHBOARD], ids=["rules", "dashboard"])
def test_the_rules_and_the_dashboard_use_only_metrics_twophase_exports(path: Path,
                                                                      tmp_path: Path) -> None:
    used = set(re.findall(r"\btwophase_[a-z_]+", path.read_text()))
    used -= {"twophase_rules"}  # the file's own name in comments
    assert used, f"{path} names no metric"
    assert used <= exported_names(tmp_path), used - exported_names(tmp_path)


def test_the_dashboard_is_a_grafana_model_with_a_query_per_panel() -> None:
    model = json.loads(DASHBOARD.read_text())
    assert model["uid"] == "twophase" and model["panels"]
    assert all(panel["targets"] and all(t["expr"] for t in panel["targets"])
               for panel in model["panels"])
