"""Log lines: text for people, JSON for collectors (GATEWAY_LOG_FORMAT), and the
request id that ties a request's lines together.

The request id lives in a contextvar set by `RequestLog` (gateway/http/access.py) for the
task that serves the request, so every line written while serving it carries the id,
whatever logger writes it. Background tasks started from a request copy its context:
they call `detach()` first, so that their lines carry no request's id.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import sys
import traceback
from datetime import UTC, datetime
from typing import Any

import orjson

from .settings import LOG_FORMATS

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "gateway_request_id", default=None
)

# A client's X-Request-ID is kept when it is short and plain: it goes into every log
# line of its request, so it must not be able to forge fields or fill the disk.
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# uvicorn passes a copy of its message with terminal colour codes: not for a collector.
_DROPPED = frozenset({"color_message"})


def request_id_from(header: bytes | str | None) -> str:
    """The client's X-Request-ID when sane, else a fresh one (32 hex digits)."""
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    if header and _SANE_REQUEST_ID.fullmatch(header):
        return header
    # 128 random bits, as uuid4's hex but without building a UUID: on every request.
    return os.urandom(16).hex()


def detach() -> None:
    """Forget the request id in the current context: for a background task that was
    started while serving a request but works for others too."""
    REQUEST_ID.set(None)


def _rfc3339(created: float) -> str:
    """A record's time as RFC 3339 UTC with microseconds, as the API writes times."""
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, request_id (while
    serving a request), exception (its traceback, when there is one), and any fields
    passed with `extra=` (the access log's method, route, status, duration_ms)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id:
            line["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and key not in _DROPPED and key not in line:
                line[key] = value
        if record.exc_info:
            line["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """The human format, with ` request_id=...` appended while serving a request."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if not request_id:
            return text
        first, newline, rest = text.partition("\n")  # keep a traceback below the line
        return f"{first} request_id={request_id}{newline}{rest}"


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure(log_format: str, level: str) -> None:
    """Send every logger's records, uvicorn's included, to one stderr handler in this
    format. uvicorn must then be started with log_config=None, so that it keeps its
    loggers propagating here instead of installing handlers of its own."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.propagate = True
    logging.captureWarnings(True)  # warnings.warn() would print plain text to stderr
    if log_format == "json":
        sys.excepthook = _log_uncaught  # a crash's traceback is one JSON line too


def _log_uncaught(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    logging.getLogger("gateway").critical("uncaught exception", exc_info=(kind, value, tb))


def format_from_env(value: str | None) -> str:
    """GATEWAY_LOG_FORMAT for setting up logging before the settings are validated: an
    unknown value logs as text until Settings.from_env refuses it."""
    value = (value or "").strip().lower()
    return value if value in LOG_FORMATS else "text"
