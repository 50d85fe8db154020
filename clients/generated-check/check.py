"""`make clients-check`: the clients that two generators make from the gateway's OpenAPI
document, type-checked and run against a real gateway, so that a document generators
misread fails here rather than in a user's build.

1. The document is built in-process, as a gateway with default settings serves it.
2. openapi-python-client generates a Python client; flow.py, which uses it, passes
   `mypy --strict`.
3. openapi-typescript generates TypeScript types; flow.ts, which calls them through
   openapi-fetch, passes `tsc --strict` (the packages are pinned in package-lock.json
   and installed with `npm ci`).
4. A gateway (`gateway serve`) starts on a fresh database (the servers of
   TEST_DATABASE_URL and TEST_REDIS_URL, else embedded ones), and each flow enqueues,
   claims, completes and reads tasks through it. The gateway is stopped, and its
   database and Redis keys removed, afterwards.

Run from the repository's root: `PYTHONPATH=. python clients/generated-check/check.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from bench.infra import (
    GatewayProcess,
    check_servers,
    delete_redis_keys,
    fresh_database,
    resolve_servers,
)
from gateway.http import openapi
from gateway.http.routes import ENDPOINTS
from gateway.settings import Settings

HERE = Path(__file__).resolve().parent
BIN = HERE / "node_modules" / ".bin"
STEP_TIMEOUT_SECONDS = 300


def say(message: str) -> None:
    print(f"clients-check: {message}", flush=True)


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Runs a command; its output is shown only when it fails, which stops the check."""
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_SECONDS,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"clients-check: `{' '.join(map(str, args))}` failed ({done.returncode}):\n"
            f"{done.stdout}{done.stderr}"
        )
    return done.stdout


def write_document(path: Path) -> None:
    settings = Settings(database_url="postgresql://", redis_url="redis://", auth_enabled=False)
    path.write_bytes(orjson.dumps(openapi.build(ENDPOINTS, settings), option=orjson.OPT_INDENT_2))


def python_client(document: Path, work: Path) -> None:
    """Generates the Python client into `work` and type-checks flow.py against it."""
    work.mkdir()
    generator = Path(sys.executable).parent / "openapi-python-client"
    run(
        *(generator, "generate", "--path", document, "--meta", "none"),
        *("--output-path", work / "claim_gateway_client"),
        *("--config", HERE / "openapi-python-client.yaml", "--fail-on-warning"),
        cwd=work,
    )
    shutil.copy(HERE / "flow.py", work)
    # Run where no project configuration is found: --strict alone decides, and the
    # generated package is checked as strictly as the script.
    run(
        sys.executable, "-m", "mypy", "--strict", "--cache-dir", work / ".mypy", "flow.py", cwd=work
    )


def typescript_client(document: Path, work: Path) -> None:
    """Generates the TypeScript types into `work` and compiles flow.ts against them."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(
            f"clients-check: {' and '.join(missing)} not found on PATH; the TypeScript "
            "client needs Node.js 20 or later with npm"
        )
    run("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", cwd=HERE)
    work.mkdir()
    for name in ("flow.ts", "tsconfig.json", "package.json"):
        shutil.copy(HERE / name, work)
    (work / "node_modules").symlink_to(HERE / "node_modules")
    run(BIN / "openapi-typescript", document, "--output", work / "schema.d.ts", cwd=work)
    run(BIN / "tsc", "--strict", "--project", work, cwd=work)


async def run_flows(python_dir: Path, typescript_dir: Path, log_path: Path) -> None:
    """Both flows against one gateway on a fresh database, removed afterwards."""
    servers = resolve_servers(None, None)
    try:
        await check_servers(servers)
        async with fresh_database(servers.database_url, "clients_") as database_url:
            gateway = GatewayProcess(database_url, servers.redis_url, True, log_path)
            try:
                await gateway.start()
                say(f"a gateway serves at {gateway.url}")
                flows = [
                    (python_dir, (sys.executable, "flow.py"), {"PYTHONPATH": str(python_dir)}),
                    (typescript_dir, ("node", "build/flow.js"), None),
                ]
                for cwd, command, env in flows:
                    out = await asyncio.to_thread(
                        run, *command, gateway.url, gateway.token, cwd=cwd, env=env
                    )
                    say(out.strip())
            except BaseException:
                say(f"the gateway's log:\n{gateway.log_tail()}")
                raise
            finally:
                await gateway.stop()
                await delete_redis_keys(servers.redis_url, gateway.prefix)
    finally:
        servers.close()


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    began = time.monotonic()
    yield
    say(f"{what} ({time.monotonic() - began:.1f} s)")


def main() -> None:
    with step("done"), tempfile.TemporaryDirectory(prefix="clients-check-") as tmp:
        work = Path(tmp)
        document = work / "openapi.json"
        with step("wrote the document"):
            write_document(document)
        with step("generated and type-checked the Python client"):
            python_client(document, work / "python")
        with step("generated and compiled the TypeScript client"):
            typescript_client(document, work / "typescript")
        with step("ran both clients against a gateway"):
            asyncio.run(run_flows(work / "python", work / "typescript", work / "gateway.log"))


if __name__ == "__main__":
    main()
