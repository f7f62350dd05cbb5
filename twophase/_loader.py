"""One loader for ``"module:Name"`` strings (the demo's, the crash driver's, cleanup's sinks)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from twophase.errors import ConfigurationError
from twophase.sink import TwoPhaseCommitSink


def load_object(reference: str) -> Any:
    """The object ``reference`` names, as ``package.module:Name``."""
    module_name, _, name = reference.partition(":")
    if not module_name or not name:
        raise ConfigurationError(f"{reference!r} does not name an object.",
                                 fix="write it as 'package.module:Name', e.g. "
                                 "'sinks.sqlite:SQLiteSink'")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load {reference!r}: {exc}.",
                                 fix="check the module is installed and defines that name") from exc


def build_sink(reference: str, options: Mapping[str, Any]) -> TwoPhaseCommitSink[Any]:
    """The sink that the class or factory ``reference`` builds from ``options``."""
    factory = load_object(reference)
    try:
        built = factory(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot build sink {reference!r}: {exc}.",
                                 fix="give the options its constructor takes") from exc
    if not isinstance(built, TwoPhaseCommitSink):
        raise ConfigurationError(f"{reference!r} did not build a TwoPhaseCommitSink.",
                                 fix="point at a sink class or a factory returning a sink")
    return built


def sink_class_name(sink: TwoPhaseCommitSink[Any]) -> str:
    """``module:Class`` of ``sink``, as :func:`build_sink` (and cleanup's ``--sink``) read it."""
    return f"{type(sink).__module__}:{type(sink).__qualname__}"
