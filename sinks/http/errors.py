"""Every answer and failure the sink meets, classified once, here.

==========================================  ====================================================
what happened                               what the sink does / raises
==========================================  ====================================================
2xx (fresh, or replayed from the store)     the request is delivered
409: the first request is still in flight   :class:`RetryableError`: retried after a backoff
429 (honouring ``Retry-After``), 408, 5xx   :class:`RetryableError` (bounded, backoff + jitter)
no connection, a timeout                    :class:`RetryableError` naming the URL
422: the key was used with another payload  :class:`FatalError` with both fingerprints
401, 403: token or signature refused        :class:`ConfigurationError`: fix the secrets/clock
413: over the receiver's body limit         :class:`ConfigurationError`: smaller requests
404, 405, a redirect, a malformed URL       :class:`ConfigurationError`: fix ``url=``
TLS verification failed (CA or host name)   :class:`ConfigurationError`: fix ``ca_bundle=``/url
any other 4xx (a rejected payload)          :class:`FatalError` with the receiver's message
==========================================  ====================================================

The staging on S3 (:mod:`~sinks.http.s3_staging`) is S3's business: its errors are classified
by the framework's one table of S3 errors (:class:`twophase.kit.s3.S3Errors`).

The committer retries the retryable ones itself (a few times, quickly) before it raises them
to twophase, which retries the whole commit again. Messages name the method, URL,
transaction and key, never a header value or a body.
"""

from __future__ import annotations

import json
from collections.abc import Hashable

import requests

from twophase import ConfigurationError, FatalError, RetryableError, TwoPhaseError
from twophase.kit import ErrorTable

SYSTEM = "HttpSink"
#: How much of a receiver's error body goes into a message.
MESSAGE_MAX_CHARS = 300
ANY_5XX = 500

FIX_RETRY = ("retried automatically with backoff; if it persists, check the receiver's health "
             "and logs")
FIX_IN_FLIGHT = ("the receiver is still processing the first request with this key; retried "
                 "automatically until it has finished")
FIX_AUTH = ("fix token= / signing_secret= to the receiver's, and this host's clock (a "
            "signature is refused outside the receiver's tolerance window); the decided batch "
            "is delivered after the fix and a restart")
FIX_TOO_LARGE = ("lower max_bytes_per_request= / max_records_per_request= below the receiver's "
                 "body limit (published at /.well-known/idempotency); batches decided already "
                 "keep their staged size: raise the receiver's limit (--max-body) to deliver "
                 "them")
FIX_MISMATCH = ("this key was used before with another payload: two jobs sharing one staging "
                "location and namespace, or staged files edited; give each job its own "
                "staging= and namespace, then re-deliver the batch")
FIX_URL = "fix url= and method= to the receiver's endpoint"
FIX_TLS = ("the receiver's certificate was not verified (another CA, or another host name): "
           "pass ca_bundle= (the file of the CA that issued it) and reach the receiver by a "
           "host name its certificate names (url=), or fix its certificate; tls='require' turns "
           "the check off (never across a network you do not trust)")
FIX_UNREACHABLE = ("retried automatically; if it persists, check url= (scheme, host, port) and "
                   "that the receiver is running and reachable from the driver")
FIX_REJECTED = ("the receiver refused the payload (see its message); fix the rows in the query "
                "or the receiver's expectations, then restart the query: the decided batch is "
                "sent again, with the same keys")

_RETRY = (RetryableError, FIX_RETRY)
_URL = (ConfigurationError, FIX_URL)
ERRORS = ErrorTable(
    system=SYSTEM,
    default=(FatalError, FIX_REJECTED),
    rules={
        409: (RetryableError, FIX_IN_FLIGHT),
        408: _RETRY, 425: _RETRY, 429: _RETRY, ANY_5XX: _RETRY,
        422: (FatalError, FIX_MISMATCH),
        401: (ConfigurationError, FIX_AUTH), 403: (ConfigurationError, FIX_AUTH),
        413: (ConfigurationError, FIX_TOO_LARGE),
        404: _URL, 405: _URL,
        301: _URL, 302: _URL, 303: _URL, 307: _URL, 308: _URL,  # never followed
        # exceptions of requests, by class name (the most specific class in the table wins)
        "SSLError": (ConfigurationError, FIX_TLS),
        "ConnectionError": (RetryableError, FIX_UNREACHABLE),
        "Timeout": (RetryableError, FIX_UNREACHABLE),
        "ChunkedEncodingError": (RetryableError, FIX_UNREACHABLE),
        "InvalidURL": _URL, "MissingSchema": _URL, "InvalidSchema": _URL,
    },
)


def _by_class(table: ErrorTable, exc: BaseException, what: str) -> TwoPhaseError:
    """The verdict of ``table`` on the most specific class of ``exc`` that it names."""
    for cls in type(exc).__mro__:
        if cls.__name__ in table.rules:
            return table.error(cls.__name__, what, f"{type(exc).__name__}: {exc}")
    return table.error("?", what, f"{type(exc).__name__}: {exc}")


def receiver_message(response: requests.Response) -> str:
    """The receiver's own words about a refusal (its JSON ``error``, else the body's start)."""
    text = response.text[:4 * MESSAGE_MAX_CHARS]
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        text = parsed["error"]
    return " ".join(text.split())[:MESSAGE_MAX_CHARS] or "(no message)"


def classify_response(response: requests.Response, what: str, *,
                      fingerprint: str) -> TwoPhaseError:
    """The verdict on a non-2xx answer to ``what``; a 422 names our fingerprint too."""
    status = response.status_code
    code: Hashable = ANY_5XX if status >= 500 and status not in ERRORS.rules else status
    detail = f"{status} {response.reason}: {receiver_message(response)}"
    if response.is_redirect:
        detail += f" (redirected to {response.headers.get('Location', '?')})"
    if status == 422:
        detail += f" (this request's fingerprint: {fingerprint})"
    return ERRORS.error(code, what, detail)


def classify(exc: BaseException, what: str) -> TwoPhaseError:
    """The verdict on an exception raised by requests during ``what``."""
    return _by_class(ERRORS, exc, what)


def retry_after_s(response: requests.Response) -> float | None:
    """A ``Retry-After`` in seconds (the HTTP-date form is read as no hint)."""
    value = response.headers.get("Retry-After", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
