"""`gateway token ...` and `gateway webhook-secret ...` as an operator runs them: real
processes against a real database (DATABASE_URL only)."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import secrets
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest
from standardwebhooks.webhooks import Webhook

from gateway.api.credential_bodies import MAX_TOKENS_PAGE
from gateway.auth.principals import hash_token

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TOKEN_RE = re.compile(r"^gwt_[A-Za-z0-9_-]{43}$")
CREATED_TOKEN_FIELDS = {"id", "name", "scopes", "runtimes", "token", "created_at"}
LISTED_TOKEN_FIELDS = {"id", "name", "scopes", "runtimes", "created_at", "revoked_at"}


def cli(database_url: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def fetch(database_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(database_url)
        try:
            return await conn.fetch(query, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


def name() -> str:
    return "cli-" + secrets.token_hex(4)


def create_token(database_url: str, *args: str) -> str:
    done = cli(database_url, "token", "create", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_create_prints_the_secret_alone_and_stores_only_its_hash(database_url):
    token_name = name()
    done = cli(database_url, "token", "create", "--name", token_name, "--scopes", "claim,read")
    assert done.returncode == 0, done.stderr
    assert TOKEN_RE.match(done.stdout.rstrip("\n")) and done.stdout.count("\n") == 1
    secret = done.stdout.strip()
    assert token_name in done.stderr and secret not in done.stderr
    [row] = fetch(database_url, "SELECT * FROM api_tokens WHERE name = $1", token_name)
    assert bytes(row["secret_hash"]) == hash_token(secret)
    assert sorted(row["scopes"]) == ["claim", "read"] and row["runtimes"] is None


def test_create_json(database_url):
    token_name = name()
    done = cli(
        database_url, "token", "create", "--name", token_name, "--scopes", "enqueue",
        "--runtime", "ci-*", "--runtime", "build", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = orjson.loads(done.stdout)
    assert set(out) == CREATED_TOKEN_FIELDS
    assert (out["name"], out["scopes"], out["runtimes"]) == (
        token_name,
        ["enqueue"],
        ["ci-*", "build"],
    )
    assert TOKEN_RE.match(out["token"])
    uuid.UUID(out["id"])
    assert datetime.fromisoformat(out["created_at"]) <= datetime.now(UTC)


def test_list_shows_no_secrets_and_hides_revoked_tokens_unless_asked(database_url):
    live, gone = name(), name()
    live_secret = create_token(database_url, "--name", live, "--scopes", "read")
    gone_secret = create_token(database_url, "--name", gone, "--scopes", "read")
    assert cli(database_url, "token", "revoke", gone).returncode == 0
    for args in ([], ["--json"], ["--all"], ["--all", "--json"]):
        done = cli(database_url, "token", "list", *args)
        assert done.returncode == 0, done.stderr
        for text in (done.stdout, done.stderr):
            assert live_secret not in text and gone_secret not in text
            assert "gwt_" not in text
        assert live in done.stdout
        assert (gone in done.stdout) is ("--all" in args)
    listed = orjson.loads(cli(database_url, "token", "list", "--all", "--json").stdout)
    by_name = {t["name"]: t for t in listed["tokens"]}
    assert set(by_name[live]) == LISTED_TOKEN_FIELDS
    assert by_name[live]["revoked_at"] is None and by_name[gone]["revoked_at"] is not None


def test_list_follows_the_pages(database_url):
    """More live tokens than a page (MAX_TOKENS_PAGE): `token list` prints every one once,
    in both forms. They share one created_at, so a page ends inside a tie and the next
    one goes on by id."""
    prefix = name()
    count = MAX_TOKENS_PAGE + 1
    fetch(
        database_url,
        "INSERT INTO api_tokens (name, secret_hash, scopes, created_at)"
        " SELECT $1 || '-' || lpad(i::text, 4, '0'), sha256(convert_to($1 || i, 'UTF8')),"
        " ARRAY['read'], now() FROM generate_series(1, $2) AS i",
        prefix,
        count,
    )
    try:
        mine = [f"{prefix}-{i:04d}" for i in range(1, count + 1)]
        listed = orjson.loads(cli(database_url, "token", "list", "--json").stdout)["tokens"]
        names = [t["name"] for t in listed]
        assert len(names) == len(set(t["id"] for t in listed)) > MAX_TOKENS_PAGE
        assert sorted(n for n in names if n.startswith(prefix)) == mine
        done = cli(database_url, "token", "list")
        assert done.returncode == 0, done.stderr
        printed = re.findall(re.escape(prefix) + r"-\d{4}", done.stdout)
        assert sorted(printed) == mine
    finally:
        fetch(database_url, "DELETE FROM api_tokens WHERE name LIKE $1 || '-%'", prefix)


def test_revoke_by_id_and_by_name(database_url):
    by_id = orjson.loads(
        cli(database_url, "token", "create", "--name", name(), "--scopes", "read", "--json").stdout
    )
    done = cli(database_url, "token", "revoke", by_id["id"])
    assert done.returncode == 0, done.stderr
    assert by_id["name"] in done.stdout
    by_name = name()
    create_token(database_url, "--name", by_name, "--scopes", "read")
    assert cli(database_url, "token", "revoke", by_name).returncode == 0
    rows = fetch(
        database_url,
        "SELECT revoked_at FROM api_tokens WHERE id = $1 OR name = $2",
        uuid.UUID(by_id["id"]),
        by_name,
    )
    assert len(rows) == 2 and all(r["revoked_at"] is not None for r in rows)
    # A revoked name matches nothing any more; nor does an unknown id.
    for ref in (by_name, str(uuid.uuid4()), "never-was"):
        done = cli(database_url, "token", "revoke", ref)
        assert done.returncode == 1, done
        assert "no token" in done.stderr and ref in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--scopes", "read,write"],
        ["--scopes", ","],
        ["--scopes", "read", "--runtime", "bad/pattern"],
        ["--scopes", "admin", "--runtime", "ci-*"],
    ],
    ids=["unknown-scope", "no-scope", "bad-pattern", "admin-with-runtimes"],
)
def test_bad_input_exits_2_and_stores_nothing(database_url, args):
    token_name = name()
    done = cli(database_url, "token", "create", "--name", token_name, *args)
    assert done.returncode == 2, done
    assert done.stdout == "" and done.stderr.startswith("gateway token create: ")
    assert fetch(database_url, "SELECT 1 FROM api_tokens WHERE name = $1", token_name) == []


def test_a_duplicate_name_exits_2_and_stores_nothing(database_url):
    token_name = name()
    create_token(database_url, "--name", token_name, "--scopes", "read")
    done = cli(database_url, "token", "create", "--name", token_name, "--scopes", "claim")
    assert done.returncode == 2 and done.stdout == ""
    assert token_name in done.stderr and "exists" in done.stderr
    rows = fetch(database_url, "SELECT scopes FROM api_tokens WHERE name = $1", token_name)
    assert [list(r["scopes"]) for r in rows] == [["read"]]


def test_without_database_url(database_url):
    done = cli(None, "token", "list")
    assert done.returncode == 2 and "DATABASE_URL" in done.stderr


def test_webhook_secrets(database_url):
    secret_name = name()
    done = cli(database_url, "webhook-secret", "create", "--name", secret_name,
               "--runtime", "hooks-*", "--runtime", "ci")  # fmt: skip
    assert done.returncode == 0, done.stderr
    secret = done.stdout.rstrip("\n")
    assert done.stdout.count("\n") == 1 and secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) >= 24
    assert secret not in done.stderr
    Webhook(secret).sign("msg_1", datetime.now(UTC), "{}")  # the reference library takes it
    [row] = fetch(database_url, "SELECT * FROM webhook_secrets WHERE name = $1", secret_name)
    assert list(row["runtimes"]) == ["hooks-*", "ci"]

    as_json = cli(database_url, "webhook-secret", "create", "--name", name(), "--runtime", "x",
                  "--json")  # fmt: skip
    out = orjson.loads(as_json.stdout)
    assert set(out) == {"id", "name", "runtimes", "secret", "created_at"}

    for args in ([], ["--json"], ["--all"]):
        listed = cli(database_url, "webhook-secret", "list", *args)
        assert listed.returncode == 0 and secret_name in listed.stdout
        assert "whsec_" not in listed.stdout + listed.stderr

    assert cli(database_url, "webhook-secret", "revoke", secret_name).returncode == 0
    assert cli(database_url, "webhook-secret", "revoke", out["id"]).returncode == 0
    assert secret_name not in cli(database_url, "webhook-secret", "list").stdout
    missing = cli(database_url, "webhook-secret", "revoke", secret_name)
    assert missing.returncode == 1 and "no webhook secret" in missing.stderr

    bad = cli(database_url, "webhook-secret", "create", "--name", name(), "--runtime", "a b")
    assert bad.returncode == 2 and bad.stdout == ""
    missing_runtime = cli(database_url, "webhook-secret", "create", "--name", name())
    assert missing_runtime.returncode == 2
