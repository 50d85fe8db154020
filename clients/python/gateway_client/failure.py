"""How a handler's failure reaches the gateway: `TaskFailed` for a text of the handler's
choosing, else the exception's type, message and the end of its traceback."""

from __future__ import annotations

import traceback

# The gateway keeps 10,000 characters of an error; a tail of the traceback is enough.
ERROR_CHARS = 4000
GATEWAY_ERROR_CHARS = 10_000


class TaskFailed(Exception):
    """Raised by a handler to fail its task with exactly this error text (no traceback);
    `retry=False` sends it to `dead` at once."""

    def __init__(
        self, error: str, *, retry: bool = True, retry_after_seconds: float | None = None
    ) -> None:
        super().__init__(error)
        self.error = error
        self.retry = retry
        self.retry_after_seconds = retry_after_seconds


def format_error(exc: BaseException, limit: int = ERROR_CHARS) -> str:
    """`Type: message`, then the end of the traceback, within `limit` characters."""
    if isinstance(exc, TaskFailed):  # the handler chose its text: keep its head
        return exc.error[:GATEWAY_ERROR_CHARS]
    head = f"{type(exc).__qualname__}: {exc}"[: limit // 2]
    trace = "".join(traceback.format_exception(exc))
    room = limit - len(head) - 1
    return head + "\n" + trace[-room:] if room > 0 else head
