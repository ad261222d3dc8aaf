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
    assert (
        "specbench.papers.base" in graph
        and "specbench.recipe" in graph["specbench.pipeline.experiments.tune"]
    )
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


# pipeline/'s concerns from the bottom up, the same rule one level down: what a run directory holds
# (records), numbers from rows (analysis), measuring (run), a recipe's bill (planning), measurements
# beside the run (experiments), and how results are shown (views).
PIPELINE = ("records", "analysis", "run", "planning", "experiments", "views")


def concern(module: str) -> int | None:
    parts = module.split(".")
    return PIPELINE.index(parts[2]) if parts[:2] == ["specbench", "pipeline"] and len(parts) > 2 else None


def test_pipeline_is_its_concerns_each_importing_only_those_below():
    loose = sorted(p.name for p in (PACKAGE / "pipeline").glob("*.py") if p.name != "__init__.py")
    folders = {p.name for p in (PACKAGE / "pipeline").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert loose == [] and folders == set(PIPELINE), "a pipeline module belongs to one concern's folder"
    graph = import_graph()
    upward = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if concern(m) is not None and concern(t) is not None and concern(t) > concern(m)
    )
    assert upward == []


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


def test_generic_code_names_no_method():
    """What the pipeline, the recipe and the commands need of a method is declared on it (its pass
    rule, theory, extra metrics, whether it is the baseline): none of them spells a method's name, and
    the baseline's name is spelled once, as specbench.methods.BASELINE."""
    from specbench.methods import METHODS

    def constants(path: Path) -> list[tuple[int, str]]:
        tree = ast.parse(path.read_text())
        return [
            (n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in METHODS
        ]

    generic = [PACKAGE / room for room in ("pipeline", "recipe", "cli")]
    named = [f"{p}:{line} {v!r}" for room in generic for p in room.rglob("*.py") for line, v in constants(p)]
    assert named == []
    baseline = [
        p.relative_to(PACKAGE)
        for p in PACKAGE.rglob("*.py")
        if any(v == "autoregressive" for _, v in constants(p))
    ]
    assert baseline == [Path("methods.py")]
