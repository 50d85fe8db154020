"""The package's shape, as docs/architecture.md describes it: every module says in its
docstring what it holds, no module grows past one concept's length, and no folder past
what a reader can take in at a glance."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
MAX_MODULE_LINES = 500
MAX_MODULES_PER_PACKAGE = 20
# Modules allowed past MAX_MODULE_LINES, each with the reason it is still one concept.
LONG_MODULES: dict[str, str] = {}


def modules() -> list[Path]:
    return sorted(GATEWAY.rglob("*.py"))


def test_every_module_says_what_it_holds() -> None:
    missing = [
        str(path.relative_to(GATEWAY.parent))
        for path in modules()
        if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
    ]
    assert missing == [], "modules without a docstring saying what they hold"


def test_no_module_is_longer_than_one_concept() -> None:
    long = {
        str(path.relative_to(GATEWAY)): n
        for path in modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert {name: n for name, n in long.items() if name not in LONG_MODULES} == {}
    # An exception whose module has shrunk is removed from the list.
    assert set(LONG_MODULES) <= set(long)


def test_no_package_holds_more_modules_than_a_reader_takes_in() -> None:
    crowded = {}
    for init in GATEWAY.rglob("__init__.py"):
        count = sum(1 for p in init.parent.glob("*.py") if p.name != "__init__.py")
        if count > MAX_MODULES_PER_PACKAGE:
            crowded[str(init.parent.relative_to(GATEWAY.parent))] = count
    assert crowded == {}
