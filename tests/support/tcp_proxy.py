"""A loopback TCP forwarder a test can cut, to drop a client's connection to a daemon that keeps
running: `cut()` closes every forwarded connection and turns new ones away (accepted, then
closed at once) until `restore()`."""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._cut = False
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def cut(self) -> None:
        self._cut = True
        for writer in list(self._open):
            writer.close()
        self._open.clear()

    def restore(self) -> None:
        self._cut = False

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.close()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self._target_port
            )
        except OSError:
            writer.close()
            return
        self._open |= {writer, upstream_writer}
        await asyncio.gather(
            self._pump(reader, upstream_writer), self._pump(upstream_reader, writer)
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copies until either side closes, then closes the other."""
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()
        self._open.discard(writer)
