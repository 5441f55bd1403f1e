"""The layout keeps its promises: no import cycles, and no module past ~500 lines without saying why."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.procs import REPO

# bench/ is not a package anyone imports, but it is read the same way: by module, with no cycle.
PACKAGES = ("server", "middleware", "bench")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: imports for annotations only, never executed."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every project module `path` imports at run time, at any depth (a lazy import is still a dependency)."""
    targets = set()
    tree = ast.parse(path.read_text())
    annotations_only = _type_checking_blocks(tree)
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from server.switchyard import profiles` imports the module server.switchyard.profiles
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                targets.add(name)
    return targets


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycles():
    modules = _modules()
    # A package's __init__ is not a dependency of its own modules' imports of each other.
    graph = {name: {t for t in _imports(path, modules) if t != name} for name, path in modules.items()}
    assert _find_cycle(graph) is None, f"import cycle: {' -> '.join(_find_cycle(graph) or [])}"


def test_cycle_finder_finds_a_cycle():
    # Negative control for the test above: the finder does report a cycle when there is one.
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_covers_bench():
    # The cycle test above reads bench/ too: its modules are in the graph, with their imports of each other.
    modules = _modules()
    assert {"bench.run", "bench.harness", "bench.procs"} <= set(modules)
    assert "bench.procs" in _imports(modules["bench.harness"], modules)


LONG_MODULE_LINES = 500
LONG_MODULE_REASON = "Longer than 500 lines because"


def test_long_modules_are_split_or_say_why():
    for name, path in _modules().items():
        text = path.read_text()
        if text.count("\n") > LONG_MODULE_LINES:
            head = ast.get_docstring(ast.parse(text)) or ""
            assert LONG_MODULE_REASON in head, (
                f"{name} is over {LONG_MODULE_LINES} lines: split it, or say why at its top"
            )
