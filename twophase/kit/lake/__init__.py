"""The sink kit for a lake-table sink (Delta, Iceberg): what differs is the table format's
files and its proof of commit, never the phases around them.

=============================  ================================================================
piece                          what it does
=============================  ================================================================
:class:`LakeStorage`           a lake table's files (data, intents) under a local directory or
                               an S3 prefix, created exclusively (:func:`lake_storage` picks
                               one by location; :class:`LakeOutput`, :class:`LakeFileStat`)
:class:`LakeIntents`           each transaction's record of its files, until it is settled:
                               what is in doubt, listed without walking the data area
                               (under :data:`INTENTS_DIRECTORY`)
:class:`LakeFiles`             a transaction's data files: one per partition key, rolled at
                               ``max_file_bytes`` (:data:`DEFAULT_MAX_FILE_BYTES`), each
                               named by its intent first; the format's :class:`LakeFileWriter`
:class:`LakeSink`              a lake sink's executor side: rows or Arrow batches conformed to the
                               table's schema, written by its :class:`LakeFiles`, listed in the
                               handle (:class:`LakeTransaction`, :class:`LakeFileRecord`,
                               :func:`validate_max_file_bytes`)
:class:`LakeCommitter`         a lake sink's driver side: one commit per batch, abort and the
                               listing in doubt by intents; the format gives its proof;
                               :class:`LakeCleanup` names what deletes unreferenced files
                               (``check_addable``)
:func:`conform_table`          Arrow rows in a table's column order and types, NOT NULL checked
:func:`lake_classifier`        a lake sink's classifier: S3 errors by the S3 table, the rest by
                               class (:data:`LAKE_FILE_RULES`, :data:`LAKE_FILE_CONDITIONS`:
                               the file system's and pyarrow's verdicts every lake sink shares,
                               their fixes :data:`FIX_LAKE_RETRY`, :data:`FIX_LAKE_VALUES`,
                               :data:`FIX_LAKE_DISK`)
:func:`lake_iam_policy`        the least-privilege S3 policy of a lake table's prefix
                               (:data:`LAKE_S3_PERMISSIONS`)
:func:`lake_deadline`          the oldest file's creation + the table cleanup's retention
=============================  ================================================================

The code lives in private modules under this package (``_files``: storage, intents, files;
``_sink``: the sink and its committer; ``_errors``: the shared verdicts). ``__all__`` is this
family's public API. Until 0.6.0 each name also imports from :mod:`twophase.kit` (where the
flat kit had it), with a :class:`DeprecationWarning` naming this module.
"""

from __future__ import annotations

from twophase.kit.lake._errors import (
    FIX_LAKE_DISK,
    FIX_LAKE_RETRY,
    FIX_LAKE_VALUES,
    LAKE_FILE_CONDITIONS,
    LAKE_FILE_RULES,
    lake_classifier,
)
from twophase.kit.lake._files import (
    DEFAULT_MAX_FILE_BYTES,
    INTENTS_DIRECTORY,
    LAKE_S3_PERMISSIONS,
    LakeFiles,
    LakeFileStat,
    LakeFileWriter,
    LakeIntents,
    LakeOutput,
    LakeStorage,
    conform_table,
    lake_deadline,
    lake_iam_policy,
    lake_storage,
)
from twophase.kit.lake._sink import (
    LakeCleanup,
    LakeCommitter,
    LakeFileRecord,
    LakeSink,
    LakeTransaction,
    validate_max_file_bytes,
)

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "FIX_LAKE_DISK",
    "FIX_LAKE_RETRY",
    "FIX_LAKE_VALUES",
    "INTENTS_DIRECTORY",
    "LAKE_FILE_CONDITIONS",
    "LAKE_FILE_RULES",
    "LAKE_S3_PERMISSIONS",
    "LakeCleanup",
    "LakeCommitter",
    "LakeFileRecord",
    "LakeFileStat",
    "LakeFileWriter",
    "LakeFiles",
    "LakeIntents",
    "LakeOutput",
    "LakeSink",
    "LakeStorage",
    "LakeTransaction",
    "conform_table",
    "lake_classifier",
    "lake_deadline",
    "lake_iam_policy",
    "lake_storage",
    "validate_max_file_bytes",
]
