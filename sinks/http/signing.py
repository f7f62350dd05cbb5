"""Webhook signatures, the way Stripe and GitHub sign theirs: an HMAC of timestamp and body.

The sender puts ``t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`` in the
:data:`~sinks.http.protocol.SIGNATURE` header, over the body bytes exactly as sent (compressed,
if they are). The receiver recomputes it, compares in constant time, and refuses a timestamp
further than its tolerance from its own clock: a captured request replayed later is refused
before anything is stored. Secrets never leave this module in a message.
"""

from __future__ import annotations

import hashlib
import hmac

SCHEME = "v1"
#: How far a signature's timestamp may be from the receiver's clock (Stripe's default).
DEFAULT_TOLERANCE_S = 300


def _mac(secret: bytes, timestamp: int, body: bytes) -> str:
    return hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: bytes, body: bytes, now: float) -> str:
    """The signature header value for ``body`` sent at ``now``."""
    timestamp = int(now)
    return f"t={timestamp},{SCHEME}={_mac(secret, timestamp, body)}"


def refusal(secret: bytes, header: str | None, body: bytes, now: float,
            tolerance_s: float = DEFAULT_TOLERANCE_S) -> str | None:
    """Why a signature header does not authenticate ``body`` (None: it does)."""
    if not header:
        return "no signature"
    fields: dict[str, list[str]] = {}
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        fields.setdefault(name, []).append(value)
    try:
        timestamp = int(fields.get("t", [""])[0])
    except ValueError:
        return "a malformed signature"
    if abs(now - timestamp) > tolerance_s:
        return f"a signature timestamp outside the tolerance window ({tolerance_s:.0f}s)"
    expected = _mac(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, given) for given in fields.get(SCHEME, [])):
        return "a signature that does not match"
    return None
