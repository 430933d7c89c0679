"""No import circles among miro's modules: every import points down, from the module that uses a thing to the
module that defines it. And the layers (DESIGN.md): core imports no worker and no cli; worker/fleet (the library)
imports core and itself only; worker/process (the RQ worker process) core, the library and itself; worker/api
(the HTTP server) core, the library and itself; no module of worker/ imports cli.

The graph is read from the source (ast), so it sees every import: at module level, under TYPE_CHECKING and
inside functions (a deferred import that hides a circle is still one). An import of a.b.c also runs a and a.b
first, so it adds edges to those packages, except from their own submodules (a package's __init__ has run
before any of its submodules). `from pkg import submodule` is an edge to the submodule alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "worker", "cli")


def module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(["miro", *parts])] = path
    return files


def import_targets(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """What each import of `name` names: the module (or package) itself, without the packages it runs first.
    `from pkg import submodule` names the submodule, `from pkg import thing` the package."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in modules]
            targets = submodules + ([source] if len(submodules) < len(node.names) else [])
        else:
            continue
        found.update(target for target in targets if target == "miro" or target.startswith("miro."))
    return found


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The miro modules `name` imports, with the packages each import runs first."""
    found = set()
    for target in import_targets(name, path, modules):
        parts = target.split(".")
        for end in range(2, len(parts) + 1):
            ancestor = ".".join(parts[:end])
            if ancestor in modules and ancestor != name and not name.startswith(ancestor + "."):
                found.add(ancestor)
    return found


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
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
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_deferred_and_type_checking_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "one.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .two import Thing\n"
    )
    (tmp_path / "pkg" / "two.py").write_text("def f():\n    from . import one\n")
    modules = {"miro.pkg.one": tmp_path / "pkg" / "one.py", "miro.pkg.two": tmp_path / "pkg" / "two.py"}
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert graph == {"miro.pkg.one": {"miro.pkg.two"}, "miro.pkg.two": {"miro.pkg.one"}}


def test_no_import_circles():
    modules = module_files()
    assert "miro.core.engine.engine" in modules and "miro.worker.process.batch_worker" in modules
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert import_circles(graph) == []


# what each layer may import, by the names its imports spell (so the test sees `from miro.worker import X` too,
# and X would come through miro.worker's re-exports of the process); the first matching prefix decides
LAYERS = [
    ("miro.core", ("miro.core",)),
    ("miro.worker.fleet", ("miro.core", "miro.worker.fleet")),
    ("miro.worker.process", ("miro.core", "miro.worker.fleet", "miro.worker.process")),
    ("miro.worker.api", ("miro.core", "miro.worker.fleet", "miro.worker.api")),
    ("miro.worker", ("miro.core", "miro.worker.fleet", "miro.worker.process")),  # its __init__: the re-exports
    ("miro.cli", ("miro.core", "miro.worker", "miro.cli")),
]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_violations(modules: dict[str, Path]) -> list[str]:
    wrong = []
    for name, path in sorted(modules.items()):
        layer, allowed = next((layer, allowed) for layer, allowed in LAYERS if _within(name, layer))
        for target in sorted(import_targets(name, path, modules)):
            if not any(_within(target, prefix) for prefix in allowed):
                wrong.append(f"{name} ({layer}) imports {target}")
    return wrong


def test_the_layer_check_sees_a_library_module_importing_the_process(tmp_path):
    (tmp_path / "lib.py").write_text("def f():\n    from miro.worker import BatchWorker\n")
    (tmp_path / "lib2.py").write_text("from miro.worker.process.jobs import generate\nfrom ...api import app\n")
    (tmp_path / "api.py").write_text("from miro.worker.process import batch_worker\nimport miro.cli.main\n")
    (tmp_path / "ok.py").write_text("from miro.core import defaults\nfrom . import keys\n")
    modules = {
        "miro.worker.fleet.lib": tmp_path / "lib.py",
        "miro.worker.fleet.sub.lib2": tmp_path / "lib2.py",
        "miro.worker.api.routes": tmp_path / "api.py",
        "miro.worker.fleet.ok": tmp_path / "ok.py",
        "miro.worker.fleet.records.keys": tmp_path / "ok.py",
        "miro.worker.process.batch_worker": tmp_path / "ok.py",
    }
    assert layer_violations(modules) == [
        "miro.worker.api.routes (miro.worker.api) imports miro.cli.main",
        "miro.worker.api.routes (miro.worker.api) imports miro.worker.process.batch_worker",
        "miro.worker.fleet.lib (miro.worker.fleet) imports miro.worker",
        "miro.worker.fleet.sub.lib2 (miro.worker.fleet) imports miro.worker.api",
        "miro.worker.fleet.sub.lib2 (miro.worker.fleet) imports miro.worker.process.jobs",
    ]


def test_each_layer_imports_only_what_it_may():
    modules = module_files()
    assert {"miro.worker.fleet.intake.submit", "miro.worker.process.batch_worker", "miro.worker.api.app"} <= set(
        modules
    )
    assert layer_violations(modules) == []
