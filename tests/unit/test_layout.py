"""The layout keeps its promises: the import rule of docs/architecture.md, no import cycles (annotation
imports included), and no module past ~500 lines without saying why."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.procs import REPO

# bench/ is not a package anyone imports, but it is read the same way: by module, with no cycle.
PACKAGES = ("server", "middleware", "bench")

# The import rule (docs/architecture.md, "Layout"): the folders are layers, from the outside (what
# builds and runs the app) down the request path to the wire. A module imports only from its own
# layer, from layers below it, or from the shared helpers. A module in no layer fails the rule test:
# place it here (and in the docs' list) when you add a folder or a top-level module.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("server.app", "server.lifespan", "server.cli", "server.spawn", "server.ray_tasks"),
    ("server.dev",),
    ("server.viewer",),
    ("server.api",),
    ("server.state", "server.request_owner", "server.stateful"),
    ("server.injection",),
    ("server.capture",),
    ("server.switchyard",),
    ("server.telemetry",),
    ("server.upstream", "server.translate"),
    ("middleware",),
    ("server.http",),
)
# Leaves every layer may use: they import nothing of the project but each other.
SHARED_HELPERS = (
    "server",  # the package itself: its docstring and version
    "server.config",
    "server.ids",
    "server.errors",
    "server.files",
    "server.urls",
    "server.logs",
    "server.batching",
    "server.process",
    "server.capture.tokens",  # the token triple rules, shared by capture, translation and telemetry
    "server.cli.exits",  # exit codes, shared by the command and the demo it starts
)
RULED = ("server", "middleware")  # bench/ and tests/ stand outside the app and may import any of it


def _modules(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
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


def _imports(path: Path, modules: dict[str, Path], *, annotations: bool = False) -> set[str]:
    """Every project module `path` imports at run time, at any depth (a lazy import is still a
    dependency); with `annotations`, also those imported under `if TYPE_CHECKING:`, which tie the
    modules together for a reader and for mypy just the same."""
    targets = set()
    tree = ast.parse(path.read_text())
    annotations_only = set() if annotations else _type_checking_blocks(tree)
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


def _import_graph(modules: dict[str, Path], *, annotations: bool = False) -> dict[str, set[str]]:
    # A package's __init__ is not a dependency of its own modules' imports of each other.
    return {
        name: {t for t in _imports(path, modules, annotations=annotations) if t != name}
        for name, path in modules.items()
    }


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


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _place(module: str) -> int | None:
    """The module's layer (0 = outermost), -1 for a shared helper, None when the rule does not place it."""
    if module in SHARED_HELPERS or any(_within(module, h) for h in SHARED_HELPERS if h != "server"):
        return -1
    best: tuple[int, int] | None = None  # (length of the matching prefix, layer): the longest prefix wins
    for layer, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if _within(module, prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer)
    return None if best is None else best[1]


def _rule_breaks(modules: dict[str, Path]) -> list[str]:
    """Every import that breaks the rule (annotation imports included), and every module it cannot place."""
    breaks = []
    for name, path in sorted(modules.items()):
        if not any(_within(name, package) for package in RULED):
            continue
        layer = _place(name)
        if layer is None:
            breaks.append(f"{name} is in no layer: add it to LAYERS (and the docs' list)")
            continue
        for target in sorted(_imports(path, modules, annotations=True)):
            if target == name or not any(_within(target, package) for package in RULED):
                continue
            target_layer = _place(target)
            if target_layer == -1:
                continue
            if layer == -1 or target_layer is None or target_layer < layer:
                breaks.append(f"{name} imports {target}")
    return breaks


def test_every_import_follows_the_layer_rule():
    assert _rule_breaks(_modules()) == []


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return _modules(root, RULED)


def test_the_layer_rule_finds_an_import_against_it(tmp_path):
    # Negative control for the rule test: a tree whose wire layer imports an endpoint, whose helper
    # imports a layer, and which holds a folder no layer names.
    modules = _tree(
        tmp_path,
        {
            "server/__init__.py": "",
            "server/errors.py": "from server.http.asgi import send_json\n",
            "server/http/__init__.py": "",
            "server/http/asgi.py": "from server.errors import OpenAIError\n",
            "server/api/__init__.py": "",
            "server/api/chat.py": "from server.http.asgi import send_json\nfrom server.translate import stream\n",
            "server/translate/__init__.py": "",
            "server/translate/stream.py": "import typing\nif typing.TYPE_CHECKING:\n    from server.api.chat import Chat\n",
            "server/gadgets/__init__.py": "",
            "middleware/__init__.py": "",
        },
    )
    assert _rule_breaks(modules) == [
        "server.errors imports server.http.asgi",
        "server.gadgets is in no layer: add it to LAYERS (and the docs' list)",
        "server.translate.stream imports server.api.chat",
    ]


def test_no_import_cycles():
    graph = _import_graph(_modules())
    assert _find_cycle(graph) is None, f"import cycle: {' -> '.join(_find_cycle(graph) or [])}"


def test_no_import_cycles_counting_annotation_imports():
    # An import under TYPE_CHECKING is not run, but it still ties two modules together: an import map
    # (and a reader) sees the circle. None is allowed.
    graph = _import_graph(_modules(), annotations=True)
    assert _find_cycle(graph) is None, f"import cycle: {' -> '.join(_find_cycle(graph) or [])}"


def test_an_annotation_import_cycle_is_found(tmp_path):
    # Negative control for the test above: a circle closed only by an annotation import is found
    # with annotations counted and missed without (the old check's blind spot).
    modules = _tree(
        tmp_path,
        {
            "server/__init__.py": "",
            "server/api/__init__.py": "",
            "server/api/responses.py": "from server.stateful.runner import start\n",
            "server/stateful/__init__.py": "",
            "server/stateful/runner.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from server.api.responses import Responses\n"
            ),
            "middleware/__init__.py": "",
        },
    )
    assert _find_cycle(_import_graph(modules)) is None
    assert _find_cycle(_import_graph(modules, annotations=True)) == [
        "server.api.responses",
        "server.stateful.runner",
        "server.api.responses",
    ]


def test_cycle_finder_finds_a_cycle():
    # Negative control for the cycle tests: the finder does report a cycle when there is one.
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
