"""pgqueuer runs from a virtual environment of its own, built with these command lines."""

from __future__ import annotations

from pathlib import Path

from bench.peers import DRIVER, PgqueuerVenv


def test_the_venv_is_made_apart_and_pgqueuer_installed_into_it_only(tmp_path: Path) -> None:
    venv = PgqueuerVenv(root=tmp_path / "pgq", version="1.6.0", base_python="/usr/bin/python3")
    make, install = venv.create_commands()
    assert make == ["/usr/bin/python3", "-m", "venv", str(tmp_path / "pgq")]
    # pip runs as the peer venv's interpreter, so nothing lands in the project's venv.
    assert install[:4] == [str(tmp_path / "pgq" / "bin" / "python"), "-m", "pip", "install"]
    assert "pgqueuer==1.6.0" in install
    assert venv.stamp.parent == tmp_path / "pgq"


def test_the_schema_is_installed_by_pgqueuers_own_cli(tmp_path: Path) -> None:
    venv = PgqueuerVenv(root=tmp_path / "pgq")
    assert venv.install_schema_command() == [
        str(tmp_path / "pgq" / "bin" / "python"),
        "-m",
        "pgqueuer",
        "install",
    ]


def test_the_driver_runs_in_the_peer_venv_with_every_size(tmp_path: Path) -> None:
    venv = PgqueuerVenv(root=tmp_path / "pgq")
    argv = venv.driver_command(
        "postgresql://u@127.0.0.1/db",
        jobs=20_000,
        enqueue_jobs=100_000,
        workers=16,
        batch_size=10,
        enqueue_batch=1000,
        latency_samples=200,
        timeout_seconds=60.0,
    )
    assert argv[:2] == [str(tmp_path / "pgq" / "bin" / "python"), str(DRIVER)]
    flags = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert flags == {
        "--dsn": "postgresql://u@127.0.0.1/db",
        "--jobs": "20000",
        "--enqueue-jobs": "100000",
        "--workers": "16",
        "--batch-size": "10",
        "--enqueue-batch": "1000",
        "--latency-samples": "200",
        "--timeout-seconds": "60",
    }
    assert DRIVER.exists()
