"""GATEWAY_REDIS_MODE: settings, the sentinel URL, and the clients each mode builds
(no server needed: redis-py connects lazily)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection
from redis.asyncio.sentinel import SentinelConnectionPool, SentinelManagedSSLConnection

from gateway.errors import ConfigError
from gateway.redis.clients import (
    ClusterNodes,
    command_client,
    make_client,
    parse_sentinel_url,
    pubsub_client,
)
from gateway.settings import Settings

TOKEN = "t" * 40
BASE = {"GATEWAY_ADMIN_TOKEN": TOKEN}


def from_env(**env: str) -> Settings:
    return Settings.from_env({**BASE, **env})


def test_the_mode_defaults_to_standalone_and_is_validated() -> None:
    assert from_env().redis_mode == "standalone"
    assert from_env(GATEWAY_REDIS_MODE=" Cluster ").redis_mode == "cluster"
    with pytest.raises(ConfigError, match="GATEWAY_REDIS_MODE"):
        from_env(GATEWAY_REDIS_MODE="replicated")


def test_sentinel_mode_needs_a_master_name_and_a_sentinel_url() -> None:
    url = "redis+sentinel://s1:26379,s2/0"
    with pytest.raises(ConfigError, match="GATEWAY_REDIS_SENTINEL_MASTER"):
        from_env(GATEWAY_REDIS_MODE="sentinel", REDIS_URL=url)
    with pytest.raises(ConfigError, match="redis\\+sentinel://"):
        from_env(
            GATEWAY_REDIS_MODE="sentinel",
            GATEWAY_REDIS_SENTINEL_MASTER="m",
            REDIS_URL="redis://h:6379/0",
        )
    s = from_env(GATEWAY_REDIS_MODE="sentinel", GATEWAY_REDIS_SENTINEL_MASTER="m", REDIS_URL=url)
    assert (s.redis_mode, s.redis_sentinel_master) == ("sentinel", "m")
    with pytest.raises(ConfigError, match="GATEWAY_REDIS_MODE=sentinel"):
        from_env(REDIS_URL=url)


def test_cluster_mode_wants_a_node_url() -> None:
    assert from_env(GATEWAY_REDIS_MODE="cluster", REDIS_URL="rediss://n1:7000").redis_url
    with pytest.raises(ConfigError, match="cluster"):
        from_env(GATEWAY_REDIS_MODE="cluster", REDIS_URL="unix:///tmp/redis.sock")


def test_sentinel_urls_parse() -> None:
    t = parse_sentinel_url("rediss+sentinel://u:p%40ss@s1:26380,s2,[::1]:26381/2")
    assert t.sentinels == [("s1", 26380), ("s2", 26379), ("::1", 26381)]
    assert (t.db, t.username, t.password, t.ssl) == (2, "u", "p@ss", True)
    t = parse_sentinel_url("redis+sentinel://s1")
    assert (t.sentinels, t.db, t.username, t.password, t.ssl) == (
        [("s1", 26379)],
        0,
        None,
        None,
        False,
    )
    for bad in ("redis://s1:26379", "redis+sentinel://s1:port/0", "redis+sentinel://s1/x"):
        with pytest.raises(ConfigError):
            parse_sentinel_url(bad)


def test_rediss_builds_tls_clients_in_every_mode() -> None:
    standalone = make_client("rediss://h:6380/0", 0.25)
    assert standalone.connection_pool.connection_class is SSLConnection

    cluster = command_client("cluster", "rediss://n1:7000", 0.25)
    assert isinstance(cluster, RedisCluster)
    assert cluster.nodes_manager.connection_kwargs["connection_class"] is SSLConnection
    nodes = pubsub_client("cluster", "rediss://:pw@n1:7000", 0.25, cluster)
    assert isinstance(nodes, ClusterNodes)
    sub = nodes._clients  # opened lazily, on the first pubsub()
    nodes.pubsub()
    [(address, client)] = sub.items()
    assert address == ("n1", 7000)
    assert client.connection_pool.connection_class is SSLConnection
    assert client.connection_pool.connection_kwargs["password"] == "pw"

    master = command_client("sentinel", "rediss+sentinel://s1:26379/0", 0.25, "m")
    assert isinstance(master, aioredis.Redis)
    pool = master.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.connection_class is SentinelManagedSSLConnection
    assert pool.service_name == "m"


def test_the_sentinel_pubsub_client_has_the_subscriber_options() -> None:
    commands = command_client("sentinel", "redis+sentinel://s1/0", 0.25, "m")
    sub = pubsub_client("sentinel", "redis+sentinel://s1/0", 0.25, commands, "m")
    assert isinstance(sub, aioredis.Redis)
    kwargs = sub.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] is None and kwargs["socket_connect_timeout"] == 0.25
    assert kwargs["retry"].get_retries() == 0
    assert sub.connection_pool.connection_kwargs.get("decode_responses") is False


def test_a_sentinel_url_password_is_masked_in_the_settings_repr() -> None:
    s = from_env(
        GATEWAY_REDIS_MODE="sentinel",
        GATEWAY_REDIS_SENTINEL_MASTER="m",
        REDIS_URL="redis+sentinel://u:hunter2@s1:26379,s2:26379/0",
    )
    assert "hunter2" not in repr(s)
    assert "s1:26379,s2:26379" in repr(s)


def test_cluster_pubsub_connections_rotate_over_the_known_nodes() -> None:
    """Each pub/sub connection (one per reconnect) opens on the next node, so a dead
    node under the connection is left behind; before discovery, REDIS_URL's node."""
    cluster = command_client("cluster", "redis://:pw@seed:7000/0", 0.25)
    assert isinstance(cluster, RedisCluster)
    nodes = ClusterNodes(cluster, "redis://:pw@seed:7000/0", 0.25)
    nodes.pubsub()
    assert nodes.current == ("seed", 7000)

    class Known:
        def __init__(self, host: str, port: int) -> None:
            self.host, self.port = host, port

    known = [Known("n2", 7001), Known("n1", 7000), Known("n3", 7002)]
    cluster.get_nodes = lambda: known  # type: ignore[method-assign]
    seen = []
    for _ in range(4):
        nodes.pubsub()
        seen.append(nodes.current)
    assert seen == [("n2", 7001), ("n3", 7002), ("n1", 7000), ("n2", 7001)]
    client = nodes._clients[("n3", 7002)]
    assert client.connection_pool.connection_kwargs["password"] == "pw"


def test_the_command_client_is_bounded_in_every_mode() -> None:
    """GATEWAY_REDIS_MAX_CONNECTIONS caps the command pool: one server's, the Sentinel
    master's, and each cluster node's (redis-py's default would be 100 of each)."""
    standalone = make_client("redis://h:6379/0", 0.25, max_connections=7)
    assert standalone.connection_pool.max_connections == 7
    assert (
        command_client("standalone", "redis://h/0", 0.25, None, 7).connection_pool.max_connections
        == 7
    )

    master = command_client("sentinel", "redis+sentinel://s1/0", 0.25, "m", 7)
    assert isinstance(master, aioredis.Redis)
    assert isinstance(master.connection_pool, SentinelConnectionPool)
    assert master.connection_pool.max_connections == 7

    cluster = command_client("cluster", "redis://n1:7000", 0.25, None, 7)
    assert isinstance(cluster, RedisCluster)
    assert [n.max_connections for n in cluster.nodes_manager.startup_nodes.values()] == [7]
    # Nodes learnt later are made with the same keyword arguments.
    assert cluster.nodes_manager.connection_kwargs["max_connections"] == 7


def test_the_pubsub_client_is_not_bounded_by_the_command_setting() -> None:
    commands = command_client("sentinel", "redis+sentinel://s1/0", 0.25, "m", 1)
    sub = pubsub_client("sentinel", "redis+sentinel://s1/0", 0.25, commands, "m")
    assert isinstance(sub, aioredis.Redis)
    assert sub.connection_pool.max_connections != 1
