"""How the test suite and the bench are laid out, read from the source: the bench
imports nothing from the tests (the tests may import the bench); a test module takes
its helpers from tests/support, never from another test module or a conftest.py;
conftest.py files hold fixtures and hooks only; and a helper module lives in
tests/support, not beside the tests that use it.

tests/faults, tests/sim and tests/model are programs (`make faults`, `make soak`,
`make simulate`, `make model`) whose modules are the program and its tests: their
tests import their own package's modules."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
TESTS = ROOT / "tests"
PROGRAMS = ("faults", "sim", "model")
# Modules beside the tests that are not helpers, and why they must stay where they are.
NOT_HELPERS = {
    "e2e/schemathesis_hooks.py": "schemathesis loads it by name (SCHEMATHESIS_HOOKS)",
    "e2e/work_task.py": "the task program `gateway work` runs in test_work.py",
    "e2e/console_screenshots.py": "a script: python -m tests.e2e.console_screenshots",
}


def parse(path: Path) -> ast.Module:
    """The module's syntax tree, parsed in a thread of its own (see test_imports.py)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(ast.parse, path.read_text()).result()


def imported(path: Path) -> Iterator[str]:
    """Every module `path` imports, anywhere in it, by its absolute name."""
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_bench_imports_nothing_from_the_tests() -> None:
    for path in sorted(BENCH.rglob("*.py")):
        found = sorted({m for m in imported(path) if m == "tests" or m.startswith("tests.")})
        assert not found, f"{shown(path)} imports {found}: move what it needs into bench/"


def test_a_test_module_imports_no_other_test_module_or_conftest() -> None:
    for path in sorted(TESTS.rglob("*.py")):
        if path.parent == TESTS / "support":
            continue
        for module in imported(path):
            last = module.rsplit(".", 1)[-1]
            if module.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                raise AssertionError(
                    f"{shown(path)} imports {module}: a helper or fixture used by more than "
                    "one module belongs in tests/support/ or a conftest.py above both"
                )


def test_conftest_files_hold_fixtures_and_hooks_only() -> None:
    for path in sorted(TESTS.rglob("conftest.py")):
        for node in parse(path).body:
            if isinstance(node, ast.ClassDef):
                raise AssertionError(f"{shown(path)} defines class {node.name}: tests/support")
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            fixture = any("fixture" in ast.unparse(d) for d in node.decorator_list)
            # A private function beside a hook is part of the hook.
            if not (fixture or node.name.startswith(("pytest_", "_"))):
                raise AssertionError(
                    f"{shown(path)} defines {node.name}, neither a fixture nor a hook: "
                    "helpers go in tests/support/"
                )


def test_helper_modules_live_in_tests_support() -> None:
    for path in sorted(TESTS.rglob("*.py")):
        place = path.relative_to(TESTS)
        if len(place.parts) == 1 or place.parts[0] in ("support", *PROGRAMS):
            continue
        name = path.name
        if name.startswith("test_") or name in ("conftest.py", "__init__.py"):
            continue
        assert place.as_posix() in NOT_HELPERS, (
            f"{shown(path)} is neither a test module nor a conftest.py: a helper "
            "belongs in tests/support/"
        )


def test_an_import_anywhere_in_a_module_counts(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import tests.support.net\n"
        "def f():\n"
        "    from tests.e2e import test_work\n"
        "    from tests.support.gateways import TOKEN\n"
    )
    assert {"tests.support.net", "tests.e2e.test_work", "tests.support.gateways.TOKEN"} <= set(
        imported(module)
    )
