"""Log formats, request ids and the settings that choose them (gateway/logs.py)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import orjson
import pytest

from gateway import logs
from gateway.errors import ConfigError
from gateway.http import access
from gateway.http.access import status_class
from gateway.metrics import Metrics, wait_buckets
from gateway.refusals import held_back
from gateway.settings import Settings

TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def record(message: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("gateway.test", logging.WARNING, __file__, 1, message, args, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_a_json_line_has_the_documented_fields() -> None:
    line = orjson.loads(logs.JsonFormatter().format(record("hello %s", "there")))
    assert TIME_RE.match(line.pop("time"))
    assert line == {"level": "WARNING", "logger": "gateway.test", "message": "hello there"}


def test_a_json_line_carries_the_request_id_and_extra_fields() -> None:
    token = logs.REQUEST_ID.set("abc-123")
    try:
        line = orjson.loads(logs.JsonFormatter().format(record(route="/healthz", status=200)))
    finally:
        logs.REQUEST_ID.reset(token)
    assert line["request_id"] == "abc-123"
    assert (line["route"], line["status"]) == ("/healthz", 200)


def test_a_json_line_holds_the_exception_on_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        rec = record()
        rec.exc_info = sys.exc_info()
    text = logs.JsonFormatter().format(rec)
    assert "\n" not in text
    line = orjson.loads(text)
    assert "Traceback" in line["exception"] and "ValueError: boom" in line["exception"]


def test_uvicorns_coloured_copy_of_a_message_is_dropped() -> None:
    line = orjson.loads(logs.JsonFormatter().format(record(color_message="\x1b[36mhi")))
    assert "color_message" not in line


def test_a_text_line_ends_with_the_request_id_while_serving() -> None:
    assert "request_id" not in logs.TextFormatter().format(record())
    token = logs.REQUEST_ID.set("r1")
    try:
        assert logs.TextFormatter().format(record()).endswith("hello %s request_id=r1")
    finally:
        logs.REQUEST_ID.reset(token)


@pytest.mark.parametrize("sent", ["abc", "A.b_c:d-9", "x" * 128, b"from-bytes"])
def test_a_sane_request_id_is_kept(sent: str | bytes) -> None:
    expected = sent.decode() if isinstance(sent, bytes) else sent
    assert logs.request_id_from(sent) == expected


@pytest.mark.parametrize("sent", [None, "", "x" * 129, "has space", 'q"uote', "a\nb", "é"])
def test_anything_else_gets_a_fresh_request_id(sent: str | None) -> None:
    made = logs.request_id_from(sent)
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    assert made != logs.request_id_from(sent)


def test_detach_forgets_the_request_id() -> None:
    token = logs.REQUEST_ID.set("r1")
    try:
        logs.detach()
        assert logs.REQUEST_ID.get() is None
    finally:
        logs.REQUEST_ID.reset(token)


def test_log_format_defaults_to_text_and_is_validated() -> None:
    base = {"GATEWAY_AUTH": "off"}
    assert Settings.from_env(base).log_format == "text"
    assert Settings.from_env({**base, "GATEWAY_LOG_FORMAT": "JSON"}).log_format == "json"
    with pytest.raises(ConfigError, match="GATEWAY_LOG_FORMAT"):
        Settings.from_env({**base, "GATEWAY_LOG_FORMAT": "yaml"})
    assert logs.format_from_env("yaml") == "text"
    assert logs.format_from_env(" json ") == "json"


def test_long_poll_buckets_run_past_the_maximum_wait() -> None:
    for cap in (0.0, 1.0, 60.0, 3600.0):
        buckets = wait_buckets(cap)
        assert list(buckets) == sorted(set(buckets))
        assert max(cap, 0.01) in buckets and buckets[-1] > max(cap, 0.01)


@pytest.mark.parametrize(
    ("status", "label"), [(200, "2xx"), (201, "2xx"), (404, "4xx"), (499, "4xx"), (503, "5xx")]
)
def test_status_classes(status: int, label: str) -> None:
    assert status_class(status) == label


def test_in_json_warnings_and_a_crash_are_json_lines_too() -> None:
    code = (
        "import warnings; from gateway.logs import configure; configure('json', 'info'); "
        "warnings.warn('careful'); raise ValueError('crashed')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    lines = [orjson.loads(line) for line in done.stderr.splitlines()]
    assert [line["level"] for line in lines] == ["WARNING", "CRITICAL"]
    assert "ValueError: crashed" in lines[1]["exception"]


class Kept(logging.Handler):
    """Every record it is handed, with the thread that handed it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[logging.LogRecord, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record, threading.current_thread().name))


@pytest.fixture
def queued() -> Iterator[tuple[logs.LineQueue, Kept]]:
    """A LineQueue of at most 3 lines on a logger of its own, whose parent keeps the
    records (as a test's handler on `gateway` keeps the access log's)."""
    parent = logging.getLogger("test.linequeue")
    parent.propagate = False
    kept = Kept()
    parent.addHandler(kept)
    logger = logging.getLogger("test.linequeue.access")
    logger.setLevel(logging.INFO)
    try:
        yield logs.LineQueue(logger, 3, interval_seconds=60), kept
    finally:
        parent.removeHandler(kept)


def test_a_queued_line_is_the_record_logging_makes() -> None:
    logger = logging.getLogger("test.linequeue.same")
    direct = logger.makeRecord(
        logger.name, logging.INFO, "f", 1, "%s %d", ("GET", 200), None, extra={"route": "/x"}
    )
    queue = logs.LineQueue(logger, 10)
    made = queue._record(direct.created, logging.INFO, "%s %d", ("GET", 200), {"route": "/x"})
    for formatter in (logs.TextFormatter(), logs.JsonFormatter()):
        assert formatter.format(made) == formatter.format(direct)
    assert (made.levelname, made.route, made.msecs) == ("INFO", "/x", direct.msecs)  # type: ignore[attr-defined]


def test_the_thread_writes_the_lines_and_stop_flushes_them(
    queued: tuple[logs.LineQueue, Kept],
) -> None:
    queue, kept = queued
    assert queue.submit(logging.INFO, "at once %d", (1,), {})  # not started: written here
    assert kept.seen[0][1] == threading.current_thread().name
    queue.start()
    queue.start()  # a second app in the process
    assert queue.submit(logging.INFO, "line %d", (2,), {"status": 200})
    assert queue.submit(logging.INFO, "line %d", (3,), {})
    assert queue.submit(logging.INFO, "line %d", (4,), {})
    assert not queue.submit(logging.INFO, "line %d", (5,), {})  # full: dropped
    assert len(kept.seen) == 1  # the thread waits its interval (a minute here)
    queue.stop()
    assert queue.running  # the other app still runs
    queue.stop()  # the last: every waiting line is written before it returns
    assert not queue.running
    assert [r.getMessage() for r, _ in kept.seen] == ["at once 1", "line 2", "line 3", "line 4"]
    assert {thread for _, thread in kept.seen[1:]} == {"log-lines test.linequeue.access"}
    assert kept.seen[1][0].status == 200  # type: ignore[attr-defined]


def test_the_text_time_is_logging_s_own() -> None:
    plain = logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    ours = logs.TextFormatter()
    for created in (1_700_000_000.0, 1_700_000_000.9996, 1_700_000_001.5, 1_700_000_001.25):
        rec = record()
        rec.created, rec.msecs = created, int((created - int(created)) * 1000) + 0.0
        assert ours.format(rec) == plain.format(rec)


def test_an_access_line_that_finds_the_queue_full_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logger = logging.getLogger("gateway.access")
    monkeypatch.setattr(logger, "level", logging.INFO)
    full = logs.LineQueue(logger, 0, interval_seconds=60)  # room for no line
    monkeypatch.setattr(access, "LINES", full)
    metrics = Metrics()
    full.start()
    try:
        access.access_line(metrics, "GET", "/healthz", 200, 0.001, "id-1")
    finally:
        full.stop()
    dropped = metrics.registry.get_sample_value("gateway_log_lines_dropped_total")
    assert dropped == 1
    assert (
        metrics.registry.get_sample_value(
            "gateway_http_requests_total",
            {"route": "/healthz", "method": "GET", "status_class": "2xx"},
        )
        == 1
    )


def test_a_start_right_after_a_stop_leaves_one_writer_and_the_old_one_ends() -> None:
    """stop() on one thread while the writer is busy, then start() on another: the old
    writer must still see its stop signal (a shared one, cleared by the start, kept it
    running beside the new one, and stop() waited out its whole timeout)."""
    writing, go_on = threading.Event(), threading.Event()

    class Slow(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            writing.set()
            go_on.wait(10)

    logger = logging.getLogger("test.line-queue.restart")
    logger.propagate = False
    logger.addHandler(Slow())
    logger.setLevel(logging.INFO)
    queue = logs.LineQueue(logger, 10, interval_seconds=0.01)
    queue.start()
    old = queue._thread
    assert old is not None
    queue.submit(logging.INFO, "one line", (), {})
    assert writing.wait(10), "the writer never took the line"
    stopper = threading.Thread(target=queue.stop, kwargs={"timeout_seconds": 3})
    stopper.start()
    while queue.running:  # stop() has handed the old writer its signal
        time.sleep(0.01)
    queue.start()
    go_on.set()
    stopper.join(10)
    assert not old.is_alive(), "the old writer kept running after its stop"
    new = queue._thread
    assert new is not None and new is not old and new.is_alive()
    queue.stop()
    assert not new.is_alive()


# Times around the edges: a second's last microsecond (JSON rounds it up into the next
# second), its last millisecond (text truncates), a whole second.
EDGE_TIMES = (1_700_000_000.0, 1_700_000_000.9999996, 1_700_000_000.9996, 1_700_000_001.25)


@pytest.mark.parametrize("formatter", [logs.TextFormatter(), logs.JsonFormatter()], ids=type)
@pytest.mark.parametrize("created", EDGE_TIMES)
@pytest.mark.parametrize(
    ("msg", "args", "extra"),
    [
        (access.ACCESS_FORMAT, ("GET", "/healthz", 200, 1.234), {"status": 200, "request_id": "r"}),
        ("two\nlines %s", ("here",), {"request_id": "r2", "color_message": "dropped"}),
        ("no arguments", (), {}),
    ],
)
def test_a_line_written_without_a_record_reads_as_the_record_s(
    formatter: logs.TextFormatter | logs.JsonFormatter,
    created: float,
    msg: str,
    args: tuple[object, ...],
    extra: dict[str, object],
) -> None:
    queue = logs.LineQueue(logging.getLogger("gateway.access"), 10)
    made = queue._record(created, logging.INFO, msg, args, extra)
    for _ in range(2):  # the second time from the formatters' cached second
        direct = formatter.format_line(created, "INFO", "gateway.access", msg % args, extra)
        assert direct == formatter.format(made)


class Listening(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def filter(self, record: logging.LogRecord) -> bool:
        self.seen += 1
        return True


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_writer_formats_lines_itself_only_while_nothing_else_could_see_them(
    log_format: str,
) -> None:
    """With logging as `configure` sets it up, the writer thread makes no record; a
    filter (or another handler) anywhere on the way gets records again, and the lines
    read the same either way."""
    import io

    parent = logging.getLogger(f"test.plainpath-{log_format}")
    parent.propagate = False
    handler = logs.StderrHandler()
    stream = io.StringIO()
    handler.setStream(stream)
    handler.setFormatter(logs.formatter(log_format))
    parent.addHandler(handler)
    logger = logging.getLogger(f"test.plainpath-{log_format}.access")
    queue = logs.LineQueue(logger, 10)
    queue._thread = threading.current_thread()  # as if started: lines wait for _write_waiting
    try:
        assert queue._plain_path() == (handler, handler.formatter)
        queue.submit(logging.INFO, "%s %d", ("GET", 200), {"request_id": "r1"})
        queue._write_waiting()
        plain = stream.getvalue()
        listening = Listening()
        logger.addFilter(listening)
        assert queue._plain_path() is None
        queue.submit(logging.INFO, "%s %d", ("GET", 200), {"request_id": "r1"})
        queue._write_waiting()
        assert listening.seen == 1
        recorded = stream.getvalue()[len(plain) :]
        assert "GET 200" in plain and "r1" in plain
        # The same line but for its time (each line is stamped when it is submitted).
        assert plain.split("GET", 1)[1] == recorded.split("GET", 1)[1]
    finally:
        queue._thread = None
        parent.removeHandler(handler)
        logger.filters.clear()


def test_the_writer_thread_runs_only_while_the_access_log_is_on() -> None:
    """With the access log off no line is queued: no thread wakes to find none (each
    wake takes the interpreter lock from the event loop). A start is counted either way,
    so that the stops match."""
    logger = logging.getLogger("gateway.access")
    level = logger.level
    try:
        logger.setLevel(logging.WARNING)  # gateway serve --no-access-log
        access.start_writer()
        try:
            assert not access.LINES.running
        finally:
            access.stop_writer()
        logger.setLevel(logging.INFO)
        access.start_writer()
        try:
            assert access.LINES.running
        finally:
            access.stop_writer()
        assert not access.LINES.running
    finally:
        logger.setLevel(level)


def test_every_error_and_slow_request_gets_its_line_and_a_share_of_the_rest() -> None:
    sampler = access.Sampler(0.1)
    fast_ok = [sampler.keeps(200, 0.001) for _ in range(100)]
    assert fast_ok.count(True) == 10 and fast_ok[9] and not fast_ok[0]  # every tenth
    for status in (400, 404, 408, 409, 431, 499, 500, 503):
        assert all(sampler.keeps(status, 0.001) for _ in range(20)), status
    assert all(sampler.keeps(200, access.SLOW_SECONDS) for _ in range(20))  # a long poll too
    assert not any(access.Sampler(0.0).keeps(204, 0.5) for _ in range(100))
    assert all(access.Sampler(1.0).keeps(200, 0.001) for _ in range(100))


def test_a_request_left_out_of_the_access_log_is_still_counted() -> None:
    queue = logs.LineQueue(logging.getLogger("gateway.access"), 100, interval_seconds=60)
    queue._thread = threading.current_thread()  # as if started: lines wait in the queue
    logger = logging.getLogger("gateway.access")
    level = logger.level
    logger.setLevel(logging.INFO)
    original, access.LINES = access.LINES, queue
    metrics = Metrics()
    try:
        sampler = access.Sampler(0.5)
        for status in (200, 200, 200, 200, 500):
            access.access_line(metrics, "GET", "/healthz", status, 0.001, "id", sampler)
    finally:
        access.LINES = original
        queue._thread = None
        logger.setLevel(level)
    assert [args[2] for _, _, _, args, _ in queue._lines] == [200, 200, 500]
    counted = metrics.registry.get_sample_value(
        "gateway_http_requests_total", {"route": "/healthz", "method": "GET", "status_class": "2xx"}
    )
    assert counted == 4


def test_the_access_log_sample_defaults_to_a_tenth_and_one_logs_every_request() -> None:
    base = {"GATEWAY_AUTH": "off"}
    assert Settings.from_env(base).access_log_sample == 0.1
    assert Settings.from_env({**base, "GATEWAY_ACCESS_LOG_SAMPLE": "1"}).access_log_sample == 1.0
    with pytest.raises(ConfigError, match="GATEWAY_ACCESS_LOG_SAMPLE"):
        Settings.from_env({**base, "GATEWAY_ACCESS_LOG_SAMPLE": "2"})


# logs.Throttle: a warning that every request of a flood would repeat.
def test_a_throttled_warning_is_due_once_per_interval_with_the_count_held_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: now[0])
    throttle = logs.Throttle(10.0)
    assert throttle.due() == 0  # the first is due at once
    for _ in range(3):
        now[0] += 3.0
        assert throttle.due() is None
    now[0] += 1.0  # 10 s after the first
    assert throttle.due() == 3
    now[0] += 9.9
    assert throttle.due() is None
    now[0] += 0.1
    assert throttle.due() == 1


def test_a_throttled_warning_says_how_many_were_refused_since_the_last_only_when_any_were() -> None:
    assert held_back(0) == ""  # the first warning: there was no last one
    assert held_back(20948) == " (20948 more refused since the last warning)"
