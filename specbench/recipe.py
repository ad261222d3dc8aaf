"""Recipes: a YAML file names models, datasets and methods with hyperparameter grids.

``load_recipe`` validates it (unknown keys and wrong types are errors, never silent defaults)
and ``Recipe.cells`` expands every method's grid into cells. Every problem becomes one
:class:`SpecbenchError` line naming the file, the field and the fix, e.g.
``recipes/x.yaml: methods[1].grid.k[0]: 0 is out of range (k: draft length, ...) — fix: use 1 <= k <= 64``.

Validation has two layers: pydantic checks the shape, types and ranges of the schema; plain
Python then checks what needs the whole recipe (model references, task names, and each method's
parameters and cross-field rule, which the method declares next to its algorithm and the registry
:data:`specbench.methods.METHODS` hands over). Nothing here knows a particular method.

One file of ~700 lines on purpose: the schema, the checks across it and their wording are one contract
(a field's rule and its one-line message sit together), and half of it is the messages themselves.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import os
import re
import types
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from specbench.errors import SpecbenchError, expand_home
from specbench.methods import METHODS, Method, ParamSpec
from specbench.models.costs import cost_tables

MAX_NAME = 100  # a recipe's name is a folder name under results/
NAME_PATTERN = rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_NAME - 1}}}"


# -- the schema --------------------------------------------------------------------------------


def _invalid(problem: str, fix: str) -> PydanticCustomError:
    """A pydantic error that carries our own problem and fix through to the SpecbenchError."""
    return PydanticCustomError("specbench", "{problem}", {"problem": problem, "fix": fix})


def _check_name(value: str) -> str:
    if not re.fullmatch(NAME_PATTERN, value):  # never "." or "..": the folder itself or the one above
        raise _invalid(
            f"{value[:60]!r}{'...' if len(value) > 60 else ''} is not a valid name",
            f"use up to {MAX_NAME} letters, digits, '_', '.' and '-', starting with a letter or digit",
        )
    return value


Name = Annotated[str, AfterValidator(_check_name)]


class _Strict(BaseModel):
    # strict: "3" is not an int and true is not a number; extra="forbid": a misspelt key is an error.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class CostTableEntry(_Strict):
    table: str
    entry: str


def _table_entry(value: dict) -> CostTableEntry:
    if set(value) != {"table", "entry"}:
        raise _invalid(f"a cost table reference has keys {sorted(value)}", "write {table: NAME, entry: NAME}")
    tables = cost_tables()
    table = tables.get(value["table"])
    if table is None:
        raise _invalid(f"unknown cost table {value['table']!r}", _one_of(value["table"], tables))
    if value["entry"] not in table["entries"]:
        raise _invalid(
            f"cost table {value['table']!r} has no entry {value['entry']!r}",
            _one_of(value["entry"], table["entries"]),
        )
    return CostTableEntry(table=value["table"], entry=value["entry"])


class CostSpec(_Strict):
    pw: float | CostTableEntry | None = None  # prior-work cost relative to the target (= 1)

    @field_validator("pw", mode="before")
    @classmethod
    def _number_or_table_entry(cls, value):
        # Checked by hand: a plain union would report one error per member type.
        if value is None or isinstance(value, CostTableEntry):
            return value
        if isinstance(value, dict):
            return _table_entry(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                raise _invalid(f"{value} is a negative cost", "use a number >= 0 (the target costs 1)")
            return float(value)
        raise _invalid(
            f"{_show(value)} is neither a number nor a cost table entry",
            "use a number >= 0 or {table: NAME, entry: NAME}",
        )


class ModelSpec(_Strict):
    source: str = Field(min_length=1)
    dtype: Literal["float32", "float64", "bfloat16", "float16", "auto"] = "auto"
    device: str = "auto"
    revision: str | None = None
    # eager Hugging Face passes, or specbench.models.compiled (static cache + compiled fixed shapes),
    # or a serving engine (specbench.engines: vllm); unset: the recipe's engine. Statistical drafters
    # have none.
    engine: Literal["eager", "compiled", "vllm"] | None = None
    # which library runs the linear layers on the eager engine (specbench.models.linear); unset: the
    # recipe's linear
    linear: Literal["aten", "onednn", "auto"] | None = None
    # a serving engine's own settings (specbench.engines.<engine>.OPTIONS), checked when read
    engine_options: dict[str, Any] = Field(default_factory=dict)
    # passed to the loader; each kind of source in specbench.sources declares the options it takes
    options: dict[str, Any] = Field(default_factory=dict)
    cost: CostSpec | None = None

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
            raise _invalid(f"{value!r} is not a device", "use auto, cpu, cuda, cuda:N or mps")
        return value


# the longest output a recipe may ask for (beyond any model's context, so only typos reach it)
MAX_NEW_TOKENS = 1_048_576
# the most cells one recipe may hold: a sweep beyond it is a search (`specbench tune`) or several runs
MAX_CELLS = 10_000


class DatasetSpec(_Strict):
    task: str
    split: str | None = None
    limit: int | None = Field(default=None, ge=1)
    every: int = Field(default=1, ge=1)  # every N-th example (a sample across a sorted set), then limit
    data_files: Path | None = Field(default=None, strict=False)
    chat_template: bool = True
    # run the generated code against the task's tests (pass@1 of code tasks), in
    # specbench.tasks.sandbox; off by default, and then those rows carry no pass@1
    execute_code: bool = False
    # this dataset's output length, when it differs from generation.max_new_tokens (papers set one
    # per task: e.g. 5 tokens for QA, 320 for GSM8K)
    max_new_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)

    @field_validator("data_files")
    @classmethod
    def _readable(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        recipe_dir = (info.context or {}).get("recipe_dir", Path("."))
        try:
            path = expand_home(value, "data_files")
        except SpecbenchError as error:
            raise _invalid(error.problem, error.fix) from None
        path = path if path.is_absolute() else recipe_dir / path
        if not path.is_file() or not os.access(path, os.R_OK):
            raise _invalid(
                f"cannot read {path}",
                "give a readable .jsonl file (a relative path starts at the recipe's folder)",
            )
        return path


class GenerationSpec(_Strict):
    max_new_tokens: int = Field(default=128, ge=1, le=MAX_NEW_TOKENS)
    temperature: float = Field(default=0.0, ge=0.0, le=100.0, allow_inf_nan=False)  # 0 = greedy
    top_k: int = Field(default=0, ge=0)  # 0 = off
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    # prompt + new tokens at most, as transformers' max_length (SpecDec++'s release: 512); None: no cap
    # beyond max_new_tokens, which still caps every example
    max_length: int | None = Field(default=None, ge=2)

    def budget(self, prompt_tokens: int, max_new_tokens: int | None = None) -> int:
        """New tokens an example may generate: ``max_new_tokens`` (the dataset's, else this one's),
        no more than ``max_length`` leaves after the prompt."""
        budget = max_new_tokens or self.max_new_tokens
        return budget if self.max_length is None else min(budget, self.max_length - prompt_tokens)


class LoadSpec(_Strict):
    """``specbench load``: the recipe's engine cells served on 127.0.0.1 and driven at each concurrency
    (specbench.engines.load)."""

    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = Field(min_length=1)
    # requests per level; None: max(8, 2 x concurrency)
    requests: int | None = Field(default=None, ge=1, le=1_000_000)
    # the service-level objective goodput counts requests against
    slo_ttft_s: float = Field(default=2.0, gt=0)
    slo_tpot_s: float = Field(default=0.2, gt=0)
    timeout_s: float = Field(default=600.0, gt=0)  # one request's limit


class MethodSpec(_Strict):
    name: Name
    method: str
    target: str
    drafter: str | None = None
    drafters: list[str] | None = None  # a cascade: neural drafters largest first, a statistical one last
    params: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    # greedy lossless methods: count the target's reviews from its AR output instead of running it
    # (specbench.models.replay); the rows' walltime then excludes the target and is reported as NaN
    replay: bool = False

    @field_validator("method")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value not in METHODS:
            raise _invalid(f"unknown method {value!r}", _one_of(value, METHODS))
        return value


class Recipe(_Strict):
    name: Name
    description: str = ""
    seed: int = 0
    warmup: int = Field(default=1, ge=0)  # examples run once per cell before timing, not recorded
    lossless_check: bool = True
    replay_check: int = Field(default=2, ge=0)  # first N examples of every replayed cell also run live
    # the order rows are measured in (specbench.pipeline.schedule): every cell per example back to back
    # (drift hits all alike), or each cell over all its examples in turn
    schedule: Literal["interleaved", "by-cell"] = "interleaved"
    # each timed row measured this many times (outputs and counts must agree); rows keep every repeat
    repeats: int = Field(default=1, ge=1, le=100)
    # the engine of every neural model that names none (eager: what the papers measured)
    engine: Literal["eager", "compiled"] = "eager"
    # the linear layers' library of every eager CPU model that names none (specbench.models.linear):
    # aten (torch's default), onednn (weights reordered once), auto (the faster here, timed at load)
    linear: Literal["aten", "onednn", "auto"] = "aten"
    # torch's intra-op threads for the run (None: torch's default, one per core); part of the machine
    # a run directory records, so a resume with another count is refused like another machine
    threads: int | None = Field(default=None, ge=1, le=4096)
    generation: GenerationSpec = Field(default_factory=GenerationSpec)
    # engine cells under load (specbench load RECIPE); ignored by specbench run
    load: LoadSpec | None = None
    models: dict[str, ModelSpec] = Field(min_length=1)
    datasets: list[DatasetSpec] = Field(min_length=1)
    methods: list[MethodSpec] = Field(min_length=1)
    # Private, so it is neither a recipe key nor part of dumps, equality or fingerprints.
    _path: Path = PrivateAttr(default=Path("<recipe>"))
    # model -> the dtype its ``dtype: auto`` resolved to where a run measured it (pin_auto_dtypes)
    _auto_dtypes: dict[str, str] = PrivateAttr(default_factory=dict)

    def pin_auto_dtypes(self, recorded: dict[str, str]) -> None:
        """Resolve ``dtype: auto`` as the machine that ran a directory did (``recorded``: model ->
        dtype name, from its environment.json), not as this one would: re-keying another machine's
        rows (``specbench check``) must not depend on whether this CPU computes bfloat16 fast."""
        self._auto_dtypes = dict(recorded)

    @property
    def path(self) -> Path:
        return self._path

    def engine_of(self, name: str) -> str:
        """The engine model ``name`` runs on: its own ``engine``, else the recipe's; statistical
        drafters always ``eager`` (they run no passes)."""
        if not _source(self.models[name].source).neural:
            return "eager"
        return self.models[name].engine or self.engine

    def linear_of(self, name: str) -> str:
        """The linear layers' library of model ``name`` as the recipe asks for it: its own ``linear``,
        else the recipe's; aten for statistical drafters and models on other engines than eager."""
        if not _source(self.models[name].source).neural or self.engine_of(name) != "eager":
            return "aten"
        return self.models[name].linear or self.linear

    def reference_model(self, name: str) -> str:
        """The model whose autoregressive output checks ``name``'s lossless cells: itself, or for a model
        on a serving engine the recipe's model of the same weights (source, revision, dtype, options)
        that specbench runs itself and decodes autoregressively, when there is one."""
        from specbench.engines import ENGINE_NAMES

        spec = self.models[name]
        if spec.engine not in ENGINE_NAMES:
            return name
        same = (spec.source, spec.revision, self.dtype_of(name), spec.options)
        for other, model in self.models.items():
            weights = (model.source, model.revision, self.dtype_of(other), model.options)
            if model.engine in ENGINE_NAMES or weights != same:
                continue
            if any(m.method == "autoregressive" and m.target == other for m in self.methods):
                return other
        return name

    def dtype_of(self, name: str) -> str | None:
        """The dtype model ``name`` loads in on this machine (``auto`` resolved, without loading it);
        None for statistical drafters."""
        spec = self.models[name]
        if not _source(spec.source).neural:
            return None
        if spec.dtype == "auto" and name in self._auto_dtypes:
            return self._auto_dtypes[name]
        from specbench.models.devices import resolve_device
        from specbench.sources import dtype_choice

        return dtype_choice(spec.dtype, resolve_device(spec.device), spec.source)[0]

    def cells(self) -> list[Cell]:
        """Methods in recipe order; within one, the cartesian product of its grid in sorted-key order."""
        cells = []
        for spec in self.methods:
            info = METHODS[spec.method]
            fixed = _defaults(info) | _normalized(info, spec.params)
            keys = tuple(sorted(spec.grid))
            for values in itertools.product(*(spec.grid[key] for key in keys)):
                point = _normalized(info, dict(zip(keys, values, strict=True)))
                cells.append(
                    Cell(
                        spec.name,
                        spec.method,
                        spec.target,
                        spec.drafter,
                        fixed | point,
                        keys,
                        tuple(spec.drafters or ()),
                        spec.replay,
                    )
                )
        return cells

    def identity(self) -> str:
        """A digest of the experiment this recipe defines, which a run directory records: the fields
        as written (defaults left out, so a field added to the schema later changes no digest), less
        its name, description, threads, schedule and load (they change no row), with data files by name
        (a checkout elsewhere names them by another path; their content is in the rows' keys)."""
        data = self.model_dump(
            mode="json",
            exclude_defaults=True,
            exclude={"name", "description", "threads", "schedule", "load"},
        )
        for dataset in data.get("datasets", []):
            if dataset.get("data_files"):
                dataset["data_files"] = Path(dataset["data_files"]).name
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def resolved(self) -> dict:
        """Every default filled in, as plain data; loading it again gives the same cells."""
        data = self.model_dump(mode="json")
        for name, model in data["models"].items():  # JSON made max_memory's GPU indices strings
            memory = (model.get("options") or {}).get("max_memory")
            if isinstance(memory, dict):
                given = self.models[name].options["max_memory"]
                model["options"]["max_memory"] = {key: given[key] for key in given}
        for dumped, spec in zip(data["methods"], self.methods, strict=True):
            info = METHODS[spec.method]
            params = _defaults(info) | _normalized(info, spec.params)
            dumped["params"] = {name: value for name, value in params.items() if name not in spec.grid}
        return data


def _defaults(info: Method) -> dict:
    return {name: spec.default for name, spec in info.params.items()}


def _normalized(info: Method, params: dict) -> dict:
    return {name: _as_declared(info.params[name], value) for name, value in params.items()}


def _as_declared(spec: ParamSpec, value: Any) -> Any:
    # 1 and 1.0 for a float parameter must give the same cell id and fingerprint.
    return float(value) if spec.type is float else value


@dataclass(frozen=True)
class Cell:
    method_name: str  # the recipe's label, e.g. "sd-lookup"
    method: str  # a key of METHODS, e.g. "speculative"
    target: str  # model names in recipe.models
    drafter: str | None
    params: dict = field(hash=False)  # defaults + params + this grid point
    grid_keys: tuple[str, ...] = ()
    drafters: tuple[str, ...] = ()  # a cascade's drafters, largest first (cs_drafting)
    replay: bool = False  # the target is replayed from the AR cell's output (walltime excludes it)

    @property
    def id(self) -> str:
        """``sd-lookup[k=4]``, ``cs[K=[[2,4],[0,3]]]``: the label plus this cell's grid values; just the
        label without a grid."""
        if not self.grid_keys:
            return self.method_name
        values = (f"{key}={_compact(self.params[key])}" for key in self.grid_keys)
        return f"{self.method_name}[{','.join(values)}]"

    def fingerprint(self, recipe: Recipe) -> str:
        """Hash of everything that determines this cell's outputs, and of nothing else in the recipe."""
        payload = {
            "method": self.method,
            "params": {
                name: value
                for name, value in self.params.items()
                if not _omitted_default(METHODS[self.method].params.get(name), value)
            },
            "target": _model_payload(recipe, self.target),
            "drafter": _model_payload(recipe, self.drafter) if self.drafter else None,
            # max_length enters only when set, so cells from before it existed keep their keys
            "generation": recipe.generation.model_dump(mode="json", exclude_none=True),
            "seed": recipe.seed,
        }
        if self.drafters:  # only cascades carry the key, so other cells keep their fingerprints
            payload["drafters"] = [_model_payload(recipe, name) for name in self.drafters]
        if METHODS[self.method].revision > 1:
            payload["revision"] = METHODS[self.method].revision
        if self.replay:  # same counts and outputs, but the walltime of replayed rows is not measured
            payload["replay"] = True
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _model_payload(recipe: Recipe, name: str) -> dict:
    """A model as it enters fingerprints: its recipe entry, and for ``dtype: auto`` the dtype that
    resolves to on this machine, so that rows measured in bfloat16 never resume as float32 ones.
    The engine enters only when compiled (outputs may differ in low precision; times do), so rows
    measured before engines existed keep their keys."""
    spec = recipe.models[name]
    payload = spec.model_dump(mode="json")
    del payload["engine"]
    if not payload["engine_options"]:  # recipes from before engines keep their fingerprints
        del payload["engine_options"]
    del payload["linear"]
    if recipe.linear_of(name) != "aten":  # as the engine: the default keeps existing fingerprints
        payload["linear"] = recipe.linear_of(name)
    if recipe.engine_of(name) != "eager":
        payload["engine"] = recipe.engine_of(name)
    if spec.dtype == "auto" and _source(spec.source).dtype_rule is not None:
        resolved = recipe.dtype_of(name)
        if resolved != "float32":  # float32, the old resolution on CPU, keeps existing fingerprints
            payload["resolved_dtype"] = resolved
    return payload


def _omitted_default(spec: ParamSpec | None, value: Any) -> bool:
    return spec is not None and spec.added_later and value == spec.default


def _compact(value: Any) -> Any:
    """Grid values in cell ids: lists as compact JSON ([[2,4],[0,3]]), the rest as Python prints them."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list) else value


# -- loading -----------------------------------------------------------------------------------


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        explicit = [(k, v) for k, v in node.value if k.tag != "tag:yaml.org,2002:merge"]
        if len(explicit) < len(node.value):  # `<<: *defaults`: merged keys may be overridden
            self.flatten_mapping(node)
        for key_node, _ in explicit:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # unhashable keys are reported by SafeLoader itself
            if key in seen:
                raise _DuplicateKey(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_recipe(path: str | Path, known_tasks: Collection[str] | None = None) -> Recipe:
    """Read, validate and return a recipe; any problem is one SpecbenchError line."""
    path = Path(path)
    return parse_recipe(_extended(_read_yaml(path), path), path, known_tasks)


def _extended(data, path: Path, chain: tuple[Path, ...] = ()):
    """A recipe with ``extends: other.yaml`` is that recipe with this file's keys laid over it:
    mappings merge key by key (so ``models: {large: {source: ...}}`` swaps one model and keeps its
    dtype and device), anything else, lists included, replaces the base's value. The base is found
    relative to the extending file; relative paths inside either resolve from the extending file."""
    if not isinstance(data, dict) or "extends" not in data:
        return data
    data = dict(data)
    base_name = data.pop("extends")
    field = f"{path}: extends"
    if not isinstance(base_name, str) or not base_name.strip():
        raise SpecbenchError(field, "must name one recipe file", "e.g. extends: gemma_2b_27b.yaml")
    base_path = path.parent / base_name
    here = path.resolve()
    if base_path.resolve() in chain + (here,):
        raise SpecbenchError(
            field, f"{base_name} leads back to this recipe", "let one recipe of the chain stand alone"
        )
    if not base_path.is_file():
        raise SpecbenchError(
            field, f"{base_name} not found in {path.parent}", "give the base recipe's path relative to it"
        )
    base = _extended(_read_yaml(base_path), base_path, chain + (here,))
    if not isinstance(base, dict):
        raise SpecbenchError(field, f"{base_name} is not a recipe mapping", "extend a recipe file")
    return _overlay(base, data)


def _overlay(base: dict, over: dict) -> dict:
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = _overlay(base[key], value) if both else value
    return merged


def _read_yaml(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecbenchError(
            str(path), "recipe file not found", "check the path (recipes live in recipes/)"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise SpecbenchError(
            str(path), f"cannot read the recipe ({reason})", "give a readable YAML file"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as error:
        raise _yaml_error(path, error) from None
    except RecursionError:
        raise SpecbenchError(
            str(path), "is nested too deeply to be a recipe", "a recipe is a few levels of mappings and lists"
        ) from None
    return data


def parse_recipe(data: dict, path: str | Path, known_tasks: Collection[str] | None = None) -> Recipe:
    """Validate already-parsed YAML; ``path`` names the file in messages and anchors relative paths."""
    path = Path(path)
    if not isinstance(data, dict):
        raise SpecbenchError(
            str(path), "a recipe must be a YAML mapping", "start with name:, models:, datasets: and methods:"
        )
    try:
        recipe = Recipe.model_validate(data, context={"recipe_dir": path.parent})
    except ValidationError as error:
        raise _from_validation_error(path, error) from None
    recipe._path = path
    for name, model in recipe.models.items():
        _check_options(path, name, model)
    _check_linear(path, recipe)
    for index, spec in enumerate(recipe.methods):
        _check_method(recipe, index, spec, f"{path}: methods[{index}]")
    _check_every_model_is_used(recipe, path)
    total = sum(math.prod(len(v) for v in spec.grid.values()) for spec in recipe.methods)
    if total > MAX_CELLS:
        raise SpecbenchError(
            f"{path}: methods",
            f"give {total:,} cells in all, more than {MAX_CELLS:,}",
            "split the sweep into several recipes, or search it with `specbench tune`",
        )
    _check_datasets_are_distinct(recipe, path, known_tasks)
    if known_tasks is not None:
        for index, dataset in enumerate(recipe.datasets):
            if dataset.task not in known_tasks:
                raise SpecbenchError(
                    f"{path}: datasets[{index}].task",
                    f"unknown task {dataset.task!r}",
                    _one_of(dataset.task, known_tasks),
                )
    return recipe


def _yaml_error(path: Path, error: yaml.YAMLError) -> SpecbenchError:
    mark = getattr(error, "problem_mark", None)
    at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(error, "problem", None) or "invalid YAML"
    fix = "keep only one of them" if isinstance(error, _DuplicateKey) else "fix the YAML syntax there"
    return SpecbenchError(str(path), f"{at}{problem}", fix)


# -- checks that need the whole recipe ---------------------------------------------------------


def _source(source: str):
    """The kind of source (specbench.sources.Source) that ``source`` names; the registry's modules
    import torch only when they load, so validating a recipe stays fast."""
    from specbench.sources import source_of

    return source_of(source)


def _check_options(path: Path, name: str, model: ModelSpec) -> None:
    """Every option reaches the model's loader, so one it does not take is an error, never dropped."""
    from specbench.sources import option_problem

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
    if model.engine is not None and not _source(model.source).neural:
        raise SpecbenchError(
            f"{path}: models.{name}.engine",
            f"{model.source} is a statistical drafter: it runs no model passes an engine could compile",
            "remove engine from this model",
        )
    if model.revision is not None and _source(model.source).fixed_weights:
        raise SpecbenchError(
            f"{path}: models.{name}.revision",
            f"source {model.source!r} has no revisions (one fixed set of weights)",
            "remove revision (it applies to Hub models)",
        )
    _check_engine_options(path, name, model)


def _check_linear(path: Path, recipe: Recipe) -> None:
    """oneDNN's reordered weights serve the eager engine only: the compiled engine's graphs take the
    weights as inputs, and a serving engine picks its own kernels. The recipe's ``linear`` applies to
    its eager models, so it needs one."""
    neural = [name for name, model in recipe.models.items() if _source(model.source).neural]
    for name in neural:
        wanted, engine = recipe.models[name].linear, recipe.engine_of(name)
        if wanted not in (None, "aten") and engine != "eager":
            raise SpecbenchError(
                f"{path}: models.{name}.linear",
                f"linear: {wanted} applies to the eager engine, and model {name} runs on the {engine} engine",
                f"set engine: eager on model {name}, or remove its linear",
            )
    if recipe.linear != "aten" and not any(recipe.engine_of(name) == "eager" for name in neural):
        raise SpecbenchError(
            f"{path}: linear",
            f"linear: {recipe.linear} applies to models on the eager engine, and this recipe has none",
            "remove linear, or run a model on engine: eager",
        )


def _check_engine_options(path: Path, name: str, model: ModelSpec) -> None:
    """A serving engine's options are its backend's (specbench.engines), and only it takes them."""
    from specbench import engines

    if model.engine not in engines.ENGINE_NAMES:
        if model.engine_options:
            raise SpecbenchError(
                f"{path}: models.{name}.engine_options",
                f"engine options apply to a serving engine ({', '.join(engines.ENGINE_NAMES)}), and this "
                f"model runs on {model.engine or 'the recipe engine'}",
                "remove engine_options, or set engine: vllm on this model",
            )
        return
    if _source(model.source).heads:
        raise SpecbenchError(
            f"{path}: models.{name}.engine",
            f"{model.source} is a set of heads; an engine loads them with its target",
            "remove engine from the heads",
        )
    problem = engines.option_problem(model.engine, model.engine_options)
    if problem:
        option, text, fix = problem
        raise SpecbenchError(f"{path}: models.{name}.engine_options.{option}", text, fix)


def _check_engine_cells(recipe: Recipe, spec: MethodSpec, where: str) -> None:
    """A cell on an engine target must map to the engine's own decoding (its backend says how), and
    an engine model is only ever a target: its drafter runs inside the same engine."""
    from specbench import engines

    for name in [spec.drafter, *(spec.drafters or [])]:
        if name is not None and recipe.models[name].engine in engines.ENGINE_NAMES:
            raise SpecbenchError(
                f"{where}.drafter",
                f"{name!r} runs on {recipe.models[name].engine}; a drafter runs in its target's engine",
                f"remove engine from models.{name} (the target's engine loads it)",
            )
    engine = recipe.models[spec.target].engine
    if engine not in engines.ENGINE_NAMES:
        return
    for cell in recipe.cells():
        if cell.method_name != spec.name:
            continue
        _, problem = engines.BACKENDS[engine].speculation(engine_cell_view(recipe, cell))
        if problem:
            field, text, fix = problem
            raise SpecbenchError(f"{where}.{field}", f"{spec.target!r} runs on {engine}: {text}", fix)


def engine_cell_view(recipe: Recipe, cell: Cell):
    """What an engine backend reads of ``cell`` to map it onto its own decoding."""
    from specbench.engines import CellView

    drafter = cell.drafter
    spec = recipe.models[drafter] if drafter else None
    return CellView(
        cell.method,
        dict(cell.params),
        drafter,
        _source(spec.source).kind if spec else None,
        dict(spec.options) if spec else {},
        recipe.generation.temperature == 0,
    )


def _check_every_model_is_used(recipe: Recipe, path: Path) -> None:
    """A model no method uses would be listed, loaded by nobody and never checked: say so."""
    used = {name for spec in recipe.methods for name in (spec.target, spec.drafter, *(spec.drafters or ()))}
    used |= {m.options.get("of") for m in recipe.models.values() if isinstance(m.options.get("of"), str)}
    for name in recipe.models:
        if name not in used:
            raise SpecbenchError(
                f"{path}: models.{name}", "no method uses this model", "remove it, or use it in a method"
            )


def _check_datasets_are_distinct(recipe: Recipe, path: Path, known_tasks) -> None:
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
    earlier = next((i for i, other in enumerate(recipe.methods[:index]) if other.name == spec.name), None)
    if earlier is not None:
        raise SpecbenchError(
            f"{where}.name", f"duplicate method name {spec.name!r} (also methods[{earlier}])", "rename one"
        )
    roles = [("target", spec.target), ("drafter", spec.drafter)]
    roles += [(f"drafters[{i}]", name) for i, name in enumerate(spec.drafters or ())]
    for role, name in roles:
        if name is not None and name not in recipe.models:
            raise SpecbenchError(
                f"{where}.{role}",
                f"no model named {name!r}",
                f"{_one_of(name, recipe.models)}, or add {name!r} under models:",
            )
    info = METHODS[spec.method]
    _check_roles(recipe, spec, info, where)
    _check_params(spec, info, where, recipe.generation)
    _check_engine_cells(recipe, spec, where)
    if info.needs_reference and not any(
        o.method == "autoregressive" and o.target == spec.target for o in recipe.methods
    ):
        raise SpecbenchError(
            f"{where}.method",
            f"{spec.method} reads the autoregressive output of {spec.target!r}, but no method produces it",
            f"add {{name: ar, method: autoregressive, target: {spec.target}}} to methods",
        )
    if spec.replay:
        problem = replay_problem(recipe, spec)
        if problem:
            raise SpecbenchError(f"{where}.replay", *problem)


def replay_problem(recipe: Recipe, spec: MethodSpec, params: dict | None = None) -> tuple[str, str] | None:
    """Why the target of ``spec``'s cells (or of its one cell with ``params``) cannot be replayed from
    its autoregressive output, as (problem, fix); None when it can (specbench.models.replay)."""
    info = METHODS[spec.method]
    if info.no_replay:
        return (
            f"method {spec.method!r} cannot replay the target: {info.no_replay}",
            "remove replay: (it works with speculative and cs_drafting)",
        )
    if spec.method == "autoregressive":
        return "the autoregressive output is what other cells replay", "remove replay: here"
    if recipe.generation.temperature > 0:
        return (
            f"replay needs greedy decoding, but generation.temperature is {recipe.generation.temperature}",
            "set generation.temperature: 0, or remove replay:",
        )
    fixed = _defaults(info) | _normalized(info, spec.params)
    keys = sorted(spec.grid)
    points = (
        [params]
        if params is not None
        else [
            fixed | _normalized(info, dict(zip(keys, values, strict=True)))
            for values in itertools.product(*(spec.grid[key] for key in keys))
        ]
    )
    for point in points:
        if info.tree_sizes(point):
            return (
                f"{spec.method} cells that verify token trees cannot replay the target: a replay of "
                "its output scores chains only",
                "remove replay:, or verify chains (tree_children: 1)",
            )
        if not info.lossless(point):
            given = ", ".join(
                f"{name}={point[name]}" for name in sorted(spec.params.keys() | spec.grid.keys())
            )
            return (
                f"{spec.method} with {given} is not lossless, so its output is not the target's to replay",
                "use lenience: 1 (in params and grid), or remove replay:",
            )
    if not any(o.method == "autoregressive" and o.target == spec.target for o in recipe.methods):
        return (
            f"replay reuses the autoregressive output of {spec.target!r}, but no method produces it",
            f"add {{name: ar, method: autoregressive, target: {spec.target}}} to methods",
        )
    return None


def _check_roles(recipe: Recipe, spec: MethodSpec, info: Method, where: str) -> None:
    target_source = recipe.models[spec.target].source
    _check_heads(recipe, spec, info, where)
    if not _source(target_source).neural:
        raise SpecbenchError(
            f"{where}.target",
            f"model {spec.target!r} ({target_source}) is a statistical drafter and cannot be a target",
            "use a neural model as the target; a statistical drafter can only be a drafter",
        )
    if info.drafter_list:
        _check_cascade_roles(recipe, spec, where)
        return
    if spec.drafters is not None:
        raise SpecbenchError(
            f"{where}.drafters",
            f"method {spec.method!r} takes no drafters list",
            "use drafter: NAME (drafters: is for cascades such as cs_drafting)",
        )
    if info.needs_drafter and spec.drafter is None:
        raise SpecbenchError(
            f"{where}.drafter",
            f"method {spec.method!r} needs a drafter",
            f"add drafter: with one of {', '.join(sorted(recipe.models))}",
        )
    if not info.needs_drafter and spec.drafter is not None:
        raise SpecbenchError(
            f"{where}.drafter", f"method {spec.method!r} takes no drafter", "remove drafter:"
        )
    if info.neural_drafter_only and not _source(recipe.models[spec.drafter].source).neural:
        raise SpecbenchError(
            f"{where}.drafter",
            f"method {spec.method!r} needs a model drafter, but {spec.drafter!r} is a statistical drafter",
            "use a model as the drafter (for prompt lookup use method hf_prompt_lookup or speculative)",
        )


def _check_heads(recipe: Recipe, spec: MethodSpec, info: Method, where: str) -> None:
    """Heads on a target's states (Medusa) serve only the methods that hand them those states."""
    if _source(recipe.models[spec.target].source).heads:
        raise SpecbenchError(
            f"{where}.target", f"{spec.target!r} is a set of heads, not a model", "use a model as the target"
        )
    for role, names in (("drafter", [spec.drafter]), ("drafters", spec.drafters or [])):
        for name in names:
            if name is None:
                continue
            source = _source(recipe.models[name].source)
            if source.heads and not info.takes_heads:
                raise SpecbenchError(
                    f"{where}.{role}",
                    f"{name!r} is a set of heads on the target's states; {spec.method!r} cannot use it",
                    f"use method {source.kind} for these heads, or a drafter model here",
                )
            if info.takes_heads and source.kind != info.takes_heads:
                raise SpecbenchError(
                    f"{where}.{role}",
                    f"method {spec.method!r} drafts with {info.takes_heads} heads on the target's states; "
                    f"{name!r} is {'a set of ' + source.kind + ' heads' if source.heads else 'not'}",
                    f"use a {info.takes_heads}:<target>/<name> source with options: {{of: TARGET}}",
                )
    if info.takes_heads and spec.drafter is not None:
        of = recipe.models[spec.drafter].options.get("of")
        if of != spec.target:
            raise SpecbenchError(
                f"{where}.drafter",
                f"the heads {spec.drafter!r} read {of!r}'s states, but the target is {spec.target!r}",
                f"set models.{spec.drafter}.options.of: {spec.target}",
            )


def _check_cascade_roles(recipe: Recipe, spec: MethodSpec, where: str) -> None:
    """drafters: neural models largest first, then exactly one statistical drafter (the bottom)."""
    shape = "list neural drafters largest first and one statistical drafter (maxgram) last"
    if spec.drafter is not None:
        raise SpecbenchError(
            f"{where}.drafter", f"method {spec.method!r} takes drafters: (a list), not drafter:", shape
        )
    if not spec.drafters:
        raise SpecbenchError(f"{where}.drafters", f"method {spec.method!r} needs drafters", shape)
    statistical = [not _source(recipe.models[name].source).neural for name in spec.drafters]
    for i, name in enumerate(spec.drafters):
        at = f"{where}.drafters[{i}]"
        if name == spec.target:
            raise SpecbenchError(at, f"{name!r} is the target", "drafters are models other than the target")
        if name in spec.drafters[:i]:
            j = spec.drafters.index(name)
            raise SpecbenchError(at, f"{name!r} appears twice (also drafters[{j}])", "list each drafter once")
        if statistical[i] and i < len(spec.drafters) - 1:
            raise SpecbenchError(
                at,
                f"{name!r} is a statistical drafter but not the last one",
                "put the statistical drafter last (it is the bottom of the cascade) and use only one",
            )
    if not statistical[-1]:
        raise SpecbenchError(
            f"{where}.drafters",
            f"the last drafter {spec.drafters[-1]!r} is neural: the cascade has no statistical bottom",
            "append a statistical drafter (source: maxgram or prompt-lookup)",
        )
    if len(spec.drafters) == 1:
        raise SpecbenchError(
            f"{where}.drafters",
            f"{spec.drafters[0]!r} alone: the cascade needs at least one neural drafter",
            f"add neural drafters before it, or use method speculative with drafter: {spec.drafters[0]}",
        )


def _check_params(spec: MethodSpec, info: Method, where: str, generation: GenerationSpec) -> None:
    for section in ("params", "grid"):
        for name in getattr(spec, section):
            if name not in info.params:
                fix = _one_of(name, info.params) if info.params else f"remove it: {spec.method} takes none"
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
            canonical = json.dumps(_as_declared(info.params[name], value), sort_keys=True, default=str)
            if canonical in seen:
                raise SpecbenchError(
                    f"{where}.grid.{name}", f"{value!r} appears twice (two identical cells)", "list it once"
                )
            seen.add(canonical)
    if info.check is None:
        return
    fixed = _defaults(info) | spec.params
    keys = sorted(spec.grid)
    for values in itertools.product(*(spec.grid[key] for key in keys)):
        problem = info.check(fixed | dict(zip(keys, values, strict=True)), spec, generation)
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
            f"{_show(value)} is not {_TYPE_WORDS[spec.type]} {about}",
            f"write {_TYPE_WORDS[spec.type]}{example}",
        )
    if spec.choices is not None and value not in spec.choices:
        raise SpecbenchError(where, f"{_show(value)} is not allowed {about}", _one_of(value, spec.choices))
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


# -- messages ----------------------------------------------------------------------------------


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return json.dumps(value, default=str)


def _one_of(given: Any, options: Collection) -> str:
    names = sorted(str(option) for option in options)
    close = difflib.get_close_matches(str(given), names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}use one of: {', '.join(names)}"


# pydantic error type -> (problem, fix), formatted with the input as {value} and the error's ctx.
_EXPLANATIONS = {
    "missing": ("a required key is missing", "add it"),
    "int_type": ("{value} is not an integer", "write a whole number, unquoted (true/false are not numbers)"),
    "float_type": ("{value} is not a number", "write a number without quotes"),
    "bool_type": ("{value} is not a boolean", "write true or false"),
    "string_type": (
        "{value} is not a string",
        "write a string (quote it if YAML reads it as a number, date, ...)",
    ),
    "path_type": ("{value} is not a path", "write a file path as a string"),
    "dict_type": ("{value} is not a mapping", "write key: value pairs"),
    "model_type": ("{value} is not a mapping", "write key: value pairs"),
    "list_type": ("{value} is not a list", "write [a, b] or one '- item' per line"),
    "literal_error": ("{value} is not allowed", "use one of: {expected}"),
    "greater_than_equal": ("{value} is too small", "use a value >= {ge}"),
    "greater_than": ("{value} is too small", "use a value > {gt}"),
    "less_than_equal": ("{value} is too large", "use a value <= {le}"),
    "too_short": ("is empty", "give at least one entry"),
    "string_too_short": ("is empty", "give a non-empty string"),
}


def _from_validation_error(path: Path, error: ValidationError) -> SpecbenchError:
    errors = error.errors(include_url=False)
    first, more = errors[0], f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    loc = [part for part in first["loc"] if part != "[key]"]  # "[key]": the error is in a mapping key
    where = f"{path}: {_field_path(loc)}" if loc else str(path)
    kind, ctx = first["type"], first.get("ctx") or {}
    if kind == "specbench":
        problem, fix = ctx["problem"], ctx["fix"]
    elif kind == "extra_forbidden":
        problem = f"unknown key {loc[-1]!r}"
        fix = f"remove it, or {_one_of(loc[-1], _keys_allowed_at(loc[:-1]))}"
    elif kind in _EXPLANATIONS:
        problem, fix = (text.format(value=_show(first.get("input")), **ctx) for text in _EXPLANATIONS[kind])
    else:
        problem = f"{_show(first.get('input'))}: {first['msg']}"
        fix = "see the recipe reference in the README"
    return SpecbenchError(where, problem + more, fix)


def _field_path(loc: list) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _keys_allowed_at(loc: list) -> list[str]:
    """The field names of the model that the mapping at ``loc`` is validated as."""
    node: Any = Recipe
    for part in loc:
        if isinstance(node, type) and issubclass(node, BaseModel):
            node = node.model_fields[part].annotation
        else:  # dict[str, X] or list[X]: one step into X
            node = get_args(node)[-1]
        if get_origin(node) in (Union, types.UnionType):  # X | None
            node = next(arg for arg in get_args(node) if arg is not type(None))
    return list(node.model_fields) if isinstance(node, type) and issubclass(node, BaseModel) else []
