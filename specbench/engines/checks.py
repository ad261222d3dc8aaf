"""What a serving engine asks of a recipe: its options on the model it serves, targets only (a drafter runs
inside its target's engine), and cells its backend can map onto its own decoding.

Each check returns None or (field, problem, fix), the field relative to the model's entry (for
:func:`model_problem`) or the method's (the others); the recipe names the file and the entry.
"""

from __future__ import annotations

from collections.abc import Iterable

from specbench.engines import BACKENDS, ENGINE_NAMES, CellView, Problem, option_problem
from specbench.sources import source_of


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
