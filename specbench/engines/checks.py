"""What a serving engine asks of a recipe: its options on the model it serves, targets only (a drafter runs
inside its target's engine), and cells its backend can map onto its own decoding.

Each check returns None or (field, problem, fix), the field relative to the model's entry (for
:func:`model_problem`) or the method's (the others); the recipe names the file and the entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from specbench.engines import BACKENDS, ENGINE_NAMES, CellView, Problem, is_remote, option_problem
from specbench.sources import source_of, tokenizer_of


def model_problem(source: str, engine: str | None, engine_options: dict) -> Problem:
    """A serving engine's options are its backend's, and only it takes them; heads are no model an
    engine serves on its own; the backend may refuse a source whose weights it cannot read."""
    if engine not in ENGINE_NAMES:
        if engine_options:
            return (
                "engine_options",
                f"engine options apply to a serving engine ({', '.join(ENGINE_NAMES)}), and this "
                f"model runs on {engine or 'the recipe engine'}",
                f"remove engine_options, or set engine: {' or '.join(ENGINE_NAMES)} on this model",
            )
        return None
    if source_of(source).heads:
        return (
            "engine",
            f"{source} is a set of heads; an engine loads them with its target",
            "remove engine from the heads",
        )
    problem = option_problem(engine, engine_options)
    if problem:
        option, text, fix = problem
        return f"engine_options.{option}", text, fix
    serves = BACKENDS[engine].source_problem
    return serves(source, engine_options) if serves is not None else None


def drafter_problem(name: str, engine: str | None) -> Problem:
    """An engine model is only ever a target: its drafter runs inside the same engine."""
    if engine in ENGINE_NAMES:
        return (
            "drafter",
            f"{name!r} runs on {engine}; a drafter runs in its target's engine",
            f"remove engine from models.{name} (the target's engine loads it)",
        )
    return None


def cells_problem(target: str, engine: str | None, cells: Iterable[CellView]) -> Problem:
    """A cell on an engine target must map to the engine's own decoding (its backend says how);
    ``cells`` is read only when ``engine`` is a serving engine."""
    if engine not in ENGINE_NAMES:
        return None
    for cell in cells:
        _, problem = BACKENDS[engine].speculation(cell)
        if problem:
            field, text, fix = problem
            return field, f"{target!r} runs on {engine}: {text}", fix
    return None


def baseline_problem(name: str, models: Mapping, has_ar: Callable[[str], bool]) -> Problem:
    """``engine_options.baseline`` of model ``name`` (``models``: the recipe's): the AR server its
    speedups are measured against must be another ``engine: openai`` model of the recipe, with an
    autoregressive cell and no baseline of its own, and the same tokenizer where the sources tell it
    (where they do not, the loaded vocabularies are compared before the first row)."""
    spec = models[name]
    baseline = spec.engine_options.get("baseline") if spec.engine in ENGINE_NAMES else None
    if baseline is None:
        return None
    field = "engine_options.baseline"
    if baseline == name or baseline not in models:
        return (
            field,
            f"{baseline!r} is not another model of the recipe",
            "name the recipe model (engine: openai) of the AR server this one's speedups are over",
        )
    other = models[baseline]
    if not is_remote(other.engine) or other.engine_options.get("baseline"):
        runs = f"runs on {other.engine or 'specbench'}" if not is_remote(other.engine) else "has a baseline"
        return (
            field,
            f"{baseline!r} {runs}; a baseline is an AR server specbench does not start (engine: openai)",
            f"give models.{baseline} engine: openai and the AR server's base_url, without a baseline",
        )
    if not has_ar(baseline):
        return (
            field,
            f"{baseline!r} has no autoregressive cell to measure speedups against",
            f"add {{name: {baseline}-ar, method: autoregressive, target: {baseline}}} to methods",
        )
    mine, theirs = tokenizer_of(spec.source), tokenizer_of(other.source)
    if spec.source != other.source and mine and theirs and mine != theirs:
        return (
            field,
            f"{baseline!r} uses the {theirs} tokenizer and {name!r} the {mine} one (tokens of other units)",
            "pair two servers of one model family (one tokenizer)",
        )
    return None
