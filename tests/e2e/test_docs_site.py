"""The documentation site in a real browser: `mkdocs build --strict` into a temporary
folder (a broken link fails it), served on loopback by a small thread HTTP server, and
Debian's Chromium, driven by Playwright, opening the getting-started page and the HTTP
API reference that the build generates from the app's OpenAPI document. Each page's
headings must be there, the reference must hold the claim operation, and nothing on
either page may reach beyond the loopback server (no web fonts, no CDN).

`DOCS_SCREENSHOTS=DIR` keeps a screenshot of each page there, for a person to look at.

Chromium missing: the test fails with CI=true, and is skipped otherwise."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.browser import browser_page

pytestmark = [pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as `make docs` builds it, into a folder of this test's own."""
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out


# A script, stylesheet, image or frame fetched from elsewhere (a CDN, web fonts).
REMOTE = re.compile(
    r"<(?:script|img|iframe)[^>]+src=\"(?:https?:)?//|<link[^>]+href=\"(?:https?:)?//"
)


def test_no_page_loads_anything_from_elsewhere(site: Path) -> None:
    # The site must work offline and tell no third party who reads it.
    remote = {}
    for page in sorted(site.rglob("*.html")):
        found = REMOTE.findall(page.read_text())
        if found:
            remote[str(page.relative_to(site))] = found
    assert remote == {}


def test_the_check_sees_a_remote_script() -> None:
    assert REMOTE.search('<script src="https://unpkg.com/mermaid.min.js"></script>')
    assert REMOTE.search('<link rel="stylesheet" href="//fonts.googleapis.com/css">')
    assert not REMOTE.search('<script src="../assets/javascripts/bundle.js"></script>')


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # pytest shows the test's own output; the requests are not part of it


@contextlib.contextmanager
def served(folder: Path) -> Iterator[str]:
    """The folder over HTTP on 127.0.0.1, on a free port, until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


async def texts(page, selector: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The headings' texts, without the permalink sign mkdocs puts after each."""
    return [t.rstrip("¶").strip() for t in await page.locator(selector).all_inner_texts()]


@pytest.mark.timeout(60)  # the build takes ~3 s, the browser ~5
async def test_the_site_builds_and_shows_its_pages(chromium, site: Path) -> None:
    shots = os.environ.get("DOCS_SCREENSHOTS")
    outside: list[str] = []
    problems: list[str] = []
    with served(site) as base:
        async with browser_page() as page:
            page.set_default_timeout(10_000)
            page.on("request", lambda r: None if r.url.startswith(base) else outside.append(r.url))
            page.on("pageerror", lambda e: problems.append(str(e)))

            await page.goto(f"{base}/getting-started/")
            assert await texts(page, "article h1") == ["Getting started"]
            headings = await texts(page, "article h2")
            for expected in (
                "The two commands",
                "A first task, with curl",
                "The same with the Python client",
            ):
                assert any(h.startswith(expected) for h in headings), (expected, headings)
            assert await page.locator("article code", has_text="make run").count() >= 1
            if shots:
                await page.screenshot(path=f"{shots}/getting-started.png", full_page=False)

            await page.goto(f"{base}/reference/api/")
            assert await texts(page, "article h1") == ["HTTP API reference"]
            groups = await texts(page, "article h2")
            assert any(g.startswith("Daemons") for g in groups), groups
            claim = page.locator("article h3", has_text="Claim tasks")
            await claim.first.wait_for()
            # The claim's method and path, its request body and a field of it follow.
            section = page.locator("article p", has_text="POST /v1/runtimes/{rt}/claim")
            assert await section.count() == 1
            assert await page.locator("article td code", has_text="worker_id").count() >= 1
            await claim.first.scroll_into_view_if_needed()
            if shots:
                await page.wait_for_timeout(500)  # the header's title fades as it scrolls
                await page.screenshot(path=f"{shots}/api.png", full_page=False)

            # The search index is built and served with the site.
            await page.goto(f"{base}/search/search_index.json")
            assert "claim" in await page.content()

    assert problems == []
    assert outside == [], "the site reached beyond its own server"
