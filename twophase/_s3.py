"""The one S3 client of twophase: settings, clients, and every S3 error classified once.

Everything that reaches S3 comes through here: the state store on S3 (:mod:`twophase._storage`),
the S3 sink, the HTTP sink's staging on S3 and a lake table on S3 (through
:mod:`twophase.kit.s3`).

:class:`S3Settings` names a bucket and how to reach it (endpoint, addressing, region,
credentials, checksums, timeouts); it holds no client and pickles as plain values, and ``repr``
never shows the credentials (nothing here logs them). :meth:`S3Settings.client` makes a boto3
client lazily, at most one per process, endpoint + credentials and attempt count: boto3 clients
are thread-safe, and one serves every bucket of its endpoint. Every client of a process comes
from one boto3 session: each new session parsed S3's service model again (~35,000 objects,
measured), a cost paid per client before. boto3 is imported on first use, so that the kit
costs nothing to a sink that never reaches S3.

:class:`S3Errors` is the one table of S3 errors (as Flink's ``XaFacade`` is for XA):

=====================================  =========================================================
what went wrong                        what it becomes
=====================================  =========================================================
a ``ClientError`` whose code is in     the verdict of the table: throttling and 5xx are
the table                              retryable; a missing bucket, a refused or unknown key, a
                                       bad signature are :class:`ConfigurationError` with the fix
                                       (a refused request names the permission of the refused
                                       operation, and the caller's ``permissions``)
a certificate not verified             :class:`ConfigurationError`: fix ``ca_bundle=`` or the
                                       endpoint's host name (``tls='require'`` turns it off)
any other 5xx status                   :class:`RetryableError`
any other code                         :class:`FatalError` (never retried blindly)
no connection, a timeout               :class:`RetryableError` naming the endpoint
no credentials at all                  :class:`ConfigurationError`
=====================================  =========================================================

Callers read :meth:`S3Errors.code` / :meth:`S3Errors.status` only to steer (``NoSuchUpload``,
``PreconditionFailed``, 404 on HEAD), never to build an error of their own.

TLS (:class:`twophase.kit.Tls`, every prebuilt sink's options): ``tls="verify"`` (the default)
verifies the store's certificate and host name, against ``ca_bundle`` (the CA file of a private
store) or else certifi's CAs (or ``AWS_CA_BUNDLE``); only ``tls="require"`` turns the check off;
``tls="off"`` is for an ``http://`` endpoint only (the scheme decides).
``client_cert``/``client_key`` are a client certificate (mutual TLS, botocore's ``client_cert``).
The former ``verify=False`` works and warns until 0.6.0. Credentials (``access_key_id``,
``secret_access_key``, ``session_token``) take a :class:`~twophase.Secret` reference, revealed only
when a client is made: the pickled settings and the key of the client cache hold the reference,
never the clear text. Should the store refuse them once their ``Secret`` changed (rotated keys),
:meth:`S3Settings.retried_if_rotated` makes the client again with the new ones
(:class:`twophase.kit.ClientCache`).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from twophase._secrets import REDACTED, ClientCache, Secret, SecretOption, reveal
from twophase._tls import (
    DEFAULT_TLS,
    Tls,
    TlsMode,
    refuse_plain_text_over_https,
    renamed_option,
)
from twophase.errors import ConfigurationError, FatalError, RetryableError, TwoPhaseError

T = TypeVar("T")

if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import ModuleType

S3Checksums = Literal["when_required", "when_supported"]

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 120.0
#: boto3's own attempts of one request (throttling, 5xx, connection resets).
DEFAULT_S3_MAX_ATTEMPTS = 3
MAX_POOL_CONNECTIONS = 32
#: How messages name the system.
SYSTEM = "S3"

FIX_RETRY = "retried automatically; if it persists, check the endpoint and the network"
FIX_UNREACHABLE = ("retried automatically; if it persists, check endpoint_url= and that the "
                   "store is reachable from this host")
FIX_BUCKET = ("create the bucket, or fix the bucket's name (and region= / endpoint_url= if it "
              "lives elsewhere)")
FIX_CREDENTIALS = ("fix the credentials: access_key_id= / secret_access_key= (or boto3's chain: "
                   "AWS_ACCESS_KEY_ID, ~/.aws/credentials, an instance role)")
FIX_REGION = "set region= to the bucket's region (or endpoint_url= of the store)"
FIX_CLOCK = "synchronise this host's clock (NTP): S3 refuses requests signed >15 min off"
FIX_PART_SIZE = "raise part_size= (S3 needs at least 5 MiB for every part but the last)"
FIX_UNKNOWN_CODE = "look up the S3 error code and fix its cause, then restart the query"
FIX_NO_BOTO3 = "pip install 'twophase[s3]'"
FIX_TLS = ("the store's certificate was not verified: pass ca_bundle= (the file of the CA that "
           "issued it) and reach the store by a host name its certificate names "
           "(endpoint_url=); tls='require' turns the check off (never across a network you do "
           "not trust)")

#: The IAM action each S3 operation of twophase needs: a refused request's fix names it.
OPERATION_PERMISSIONS = {
    "HeadBucket": "s3:ListBucket",
    "ListObjectsV2": "s3:ListBucket",
    "ListMultipartUploads": "s3:ListBucketMultipartUploads",
    "GetBucketLifecycleConfiguration": "s3:GetLifecycleConfiguration",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "PutObject": "s3:PutObject",
    "HeadObject": "s3:GetObject",
    "GetObject": "s3:GetObject",
    "ListParts": "s3:ListMultipartUploadParts",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "DeleteObjects": "s3:DeleteObject",
    "DeleteObject": "s3:DeleteObject",
}
#: Codes of a request the store refused to these credentials.
ACCESS_DENIED = frozenset({"AccessDenied", "403", "AllAccessDisabled"})
#: A refusal without a body (a HEAD's): wrong credentials or a missing permission.
BARE_403 = "403"
#: Codes of credentials the store does not accept (moto names a deleted key's signature
#: ``InvalidClientTokenId``, as IAM does).
REFUSED_CREDENTIALS = frozenset({"InvalidAccessKeyId", "InvalidClientTokenId",
                                 "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                                 BARE_403})

#: What a code becomes: the kind of error and the fix an operator can act on.
_Verdict = tuple[type[TwoPhaseError], str]
#: Any code the table does not name: never retried blindly.
UNKNOWN_CODE: _Verdict = (FatalError, FIX_UNKNOWN_CODE)

log = logging.getLogger(__name__)

#: botocore's loggers that print a request at DEBUG (its headers, its canonical form for the
#: signature): the session token is a header there.
REQUEST_LOGGERS = ("botocore.auth", "botocore.endpoint", "botocore.awsrequest",
                   "botocore.httpsession", "botocore.hooks", "botocore.parsers",
                   "botocore.retryhandler", "urllib3.connectionpool")
#: Shorter secrets are not searched for in log records (they would redact common words, as
#: "x" the header ``x-amz-...``); no S3 credential is that short (AWS's are 20 and 40).
MIN_REDACTED_LENGTH = 8
#: A session token header and a signature, however botocore prints them.
_SECRET_FIELDS = re.compile(r"(?i)(x-amz-security-token['\"]?\s*[:=,]\s*b?['\"]?)([^'\"\s,}]+)"
                            r"|(Signature=)([0-9a-f]+)")

_sessions: dict[int, Any] = {}


@dataclass(frozen=True)
class S3Settings:
    """Bucket, endpoint, addressing, region and credentials (hidden from ``repr``)."""

    bucket: str
    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False
    access_key_id: SecretOption | None = field(default=None, repr=False)
    secret_access_key: SecretOption | None = field(default=None, repr=False)
    session_token: SecretOption | None = field(default=None, repr=False)
    #: Every prebuilt sink's TLS options (:class:`twophase.kit.Tls`): ``tls="require"`` turns
    #: certificate verification off (the one option that relaxes it); ``ca_bundle`` is the CA
    #: file the store's certificate is verified against (None: certifi's CAs).
    tls: TlsMode = DEFAULT_TLS
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    #: The former ``tls="require"`` (``verify=False``), until 0.6.0.
    verify: bool | None = None
    checksums: S3Checksums = "when_required"
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.verify is not None:
            self._take_former_verify()
        tls = Tls(self.tls, self.ca_bundle, self.client_cert, self.client_key, SYSTEM)
        refuse_plain_text_over_https(tls, self.endpoint_url or "https://s3.amazonaws.com")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ConfigurationError(f"{SYSTEM}: access_key_id and secret_access_key go together.",
                                     fix="pass both, or neither to use boto3's chain")
        for name in ("access_key_id", "secret_access_key", "session_token"):
            if not isinstance(getattr(self, name), str | Secret | None):
                raise ConfigurationError(f"{SYSTEM}: {name} is a {type(getattr(self, name))}.",
                                         fix=f"pass {name}= as a str or a twophase.Secret")

    @classmethod
    def of(cls, bucket: str, options: Mapping[str, Any], *, named: str) -> S3Settings:
        """The settings of ``bucket`` from a location's ``options`` (:data:`S3_OPTIONS`); any
        other option is refused, naming where it was given (``named``)."""
        unknown = set(options) - S3_OPTIONS
        if unknown:
            raise ConfigurationError(f"{named}: unknown S3 options {sorted(unknown)}.",
                                     fix=f"use only {', '.join(sorted(S3_OPTIONS))}")
        return cls(bucket, **options)

    @property
    def where(self) -> str:
        """The bucket and endpoint, as error messages name them."""
        return f"s3://{self.bucket}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    def _take_former_verify(self) -> None:
        """The former ``verify=`` as ``tls=`` (``verify=False``: ``tls="require"``, the CA file
        it ignored dropped), with a warning naming the new option."""
        renamed_option(SYSTEM, "verify", self.verify, "tls", None,
                       same="tls='require' for verify=False, nothing for verify=True",
                       stacklevel=6)
        if not self.verify:
            object.__setattr__(self, "tls", "require")
            object.__setattr__(self, "ca_bundle", None)
        object.__setattr__(self, "verify", None)

    @property
    def tls_verify(self) -> bool | str | None:
        """boto3's ``verify=``: the CA file, False if turned off, None for boto3's default
        (verified against certifi's CAs or ``AWS_CA_BUNDLE``)."""
        if self.tls == "require":
            return False
        return self.ca_bundle

    @property
    def secrets(self) -> tuple[SecretOption | None, ...]:
        """The credentials a client is made with."""
        return (self.access_key_id, self.secret_access_key, self.session_token)

    def client(self, *, max_attempts: int = DEFAULT_S3_MAX_ATTEMPTS) -> Any:
        """This process's client for this endpoint, these credentials and ``max_attempts``
        (made on first use, thread-safe, for every bucket). The cache's key is these settings:
        a :class:`~twophase.Secret` stays a reference there, and ``repr`` hides the
        credentials either way."""
        return _clients.get(self._client_key(max_attempts))

    def retried_if_rotated(self, attempt: Callable[[], T], what: str, *,
                           max_attempts: int = DEFAULT_S3_MAX_ATTEMPTS) -> T:
        """``attempt()``, which uses :meth:`client` (``max_attempts``); should the store refuse
        its credentials after their ``Secret`` changed (rotated keys), the client is made again
        with the new ones and ``attempt()`` runs once more."""
        return _clients.retried_if_rotated(self._client_key(max_attempts), attempt,
                                           refused_credentials, what=f"{what} ({self.where})")

    def _client_key(self, max_attempts: int) -> tuple[S3Settings, int]:
        return replace(self, bucket=""), max_attempts

    def _new_client(self, max_attempts: int) -> Any:
        key_id, secret, token = (reveal(option) for option in self.secrets)
        _redaction.protect(secret, token)
        if self.tls == "require":
            log.warning("%s: TLS certificate verification is OFF (tls='require') for %s",
                        SYSTEM, self.endpoint_url or "AWS")
        config = _boto("botocore.config").Config(
            s3={"addressing_style": "path" if self.path_style else "auto"},
            retries={"max_attempts": max_attempts, "mode": "standard"},
            request_checksum_calculation=self.checksums,
            response_checksum_validation="when_required",
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            max_pool_connections=MAX_POOL_CONNECTIONS,
            client_cert=self.client_cert if self.client_key is None
            else (self.client_cert, self.client_key),
        )
        return _session().client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret, aws_session_token=token, verify=self.tls_verify,
            config=config)


class _RedactSecrets(logging.Filter):
    """Takes the credentials out of botocore's DEBUG records of requests: the session token
    header, the signature, and every secret a client of this process was made with."""

    def __init__(self) -> None:
        super().__init__()
        self._secrets: set[str] = set()
        self._installed = False

    def protect(self, *secrets: str | None) -> None:
        """Redact ``secrets`` from now on (and install the filter, once)."""
        self._secrets.update(s for s in secrets if s and len(s) >= MIN_REDACTED_LENGTH)
        if not self._installed:
            for name in REQUEST_LOGGERS:
                logging.getLogger(name).addFilter(self)
            self._installed = True

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: its handler reports it
            return True
        redacted = _SECRET_FIELDS.sub(
            lambda m: f"{m.group(1) or m.group(3)}{REDACTED}", message)
        for secret in self._secrets:
            redacted = redacted.replace(secret, REDACTED)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


_redaction = _RedactSecrets()


#: The options an S3 location takes: :class:`S3Settings`' fields but the bucket.
S3_OPTIONS = frozenset(f.name for f in fields(S3Settings)) - {"bucket"}


def _session() -> Any:
    """This process's boto3 session (called by :data:`_clients` with its lock held: sessions
    are not thread-safe)."""
    session = _sessions.get(os.getpid())
    if session is None:
        session = _sessions[os.getpid()] = _boto("boto3").session.Session()
    return session


def _boto(module: str) -> ModuleType:
    """``boto3`` or a ``botocore`` module, imported on first use."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(f"{SYSTEM} needs boto3, which is not installed.",
                                 fix=FIX_NO_BOTO3) from exc


@functools.cache
def boto_errors() -> tuple[type[BaseException], ...]:
    """What to catch around boto3 calls: botocore's ``ClientError`` and ``BotoCoreError``."""
    exceptions = _boto("botocore.exceptions")
    return (exceptions.ClientError, exceptions.BotoCoreError)


@dataclass(frozen=True)
class S3Errors:
    """Every S3 error, classified once, here (see the module docstring), for a caller whose
    credentials need ``permissions`` (``"s3:GetObject"``...): a refused request's fix names
    them."""

    permissions: tuple[str, ...]

    # -- codes callers steer by ----------------------------------------------------------------
    NOT_FOUND: ClassVar[frozenset[str]] = frozenset({"404", "NoSuchKey", "NotFound"})
    NO_SUCH_BUCKET: ClassVar[str] = "NoSuchBucket"
    NO_SUCH_UPLOAD: ClassVar[str] = "NoSuchUpload"
    PRECONDITION_FAILED: ClassVar[str] = "PreconditionFailed"
    #: A conditional write that raced another one on the same key (409).
    CONDITIONAL_CONFLICT: ClassVar[str] = "ConditionalRequestConflict"
    NO_LIFECYCLE: ClassVar[str] = "NoSuchLifecycleConfiguration"
    #: The rule of a 5xx whose code the table does not name.
    SERVER_ERROR: ClassVar[str] = "500"

    @staticmethod
    def code(exc: BaseException) -> str | None:
        """The S3 error code of a ``ClientError`` (``"404"`` for a HEAD without a body)."""
        code: Any = _response(exc).get("Error", {}).get("Code")
        return str(code) if code is not None else None

    @staticmethod
    def status(exc: BaseException) -> int:
        """The HTTP status of a ``ClientError`` (0 otherwise)."""
        value: Any = _response(exc).get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return int(value or 0)

    def classify(self, exc: BaseException, what: str) -> TwoPhaseError:
        """The one verdict on a boto3/botocore error raised during ``what``."""
        errors = _boto("botocore.exceptions")
        if isinstance(exc, errors.ClientError):
            code = self.code(exc) or str(self.status(exc))
            return self.error(code, what, exc.response.get("Error", {}).get("Message", ""),
                              status=self.status(exc),
                              operation=getattr(exc, "operation_name", None))
        failed = f"{SYSTEM}: {what} failed: {exc}."
        if isinstance(exc, (errors.NoCredentialsError, errors.PartialCredentialsError)):
            return ConfigurationError(failed, fix=FIX_CREDENTIALS)
        if isinstance(exc, errors.SSLError):
            return ConfigurationError(failed, fix=FIX_TLS)
        if isinstance(exc, (errors.ConnectionError, errors.HTTPClientError)):
            return RetryableError(failed, fix=FIX_UNREACHABLE)
        if isinstance(exc, errors.BotoCoreError):
            return FatalError(failed, fix=FIX_UNKNOWN_CODE)
        return FatalError(f"{SYSTEM}: {what} failed: {type(exc).__name__}: {exc}.",
                          fix=FIX_UNKNOWN_CODE)

    def error(self, code: str, what: str, message: str = "", *, status: int = 0,
              operation: str | None = None) -> TwoPhaseError:
        """The verdict on S3's error ``code`` (HTTP ``status``) during ``what``: also for a
        code that comes in a reply (DeleteObjects' per-key errors) or that a bodiless reply
        only implies (a HEAD's 404 of a bucket is ``NoSuchBucket``). A refused ``operation``
        (``"ListParts"``...) names the permission it needs first."""
        rule = self.SERVER_ERROR if code not in self.rules and status >= 500 else code
        kind, fix = self.rules.get(rule, UNKNOWN_CODE)
        needed = OPERATION_PERMISSIONS.get(operation or "")
        if code in ACCESS_DENIED and needed is not None:  # a bare 403 may be the key's fault
            fix = f"{fix}; {operation} needs {needed}" if code == BARE_403 \
                else f"{operation} needs {needed}; {fix}"
        return kind(f"{SYSTEM}: {what} failed: {code}" + (f" ({message})." if message else "."),
                    fix=fix)

    @functools.cached_property
    def rules(self) -> dict[str, _Verdict]:
        """Each code's verdict (the fix of a refused request names ``permissions``)."""
        return _rules(_access_fix(self.permissions))


def _access_fix(permissions: tuple[str, ...]) -> str:
    *first, last = permissions
    named = f"{', '.join(first)} and {last}" if first else last
    return f"grant {named} on the bucket and prefix to these credentials"


def _rules(fix_access: str) -> dict[str, _Verdict]:
    retry: _Verdict = (RetryableError, FIX_RETRY)
    return {
        "SlowDown": retry,
        "Throttling": retry,
        "ThrottlingException": retry,
        "RequestLimitExceeded": retry,
        "RequestTimeout": retry,
        "InternalError": retry,
        "ServiceUnavailable": retry,
        "OperationAborted": retry,  # a conflicting operation on the bucket is in progress
        S3Errors.SERVER_ERROR: retry, "502": retry, "503": retry, "504": retry,
        S3Errors.NO_SUCH_BUCKET: (ConfigurationError, FIX_BUCKET),
        "InvalidBucketName": (ConfigurationError, FIX_BUCKET),
        "AccessDenied": (ConfigurationError, fix_access),
        "403": (ConfigurationError, f"{FIX_CREDENTIALS}; or {fix_access}"),
        "AllAccessDisabled": (ConfigurationError, fix_access),
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
    }


def refused_credentials(exc: BaseException) -> bool:
    """Whether the store refused the credentials themselves (an unknown or deleted key, a
    signature of another secret, an expired token; a bare 403, which may also be a missing
    permission): a rotated key is read again (:func:`twophase.kit.retried_if_rotated`)."""
    return S3Errors.code(exc) in REFUSED_CREDENTIALS


#: Clients are not closed when dropped (another thread may be using one): collected instead.
_clients: ClientCache[tuple[S3Settings, int], Any] = ClientCache(
    lambda key: key[0]._new_client(key[1]), lambda key: key[0].secrets)


def _response(exc: BaseException) -> dict[str, Any]:
    """A ``ClientError``'s parsed reply (empty for any other error)."""
    response: Any = getattr(exc, "response", None)
    return response if isinstance(response, dict) else {}


def split_s3_location(location: str, *, named: str, fix: str) -> tuple[str, str]:
    """The bucket and the rest (the key or prefix, as given) of ``s3://bucket/rest`` (or
    ``s3a://``); a location without a bucket is a ConfigurationError naming it as ``named``."""
    bucket, _, rest = location.split("://", 1)[1].partition("/")
    if not bucket:
        raise ConfigurationError(f"{named} {location!r} names no bucket.", fix=fix)
    return bucket, rest
