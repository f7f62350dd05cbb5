"""HTTP endpoints, exactly once by idempotency keys: :class:`HttpSink`, and the receiver.

::

    from sinks.http import HttpSink

    sink = HttpSink("https://hooks.example.com/orders", staging="s3://bucket/staging",
                    encoding="jsonl", compression="gzip", token=..., signing_secret=...)

One module per role:

==============  ===========================================================================
module          role
==============  ===========================================================================
``sink``        :class:`HttpSink`: the phases, and what a crash at each one leaves
``committer``   :class:`HttpCommitter`: the driver's sends, retries and aborts
``staging``     the staging (a directory): durable request bodies, manifests, commit records
``s3_staging``  the staging under an S3 prefix (the manifest written last is the seal)
``encoding``    rows to JSON arrays / JSON Lines (+ gzip), split into bounded requests
``protocol``    header names, idempotency keys, fingerprints (shared with the receiver)
``signing``     HMAC signatures of timestamp and body (shared with the receiver)
``errors``      every status and failure and how it is classified: the one place
``connection``  settings (secrets hidden) and one pooled session per process
``receiver``    the reference receiver: ``python -m sinks.http.receiver`` (aiohttp, SQLite)
``receipts``    the receiver's SQLite store of keys, responses and delivered records
==============  ===========================================================================
"""

from sinks.http.protocol import IDEMPOTENCY_KEY, REPLAYED, SIGNATURE, WELL_KNOWN
from sinks.http.sink import HttpSink

__all__ = ["IDEMPOTENCY_KEY", "REPLAYED", "SIGNATURE", "WELL_KNOWN", "HttpSink"]
