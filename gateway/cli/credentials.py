"""The `gateway token` and `gateway webhook-secret` commands (options in main.py).

Each connects to DATABASE_URL alone, does one thing through gateway.auth.credentials and
exits. Bad input is refused before connecting, so it never stores anything.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from ..api import credential_bodies
from ..auth import credentials as c
from ..errors import AlreadyExists, GatewayError, ValidationFailed
from ..metrics import Metrics
from ..store import Store
from ..store.base import Row


def _credentials(prog: str, command: Callable[[c.Credentials], Awaitable[int]]) -> int:
    """Run `command` against DATABASE_URL. Exit codes: 0 done; 1 nothing matched or the
    database failed; 2 bad input (nothing stored) or DATABASE_URL unset."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        print(f"{prog}: DATABASE_URL is not set", file=sys.stderr)
        return 2

    async def go() -> int:
        store = Store(url, Metrics(), min_size=1, max_size=1)
        await store.open()
        try:
            return await command(c.Credentials(store))
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except GatewayError as exc:
        print(f"{prog}: {exc.detail}", file=sys.stderr)
        return 2 if isinstance(exc, ValidationFailed | AlreadyExists) else 1


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "*" if key == "runtimes" else "-"  # no runtime patterns: every runtime
    return ",".join(value) if isinstance(value, list) else str(value)


def _show(objects: list[dict[str, Any]], key: str, as_json: bool) -> None:
    """A listing as {key: [...]} JSON, or as a table with a column per field."""
    if as_json:
        print(orjson.dumps({key: objects}, option=orjson.OPT_INDENT_2).decode())
        return
    header = [k.upper() for k in objects[0]] if objects else ["(none)"]
    rows = [header] + [[_cell(k, v) for k, v in o.items()] for o in objects]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _created(kind: str, out: dict[str, Any], secret_key: str, as_json: bool) -> None:
    """The secret alone on stdout (or the whole object as JSON); the note on stderr."""
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() if as_json else out[secret_key])
    print(
        f"created {kind} {out['name']!r} (id {out['id']}) for runtimes "
        f"{_cell('runtimes', out['runtimes'])}. The secret is shown this once: keep it now.",
        file=sys.stderr,
    )


async def _every_token(creds: c.Credentials, include_revoked: bool) -> list[Row]:
    """Every token, oldest first, read a page (MAX_TOKENS_PAGE) at a time, each page
    starting after the last one's (created_at, id), as the API's next_cursor does."""
    rows: list[Row] = []
    after = None
    while True:
        page = await creds.list_tokens(include_revoked, credential_bodies.MAX_TOKENS_PAGE, after)
        rows += page
        if len(page) < credential_bodies.MAX_TOKENS_PAGE:
            return rows
        after = (page[-1]["created_at"], page[-1]["id"])


def cmd_token(args: argparse.Namespace) -> int:
    prog = f"gateway token {args.action}"
    if args.action == "create":
        scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
        body = {"name": args.name, "scopes": scopes, "runtimes": args.runtime}
        try:  # before connecting: bad input never reaches the database
            spec = c.parse_token_spec(body)
        except ValidationFailed as exc:
            print(f"{prog}: {exc.detail}", file=sys.stderr)
            return 2

    async def go(creds: c.Credentials) -> int:
        if args.action == "create":
            row, secret = await creds.create_token(spec)
            _created("token", c.token_json(row, secret), "token", args.json)
        elif args.action == "list":
            rows = await _every_token(creds, args.all)
            _show([c.token_json(r) for r in rows], "tokens", args.json)
        else:
            row = await creds.revoke_token(c.parse_ref(args.ref))
            print(f"revoked token {row['name']!r} (id {row['id']})")
        return 0

    return _credentials(prog, go)


def cmd_webhook_secret(args: argparse.Namespace) -> int:
    prog = f"gateway webhook-secret {args.action}"
    if args.action == "create":
        try:
            spec = c.parse_webhook_secret_spec({"name": args.name, "runtimes": args.runtime})
        except ValidationFailed as exc:
            print(f"{prog}: {exc.detail}", file=sys.stderr)
            return 2

    async def go(creds: c.Credentials) -> int:
        if args.action == "create":
            row, secret = await creds.create_webhook_secret(spec)
            _created("webhook secret", c.webhook_secret_json(row, secret), "secret", args.json)
        elif args.action == "list":
            rows = await creds.list_webhook_secrets(args.all)
            _show([c.webhook_secret_json(r) for r in rows], "webhook_secrets", args.json)
        else:
            row = await creds.revoke_webhook_secret(c.parse_ref(args.ref))
            print(f"revoked webhook secret {row['name']!r} (id {row['id']})")
        return 0

    return _credentials(prog, go)
