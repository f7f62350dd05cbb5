"""Every error the Delta sink meets, classified once, here.

deltalake raises few exception types (``deltalake.exceptions``) and tells their meanings apart
in the message; pyarrow's file system raises ``OSError``. Each is looked up by its class name,
then by a condition on its message:

==============================================  =============================================
what went wrong                                 what the sink raises
==============================================  =============================================
``CommitFailedError`` "Concurrent transaction"  :class:`RetryableError`: another committer of
/ "version already exists" (a racing commit)    the table committed first; the retry loads the
                                                table again and re-checks the proof
``CommitFailedError`` (anything else)           :class:`FatalError`
``TableNotFoundError``                          :class:`ConfigurationError`: create the table
                                                (``create=True``) or fix ``table_uri``
``DeltaProtocolError``                          :class:`ConfigurationError`: a reader or
                                                writer feature deltalake cannot honour
``SchemaMismatchError`` (deltalake's)           :class:`SchemaMismatchError`
``DeltaError`` "No such file" / "not found"     :class:`RetryableError` (a store that answers
                                                late); a file that is really gone is decided
                                                by the committer, never here
``DeltaError`` (anything else)                  :class:`FatalError`
``OSError`` (pyarrow file system, local disk)   :class:`RetryableError`, but "No space left"
                                                and "Permission denied":
                                                :class:`ConfigurationError`
``ArrowInvalid`` / ``ArrowTypeError``           :class:`SchemaMismatchError` (a value the
                                                table's type cannot hold)
a boto3 error (a table on S3: the data files    twophase's one S3 table (``S3Errors``): a
and the intents)                                refused request names :data:`S3_PERMISSIONS`
==============================================  =============================================

A decided transaction whose file is gone, or whose commit cannot be proven, is
lost (:func:`~twophase.kit.transaction_lost`): never an ``AddAction`` to nothing, never a
silent success.
"""

from __future__ import annotations

import deltalake.exceptions
import pyarrow as pa

from twophase import (
    ConfigurationError,
    FatalError,
    RetryableError,
    SchemaMismatchError,
    TwoPhaseError,
)
from twophase.kit import Condition, ErrorTable
from twophase.kit.lake import (
    FIX_LAKE_VALUES,
    LAKE_FILE_CONDITIONS,
    LAKE_FILE_RULES,
    LAKE_S3_PERMISSIONS,
    lake_classifier,
    lake_iam_policy,
)
from twophase.kit.s3 import S3Errors

SYSTEM = "DeltaSink"

#: What the sink catches around deltalake and pyarrow calls and hands to :func:`classify`.
ERRORS_CAUGHT: tuple[type[BaseException], ...] = (
    deltalake.exceptions.DeltaError, OSError, pa.ArrowException)

#: What the sink's credentials need on a table on S3 (a refused request names them; the
#: README's policy, :func:`iam_policy`): the bucket's listing, and the objects under the
#: table's prefix (the data files, the intents and deltalake's log).
S3_PERMISSIONS = LAKE_S3_PERMISSIONS
S3_ERRORS = S3Errors(S3_PERMISSIONS)
#: The least-privilege IAM policy of a sink appending to a table at ``s3://bucket/prefix``.
iam_policy = lake_iam_policy

FIX_RETRY = "retried automatically; if it persists, check the table's storage"
FIX_RACE = ("retried automatically: another committer of the table committed first; the "
            "retry reads the table again and proves or makes the commit")
FIX_TABLE = ("create the table first, or pass create=True to create it from the query's "
             "columns, or fix table_uri=")
FIX_FEATURE = ("write to a table without the feature named above (a new table, or one "
               "rewritten without it): DeltaSink appends plain Parquet files")

_RETRY: tuple[type[TwoPhaseError], str] = (RetryableError, FIX_RETRY)

ERRORS = ErrorTable(
    system=SYSTEM,
    default=(FatalError, "fix the cause named above, then restart the query"),
    rules={
        **LAKE_FILE_RULES,
        "CommitFailedError": (FatalError, "fix the cause named above, then restart the query"),
        "TableNotFoundError": (ConfigurationError, FIX_TABLE),
        "DeltaProtocolError": (ConfigurationError, FIX_FEATURE),
        "SchemaMismatchError": (SchemaMismatchError, FIX_LAKE_VALUES),
    },
    conditions={
        **LAKE_FILE_CONDITIONS,
        "CommitFailedError": (
            Condition("Concurrent", (RetryableError, FIX_RACE)),
            Condition("already exists", (RetryableError, FIX_RACE)),
        ),
        "DeltaError": (
            Condition("No such file", _RETRY),
            Condition("not found", _RETRY),
        ),
    },
)

#: The sink's classifier: S3 errors by :data:`S3_ERRORS`, the rest by :data:`ERRORS`.
classify = lake_classifier(ERRORS, S3_ERRORS)
