"""Delta Lake on a local path: a fresh table directory per target (no server: nothing to
kill, no network), read back by another engine, DuckDB's Delta reader, loaded from the
``duckdb-extension-delta`` package (never downloaded at run time).

On S3 (:meth:`DeltaSetup.on_s3`, the fixture ``delta_s3_setup``): a fresh prefix of the S3
lab's bucket (``moto_server``, conditional puts) per target; the table is read by copying its
objects to a local directory as they are, then by the same DuckDB reader."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_delta

from setups.base import Proxy, ProxyFactory, SinkSetup, Target
from setups.servers.moto import REGION, MotoServer
from sinks.delta.keyed import TOMBSTONES_PATH
from twophase.kit.lake import INTENTS_DIRECTORY

#: Where the extension package keeps its binary: ``extensions/v<duckdb>/delta.duckdb_extension``.
EXTENSION = (Path(duckdb_extension_delta.__file__).parent / "extensions"
             / f"v{duckdb.__version__}" / "delta.duckdb_extension")
#: No extension comes from the network: a missing one fails instead.
OFFLINE: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False, "autoload_known_extensions": False}


def reader() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the Delta extension loaded from its package."""
    connection = duckdb.connect(config=OFFLINE)
    connection.execute(f"LOAD '{EXTENSION}'")
    return connection


def delta_scan(path: Path | str) -> str:
    """``delta_scan('<path>')`` as a FROM item (the path quoted)."""
    quoted = str(path).replace("'", "''")
    return f"delta_scan('{quoted}')"


def data_files(root: Path) -> set[str]:
    """Every Parquet file in the table's data area (relative; ``_``/``.`` folders skipped)."""
    return {path.relative_to(root).as_posix() for path in root.rglob("*.parquet")
            if not any(part.startswith(("_", ".")) for part in path.relative_to(root).parts)}


def intents_left(root: Path) -> set[str]:
    """The intents and keyed staged changes left in the table (a settled transaction leaves
    none; the keyed mode's tombstone table is not one)."""
    return {path.relative_to(root).as_posix() for path in (root / INTENTS_DIRECTORY).rglob("*")
            if path.is_file()
            and not path.relative_to(root).as_posix().startswith(f"{TOMBSTONES_PATH}/")}


def s3_storage_options(server: MotoServer) -> dict[str, str]:
    """deltalake's options (the sink's S3 client reads the same) for the S3 lab's server."""
    return {"AWS_ENDPOINT_URL": server.endpoint_url, "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": str(server.access_key_id),
            "AWS_SECRET_ACCESS_KEY": str(server.secret_access_key), "AWS_ALLOW_HTTP": "true"}


class DeltaSetup(SinkSetup):
    name = "delta"
    factory = "sinks.delta:DeltaSink"
    networked = False
    model_ci_examples = 5
    since = "0.3.0"

    def __init__(self, scratch: Path, proxy: Proxy | None = None, *,
                 s3: tuple[MotoServer, str] | None = None) -> None:
        super().__init__(scratch, proxy)
        #: One DuckDB for the setup (loading the extension takes ~0.2 s): a cursor per read.
        self._reader: duckdb.DuckDBPyConnection | None = None
        #: The S3 lab's server and bucket, for tables on S3 (None: local paths).
        self.s3 = s3

    @classmethod
    def on_s3(cls, scratch: Path, server: MotoServer, bucket: str) -> DeltaSetup:
        """Tables under fresh prefixes of ``bucket`` (see the module docstring)."""
        return cls(scratch, s3=(server, bucket))

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        """``statement``'s rows, read by the setup's DuckDB."""
        if self._reader is None:
            self._reader = reader()
        with contextlib.closing(self._reader.cursor()) as cursor:
            return cursor.execute(statement).fetchall()

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None) -> Iterator[DeltaSetup]:
        yield cls(scratch)

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[DeltaSetup]:
        yield cls(scratch / "delta")

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        """A table created from the query's columns at the driver's first check."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        name = f"orders-{self.number()}"
        if self.s3 is None:
            return {"table_uri": str(self.scratch / name), "create": True, **overrides}
        server, bucket = self.s3
        return {"table_uri": f"s3://{bucket}/{name}", "create": True,
                "storage_options": s3_storage_options(server), **overrides}

    def visible(self, target: Target) -> list[int]:
        root = self.readable(target)
        if not (root / "_delta_log").is_dir():
            return []
        return [int(row[0]) for row in self.query(f"SELECT event_id FROM {delta_scan(root)}")]

    def in_doubt(self, target: Target) -> list[Any]:
        """Parquet files in the data area that DuckDB's reader does not read (unreferenced:
        no OPTIMIZE runs in the suites, so every committed file is live), and intents left."""
        root = self.readable(target)
        if not (root / "_delta_log").is_dir():
            return sorted(data_files(root) | intents_left(root)) if root.is_dir() else []
        live = {Path(str(row[0])).resolve().relative_to(root.resolve()).as_posix()
                for row in self.query(f"SELECT DISTINCT filename FROM {delta_scan(root)}")}
        return sorted((data_files(root) - live) | intents_left(root))

    def readable(self, target: Target) -> Path:
        """The table as a local directory: its own, or a fresh copy of its S3 objects."""
        uri = str(target.options["table_uri"])
        if self.s3 is None:
            return Path(uri)
        server, bucket = self.s3
        prefix = uri.removeprefix(f"s3://{bucket}/").rstrip("/") + "/"
        copy = self.scratch / "copies" / f"{prefix.strip('/')}-{self.number()}"
        client = server.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                        Prefix=prefix):
            for item in page.get("Contents", ()):
                path = copy / item["Key"][len(prefix):]
                path.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, item["Key"], str(path))
        return copy
