"""Apache Iceberg tables through pyiceberg's SQL catalog: the embedded one (SQLite, a file per
setup) or the one a team runs (PostgreSQL, the private server: :meth:`IcebergSetup.on_postgres`),
the data under a local warehouse directory; a fresh table per target, read back by another
engine, DuckDB's Iceberg reader, loaded from the ``duckdb-extension-iceberg`` and ``-avro``
packages (never downloaded at run time)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import duckdb
import duckdb_extension_avro
import duckdb_extension_httpfs
import duckdb_extension_iceberg
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from setups.base import Proxy, ProxyFactory, SinkSetup, Target
from setups.servers.iceberg_rest import IcebergRestServer
from setups.servers.moto import REGION, MotoServer
from setups.servers.postgres import PostgresServer
from twophase.kit.lake import INTENTS_DIRECTORY

#: The packages' binaries: ``extensions/v<duckdb>/<name>.duckdb_extension``.
EXTENSIONS = [Path(package.__file__).parent / "extensions" / f"v{duckdb.__version__}"
              / f"{name}.duckdb_extension"
              for package, name in ((duckdb_extension_avro, "avro"),
                                    (duckdb_extension_iceberg, "iceberg"))]
#: No extension comes from the network: a missing one fails instead.
OFFLINE: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False, "autoload_known_extensions": False}
HTTPFS = (Path(duckdb_extension_httpfs.__file__).parent / "extensions"
          / f"v{duckdb.__version__}" / "httpfs.duckdb_extension")
CATALOG_NAME = "lake"
NAMESPACE = "db"


def reader(s3: MotoServer | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the Iceberg extension (and Avro, which it needs) loaded; with
    ``s3``, httpfs too and a secret for the S3 lab's server."""
    connection = duckdb.connect(config=OFFLINE)
    for extension in EXTENSIONS if s3 is None else [*EXTENSIONS, HTTPFS]:
        connection.execute(f"LOAD '{extension}'")
    if s3 is not None:
        endpoint = urlparse(s3.endpoint_url)
        connection.execute(
            "CREATE SECRET lab (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, "
            "URL_STYLE 'path', USE_SSL false)",
            [str(s3.access_key_id), str(s3.secret_access_key), REGION, endpoint.netloc])
    return connection


def s3_properties(server: MotoServer) -> dict[str, str]:
    """pyiceberg's S3 properties (the sink's own S3 client reads the same) for the lab."""
    return {"s3.endpoint": server.endpoint_url, "s3.region": REGION,
            "s3.access-key-id": str(server.access_key_id),
            "s3.secret-access-key": str(server.secret_access_key)}


def iceberg_scan(table: Table | None) -> str:
    """``iceberg_scan('<the table's metadata file>')`` as a FROM item (the path quoted)."""
    assert table is not None, "no such table"
    metadata_location = table.metadata_location
    path = urlparse(metadata_location).path if metadata_location.startswith(
        "file:") else metadata_location  # as pyiceberg wrote it: no percent-decoding
    quoted = path.replace("'", "''")
    return f"iceberg_scan('{quoted}')"


def local_path(uri: str) -> Path:
    return Path(urlparse(uri).path)


def referenced_files(table: Table) -> set[str]:
    """Every data file any snapshot of the table ever added (absolute URIs)."""
    return {entry.data_file.file_path
            for snapshot in table.metadata.snapshots
            for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)}


def postgres_catalog_uri(server: PostgresServer) -> str:
    params = server.params
    return (f"postgresql+psycopg://{quote(params.user)}:{quote(params.password)}@{params.host}"
            f":{params.port}/{quote(params.database)}")


class IcebergSetup(SinkSetup):
    name = "iceberg"
    factory = "sinks.iceberg:IcebergSink"
    networked = False
    model_ci_examples = 3
    since = "0.4.0"

    def __init__(self, scratch: Path, proxy: Proxy | None = None, *,
                 catalog: Mapping[str, str] | None = None) -> None:
        super().__init__(scratch, proxy)
        self.scratch.mkdir(parents=True, exist_ok=True)
        #: pyiceberg's catalog properties: by default the SQL catalog on SQLite in the scratch
        #: directory, the data under its warehouse directory.
        self._catalog_properties = dict(catalog or self.sql_catalog(
            f"sqlite:///{self.scratch.absolute()}/catalog.db"))
        self._reader: duckdb.DuckDBPyConnection | None = None
        self._catalog: Catalog | None = None
        #: Table names unique in a catalog that outlives the setup (a server's database).
        self._token = secrets.token_hex(4)
        #: The S3 lab's server and bucket, for tables on S3 (None: local paths).
        self.s3: tuple[MotoServer, str] | None = None

    def sql_catalog(self, uri: str) -> dict[str, str]:
        return {"type": "sql", "uri": uri,
                "warehouse": f"file://{(self.scratch / 'warehouse').absolute()}"}

    @classmethod
    def on_postgres(cls, scratch: Path, server: PostgresServer) -> IcebergSetup:
        """The SQL catalog in the private PostgreSQL server's database."""
        setup = cls(scratch)
        setup._catalog_properties = setup.sql_catalog(postgres_catalog_uri(server))
        return setup

    @classmethod
    def on_s3(cls, scratch: Path, server: MotoServer, bucket: str) -> IcebergSetup:
        """The embedded SQL catalog, the tables' data and metadata under a fresh prefix of the
        S3 lab's bucket (the sink's data files by conditional put; read by DuckDB's httpfs)."""
        setup = cls(scratch)
        setup._catalog_properties = {
            **setup.sql_catalog(f"sqlite:///{setup.scratch.absolute()}/catalog.db"),
            "warehouse": f"s3://{bucket}/{setup._token}", **s3_properties(server)}
        setup.s3 = (server, bucket)
        return setup

    @classmethod
    def on_rest(cls, scratch: Path, server: IcebergRestServer) -> IcebergSetup:
        """The REST catalog server's tables (its own warehouse, a local directory)."""
        return cls(scratch, catalog=server.properties())

    def catalog_properties(self) -> dict[str, str]:
        return dict(self._catalog_properties)

    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog(CATALOG_NAME, **self.catalog_properties())
        return self._catalog

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        """``statement``'s rows, read by the setup's DuckDB."""
        if self._reader is None:
            self._reader = reader(self.s3[0] if self.s3 else None)
        with contextlib.closing(self._reader.cursor()) as cursor:
            return cursor.execute(statement).fetchall()

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None
                ) -> Iterator[IcebergSetup]:
        yield cls(scratch)

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[IcebergSetup]:
        yield cls(scratch / "iceberg")

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        """A table created from the query's columns at the driver's first check."""
        return {"table": f"{NAMESPACE}.orders_{self._token}_{self.number()}", "create": True,
                "catalog": self.catalog_properties(), "catalog_name": CATALOG_NAME,
                **overrides}

    def table(self, target: Target) -> Table | None:
        """The target's table as the catalog has it now (None: not created yet)."""
        identifier = str(target.options["table"])
        if not self.catalog().table_exists(identifier):
            return None
        return self.catalog().load_table(identifier)

    def visible(self, target: Target) -> list[int]:
        table = self.table(target)
        if table is None or table.current_snapshot() is None:
            return []
        return [int(row[0]) for row in
                self.query(f"SELECT event_id FROM {iceberg_scan(table)}")]

    def in_doubt(self, target: Target) -> list[Any]:
        """Parquet files in the data area that no snapshot ever added, and intents left."""
        table = self.table(target)
        if table is None:
            return []
        files = self.files_under(table.location())
        data = {uri for uri in files if "/data/" in uri and uri.endswith(".parquet")}
        intents = {uri for uri in files if f"/{INTENTS_DIRECTORY}/" in uri}
        return sorted((data - referenced_files(table)) | intents)

    def files_under(self, location: str) -> set[str]:
        """Every file under ``location`` (``file://`` or ``s3://``), as a URI of that kind."""
        if self.s3 is None:
            root = local_path(location)
            return {f"{location.rstrip('/')}/{path.relative_to(root).as_posix()}"
                    for path in root.rglob("*") if path.is_file()}
        server, bucket = self.s3
        prefix = location.removeprefix(f"s3://{bucket}/").rstrip("/") + "/"
        pages = server.client().get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix)
        return {f"s3://{bucket}/{item['Key']}" for page in pages
                for item in page.get("Contents", ())}
