"""The console's static files at /console: content types, caching, the
Content-Security-Policy, and nothing but its own files."""

from __future__ import annotations

import asyncio
import sys
import zipfile
from pathlib import Path

import pytest

from gateway.cli.main import _banner
from gateway.http import console
from gateway.settings import Settings
from tests.support.http import req
from tests.support.lifecycle import assert_problem

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]

ASSETS = {
    "app.js": "text/javascript",
    "api.js": "text/javascript",
    "dom.js": "text/javascript",
    "json.js": "text/javascript",
    "load.js": "text/javascript",
    "controls.js": "text/javascript",
    "schedules.js": "text/javascript",
    "task.js": "text/javascript",
    "chart.js": "text/javascript",
    "history.js": "text/javascript",
    "failures.js": "text/javascript",
    "console.css": "text/css",
    "icon.svg": "image/svg+xml",
}


# The policy, byte for byte: the console's charts and panels are drawn within it, and a
# change to it is a change to what the console may do.
POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


def assert_locked_down(resp) -> None:
    csp = resp.headers["Content-Security-Policy"]
    assert csp == POLICY
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'"  # no inline script, no eval
    assert directives["style-src"] == "'self'"  # no inline style
    assert directives["frame-ancestors"] == "'none'"
    assert directives["object-src"] == "'none'"
    assert directives["base-uri"] == "'none'"
    assert directives["form-action"] == "'none'"  # a form never sends the token in a URL
    assert "unsafe" not in csp
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["X-Frame-Options"] == "DENY"
    assert resp.headers["Referrer-Policy"] == "no-referrer"
    assert resp.headers["Cache-Control"] == "no-cache"
    assert resp.headers["ETag"]


@pytest.mark.parametrize("path", ["/console", "/console/"])
async def test_the_page(gw, path):
    resp = await req(gw, "GET", path, auth=None)
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
    assert_locked_down(resp)
    page = resp.body
    assert '<script type="module" src="/console/assets/app.js">' in page
    # Nothing inline: the policy would block it, and the page must not need it.
    assert "<script>" not in page and "<style" not in page and "style=" not in page
    assert "://" not in page  # no CDN, no other origin


@pytest.mark.parametrize(("name", "content_type"), sorted(ASSETS.items()))
async def test_assets(gw, name, content_type):
    resp = await req(gw, "GET", f"/console/assets/{name}", auth=None)
    assert resp.status == 200
    assert resp.content_type == content_type
    assert_locked_down(resp)
    again = await req(
        gw,
        "GET",
        f"/console/assets/{name}",
        auth=None,
        headers={"If-None-Match": resp.headers["ETag"]},
    )
    assert again.status == 304 and again.body is None


async def test_every_shipped_file_is_served_and_none_uses_inner_html():
    assert set(console.FILES) == {*ASSETS, "index.html"}
    for name, (body, _, _) in console.FILES.items():
        text = body.decode()
        assert "innerHTML" not in text and "outerHTML" not in text, name
        assert "insertAdjacentHTML" not in text and "document.write" not in text, name
        # The SVG namespace names elements; nothing is fetched from it.
        text = text.replace('"http://www.w3.org/2000/svg"', "")
        assert ("http://" not in text and "https://" not in text) or name == "icon.svg", name
        # The policy forbids inline styles: presentation goes through classes.
        assert ".style" not in text and 'setAttribute("style"' not in text, name


@pytest.mark.parametrize(
    "path",
    [
        "/console/assets/nope.js",
        "/console/assets/index.html",
        "/console/assets/__init__.py",
        "/console/assets/..%2F..%2Fsettings.py",
        "/console/assets/..%2fconsole.py",
        "/console/assets/%2e%2e/%2e%2e/pyproject.toml",
        "/console/assets/../console.py",
        "/console/assets/",
        "/console/assets",
        "/console/app.js",
        "/console//assets/app.js",
    ],
)
async def test_anything_else_is_404(gw, path):
    resp = await req(gw, "GET", path, auth=None)
    assert_problem(resp, 404, "not_found")


async def test_only_get_and_head(gw):
    resp = await req(gw, "POST", "/console", auth=None)
    assert_problem(resp, 405)
    head = await req(gw, "HEAD", "/console/assets/app.js", auth=None)
    assert head.status == 200 and head.content_type == "text/javascript"


@pytest.mark.timeout(120)
async def test_the_wheel_ships_every_console_file(tmp_path):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--wheel-dir", str(tmp_path), str(ROOT),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 100)
    assert proc.returncode == 0, err.decode()
    (wheel,) = tmp_path.glob("claim_gateway-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {f"gateway/http/console_static/{name}" for name in console.FILES} <= names


async def test_the_serve_banner_links_the_console(tmp_path):
    settings = Settings(admin_token="x" * 40)
    dev = _banner("127.0.0.1", 8080, settings, tmp_path / "dev-token", None, "dev-tok_en")
    assert "  console:   http://127.0.0.1:8080/console#token=dev-tok_en" in dev.splitlines()
    # Without the development token, only the address: the admin token is never printed.
    plain = _banner("127.0.0.1", 8080, settings, None)
    assert "  console:   http://127.0.0.1:8080/console" in plain.splitlines()
    assert "x" * 40 not in plain
