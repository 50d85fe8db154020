"""The packages' shape, as docs/architecture.md describes it: every module says in its
docstring what it holds, no module grows past one concept's length, and no folder past
what a reader can take in at a glance. The rules hold for the server's package and for
the Python client's alike."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "gateway", ROOT / "clients" / "python" / "gateway_client")
MAX_MODULE_LINES = 500
MAX_MODULES_PER_PACKAGE = 20
# Modules allowed past MAX_MODULE_LINES (paths from the repository's root), each with
# the reason it is still one concept.
LONG_MODULES: dict[str, str] = {
    "clients/python/gateway_client/client.py": (
        "AsyncClient, one method per endpoint of the API, a few lines over: one concept, "
        "to be split by the API's resources should it grow"
    ),
}


def modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in package.rglob("*.py"))


def name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_rules_cover_both_packages() -> None:
    """A moved package would otherwise leave these tests checking nothing."""
    for package in PACKAGES:
        assert (package / "__init__.py").is_file(), f"{name(package)} is not a package"


def test_every_module_says_what_it_holds() -> None:
    missing = [
        name(path)
        for path in modules()
        if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
    ]
    assert missing == [], "modules without a docstring saying what they hold"


def test_no_module_is_longer_than_one_concept() -> None:
    long = {
        name(path): n
        for path in modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert {path: n for path, n in long.items() if path not in LONG_MODULES} == {}
    # An exception whose module has shrunk is removed from the list.
    assert set(LONG_MODULES) <= set(long)


def test_no_package_holds_more_modules_than_a_reader_takes_in() -> None:
    crowded = {}
    for init in (init for package in PACKAGES for init in package.rglob("__init__.py")):
        count = sum(1 for p in init.parent.glob("*.py") if p.name != "__init__.py")
        if count > MAX_MODULES_PER_PACKAGE:
            crowded[name(init.parent)] = count
    assert crowded == {}
