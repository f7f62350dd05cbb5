"""Every S3 error the sink meets, classified once, here (as Flink's ``XaFacade`` does).

=====================================  =========================================================
what went wrong                        what the sink raises
=====================================  =========================================================
a ``ClientError`` whose code is in     the verdict of :data:`ERRORS`: throttling and 5xx are
:data:`ERRORS`                         retryable; a missing bucket, a refused or unknown key, a
                                       bad signature are :class:`ConfigurationError` with the fix
any other 5xx status                   :class:`RetryableError`
any other code                         :class:`FatalError` (never retried blindly)
no connection, a timeout               :class:`RetryableError` naming the endpoint
no credentials at all                  :class:`ConfigurationError`
=====================================  =========================================================

The other modules use :func:`error_code` / :func:`status` only to steer (``NoSuchUpload``,
``PreconditionFailed``, 404 on HEAD), never to build an error of their own. Credentials never
appear in a message: botocore's errors do not carry them, and
:class:`~sinks.s3.connection.S3Settings` hides them from ``repr``.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,  # botocore's: the base of every connection failure
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from twophase import ConfigurationError, FatalError, RetryableError, TwoPhaseError
from twophase.kit import ErrorTable

#: How messages name the system: the S3 sink and the HTTP sink's S3 staging share this table.
SYSTEM = "S3"

# -- codes the sink steers by -----------------------------------------------------------------
NO_SUCH_UPLOAD = "NoSuchUpload"
PRECONDITION_FAILED = "PreconditionFailed"
NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
NO_LIFECYCLE = "NoSuchLifecycleConfiguration"

FIX_RETRY = "retried automatically; if it persists, check the endpoint and the network"
FIX_BUCKET = ("create the bucket, or fix the bucket's name (and region= / endpoint_url= if it "
              "lives elsewhere)")
FIX_ACCESS = ("grant s3:PutObject, s3:GetObject, s3:ListBucket, s3:ListBucketMultipartUploads "
              "and s3:AbortMultipartUpload on the bucket and prefix to these credentials")
FIX_CREDENTIALS = ("fix the credentials: access_key_id= / secret_access_key= (or boto3's chain: "
                   "AWS_ACCESS_KEY_ID, ~/.aws/credentials, an instance role)")
FIX_REGION = "set region= to the bucket's region (or endpoint_url= of the store)"
FIX_CLOCK = "synchronise this host's clock (NTP): S3 refuses requests signed >15 min off"
FIX_PART_SIZE = "raise part_size= (S3 needs at least 5 MiB for every part but the last)"
FIX_UNKNOWN_CODE = "look up the S3 error code and fix its cause, then restart the query"

_RETRY = (RetryableError, FIX_RETRY)
ERRORS = ErrorTable(
    system=SYSTEM,
    default=(FatalError, FIX_UNKNOWN_CODE),
    rules={
        "SlowDown": _RETRY,
        "Throttling": _RETRY,
        "ThrottlingException": _RETRY,
        "RequestLimitExceeded": _RETRY,
        "RequestTimeout": _RETRY,
        "InternalError": _RETRY,
        "ServiceUnavailable": _RETRY,
        "OperationAborted": _RETRY,  # a conflicting operation on the bucket is in progress
        "500": _RETRY, "502": _RETRY, "503": _RETRY, "504": _RETRY,
        "NoSuchBucket": (ConfigurationError, FIX_BUCKET),
        "InvalidBucketName": (ConfigurationError, FIX_BUCKET),
        "AccessDenied": (ConfigurationError, FIX_ACCESS),
        "403": (ConfigurationError, f"{FIX_CREDENTIALS}; or {FIX_ACCESS}"),
        "AllAccessDisabled": (ConfigurationError, FIX_ACCESS),
        "InvalidAccessKeyId": (ConfigurationError, FIX_CREDENTIALS),
        "SignatureDoesNotMatch": (ConfigurationError, FIX_CREDENTIALS),
        "ExpiredToken": (ConfigurationError, FIX_CREDENTIALS),
        "InvalidToken": (ConfigurationError, FIX_CREDENTIALS),
        "AuthorizationHeaderMalformed": (ConfigurationError, FIX_REGION),
        "PermanentRedirect": (ConfigurationError, FIX_REGION),
        "301": (ConfigurationError, FIX_REGION),
        "IllegalLocationConstraintException": (ConfigurationError, FIX_REGION),
        "RequestTimeTooSkewed": (ConfigurationError, FIX_CLOCK),
        "EntityTooSmall": (ConfigurationError, FIX_PART_SIZE),
    },
)


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of a ``ClientError`` (``"404"`` for a HEAD without a body)."""
    if isinstance(exc, ClientError):
        code: Any = exc.response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


def status(exc: BaseException) -> int:
    """The HTTP status of a ``ClientError`` (0 otherwise)."""
    if isinstance(exc, ClientError):
        value: Any = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return int(value or 0)
    return 0


def classify(exc: BaseException, what: str) -> TwoPhaseError:
    """The one verdict on a boto3/botocore error raised during ``what``."""
    if isinstance(exc, ClientError):
        code = error_code(exc) or str(status(exc))
        detail = f"{code} ({exc.response.get('Error', {}).get('Message', '')})"
        if code not in ERRORS.rules and status(exc) >= 500:
            return ERRORS.error("500", what, detail)
        return ERRORS.error(code, what, detail)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return ConfigurationError(f"{SYSTEM}: {what} failed: {exc}.", fix=FIX_CREDENTIALS)
    if isinstance(exc, (ConnectionError, HTTPClientError)):
        return RetryableError(f"{SYSTEM}: {what} failed: {exc}.",
                              fix="retried automatically; if it persists, check endpoint_url= "
                              "and that the store is reachable from this host")
    if isinstance(exc, BotoCoreError):
        return FatalError(f"{SYSTEM}: {what} failed: {exc}.", fix=FIX_UNKNOWN_CODE)
    return FatalError(f"{SYSTEM}: {what} failed: {type(exc).__name__}: {exc}.",
                      fix=FIX_UNKNOWN_CODE)


#: What :func:`twophase.kit.classified` should catch around boto3 calls.
BOTO_ERRORS: tuple[type[BaseException], ...] = (ClientError, BotoCoreError)
