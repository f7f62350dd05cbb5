"""The driver's way to the catalog: one client per process and settings, errors of its
properties named, the table loaded or created. Only the driver imports this module (and with
it pyiceberg's catalog, SQLAlchemy or the REST client): the executors write files from the
sink's :class:`~sinks.iceberg.layout.Layout` alone."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping, Sequence

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NoSuchTableError, NotInstalledError
from pyiceberg.table import Table

from sinks.iceberg import schema
from sinks.iceberg.errors import SYSTEM
from twophase import Column, ConfigurationError

log = logging.getLogger(__name__)

#: What pyiceberg says when it has no location for a new table (no ``warehouse`` property, no
#: ``location`` on the namespace).
NO_DEFAULT_PATH = "No default path is set"
#: pyiceberg's SQL catalog (its table of tables, ``iceberg_tables``, keyed by catalog name).
SQL_CATALOG_MODULE = "pyiceberg.catalog.sql"

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
    ``create``. A SQL catalog's table of another catalog name, and a new table with nowhere
    to go (no ``warehouse``), are ConfigurationErrors naming the option to fix."""
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        _require_not_under_another_name(catalog, identifier, create=create, where=where)
        if not create:
            raise
    log.info("creating %s from the query's columns (readers see it in the catalog named %r)",
             where, catalog.name)
    try:
        return schema.create_table(catalog, identifier, columns, partition_by=partition_by,
                                   properties=properties)
    except ValueError as exc:
        if NO_DEFAULT_PATH not in str(exc):
            raise
        raise ConfigurationError(
            f"{where}: create=True, but catalog= has no \"warehouse\" (nor the table's "
            "namespace a \"location\"), so pyiceberg has nowhere to put a new table.",
            fix='add "warehouse" to catalog= (say "warehouse": "s3://bucket/warehouse" or '
                '"file:///data/warehouse": new tables go under it), or create the table '
                "yourself and leave create=True out") from None


def _require_not_under_another_name(catalog: Catalog, identifier: str, *, create: bool,
                                    where: str) -> None:
    """Refuse a table missing from a SQL catalog of this name that its database holds under
    another catalog name: the name is a column of the catalog's tables, and each name sees
    only its own (a table made under "default" is invisible to ``load_catalog("lake")``)."""
    names = _other_catalog_names_holding(catalog, identifier)
    if not names:
        return
    raise ConfigurationError(
        f"{where} does not exist, but the SQL catalog's database holds {identifier} under the "
        f"catalog name {', '.join(map(repr, names))}: a SQL catalog sees only the tables of "
        "its own name" + (", and create=True would make a second table that readers of "
                          f"{names[0]!r} never see" if create else "") + ".",
        fix=f"pass catalog_name={names[0]!r} (the name your readers load the catalog by, "
            f"load_catalog({names[0]!r}, ...))")


def _other_catalog_names_holding(catalog: Catalog, identifier: str) -> list[str]:
    """For a SQL catalog, the other catalog names its database holds ``identifier`` under
    (none for any other catalog: a REST catalog's name is only a label)."""
    sql = sys.modules.get(SQL_CATALOG_MODULE)  # loaded by any SQL catalog
    if sql is None or not isinstance(catalog, sql.SqlCatalog):
        return []
    from sqlalchemy import select  # noqa: PLC0415 - the SQL catalog's dependency
    from sqlalchemy.orm import Session  # noqa: PLC0415

    tables = sql.IcebergTables
    statement = select(tables.catalog_name).distinct().where(
        tables.table_namespace == Catalog.namespace_to_string(Catalog.namespace_from(identifier)),
        tables.table_name == Catalog.table_name_from(identifier),
        tables.catalog_name != catalog.name)
    with Session(catalog.engine) as session:
        return sorted(str(name) for name in session.scalars(statement))
