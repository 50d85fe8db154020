"""The requests this process is working on: the gateway's own CPU as a queue.

A flood of clients that send again the moment they are answered can keep the event
loop busy past its capacity while the database's line stays short: each claim and
complete is cheap for Postgres, and the gateway's Python is not. Every request read
then takes a turn of the loop at each step it awaits (its grant, its statement, its
answer), and each turn serves every request in flight, so a request's time grows with
how many are in flight (Little's law): a well-behaved client waits as long as the
flood. Measured (bench/README.md, the overload scenario): with 2,000 connections of
claims and completes, the database's line held 0 to 7 requests while each pooled
connection was held 44 to 233 ms (5 ms unloaded), Postgres idle between statements,
waiting for the gateway.

So the HTTP protocol counts the requests it has read in full and not yet answered
(`InFlight`), and `Gateway.busy()` compares them, less the claims that may wait and the
result waits (they cost nothing while they wait), with GATEWAY_MAX_ACTIVE_REQUESTS. A
request counts once its body is in and it has started, so that neither clients sending
slowly nor requests queued behind another on one connection (pipelined, or held after a
refusal) cost the count anything; one that waits for a slow database counts, as does an
answer that waits for a client slow to read it. Past it, a claim that carries no
acknowledgements and does not wait is refused `429 overloaded` at once, after its body
is read and before any work, and its connection is read again only at the end of its
Retry-After (the claim handler, gateway/http/handlers/daemon.py). Those are the flood's
cheapest requests to refuse and to send again: nothing rides on them. Completes, fails,
heartbeats and releases free work; a claim carrying them must apply them; a waiting
claim costs nothing while parked; an enqueue carries a producer's data, and the
database's line guards it (gateway/http/shedding.py). None of these is refused for it.
"""

from __future__ import annotations

from .errors import Overloaded


class InFlight:
    """A count the HTTP protocol keeps (gateway/http/server.py): requests read in full
    (head and body), whose answer is not complete, and whose connection is not gone. One per
    Gateway; read on every request of work, so a plain attribute."""

    __slots__ = ("requests",)

    def __init__(self) -> None:
        self.requests = 0


def claim_refusal(limit: int) -> Overloaded:
    """What a claim that carries nothing and does not wait is answered for it (429)."""
    return Overloaded(
        f"this instance is working on more than {limit} requests "
        "(GATEWAY_MAX_ACTIVE_REQUESTS); claim again after Retry-After (a claim that "
        "carries completes or fails, or waits, is still taken)"
    )
