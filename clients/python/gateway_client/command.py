"""A task as a command (`gateway work RUNTIME -- CMD ARGS...`): each task runs CMD in a
process group of its own, with the payload as JSON on stdin and GATEWAY_TASK_ID,
GATEWAY_TASK_ATTEMPT and GATEWAY_RUNTIME in its environment (GATEWAY_TOKEN is not
passed on). Its trace context, if it has one, is in TRACEPARENT and TRACESTATE, so that
a traced command continues the task's trace: its consumer span's context when the worker
loop records one (tracing/spans.py), which makes the command's spans that span's children, else
the task's stored context. Without either it runs without them, even when the worker's
own environment has them.

Exit 0 completes the task with stdout: its JSON value if it parses, else
`{"stdout": "..."}`, cut to fit `max_result_bytes`. Another exit fails it with the exit
code and the last 4 KiB of stderr. A cancelled handler (cancel requested, lease lost,
shutdown) terminates the process group: SIGTERM, then SIGKILL after `term_grace_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from .failure import TaskFailed
from .models import Task
from .tracing.propagation import command_environment, task_context

STDERR_TAIL_BYTES = 4096
# Of stderr's last line, as the first line of a failed task's error.
LAST_LINE_CHARS = 500
# The gateway's default GATEWAY_MAX_PAYLOAD_BYTES, which bounds a result too.
MAX_RESULT_BYTES = 1024 * 1024
TERM_GRACE_SECONDS = 5.0
# Once the command has exited, children it left behind may hold its pipes open.
PIPES_AFTER_EXIT_SECONDS = 2.0
READ_CHUNK_BYTES = 65536
# Not for the command: it acts on its task through stdin, stdout and its exit code.
WITHHELD_ENV = ("GATEWAY_TOKEN",)


class CommandHandler:
    """The worker loop's handler that runs `argv` once per task."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        max_result_bytes: int = MAX_RESULT_BYTES,
        term_grace_seconds: float = TERM_GRACE_SECONDS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not argv:
            raise ValueError("a command is needed")
        self.argv = list(argv)
        self.max_result_bytes = max_result_bytes
        self.term_grace_seconds = term_grace_seconds
        self.env = dict(os.environ if env is None else env)
        for name in WITHHELD_ENV:
            self.env.pop(name, None)

    async def __call__(self, task: Task) -> Any:
        env = {
            **self.env,
            "GATEWAY_TASK_ID": task.id,
            "GATEWAY_TASK_ATTEMPT": str(task.attempts),
            "GATEWAY_RUNTIME": task.runtime_id,
        }
        command_environment(env, task_context(task))
        spawning = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,  # its own process group, so that we can end all of it
            )
        )
        try:
            proc = await asyncio.shield(spawning)
        except asyncio.CancelledError:
            # Cancelled while the process was being set up (it may be running already):
            # asyncio would kill the leader alone and wait for every pipe to close, that
            # is for whatever it started meanwhile to end. Its group is ended instead.
            proc = await spawning
            await self._terminate(proc)
            raise
        try:
            stdout, overflow, stderr = await self._exchange(proc, json.dumps(task.payload).encode())
        except BaseException:
            await self._terminate(proc)
            raise
        code = proc.returncode
        if code != 0:
            raise TaskFailed(_failure_text(code, stderr.decode("utf-8", "replace")))
        return self._result(stdout, overflow)

    async def _exchange(
        self, proc: asyncio.subprocess.Process, stdin: bytes
    ) -> tuple[bytes, bool, bytes]:
        """Feeds stdin, reads both pipes (bounded) and waits for the exit: (stdout,
        whether stdout passed the limit, the tail of stderr)."""
        assert proc.stdin and proc.stdout and proc.stderr
        writer = asyncio.create_task(_feed(proc.stdin, stdin))
        out = asyncio.create_task(_head(proc.stdout, self.max_result_bytes + 1))
        err = asyncio.create_task(_tail(proc.stderr, STDERR_TAIL_BYTES))
        try:
            await proc.wait()
            _, pending = await asyncio.wait({out, err}, timeout=PIPES_AFTER_EXIT_SECONDS)
            if pending:
                _kill_group(proc, signal.SIGKILL)
            stdout, stderr = await out, await err
        finally:
            for job in (writer, out, err):
                job.cancel()
        return stdout[: self.max_result_bytes], len(stdout) > self.max_result_bytes, stderr

    async def _terminate(self, proc: asyncio.subprocess.Process) -> None:
        """SIGTERM to the group, SIGKILL after the grace (also if this wait is cut short)."""
        _kill_group(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.term_grace_seconds)
        except TimeoutError:
            pass
        finally:
            _kill_group(proc, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), self.term_grace_seconds)

    def _result(self, stdout: bytes, overflow: bool) -> Any:
        if not overflow:
            try:
                return json.loads(stdout)
            except ValueError:
                pass
        text = stdout.decode("utf-8", "replace")
        result: dict[str, Any] = {"stdout": text}
        if overflow:
            result["truncated"] = True
        # Escapes can make the JSON longer than the text: cut until it fits.
        while len(json.dumps(result).encode()) > self.max_result_bytes and text:
            text = text[: len(text) // 2]
            result = {"stdout": text, "truncated": True}
        return result


def _kill_group(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    # The group id is the command's pid (start_new_session); it outlives the leader.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _failure_text(code: int | None, stderr_tail: str) -> str:
    """The error a failed command leaves on its task: a first line that says what went
    wrong, its stderr's last line (where a traceback or a shell says it) with the exit,
    then the tail of stderr. The console groups failures by that first line, so that
    `exit code 1` alone does not stand for every failure of every command."""
    lines = (line.strip() for line in reversed(stderr_tail.splitlines()))
    last = next((line for line in lines if line), "")
    exit_text = _exit_text(code)
    head = f"{last[:LAST_LINE_CHARS]} ({exit_text})" if last else exit_text
    return head + "\n" + stderr_tail


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exit code {code}"


async def _feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    # A command that does not read its stdin closes the pipe: that is not an error.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stream.write(data)
        await stream.drain()
        stream.close()
        await stream.wait_closed()


async def _head(stream: asyncio.StreamReader, limit: int) -> bytes:
    """The first `limit` bytes; the rest is read and dropped so the command never blocks."""
    kept = bytearray()
    while chunk := await stream.read(READ_CHUNK_BYTES):
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept)


async def _tail(stream: asyncio.StreamReader, limit: int) -> bytes:
    """The last `limit` bytes."""
    kept = bytearray()
    while chunk := await stream.read(READ_CHUNK_BYTES):
        kept += chunk
        del kept[:-limit]
    return bytes(kept)
