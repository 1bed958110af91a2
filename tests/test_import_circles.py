"""No module of allocsim imports, directly or through others, a module that imports it back.

The check is static: every ``import`` / ``from ... import`` in allocsim/, function-level ones
included (a lazy import hides a circle from Python but not from a reader), is resolved to a module
of the package and the graph is searched for cycles. Importing a name from a package counts as
importing that package's ``__init__``; the two compiled extensions are leaves.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "allocsim"
#: The compiled extensions (setup.py): ``from . import _kernel`` imports them, not their package.
EXTENSIONS = {"allocsim.policies._kernel", "allocsim.trace._readers"}


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _imports(module: str, is_package: bool, tree: ast.AST, modules: set[str]) -> set[str]:
    """The allocsim modules ``module`` imports anywhere in its body."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = []
            for alias in node.names:
                candidate = f"{prefix}.{alias.name}"
                if candidate in EXTENSIONS:
                    continue
                targets.append(candidate if candidate in modules else prefix)
        else:
            continue
        for name in targets:
            while name and name not in modules:      # a name inside a module: the module
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


@functools.lru_cache(maxsize=1)
def import_graph() -> dict[str, set[str]]:
    """Each allocsim module and the allocsim modules it imports (parsed once per session; do not mutate)."""
    parsed = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        name, is_package = _module_name(path)
        parsed[name] = (is_package, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    modules = set(parsed)
    return {name: _imports(name, is_package, tree, modules) for name, (is_package, tree) in parsed.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_allocsim_has_no_import_circle():
    graph = import_graph()
    assert len(graph) > 100 and "allocsim.trace.schema" in graph   # the walk found the package
    circles = import_circles(graph)
    assert circles == [], "import circles: " + "; ".join(
        " <-> ".join(group) + " (" + ", ".join(f"{m} -> {sorted(graph[m] & set(group))}" for m in group) + ")"
        for group in circles)


def test_circle_finder_sees_a_lazy_import_circle():
    # The finder itself: a function-level import back to the importer is a circle; a one-way one is not.
    def graph_of(sources: dict[str, str]) -> dict[str, set[str]]:
        modules = set(sources)
        return {name: _imports(name, False, ast.parse(text), modules) for name, text in sources.items()}

    circle = graph_of({"allocsim.a": "from .b import f\n",
                       "allocsim.b": "def f():\n    from .a import g\n"})
    assert import_circles(circle) == [["allocsim.a", "allocsim.b"]]
    one_way = graph_of({"allocsim.a": "from .b import f\n", "allocsim.b": "import os\n"})
    assert import_circles(one_way) == []


def test_settings_and_trace_do_not_import_upwards():
    # The layers below the policies: settings imports neither the policies nor the trace layer, and
    # no policy imports the trace layer's readers.
    graph = import_graph()
    for module, targets in graph.items():
        if module.startswith("allocsim.settings"):
            assert not {t for t in targets if t.startswith(("allocsim.policies", "allocsim.trace"))}, module
        if module.startswith("allocsim.policies"):
            assert not {t for t in targets if t.startswith("allocsim.trace.formats")}, module
