"""The serving packages import one another in one direction: no import cycle (function-level and
TYPE_CHECKING imports included), services -> specserve and never back, the bench outside the serving graph."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVING_PACKAGES = (
    "specserve", "specserve_client", "protos", "draft_service", "target_service", "orchestrator", "inprocess", "deploy",
)  # fmt: skip
ABOVE_SPECSERVE = ("draft_service", "target_service", "orchestrator", "inprocess", "deploy")
"""Packages built on specserve: it imports none of them (but in the CLI and the bench, which compose them)."""


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of `packages` under `root`."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports anywhere in its source, at any depth."""
    modules = module_files(root, packages)

    def known(name: str) -> str | None:  # `from a.b import c`: the module a.b.c if there is one, else a.b
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: up from this module's package
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}".rstrip(".")
                names += [f"{base}.{alias.name}" for alias in node.names]
        graph[module] = {target for name in names if (target := known(name)) and target != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def edges(graph: dict[str, set[str]], importers: str | tuple[str, ...], imported: str | tuple[str, ...]) -> set[str]:
    """'a -> b' for each module a named by `importers` (dotted prefixes) importing one named by `imported`."""
    return {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if _under(module, importers)
        for target in targets
        if _under(target, imported)
    }


def _under(module: str, prefixes: str | tuple[str, ...]) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def test_the_serving_packages_import_no_cycle() -> None:
    assert cycles(import_graph(ROOT, SERVING_PACKAGES)) == []


def test_a_cycle_behind_a_function_level_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "circle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circle.b import helper\n")
    (package / "b.py").write_text("def helper():\n    from circle import a  # hidden in a function\n    return a\n")
    (package / "c.py").write_text("from . import a\n")  # imports into the cycle, is not part of it
    assert cycles(import_graph(tmp_path, ["circle"])) == [["circle.a", "circle.b"]]


def test_specserve_imports_no_package_built_on_it() -> None:
    graph = import_graph(ROOT, SERVING_PACKAGES)
    composers = ("specserve.cli", "specserve.bench")  # they run the whole system: the commands and the bench
    found = {edge for edge in edges(graph, "specserve", ABOVE_SPECSERVE) if not edge.startswith(composers)}
    assert found == set()


def test_the_bench_is_outside_the_serving_graph() -> None:
    graph = import_graph(ROOT, SERVING_PACKAGES)
    importers = {edge.split(" -> ")[0] for edge in edges(graph, SERVING_PACKAGES, "specserve.bench")}
    assert {m for m in importers if not _under(m, "specserve.bench")} <= {"specserve.cli"}


def test_the_services_do_not_import_each_other() -> None:
    graph = import_graph(ROOT, SERVING_PACKAGES)
    assert edges(graph, "draft_service", "target_service") | edges(graph, "target_service", "draft_service") == set()
