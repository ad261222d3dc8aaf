"""Recipes: a YAML file names models, datasets and methods with hyperparameter grids.

``load_recipe`` validates it (unknown keys and wrong types are errors, never silent defaults)
and ``Recipe.cells`` expands every method's grid into cells. Every problem becomes one
:class:`SpecbenchError` line naming the file, the field and the fix.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specbench.errors import SpecbenchError

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
STATISTICAL_SOURCES = ("prompt-lookup", "maxgram")


@dataclass(frozen=True)
class ParamSpec:
    type: type
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple | None = None


@dataclass(frozen=True)
class MethodInfo:
    needs_drafter: bool
    params: dict[str, ParamSpec]
    help: str
    check: Any = None  # optional callable(params) -> error string or None, for cross-parameter rules


def _check_lenience(params: dict) -> str | None:
    lenience, convention = params.get("lenience", 1.0), params.get("lenience_convention", "cs")
    if convention == "cs" and lenience < 1.0:
        return f"lenience {lenience} is below 1, but the cs convention needs l >= 1"
    if convention == "leviathan" and not 0.0 < lenience <= 1.0:
        return f"lenience {lenience} is outside (0, 1], which the leviathan convention needs"
    return None


K = ParamSpec(int, 4, "draft length: tokens proposed per target verification", 1, 64)
METHODS: dict[str, MethodInfo] = {
    "autoregressive": MethodInfo(False, {}, "one target forward pass per token"),
    "speculative": MethodInfo(
        True,
        {
            "k": K,
            "lenience": ParamSpec(float, 1.0, "loosens the review (1 = lossless)", minimum=0.0),
            "lenience_convention": ParamSpec(
                str, "cs", "cs: l >= 1; leviathan: l in (0, 1]", choices=("cs", "leviathan")
            ),
        },
        "speculative decoding (Leviathan et al. 2023), greedy or sampled",
        _check_lenience,
    ),
    "hf_assisted": MethodInfo(True, {"k": K}, "transformers generate(assistant_model=...), constant k"),
    "hf_prompt_lookup": MethodInfo(
        False,
        {"k": K, "max_ngram": ParamSpec(int, 2, "longest n-gram prompt lookup matches", 1, 64)},
        "transformers generate(prompt_lookup_num_tokens=k)",
    ),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CostTableEntry(_Strict):
    table: str
    entry: str


class CostSpec(_Strict):
    pw: float | CostTableEntry | None = Field(
        default=None, description="prior-work cost relative to the target"
    )

    @field_validator("pw")
    @classmethod
    def _non_negative(cls, value):
        if isinstance(value, float) and value < 0:
            raise ValueError("a cost must be >= 0")
        return value


class ModelSpec(_Strict):
    source: str
    dtype: Literal["float32", "float64", "bfloat16", "float16", "auto"] = "auto"
    device: str = Field(default="auto", pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$")
    revision: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    cost: CostSpec | None = None


class DatasetSpec(_Strict):
    task: str
    split: str | None = None
    limit: int | None = Field(default=None, ge=1)
    data_files: Path | None = None
    chat_template: bool = True


class GenerationSpec(_Strict):
    max_new_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    top_k: int = Field(default=0, ge=0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)


class MethodSpec(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    method: str
    target: str
    drafter: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)


class Recipe(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    seed: int = 0
    warmup: int = Field(default=1, ge=0)
    lossless_check: bool = True
    generation: GenerationSpec = Field(default_factory=GenerationSpec)
    models: dict[str, ModelSpec] = Field(min_length=1)
    datasets: list[DatasetSpec] = Field(min_length=1)
    methods: list[MethodSpec] = Field(min_length=1)
    path: Path = Field(default=Path("<recipe>"), exclude=True)

    def cells(self) -> list[Cell]:
        cells = []
        for spec in self.methods:
            info = METHODS[spec.method]
            base = {name: p.default for name, p in info.params.items()} | spec.params
            keys = sorted(spec.grid)
            for values in itertools.product(*(spec.grid[k] for k in keys)):
                point = dict(zip(keys, values, strict=True))
                cells.append(
                    Cell(spec.name, spec.method, spec.target, spec.drafter, base | point, tuple(keys))
                )
        return cells

    def resolved(self) -> dict:
        data = self.model_dump(mode="json")
        for method in data["methods"]:
            info = METHODS[method["method"]]
            method["params"] = {name: p.default for name, p in info.params.items()} | method["params"]
        return data


@dataclass(frozen=True)
class Cell:
    method_name: str
    method: str
    target: str
    drafter: str | None
    params: dict = field(hash=False)
    grid_keys: tuple = ()

    @property
    def id(self) -> str:
        if not self.grid_keys:
            return self.method_name
        return self.method_name + "[" + ",".join(f"{k}={self.params[k]}" for k in self.grid_keys) + "]"

    def fingerprint(self, recipe: Recipe) -> str:
        """Hash of everything that determines this cell's outputs (and nothing else)."""
        models = {
            role: recipe.models[name].model_dump(mode="json")
            for role, name in (("target", self.target), ("drafter", self.drafter))
            if name
        }
        payload = {
            "method": self.method,
            "params": self.params,
            "models": models,
            "generation": recipe.generation.model_dump(mode="json"),
            "seed": recipe.seed,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def load_recipe(path: str | Path, known_tasks: Collection[str] | None = None) -> Recipe:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecbenchError(
            str(path), "recipe file not found", "check the path (recipes live in recipes/)"
        ) from None
    except OSError as error:
        raise SpecbenchError(
            str(path), f"cannot read the recipe ({error.strerror})", "check its permissions"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise SpecbenchError(str(path), f"{line}{problem}", "fix the YAML syntax") from None
    if not isinstance(data, dict):
        raise SpecbenchError(
            str(path), "a recipe must be a YAML mapping", "start with `name:`, `models:`, ..."
        )
    return parse_recipe(data, path, known_tasks)


def parse_recipe(data: dict, path: str | Path, known_tasks: Collection[str] | None = None) -> Recipe:
    path = Path(path)
    try:
        recipe = Recipe.model_validate({**data, "path": path})
    except ValidationError as error:
        raise _first_error(path, error) from None
    _check_references(recipe, path, known_tasks)
    return recipe


def _where(loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _first_error(path: Path, error: ValidationError) -> SpecbenchError:
    errors = error.errors()
    first = errors[0]
    loc = [
        p for p in first["loc"] if not (isinstance(p, str) and ("[" in p or p in ("float", "CostTableEntry")))
    ]
    kind, more = first["type"], f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    where = f"{path}: {_where(loc)}"
    if kind == "extra_forbidden":
        return SpecbenchError(
            where, f"unknown key{more}", "remove it or check its spelling against the README"
        )
    if kind == "missing":
        return SpecbenchError(where, f"required field is missing{more}", "add it")
    value = first.get("input")
    shown = (
        json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    )
    return SpecbenchError(
        where, f"{shown} is invalid: {first['msg']}{more}", "give a value of the right type and range"
    )


def _check_references(recipe: Recipe, path: Path, known_tasks: Collection[str] | None) -> None:
    names = sorted(recipe.models)
    seen = set()
    for i, method in enumerate(recipe.methods):
        where = f"{path}: methods[{i}]"
        if method.name in seen:
            raise SpecbenchError(
                f"{where}.name", f"duplicate method name {method.name!r}", "give each method a unique name"
            )
        seen.add(method.name)
        info = METHODS.get(method.method)
        if info is None:
            raise SpecbenchError(
                f"{where}.method", f"unknown method {method.method!r}", f"use one of {sorted(METHODS)}"
            )
        for role in ("target", "drafter"):
            name = getattr(method, role)
            if name is not None and name not in recipe.models:
                raise SpecbenchError(
                    f"{where}.{role}", f"no model named {name!r}", f"use one of {names} or define it"
                )
        if recipe.models[method.target].source in STATISTICAL_SOURCES:
            raise SpecbenchError(
                f"{where}.target", "a statistical drafter cannot be a target", "use a neural model"
            )
        if info.needs_drafter and method.drafter is None:
            raise SpecbenchError(
                f"{where}.drafter", f"method {method.method!r} needs a drafter", "name a drafter model"
            )
        if not info.needs_drafter and method.drafter is not None:
            raise SpecbenchError(
                f"{where}.drafter", f"method {method.method!r} takes no drafter", "remove it"
            )
        _check_params(method, info, where, recipe.generation.max_new_tokens)
    for i, dataset in enumerate(recipe.datasets):
        where = f"{path}: datasets[{i}]"
        if known_tasks is not None and dataset.task not in known_tasks:
            raise SpecbenchError(
                f"{where}.task", f"unknown task {dataset.task!r}", f"use one of {sorted(known_tasks)}"
            )
        if dataset.data_files is not None:
            resolved = (
                dataset.data_files if dataset.data_files.is_absolute() else path.parent / dataset.data_files
            )
            if not resolved.is_file() or not os.access(resolved, os.R_OK):
                raise SpecbenchError(
                    f"{where}.data_files", f"cannot read {resolved}", "give the path of a JSONL file"
                )
            object.__setattr__(dataset, "data_files", resolved)


def _check_params(method: MethodSpec, info: MethodInfo, where: str, max_new_tokens: int) -> None:
    allowed = sorted(info.params) or ["(none)"]
    for section in ("params", "grid"):
        for name in getattr(method, section):
            if name not in info.params:
                raise SpecbenchError(
                    f"{where}.{section}.{name}",
                    f"unknown parameter of {method.method!r}",
                    f"use one of {allowed}",
                )
    for name in set(method.params) & set(method.grid):
        raise SpecbenchError(f"{where}.grid.{name}", "set in both params and grid", "keep it in one of them")
    values = [(f"params.{n}", n, v) for n, v in method.params.items()]
    for name, options in method.grid.items():
        if not options:
            raise SpecbenchError(f"{where}.grid.{name}", "empty list", "give at least one value")
        values += [(f"grid.{name}[{j}]", name, v) for j, v in enumerate(options)]
    for field_path, name, value in values:
        problem = _param_problem(info.params[name], value, name, max_new_tokens)
        if problem:
            raise SpecbenchError(f"{where}.{field_path}", problem[0], problem[1])
    base = {n: p.default for n, p in info.params.items()} | method.params
    if info.check:
        for point in itertools.product(*method.grid.values()):
            problem = info.check(base | dict(zip(method.grid, point, strict=True)))
            if problem:
                raise SpecbenchError(f"{where}", problem, "change lenience or lenience_convention")


def _param_problem(spec: ParamSpec, value, name: str, max_new_tokens: int) -> tuple[str, str] | None:
    expected = spec.type
    ok = isinstance(value, expected) and not isinstance(value, bool)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        return f"{json.dumps(value)} is not a{'n' if expected is int else ''} {expected.__name__}", spec.help
    if spec.choices and value not in spec.choices:
        return f"{value!r} is not allowed", f"use one of {list(spec.choices)}"
    if spec.minimum is not None and (value < spec.minimum if expected is int else value <= spec.minimum):
        bound = f">= {spec.minimum}" if expected is int else f"> {spec.minimum}"
        return f"{value} is out of range", f"use values {bound}"
    if spec.maximum is not None and value > spec.maximum:
        return f"{value} is out of range", f"use values <= {spec.maximum}"
    if name == "k" and value > max_new_tokens:
        return f"k = {value} is impossible with max_new_tokens = {max_new_tokens}", "use k <= max_new_tokens"
    return None
