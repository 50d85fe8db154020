"""A loopback TCP proxy that can blackhole its path: while blackholed it forwards
nothing and closes nothing, as a dead link or a dropping firewall would, so that only
the client's own timeouts can notice."""

from __future__ import annotations

import asyncio
import contextlib

from tests.support.net import free_port

CHUNK_BYTES = 65536


class BlackholeProxy:
    """Listens on 127.0.0.1:port and forwards every connection to target_port."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._held: set[asyncio.Task[object]] = set()  # accepts waiting out the blackhole

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def blackhole(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        # Accepts held by the blackhole (released by a heal just before, they would
        # start pipes after a single sweep) end here too: left to the garbage collector
        # once the loop is closed, their streams warn in whichever test runs then.
        while self._pipes or self._held:
            tasks = [*self._pipes, *self._held]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # New connections are accepted but not connected onward while blackholed: the
        # SYN is answered, nothing else is, like a path that drops packets.
        task = asyncio.current_task()
        assert task is not None
        self._held.add(task)
        try:
            await self._open.wait()
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        except BaseException:
            writer.close()
            raise
        finally:
            self._held.discard(task)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst, (writer, up_writer)))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        both: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while data := await src.read(CHUNK_BYTES):
                await self._open.wait()  # held, not dropped: delivered late once healed
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in both:
                with contextlib.suppress(Exception):
                    w.close()
