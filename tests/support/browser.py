"""A real Chromium (Debian's `chromium`, never a downloaded one) driven by Playwright,
and the gateway's API as a given bearer token (`Api`), for the console's browser test
(tests/e2e/test_console_browser.py) and `python -m tests.e2e.console_screenshots`."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

CHROMIUM = os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MISSING = f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)"


def chromium_missing() -> bool:
    return not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK))


@contextlib.asynccontextmanager
async def browser_page(width: int = 1280, height: int = 800) -> AsyncIterator[Any]:
    """A page of a fresh Chromium with a user-data folder of its own, removed after."""
    from playwright.async_api import async_playwright

    profile = tempfile.mkdtemp(prefix="console-chromium-")
    try:
        async with async_playwright() as pw:
            context = await pw.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                args=LAUNCH_ARGS,
                headless=True,
                viewport={"width": width, "height": height},
            )
            try:
                yield context.pages[0] if context.pages else await context.new_page()
            finally:
                await context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class Api:
    """The gateway's API over HTTP, as a given bearer token."""

    def __init__(self, http: aiohttp.ClientSession, base: str, token: str) -> None:
        self.http, self.base, self.token = http, base, token

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None if body is None else orjson.dumps(body)
        if data is not None:
            headers["Content-Type"] = "application/json"
        async with self.http.request(method, self.base + path, data=data, headers=headers) as r:
            raw = await r.read()
            return r.status, orjson.loads(raw) if raw else None

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await self.call(method, path, body)
        assert status in (200, 201), (status, answer)
        return answer

    async def enqueue(self, rt: str, payload: Any, **fields: Any) -> dict[str, Any]:
        body = {"payload": payload, **fields}
        return dict(await self.ok("POST", f"/v1/runtimes/{rt}/tasks", body))

    async def make_token(self, scopes: list[str], runtimes: list[str] | None = None) -> str:
        body: dict[str, Any] = {"name": "console-" + os.urandom(4).hex(), "scopes": scopes}
        if runtimes is not None:
            body["runtimes"] = runtimes
        return str((await self.ok("POST", "/v1/admin/tokens", body))["token"])
