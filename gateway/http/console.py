"""The web console at /console: static files from the package, nothing else.

The console is a few plain ES modules that call the public API with the user's bearer
token; it needs no server-side state. Every file is read from the package once, at
import, and answered from memory, so a name that is not one of them is a 404 and no
path ever reaches the file system. Each answer carries a strict Content-Security-Policy
(scripts and styles from this origin only, no inline code, no framing) and
`Cache-Control: no-cache` with an ETag: the assets are not fingerprinted, so a browser
revalidates them (a 304 costs no body) and an upgraded gateway is seen at once.
"""

from __future__ import annotations

import hashlib
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import NotFound
from .io import problem_response

PACKAGE = "gateway.http.console_static"
INDEX = "index.html"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        # The forms are handled by script; should one ever submit natively, the token
        # field must not travel in a URL.
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # The console's links carry runtime and task ids; no other site needs them.
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",
}


def _load() -> dict[str, tuple[bytes, str, str]]:
    """Every file of the console by name: (body, content type, ETag)."""
    files = {}
    for entry in resources.files(PACKAGE).iterdir():
        suffix = entry.name[entry.name.rfind(".") :]
        if entry.is_file() and suffix in CONTENT_TYPES:
            body = entry.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
            files[entry.name] = (body, CONTENT_TYPES[suffix], etag)
    return files


FILES = _load()


def _answer(request: Request, name: str) -> Response:
    body, content_type, etag = FILES[name]
    headers = {**SECURITY_HEADERS, "ETag": etag}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(body, headers=headers, media_type=content_type)


async def index(request: Request) -> Response:
    """The console's page, at /console and /console/ alike."""
    return _answer(request, INDEX)


async def asset(request: Request) -> Response:
    """One of the console's scripts, styles or images; any other name is 404."""
    name = request.path_params["name"]
    if name == INDEX or name not in FILES:
        return problem_response(NotFound(f"the console has no file named {name!r}"))
    return _answer(request, name)


ROUTES = [
    Route("/console", index, methods=["GET", "HEAD"]),
    Route("/console/", index, methods=["GET", "HEAD"]),
    Route("/console/assets/{name}", asset, methods=["GET", "HEAD"]),
]
