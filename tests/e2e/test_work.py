"""`gateway work` as a real process against a real gateway: many tasks through a
concurrent worker, a worker killed mid-task, a cancel while the command runs, and the
drain on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from gateway_client import AsyncClient, NewTask
from tests.support.gateways import TOKEN, client_env, make_settings, running_gateway, work
from tests.support.waiting import wait_until


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):  # not there yet, or half written
        return None


async def read_pid(path: Path, within: float = 10) -> int:
    await wait_until(lambda: pid_in(path) is not None, within, f"a pid in {path}")
    pid = pid_in(path)
    assert pid is not None
    return pid


@pytest.mark.timeout(60)
async def test_two_hundred_tasks_each_completed_once(
    own_database_url, redis_url, redis_prefix, runtime_id
):
    settings = make_settings(own_database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        tasks = await client.enqueue_batch(
            runtime_id,
            [
                NewTask({"n": n, "fail": n % 10 == 0}, max_attempts=1 if n % 10 == 0 else 5)
                for n in range(200)
            ],
        )
        async with work(gw.url, runtime_id, "--concurrency", "8") as proc:
            counts: dict[str, int] = {}

            async def poll() -> None:
                while counts.get("completed", 0) + counts.get("dead", 0) < 200:
                    counts.update((await client.stats(runtime_id)).counts)
                    await asyncio.sleep(0.2)

            await asyncio.wait_for(poll(), 40)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
        by_id = {t.id: t async for t in client.iter_tasks(runtime_id)}
    assert len(by_id) == 200
    for sent in tasks:
        task = by_id[sent.id]
        n = sent.payload["n"]
        assert task.attempts == 1, task
        if n % 10 == 0:
            assert task.status == "dead"
            assert task.last_error is not None
            head = f"failed on purpose: {n} (exit code 7)\n"
            assert task.last_error.startswith(head)
            assert task.last_error.endswith(f"failed on purpose: {n}")
            assert len(task.last_error) <= 4096 + len(head)
        else:
            assert task.status == "completed"
            assert task.result["n"] == n and task.result["task_id"] == task.id
            assert task.result["runtime"] == runtime_id and task.result["token_withheld"]


async def test_a_traced_task_s_command_gets_its_context_and_no_other(
    own_database_url, redis_url, redis_prefix, runtime_id
):
    """W3C Trace Context from the producer's headers reaches the command as TRACEPARENT
    and TRACESTATE; an untraced task's command gets none, not even the worker's own."""
    settings = make_settings(own_database_url, redis_url, redis_prefix)
    traced = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01", "tracestate": "k=v"}
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        sent = await client.enqueue(runtime_id, {"n": 1}, **traced)
        bare = await client.enqueue(runtime_id, {"n": 2})
        mine = {"TRACEPARENT": f"00-{'ef' * 16}-{'01' * 8}-01", "TRACESTATE": "worker=1"}
        async with work(gw.url, runtime_id, environ=mine) as proc:

            async def done() -> bool:
                counts = (await client.stats(runtime_id)).counts
                return counts.get("completed", 0) == 2

            async with asyncio.timeout(30):
                while not await done():
                    await asyncio.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
        got = {t.id: t.result async for t in client.iter_tasks(runtime_id)}
    assert (got[sent.id]["traceparent"], got[sent.id]["tracestate"]) == (
        traced["traceparent"],
        "k=v",
    )
    assert (got[bare.id]["traceparent"], got[bare.id]["tracestate"]) == (None, None)


async def test_a_killed_worker_s_task_is_done_by_the_next(
    own_database_url, redis_url, redis_prefix, runtime_id, tmp_path
):
    settings = make_settings(
        own_database_url, redis_url, redis_prefix, janitor_interval_seconds=0.2
    )
    pidfile = tmp_path / "pid"
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        task = await client.enqueue(
            runtime_id, {"n": 1, "pidfile": str(pidfile), "sleep": 30, "sleep_on_attempt": 1}
        )
        async with work(gw.url, runtime_id, "--lease-seconds", "1") as first:
            orphan = await read_pid(pidfile)
            first.kill()
            await first.wait()
        try:
            async with work(gw.url, runtime_id, "--lease-seconds", "1") as second:
                await wait_until(lambda: second.returncode is None, 1, "start")
                done = None
                for _ in range(100):
                    done = await client.get(task.id)
                    if done.status == "completed":
                        break
                    await asyncio.sleep(0.1)
                second.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(second.wait(), 10) == 0
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)  # the killed worker could not end its command
    assert done is not None and done.status == "completed", done
    assert done.attempts == 2 and done.result["attempt"] == 2


async def test_a_cancelled_task_s_command_is_ended(
    own_database_url, redis_url, redis_prefix, runtime_id, tmp_path
):
    settings = make_settings(own_database_url, redis_url, redis_prefix)
    pidfile = tmp_path / "pid"
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        task = await client.enqueue(runtime_id, {"pidfile": str(pidfile), "sleep": 30})
        async with work(gw.url, runtime_id, "--lease-seconds", "3") as proc:
            pid = await read_pid(pidfile)
            assert (await client.cancel(task.id)).cancel_requested
            # The next heartbeat (a third of 3 s) sees the cancel; SIGTERM ends the command.
            await wait_until(lambda: not alive(pid), 5, "the command to be gone")
            for _ in range(50):
                if (await client.get(task.id)).status == "cancelled":
                    break
                await asyncio.sleep(0.1)
            assert (await client.get(task.id)).status == "cancelled"
            assert proc.returncode is None  # the worker goes on
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_a_lost_lease_ends_the_command_and_reports_nothing(
    own_database_url, redis_url, redis_prefix, runtime_id, tmp_path
):
    """The worker is frozen past its lease; the task goes to another daemon. Thawed, its
    next heartbeat is refused: its command is ended, and the new holder is left alone."""
    settings = make_settings(
        own_database_url, redis_url, redis_prefix, janitor_interval_seconds=0.2
    )
    pidfile = tmp_path / "pid"
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        task = await client.enqueue(runtime_id, {"pidfile": str(pidfile), "sleep": 30})
        log = tmp_path / "work.log"
        async with work(gw.url, runtime_id, "--lease-seconds", "1", log=log) as proc:
            pid = await read_pid(pidfile)
            proc.send_signal(signal.SIGSTOP)
            try:
                taken: list = []
                for _ in range(100):  # the lease lapses, the janitor queues the task again
                    taken = await client.claim(runtime_id, "other", lease_seconds=60)
                    if taken:
                        break
                    await asyncio.sleep(0.1)
                assert [t.id for t in taken] == [task.id] and taken[0].attempts == 2
            finally:
                proc.send_signal(signal.SIGCONT)
            await wait_until(lambda: not alive(pid), 5, "the command to be gone")
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
        held = await client.get(task.id)
        assert held.status == "claimed" and held.worker_id == "other"
        assert held.lease_id == taken[0].lease_id and held.attempts == 2
        assert "outcome=lease_lost" in log.read_text()


async def test_sigterm_lets_the_running_command_finish_and_exits_0(
    own_database_url, redis_url, redis_prefix, runtime_id, tmp_path
):
    settings = make_settings(own_database_url, redis_url, redis_prefix)
    pidfile = tmp_path / "pid"
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        task = await client.enqueue(runtime_id, {"n": 5, "pidfile": str(pidfile), "sleep": 1})
        later = await client.enqueue(runtime_id, {"n": 6})
        async with work(gw.url, runtime_id, log=tmp_path / "work.log") as proc:
            await read_pid(pidfile)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 10) == 0
        log = (tmp_path / "work.log").read_text()
        assert (await client.get(task.id)).status == "completed", log
        assert (await client.get(later.id)).status == "queued"  # never claimed
        stats = await client.stats(runtime_id)
        assert stats.counts["claimed"] == 0
        assert "outcome=completed" in log and "stopping: no more claims" in log


async def enqueue_cli(
    url: str, *args: str, stdin: bytes = b"", token: str = TOKEN
) -> tuple[int, str, str]:
    """`gateway enqueue ARGS`: (exit code, stdout, stderr). Asynchronous, since the gateway
    answering it runs on this test's event loop."""
    env = client_env(url, token)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "enqueue", *args,
        env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), 20)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_enqueue_takes_json_a_file_or_stdin(
    database_url, redis_url, redis_prefix, runtime_id, tmp_path
):
    payload_file = tmp_path / "payload.json"
    payload_file.write_text('{"from": "file"}')
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        code, out, err = await enqueue_cli(
            gw.url, runtime_id, "--payload", '{"n": 18446744073709551616}', "--priority", "70",
            "--delay-seconds", "60", "--idempotency-key", "k",
        )  # fmt: skip
        assert code == 0, err
        task = json.loads(out)
        assert task["payload"] == {"n": 18446744073709551616} and task["priority"] == 70
        assert task["run_at"] > task["created_at"]
        code, out, _ = await enqueue_cli(gw.url, runtime_id, "--payload", f"@{payload_file}")
        assert json.loads(out)["payload"] == {"from": "file"}
        code, out, _ = await enqueue_cli(gw.url, runtime_id, "--payload", "-", stdin=b"[1, 2]")
        assert json.loads(out)["payload"] == [1, 2]
        code, out, err = await enqueue_cli(gw.url, runtime_id, "--payload", "{nope")
        assert code == 2 and "--payload" in err and not out
        code, out, err = await enqueue_cli(gw.url, runtime_id, "--payload", "1", token="bad")
        assert code == 1 and "unauthorized" in err and not out


async def test_enqueue_wait_prints_the_result_and_exits_by_how_the_task_ended(
    database_url, redis_url, redis_prefix, runtime_id
):
    """`gateway enqueue --wait`: 0 and the result when completed, 3 and the task when it
    ended dead, 4 and the task when it had not finished within --wait-seconds."""
    async with (
        running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw,
        AsyncClient(gw.url, TOKEN) as client,
    ):
        waiting = asyncio.create_task(
            enqueue_cli(gw.url, runtime_id, "--payload", '{"q": 1}', "--wait")
        )
        [task] = await client.claim(runtime_id, "w", wait_seconds=15)
        await client.complete(task.id, task.lease_id or "", {"answer": 18446744073709551616})
        code, out, err = await waiting
        assert code == 0, err
        assert json.loads(out) == {"answer": 18446744073709551616}

        waiting = asyncio.create_task(
            enqueue_cli(gw.url, runtime_id, "--payload", "2", "--wait-seconds", "15")
        )
        [task] = await client.claim(runtime_id, "w", wait_seconds=15)
        await client.fail(task.id, task.lease_id or "", "it broke", retry=False)
        code, out, err = await waiting
        assert code == 3, err
        assert json.loads(out)["status"] == "dead"
        assert f"task {task.id} ended dead: it broke" in err

        code, out, err = await enqueue_cli(
            gw.url, runtime_id, "--payload", "3", "--wait-seconds", "0.3"
        )
        assert code == 4, err
        assert json.loads(out)["status"] == "queued" and "had not finished" in err


async def test_enqueue_help_names_the_wait_exit_codes() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "enqueue", "--help",
        env=client_env("http://127.0.0.1:9", TOKEN), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    text = " ".join(out.decode().split())
    assert "--wait-seconds" in text
    assert "0 completed" in text and "3 the task ended dead, expired or cancelled" in text
    assert "4 it had not finished within --wait-seconds" in text
