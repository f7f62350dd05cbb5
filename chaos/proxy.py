"""A small TCP proxy that a chaos scenario puts between the Spark job and the sink's server.

The sink is configured with the proxy's port; the scenario then breaks the network at will:

* :meth:`FaultProxy.cut` - every open connection is reset (RST) and new ones are reset as soon
  as they are accepted, until :meth:`FaultProxy.heal`: the server is unreachable;
* :meth:`FaultProxy.reset` - the open connections are reset once; new ones go through;
* :meth:`FaultProxy.slow` - every chunk forwarded waits ``delay_s`` first, until ``heal``.

It runs an asyncio loop in a daemon thread of the scenario's process, so that the scenario's
calls act at once, whatever the driver does meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
CHUNK_BYTES = 64 * 1024
#: SO_LINGER on, zero timeout: close() sends RST instead of FIN, as a broken network does.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


@dataclass
class _Mode:
    cut: bool = False
    delay_s: float = 0.0


@dataclass
class FaultProxy:
    """Forwards ``HOST:port`` to ``upstream`` (host, port) and breaks it on demand."""

    upstream: tuple[str, int]
    port: int = 0
    _mode: _Mode = field(default_factory=_Mode)
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _open: set[asyncio.StreamWriter] = field(default_factory=set)
    _server: asyncio.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def __enter__(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"proxy-{self.upstream[1]}")
        self._thread.start()
        self._call(self._listen())
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join()
        self._loop.close()

    # -- what a scenario does ------------------------------------------------------------

    def cut(self) -> None:
        """Reset every connection and refuse new ones until :meth:`heal`."""
        self._mode.cut = True
        self._call(self._reset_all())

    def reset(self) -> None:
        """Reset every open connection once (new ones go through)."""
        self._call(self._reset_all())

    def slow(self, delay_s: float) -> None:
        """Delay every forwarded chunk by ``delay_s`` until :meth:`heal`."""
        self._mode.delay_s = delay_s

    def heal(self) -> None:
        self._mode = _Mode()

    # -- the loop's side -------------------------------------------------------------------

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset_all()

    async def _reset_all(self) -> None:
        for writer in list(self._open):
            _reset(writer)
        self._open.clear()

    async def _accept(self, client_reader: asyncio.StreamReader,
                      client_writer: asyncio.StreamWriter) -> None:
        if self._mode.cut:
            _reset(client_writer)
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(client_writer)  # the server is down: the client sees a reset, as it would
            return
        pair = {client_writer, server_writer}
        self._open |= pair
        pipes = [asyncio.ensure_future(self._pipe(client_reader, server_writer)),
                 asyncio.ensure_future(self._pipe(server_reader, client_writer))]
        try:  # one side closed or reset: close the other, as a TCP connection would end
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            for writer in pair:
                self._open.discard(writer)
                writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(CHUNK_BYTES):
                if self._mode.delay_s:
                    await asyncio.sleep(self._mode.delay_s)
                if self._mode.cut or writer.is_closing():
                    return
                writer.write(chunk)
                await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        except OSError:
            log.debug("socket already closed")
    writer.transport.abort()
