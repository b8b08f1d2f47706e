"""The top-level modules of agentgym import one another without a cycle, lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentgym"
#: The package itself (``import agentgym``, ``from agentgym import make``) is the node ``__init__``.
INIT = "__init__"


def _top_level_modules() -> dict[str, Path]:
    return {path.stem: path for path in sorted(PACKAGE.glob("*.py"))}


def _imported(node: ast.AST, modules: set[str]) -> set[str]:
    """The top-level agentgym modules one import statement names (anywhere: functions, TYPE_CHECKING)."""
    names: set[str] = set()
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
        names |= {_module_of(t, modules) for t in targets if t == "agentgym" or t.startswith("agentgym.")}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
        if node.module == "agentgym":
            names |= {alias.name if alias.name in modules else INIT for alias in node.names}
        elif node.module.startswith("agentgym."):
            names.add(_module_of(node.module, modules))
    names.discard("")
    return names


def _module_of(dotted: str, modules: set[str]) -> str:
    parts = dotted.split(".")
    if len(parts) == 1:
        return INIT
    return parts[1] if parts[1] in modules else ""  # a sub-package (http, sandbox...) is outside the graph


def import_graph() -> dict[str, set[str]]:
    """Edges ``module -> modules it imports`` among agentgym's top-level modules."""
    paths = _top_level_modules()
    modules = set(paths)
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            edges |= _imported(node, modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_finder_finds_a_lazy_cycle() -> None:
    tree = ast.parse("def f():\n    from agentgym.registry import make\n")
    assert _imported(tree.body[0].body[0], {"registry", "guard"}) == {"registry"}
    assert find_cycle({"guard": {"registry"}, "registry": {"guard"}}) == ["guard", "registry", "guard"]
    assert find_cycle({"guard": {"spec", "core"}, "registry": {"guard", "spec"}, "spec": set()}) is None


def test_env_api_modules_import_in_one_direction() -> None:
    graph = import_graph()
    assert "registry" not in graph["guard"] and "guard" not in graph["spec"] and "registry" not in graph["spec"]
    assert {"guard", "spec"} <= graph["registry"]


def test_no_import_cycle_among_top_level_modules() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"
