"""Where a Delta table's files live: :class:`~twophase.kit.lake.LakeStorage` (a local directory or
an S3 prefix, with conditional puts), shared with every lake sink, reached here from the
sink's ``storage_options``.

The Delta log is read and written by deltalake, through its own object store and the sink's
``storage_options``; everything else the sink stores (the data files, the intents) goes
through the storage, relative to the table's root.

On S3 the sink's own client takes its settings from the same ``storage_options`` deltalake
takes (its key names, case-insensitive, with or without ``aws_``): ``access_key_id``,
``secret_access_key``, ``session_token``, ``region``, ``endpoint_url`` (or ``endpoint``),
``virtual_hosted_style_request`` (path style by default, as deltalake's); any other key is
deltalake's alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sinks.delta.errors import S3_ERRORS, SYSTEM
from twophase.kit.lake import LakeStorage, lake_storage
from twophase.kit.s3 import S3Settings

#: deltalake's option names (after the optional ``aws_`` prefix, lower case) that the sink's own
#: S3 client takes too, and the :class:`~twophase.kit.s3.S3Settings` field each becomes.
S3_SETTINGS_OF_OPTIONS: Mapping[str, str] = {
    "access_key_id": "access_key_id", "secret_access_key": "secret_access_key",
    "session_token": "session_token", "token": "session_token", "region": "region",
    "default_region": "region", "endpoint_url": "endpoint_url", "endpoint": "endpoint_url"}
VIRTUAL_HOSTED = "virtual_hosted_style_request"


def storage_for(table_uri: str, storage_options: Mapping[str, Any]) -> LakeStorage:
    """The storage of a table at ``table_uri``: a local path, ``file://`` or ``s3://``."""
    return lake_storage(table_uri, system=SYSTEM, s3_errors=S3_ERRORS,
                        s3_settings=lambda bucket: s3_settings(bucket, storage_options))


def s3_settings(bucket: str, storage_options: Mapping[str, Any]) -> S3Settings:
    """The sink's S3 client settings from deltalake's ``storage_options`` (module docstring)."""
    settings: dict[str, Any] = {}
    path_style = True
    for key, value in storage_options.items():
        name = key.lower().removeprefix("aws_")
        if name in S3_SETTINGS_OF_OPTIONS:
            settings[S3_SETTINGS_OF_OPTIONS[name]] = value
        elif name == VIRTUAL_HOSTED:
            path_style = str(value).lower() not in ("true", "1")
    return S3Settings(bucket, path_style=path_style, **settings)
