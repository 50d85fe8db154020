"""claim-gateway's Python client: `AsyncClient` (every endpoint), `Client` (the same,
blocking), and `Worker` (the daemon loop). It needs aiohttp and nothing of the server."""

from .backoff import Backoff
from .client import AsyncClient, config_from_env
from .errors import (
    AlreadyExists,
    BadRequest,
    CacheUnavailable,
    DatabaseBusy,
    Draining,
    Forbidden,
    GatewayError,
    IdempotencyKeyReused,
    InvalidState,
    LeaseLost,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    ServerError,
    StoreUnavailable,
    TransportError,
    Unauthorized,
    ValidationFailed,
    WaitTimedOut,
)
from .failure import TaskFailed
from .models import (
    KEEP,
    Beat,
    Claimed,
    Completion,
    Controls,
    Failure,
    ItemOutcome,
    ItemOutcomeKind,
    NewTask,
    Page,
    RuntimePage,
    RuntimeSummary,
    Stats,
    Task,
    TaskStatus,
)
from .options import WorkerOptions
from .runs import Outcome
from .schedules import Backfill, Schedule, ScheduleTick
from .sync import Client
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "KEEP",
    "AlreadyExists",
    "AsyncClient",
    "Backfill",
    "Backoff",
    "BadRequest",
    "Beat",
    "CacheUnavailable",
    "Claimed",
    "Client",
    "Completion",
    "Controls",
    "DatabaseBusy",
    "Draining",
    "Failure",
    "Forbidden",
    "GatewayError",
    "IdempotencyKeyReused",
    "InvalidState",
    "ItemOutcome",
    "ItemOutcomeKind",
    "LeaseLost",
    "NewTask",
    "NotFound",
    "Outcome",
    "Overloaded",
    "Page",
    "PayloadTooLarge",
    "RuntimePage",
    "RuntimeSummary",
    "Schedule",
    "ScheduleTick",
    "ServerError",
    "Stats",
    "StoreUnavailable",
    "Task",
    "TaskFailed",
    "TaskStatus",
    "TransportError",
    "Unauthorized",
    "ValidationFailed",
    "WaitTimedOut",
    "Worker",
    "WorkerOptions",
    "config_from_env",
]
