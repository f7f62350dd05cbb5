"""The driver's way to the catalog: one client per process and settings, errors of its
properties named, the table loaded or created. Only the driver imports this module (and with
it pyiceberg's catalog, SQLAlchemy or the REST client): the executors write files from the
sink's :class:`~sinks.iceberg.layout.Layout` alone."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchTableError, NotInstalledError
from pyiceberg.table import Table

from sinks.iceberg import schema
from sinks.iceberg.errors import SYSTEM
from twophase import Column, ConfigurationError

log = logging.getLogger(__name__)

_catalogs: dict[tuple[str, tuple[tuple[str, str], ...]], Catalog] = {}
_catalogs_lock = threading.Lock()


def open_catalog(name: str, properties: Mapping[str, str]) -> Catalog:
    """One catalog client per process and settings (its engine or HTTP session reused);
    properties pyiceberg cannot make a catalog of are a ConfigurationError naming the type
    (never the properties: they hold credentials)."""
    key = (name, tuple(sorted(properties.items())))
    with _catalogs_lock:
        if key not in _catalogs:
            try:
                _catalogs[key] = load_catalog(name, **properties)
            except (ValueError, NotInstalledError) as exc:
                kind = properties.get("type", "(inferred from the uri)")
                raise ConfigurationError(
                    f"{SYSTEM}: pyiceberg cannot make a catalog of type {kind!r} from "
                    f"catalog= ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}).",
                    fix='give pyiceberg\'s catalog properties: {"type": "sql", "uri": ..., '
                        '"warehouse": ...} or {"type": "rest", "uri": ...} (and its extra: '
                        "pip install 'pyiceberg[sql-postgres]' ...)") from None
        return _catalogs[key]


def table_for(catalog: Catalog, identifier: str, columns: Sequence[Column], *, create: bool,
              partition_by: Sequence[str], properties: Mapping[str, str], where: str) -> Table:
    """The table; created from the query's columns (and its namespace) if missing and
    ``create``."""
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        if not create:
            raise
    log.info("creating %s from the query's columns", where)
    return schema.create_table(catalog, identifier, columns, partition_by=partition_by,
                               properties=properties)
