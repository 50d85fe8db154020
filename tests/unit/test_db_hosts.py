"""The hosts of a Postgres URL as gateway/store/hosts.py walks them: in the URL's
order and with the ports the driver would give them; the host that took the last
connection first."""

from __future__ import annotations

import pytest

from gateway.store.hosts import Host, Hosts, NoHostAccepted, hosts


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:p@10.0.0.1:5432/db", [Host("10.0.0.1", 5432)]),
        ("postgresql://u@db.internal/db", [Host("db.internal", 5432)]),
        (
            "postgresql://u:p@10.0.0.1:5433,10.0.0.2/db?target_session_attrs=read-write",
            [Host("10.0.0.1", 5433), Host("10.0.0.2", 5432)],
        ),
        ("postgres://u@[::1]:6000,[fe80::1]/db", [Host("::1", 6000), Host("fe80::1", 5432)]),
        ("postgresql://u@%2Fvar%2Frun%2Fpostgresql/db", [Host("/var/run/postgresql", 5432)]),
        ("postgresql:///db?host=a,b&port=6001,6002", [Host("a", 6001), Host("b", 6002)]),
        ("postgresql:///db?host=a,b&port=6001", [Host("a", 6001), Host("b", 6001)]),
        ("postgresql:///db", []),
    ],
)
def test_hosts_in_the_urls_order_with_their_ports(url: str, expected: list[Host]) -> None:
    assert hosts(url) == expected


def test_a_host_without_a_port_takes_pgport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPORT", "6432")
    assert hosts("postgresql://u@a,b:5433/db") == [Host("a", 6432), Host("b", 5433)]


def test_the_host_that_took_the_last_connection_is_tried_first() -> None:
    walk = Hosts("postgresql://u@a:1,b:2,c:3/db", 1.0)
    assert walk.order() == [Host("a", 1), Host("b", 2), Host("c", 3)]
    walk._took(Host("c", 3), [])
    assert walk.order() == [Host("c", 3), Host("a", 1), Host("b", 2)]


def test_no_host_accepted_names_each_host_and_why_and_is_an_oserror() -> None:
    error = NoHostAccepted(
        [(Host("10.0.0.1", 5432), "no answer within 2 s"), (Host("::1", 5433), "refused")]
    )
    assert isinstance(error, OSError)
    assert str(error) == (
        "no host took the connection (10.0.0.1:5432: no answer within 2 s; [::1]:5433: refused)"
    )
