"""The command runner alone: what becomes the result or the error, what its environment
holds (the task's trace context, and never the worker's), and how a cancelled command's
whole process group is ended."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gateway_client import Task, TaskFailed, TraceContext
from gateway_client.command import CommandHandler
from tests.support.fake_gateway import make_task


def task(payload: object = None) -> Task:
    return make_task(payload)


async def test_stdout_json_is_the_result_and_the_payload_arrives_on_stdin():
    run = CommandHandler(
        ["python3", "-c", "import sys, json; print(json.dumps(json.load(sys.stdin)))"]
    )
    assert await run(task({"a": [1, 2.5, None]})) == {"a": [1, 2.5, None]}


async def test_other_stdout_is_wrapped_and_bounded():
    assert await CommandHandler(["sh", "-c", "echo hi"])(task()) == {"stdout": "hi\n"}
    big = await CommandHandler(["sh", "-c", "yes 'é' | head -c 100000"], max_result_bytes=1000)(
        task()
    )
    assert big["truncated"] is True and len(json.dumps(big).encode()) <= 1000
    assert big["stdout"].startswith("é\né\n")


async def test_environment_names_the_task_and_withholds_the_token():
    env = {**os.environ, "GATEWAY_TOKEN": "secret"}
    script = 'echo "$GATEWAY_TASK_ID $GATEWAY_TASK_ATTEMPT $GATEWAY_RUNTIME ${GATEWAY_TOKEN:-none}"'
    t = task()
    out = await CommandHandler(["sh", "-c", script], env=env)(t)
    assert out == {"stdout": f"{t.id} 0 rt none\n"}


# The worker's own context, as a traced process that started it would leave it.
WORKER_TRACE = {
    "TRACEPARENT": "00-11111111111111111111111111111111-2222222222222222-01",
    "TRACESTATE": "worker=1",
}
PRINT_TRACE = 'echo "${TRACEPARENT:-none} ${TRACESTATE:-none}"'


async def test_a_traced_task_s_context_is_in_its_command_s_environment():
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    run = CommandHandler(["sh", "-c", PRINT_TRACE], env={**os.environ, **WORKER_TRACE})
    traced = replace(task(), trace=TraceContext(parent, "congo=t61rcWkgMzE"))
    assert await run(traced) == {"stdout": f"{parent} congo=t61rcWkgMzE\n"}
    # Its own tracestate or none: never the worker's beside the task's traceparent.
    assert await run(replace(task(), trace=TraceContext(parent))) == {"stdout": f"{parent} none\n"}


async def test_a_task_without_a_trace_does_not_inherit_the_worker_s():
    run = CommandHandler(["sh", "-c", PRINT_TRACE], env={**os.environ, **WORKER_TRACE})
    assert await run(task()) == {"stdout": "none none\n"}


async def test_a_failing_command_fails_with_its_last_words_exit_code_and_stderr_tail():
    script = (
        "head -c 10000 /dev/zero | tr '\\0' x >&2; echo >&2; echo 'OSError: disk full' >&2; exit 4"
    )
    with pytest.raises(TaskFailed) as failed:
        await CommandHandler(["sh", "-c", script])(task())
    error = failed.value.error
    head = "OSError: disk full (exit code 4)\n"
    assert error.startswith(head) and error.endswith("OSError: disk full\n")
    assert len(error) == len(head) + 4096


async def test_a_command_failing_in_silence_fails_with_its_exit_code():
    with pytest.raises(TaskFailed) as failed:
        await CommandHandler(["sh", "-c", "echo '  ' >&2; exit 3"])(task())
    assert failed.value.error == "exit code 3\n  \n"


async def test_a_cancelled_command_s_group_is_terminated(tmp_path: Path):
    pids = tmp_path / "pids"
    # A child of the command, in the same group, must go too.
    script = f"sleep 30 & echo $! > {pids}; echo $$ >> {pids}; wait"
    job = asyncio.create_task(CommandHandler(["sh", "-c", script])(task()))
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        await asyncio.sleep(0.02)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    for pid in map(int, pids.read_text().split()):
        await _gone(pid)


async def test_a_command_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path):
    ready = tmp_path / "ready"
    script = f"trap '' TERM; touch {ready}; sleep 30 & wait; sleep 30"
    handler = CommandHandler(["sh", "-c", script], term_grace_seconds=0.5)
    job = asyncio.create_task(handler(task()))
    while not ready.exists():
        await asyncio.sleep(0.02)
    begun = time.monotonic()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert 0.4 < time.monotonic() - begun < 3


async def _gone(pid: int, within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        # An orphaned child is reaped by init a moment after it dies.
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        await asyncio.sleep(0.02)


async def test_a_command_cancelled_while_it_is_set_up_has_its_group_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A cancel that comes while asyncio still sets the process up (it may be running
    already; on a busy machine this takes a while) ends its whole group at once. Left to
    asyncio, only the leader was killed, and the cancel waited until every process of
    the group had closed its pipes: here the 30 s of a sleep in the background."""
    pids = tmp_path / "pids"
    script = f"trap '' TERM; sleep 30 & echo $! > {pids}; echo $$ >> {pids}; wait"
    spawned = asyncio.Event()
    real = asyncio.create_subprocess_exec

    async def slow_setup(*args: object, **kwargs: object) -> asyncio.subprocess.Process:
        proc = await real(*args, **kwargs)  # type: ignore[arg-type]
        spawned.set()
        await asyncio.sleep(0.3)  # the set-up a cancel interrupts
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", slow_setup)
    job = asyncio.create_task(CommandHandler(["sh", "-c", script], term_grace_seconds=0.5)(task()))
    await spawned.wait()
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        await asyncio.sleep(0.02)
    begun = time.monotonic()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert time.monotonic() - begun < 3
    for pid in map(int, pids.read_text().split()):
        await _gone(pid)
