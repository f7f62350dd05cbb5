"""Secret options by reference (:class:`twophase.Secret`): read where used, never in clear."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from twophase import ConfigurationError, Secret
from twophase.cleanup import target_from
from twophase.kit import reveal

MARKER = "canary-5e1f0c"


def test_a_reference_is_read_where_it_is_revealed(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWOPHASE_TEST_SECRET", MARKER)
    secret_file = tmp_path / "secret"
    secret_file.write_text(MARKER + "\n")
    by_env, by_file = Secret(env="TWOPHASE_TEST_SECRET"), Secret(file=str(secret_file))
    assert reveal(by_env) == reveal(by_file) == MARKER
    assert reveal("clear") == "clear" and reveal(None) is None
    for secret in (by_env, by_file):
        assert MARKER not in repr(secret)
        assert MARKER.encode() not in pickle.dumps(secret)
    secret_file.write_text("rotated")
    assert reveal(by_file) == "rotated"


def test_a_missing_reference_names_what_to_fix(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TWOPHASE_TEST_SECRET", raising=False)
    with pytest.raises(ConfigurationError, match=r"TWOPHASE_TEST_SECRET is not set.*Fix: export"):
        Secret(env="TWOPHASE_TEST_SECRET").reveal()
    with pytest.raises(ConfigurationError, match=r"cannot be read \(FileNotFoundError.*Fix: "):
        Secret(file=str(tmp_path / "absent")).reveal()
    with pytest.raises(ConfigurationError, match="names an environment variable or a file"):
        Secret()
    with pytest.raises(ConfigurationError, match="one key, env or file"):
        Secret.of({"env": "A", "file": "B"})


def test_a_cleanup_config_reads_a_file_reference(tmp_path: Path) -> None:
    secret_file = tmp_path / "db"
    secret_file.write_text(str(tmp_path / "orders.db"))
    target = target_from({"sink": "sinks.sqlite:SQLiteSink",
                          "options": {"path": {"file": str(secret_file)}, "table": "orders"}})
    assert str(target.sink.path) == str(tmp_path / "orders.db")  # type: ignore[attr-defined]
