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
:func:`validate_lake_mode`     a lake sink's mode, :data:`APPEND` or keyed (:data:`LAKE_MODES`)
:func:`plan_batch`             the keyed mode: a batch's changes against the versions its keys
                               hold (:class:`BatchPlan`: what applies, the tombstones to
                               write and to clear; :func:`keys_of`); the changes staged as
                               :class:`StagedFile` under :data:`STAGED_DIRECTORY`, each
                               transaction proven by :func:`proof_key`; the format's
                               tombstone table a :class:`LakeTombstones`
=============================  ================================================================

The code lives in private modules under this package (``_files``: storage, intents, files;
``_sink``: the sink and its committer; ``_errors``: the shared verdicts; ``_keyed``: the keyed
mode). ``__all__`` is this
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
from twophase.kit.lake._keyed import (
    APPEND,
    LAKE_MODES,
    STAGED_DIRECTORY,
    BatchPlan,
    StagedFile,
    keys_of,
    plan_batch,
    proof_key,
    validate_lake_mode,
)
from twophase.kit.lake._sink import (
    LakeCleanup,
    LakeCommitter,
    LakeFileRecord,
    LakeSink,
    LakeTombstones,
    LakeTransaction,
    validate_max_file_bytes,
)

__all__ = [
    "APPEND",
    "DEFAULT_MAX_FILE_BYTES",
    "FIX_LAKE_DISK",
    "FIX_LAKE_RETRY",
    "FIX_LAKE_VALUES",
    "INTENTS_DIRECTORY",
    "LAKE_FILE_CONDITIONS",
    "LAKE_FILE_RULES",
    "LAKE_MODES",
    "LAKE_S3_PERMISSIONS",
    "STAGED_DIRECTORY",
    "BatchPlan",
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
    "LakeTombstones",
    "LakeTransaction",
    "StagedFile",
    "conform_table",
    "keys_of",
    "lake_classifier",
    "lake_deadline",
    "lake_iam_policy",
    "lake_storage",
    "plan_batch",
    "proof_key",
    "validate_lake_mode",
    "validate_max_file_bytes",
]
