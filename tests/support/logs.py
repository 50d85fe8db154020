"""Capturing the gateway's and uvicorn's log records in a test."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

# uvicorn's loggers do not propagate to the root logger (its logging config), so
# pytest's caplog would miss what they write.
SERVER_LOGGERS = ("gateway", "uvicorn", "uvicorn.error")


class Records(logging.Handler):
    """Every record it is handed, in order."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self) -> list[str]:
        """Messages of records at ERROR or above, or carrying a traceback."""
        return [r.getMessage() for r in self.records if r.levelno >= logging.ERROR or r.exc_info]


@contextlib.contextmanager
def server_records() -> Iterator[Records]:
    """Records of the gateway's and uvicorn's loggers while the block runs."""
    handler = Records()
    loggers = [logging.getLogger(name) for name in SERVER_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
