"""How the two distributions install. The client installs alone, into a fresh virtual
environment, with aiohttp and none of the server's packages. The server's wheel carries
the client as its private gateway._client: both install into one environment, no file
has two owners, and uninstalling either leaves the other's commands working.

The wheels are built here from the checkout; aiohttp and its dependencies come from the
package index once, as wheels, and every install reads only that folder (--no-index)."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import venv
from collections import Counter
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[1]
ROOT = CLIENT.parents[1]
SERVER_ONLY = ("asyncpg", "redis", "starlette", "uvicorn", "gateway")
# Every client module imports, and none of the server's modules can be found.
CHECK = """
import importlib.util, sys
import gateway_client, gateway_client.cli, gateway_client.command, gateway_client.sync
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None))
"""
# Nothing listens on port 1 of the loopback: a call there fails at once with no answer,
# after the command has loaded the client and aiohttp, built and sent its request.
UNREACHABLE = "http://127.0.0.1:1"


def pip(*args: str | Path, python: Path | None = None, isolated: bool = True) -> str:
    """This environment's pip, acting on `python`'s environment when given. Isolated:
    no configuration, no index, only the wheels given with --find-links."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if isolated:
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    if python is not None:
        command += ["--python", str(python)]
    done = subprocess.run(
        [*command, *map(str, args)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, f"pip {args}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both distributions' wheels, and aiohttp's with its dependencies (the versions of
    this environment), in one folder."""
    folder = tmp_path_factory.mktemp("wheels")
    for source in (ROOT, CLIENT):
        pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", folder, source)
    aiohttp = importlib.metadata.version("aiohttp")
    pip(
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--dest",
        folder,
        f"aiohttp=={aiohttp}",
        isolated=False,
    )
    return folder


def fresh_venv(path: Path) -> Path:
    """A virtual environment without pip (this environment's pip installs into it)."""
    venv.create(path, with_pip=False)
    return path / "bin" / "python"


def run(path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Away from the repository and its PYTHONPATH, where `gateway` would be found.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GATEWAY_TOKEN")}
    return subprocess.run(
        [str(path), *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env
    )


def owned_files(python: Path, *distributions: str) -> dict[str, list[str]]:
    """Each distribution's files, as `pip show -f` lists them."""
    shown = pip("show", "-f", *distributions, python=python)
    files: dict[str, list[str]] = {}
    for block in shown.split("\n---\n"):
        name = re.search(r"^Name: (.+)$", block, re.M)
        assert name and "Files:" in block, block
        listed = block.split("Files:", 1)[1].splitlines()
        files[name[1]] = [line.strip() for line in listed if line.strip()]
    return files


def assert_enqueue_runs(command: Path, cwd: Path) -> None:
    """`enqueue` loads the client, sends its call, and reports that no answer came."""
    done = run(command, "enqueue", "demo", "--payload", "{}", "--url", UNREACHABLE, cwd=cwd)
    assert done.returncode == 1 and "enqueue: transport_error" in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)  # the wheels, a fresh venv and two installs: about 10 s
def test_the_client_installs_without_the_server_dependencies(wheels: Path, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    pip(
        "install",
        "--quiet",
        "--no-index",
        "--find-links",
        wheels,
        "claim-gateway-client",
        python=python,
    )
    found = run(python, "-c", CHECK, *SERVER_ONLY, cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "", f"importable in the client's venv: {found.stdout}"
    usage = run(python.parent / "gateway-client", "work", "--help", cwd=tmp_path)
    assert usage.returncode == 0 and "--concurrency" in usage.stdout, usage.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_both_install_side_by_side_and_each_outlives_the_other(
    wheels: Path, tmp_path: Path
) -> None:
    """The server goes in without its drivers (--no-deps): `gateway work`, `enqueue` and
    `runtime` need only aiohttp, which the client's install brings."""
    python = fresh_venv(tmp_path / "venv")
    bin_dir = python.parent
    install = ("install", "--quiet", "--no-index", "--find-links", wheels)
    pip(*install, "claim-gateway-client", python=python)
    pip(*install, "--no-deps", "claim-gateway", python=python)

    files = owned_files(python, "claim-gateway", "claim-gateway-client")
    assert {"gateway/_client/client.py", "gateway/cli/main.py"} <= set(files["claim-gateway"])
    assert "gateway_client/client.py" in files["claim-gateway-client"]
    every = Counter(f for listed in files.values() for f in listed)
    assert [f for f, n in every.items() if n > 1] == [], "files with two owners"

    # The server alone still brings what its copy of the client needs.
    requires = run(
        python,
        "-c",
        "import importlib.metadata as m; print(m.requires('claim-gateway'))",
        cwd=tmp_path,
    )
    assert "aiohttp" in requires.stdout, requires.stdout + requires.stderr

    pip("uninstall", "--yes", "claim-gateway-client", python=python)
    gone = run(python, "-c", "import gateway_client", cwd=tmp_path)
    assert gone.returncode == 1 and "ModuleNotFoundError" in gone.stderr
    usage = run(bin_dir / "gateway", "work", "--help", cwd=tmp_path)
    assert usage.returncode == 0 and "--concurrency" in usage.stdout, usage.stderr
    assert_enqueue_runs(bin_dir / "gateway", tmp_path)

    pip(*install, "--no-deps", "claim-gateway-client", python=python)
    pip("uninstall", "--yes", "claim-gateway", python=python)
    assert not (bin_dir / "gateway").exists()
    found = run(python, "-c", CHECK, "gateway", cwd=tmp_path)
    assert found.returncode == 0 and found.stdout.strip() == "", found.stdout + found.stderr
    assert_enqueue_runs(bin_dir / "gateway-client", tmp_path)


def test_the_gateway_command_loads_no_server_package_for_work_and_enqueue() -> None:
    """`gateway work` and `gateway enqueue` run where only the client's packages are:
    building the parser and starting either imports none of the server's drivers."""
    check = (
        "import sys; import gateway.cli.main as c; c.build_parser(); "
        "import gateway._client.command, gateway._client.worker; "
        "print(' '.join(m for m in ('asyncpg', 'redis', 'starlette', 'uvicorn') "
        "if m in sys.modules))"
    )
    found = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "", f"imported: {found.stdout}"


def test_the_client_imports_its_own_modules_relatively_only() -> None:
    """The server's copy runs as gateway._client, where `import gateway_client` would
    find nothing (or another install's modules)."""
    for path in sorted((CLIENT / "gateway_client").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            own = [n for n in names if n.split(".")[0] == "gateway_client"]
            assert own == [], f"{path.name}:{node.lineno} imports {own}: import it relatively"
