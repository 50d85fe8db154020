"""The gateway's import graph: no cycle, counting the imports made only for type
checking, and no HTTP handler module that reaches a database or Redis driver itself.
Read from the source (every `import` anywhere in a module), not from what Python has
loaded, so that an import inside a function or an `if TYPE_CHECKING:` block counts."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
# The modules that answer HTTP requests: they parse, call the store and the claimer,
# and shape answers, through the gateway's own modules only.
HANDLERS = (
    "admin",
    "batch",
    "controls_routes",
    "daemon_routes",
    "httpio",
    "producer_routes",
    "routes",
    "runtimes",
    "webhook_routes",
)
DRIVERS = ("asyncpg", "redis")


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(the gateway modules `path` imports, the top-level packages it imports)."""
    own: set[str] = set()
    packages: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            packages.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                packages.add(node.module.split(".")[0])
                if node.module.startswith("gateway."):
                    own.add(node.module.split(".")[1])
            elif node.level == 1 and node.module:
                own.add(node.module.split(".")[0])
            elif node.level == 1:
                own.update(alias.name for alias in node.names)
    return own, packages


def graph() -> dict[str, set[str]]:
    modules = {path.stem: path for path in GATEWAY.glob("*.py")}
    return {name: imports(path)[0] & set(modules) for name, path in modules.items()}


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


def test_no_handler_imports_a_driver() -> None:
    for name in HANDLERS:
        path = GATEWAY / f"{name}.py"
        assert path.exists(), f"{name} is listed as a handler module but does not exist"
        drivers = imports(path)[1] & set(DRIVERS)
        assert not drivers, f"gateway/{name}.py imports {sorted(drivers)}"
