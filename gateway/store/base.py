"""The Postgres pool and its plumbing, under every group of statements of `Store`.

Owns the asyncpg pool: opening and closing it, each connection's setup, running a
function on a pooled connection (`_run`; `run` for tests and tools with SQL of their
own), transactions bounded by the statement timeout. asyncpg and socket errors are
translated here into StoreUnavailable (DatabaseBusy when no connection comes free in
time); nothing above the store modules sees a driver exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NoReturn, TypeAlias, TypeVar

import asyncpg
import orjson

from ..admission import Admission, LineLoad
from ..errors import DatabaseBusy, StoreUnavailable
from ..logs import Throttle
from ..metrics import Metrics
from ..refusals import Refusals, held_back
from .hosts import Hosts
from .migrate import schema_is_current
from .sql import base as sql

# Records of the credential tables (credentials.py); task rows go up as TaskRow.
Row: TypeAlias = asyncpg.Record
# What the driver raises when Postgres is unreachable, slow or refuses a statement;
# translated into StoreUnavailable in the store modules and nowhere else. A pooled
# connection whose server process was terminated (Postgres stopping or restarting,
# pg_terminate_backend) may fail its next statement with InternalClientError.
DRIVER_ERRORS = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    TimeoutError,
)
T = TypeVar("T")
UNAVAILABLE = "the database failed or could not be reached; the error is in the gateway's log"
# What a transaction pooler (PgBouncer, pool_mode = transaction) does to asyncpg's named
# prepared statements: each lives on one server connection, and the next transaction
# may run on another.
PREPARED_STATEMENT_ERRORS = (
    asyncpg.InvalidSQLStatementNameError,
    asyncpg.DuplicatePreparedStatementError,
)
# The logger of every store module, named after Store's module: log settings (and
# tests) select it by that name.
log = logging.getLogger("gateway.store")


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb goes in as JSON text (already serialized and checked) and comes out as the
    # text Postgres wrote, embedded in answers verbatim: never re-parsed, so numbers
    # stay exact and no stored value can fail to serialize.
    await conn.set_type_codec(
        "jsonb", encoder=lambda text: text, decoder=orjson.Fragment, schema="pg_catalog"
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset for a returned connection, beyond asyncpg's own (which rolls
    back a transaction left open): nothing. Pooled connections carry no session state
    (no session SET, LISTEN, cursor or advisory lock: those live on connections of
    their own), so the driver's default reset query would cost a round trip on every
    request and, through a shared PgBouncer, release other clients' advisory locks."""


class StoreBase:
    """The pool and what runs statements on it; the groups of statements (the other
    modules of this package) build on it and `Store` (__init__.py) is all of them in one
    object."""

    def __init__(
        self,
        dsn: str,
        metrics: Metrics,
        *,
        min_size: int = 2,
        max_size: int = 20,
        statement_timeout_ms: int = 10_000,
        statement_cache_size: int = 100,
        lock_dsn: str | None = None,
        acquire_timeout_ms: int = 5_000,
        queue_budget_ms: float = 250.0,
        connect_timeout_ms: int = 2_000,
    ) -> None:
        self._dsn = dsn
        # Every connection this process opens walks its URL's hosts, each within
        # connect_timeout_ms (hosts.py); a URL of one host waits as long as a request
        # may wait for a connection. The lock URL (the janitor's and VACUUM's own
        # connections) shares the pool's memory of the host that last took a
        # connection when it is the same URL.
        alone = max(connect_timeout_ms, acquire_timeout_ms) / 1000
        self._hosts = Hosts(dsn, connect_timeout_ms / 1000, alone)
        self._lock_hosts = self._hosts
        if lock_dsn and lock_dsn != dsn:
            self._lock_hosts = Hosts(lock_dsn, connect_timeout_ms / 1000, alone)
        self._metrics = metrics
        self._min_size = min_size
        self._max_size = max_size
        self._statement_timeout_ms = statement_timeout_ms
        self._statement_cache_size = statement_cache_size
        self._acquire_timeout_ms = acquire_timeout_ms
        # The line for a connection (gateway/admission.py): at most max_size hold one.
        self._admission = Admission(max_size, queue_budget_ms, acquire_timeout_ms, metrics)
        self._busy_warning = Throttle()  # the database is overloaded (_log_busy)
        self._begin = sql.BEGIN_WITH_TIMEOUT.format(timeout_ms=statement_timeout_ms)
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        # No statement_timeout among the startup parameters: PgBouncer refuses the
        # connection. A transaction sets it with SET LOCAL (`_transaction`); a statement
        # of its own is bounded by the driver's timeout, which cancels it on the server
        # (PgBouncer forwards the cancel to the server connection running it).
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn,
                connect=self._hosts.connect,
                min_size=self._min_size,
                max_size=self._max_size,
                init=_init_connection,
                reset=_keep_session,
                statement_cache_size=self._statement_cache_size,
                command_timeout=self._statement_timeout_ms / 1000,
                server_settings={"application_name": "claim-gateway"},
            )
        except DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"cannot connect to Postgres: {exc}") from exc

    async def close(self, timeout_seconds: float = 10.0) -> None:
        """Close the pool, waiting for borrowed connections at most `timeout_seconds`,
        then closing the rest by force, so that shutdown stays inside its grace period."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), timeout_seconds)
            except TimeoutError:
                pool.terminate()

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreUnavailable("the database pool is not open")
        return self._pool

    def connection_free(self) -> bool:
        """True when a request would get a connection without waiting for another to
        come back: one is idle, or the pool may open another. A hint, not a promise."""
        pool = self._pool
        if pool is None:
            return False
        idle: int = pool.get_idle_size()
        return idle > 0 or pool.get_size() < pool.get_max_size()

    def crowded(self) -> bool:
        """True when work (an enqueue, a claim, a read) arriving now would be shed
        (gateway/admission.py): a hint, for the claim pump to keep the completes a claim
        carries apart from a claim that would be refused."""
        return self._admission.crowded()

    def line_load(self) -> LineLoad:
        """How full the line for a connection is now (gateway/admission.py)."""
        return self._admission.load()

    def recent_refusals(self) -> Refusals:
        """The requests refused before any work, per reason, over the last minutes."""
        return self._admission.refusals

    def refusal(self) -> DatabaseBusy:
        """What work refused for the line's length is answered (gateway/admission.py)."""
        return self._admission.refusal()

    def client_gone(self, claims: int) -> None:
        """Count claims not claimed for because their client left while they waited
        for a claim slot (gateway/claim/pump.py), as work whose client left is."""
        self._admission.shed("client_gone", claims)

    def shed(self) -> None:
        """Count a request of work refused, for the line's length, before it reached
        the database (gateway/http/shedding.py)."""
        self._admission.shed("database_queue")
        self._log_busy()

    def shed_busy(self) -> None:
        """Count a claim refused before any work because this instance had too many
        requests at work (gateway/in_flight.py; the gateway logs it)."""
        self._admission.shed("busy")

    async def _run(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        pool = self.pool
        try:
            # Bounded: work that would wait past its share of the line, or any request
            # that no connection came free for in time, is refused with Retry-After
            # instead of queueing without end behind the others; work whose client left
            # meanwhile is not started (gateway/admission.py).
            granted = await self._admission.acquire()
        except DatabaseBusy:
            self._log_busy()
            raise
        try:
            # At most max_size hold a slot, so a connection is idle or may be opened;
            # only opening one can take time (Postgres slow to accept).
            conn = await pool.acquire(timeout=self._acquire_timeout_ms / 1000)
        except TimeoutError:
            self._admission.release(granted)
            self._log_busy()
            raise self._admission.timed_out() from None
        except BaseException as exc:
            self._admission.release(granted)
            if isinstance(exc, DRIVER_ERRORS):
                self._driver_error(exc)
            raise
        try:
            # Opening a connection may have taken a while: work whose client left
            # meanwhile is not started either.
            self._admission.check_caller()
            return await fn(conn)
        except DRIVER_ERRORS as exc:
            self._driver_error(exc)
        finally:
            try:
                await pool.release(conn)
            finally:
                self._admission.release(granted)

    def _log_busy(self) -> None:
        """One warning per 10 s at most: under overload every request would log one."""
        refused = self._busy_warning.due()
        if refused is None:
            return
        log.warning(
            "the database is overloaded: requests are refused with 503 database_busy and "
            "Retry-After, where every connection (GATEWAY_DB_POOL_MAX) stayed busy for %d "
            "ms or the line for one held more than GATEWAY_DB_QUEUE_BUDGET_MS of work%s",
            self._acquire_timeout_ms,
            held_back(refused),
        )

    def _driver_error(self, exc: BaseException) -> NoReturn:
        # The driver's text can name hosts, databases, or other callers' values (a
        # batched claim's worker ids): it goes to the log, never to the client.
        log.warning("database error: %s: %s", type(exc).__name__, exc)
        if isinstance(exc, PREPARED_STATEMENT_ERRORS) and self._statement_cache_size:
            log.error(
                "prepared statements are lost between transactions: DATABASE_URL "
                "goes through a transaction pooler; set GATEWAY_DB_STATEMENT_CACHE_SIZE=0"
            )
        raise StoreUnavailable(UNAVAILABLE) from exc

    @contextlib.asynccontextmanager
    async def _transaction(self, conn: asyncpg.Connection) -> AsyncIterator[None]:
        """A transaction whose statements stop after the statement timeout. Its BEGIN
        carries the SET LOCAL, so it costs no more round trips than asyncpg's own."""
        await conn.execute(self._begin)
        try:
            yield
        except BaseException:
            # Also on cancellation: a connection back in the pool must not be left
            # inside a transaction. If even the ROLLBACK fails, the pool's reset on
            # release rolls back or discards the connection.
            with contextlib.suppress(*DRIVER_ERRORS):
                await conn.execute(sql.ROLLBACK)
            raise
        await conn.execute(sql.COMMIT)

    async def run(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run `fn` on a pooled connection, for tests and tools that run SQL of their
        own: the gateway's statements are methods of Store's groups. Driver errors become
        StoreUnavailable, as here; a GatewayError that `fn` raises passes through
        unchanged."""
        return await self._run(fn)

    async def schema_is_current(self) -> bool:
        """True when every migration file has been applied (for readiness)."""
        return await self._run(schema_is_current)
