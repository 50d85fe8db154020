"""claim-gateway's Python client: `AsyncClient` (every endpoint), `Client` (the same,
blocking), and `Worker` (the daemon loop). It needs aiohttp and nothing of the server."""

from .backoff import Backoff
from .client import AsyncClient, config_from_env
from .errors import (
    AlreadyExists,
    BadRequest,
    CacheUnavailable,
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
)
from .failure import TaskFailed
from .models import (
    KEEP,
    Beat,
    Completion,
    Controls,
    Failure,
    ItemOutcome,
    NewTask,
    Page,
    RuntimePage,
    RuntimeSummary,
    Stats,
    Task,
)
from .sync import Client
from .worker import Outcome, Worker, WorkerOptions

__version__ = "0.1.0"

__all__ = [
    "KEEP",
    "AlreadyExists",
    "AsyncClient",
    "Backoff",
    "BadRequest",
    "Beat",
    "CacheUnavailable",
    "Client",
    "Completion",
    "Controls",
    "Draining",
    "Failure",
    "Forbidden",
    "GatewayError",
    "IdempotencyKeyReused",
    "InvalidState",
    "ItemOutcome",
    "LeaseLost",
    "NewTask",
    "NotFound",
    "Outcome",
    "Overloaded",
    "Page",
    "PayloadTooLarge",
    "RuntimePage",
    "RuntimeSummary",
    "ServerError",
    "Stats",
    "StoreUnavailable",
    "Task",
    "TaskFailed",
    "TransportError",
    "Unauthorized",
    "ValidationFailed",
    "Worker",
    "WorkerOptions",
    "config_from_env",
]
