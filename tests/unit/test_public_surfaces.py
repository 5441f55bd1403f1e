"""Each package's public surface is its `__init__`'s `__all__`, and other packages import only from it.

A package's `__all__` names what other packages may use: names its `__init__` re-exports, or the
public modules themselves (where re-exporting would make an import cycle or import more than a
caller needs; the package docstring says which). So, across packages:

- the package imported from has an `__all__`, and every entry of it exists;
- what is imported is on that surface: the name, or the module it is taken from, is in `__all__`;
- no private name (`_x`) and no private module is imported at all.

Inside one package (its modules and its `__init__`) anything goes.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import REPO

PACKAGES = ("server", "middleware", "bench")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


def modules_under(root: Path, packages: tuple[str, ...]) -> dict[str, Module]:
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            found[name] = Module(name, path, is_package)
    return found


def declared_all(module: Module) -> list[str] | None:
    """The literal `__all__` of a module, or None when it has none."""
    for node in ast.parse(module.path.read_text()).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            return list(ast.literal_eval(node.value))
    return None


def bound_names(module: Module) -> set[str]:
    """The names a module's top level binds: definitions, assignments and imports."""
    names: set[str] = set()
    for node in ast.parse(module.path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def missing_from_all(modules: dict[str, Module]) -> list[str]:
    """Entries of a package's `__all__` that are neither bound in its `__init__` nor a submodule."""
    problems = []
    for module in modules.values():
        if not module.is_package:
            continue
        entries = declared_all(module) or []
        bound = bound_names(module)
        for entry in entries:
            if entry not in bound and f"{module.name}.{entry}" not in modules:
                problems.append(f"{module.name}.__all__ names {entry!r}, which it neither defines nor has as a module")
    return problems


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _cross_package_uses(importer: Module, modules: dict[str, Module]) -> list[tuple[str, tuple[str, ...], str, int]]:
    """(package, entries, what, line) for each import of another package's module or name: one of
    `entries` must be on the package's surface (the name, or the module it comes from)."""
    uses = []
    for node in ast.walk(ast.parse(importer.path.read_text())):
        pairs: list[tuple[str, str | None]] = []  # (module path, name taken from it or None)
        if isinstance(node, ast.Import):
            pairs = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            pairs = [(node.module, alias.name) for alias in node.names]
        for path, name in pairs:
            if path.split(".")[0] not in PACKAGES:
                continue
            full = f"{path}.{name}" if name else path
            if full in modules:  # a module (or package) itself
                package, _, entry = full.rpartition(".")
                entries: tuple[str, ...] = (entry,)
            elif path in modules:  # a name taken from a module
                package = modules[path].package
                entries = (name or "",) if modules[path].is_package else (path.rpartition(".")[2], name or "")
            else:
                continue
            if package in modules and package != importer.package:
                # the path below the package, then the name: any private part is a private import
                below = full[len(package) + 1 :].split(".")
                uses.append((package, entries, ".".join(below), node.lineno))
    return uses


def surface_problems(modules: dict[str, Module]) -> list[str]:
    problems = []
    surfaces = {m.name: declared_all(m) for m in modules.values() if m.is_package}
    for importer in modules.values():
        where = importer.name + (".__init__" if importer.is_package else "")
        for package, entries, what, line in _cross_package_uses(importer, modules):
            if any(_private(part) for part in what.split(".")):
                problems.append(f"{where}:{line} imports the private {package}.{what}")
                continue
            surface = surfaces.get(package)
            if surface is None:
                problems.append(f"{where}:{line} imports {package}.{what}, but {package} has no __all__")
            elif not any(entry in surface for entry in entries):
                problems.append(f"{where}:{line} imports {package}.{what}, which is not in {package}.__all__")
    return problems


# ---- the project -----------------------------------------------------------------------------


def test_every_package_imported_from_another_keeps_to_its_public_surface():
    problems = surface_problems(modules_under(REPO, PACKAGES))
    assert not problems, "\n".join(problems)


def test_every_entry_of_every_all_exists():
    problems = missing_from_all(modules_under(REPO, PACKAGES))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("package", sorted(n for n, m in modules_under(REPO, PACKAGES).items() if m.is_package))
def test_every_re_exported_name_is_there_at_run_time(package):
    module = importlib.import_module(package)
    for entry in declared_all(modules_under(REPO, PACKAGES)[package]) or []:
        if (
            not (REPO / package.replace(".", "/") / entry).exists()
            and not (REPO / package.replace(".", "/") / f"{entry}.py").exists()
        ):
            assert hasattr(module, entry), f"{package}.__all__ names {entry!r}, which importing it does not give"


# ---- negative controls: the checks do catch each kind of problem -----------------------------


def _tree(root: Path, files: dict[str, str]) -> dict[str, Module]:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules_under(root, ("server",))


def test_the_checks_catch_a_private_name_a_missing_all_and_an_off_surface_import(tmp_path):
    modules = _tree(
        tmp_path,
        {
            "server/__init__.py": '__all__ = ["a"]\n',
            "server/a/__init__.py": '__all__ = ["public", "tools"]\nfrom server.a.tools import public\n',
            "server/a/tools.py": "def public(): ...\ndef _private(): ...\ndef other(): ...\n",
            "server/a/inner.py": "from server.a.tools import _private\n",  # same package: allowed
            "server/b/__init__.py": "",
            "server/b/thing.py": "X = 1\n",
            "server/c/__init__.py": '__all__ = ["gone"]\n',
            "server/user.py": (
                "from server.a.tools import _private\n"  # private, across packages
                "from server.b.thing import X\n"  # b has no __all__
                "from server.a import other\n"  # not on a's surface
                "from server.a.tools import other\n"  # its module `tools` is on the surface: allowed
                "from server.a import public\n"  # on the surface: allowed
            ),
        },
    )
    problems = surface_problems(modules)
    assert problems == [
        "server.user:1 imports the private server.a.tools._private",
        "server.user:2 imports server.b.thing.X, but server.b has no __all__",
        "server.user:3 imports server.a.other, which is not in server.a.__all__",
    ]
    assert missing_from_all(modules) == ["server.c.__all__ names 'gone', which it neither defines nor has as a module"]


def test_a_clean_tree_has_no_problems(tmp_path):
    modules = _tree(
        tmp_path,
        {
            "server/__init__.py": '__all__ = ["a", "user"]\n',
            "server/a/__init__.py": '__all__ = ["public"]\nfrom server.a.tools import public\n',
            "server/a/tools.py": "def public(): ...\n",
            "server/user.py": "from server.a import public\nfrom server.a.tools import public as again\n",
        },
    )
    assert surface_problems(modules) == [] and missing_from_all(modules) == []
