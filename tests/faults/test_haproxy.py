"""The HAProxy the failover rows run: its configuration is the one the failover guide
shows (only the addresses and the harness's admin socket differ), HAProxy accepts it,
the harness reads HAProxy's servers and log as HAProxy writes them, and a machine
without haproxy skips the rows through it (fails them under CI=true)."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import pytest

from tests.faults import matrix, patroni
from tests.faults.failovers import sessions_ended
from tests.faults.faults import FAULTS
from tests.faults.haproxy import HAProxy, config, haproxy_binary, parse_stat, routes
from tests.faults.patroni import Node
from tests.support.ci import unavailable

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "failover.md"
# `show stat` as HAProxy 2.6 answered it during a row, cut after the status column.
SHOW_STAT = (
    "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,"
    "wretr,wredis,status,weight\n"
    "postgres_primary,FRONTEND,,,21,22,9984,33,48127,16418,0,0,0,,,,,OPEN,\n"
    "postgres_primary,node0,0,0,21,22,,33,48127,16418,,0,,0,0,0,0,UP,1\n"
    "postgres_primary,node1,0,0,0,0,,0,0,0,,0,,0,0,0,0,DOWN,1\n"
    "postgres_primary,BACKEND,0,0,21,22,999,33,48127,16418,0,0,,0,0,0,0,UP,1\n"
)


def _nodes(tmp_path: Path) -> list[Node]:
    return [
        Node("node0", tmp_path, pg_port=15432, api_port=18008),
        Node("node1", tmp_path, pg_port=25432, api_port=28008),
    ]


def _shape(text: str) -> list[str]:
    """A configuration's lines without its addresses and ports, and without the global
    section (the harness's admin socket)."""
    text = re.sub(r"(?ms)^global\n.*?\n\n", "", text)
    text = re.sub(r"bind \S+", "bind ADDRESS", text)
    text = re.sub(r"server \S+ \S+ check port \d+", "server NODE ADDRESS check port API", text)
    return [line.rstrip() for line in text.strip().splitlines()]


def _guide_snippet() -> str:
    blocks = re.findall(r"```\n(.*?)```", GUIDE.read_text(), re.S)
    found = [b for b in blocks if "listen postgres_primary" in b]
    assert len(found) == 1, "the failover guide shows one HAProxy configuration"
    return found[0]


def test_the_harness_runs_the_configuration_the_guide_shows(tmp_path: Path) -> None:
    ours = config(_nodes(tmp_path), 5000, tmp_path / "admin.sock")
    assert _shape(ours) == _shape(_guide_snippet())
    # Each node is reached on its Postgres port and checked on its Patroni API port.
    assert "    server node0 127.0.0.1:15432 check port 18008" in ours.splitlines()
    assert "    server node1 127.0.0.1:25432 check port 28008" in ours.splitlines()
    assert "    bind 127.0.0.1:5000" in ours.splitlines()


def test_haproxy_accepts_the_configuration(tmp_path: Path) -> None:
    binary = haproxy_binary()
    if binary is None:
        unavailable("haproxy is not installed", "apt-get install haproxy")
    path = tmp_path / "haproxy.cfg"
    path.write_text(config(_nodes(tmp_path), 5000, tmp_path / "admin.sock"))
    checked = subprocess.run(
        [binary, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # A warning would mean HAProxy reads it otherwise than written (a missing timeout).
    assert "WARNING" not in checked.stdout + checked.stderr


def test_show_stat_gives_each_server_its_status() -> None:
    assert parse_stat(SHOW_STAT) == {"node0": "UP", "node1": "DOWN"}


def test_show_stat_refuses_an_answer_that_is_not_its_table() -> None:
    try:
        parse_stat("Unknown command: 'show stat'\n")
    except ValueError:
        return
    raise AssertionError("an error message was read as a table")


def test_a_server_going_down_still_takes_connections_one_rising_does_not() -> None:
    # HAProxy counts every server up when it starts: a replica takes connections
    # until FALL checks failed, which is why the harness waits for the leader alone.
    servers = {"node0": "UP", "node1": "UP 1/2", "node2": "DOWN 1/2", "node3": "MAINT"}
    assert routes(servers) == ["node0", "node1"]


def test_the_sessions_a_server_had_when_marked_down_are_read_from_the_log(
    tmp_path: Path,
) -> None:
    balancer = HAProxy(_nodes(tmp_path), tmp_path)
    before = (
        "[WARNING]  (1) : Server postgres_primary/node1 is DOWN, reason: Layer7 wrong "
        'status, code: 503, info: "Service Unavailable", check duration: 6ms. 1 active '
        "and 0 backup servers left. 3 sessions active, 0 requeued, 0 remaining in queue.\n"
    )
    line = before.replace("node1", "node0").replace("3 sessions", "17 sessions")
    balancer.log_path.write_text(before + line)
    start = len(before)
    assert sessions_ended(balancer, "node0", start) == "ending the 17 sessions it had"
    # A line before the fault is not the fault's.
    assert sessions_ended(balancer, "node1", start) == "its log names no sessions"


HAPROXY_ROW = "Patroni switchover through HAProxy (synchronous)"


def test_a_missing_haproxy_skips_the_rows_through_it_and_only_those(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(matrix, "haproxy_binary", lambda: None)
    monkeypatch.setattr(patroni, "missing", lambda: "")
    assert matrix.missing(FAULTS[HAPROXY_ROW]) == "haproxy"
    assert matrix.missing(FAULTS["Patroni switchover (synchronous)"]) == ""
    monkeypatch.setattr(matrix, "IN_CI", False)
    [skipped] = asyncio.run(matrix.run_matrix([HAPROXY_ROW], None))
    assert skipped.skipped == "haproxy not installed" and skipped.clean


def test_a_missing_haproxy_fails_the_rows_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "haproxy_binary", lambda: None)
    monkeypatch.setattr(patroni, "missing", lambda: "")
    monkeypatch.setattr(matrix, "IN_CI", True)
    [failed] = asyncio.run(matrix.run_matrix([HAPROXY_ROW], None))
    assert not failed.clean
    assert failed.unproven == "haproxy not installed, and CI=true forbids skipping"
