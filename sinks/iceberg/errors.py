"""Every error the Iceberg sink meets, classified once, here.

pyiceberg raises its own exception classes (``pyiceberg.exceptions``); the SQL catalog's
database raises SQLAlchemy's; the REST catalog's transport, ``requests``' (``OSError``s);
pyarrow's file system and the local disk, ``OSError``. Each is looked up by its class name,
then by a condition on its message:

==============================================  =============================================
what went wrong                                 what the sink raises
==============================================  =============================================
``CommitFailedException`` (a requirement not    :class:`RetryableError`: another committer of
met: the table moved since it was loaded)       the table committed first; the retry loads
                                                the table again and re-checks the proof
``CommitStateUnknownException`` (the catalog    :class:`RetryableError`: the retry's proof
did not say whether it committed)               finds out
``NoSuchTableError`` / ``NoSuchNamespaceError`` :class:`ConfigurationError`: create the table
                                                (``create=True``) or fix ``table=`` or
                                                ``catalog_name=`` (a SQL catalog's table of
                                                another name: that name, in
                                                :mod:`~sinks.iceberg.catalog`)
``ValueError`` "No default path" (creating a    :class:`ConfigurationError`: add
table, no ``warehouse``)                        ``"warehouse"`` to ``catalog=``
``OperationalError`` (the catalog database:     :class:`RetryableError`; "password
unreachable, locked, restarting)                authentication failed" / "permission denied":
                                                :class:`ConfigurationError`
``ProgrammingError`` / ``IntegrityError``       :class:`FatalError`; "permission denied":
                                                :class:`ConfigurationError` (the grants)
``ServerError`` / ``ServiceUnavailableError``   :class:`RetryableError`
/ ``TooManyRequestsError`` (REST)
``UnauthorizedError`` / ``ForbiddenError`` /    :class:`ConfigurationError`: the catalog's
``AuthorizationExpiredError`` / ``OAuthError``  credentials or grants
``OSError`` (a file system, the REST            :class:`RetryableError`, but "No space left"
catalog's connection)                           and "Permission denied":
                                                :class:`ConfigurationError`
``ArrowInvalid`` / ``ArrowTypeError``           :class:`SchemaMismatchError` (a value the
                                                table's type cannot hold)
a boto3 error (a table on S3: the data files    twophase's one S3 table (``S3Errors``): a
and the intents)                                refused request names :data:`S3_PERMISSIONS`
anything else pyiceberg raises                  :class:`FatalError`
==============================================  =============================================

A decided transaction whose file is gone, or that is past the orphan-file cleanup's age, is
lost (:func:`~twophase.kit.transaction_lost`): never a snapshot of missing files, never a
silent success.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pyiceberg.exceptions

from twophase import (
    ConfigurationError,
    FatalError,
    RetryableError,
    TwoPhaseError,
)
from twophase.kit import Condition, ErrorTable
from twophase.kit.lake import (
    LAKE_FILE_CONDITIONS,
    LAKE_FILE_RULES,
    LAKE_S3_PERMISSIONS,
    lake_classifier,
    lake_iam_policy,
)
from twophase.kit.s3 import S3Errors

SYSTEM = "IcebergSink"

#: What the sink catches around pyiceberg, the catalog, pyarrow and storage calls.
ERRORS_CAUGHT: tuple[type[BaseException], ...] = (
    pyiceberg.exceptions.CommitFailedException, pyiceberg.exceptions.RESTError,
    pyiceberg.exceptions.NoSuchTableError, pyiceberg.exceptions.NoSuchNamespaceError,
    pyiceberg.exceptions.ValidationError, pyiceberg.exceptions.ValidationException,
    OSError, pa.ArrowException)


def catalog_errors() -> tuple[type[BaseException], ...]:
    """The SQL catalog's database errors (SQLAlchemy's), once SQLAlchemy is loaded: the SQL
    catalog loads it, and a process that never did cannot meet them (the executors, which are
    spared its import)."""
    module = sys.modules.get("sqlalchemy.exc")
    return () if module is None else (module.SQLAlchemyError,)

#: What the sink's S3 credentials need on a table on S3: the bucket's listing, and the
#: objects under the table's location (data files, intents, and pyiceberg's metadata files).
S3_PERMISSIONS = LAKE_S3_PERMISSIONS
S3_ERRORS = S3Errors(S3_PERMISSIONS)
#: The least-privilege IAM policy of a sink appending to a table at ``s3://bucket/prefix``.
iam_policy = lake_iam_policy


FIX_RETRY = "retried automatically; if it persists, check the catalog and the table's storage"
FIX_RACE = ("retried automatically: another committer of the table committed first; the "
            "retry loads the table again and proves or makes the commit")
FIX_TABLE = ("create the table first, or pass create=True to create it (and its namespace) "
             "from the query's columns, or fix table= or catalog_name= (default 'default': "
             "a SQL catalog sees only the tables of its own name, the one your readers pass "
             "to load_catalog)")
FIX_CATALOG_ACCESS = ("fix the catalog's credentials or grants (catalog=): the sink reads and "
                      "updates the table's catalog entry")
FIX_UNCLASSIFIED = "fix the cause named above, then restart the query"

_RETRY: tuple[type[TwoPhaseError], str] = (RetryableError, FIX_RETRY)
_ACCESS: tuple[type[TwoPhaseError], str] = (ConfigurationError, FIX_CATALOG_ACCESS)

ERRORS = ErrorTable(
    system=SYSTEM,
    default=(FatalError, FIX_UNCLASSIFIED),
    rules={
        **LAKE_FILE_RULES,
        "CommitFailedException": (RetryableError, FIX_RACE),
        "CommitStateUnknownException": (RetryableError, FIX_RACE),
        "NoSuchTableError": (ConfigurationError, FIX_TABLE),
        "NoSuchNamespaceError": (ConfigurationError, FIX_TABLE),
        "OperationalError": _RETRY,
        "InterfaceError": _RETRY,
        "ServerError": _RETRY,
        "ServiceUnavailableError": _RETRY,
        "TooManyRequestsError": _RETRY,
        "UnauthorizedError": _ACCESS,
        "ForbiddenError": _ACCESS,
        "AuthorizationExpiredError": _ACCESS,
        "OAuthError": _ACCESS,
    },
    conditions={
        **LAKE_FILE_CONDITIONS,
        "OperationalError": (
            Condition("password authentication failed", _ACCESS),
            Condition("permission denied", _ACCESS),
            Condition("unable to open database file", (ConfigurationError, FIX_CATALOG_ACCESS)),
        ),
        "ProgrammingError": (
            Condition("permission denied", _ACCESS),
        ),
    },
)

#: The sink's classifier: S3 errors by :data:`S3_ERRORS`, the rest by :data:`ERRORS`.
classify = lake_classifier(ERRORS, S3_ERRORS)
