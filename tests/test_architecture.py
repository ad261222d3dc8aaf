"""The layout stays a map of the architecture: no import circles, every top-level module an interface
(packages hold the rest), and no module above ~500 lines without its docstring saying why."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specbench"
# The interfaces at the top; everything else lives in a package named after its role.
INTERFACES = {"__init__", "cli", "errors", "methods", "recipe"}
PACKAGES = {"data", "decoding", "drafters", "models", "papers", "pipeline", "tasks"}
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the specbench modules it imports anywhere (module level or inside functions)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                assert node.level == 0, f"{path}: use absolute imports"
                targets |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        graph[module] = {hit for hit in map(owner, targets) if hit and hit != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                found.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, [*stack, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_circles():
    graph = import_graph()
    assert "specbench.papers.base" in graph and "specbench.recipe" in graph["specbench.pipeline.tune"]
    assert cycles(graph) == []


def test_generic_code_never_imports_a_paper():
    generic = [
        m for m in import_graph().items() if not m[0].startswith(("specbench.papers", "specbench.cli"))
    ]
    assert [name for name, targets in generic if any(t.startswith("specbench.papers") for t in targets)] == []


def test_top_level_rooms_are_interfaces_or_packages():
    modules = {path.stem for path in PACKAGE.glob("*.py")}
    packages = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert modules == INTERFACES and packages == PACKAGES


def test_long_modules_say_why():
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().count("\n")
        if lines > MAX_LINES:
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "on purpose" in docstring, f"{path}: {lines} lines; split it or say why in its docstring"
