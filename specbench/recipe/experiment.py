"""The recipe as a whole: its sections, how each model resolves on this machine, and its cells.

:class:`Recipe` is the validated document (the root of the schema in :mod:`specbench.recipe.schema`);
:meth:`Recipe.cells` expands every method's grid into :class:`Cell` s, and :meth:`Cell.fingerprint`
keys the rows a cell measures (:mod:`specbench.recipe.keys`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr

import specbench.recipe.grid as grid
from specbench.engines import CellView
from specbench.methods import BASELINE, METHODS
from specbench.recipe.keys import cell_key, digest, model_key
from specbench.recipe.schema import (
    DatasetSpec,
    GenerationSpec,
    LoadSpec,
    MethodSpec,
    ModelSpec,
    Name,
    Strict,
)
from specbench.sources import source_of


class Recipe(Strict):
    name: Name
    description: str = ""
    seed: int = 0
    warmup: int = Field(default=1, ge=0)  # examples run once per cell before timing, not recorded
    lossless_check: bool = True
    replay_check: int = Field(default=2, ge=0)  # first N examples of every replayed cell also run live
    # the order rows are measured in (specbench.pipeline.run.schedule): every cell per example back to back
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
        if not source_of(self.models[name].source).neural:
            return "eager"
        return self.models[name].engine or self.engine

    def linear_of(self, name: str) -> str:
        """The linear layers' library of model ``name`` as the recipe asks for it: its own ``linear``,
        else the recipe's (which is the eager engine's); aten for statistical drafters and serving engines."""
        engine = self.engine_of(name)
        if not source_of(self.models[name].source).neural or engine not in ("eager", "compiled"):
            return "aten"
        if engine == "compiled":
            return self.models[name].linear or "aten"
        return self.models[name].linear or self.linear

    def reference_model(self, name: str) -> str:
        """The model whose autoregressive output checks ``name``'s lossless cells: itself, or for a model
        on a serving engine the recipe's model of the same weights (source, revision, dtype, options)
        that specbench runs itself and decodes autoregressively, when there is one (never for an engine
        that runs other weights than ours, llama.cpp's quantized GGUF: it is its own reference)."""
        from specbench.engines import BACKENDS, ENGINE_NAMES

        spec = self.models[name]
        if spec.engine not in ENGINE_NAMES or BACKENDS[spec.engine].own_reference:
            return name
        same = (spec.source, spec.revision, self.dtype_of(name), spec.options)
        for other, model in self.models.items():
            weights = (model.source, model.revision, self.dtype_of(other), model.options)
            if model.engine in ENGINE_NAMES or weights != same:
                continue
            if any(m.method == BASELINE and m.target == other for m in self.methods):
                return other
        return name

    def speedup_over(self, name: str) -> str:
        """The model whose AR cell ``name``'s speedups are measured against: the AR server its
        ``engine_options.baseline`` names (engine: openai), else itself."""
        spec = self.models[name]
        return spec.engine_options.get("baseline") or name

    def dtype_of(self, name: str) -> str | None:
        """The dtype model ``name`` loads in on this machine (``auto`` resolved, without loading it);
        None for statistical drafters."""
        spec = self.models[name]
        if not source_of(spec.source).neural:
            return None
        if spec.dtype == "auto" and name in self._auto_dtypes:
            return self._auto_dtypes[name]
        from specbench.models.devices import resolve_device
        from specbench.sources import dtype_choice

        return dtype_choice(spec.dtype, resolve_device(spec.device), spec.source)[0]

    def model_key(self, name: str) -> dict:
        """Model ``name`` as it enters fingerprints (:func:`specbench.recipe.keys.model_key`)."""
        spec = self.models[name]
        auto = spec.dtype == "auto" and source_of(spec.source).dtype_rule is not None
        return model_key(
            spec.model_dump(mode="json"),
            self.engine_of(name),
            self.linear_of(name),
            self.dtype_of(name) if auto else None,
        )

    def cells(self) -> list[Cell]:
        """Methods in recipe order; within one, the cartesian product of its grid in sorted-key order."""
        return [cell for spec in self.methods for cell in self.method_cells(spec)]

    def method_cells(self, spec: MethodSpec) -> list[Cell]:
        """The cells of one method entry: the cartesian product of its grid in sorted-key order."""
        info = METHODS[spec.method]
        fixed = grid.defaults(info) | grid.normalized(info, spec.params)
        keys = tuple(sorted(spec.grid))
        drafters = tuple(spec.drafters or ())
        return [
            Cell(
                spec.name,
                spec.method,
                spec.target,
                spec.drafter,
                fixed | grid.normalized(info, point),
                keys,
                drafters,
                spec.replay,
            )
            for point in grid.points(spec.grid)
        ]

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
        return digest(data)

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
            params = grid.defaults(info) | grid.normalized(info, spec.params)
            dumped["params"] = {name: value for name, value in params.items() if name not in spec.grid}
        return data


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
        values = (f"{key}={grid.compact(self.params[key])}" for key in self.grid_keys)
        return f"{self.method_name}[{','.join(values)}]"

    @property
    def drafter_names(self) -> tuple[str, ...]:
        """Every drafter of the cell: a cascade's list, the one drafter, or none."""
        return self.drafters or ((self.drafter,) if self.drafter else ())

    def fingerprint(self, recipe: Recipe) -> str:
        """Hash of everything that determines this cell's outputs, and of nothing else in the recipe."""
        info = METHODS[self.method]
        models = {
            "target": recipe.model_key(self.target),
            "drafter": recipe.model_key(self.drafter) if self.drafter else None,
            "drafters": [recipe.model_key(name) for name in self.drafters],
        }
        generation = recipe.generation.model_dump(mode="json")
        return cell_key(
            self.method, self.params, info.params, models, generation, recipe.seed, info.revision, self.replay
        )


def engine_cell_view(recipe: Recipe, cell: Cell) -> CellView:
    """What an engine backend reads of ``cell`` to map it onto its own decoding."""
    drafter = cell.drafter
    spec = recipe.models[drafter] if drafter else None
    return CellView(
        cell.method,
        dict(cell.params),
        drafter,
        source_of(spec.source).kind if spec else None,
        dict(spec.options) if spec else {},
        recipe.generation.temperature == 0,
        spec.source if spec else None,
    )
