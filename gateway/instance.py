"""The Gateway: every long-lived part of one gateway process (an instance of the
service), opened and closed together; not to be confused with a runtime, a tenant's queue.

Only the app's lifespan calls `open()` and `close()`; handlers reach the parts
through `request.app.state.gateway`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from redis.asyncio.cluster import RedisCluster

from .api.cursors import CursorSeal
from .api.decode import RUNTIME_ID_MAX_CHARS
from .auth.credentials import Credentials
from .auth.principals import Authenticator
from .auth.webhooks import Verifier
from .background import stop_task
from .claim.claimer import Claimer
from .claim.completions import Completions
from .claim.controls import RuntimeControls
from .claim.lease_spans import LeaseSpans
from .claim.results import Results
from .errors import ConfigError, GatewayError
from .in_flight import InFlight
from .janitor import Janitor
from .logs import Throttle
from .metrics import Metrics
from .redis.breaker import CircuitBreaker
from .redis.clients import (
    REDIS_ERRORS,
    CommandClient,
    PubSubSource,
    command_client,
    make_client,
    make_pubsub_client,
    not_a_cluster,
    pubsub_client,
)
from .redis.parked import ParkedReport
from .redis.verdict import VerdictCache
from .redis.wakeups import Subscriber
from .refusals import held_back
from .rows import ItemResult, ended
from .schedules.service import Scheduler
from .settings import Settings
from .store import Store

log = logging.getLogger("gateway")

CLUSTER_DISCOVERY_SECONDS = 5.0  # bound on learning a cluster's nodes and slots at start


# How long /readyz waits for Postgres to answer its schema check: well under a probe's
# own timeout (3 s in deploy/kubernetes), so that a database that does not answer is
# reported as such rather than failing the probe by its timeout.
READINESS_DATABASE_SECONDS = 1.0


@dataclass(frozen=True)
class Readiness:
    """What /readyz answers: `problems`, why this instance should get no traffic (none:
    ready); `degraded`, what fails for every instance alike while this one stays ready."""

    problems: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)


class Gateway:
    """Owns the Postgres pool, the Redis clients, the pub/sub subscriber, the claimer,
    the janitor, the scheduler, and the short-lived caches of tokens and webhook secrets."""

    def __init__(self, settings: Settings) -> None:
        if not settings.database_url:
            raise ConfigError("DATABASE_URL is not set (or run `gateway serve --embedded`)")
        if not settings.redis_url:
            raise ConfigError("REDIS_URL is not set (or run `gateway serve --embedded`)")
        self.settings = settings
        self.in_flight = InFlight()
        self._busy_warning = Throttle()  # shed_busy's
        self.metrics = Metrics(settings.max_wait_seconds)
        self.store = Store(
            settings.database_url,
            self.metrics,
            min_size=settings.db_pool_min,
            max_size=settings.db_pool_max,
            statement_timeout_ms=settings.db_statement_timeout_ms,
            acquire_timeout_ms=settings.db_acquire_timeout_ms,
            connect_timeout_ms=settings.db_connect_timeout_ms,
            queue_budget_ms=settings.db_queue_budget_ms,
            statement_cache_size=settings.db_statement_cache_size,
            lock_dsn=settings.lock_database_url,
        )
        self.credentials = Credentials(self.store)
        self.auth = Authenticator(settings, self.credentials.principal_by_hash)
        self.webhooks = Verifier(self.credentials.webhook_keys)
        # The runtimes listing's cursors (runtimes.py), keyed from the admin token that
        # every replica holds, so that any replica opens another's cursor (cursors.py).
        self.runtime_cursors = CursorSeal(
            settings.admin_token or "", "runtimes", RUNTIME_ID_MAX_CHARS
        )
        timeout = settings.redis_timeout_seconds
        mode, master = settings.redis_mode, settings.redis_sentinel_master
        commands: CommandClient
        pubsub: PubSubSource
        bound = settings.redis_max_connections
        try:
            if mode == "standalone":
                commands = make_client(settings.redis_url, timeout, max_connections=bound)
                pubsub = make_pubsub_client(settings.redis_url, timeout)
            else:
                commands = command_client(mode, settings.redis_url, timeout, master, bound)
                pubsub = pubsub_client(mode, settings.redis_url, timeout, commands, master)
        except ValueError as exc:  # redis-py's word for a URL it cannot read
            raise ConfigError(f"REDIS_URL cannot be used: {exc}") from exc
        self.cache = VerdictCache(
            commands,
            settings.redis_prefix,
            self.metrics,
            timeout_seconds=timeout,
            version_ttl_seconds=settings.version_ttl_seconds,
            breaker=CircuitBreaker(settings.breaker_failures, settings.breaker_open_seconds),
            on_trouble=self._on_redis_trouble,
            cluster=mode == "cluster",
            max_connections=bound,
        )
        self.subscriber = Subscriber(
            pubsub,
            settings.redis_prefix,
            self.metrics,
            on_wake=self._on_wake,
            on_reset=self._on_reset,
            timeout_seconds=timeout,
            on_message=self._on_message,
            on_control=self._on_control,
        )
        self._commands = commands
        self.controls = RuntimeControls(self.store, self.cache, self._on_controls_changed)
        self.claimer = Claimer(
            self.store,
            self.cache,
            self.subscriber,
            settings,
            self.metrics,
            controls=self.controls,
            settled=self.completes_settled,
        )
        self.results = Results(
            self.store, self.cache, self.subscriber, self.claimer, settings, self.metrics
        )
        self.claimer.on_drain(self.results.drain)
        self.lease_spans = LeaseSpans(self.store)  # while tracing is on
        self.completions = Completions(self.store, self.metrics, self.lease_spans)
        self.parked = ParkedReport(
            self.cache, self.claimer.parked_counts, self.claimer.activity.counts
        )
        self._redis_watch: asyncio.Task[None] | None = None
        self._schema_check: asyncio.Task[bool] | None = None  # readiness's, see readiness()
        self.janitor = Janitor(
            self.store,
            self.cache,
            self.claimer.announce,
            settings,
            self.metrics,
            finished=self.results.finished,
            slots_freed=self.controls.slot_freed,
        )
        self.scheduler = Scheduler(
            self.store,
            self.claimer.announce_many,
            settings,
            self.metrics,
            leading=lambda: self.janitor.is_leader,
            finished=self.results.finished,
        )

    async def tasks_ended(
        self, tasks: Iterable[tuple[uuid.UUID, str]], runtime_ids: Sequence[str]
    ) -> None:
        """After a commit that ended claimed tasks (complete, fail without a retry):
        wake the requests waiting for the results of `tasks`, each (id, status now),
        and the parked polls of those of `runtime_ids` that a max_in_flight holds back
        (a slot came free). Neither makes the caller wait for Redis unless a runtime
        has a max_in_flight."""
        await self.results.finished(tasks)
        await self.controls.slot_freed(runtime_ids)

    async def completes_settled(self, outcomes: Sequence[ItemResult]) -> None:
        """After the commit of completes applied item by item (a batch complete, the
        completes a claim carries): the requests waiting for the results of those that
        ended woken, and the parked polls of limited runtimes whose slots came free."""
        await self.tasks_ended(ended(outcomes), [r.runtime_id for r in outcomes if r.runtime_id])
        self.lease_spans.ended_many(outcomes, "complete")

    def _on_wake(self, runtime_id: str) -> None:
        self.claimer.wake(runtime_id)

    def _on_reset(self) -> None:
        self.claimer.wake_all()
        self.results.wake_all()
        self.controls.refresh_soon()  # a change announced meanwhile was lost

    def _on_message(self, channel: str) -> None:
        self.results.message(channel)

    def _on_control(self, message: str) -> None:
        self.controls.on_message(message)

    def _on_controls_changed(self, runtime_id: str) -> None:
        self.claimer.wake(runtime_id)

    def _on_redis_trouble(self) -> None:
        self.claimer.redis_trouble()
        self.results.redis_trouble()

    async def open(self) -> None:
        if not self.settings.auth_enabled:
            log.warning(
                "AUTHENTICATION IS OFF (GATEWAY_AUTH=off): anyone who can reach this port "
                "can enqueue, claim and complete tasks. Use this for local development only."
            )
        await self.store.open()
        await self.subscriber.start()
        if isinstance(self._commands, RedisCluster):
            # Learning the slot map takes several round trips: more than one command's
            # budget allows. If it fails here, the first command tries again.
            try:
                async with asyncio.timeout(CLUSTER_DISCOVERY_SECONDS):
                    await self._commands.initialize()
            except REDIS_ERRORS as exc:
                refused = not_a_cluster(exc)
                if refused is not None:
                    raise ConfigError(
                        "GATEWAY_REDIS_MODE is cluster, but the Redis at REDIS_URL answered "
                        f"that it is not a cluster node ({refused}); set GATEWAY_REDIS_MODE "
                        "to standalone, or point REDIS_URL at a node of the cluster"
                    ) from None
        if not await self.cache.ping():
            log.warning("Redis is not reachable; claims go to Postgres until it is back")
        await self.controls.start()
        await self.janitor.start()
        await self.scheduler.start()
        await self.parked.start()
        self._redis_watch = asyncio.create_task(self.claimer.watch_redis(), name="redis-watch")

    async def close(self) -> None:
        self.claimer.drain()
        await self.scheduler.stop()
        await self.janitor.stop()
        await self.parked.stop()
        await self.completions.close()  # before the result wake-ups its requests send
        await self.claimer.close()  # leases being given back: a statement and bumps each
        await self.results.close()
        await self.lease_spans.close()  # before the pool: each write is one statement
        await self.controls.stop()
        if self._redis_watch is not None:
            await stop_task(self._redis_watch, "Redis watch")
        await self.subscriber.stop()
        await self.cache.close()
        if self._schema_check is not None:
            self._schema_check.cancel()  # holds a connection the pool's close would wait for
        await self.store.close()

    def at_work(self) -> int:
        """Requests at work in this process: read and not yet answered, less the claims
        that may wait and the result waits (gateway/in_flight.py)."""
        return self.in_flight.requests - self.claimer.long_polls

    def busy(self) -> bool:
        """True when more requests are at work than GATEWAY_MAX_ACTIVE_REQUESTS. A few
        attribute reads: asked of every claim that carries nothing and does not wait."""
        return self.at_work() > self.settings.max_active_requests

    def shed_busy(self) -> None:
        """Count a claim refused because this instance was busy (`busy()`); a warning
        at most once per 10 s, as the database's line logs its own."""
        self.store.shed_busy()
        refused = self._busy_warning.due()
        if refused is not None:
            log.warning(
                "this instance is busy: %d requests at work, more than "
                "GATEWAY_MAX_ACTIVE_REQUESTS (%d); claims that carry no completes or fails "
                "and do not wait are refused with 429 overloaded and Retry-After%s",
                self.at_work(),
                self.settings.max_active_requests,
                held_back(refused),
            )

    async def readiness(self) -> Readiness:
        """Whether this instance should receive traffic, and what fails meanwhile.

        Not ready: it is shutting down (I10), or Postgres answers that its schema lacks a
        migration this release needs (a release rolled out before its migration: the
        instances of the release before still serve). A start not finished yet is
        answered before this is asked (http/startup.py).

        Ready, with "database unavailable" among `degraded`: Postgres does not answer,
        or not within READINESS_DATABASE_SECONDS. Every instance shares it, so all of
        them would report it together (a failover): were that not-ready, a load balancer
        or Kubernetes Service would be left with no instance, and clients would get
        refused connections instead of answers. A ready instance answers what needs
        Postgres with 503 meanwhile, and what does not (parked polls, /metrics) as
        usual. Redis is not required at all (I5)."""
        if self.claimer.draining:
            return Readiness(["shutting down"])
        try:
            current = await self._schema_is_current()
        except (GatewayError, TimeoutError) as exc:
            # The answer is public: it names the component; the detail stays in the log.
            detail = (
                exc.detail
                if isinstance(exc, GatewayError)
                else (f"no answer within {READINESS_DATABASE_SECONDS:g} s")
            )
            log.warning("readiness: the database is unavailable (still ready): %s", detail)
            self.metrics.database_reachable.set(0)
            return Readiness(degraded=["database unavailable"])
        self.metrics.database_reachable.set(1)
        if not current:
            return Readiness(["database schema is not current: run `gateway migrate`"])
        return Readiness()

    async def _schema_is_current(self) -> bool:
        """The schema check, waited for READINESS_DATABASE_SECONDS at most (TimeoutError
        past it). Not cancelled then: a statement cancelled on a connection that does
        not answer would hold the probe up for the driver's cleanup. It runs on, bounded
        by the statement timeout, and the probes meanwhile wait for it rather than
        start another, so that a database that does not answer holds one connection for
        readiness, not one per probe."""
        check = self._schema_check
        if check is None or check.done():
            check = asyncio.create_task(self.store.schema_is_current(), name="readiness check")
            # Read at once when done, so that a failure no probe waits for is not
            # reported as never retrieved.
            check.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._schema_check = check
        done, _ = await asyncio.wait({check}, timeout=READINESS_DATABASE_SECONDS)
        if not done:
            raise TimeoutError
        return check.result()
