"""The reference receiver: any webhook made idempotent, per the IETF idempotency-key draft.

::

    python -m sinks.http.receiver --db receipts.sqlite --port 8080 \\
        [--forward https://internal/webhook] [--token-file F] [--signing-secret-file F] \\
        [--key-expiry 86400] [--max-body 10485760] [--certfile cert.pem --keyfile key.pem]

An aiohttp server. Every ``POST`` / ``PUT`` carries a JSON array or JSON Lines body
(``Content-Encoding: gzip`` allowed) and an ``Idempotency-Key``; in this order it answers:

======  =========================================================================================
status  when
======  =========================================================================================
413     the body (or its decompressed content) is over ``--max-body``
401     the bearer token (``--token-file``) or the signature (``--signing-secret-file``, an HMAC
        of timestamp and body, see :mod:`~sinks.http.signing`) is missing, wrong, or out of the
        tolerance window; nothing is stored
400     no (valid) ``Idempotency-Key``; a body that is not JSON records (nothing is stored)
415     a media type or content encoding it does not read
422     the key is known with another fingerprint (both fingerprints in the body)
409     the key's first request is still in flight (``Retry-After: 1``)
replay  the key's first request completed: its stored status and body, ``Idempotent-Replayed:
        true``; nothing is executed again
200     a first request: its records stored (table ``records``); with ``--forward``, the
        downstream webhook's 2xx answer, stored and replayed from then on. A downstream
        refusal (4xx, passed on) or failure (5xx, a timeout: 502) is not stored: the key is
        released, so the retry is forwarded again once the downstream is fixed
======  =========================================================================================

Keys are kept ``--key-expiry`` seconds after their first request and then forgotten (a request
with an expired key is a new request); the window, the body limit and the header names are
published as JSON at ``GET /.well-known/idempotency``. The store (:mod:`~sinks.http.receipts`)
is SQLite: one receiver process per database. A restart after a crash releases the keys left
in flight, so their retries execute them; with ``--forward``, a crash between the downstream's
answer and its storage lets that one request reach the downstream twice (the downstream has
no idempotency of its own: nothing can tell whether it acted). TLS with ``--certfile`` and
``--keyfile``. The log names methods, paths, keys and statuses: never a secret or a body.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hmac
import json
import logging
import os
import ssl
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import ClientError, ClientSession, ClientTimeout, web

from sinks.http.protocol import (
    GZIP,
    IDEMPOTENCY_KEY,
    JSON_LINES_TYPES,
    REPLAYED,
    SIGNATURE,
    WELL_KNOWN,
    content_digest,
    fingerprint,
    parse_key,
)
from sinks.http.receipts import Claim, Receipts, Stored
from sinks.http.signing import DEFAULT_TOLERANCE_S, refusal

log = logging.getLogger(__name__)

DEFAULT_PORT = 8080
DEFAULT_HOST = "127.0.0.1"
DEFAULT_KEY_EXPIRY_S = 24 * 3600.0
DEFAULT_MAX_BODY = 10 * 1024 * 1024
#: Decompressed content may be this many times ``--max-body`` (a gzip bomb is refused).
MAX_INFLATION = 10
DEFAULT_FORWARD_TIMEOUT_S = 30.0
#: The most of a downstream answer that is stored and replayed.
MAX_STORED_ANSWER = 1024 * 1024
READ_CHUNK = 64 * 1024
PURGE_INTERVAL_S = 60.0
IN_FLIGHT_RETRY_AFTER_S = "1"
JSON_TYPE = "application/json"
FORWARDED_HEADERS = ("Content-Type", "Content-Encoding", IDEMPOTENCY_KEY)

T = TypeVar("T")


@dataclass(frozen=True)
class ReceiverConfig:
    """What the receiver enforces (secrets hidden from ``repr``)."""

    db: Path
    forward: str | None = None
    token: str | None = None
    signing_secret: bytes | None = None
    tolerance_s: float = DEFAULT_TOLERANCE_S
    key_expiry_s: float = DEFAULT_KEY_EXPIRY_S
    max_body: int = DEFAULT_MAX_BODY
    forward_timeout_s: float = DEFAULT_FORWARD_TIMEOUT_S

    def __repr__(self) -> str:
        return (f"ReceiverConfig(db={str(self.db)!r}, forward={self.forward!r}, "
                f"token={'set' if self.token else None}, "
                f"signing_secret={'set' if self.signing_secret else None}, "
                f"key_expiry_s={self.key_expiry_s}, max_body={self.max_body})")

    def policy(self) -> dict[str, Any]:
        """What ``GET /.well-known/idempotency`` publishes."""
        return {"key_expiry_s": self.key_expiry_s, "max_body_bytes": self.max_body,
                "idempotency_key_header": IDEMPOTENCY_KEY, "replayed_header": REPLAYED,
                "signature_header": SIGNATURE if self.signing_secret else None,
                "signature_tolerance_s": self.tolerance_s if self.signing_secret else None,
                "bearer_token": self.token is not None}


@dataclass(frozen=True)
class Incoming:
    """A request that passed every check, about to be claimed."""

    request: web.Request
    key: str
    body: bytes
    records: list[Any]
    fingerprint: str

    @property
    def scope(self) -> str:
        """Keys are unique per resource: the path."""
        return self.request.path


class RefusedError(Exception):
    """A request answered with an error status before anything is stored."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


def _error(status: int, message: str, *, headers: dict[str, str] | None = None,
           **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status, headers=headers)


class Receiver:
    """The request handling; the store runs on one thread of its own."""

    def __init__(self, config: ReceiverConfig) -> None:
        self.config = config
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="receipts")
        self.receipts = Receipts(config.db, owner=uuid.uuid4().hex)
        self.client: ClientSession | None = None

    async def store(self, action: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, action, *args)

    # -- lifecycle -----------------------------------------------------------------------------

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        released = await self.store(self.receipts.release_interrupted)
        if released:
            log.warning("released %d key(s) left in flight by a previous process: their "
                        "retries execute them%s", released,
                        " (and forward them again)" if self.config.forward else "")
        if self.config.forward:
            self.client = ClientSession(
                timeout=ClientTimeout(total=self.config.forward_timeout_s), auto_decompress=False)
        purger = asyncio.create_task(self._purge_forever())
        yield
        purger.cancel()
        if self.client is not None:
            await self.client.close()
        self.executor.submit(self.receipts.close).result()
        self.executor.shutdown()

    async def _purge_forever(self) -> None:
        interval = min(PURGE_INTERVAL_S, self.config.key_expiry_s / 4)
        while True:
            purged = await self.store(self.receipts.purge_expired, time.time(),
                                      self.config.key_expiry_s)
            if purged:
                log.info("forgot %d expired key(s)", purged)
            await asyncio.sleep(interval)

    # -- handlers ------------------------------------------------------------------------------

    async def policy(self, _: web.Request) -> web.Response:
        return web.json_response(self.config.policy())

    async def receive(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._read(request)
            self._authenticate(request, body)
            key = parse_key(request.headers.get(IDEMPOTENCY_KEY))
            if key is None:
                raise RefusedError(400, f"a {request.method} needs an {IDEMPOTENCY_KEY} "
                                   "header (a quoted string of printable ASCII, up to 255 "
                                   "characters)")
            content = self._decode(request, body)
            records = _records(content, request.content_type)
        except RefusedError as refused:
            log.info("%s %s -> %d %s", request.method, request.path, refused.status,
                     refused.message)
            headers = {"WWW-Authenticate": "Bearer"} if refused.status == 401 else None
            return _error(refused.status, refused.message, headers=headers, **refused.extra)
        incoming = Incoming(request, key, body, records,
                            fingerprint(request.method, request.path_qs, content_digest(content)))
        claim = await self.store(self.receipts.claim, incoming.scope, key,
                                 incoming.fingerprint, time.time(), self.config.key_expiry_s)
        response = await self._answer(incoming, claim)
        log.info("%s %s key=%s -> %d%s", request.method, request.path, key, response.status,
                 " (replayed)" if response.headers.get(REPLAYED) else "")
        return response

    async def _answer(self, incoming: Incoming, claim: Claim) -> web.Response:
        key, ours = incoming.key, incoming.fingerprint
        if claim.stored_fingerprint is not None:
            return _error(422, f"{IDEMPOTENCY_KEY} {key} was used with another request "
                          f"(fingerprint {claim.stored_fingerprint}; this one: {ours})",
                          stored_fingerprint=claim.stored_fingerprint,
                          request_fingerprint=ours)
        if claim.in_flight:
            return _error(409, f"the first request with {IDEMPOTENCY_KEY} {key} is still in "
                          "flight", headers={"Retry-After": IN_FLIGHT_RETRY_AFTER_S})
        if claim.stored is not None:
            return web.Response(status=claim.stored.status, body=claim.stored.body,
                                content_type=claim.stored.content_type,
                                headers={REPLAYED: "true"})
        try:
            answer = await self._execute(incoming)
        except BaseException:
            await asyncio.shield(self.store(self.receipts.release, incoming.scope, key))
            raise
        if not 200 <= answer.status < 300:  # the downstream refused or failed: not stored
            await self.store(self.receipts.release, incoming.scope, key)
            if answer.status >= 500:
                return _error(502, f"the downstream webhook answered {answer.status}; retry "
                              "later")
            return web.Response(status=answer.status, body=answer.body,
                                content_type=answer.content_type)
        await asyncio.shield(self.store(self.receipts.complete, incoming.scope, key,
                                        incoming.records, answer, time.time()))
        return web.Response(status=answer.status, body=answer.body,
                            content_type=answer.content_type)

    async def _execute(self, incoming: Incoming) -> Stored:
        """Run a first request: forward it, or just accept its records."""
        request, body = incoming.request, incoming.body
        if self.client is None or self.config.forward is None:
            return Stored(200, JSON_TYPE, json.dumps({"accepted": len(incoming.records)}).encode())
        headers = {name: request.headers[name] for name in FORWARDED_HEADERS
                   if name in request.headers}
        try:
            async with self.client.request(request.method, self.config.forward, data=body,
                                           headers=headers) as reply:
                answer = await reply.content.read(MAX_STORED_ANSWER)
                content_type = reply.content_type or "application/octet-stream"
                return Stored(reply.status, content_type, answer)
        except (ClientError, TimeoutError) as exc:
            log.warning("forward to the downstream webhook failed: %s", type(exc).__name__)
            return Stored(502, JSON_TYPE, b"{}")

    # -- checks --------------------------------------------------------------------------------

    async def _read(self, request: web.Request) -> bytes:
        limit = self.config.max_body
        too_large = RefusedError(413, f"the body is over this receiver's limit of {limit} "
                                 "bytes", max_body_bytes=limit)
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        parts, size = [], 0
        async for chunk in request.content.iter_chunked(READ_CHUNK):
            size += len(chunk)
            if size > limit:
                raise too_large
            parts.append(chunk)
        return b"".join(parts)

    def _authenticate(self, request: web.Request, body: bytes) -> None:
        token, secret = self.config.token, self.config.signing_secret
        if token is not None:
            given = request.headers.get("Authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(),
                                                                     token.encode()):
                raise RefusedError(401, "a missing or wrong bearer token")
        if secret is not None:
            why = refusal(secret, request.headers.get(SIGNATURE), body, time.time(),
                          self.config.tolerance_s)
            if why is not None:
                raise RefusedError(401, f"{why} in {SIGNATURE}")

    def _decode(self, request: web.Request, body: bytes) -> bytes:
        coding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if coding in ("", "identity"):
            return body
        if coding != GZIP:
            raise RefusedError(415, f"Content-Encoding {coding!r} is not read here (gzip is)")
        limit = self.config.max_body * MAX_INFLATION
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            content = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise RefusedError(400, f"the gzip body is corrupt ({exc})") from exc
        if len(content) > limit or inflater.unconsumed_tail:
            raise RefusedError(413, f"the decompressed content is over {limit} bytes")
        if not inflater.eof:
            raise RefusedError(400, "the gzip body is truncated")
        return content


def _records(content: bytes, content_type: str) -> list[Any]:
    """The JSON objects of a JSON array or JSON Lines body."""
    try:
        if content_type in JSON_LINES_TYPES:
            records = [json.loads(line) for line in content.splitlines() if line.strip()]
        elif content_type == JSON_TYPE:
            parsed = json.loads(content)
            records = parsed if isinstance(parsed, list) else [parsed]
        else:
            raise RefusedError(415, f"Content-Type {content_type!r} is not read here (use "
                               f"{JSON_TYPE} or application/x-ndjson)")
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise RefusedError(400, f"the body is not valid JSON ({type(exc).__name__} at "
                           f"{getattr(exc, 'pos', '?')})") from exc
    if not all(isinstance(record, dict) for record in records):
        raise RefusedError(400, "every record must be a JSON object")
    return records


def build_app(config: ReceiverConfig) -> web.Application:
    receiver = Receiver(config)
    app = web.Application()
    app.cleanup_ctx.append(receiver.lifecycle)
    app.router.add_get(WELL_KNOWN, receiver.policy)
    app.router.add_route("POST", "/{tail:.*}", receiver.receive)
    app.router.add_route("PUT", "/{tail:.*}", receiver.receive)
    return app


def _secret(path: str | None) -> str | None:
    return Path(path).read_text().strip() if path else None


def _lock(db: Path) -> int:
    """Hold ``<db>.lock``: one receiver per database (its in-flight keys are its own)."""
    fd = os.open(f"{db}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another receiver is using {db}: give each receiver its own --db") \
            from None
    return fd


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sinks.http.receiver",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--db", required=True, help="the SQLite store (created if missing)")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--forward", help="a downstream webhook to forward first requests to")
    parser.add_argument("--forward-timeout", type=float, default=DEFAULT_FORWARD_TIMEOUT_S)
    parser.add_argument("--token-file", help="a file holding the bearer token to require")
    parser.add_argument("--signing-secret-file", help="a file holding the HMAC signing secret")
    parser.add_argument("--signature-tolerance", type=float, default=DEFAULT_TOLERANCE_S,
                        help="seconds a signature's timestamp may be off (default %(default)s)")
    parser.add_argument("--key-expiry", type=float, default=DEFAULT_KEY_EXPIRY_S,
                        help="seconds a key is kept (default %(default)s)")
    parser.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY,
                        help="largest body in bytes (default %(default)s)")
    parser.add_argument("--certfile", help="serve TLS with this certificate chain (PEM)")
    parser.add_argument("--keyfile", help="the certificate's private key (PEM)")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    secret = _secret(args.signing_secret_file)
    config = ReceiverConfig(
        db=Path(args.db), forward=args.forward, token=_secret(args.token_file),
        signing_secret=secret.encode() if secret else None,
        tolerance_s=args.signature_tolerance, key_expiry_s=args.key_expiry,
        max_body=args.max_body, forward_timeout_s=args.forward_timeout)
    if config.token is None and config.signing_secret is None:
        log.warning("no --token-file and no --signing-secret-file: anyone who reaches this "
                    "port can deliver records")
    context = None
    if args.certfile:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.certfile, args.keyfile)
    lock = _lock(config.db)
    log.info("receiving on %s://%s:%d with %r", "https" if context else "http", args.host,
             args.port, config)
    try:
        web.run_app(build_app(config), host=args.host, port=args.port, ssl_context=context,
                    access_log=None, print=None, auto_decompress=False)
    finally:
        with contextlib.suppress(OSError):
            os.close(lock)


if __name__ == "__main__":
    main()
