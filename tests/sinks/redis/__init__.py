"""The Redis sink's tests, and their reader of a stream's length (:class:`LengthReader`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import redis

from setups.servers.redis import RedisServer

POLL_INTERVAL_S = 0.002


class LengthReader:
    """A reader of a stream's length (redis-py's XLEN as the server's default user, none of
    the sink's code) in a thread of its own, keeping every length it saw."""

    def __init__(self, server: RedisServer, stream: str) -> None:
        self.client = server.client()
        self.stream, self.seen = stream, set[int]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            with contextlib.suppress(redis.exceptions.RedisError):  # a test restarts the server
                self.seen.add(int(self.client.xlen(self.stream)))

    @contextlib.contextmanager
    def polling(self) -> Iterator[LengthReader]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()
            self.client.close()
