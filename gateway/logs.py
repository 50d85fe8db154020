"""Log lines: text for people, JSON for collectors (GATEWAY_LOG_FORMAT), the request
id that ties a request's lines together, and the queue that writes a busy logger's
lines (the access log's) off the event loop.

The request id lives in a contextvar set by `RequestLog` (gateway/http/access.py) for the
task that serves the request, so every line written while serving it carries the id,
whatever logger writes it. Background tasks started from a request copy its context:
they call `detach()` first, so that their lines carry no request's id.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import random
import re
import sys
import threading
import time
import traceback
from datetime import UTC, datetime
from typing import Any

import orjson

from . import tracing
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


class Throttle:
    """A warning that every request of a flood would repeat, let through at most once
    per `interval_seconds` (monotonic), counting the times it was held back meanwhile.
    """

    __slots__ = ("_held", "_interval", "_last")

    def __init__(self, interval_seconds: float = 10.0) -> None:
        self._interval = interval_seconds
        self._last = float("-inf")
        self._held = 0

    def due(self) -> int | None:
        """When the warning is due now: how many times it was held back since it was
        last due (and the clock restarts); otherwise None, and one more held back."""
        now = time.monotonic()
        if now - self._last < self._interval:
            self._held += 1
            return None
        held, self._last, self._held = self._held, now, 0
        return held


def request_id_from(header: bytes | str | None) -> str:
    """The client's X-Request-ID when sane, else a fresh one (32 hex digits)."""
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    if header and _SANE_REQUEST_ID.fullmatch(header):
        return header
    # 128 random bits, as uuid4's hex but without building a UUID: on every request.
    # From the random module, not os.urandom: an id need not be unpredictable, and
    # os.urandom lets go of the interpreter lock for its system call, which on every
    # request handed the lock to the access log's writer thread whenever it waited for
    # it. The module's generator is seeded again in a forked child.
    return f"{random.getrandbits(128):032x}"


def detach() -> None:
    """Forget the request id in the current context: for a background task that was
    started while serving a request but works for others too."""
    REQUEST_ID.set(None)


def _rfc3339(created: float) -> str:
    """A record's time as RFC 3339 UTC with microseconds, as the API writes times."""
    global _RFC3339_SECOND
    moment = datetime.fromtimestamp(created, UTC)
    micro = moment.microsecond
    second = moment.replace(microsecond=0) if micro else moment
    known, text = _RFC3339_SECOND
    if known != second:
        # strftime is most of the time a line takes: done once a second. One tuple,
        # replaced whole, so that two threads formatting at once never mix them.
        text = second.strftime("%Y-%m-%dT%H:%M:%S")
        _RFC3339_SECOND = (second, text)
    return f"{text}.{micro:06d}Z"


# The last second _rfc3339 wrote, and its text.
_RFC3339_SECOND: tuple[datetime | None, str] = (None, "")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, request_id (while
    serving a request), trace_id and span_id (while tracing is on, inside a span: the
    request's server span, or a span made for it), exception (its traceback, when there
    is one), and any fields passed with `extra=` (the access log's method, route,
    status, duration_ms, and its request's trace_id and span_id, taken when the line
    was queued: its thread runs in no request's context)."""

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
        spans = tracing.active
        if spans is not None and not hasattr(record, "trace_id"):
            ids = spans.current_ids()
            if ids is not None:
                line["trace_id"], line["span_id"] = ids
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

    def format_line(
        self, created: float, levelname: str, name: str, message: str, extra: dict[str, Any]
    ) -> str:
        """What `format` writes for a record of these values, made by LineQueue
        (`extra` holds no record attribute, the record no exception), without making
        the record."""
        line: dict[str, Any] = {
            "time": _rfc3339(created),
            "level": levelname,
            "logger": name,
            "message": message,
        }
        request_id = extra.get("request_id") or REQUEST_ID.get()
        if request_id:
            line["request_id"] = request_id
        for key, value in extra.items():
            if key not in _DROPPED and key not in line:
                line[key] = value
        return orjson.dumps(line, default=str).decode()


TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """The human format, with ` request_id=...` appended while serving a request."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        # The last second written, and its text: the access log writes thousands of
        # lines a second, and strftime is a third of a line's formatting. One tuple,
        # replaced whole, so that two threads formatting at once never mix them.
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """As logging.Formatter.formatTime writes it (local time, milliseconds)."""
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second, text = self._second
        if second != int(record.created):
            second = int(record.created)
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = (second, text)
        return f"{text},{int(record.msecs):03d}"  # default_msec_format, "%s,%03d"

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if not request_id:
            return text
        first, newline, rest = text.partition("\n")  # keep a traceback below the line
        return f"{first} request_id={request_id}{newline}{rest}"

    @property
    def plain(self) -> bool:
        """Whether this is the format the class sets up (format_line writes it): no
        format, date format or clock of a caller's own."""
        return (
            self._style._fmt == TEXT_FORMAT
            and type(self._style) is logging.PercentStyle
            and self.datefmt is None
            and self.converter is time.localtime
            and type(self).formatTime is TextFormatter.formatTime
        )

    def format_line(
        self, created: float, levelname: str, name: str, message: str, extra: dict[str, Any]
    ) -> str:
        """What `format` writes for a record of these values, made by LineQueue
        (`extra` holds no record attribute, the record no exception), without making
        the record; for a `plain` formatter only."""
        second, text = self._second
        if second != int(created):
            second = int(created)
            text = time.strftime(self.default_time_format, self.converter(created))
            self._second = (second, text)
        msecs = int((created - int(created)) * 1000)  # as LineQueue._record sets it
        line = f"{text},{msecs:03d} {levelname:<7} {name}: {message}"
        request_id = extra.get("request_id") or REQUEST_ID.get()
        if not request_id:
            return line
        first, newline, rest = line.partition("\n")
        return f"{first} request_id={request_id}{newline}{rest}"


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure(log_format: str, level: str) -> None:
    """Send every logger's records, uvicorn's included, to one stderr handler in this
    format. uvicorn must then be started with log_config=None, so that it keeps its
    loggers propagating here instead of installing handlers of its own."""
    handler = StderrHandler()
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


# The lines a LineQueue's thread has formatted for each StderrHandler during a batch,
# while it writes one; unset otherwise (and in every other thread).
_BATCH = threading.local()


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr, as `configure` sets it up. Lines a LineQueue's thread hands it during a
    batch are gathered and written together at the batch's end, with one write and
    one flush, instead of one each per line (a system call per line, and as many
    hand-overs of the interpreter lock to the event loop's thread and back); every
    other line is written at once."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        held: dict[StderrHandler, list[str]] | None = getattr(_BATCH, "held", None)
        if held is None:
            super().emit(record)
            return
        try:
            held.setdefault(self, []).append(self.format(record) + self.terminator)
        except Exception:
            self.handleError(record)

    def write_held(self, parts: list[str]) -> None:
        """Write a batch's lines, formatted by `emit`."""
        with self.lock or contextlib.nullcontext():
            try:
                self.stream.write("".join(parts))
                self.flush()
            except Exception:
                self.handleError(logging.makeLogRecord({"msg": "log lines lost"}))


# Lines a LineQueue's thread formats before it writes them out: a write per 1,000 lines
# (about 150 kB) rather than per line.
BATCH_LINES = 1000
# logging's own start time (LogRecord.relativeCreated counts from it).
_STARTED: float = getattr(logging, "_startTime", time.time())


class LineQueue:
    """One logger's lines, handed by the threads that serve requests to a thread of
    their own, which makes each record and passes it to the logger's handlers: the
    formatting, and the writes to stderr (which block while a slow reader leaves its
    pipe full), happen there, and serving waits for neither.

    `submit` takes the line's raw values (the message template, its arguments and its
    extra fields, all immutable) and the time; the record is made later with that
    time, so a line reads exactly as if it had been logged at once. Bounded: with
    `max_lines` waiting, a new line is dropped and `submit` answers False (the caller
    counts it), rather than memory growing or the event loop blocking. The thread
    wakes every `interval_seconds` and writes everything waiting.

    Between `start` and `stop` (counted: several apps in one process share the
    logger, and the thread runs while one of them does); outside them a line is
    logged at once, in the caller's thread, as logging does. `stop` writes every line
    still waiting before it returns."""

    def __init__(
        self, logger: logging.Logger, max_lines: int, interval_seconds: float = 0.05
    ) -> None:
        self.logger = logger
        self.max_lines = max_lines
        self.interval_seconds = interval_seconds
        # A deque's append and popleft are atomic: the serving threads append, the
        # writer takes from the other end, and neither takes a lock.
        self._lines: collections.deque[tuple[float, int, str, tuple[Any, ...], dict[str, Any]]]
        self._lines = collections.deque()
        self._lock = threading.Lock()  # start and stop
        self._users = 0
        self._thread: threading.Thread | None = None
        self._stopping: threading.Event | None = None  # the running thread's own
        self._template: dict[str, Any] | None = None  # _record's

    @property
    def running(self) -> bool:
        return self._thread is not None

    def submit(self, level: int, msg: str, args: tuple[Any, ...], extra: dict[str, Any]) -> bool:
        """Queue one line (logged at once when the thread is not running); False when
        the queue is full and the line was dropped."""
        if self._thread is None:
            self.logger.log(level, msg, *args, extra=extra)
            return True
        if len(self._lines) >= self.max_lines:
            return False
        self._lines.append((time.time(), level, msg, args, extra))
        return True

    def start(self, thread: bool = True) -> None:
        """Count one more user; start the thread unless `thread` is false (a user that
        will queue no line) or it runs already."""
        with self._lock:
            self._users += 1
            if thread and self._thread is None:
                # Each thread has a stop signal of its own: a start just after a stop
                # must not clear the signal the stopping thread has yet to see.
                self._stopping = threading.Event()
                self._thread = threading.Thread(
                    target=self._run,
                    args=(self._stopping,),
                    name=f"log-lines {self.logger.name}",
                    daemon=True,
                )
                self._thread.start()

    def stop(self, timeout_seconds: float = 5.0) -> None:
        """Stop after the last user; every waiting line is written first (for at most
        `timeout_seconds`, should stderr not be read)."""
        with self._lock:
            self._users = max(self._users - 1, 0)
            thread, stopping = self._thread, self._stopping
            if self._users or thread is None or stopping is None:
                return
            self._thread = self._stopping = None  # from here on, lines are logged at once
            stopping.set()
        thread.join(timeout_seconds)

    def _run(self, stop: threading.Event) -> None:
        while True:
            stopping = stop.wait(self.interval_seconds)
            self._write_waiting()
            if stopping:
                # A line submitted just before `stop` cleared the thread is in the deque.
                self._write_waiting()
                return

    def _write_waiting(self) -> None:
        """Every waiting line, handed to the logger's handlers BATCH_LINES at a time;
        or, when logging is set up as `configure` does it, formatted and written by
        this thread itself (`_plain_path`)."""
        lines, logger = self._lines, self.logger
        while lines:
            held: dict[StderrHandler, list[str]] = {}
            _BATCH.held = held
            try:
                plain = self._plain_path()
                for _ in range(min(len(lines), BATCH_LINES)):
                    line = lines.popleft()
                    if plain is None or not self._write_plain(plain, held, *line):
                        logger.handle(self._record(*line))
            finally:
                _BATCH.held = None
                for handler, parts in held.items():
                    handler.write_held(parts)

    def _plain_path(self) -> tuple[StderrHandler, TextFormatter | JsonFormatter] | None:
        """The handler every line of this logger goes to, and its formatter, when
        nothing else could see a record: the logger and its ancestors have no filter
        and no other handler, and the one handler is the StderrHandler `configure`
        installs, with no filter, and one of this module's formatters as it sets them
        up. Then a line needs no LogRecord: making one (and passing it through the
        logger, the handler and the formatter) took three quarters of the time this
        thread spent on an access line, which it spent holding the interpreter lock
        the event loop needs. None otherwise: each line is then a record, as logging
        would make it. Asked once per batch, so a change to logging applies from the
        next batch."""
        if self.logger.disabled or logging.getLogRecordFactory() is not logging.LogRecord:
            return None
        handlers: list[logging.Handler] = []
        node: logging.Logger | None = self.logger
        while node is not None:
            if node.filters:
                return None
            handlers.extend(node.handlers)
            if not node.propagate:
                break
            node = node.parent
        if len(handlers) != 1 or type(handlers[0]) is not StderrHandler or handlers[0].filters:
            return None
        handler = handlers[0]
        formatter = handler.formatter
        if type(formatter) is JsonFormatter or (
            type(formatter) is TextFormatter and formatter.plain
        ):
            return handler, formatter
        return None

    def _write_plain(
        self,
        plain: tuple[StderrHandler, TextFormatter | JsonFormatter],
        held: dict[StderrHandler, list[str]],
        created: float,
        level: int,
        msg: str,
        args: tuple[Any, ...],
        extra: dict[str, Any],
    ) -> bool:
        """Format one line as the record path would and hold it for the batch's write;
        False when this line must take the record path instead (its level is below the
        handler's, an extra field would replace a record's attribute, or its message
        does not format: logging reports that itself)."""
        handler, formatter = plain
        if level < handler.level or not _RECORD_ATTRS.isdisjoint(extra):
            return False
        try:
            message = msg % args if args else msg
        except Exception:
            return False
        text = formatter.format_line(
            created, logging.getLevelName(level), self.logger.name, message, extra
        )
        held.setdefault(handler, []).append(text + handler.terminator)
        return True

    def _record(
        self, created: float, level: int, msg: str, args: tuple[Any, ...], extra: dict[str, Any]
    ) -> logging.LogRecord:
        """The record logging would have made at `created`, in this thread.

        LogRecord's constructor asks for the thread, the process and the file's name
        again for every record: 4 us of the 9 this thread spends on a line. Those are
        the same for every line here, so each record starts as a copy of the first
        one's attributes (unless a program set a record factory of its own, which
        then makes every record)."""
        logger = self.logger
        if logging.getLogRecordFactory() is not logging.LogRecord:
            record = logger.makeRecord(
                logger.name, level, "(unknown file)", 0, msg, args, None, extra=extra
            )
        else:
            if self._template is None:
                made = logging.LogRecord(logger.name, level, "(unknown file)", 0, "", (), None)
                self._template = dict(vars(made))
            record = logging.LogRecord.__new__(logging.LogRecord)
            fields = record.__dict__
            fields.update(self._template)
            fields.update(extra)
            fields["levelno"] = level
            fields["levelname"] = logging.getLevelName(level)
            fields["msg"] = msg
            fields["args"] = args
        record.created = created  # LogRecord sets these three from the clock
        record.msecs = int((created - int(created)) * 1000) + 0.0
        record.relativeCreated = (created - _STARTED) * 1000
        return record
