"""Transaction ids and handles: the values that cross processes and live in state files."""

import json

import pytest

from tests import DATA
from twophase import ConfigurationError, Handle, StateCorruptError, TxnId, _handle

GOLDEN = DATA / "handles"
QUERY = "3f2a9c1e-7b6d-4a01-9f00-000000000000"


def make_txn(**overrides: int) -> TxnId:
    fields = dict(epoch=4, batch=17, partition=2, attempt=345)
    fields.update(overrides)
    return TxnId.open(namespace="orders", query_id=QUERY, clock=lambda: 1763730000.5, **fields)


def test_txn_id_text_form_round_trips_and_is_readable() -> None:
    txn = make_txn()
    assert str(txn) == "orders.3f2a9c1e7b6d4a01.4.17.2.345.1763730000"
    assert TxnId.parse(str(txn)) == txn
    assert TxnId.from_parts(txn.global_part, txn.branch_part) == txn
    assert txn.belongs_to("orders", QUERY)
    assert not txn.belongs_to("orders", "ffffffff-7b6d-4a01-9f00-000000000000")


def test_txn_id_parts_fit_a_64_byte_xa_gtrid_at_the_limits() -> None:
    txn = TxnId.open(namespace="n" * _handle.NAMESPACE_MAX_LENGTH, query_id=QUERY,
                     epoch=999_999, batch=9_999_999_999, partition=999_999,
                     attempt=999_999_999_999, clock=lambda: 99_999_999_999)
    assert len(txn.global_part) <= 64
    assert len(txn.branch_part) <= 64
    assert TxnId.parse(str(txn)) == txn


@pytest.mark.parametrize("namespace", ["", "has space", "dots.break.parsing", "x" * 25])
def test_unusable_namespace_is_a_configuration_error_with_a_fix(namespace: str) -> None:
    with pytest.raises(ConfigurationError, match="Fix: use 1-24 characters"):
        make_txn_with_namespace(namespace)


def make_txn_with_namespace(namespace: str) -> TxnId:
    return TxnId.open(namespace=namespace, query_id=QUERY, epoch=1, batch=0, partition=0,
                      attempt=0)


@pytest.mark.parametrize(
    "text", ["orders.3f2a.1.2.3.4.5", "other-system-xid", "orders.3f2a9c1e7b6d4a01.1.2.3.4"])
def test_foreign_ids_do_not_parse(text: str) -> None:
    with pytest.raises(ValueError, match="not a twophase transaction id"):
        TxnId.parse(text)


def test_handle_json_round_trip() -> None:
    handle = Handle(make_txn(), "sqlite", rows=10, data={"upload_id": "u-1", "parts": [1, 2]})
    assert Handle.loads(handle.dumps()) == handle
    assert json.loads(handle.dumps())["v"] == _handle.HANDLE_FORMAT_VERSION


def test_every_golden_handle_of_an_older_format_still_loads() -> None:
    files = sorted(GOLDEN.glob("v*.json"))
    assert files, "golden handle files are missing"
    for path in files:
        handle = Handle.loads(path.read_text())
        assert str(handle.txn_id) == "orders.3f2a9c1e7b6d4a01.4.17.2.345.1763730000"
        assert handle.rows == 1000
        assert handle.data["upload_id"] == "2~abc"


def test_a_format_change_keeps_v1_handles_loadable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulate the next format version: v1 files must go through the upgrade chain."""
    upgraded: list[object] = []

    def upgrade_v1(obj: dict[str, object]) -> dict[str, object]:
        upgraded.append(obj["txn"])
        return {**obj, "v": 2}

    monkeypatch.setattr(_handle, "HANDLE_FORMAT_VERSION", 2)
    monkeypatch.setitem(_handle._HANDLE_UPGRADES, 1, upgrade_v1)
    handle = Handle.loads((GOLDEN / "v1.json").read_text())
    assert upgraded == [str(handle.txn_id)]
    assert handle.rows == 1000
    assert json.loads(handle.dumps())["v"] == 2


def test_a_handle_from_a_newer_version_is_refused_loudly() -> None:
    newer = {"v": _handle.HANDLE_FORMAT_VERSION + 1, "sink": "sqlite", "txn": "x", "rows": 0,
             "data": {}}
    with pytest.raises(StateCorruptError, match="newer twophase version"):
        Handle.from_json(newer)
