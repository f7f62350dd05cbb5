"""A batch's snapshot swapped in by a local transaction of the SQL catalog's own database, shared
with other members of a sink group (:class:`twophase.kit.LocalCommitMember`): a PostgreSQL table
staged in the same database and this lake table become visible in the same instant.

The SQL catalog keeps a table's current metadata file in one row of ``iceberg_tables``; a commit
is a new metadata file and a compare-and-swap of that row's ``metadata_location``. Here the swap
runs on the connection the group gives (the database's local transaction that also publishes the
other members' rows), so it commits when that transaction commits, and not otherwise:

1. ``SELECT metadata_location ... FOR UPDATE`` on the connection: the version read, locked
   (a racing committer of this table waits for the local transaction to end);
2. the table at that version (its metadata file), settled by the committer's own
   ``settle_on`` (the same proof, the same file checks, ONE snapshot built by
   :func:`~sinks.iceberg.snapshots.commit`), whose catalog attempt writes the new metadata
   file and then runs ``UPDATE iceberg_tables SET metadata_location = <new>,
   previous_metadata_location = <read> WHERE catalog_name, table_namespace, table_name AND
   metadata_location = <read>`` on the connection: a row count other than 1 is a race
   (``CommitFailedException``: retryable).

A crash (or an error of any member) before the local transaction commits leaves a metadata
file no catalog row names (unreferenced, as a failed pyiceberg commit leaves one) and the
data files unreferenced: recovery settles the batch again. After the commit the proof holds.

Private API: the catalog attempt uses ``Catalog._update_and_stage_table`` and
``Catalog._write_metadata`` of pyiceberg 0.12.0 (what ``SqlCatalog.commit_table`` does before
its own swap); pinned in ``constraints.txt``.

Domain: ``postgresql://host:port/dbname`` of the catalog's ``uri`` when the catalog is SQL on
PostgreSQL; None otherwise (no local commit: a SQLite or REST catalog).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import psycopg
from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.io import load_file_io
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.update import TableRequirement, TableUpdate
from sqlalchemy.engine import make_url

from sinks.iceberg.errors import SYSTEM, classify
from twophase import CommitOutcome, FatalError, Handle, RetryableError, TxnId
from twophase.kit import classified

if TYPE_CHECKING:
    from sinks.iceberg.committer import IcebergCommitter

log = logging.getLogger(__name__)

POSTGRES_PORT = 5432
#: SQLSTATE classes worth a retry: connection, rollback (serialization, deadlock), resources,
#: operator intervention.
_RETRYABLE_CLASSES = ("08", "40", "53", "57")
_CURRENT = ("SELECT metadata_location FROM iceberg_tables WHERE catalog_name = %s AND "
            "table_namespace = %s AND table_name = %s FOR UPDATE")
_SWAP = ("UPDATE iceberg_tables SET metadata_location = %s, previous_metadata_location = %s "
         "WHERE catalog_name = %s AND table_namespace = %s AND table_name = %s "
         "AND metadata_location = %s")


def postgres_domain(uri: str) -> str | None:
    """``postgresql://host:port/dbname`` of a SQLAlchemy URI on PostgreSQL, else None."""
    url = make_url(uri)
    if url.get_backend_name() != "postgresql" or not url.host or not url.database:
        return None
    return f"postgresql://{url.host}:{url.port or POSTGRES_PORT}/{url.database}"


def offer(committer: IcebergCommitter) -> IcebergLocalCommit | None:
    """The committer's local commit, if its catalog is SQL on PostgreSQL."""
    properties = committer.sink.catalog_properties
    uri = properties.get("uri", "")
    if properties.get("type", "sql") != "sql" or postgres_domain(uri) is None:
        return None
    return IcebergLocalCommit(committer)


class IcebergLocalCommit:
    """The Iceberg sink's :class:`twophase.kit.LocalCommitMember` (module docstring)."""

    def __init__(self, committer: IcebergCommitter) -> None:
        self.committer = committer
        self.sink = committer.sink
        self._uri = self.sink.catalog_properties["uri"]
        identifier = Catalog.identifier_to_tuple(self.sink.table)
        self._namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
        self._name = Catalog.table_name_from(identifier)

    def local_domain(self) -> str | None:
        return postgres_domain(self._uri)

    @contextlib.contextmanager
    def local_transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A new session of the catalog's database in a transaction (when this member comes
        first in the group's commit order)."""
        url = make_url(self._uri)
        with _psycopg_errors(f"publishing to {self.sink.where}"), psycopg.connect(
                host=url.host, port=url.port or POSTGRES_PORT, user=url.username,
                password=url.password, dbname=url.database, autocommit=False,
                options="-c TimeZone=UTC") as connection:
            yield connection  # committed at the end of the block, rolled back on an error

    def settle_in(self, connection: psycopg.Connection[Any], handles: Sequence[Handle]
                  ) -> Mapping[TxnId, CommitOutcome]:
        """Prove or commit ``handles`` (one batch's) on ``connection`` (module docstring)."""
        batch = handles[0].txn_id.batch
        what = (f"commit of batch {batch} ({len(handles)} transactions) to {self.sink.where} "
                f"in a local transaction of {self.local_domain()}")
        with _psycopg_errors(what), classified(classify, what, self.sink.errors_caught):
            return self.committer.settle_on(self._locked(connection), handles)

    def _locked(self, connection: psycopg.Connection[Any]) -> Table:
        """The table at the version the catalog row names, the row locked; its commits swap
        that row on ``connection``."""
        catalog = self.sink.catalog()
        row = connection.execute(_CURRENT, (catalog.name, self._namespace, self._name)
                                 ).fetchone()
        if row is None or not row[0]:
            raise NoSuchTableError(f"{self.sink.where} is not in the catalog's iceberg_tables")
        location = str(row[0])
        io = load_file_io(properties=dict(catalog.properties), location=location)
        metadata = FromInputFile.table_metadata(io.new_input(location))
        identifier = (*Catalog.identifier_to_tuple(self._namespace), self._name)
        current = Table(identifier, metadata, location, io, catalog)
        on_connection = _SwapOn(catalog, connection, current)
        return Table(identifier, metadata, location, io, cast(Catalog, on_connection))


class _SwapOn:
    """The catalog as a table committed on the local connection sees it: ``commit_table``
    stages the metadata as ``SqlCatalog.commit_table`` does, then swaps the row on the
    connection; anything else is the catalog's."""

    def __init__(self, catalog: Catalog, connection: psycopg.Connection[Any],
                 current: Table) -> None:
        if not isinstance(catalog, MetastoreCatalog):
            raise FatalError(f"{SYSTEM}: the catalog {catalog.name!r} stages no metadata files "
                             "(not a SQL catalog).", fix="use a SQL catalog on PostgreSQL")
        self._catalog, self._connection, self._current = catalog, connection, current

    def __getattr__(self, name: str) -> Any:
        return getattr(self._catalog, name)

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...],
                     updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        current = self._current  # the version read under the lock (not the one-attempt view)
        staged = self._catalog._update_and_stage_table(current, table.name(), requirements,
                                                       updates)
        self._catalog._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        identifier = current.name()
        swapped = self._connection.execute(_SWAP, (
            staged.metadata_location, current.metadata_location, self._catalog.name,
            Catalog.namespace_to_string(Catalog.namespace_from(identifier)),
            Catalog.table_name_from(identifier), current.metadata_location)).rowcount
        if swapped != 1:
            raise CommitFailedException(
                f"Table has been updated by another process: {'.'.join(identifier)}")
        self._current = Table(identifier, staged.metadata, staged.metadata_location,
                              staged.io, self._catalog)
        return CommitTableResponse(metadata=staged.metadata,  # type: ignore[call-arg]
                                   metadata_location=staged.metadata_location)


@contextlib.contextmanager
def _psycopg_errors(what: str) -> Iterator[None]:
    """A PostgreSQL error on the shared connection: retryable if its class says so (the local
    transaction is rolled back, the retry settles again), else fatal."""
    try:
        yield
    except psycopg.Error as exc:
        code = exc.sqlstate or "08"  # no SQLSTATE: a client-side (connection) error
        kind = RetryableError if code[:2] in _RETRYABLE_CLASSES else FatalError
        raise kind(f"{SYSTEM}: {what} failed: {exc}",
                   fix="retried automatically; if it persists, check the catalog's database "
                   "and the grants on iceberg_tables (SELECT, UPDATE)") from exc
