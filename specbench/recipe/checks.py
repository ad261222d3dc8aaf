"""The checks that need the whole recipe: model references, task names, labels, cell counts, and each
method's parameters as the method declares them.

What belongs to a feature is asked of its owner through its declaration: a source checks its options
(:func:`specbench.sources.option_problem`), a serving engine its options and cells
(:mod:`specbench.engines.checks`), a method its roles (:mod:`specbench.decoding.roles` and
``Method.check_roles``) and its rule across parameters (``Method.check``), replay its cells
(:mod:`specbench.decoding.replayable`), the linear layers their engine (:mod:`specbench.models.linear`).
Each answers (field, problem, fix); this module names the file and the entry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

import specbench.recipe.grid as grid
from specbench.decoding import replayable, roles
from specbench.engines import checks as engine_checks
from specbench.errors import SpecbenchError
from specbench.methods import BASELINE, METHODS, Method, ParamSpec
from specbench.recipe.experiment import Recipe, engine_cell_view
from specbench.recipe.messages import one_of, show
from specbench.recipe.schema import MAX_CELLS, GenerationSpec, LoadSpec, MethodSpec, ModelSpec
from specbench.sources import option_problem, source_of


def check_recipe(recipe: Recipe, path: Path, known_tasks: Collection[str] | None) -> None:
    """Every check across ``recipe`` (its schema already validated), in order; the first problem
    raises a SpecbenchError naming ``path``."""

    def has_ar(name: str) -> bool:
        return _has_reference(recipe, name)

    for name, model in recipe.models.items():
        _check_model(path, name, model)
    _check_linear(path, recipe)
    for index, spec in enumerate(recipe.methods):
        _check_method(recipe, index, spec, f"{path}: methods[{index}]")
    _check_every_model_is_used(recipe, path)
    for name in recipe.models:  # a server's baseline: another server's AR cell (engine: openai)
        _raise(f"{path}: models.{name}", engine_checks.baseline_problem(name, recipe.models, has_ar))
    total = sum(math.prod(len(v) for v in spec.grid.values()) for spec in recipe.methods)
    if total > MAX_CELLS:
        raise SpecbenchError(
            f"{path}: methods",
            f"give {total:,} cells in all, more than {MAX_CELLS:,}",
            "split the sweep into several recipes, or search it with `specbench tune`",
        )
    _check_datasets_are_distinct(recipe, path, known_tasks)
    if recipe.load is not None:
        _check_load(recipe.load, path)
    if known_tasks is not None:
        for index, dataset in enumerate(recipe.datasets):
            if dataset.task not in known_tasks:
                raise SpecbenchError(
                    f"{path}: datasets[{index}].task",
                    f"unknown task {dataset.task!r}",
                    one_of(dataset.task, known_tasks),
                )


def _check_load(load: LoadSpec, path: Path) -> None:
    """A load: section's levels must exist and each be able to run as it says."""
    if not load.concurrency and not load.request_rate:
        raise SpecbenchError(
            f"{path}: load",
            "lists no level",
            "give concurrency: [1, 2, 4, 8] (requests in flight) or request_rate: [0.5, 1, 2] (per second)",
        )
    if load.requests is not None and load.duration_s is not None:
        raise SpecbenchError(
            f"{path}: load.duration_s",
            f"is given beside load.requests ({load.requests}): a level is one or the other",
            "keep requests (a count per level and repeat) or duration_s (seconds per level), not both",
        )
    if load.requests is not None and load.concurrency and load.requests < max(load.concurrency):
        widest = max(load.concurrency)
        raise SpecbenchError(
            f"{path}: load.requests",
            f"{load.requests} requests per level cannot keep {widest} in flight (load.concurrency lists "
            f"{widest}): its clients would wait idle and the level measure less load than it names",
            f"raise requests to at least {widest}, or drop the concurrency levels above {load.requests}",
        )
    if load.requests is not None and load.requests * load.repeats < 2:
        raise SpecbenchError(
            f"{path}: load.requests",
            f"{load.requests} request in {load.repeats} repeat is a level without an interval (its "
            "figures are drawn again from its requests)",
            "raise requests (32 is the default) or repeats",
        )
    for rate in load.request_rate if load.duration_s is not None else ():
        if load.request_count(rate=rate) < 1:
            raise SpecbenchError(
                f"{path}: load.duration_s",
                f"{load.duration_s:g} s at {rate:g} requests/s sends no request",
                f"raise duration_s to at least {1 / rate:.3g} s, or drop rate {rate:g}",
            )


def _check_model(path: Path, name: str, model: ModelSpec) -> None:
    """Every option reaches the model's loader, so one it does not take is an error, never dropped."""
    problem = option_problem(model.source, model.options)
    if problem:
        option, text, fix = problem
        raise SpecbenchError(f"{path}: models.{name}.options.{option}", text, fix)
    if "device_map" in model.options and model.device != "auto":
        raise SpecbenchError(
            f"{path}: models.{name}.device",
            f"device: {model.device} and options.device_map both place the model",
            "keep one: device for a whole model on one device, device_map to split it",
        )
    if model.engine is not None and not source_of(model.source).neural:
        raise SpecbenchError(
            f"{path}: models.{name}.engine",
            f"{model.source} is a statistical drafter: it runs no model passes an engine could compile",
            "remove engine from this model",
        )
    if model.revision is not None and source_of(model.source).fixed_weights:
        raise SpecbenchError(
            f"{path}: models.{name}.revision",
            f"source {model.source!r} has no revisions (one fixed set of weights)",
            "remove revision (it applies to Hub models)",
        )
    problem = engine_checks.model_problem(model.source, model.engine, model.engine_options)
    if problem:
        field, text, fix = problem
        raise SpecbenchError(f"{path}: models.{name}.{field}", text, fix)


def _check_linear(path: Path, recipe: Recipe) -> None:
    """Each neural model's linear library against its engine, and the recipe's against its models."""
    from specbench.models import linear

    neural = [name for name, model in recipe.models.items() if source_of(model.source).neural]
    for name in neural:
        problem = linear.model_problem(name, recipe.models[name].linear, recipe.engine_of(name))
        if problem:
            raise SpecbenchError(f"{path}: models.{name}.linear", *problem)
    problem = linear.recipe_problem(recipe.linear, [recipe.engine_of(name) for name in neural])
    if problem:
        raise SpecbenchError(f"{path}: linear", *problem)


def _check_every_model_is_used(recipe: Recipe, path: Path) -> None:
    """A model no method uses would be listed, loaded by nobody and never checked: say so."""
    used = {name for spec in recipe.methods for name in (spec.target, spec.drafter, *(spec.drafters or ()))}
    used |= {m.options.get("of") for m in recipe.models.values() if isinstance(m.options.get("of"), str)}
    for name in recipe.models:
        if name not in used:
            raise SpecbenchError(
                f"{path}: models.{name}", "no method uses this model", "remove it, or use it in a method"
            )


def _check_datasets_are_distinct(recipe: Recipe, path: Path, known_tasks: Collection[str] | None) -> None:
    """Rows and cells are labelled task/split: two entries with the same label would share rows."""
    seen: dict[tuple[str, str | None], int] = {}
    for index, spec in enumerate(recipe.datasets):
        split = spec.split
        if split is None and known_tasks is not None and spec.task in known_tasks:
            from specbench.tasks import get_task

            split = get_task(spec.task).default_split
        label = (spec.task, split)
        if label in seen:
            shown = f"{spec.task}/{split}" if split else spec.task
            raise SpecbenchError(
                f"{path}: datasets[{index}]",
                f"{shown} is also datasets[{seen[label]}]: their rows and cells would share one label",
                "list each task and split once (give a dataset one max_new_tokens, or use another split)",
            )
        seen[label] = index


def _check_method(recipe: Recipe, index: int, spec: MethodSpec, where: str) -> None:
    """The method entry ``spec`` (``methods[index]``): its name, the models it names, and what its
    method, its parameters and its target's engine ask of them."""
    earlier = next((i for i, other in enumerate(recipe.methods[:index]) if other.name == spec.name), None)
    if earlier is not None:
        raise SpecbenchError(
            f"{where}.name", f"duplicate method name {spec.name!r} (also methods[{earlier}])", "rename one"
        )
    named = [("target", spec.target), ("drafter", spec.drafter)]
    named += [(f"drafters[{i}]", name) for i, name in enumerate(spec.drafters or ())]
    for role, name in named:
        if name is not None and name not in recipe.models:
            raise SpecbenchError(
                f"{where}.{role}",
                f"no model named {name!r}",
                f"{one_of(name, recipe.models)}, or add {name!r} under models:",
            )
    info = METHODS[spec.method]
    _raise(where, roles.roles_problem(info, spec, recipe.models))
    _check_params(spec, info, where, recipe.generation)
    for name in [spec.drafter, *(spec.drafters or [])]:
        if name is not None:
            _raise(where, engine_checks.drafter_problem(name, recipe.models[name].engine))
    views = (engine_cell_view(recipe, cell) for cell in recipe.method_cells(spec))  # read by engines only
    _raise(where, engine_checks.cells_problem(spec.target, recipe.models[spec.target].engine, views))
    if info.needs_reference and not _has_reference(recipe, spec.target):
        raise SpecbenchError(
            f"{where}.method",
            f"{spec.method} reads the autoregressive output of {spec.target!r}, but no method produces it",
            f"add {{name: ar, method: autoregressive, target: {spec.target}}} to methods",
        )
    if spec.replay:
        problem = replay_problem(recipe, spec)
        if problem:
            raise SpecbenchError(f"{where}.replay", *problem)


def _raise(where: str, problem: tuple[str, str, str] | None) -> None:
    """A problem an owner found in the method entry at ``where``, as its SpecbenchError."""
    if problem:
        field, text, fix = problem
        raise SpecbenchError(f"{where}.{field}", text, fix)


def _has_reference(recipe: Recipe, target: str) -> bool:
    """Whether ``recipe`` runs the autoregressive method on ``target`` (what oracles and replay read)."""
    return any(o.method == BASELINE and o.target == target for o in recipe.methods)


def replay_problem(recipe: Recipe, spec: MethodSpec, params: dict | None = None) -> tuple[str, str] | None:
    """Why the target of ``spec``'s cells (or of its one cell with ``params``) cannot be replayed from
    its autoregressive output, as (problem, fix); None when it can (specbench.models.replay)."""
    info = METHODS[spec.method]
    fixed = grid.defaults(info) | grid.normalized(info, spec.params)
    cells = (
        [params]
        if params is not None
        else [fixed | grid.normalized(info, point) for point in grid.points(spec.grid)]
    )
    return replayable.replay_problem(
        info, spec, recipe.generation.temperature, cells, _has_reference(recipe, spec.target)
    )


def _check_params(spec: MethodSpec, info: Method, where: str, generation: GenerationSpec) -> None:
    for section in ("params", "grid"):
        for name in getattr(spec, section):
            if name not in info.params:
                fix = one_of(name, info.params) if info.params else f"remove it: {spec.method} takes none"
                raise SpecbenchError(
                    f"{where}.{section}.{name}", f"{spec.method!r} has no parameter {name!r}", fix
                )
    for name in sorted(spec.params.keys() & spec.grid.keys()):
        raise SpecbenchError(
            f"{where}.grid.{name}", f"{name} is set in both params and grid", "keep it in only one of them"
        )
    for name, value in spec.params.items():
        _check_value(info.params[name], name, value, f"{where}.params.{name}", generation.max_new_tokens)
    cells = math.prod(len(values) for values in spec.grid.values())
    if cells > MAX_CELLS:  # before any value is checked: a huge grid costs nothing to refuse
        raise SpecbenchError(
            f"{where}.grid",
            f"gives {cells:,} cells, more than {MAX_CELLS:,}",
            "split the sweep into several recipes, or search it with `specbench tune`",
        )
    for name, values in spec.grid.items():
        if not values:
            raise SpecbenchError(
                f"{where}.grid.{name}", "the grid list is empty", "give at least one value, or remove the key"
            )
        for position, value in enumerate(values):
            _check_value(
                info.params[name], name, value, f"{where}.grid.{name}[{position}]", generation.max_new_tokens
            )
        seen: set[str] = set()  # canonical JSON: values may be lists (CS Drafting's K); linear time
        for value in values:
            canonical = json.dumps(grid.as_declared(info.params[name], value), sort_keys=True, default=str)
            if canonical in seen:
                raise SpecbenchError(
                    f"{where}.grid.{name}", f"{value!r} appears twice (two identical cells)", "list it once"
                )
            seen.add(canonical)
    if info.check is None:
        return
    fixed = grid.defaults(info) | spec.params
    for point in grid.points(spec.grid):
        problem = info.check(fixed | point, spec, generation)
        if problem:
            name, text, fix = problem
            raise SpecbenchError(f"{where}.{'grid' if name in spec.grid else 'params'}.{name}", text, fix)


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list"}


def _check_value(spec: ParamSpec, name: str, value: Any, where: str, max_new_tokens: int) -> None:
    about = f"({name}: {spec.help})"
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    fits = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: is_number,
        bool: isinstance(value, bool),
        str: isinstance(value, str),
        list: isinstance(value, list),
    }[spec.type]
    if not fits:
        example = f", e.g. {json.dumps(spec.default)}" if spec.default is not None else ""
        raise SpecbenchError(
            where,
            f"{show(value)} is not {_TYPE_WORDS[spec.type]} {about}",
            f"write {_TYPE_WORDS[spec.type]}{example}",
        )
    if spec.choices is not None and value not in spec.choices:
        raise SpecbenchError(where, f"{show(value)} is not allowed {about}", one_of(value, spec.choices))
    low, high = spec.minimum, spec.maximum
    if (low is not None and value < low) or (high is not None and value > high):
        raise SpecbenchError(where, f"{value} is out of range {about}", f"use {_bounds(name, low, high)}")
    fix = spec.validator(value) if spec.validator else None
    if fix:
        raise SpecbenchError(where, f"{value} is out of range {about}", fix)
    if name == "k" and value > max_new_tokens:  # every method's k is a draft length
        raise SpecbenchError(
            where,
            f"k = {value} is impossible with generation.max_new_tokens = {max_new_tokens}",
            f"use k <= {max_new_tokens}, or raise max_new_tokens",
        )


def _bounds(name: str, low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{low} <= {name} <= {high}"
    return f"{name} >= {low}" if low is not None else f"{name} <= {high}"
