"""The gateway's import graph: no cycle, counting the imports made only for type
checking, and no HTTP handler module that reaches a database or Redis driver itself.
Read from the source (every `import` anywhere in a module), not from what Python has
loaded, so that an import inside a function or an `if TYPE_CHECKING:` block counts."""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
# The packages that answer HTTP requests (they parse, call the store and the claimer,
# and shape answers, through the gateway's own modules only) and the wire format, which
# does no I/O at all.
NO_DRIVERS = ("http", "api")
DRIVERS = ("asyncpg", "redis")
# The wire format is plain data: no web framework either.
NO_FRAMEWORK = ("api",)
FRAMEWORKS = ("starlette", "uvicorn")


def parse(path: Path) -> ast.Module:
    """The module's syntax tree, parsed in a thread of its own: CPython 3.11's parser
    can fail with "AST constructor recursion depth mismatch" in a thread where an
    earlier test ran into a RecursionError (deeply nested JSON does, on purpose)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(ast.parse, path.read_text()).result()


def module_name(path: Path) -> str:
    """`store.tasks` for gateway/store/tasks.py, `store` for its __init__.py."""
    parts = list(path.relative_to(GATEWAY).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(the gateway modules among `known` that `path` imports, as module_name() names
    them, and the top-level packages it imports). `from .store.sql import tasks` imports
    the module store.sql.tasks; `from .store import Store`, the package store."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    own: set[str] = set()
    packages: set[str] = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                packages.add(alias.name.split(".")[0])
                if alias.name.startswith("gateway."):
                    own.add(alias.name[len("gateway.") :])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                module = node.module or ""
                packages.add(module.split(".")[0])
                if not module.startswith("gateway."):
                    continue
                base = module[len("gateway.") :].split(".")
            else:
                base = package[: len(package) - node.level + 1] + (node.module or "").split(".")
            prefix = ".".join(part for part in base if part)
            for alias in node.names:
                child = f"{prefix}.{alias.name}" if prefix else alias.name
                own.add(child if child in known else prefix)
    return own & known, packages


def graph() -> dict[str, set[str]]:
    """Each module's imports, with the packages an import runs on the way: importing
    store.sql.tasks runs store/__init__.py first, and all that it imports. A module's
    own packages are already running when it runs, and are left out."""
    modules = {module_name(path): path for path in GATEWAY.rglob("*.py")}
    modules.pop("", None)  # gateway/__init__.py
    known = set(modules)
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        parts = name.split(".")
        running = {".".join(parts[:i]) for i in range(1, len(parts))}
        targets: set[str] = set()
        for target in imports(path, known)[0]:
            pieces = target.split(".")
            targets.update(".".join(pieces[:i]) for i in range(1, len(pieces) + 1))
        edges[name] = (targets & known) - running - {name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_gateway_has_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def modules_of(package: str) -> list[Path]:
    folder = GATEWAY / package
    assert (folder / "__init__.py").exists(), f"gateway/{package} is not a package"
    return sorted(folder.rglob("*.py"))


def test_no_handler_imports_a_driver() -> None:
    for package in NO_DRIVERS:
        for path in modules_of(package):
            drivers = imports(path, set())[1] & set(DRIVERS)
            assert not drivers, f"{path.relative_to(GATEWAY.parent)} imports {sorted(drivers)}"


def test_the_wire_format_imports_no_web_framework() -> None:
    for package in NO_FRAMEWORK:
        for path in modules_of(package):
            found = imports(path, set())[1] & set(FRAMEWORKS)
            assert not found, f"{path.relative_to(GATEWAY.parent)} imports {sorted(found)}"
