"""What a lake sink's own file work raises, classified the same for every format (Delta,
Iceberg): the file system (a local disk, pyarrow's) and pyarrow's value errors, and a
classifier that sends a table on S3's errors to the S3 table.

A lake sink's :class:`~twophase.kit.ErrorTable` takes these verdicts with its own
(``rules={**LAKE_FILE_RULES, ...}``, ``conditions={**LAKE_FILE_CONDITIONS, ...}``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from twophase._classify import Classify
from twophase._s3 import S3Errors
from twophase.errors import ConfigurationError, RetryableError, SchemaMismatchError, TwoPhaseError
from twophase.kit import Condition, ErrorTable, Verdict

FIX_LAKE_RETRY = "retried automatically; if it persists, check the table's storage"
FIX_LAKE_VALUES = "cast the column in the query to the table's type, or fix the table's schema"
FIX_LAKE_DISK = "free space on (or grant write access to) the table's storage, then restart"
LAKE_FILE_RULES: Mapping[Hashable, Verdict] = {
    "OSError": (RetryableError, FIX_LAKE_RETRY),
    "FileNotFoundError": (RetryableError, FIX_LAKE_RETRY),
    "ArrowInvalid": (SchemaMismatchError, FIX_LAKE_VALUES),
    "ArrowTypeError": (SchemaMismatchError, FIX_LAKE_VALUES),
    "ArrowNotImplementedError": (SchemaMismatchError, FIX_LAKE_VALUES),
}
LAKE_FILE_CONDITIONS: Mapping[Hashable, Sequence[Condition]] = {
    "OSError": (Condition("No space left", (ConfigurationError, FIX_LAKE_DISK)),
                Condition("Permission denied", (ConfigurationError, FIX_LAKE_DISK))),
}


def lake_classifier(errors: ErrorTable, s3_errors: S3Errors) -> Classify:
    """A lake sink's classifier: a boto3 error (a table on S3) by the S3 table, anything else
    by its class in ``errors`` (:meth:`~twophase.kit.ErrorTable.error_of`)."""

    def classify(exc: BaseException, what: str) -> TwoPhaseError:
        if type(exc).__module__.startswith("botocore"):
            return s3_errors.classify(exc, what)
        return errors.error_of(exc, what)

    return classify
