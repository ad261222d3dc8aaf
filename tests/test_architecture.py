"""The layout stays a map of the architecture: no import circles, every room imports only rooms below it,
every top-level module an interface (packages hold the rest), and no module above ~500 lines without its
docstring saying why."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specbench"
# The interfaces at the top; everything else lives in a package named after its role.
INTERFACES = {"__init__", "errors", "methods", "registry"}
PACKAGES = {
    "cli",
    "data",
    "decoding",
    "drafters",
    "engines",
    "models",
    "papers",
    "pipeline",
    "recipe",
    "sources",
    "tasks",
    "training",
}
# The rooms from the bottom up: a module imports from its own layer or the ones below, never above.
# models: the model interface (a pass, a draft, sampling), its engines, devices, the cache, cost tables;
# drafters and tasks build on it; sources turn a recipe's source: into a model or drafter; decoding
# implements the methods the methods registry collects; engines run a cell inside a serving engine
# (vLLM) and account for it in the methods' terms; training makes drafters and heads from sources
# and tasks; pipeline runs recipes; papers render the papers' tables; cli is the user's entry.
LAYERS = (
    {"specbench", "errors", "registry"},
    {"models"},
    {"drafters", "tasks"},
    {"sources"},
    {"methods", "decoding"},
    {"engines"},
    {"recipe"},
    {"training"},
    {"pipeline"},
    {"papers"},
    {"cli"},
)
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


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer(module: str) -> int:
    return next(i for i, rooms in enumerate(LAYERS) if room(module) in rooms)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if layer(t) > layer(m))


def test_layer_check_sees_an_upward_import():
    graph = {"specbench.models.hf": {"specbench.sources"}, "specbench.sources": {"specbench.models.hf"}}
    assert upward_imports(graph) == ["specbench.models.hf -> specbench.sources"]


def test_no_room_imports_a_room_above_it():
    graph = import_graph()
    assert {room(m) for m in graph} <= set().union(*LAYERS), "a new room needs its place in LAYERS"
    assert upward_imports(graph) == []


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
