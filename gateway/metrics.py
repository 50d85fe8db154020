"""Prometheus metrics. One `Metrics` per app, each with its own registry, so that two
apps in one process (as in the tests) count separately.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import timedelta

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics

from . import tracing
from .rows import TaskRow

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Asked for in a scrape's Accept header: the format that carries exemplars.
OPENMETRICS = "application/openmetrics-text"

# Enqueue-to-claim delay, in seconds: from a few milliseconds (a poll was parked) to
# an hour (a backlog).
DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_WAIT_STEPS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 45, 60, 120, 300, 600, 1800)


class LoopCounter:
    """A counter for the request path, with labels, that takes no lock: a plain dict of
    numbers, read when /metrics is scraped. prometheus-client's own counters take a
    thread lock per increment; this one may only be incremented from the event loop's
    thread, which is where every request is served. Exported as `<name>_total`."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        # An unlabelled counter shows 0 from the start, as prometheus-client's do.
        self.values: dict[tuple[str, ...], float] = {} if self.labelnames else {(): 0.0}
        if registry is not None:
            registry.register(self)

    def inc(self, *labelvalues: str, amount: float = 1.0) -> None:
        """Add `amount` to the sample with these label values (in labelnames' order)."""
        self.values[labelvalues] = self.values.get(labelvalues, 0.0) + amount

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labelvalues, value in list(self.values.items()):
            family.add_metric(list(labelvalues), value)
        yield family


def wait_buckets(max_wait_seconds: float) -> tuple[float, ...]:
    """Long-poll buckets, in seconds: the steps below the cap, the cap itself (most
    empty polls end there), and two past it, for polls that overran it (a claim in
    flight at the deadline, a slow answer)."""
    cap = max(max_wait_seconds, 0.01)
    below = [step for step in _WAIT_STEPS if step < cap]
    return (*below, cap, cap * 1.1 + 1, cap * 2 + 5)


class Metrics:
    """The gateway's counters. Names are stable: dashboards depend on them."""

    def __init__(self, max_wait_seconds: float = 60.0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.verdict_checks = Counter(
            "gateway_verdict_checks",
            "Empty-verdict reads in Redis, by outcome: hit (Postgres skipped), miss, error.",
            ["outcome"],
            registry=r,
        )
        self.pg_claims = Counter(
            "gateway_postgres_claims",
            "Claim statements sent to Postgres (one serves every local waiter of a runtime).",
            registry=r,
        )
        self.complete_statements = Counter(
            "gateway_complete_statements",
            "Statements that completed tasks for completes and batch acknowledgements "
            "(one serves every one of the process that arrived while others were in "
            "flight).",
            registry=r,
        )
        self.shed = Counter(
            "gateway_shed",
            "Requests refused at once, before any work, to keep the line short under "
            "overload (reason: database_queue, the line for a database connection was "
            "longer than GATEWAY_DB_QUEUE_BUDGET_MS of work; busy, a claim carrying nothing "
            "that would not wait, while the instance worked on more than "
            "GATEWAY_MAX_ACTIVE_REQUESTS requests; client_gone, the client "
            "closed its connection while its request waited for one, or a claim for its "
            "statement).",
            ["reason"],
            registry=r,
        )
        self.db_queue_limit = Gauge(
            "gateway_db_queue_limit",
            "Requests of work (enqueues, claims, reads) that may wait for a database "
            "connection now, from GATEWAY_DB_QUEUE_BUDGET_MS and the mean time a "
            "connection is held; more are refused at once (gateway_shed_total).",
            registry=r,
        )
        self.db_acquire_timeouts = Counter(
            "gateway_db_acquire_timeouts",
            "Requests refused (503 database_busy) because no pooled Postgres connection "
            "came free within GATEWAY_DB_ACQUIRE_TIMEOUT_MS.",
            registry=r,
        )
        self.tasks_claimed = Counter(
            "gateway_tasks_claimed", "Tasks handed out with a lease.", registry=r
        )
        self.tasks_enqueued = Counter("gateway_tasks_enqueued", "Tasks created.", registry=r)
        self.unclaimed = Counter(
            "gateway_leases_returned",
            "Leases given back because their poll left before they could be delivered.",
            registry=r,
        )
        self.bumps = Counter(
            "gateway_version_bumps",
            "Runtime version bumps, by outcome: ok, error (a lost bump; the janitor repairs it).",
            ["outcome"],
            registry=r,
        )
        self.redis_errors = Counter(
            "gateway_redis_errors",
            "Redis commands that failed or timed out; the gateway fell back to Postgres.",
            registry=r,
        )
        self.redis_pool_timeouts = Counter(
            "gateway_redis_pool_timeouts",
            "Redis calls not sent: every connection (GATEWAY_REDIS_MAX_CONNECTIONS) stayed "
            "busy for GATEWAY_REDIS_TIMEOUT_MS; the gateway fell back to Postgres.",
            registry=r,
        )
        self.breaker_open = Gauge(
            "gateway_redis_breaker_open",
            "1 while the Redis circuit breaker skips Redis after repeated errors.",
            registry=r,
        )
        self.parked_polls = Gauge(
            "gateway_parked_polls",
            "Requests waiting in this process: claims waiting for work, and requests "
            "waiting for a task's result (GET /v1/tasks/{id}?wait_seconds).",
            registry=r,
        )
        self.claims_rejected = Counter(
            "gateway_claims_rejected",
            "Claims answered 429, by reason: database_queue (too many Postgres claims were "
            "queued, or the first in line had waited past GATEWAY_DB_QUEUE_BUDGET_MS) or "
            "parked_polls (GATEWAY_MAX_PARKED_POLLS polls were already waiting).",
            ["reason"],
            registry=r,
        )
        self.tasks_unrenderable = Counter(
            "gateway_tasks_unrenderable",
            "Claimed tasks that could not be turned into a response; each was ended dead "
            "with the reason in last_error, and the tasks claimed beside it were delivered.",
            registry=r,
        )
        self.wakeups_received = Counter(
            "gateway_wakeups_received",
            "Wake-up messages received on the pub/sub connection (one per message, whether "
            "or not a poll of its runtime is parked here).",
            registry=r,
        )
        self.wakeups_delivered = Counter(
            "gateway_wakeups_delivered",
            "Parked polls answered with tasks by the claim that a wake-up started. A parked "
            "poll is one that had already found no work; a wake-up is a pub/sub message or "
            "a bump made by this process. Compare with gateway_wakeups_received_total.",
            registry=r,
        )
        self.sync_matches = Counter(
            "gateway_sync_matches",
            "Tasks an enqueue wrote already leased to a poll parked on this instance "
            "(GATEWAY_SYNC_MATCH), with no claim statement; given back to the queue if "
            "the poll's client had left meanwhile (outcome).",
            ["outcome"],
            registry=r,
        )
        self.long_poll_wait = Histogram(
            "gateway_long_poll_wait_seconds",
            "Time a claim with wait_seconds > 0 spent in the gateway, from its arrival to "
            "its answer (tasks, an empty list when the wait ran out, or an error), in "
            "seconds. The buckets run past GATEWAY_MAX_WAIT_SECONDS.",
            buckets=wait_buckets(max_wait_seconds),
            registry=r,
        )
        self.claim_delay = Histogram(
            "gateway_claim_delay_seconds",
            "Time from a task becoming claimable (its run_at, or created_at when later) to "
            "the start of the lease that claimed it, in seconds, both times from Postgres's "
            "clock. Release, lease expiry, retry and fail set a new run_at, so a task's "
            "next claim counts from there.",
            buckets=DELAY_BUCKETS,
            registry=r,
        )
        self.subscriber_reconnects = Counter(
            "gateway_pubsub_reconnects",
            "Times the shared pub/sub connection was replaced after an error.",
            registry=r,
        )
        self.claim_seconds = Histogram(
            "gateway_postgres_claim_seconds",
            "Duration of one Postgres claim statement, in seconds.",
            registry=r,
        )

        self.repairs = Counter(
            "gateway_verdict_repairs",
            "Runtimes the janitor found with claimable tasks behind an 'empty' verdict and "
            "bumped. Each one means a version bump was lost somewhere.",
            registry=r,
        )
        self.repair_wakeups = Counter(
            "gateway_janitor_wakeups",
            "Wake-ups the janitor published to runtimes whose tasks had been claimable for "
            "over a second, so that a poll that missed a wake-up re-checks.",
            registry=r,
        )
        self.leases_reclaimed = Counter(
            "gateway_leases_reclaimed",
            "Expired leases the janitor took back, by outcome: queued, dead or cancelled.",
            ["outcome"],
            registry=r,
        )
        self.tasks_expired = Counter(
            "gateway_tasks_expired", "Queued tasks marked expired past their TTL.", registry=r
        )
        self.tasks_purged = Counter(
            "gateway_tasks_purged", "Finished tasks deleted by retention.", registry=r
        )
        self.janitor_pass_seconds = Histogram(
            "gateway_janitor_pass_seconds",
            "Duration of one janitor pass (every step: lease reclaim, expiry, retention, "
            "counts fold, verdict repair, queue depth), in seconds. Each step does a bounded "
            "amount of work per pass; what is left waits for the next pass.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.table_vacuums = Counter(
            "gateway_janitor_vacuums",
            "VACUUMs of the task table the janitor ran after a burst "
            "(GATEWAY_JANITOR_VACUUM_DEAD_ROWS), by outcome: done, skipped (another VACUUM "
            "of the table was running), failed, cancelled (the gateway stopping).",
            ["outcome"],
            registry=r,
        )
        self.janitor_errors = Counter(
            "gateway_janitor_errors", "Janitor steps that failed (retried next pass).", registry=r
        )
        self.schedule_ticks = Counter(
            "gateway_schedule_ticks",
            "Schedule ticks decided, by outcome: enqueued (the tick's task was made), "
            "skipped_overlap (the previous task was still queued or running), skipped_late "
            "(older than the schedule's catch_up_seconds), failed (a tick pass's batch that "
            "failed; its ticks are decided by the next pass).",
            ["outcome"],
            registry=r,
        )
        self.schedule_pass_seconds = Histogram(
            "gateway_schedule_pass_seconds",
            "Duration of one tick pass that found schedules due, in seconds: at most 10 "
            "transactions of 2,000 due schedules each, and the Redis bumps after them. "
            "A pass that finds none due (one index probe) is not counted.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.schedule_lag = Histogram(
            "gateway_schedule_lag_seconds",
            "How long after its tick's time the tick pass enqueued a schedule's task, in "
            "seconds (the task's jitter not counted); 0 for a tick decided ahead of its "
            "time (overlap allow), whose task waits for it.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        self.connections_cut = Counter(
            "gateway_connections_cut",
            "Connections the gateway cut, by reason: read_timeout (a request not in full "
            "within GATEWAY_READ_TIMEOUT_SECONDS), head_too_large (request line and headers "
            "over 64 KiB), body_unread (answered before the body arrived, a 413 say; the rest "
            "of the body is not read), write_timeout (an answer waiting for its client, of "
            "which less than 16 KiB left in GATEWAY_READ_TIMEOUT_SECONDS; it is dropped).",
            ["reason"],
            registry=r,
        )
        self.janitor_leader = Gauge(
            "gateway_janitor_leader", "1 while this instance runs the janitor.", registry=r
        )
        self.database_reachable = Gauge(
            "gateway_database_reachable",
            "1 while this instance reaches Postgres, 0 while it does not: as the last "
            "readiness probe or janitor round found it (every instance tries once per "
            "GATEWAY_JANITOR_INTERVAL_SECONDS). An instance that does not reach Postgres "
            "stays ready (a failover would otherwise leave no instance) and answers 503.",
            registry=r,
        )
        self.database_reachable.set(1)
        self.tasks_by_status = Gauge(
            "gateway_tasks_stored",
            "Tasks stored, by status, counted by the janitor's leader once per "
            "GATEWAY_JANITOR_INTERVAL_SECONDS, or less often when counting takes over a tenth "
            "of the time between two counts (only the leader has samples: aggregate with max).",
            ["status"],
            registry=r,
        )
        self.oldest_queued_age = Gauge(
            "gateway_oldest_queued_age_seconds",
            "Age in seconds of the oldest claimable queued task, counted from its run_at "
            "(or created_at when later); 0 when none. Set by the janitor's leader with "
            "gateway_tasks_stored.",
            registry=r,
        )
        self.verdict_renewals = Counter(
            "gateway_verdict_renewals",
            "Empty verdicts given a new life in Redis, without a Postgres scan, because no "
            "bump had made them stale and no delayed task was coming due, by outcome: renewed, "
            "stale (a bump had landed; the next check goes to Postgres).",
            ["outcome"],
            registry=r,
        )
        self.near_hits = LoopCounter(
            "gateway_verdict_local_hits",
            "Claims answered from this process's copy of a runtime's empty verdict, without "
            "a Redis round trip. The copy is kept only while the process is subscribed to the "
            "runtime's wake-ups (GATEWAY_NEAR_CACHE), and dropped at the runtime's next "
            "wake-up; gateway_verdict_checks_total counts the reads that did go to Redis.",
            registry=r,
        )
        # Waits for a task's result (gateway/claim/results.py).
        self.result_wait_reads = Counter(
            "gateway_result_wait_reads",
            "Reads of a task from Postgres by requests waiting for its result "
            "(GET /v1/tasks/{id}?wait_seconds): one when the wait begins, one per wake-up "
            "and one when it ends. A wait that is not woken costs no read while it waits.",
            registry=r,
        )
        self.result_publishes = Counter(
            "gateway_result_publishes",
            "Wake-ups published to requests waiting for a task's result, when a task "
            "finished, by outcome: ok, error (Redis failed; the waiters find out at their "
            "next fallback read, or when their wait ends).",
            ["outcome"],
            registry=r,
        )
        self.http_requests = LoopCounter(
            "gateway_http_requests",
            "HTTP requests answered, by route template (`unmatched` when no endpoint's "
            "path matched), method and status class (2xx, 4xx, 5xx; 499, client left, is "
            "4xx). A long poll counts once, when it is answered.",
            ["route", "method", "status_class"],
            registry=r,
        )
        self.log_lines_dropped = LoopCounter(
            "gateway_log_lines_dropped",
            "Access log lines dropped because the queue to the thread that writes them "
            "was full (stderr read more slowly than requests were answered). Requests "
            "are still counted in gateway_http_requests_total.",
            registry=r,
        )

    def observe_claim_delay(self, task: TaskRow, lease_seconds: float) -> None:
        """Enqueue-to-claim delay of a task just leased, Postgres's clock against
        Postgres's: the lease began `lease_seconds` before the lease_expires_at the claim
        wrote."""
        if task.lease_expires_at is None:
            return
        leased_at = task.lease_expires_at - timedelta(seconds=lease_seconds)
        delay = (leased_at - max(task.run_at, task.created_at)).total_seconds()
        self.claim_delay.observe(max(delay, 0.0), exemplar(task.trace_parent))

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The samples and their content type: OpenMetrics, with the exemplars, when
        `accept` (a scrape's Accept header) asks for it, as Prometheus does when its
        exemplar storage is on; else the Prometheus text format."""
        if OPENMETRICS in accept:
            text = openmetrics.generate_latest(self.registry)  # type: ignore[no-untyped-call]
            return text, openmetrics.CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE


def exemplar(traceparent: str | None) -> dict[str, str] | None:
    """The exemplar of an observation made for a task whose stored context is
    `traceparent`: its trace id, while tracing is on (off, none: no tracing work)."""
    if traceparent is None or tracing.active is None:
        return None
    return {"trace_id": traceparent[3:35]}  # version-traceid-parentid-flags, as stored
