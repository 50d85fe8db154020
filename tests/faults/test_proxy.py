"""The blackhole proxy forwards, then holds bytes without closing anything, then
delivers them once healed: the row's fault is what it claims to be."""

from __future__ import annotations

import asyncio

from tests.support.proxy import BlackholeProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


async def test_blackhole_holds_bytes_and_heal_delivers_them() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    proxy = BlackholeProxy(server.sockets[0].getsockname()[1])
    await proxy.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(b"one")
        assert await asyncio.wait_for(reader.readexactly(3), 5) == b"one"
        proxy.blackhole()
        writer.write(b"two")
        # Nothing comes back, and the connection stays open (no EOF, no reset).
        pending = asyncio.ensure_future(reader.read(3))
        done, _ = await asyncio.wait([pending], timeout=0.3)
        assert not done
        proxy.heal()
        assert await asyncio.wait_for(pending, 5) == b"two"
    finally:
        writer.close()
        await proxy.close()
        server.close()
        await server.wait_closed()


async def test_close_after_heal_leaves_no_connection_of_a_held_accept() -> None:
    """A connection accepted while blackholed waits for the heal; healed and closed at
    once (as the fixtures do), it used to start its pipes after close() had swept them:
    they outlived the test's loop, and their streams' ResourceWarnings failed whichever
    test the garbage collector happened to run in."""
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    proxy = BlackholeProxy(server.sockets[0].getsockname()[1])
    await proxy.start()
    proxy.blackhole()
    _reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        await asyncio.sleep(0.1)  # accepted, held
        proxy.heal()
        await proxy.close()
        await asyncio.sleep(0.1)  # anything close() missed would run now
        leftover = [
            t
            for t in asyncio.all_tasks()
            if t is not asyncio.current_task() and "_pipe" in repr(t.get_coro())
        ]
        assert leftover == []
    finally:
        writer.close()
        server.close()
        await server.wait_closed()
