"""clients/python installs alone, into a fresh virtual environment, with its own
dependencies from the package index and none of the server's."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[1]
SERVER_ONLY = ("asyncpg", "redis", "starlette", "uvicorn", "gateway")
# Every client module imports, and none of the server's modules can be found.
CHECK = """
import importlib.util, sys
import gateway_client, gateway_client.cli, gateway_client.command, gateway_client.sync
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None))
"""


@pytest.mark.slow
@pytest.mark.timeout(180)  # a fresh venv and a real install: about 15 s with a warm pip cache
def test_the_client_installs_without_the_server_dependencies(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(CLIENT)],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert install.returncode == 0, install.stderr
    # Away from the repository and its PYTHONPATH, where `gateway` would be found.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run(
        [python, "-c", CHECK, *SERVER_ONLY],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env=env,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "", f"importable in the client's venv: {found.stdout}"
    usage = subprocess.run(
        [env_dir / "bin" / "gateway-client", "work", "--help"], capture_output=True, text=True
    )
    assert usage.returncode == 0 and "--concurrency" in usage.stdout, usage.stderr


def test_the_gateway_command_loads_no_server_package_for_work_and_enqueue() -> None:
    """`gateway work` and `gateway enqueue` run where only the client's packages are:
    building the parser and starting either imports none of the server's drivers."""
    check = (
        "import sys; import gateway.cli.main as c; c.build_parser(); "
        "import gateway_client.command, gateway_client.worker; "
        "print(' '.join(m for m in ('asyncpg', 'redis', 'starlette', 'uvicorn') "
        "if m in sys.modules))"
    )
    found = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "", f"imported: {found.stdout}"
