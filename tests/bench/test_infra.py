"""The bench measures the gateway as it ships (`gateway serve`), and compares worker
counts on one server command line."""

from __future__ import annotations

from pathlib import Path

from bench.infra import GatewayProcess
from gateway.cli.main import build_parser


def _process(**more: object) -> GatewayProcess:
    return GatewayProcess("postgresql://db", "redis://r", True, Path("gw.log"), **more)  # type: ignore[arg-type]


def test_the_gateway_runs_as_gateway_serve() -> None:
    proc = _process(port=12345)
    argv = proc.argv()
    assert "uvicorn" not in argv
    assert argv[1:3] == ["-c", "from gateway.cli.main import main; main()"]
    # The arguments are ones `gateway` itself accepts.
    args = build_parser().parse_args(argv[3:])
    assert args.func.__name__ == "cmd_serve"
    assert (args.host, args.port) == ("127.0.0.1", 12345)
    assert args.access_log is False
    assert args.log_level == "warning"


def test_the_access_log_variant_runs_as_gateway_serve_starts_by_default() -> None:
    argv = _process(log_level="info", access_log=True).argv()
    args = build_parser().parse_args(argv[3:])
    assert args.access_log is True
    assert args.log_level == build_parser().parse_args(["serve"]).log_level == "info"


def test_worker_counts_and_peers_run_under_uvicorns_command_line() -> None:
    for proc in (_process(workers=1), _process(workers=2), _process(app="bench.floor:create_app")):
        argv = proc.argv()
        assert argv[1:3] == ["-m", "uvicorn"]
        assert ("--workers" in argv) == (proc.workers > 1)
        # Like the gateway's own server: no proxy-headers middleware in front.
        assert "--no-proxy-headers" in argv and "--no-access-log" in argv
