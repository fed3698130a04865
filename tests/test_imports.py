"""No import cycle among batchfold's modules.

Every ``import`` / ``from ... import`` statement anywhere in a module counts,
including those inside functions; imports guarded by ``if TYPE_CHECKING:`` do
not.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "batchfold"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return False


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Import statements in ``tree``, skipping ``if TYPE_CHECKING:`` bodies."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The batchfold module ``target`` names (or its nearest package)."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")
                    if node.level > 1:
                        base_parts = base_parts[: -(node.level - 1)]
                    base = ".".join(base_parts)
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                # ``from pkg import name`` names a submodule or something in pkg.
                for alias in node.names:
                    submodule = f"{module}.{alias.name}"
                    targets.append(submodule if submodule in modules else module)
            for target in targets:
                if not target.startswith(PACKAGE):
                    continue
                dep = _resolve(target, modules)
                if dep is not None and dep != name:
                    graph[name].add(dep)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in ``graph`` as a list of modules (first repeated last)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for dep in sorted(graph[node]):
            if colour[dep] == GREY:
                return stack[stack.index(dep) :] + [dep]
            if colour[dep] == WHITE:
                cycle = visit(dep)
                if cycle is not None:
                    return cycle
        stack.pop()
        colour[node] = BLACK
        return None

    for node in sorted(graph):
        if colour[node] == WHITE:
            cycle = visit(node)
            if cycle is not None:
                return cycle
    return None


def test_graph_sees_the_package() -> None:
    graph = import_graph()
    assert "batchfold.blocks.base" in graph
    # Relative, absolute and function-level imports are all seen.
    assert "batchfold.graph" in graph["batchfold.grouping"]
    assert "batchfold.lazy.hooks" in graph["batchfold.lazy.api"]


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
