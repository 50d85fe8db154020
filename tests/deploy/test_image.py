"""deploy/Dockerfile, checked without Docker: its stages and final image, and the wheel
that its build stage makes from the build context that .dockerignore lets through."""

from __future__ import annotations

import fnmatch
import json
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"  # the build context is the repository root
COMPILERS = ("build-essential", "gcc", "g++", "clang", "make", "cargo", "rustc")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, each with its (INSTRUCTION, arguments)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue  # comments and blank lines may sit inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = rest.split()
            base = words[0]
            for name, value in global_args.items():
                base = base.replace("${" + name + "}", value).replace("$" + name, value)
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = rest.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return global_args, stages


def exec_form(rest: str) -> list[str]:
    value = json.loads(rest)
    assert isinstance(value, list), f"not the exec form: {rest}"
    return [str(v) for v in value]


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())[1]


@pytest.fixture(scope="module")
def pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_multi_stage_with_a_slim_python_last(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    final = stages[-1]
    assert final.base.startswith("python:") and "slim" in final.base, final.base
    # The final stage takes only wheels from the build stage, never the source tree.
    assert not final.args("COPY") and not final.args("ADD")
    assert any("from=build" in run and "--no-index" in run for run in final.args("RUN"))


def test_final_stage_runs_as_a_numeric_non_root_user(stages: list[Stage]) -> None:
    users = stages[-1].args("USER")
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, users[-1]
    assert not gid or (gid.isdigit() and int(gid) > 0), users[-1]


def test_entrypoint_is_gateway_and_cmd_serves_on_every_interface(stages: list[Stage]) -> None:
    final = stages[-1]
    assert exec_form(final.args("ENTRYPOINT")[-1]) == ["gateway"]
    cmd = exec_form(final.args("CMD")[-1])
    assert cmd[0] == "serve"
    # The default 127.0.0.1 would be unreachable from outside the container.
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"


def test_no_healthcheck(stages: list[Stage]) -> None:
    assert not any(stage.args("HEALTHCHECK") for stage in stages)


def test_no_compilers_or_pip_cache_in_the_final_stage(stages: list[Stage]) -> None:
    final = stages[-1]
    for run in final.args("RUN"):
        words = shlex.split(run)
        assert not any(w in COMPILERS for w in words), run
        assert "apt-get" not in words and "apk" not in words, run
    env = " ".join(final.args("ENV"))
    pip_runs = [run for run in final.args("RUN") if "pip install" in run]
    assert pip_runs
    for run in pip_runs:
        assert "--no-cache-dir" in run or "PIP_NO_CACHE_DIR=1" in env, run


def test_the_image_can_export_spans(stages: list[Stage], pyproject: dict[str, object]) -> None:
    # The otel extra is built and installed, so that setting OTEL_EXPORTER_OTLP_ENDPOINT
    # turns tracing on instead of refusing the start for a missing SDK.
    project = pyproject["project"]
    assert isinstance(project, dict) and "otel" in project["optional-dependencies"]
    [build_wheels] = [run for run in stages[0].args("RUN") if "pip wheel" in run]
    assert "[otel]" in build_wheels
    [install] = [run for run in stages[-1].args("RUN") if "pip install" in run]
    assert "claim-gateway[otel]" in install


def test_console_script_gateway(pyproject: dict[str, object]) -> None:
    project = pyproject["project"]
    assert isinstance(project, dict)
    assert project["scripts"] == {"gateway": "gateway.cli.main:main"}


# -- the build context and the wheel made from it --------------------------------------


def ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore's rule, as Docker applies it: the last pattern that matches the path
    or one of its parent folders decides; `!` lets it back in."""
    parts = path.split("/")
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(_match(c, pattern) for c in candidates):
            verdict = not negate
    return verdict


def _match(path: str, pattern: str) -> bool:
    if pattern.startswith("**/"):
        return any(
            fnmatch.fnmatchcase("/".join(path.split("/")[i:]), pattern[3:])
            for i in range(len(path.split("/")))
        )
    return path.count("/") == pattern.count("/") and fnmatch.fnmatchcase(path, pattern)


def build_context(destination: Path) -> None:
    """Copy what the build stage's COPY instructions take, as the context offers it."""
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    build = parse_dockerfile(DOCKERFILE.read_text())[1][0]
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    context = [p for p in tracked if not ignored(p, patterns)]
    for copy in build.args("COPY"):
        *sources, _target = copy.split()
        for source in sources:
            source = source.rstrip("/")
            for path in context:
                if path == source or path.startswith(source + "/"):
                    (destination / path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / path, destination / path)


def test_context_leaves_out_what_the_image_does_not_need() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    for path in (".git/config", ".venv/bin/python", "tests/conftest.py", ".gateway/dev-token"):
        assert ignored(path, patterns), path
    for path in ("gateway/cli/main.py", "clients/python/gateway_client/cli.py", "pyproject.toml"):
        assert not ignored(path, patterns), path
    assert ignored("gateway/__pycache__/cli.cpython-312.pyc", patterns)


@pytest.mark.timeout(120)
def test_wheel_from_the_context_has_both_packages_migrations_and_the_script(
    tmp_path: Path,
) -> None:
    source, out = tmp_path / "src", tmp_path / "wheels"
    source.mkdir()
    build_context(source)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("claim_gateway-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    assert "gateway/cli/main.py" in names
    assert "gateway/_client/cli.py" in names  # `gateway work` and `gateway enqueue`
    assert not any(n.startswith("gateway_client/") for n in names)  # the client's own
    shipped = {p.name for p in (ROOT / "migrations").glob("*.sql")}
    assert shipped and {f"gateway/migrations/{n}" for n in shipped} <= names
    assert "gateway = gateway.cli.main:main" in scripts
