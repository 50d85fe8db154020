"""tests.support.pgbouncer: which server the test PgBouncer is sent to, and as whom it runs."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import pytest

from tests.support.pgbouncer import PgBouncer, databases_entry, run_as, server_of

EMBEDDED = "postgresql://postgres@/gwtest_ab12?host=/tmp/gateway-test-XyZ/postgres"


@pytest.mark.parametrize(
    ("url", "server"),
    [
        ("postgresql://postgres@127.0.0.1:5432/test", ("127.0.0.1", 5432)),
        ("postgresql://u:p@db.example:6000/test", ("db.example", 6000)),
        ("postgresql://u@[::1]:6001/test", ("::1", 6001)),
        ("postgresql://postgres@localhost/test", ("localhost", 5432)),
        # The embedded server's URL: the socket directory, case kept, as a query parameter.
        (EMBEDDED, ("/tmp/gateway-test-XyZ/postgres", 5432)),
        ("postgresql://postgres@/db?host=/run/Pg&port=5433", ("/run/Pg", 5433)),
        ("postgresql://postgres@%2Frun%2FPg:5434/db", ("/run/Pg", 5434)),
        # asyncpg reads the authority's host first, and then ignores these.
        ("postgresql://h:5435/db?host=/run/pg&port=1", ("h", 5435)),
        ("postgresql:///db", ("127.0.0.1", 5432)),
    ],
)
def test_the_server_a_url_names(url: str, server: tuple[str, int]) -> None:
    assert server_of(url) == server


def test_the_databases_entry_quotes_the_host() -> None:
    assert databases_entry("postgresql://p@127.0.0.1:5432/t") == "host='127.0.0.1' port=5432"
    assert databases_entry(EMBEDDED) == "host='/tmp/gateway-test-XyZ/postgres' port=5432"
    weird = "postgresql://p@/t?host=/tmp/a%20b'c&port=7"
    assert databases_entry(weird) == "host='/tmp/a b''c' port=7"


def test_the_url_through_the_pooler_names_only_the_pooler() -> None:
    bouncer = PgBouncer("pgbouncer", EMBEDDED)
    try:
        through = bouncer.url(EMBEDDED.replace("gwtest_ab12", "other") + "&sslmode=disable")
        assert through == f"postgresql://postgres@127.0.0.1:{bouncer.port}/other?sslmode=disable"
        assert bouncer.url("postgresql://u:p@10.0.0.1:5432/d") == (
            f"postgresql://u:p@127.0.0.1:{bouncer.port}/d"
        )
    finally:
        bouncer.stop()


def test_it_runs_as_the_owner_of_the_socket_directory(tmp_path: Path) -> None:
    """Root starts it as the user who owns the server's socket directory (who can reach
    the socket), and as postgres for a TCP server or a root-owned directory."""
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(sockets, "nobody")
        owner = "nobody"
    else:
        owner = pwd.getpwuid(os.geteuid()).pw_name
    assert run_as(f"postgresql://postgres@/db?host={sockets}") == owner
    assert run_as("postgresql://postgres@127.0.0.1:5432/db") == "postgres"
    assert run_as("postgresql://postgres@/db?host=/") == "postgres"
    assert run_as(f"postgresql://postgres@/db?host={tmp_path}/missing") == "postgres"
