"""How the gateway reaches Redis: one server, a Redis Cluster, or a master found through
Sentinel (GATEWAY_REDIS_MODE). Builds the command client and the pub/sub client, in
every mode with the gateway's budgets (`redis_options`: short timeouts, one retry, no
backoff, where redis-py's defaults can stall a call for a minute).

Wake-ups use plain PUBLISH in every mode. In a cluster a PUBLISH reaches every node over
the cluster bus, so the process keeps one pub/sub connection to any one node, and the
guarantees of `wakeups.Subscriber` (confirmed subscriptions, pings, reconnect + wake
every waiter) carry over unchanged; see docs/design.md, "Redis Cluster".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from ..errors import ConfigError
from ..settings import DEFAULT_REDIS_MAX_CONNECTIONS

# What a Redis call may raise when Redis is unreachable, slow or refuses: each is a miss
# (I5), never an error of the request. redis-py's cluster client raises
# RedisClusterException, which is no RedisError, while it cannot reach any node to learn
# the slot map (every call until it can, when the cluster was down at start-up).
REDIS_ERRORS = (RedisError, RedisClusterException, OSError, TimeoutError)


def not_a_cluster(exc: BaseException) -> str | None:
    """What a Redis that was reached said when the cluster client asked it for the
    slot map and it is no cluster node (a standalone Redis: "Cluster mode is not
    enabled on this node"), from the cluster client's failed discovery `exc`; None
    when no node could be reached (that is an outage, and the gateway fails open)."""
    cause = exc.__cause__
    if isinstance(exc, RedisClusterException) and isinstance(cause, RedisClusterException):
        return str(cause)
    return None


def redis_options(timeout_seconds: float, **extra: object) -> dict[str, object]:
    """The gateway's budgets for a redis client: short timeouts, one retry, no backoff.

    redis-py's defaults (several retries with backoff) can stall a call for far
    longer than a claim may wait on Redis.
    """
    options: dict[str, object] = {
        "socket_timeout": timeout_seconds,
        "socket_connect_timeout": timeout_seconds,
        "retry": Retry(NoBackoff(), 1),
        "decode_responses": True,
    }
    options.update(extra)
    return options


def pubsub_options() -> dict[str, object]:
    """What the pub/sub subscriber's client changes in `redis_options`: no socket
    timeout (its reads block for long stretches by design; its own PINGs find a dead
    connection), raw bytes (redis-py mis-parses a subscribed PONG when it decodes
    responses), and no retry.

    With a retry, redis-py's pub/sub reconnects and subscribes again inside the failed
    read and returns as if nothing happened: the subscriber would never learn of the
    gap, nor wake its waiters for the wake-ups lost in it (I8).
    """
    return {"socket_timeout": None, "decode_responses": False, "retry": Retry(NoBackoff(), 0)}


def make_client(url: str, timeout_seconds: float, **extra: object) -> aioredis.Redis:
    """A redis client for one server with the gateway's budgets (`redis_options`)."""
    return aioredis.Redis.from_url(url, **redis_options(timeout_seconds, **extra))  # type: ignore[arg-type]


def make_pubsub_client(url: str, timeout_seconds: float) -> aioredis.Redis:
    """The pub/sub subscriber's client for one server (see `pubsub_options`)."""
    return make_client(url, timeout_seconds, **pubsub_options())


MODES = ("standalone", "cluster", "sentinel")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379

CommandClient = aioredis.Redis | RedisCluster


class PubSubSource(Protocol):
    """What the Subscriber needs of a client: a fresh PubSub per connection, and close."""

    def pubsub(self) -> Any: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class SentinelTarget:
    """The sentinels to ask, and how to talk to the master they name."""

    sentinels: list[tuple[str, int]]
    db: int
    username: str | None
    password: str | None
    ssl: bool


def parse_sentinel_url(url: str) -> SentinelTarget:
    """`redis+sentinel://[user:password@]host1[:port1],host2[:port2]/[db]`, or
    `rediss+sentinel://` for TLS. The credentials are the master's; the port defaults
    to 26379. Raises ConfigError naming REDIS_URL."""
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        raise ConfigError(
            "with GATEWAY_REDIS_MODE=sentinel, REDIS_URL must look like "
            "redis+sentinel://host1:26379,host2:26379/0 (or rediss+sentinel:// for TLS)"
        )
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    sentinels = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep:
            host, port = port, str(DEFAULT_SENTINEL_PORT)
        host = host.strip("[]")  # an IPv6 literal
        if not host or not port.isdigit():
            raise ConfigError(f"REDIS_URL names a sentinel without host or port: {item!r}")
        sentinels.append((host, int(port)))
    db = parts.path.strip("/") or "0"
    if not db.isdigit():
        raise ConfigError(f"REDIS_URL's database must be a number, got {db!r}")
    return SentinelTarget(
        sentinels=sentinels,
        db=int(db),
        username=unquote(username) or None,
        password=unquote(password) if password else None,
        ssl=parts.scheme == "rediss+sentinel",
    )


class SentinelMaster(aioredis.Redis):
    """A client of the master the sentinels name; owns its clients of the sentinels."""

    owned_sentinel: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        sentinels = self.owned_sentinel.sentinels if self.owned_sentinel is not None else []
        for client in sentinels:
            await client.aclose()


def _sentinel_master(
    url: str, master: str, timeout_seconds: float, **extra: object
) -> aioredis.Redis:
    """A client whose connections ask the sentinels for the current master each time
    they connect: after a failover, the next (re)connect finds the new master."""
    target = parse_sentinel_url(url)
    options = redis_options(timeout_seconds, **extra)
    sentinel_kwargs = {k: options[k] for k in ("socket_timeout", "socket_connect_timeout")}
    if sentinel_kwargs["socket_timeout"] is None:  # the pub/sub client's: sentinels answer fast
        sentinel_kwargs["socket_timeout"] = timeout_seconds
    if target.ssl:
        sentinel_kwargs["ssl"] = True
    sentinel = Sentinel(target.sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    options.update(db=target.db, username=target.username, password=target.password)
    if target.ssl:
        options["ssl"] = True
    client: SentinelMaster = sentinel.master_for(master, redis_class=SentinelMaster, **options)  # type: ignore[arg-type]
    client.owned_sentinel = sentinel
    return client


def command_client(
    mode: str,
    url: str,
    timeout_seconds: float,
    sentinel_master: str | None = None,
    max_connections: int = DEFAULT_REDIS_MAX_CONNECTIONS,
) -> CommandClient:
    """The client for commands (verdicts, bumps, publishes), with the gateway's budgets
    and at most `max_connections` connections (to each node, in a cluster). A full
    pool refuses a call (MaxConnectionsError); VerdictCache makes calls wait instead."""
    if mode == "cluster":
        return RedisCluster.from_url(
            url, max_connections=max_connections, **redis_options(timeout_seconds)
        )
    if mode == "sentinel":
        return _sentinel_master(
            url, sentinel_master or "", timeout_seconds, max_connections=max_connections
        )
    return make_client(url, timeout_seconds, max_connections=max_connections)


def pubsub_client(
    mode: str,
    url: str,
    timeout_seconds: float,
    commands: CommandClient,
    sentinel_master: str | None = None,
) -> PubSubSource:
    """The Subscriber's client (see `make_pubsub_client` for its options)."""
    if mode == "cluster" and isinstance(commands, RedisCluster):
        return ClusterNodes(commands, url, timeout_seconds)
    if mode == "sentinel":
        return _sentinel_master(url, sentinel_master or "", timeout_seconds, **pubsub_options())
    return make_pubsub_client(url, timeout_seconds)


def _at(url: str, host: str, port: int) -> str:
    """`url` with its host and port replaced, keeping scheme (TLS) and credentials."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    host = f"[{host}]" if ":" in host else host
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}:{port}", path="/0"))


class ClusterNodes:
    """The Subscriber's client in cluster mode. Each `pubsub()` (one per connection the
    Subscriber opens, so one per reconnect) is opened on the next node the command
    client knows of, or on REDIS_URL's node before it knows any: when the node under
    the pub/sub connection dies, the reconnect lands on another one. Owns one
    pub/sub client per node it has used."""

    def __init__(self, cluster: RedisCluster, url: str, timeout_seconds: float) -> None:
        self._cluster = cluster
        self._url = url
        self._timeout = timeout_seconds
        self._turn = 0
        self._clients: dict[tuple[str, int], aioredis.Redis] = {}
        self.current: tuple[str, int] | None = None  # the node of the latest connection

    def _addresses(self) -> list[tuple[str, int]]:
        known = sorted({(str(node.host), int(node.port)) for node in self._cluster.get_nodes()})
        if known:
            return known
        seed = urlsplit(self._url)
        return [(seed.hostname or "127.0.0.1", seed.port or 6379)]

    def pubsub(self) -> Any:
        addresses = self._addresses()
        address = addresses[self._turn % len(addresses)]
        self._turn += 1
        client = self._clients.get(address)
        if client is None:
            client = make_pubsub_client(_at(self._url, *address), self._timeout)
            self._clients[address] = client
        self.current = address
        return client.pubsub()

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
