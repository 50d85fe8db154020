"""The peers the gateway is measured against in the same run.

- pgqueuer (PyPI `pgqueuer`), installed into a virtual environment of its own under
  `.gateway/bench-peers/` (git-ignored; created on first use, reused afterwards), never
  into the project's: its dependencies must not change what the gateway runs with.
  `bench/pgq_driver.py` drives it there, in a database of its own.
- the bare Starlette floor (`bench/floor.py`), started like the gateway.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .infra import PROJECT_ROOT, fresh_database, log

PGQUEUER_VERSION = "1.6.0"
PEERS_DIR = PROJECT_ROOT / ".gateway" / "bench-peers"
INSTALL_TIMEOUT_SECONDS = 300.0
DRIVER = PROJECT_ROOT / "bench" / "pgq_driver.py"


@dataclass(frozen=True)
class PgqueuerVenv:
    """Where the peer's environment lives and the command lines that make and use it."""

    root: Path = PEERS_DIR / f"pgqueuer-{PGQUEUER_VERSION}"
    version: str = PGQUEUER_VERSION
    base_python: str = sys.executable

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def stamp(self) -> Path:
        """Written last, so that a half-made environment is made again."""
        return self.root / ".installed"

    def create_commands(self) -> list[list[str]]:
        # The project's interpreter makes the venv, so both run the same Python.
        return [
            [self.base_python, "-m", "venv", str(self.root)],
            [
                str(self.python),
                "-m",
                "pip",
                "install",
                "--quiet",
                f"pgqueuer=={self.version}",
                "asyncpg",
                "uvloop",
            ],
        ]

    def install_schema_command(self) -> list[str]:
        """pgqueuer's own CLI creates its tables; the DSN goes in PGDSN (see env)."""
        return [str(self.python), "-m", "pgqueuer", "install"]

    def driver_command(
        self,
        dsn: str,
        *,
        jobs: int,
        enqueue_jobs: int,
        workers: int,
        batch_size: int,
        enqueue_batch: int,
        latency_samples: int,
        timeout_seconds: float,
    ) -> list[str]:
        return [
            str(self.python),
            str(DRIVER),
            "--dsn",
            dsn,
            "--jobs",
            str(jobs),
            "--enqueue-jobs",
            str(enqueue_jobs),
            "--workers",
            str(workers),
            "--batch-size",
            str(batch_size),
            "--enqueue-batch",
            str(enqueue_batch),
            "--latency-samples",
            str(latency_samples),
            "--timeout-seconds",
            f"{timeout_seconds:g}",
        ]


async def _run(argv: list[str], env: Mapping[str, str] | None, timeout: float) -> str:
    """Run a command by pid with a time bound; its stdout, or RuntimeError with its output."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=PROJECT_ROOT,
        env=dict(env) if env is not None else None,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        tail = "\n".join(err.decode(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{argv[0]} {' '.join(argv[1:3])} exited {proc.returncode}:\n{tail}")
    return out.decode(errors="replace")


async def ensure_pgqueuer(venv: PgqueuerVenv) -> None:
    """Create the peer's environment unless a complete one is there already."""
    if venv.stamp.exists():
        return
    log(f"installing pgqueuer {venv.version} into {venv.root} (first use only)")
    venv.root.parent.mkdir(parents=True, exist_ok=True)
    for argv in venv.create_commands():
        await _run(argv, None, INSTALL_TIMEOUT_SECONDS)
    venv.stamp.write_text(venv.version + "\n")


async def run_pgqueuer(
    admin_url: str,
    *,
    jobs: int,
    enqueue_jobs: int,
    workers: int,
    batch_size: int,
    enqueue_batch: int,
    latency_samples: int,
    timeout_seconds: float,
    venv: PgqueuerVenv | None = None,
) -> dict[str, Any]:
    """pgqueuer's batch enqueue (`enqueue_jobs` jobs), drain (`jobs` jobs) and
    enqueue-to-start latency, in a fresh database on the same server (dropped afterwards)."""
    venv = venv or PgqueuerVenv()
    await ensure_pgqueuer(venv)
    async with fresh_database(admin_url, "bench_pgq_", migrate=False) as dsn:
        env = {**os.environ, "PGDSN": dsn}
        await _run(venv.install_schema_command(), env, 60)
        argv = venv.driver_command(
            dsn,
            jobs=jobs,
            enqueue_jobs=enqueue_jobs,
            workers=workers,
            batch_size=batch_size,
            enqueue_batch=enqueue_batch,
            latency_samples=latency_samples,
            timeout_seconds=timeout_seconds,
        )
        out = await _run(argv, None, 3 * timeout_seconds + 60)
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result
