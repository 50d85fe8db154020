"""How the bench and the test suite are laid out, read from the source (every import
anywhere in a module, as tests/unit/test_imports.py reads the gateway's): the bench
imports nothing from the tests; the tests may import the bench."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


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
