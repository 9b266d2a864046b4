"""An asyncio TCP proxy for fault tests: per-direction pause ("blackhole": the
bytes wait in the proxy, as TCP would retransmit them once the link heals),
delay, and cut (close both sides after N more bytes)."""

from __future__ import annotations

import asyncio
import contextlib


class FaultProxy:
    def __init__(
        self, target_host: str, target_port: int, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        """Listens on `host`:`port` (default: a free loopback port)."""
        self.target = (target_host, target_port)
        self.host, self.listen_port = host, port
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.open = {"up": asyncio.Event(), "down": asyncio.Event()}  # up: client→target
        for event in self.open.values():
            event.set()
        self.delay_s = {"up": 0.0, "down": 0.0}
        self.cut_after: dict[str, int | None] = {"up": None, "down": None}
        self.connections = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, self.listen_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def blackhole(self, direction: str = "both") -> None:
        for d in ("up", "down") if direction == "both" else (direction,):
            self.open[d].clear()

    def heal(self) -> None:
        for event in self.open.values():
            event.set()
        self.delay_s = {"up": 0.0, "down": 0.0}

    def cut_connections(self) -> None:
        for w in list(self._writers):
            w.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut_connections()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.connections += 1
        self._writers |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, "up", writer)),
            asyncio.create_task(self._pump(up_reader, writer, "down", up_writer)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        for w in (writer, up_writer):
            w.close()
            self._writers.discard(w)
        self._tasks.difference_update(pumps)

    async def _pump(self, reader, writer, direction: str, other) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                await self.open[direction].wait()
                if self.delay_s[direction]:
                    await asyncio.sleep(self.delay_s[direction])
                limit = self.cut_after[direction]
                if limit is not None:
                    if len(data) >= limit:
                        writer.write(data[:limit])
                        await writer.drain()
                        writer.close()
                        other.close()
                        return
                    self.cut_after[direction] = limit - len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return
