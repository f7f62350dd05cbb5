"""What the sink and the receiver agree on: header names, idempotency keys, fingerprints.

The receiving side follows the IETF draft "The Idempotency-Key HTTP Header Field"
(draft-ietf-httpapi-idempotency-key-header-07): the key is a structured-field String (a quoted
string), one per request; a completed request's response is replayed for the same key; the
same key with another payload is 422, one still in flight 409, a missing one 400; the server
publishes how long it keeps keys (here at :data:`WELL_KNOWN`).

A request's *fingerprint* is what the receiver compares when a key comes back: the SHA-256 of
the method, the path (with its query) and the SHA-256 of the decoded content, so a request
sent once with gzip and once without is still the same request.
"""

from __future__ import annotations

import hashlib
import re
import uuid

IDEMPOTENCY_KEY = "Idempotency-Key"
#: Set to ``true`` on a response the receiver replays from its store (not executed again).
REPLAYED = "Idempotent-Replayed"
#: ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "t." + body>`` (see :mod:`~sinks.http.signing`).
SIGNATURE = "Twophase-Signature"
#: The transaction id and ``index/count`` of a request, for the receiver's operators.
TRANSACTION = "Twophase-Transaction"
REQUEST = "Twophase-Request"
#: Where the receiver publishes its key-expiry policy and body limit (JSON).
WELL_KNOWN = "/.well-known/idempotency"
#: How long the sink waits for that policy (``check_schema``, ``check_committable``).
POLICY_TIMEOUT_S = 5.0

MEDIA_TYPES = {"json": "application/json", "jsonl": "application/x-ndjson"}
JSON_LINES_TYPES = frozenset({"application/x-ndjson", "application/jsonl",
                              "application/json-lines", "application/x-jsonlines"})
GZIP = "gzip"

KEY_MAX_LENGTH = 255
#: A structured-field String's characters, without the two that need escapes (" and \).
_KEY_RE = re.compile(rf"^[\x21\x23-\x5b\x5d-\x7e]{{1,{KEY_MAX_LENGTH}}}$")
#: The UUID namespace of the sink's keys: uuid5(this, "<txn id>/<request index>").
KEY_NAMESPACE = uuid.UUID("5a0c6b8e-2f51-4c9e-9d3b-7f1e2a6c4d90")


def idempotency_key(txn_id: str, index: int) -> str:
    """The deterministic key of request ``index`` of a transaction: the same on every retry,
    in every process, after every restart."""
    return str(uuid.uuid5(KEY_NAMESPACE, f"{txn_id}/{index}"))


def key_header(key: str) -> str:
    """The header value of a key: a structured-field String."""
    return f'"{key}"'


def parse_key(value: str | None) -> str | None:
    """The key of a header value (quoted as the draft says, or bare as many clients send it);
    None if it is missing or not a usable key."""
    if value is None:
        return None
    text = value.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return text if _KEY_RE.match(text) else None


def content_digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def fingerprint(method: str, path: str, digest: str) -> str:
    """The fingerprint of a request from its method, path and :func:`content_digest`."""
    return hashlib.sha256(f"{method.upper()} {path}\n{digest}".encode()).hexdigest()
