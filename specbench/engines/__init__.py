"""Serving engines as backends: a recipe model with ``engine: vllm`` or ``engine: llama.cpp`` runs its
cells inside that engine; one with ``engine: openai`` is measured on a server specbench does not start.

Every module of this package that wraps an engine declares it as a module-level
``BACKEND = Backend(...)``: the options it passes through (``engine_options:`` on the model, validated
when the recipe is read), how it maps a cell (method, parameters, drafter) to its own speculative
settings or refuses it, and how it opens the engine. :data:`BACKENDS` collects them on first use, so
another engine (SGLang's offline ``Engine``) is one more module beside :mod:`specbench.engines.vllm` and
:mod:`specbench.engines.llamacpp`.

An engine model stands where an :class:`~specbench.models.hf.HFModel` target stands in a cell: it has
the tokenizer, device and EOS ids a request is built from, and ``generate`` returns a
:class:`~specbench.decoding.generation.Generation` whose steps and counts come from the engine's
counters (:mod:`specbench.engines.accounting`), so engine rows land in the same schema, the same
lossless audit and the same report as specbench's own loops.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specbench.methods import ParamSpec
from specbench.registry import Registry

# (field, problem, fix) or None
Problem = tuple[str, str, str] | None


@dataclass(frozen=True)
class CellView:
    """What a backend sees of a cell when it maps it: the method, its parameters, and its drafter's
    source kind and options (None without a drafter)."""

    method: str
    params: dict
    drafter: str | None
    drafter_kind: str | None
    drafter_options: dict
    greedy: bool
    drafter_source: str | None = None  # the drafter's source: (an engine that loads its file itself)


@dataclass(frozen=True)
class Backend:
    name: str
    help: str
    options: Mapping[str, ParamSpec]
    # speculation(cell) -> (the engine's speculative settings as a JSON-able dict, or None for plain
    # decoding; or raises nothing and returns a Problem naming the method field that cannot map)
    speculation: Callable[[CellView], tuple[dict | None, Problem]]
    # open(ModelRequest, sources.Served) -> the engine model (a cell's target)
    open: Callable[..., Any]
    # None when the engine can run here, else (problem, fix): checked before the first row
    available: Callable[[dict], tuple[str, str] | None]
    # serve(target, speculative settings, drafter, port) -> (command, environment) of the engine's
    # HTTP server for load (specbench.engines.load); None: the engine has no server here
    serve: Callable[..., tuple[list[str], dict]] | None = None
    # source_problem(source, engine_options) -> a Problem naming the model's field when the engine
    # cannot serve that source's weights (checked when the recipe is read); None: it serves any
    source_problem: Callable[[str, dict], Problem] | None = None
    # True when the engine runs other weights than specbench's copy of the same source (llama.cpp's
    # quantized GGUF): its lossless cells are audited against its own AR, never against ours
    own_reference: bool = False
    # load's counters in the server's /metrics: drafts, draft_tokens, accepted -> metric name
    load_counters: Mapping[str, str] = field(default_factory=dict)
    # attach(target) -> a server specbench did not start, for load (specbench.engines.openai_compat's
    # Attached); None: load starts the engine's own server (serve)
    attach: Callable[..., Any] | None = None
    # the fields load's requests add to the OpenAI body (the output's token ids asked for)
    load_body: Mapping[str, Any] = field(default_factory=dict)
    # tokenizer_only(engine_options) -> True where open() takes the source's tokenizer alone
    # (specbench.sources.tokenizers.Tokenized), never its weights: a server elsewhere holds them
    tokenizer_only: Callable[[dict], bool] | None = None


class EngineModel:
    """A recipe model served by an engine (a cell's target): the tokenizer, device and EOS ids a
    request is built from, and the engine's decoding behind ``prepare`` and ``generate``."""

    engine: str
    name: str
    tokenizer: Any
    device: Any
    num_parameters: int
    is_encoder_decoder = False
    # specbench's own copy of the target (an HF module) where engine_options.audit_sampling keeps it:
    # sampled outputs are re-scored with it (specbench.engines.sampling_audit)
    reference = None

    def eos_token_ids(self) -> list[int]:
        eos = self.tokenizer.eos_token_id
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def speculative_config(self, spec: dict | None, drafter) -> dict | None:
        """The cell's speculative settings as the engine takes them (a drafter's weights filled in)."""
        return spec

    def prepare(self, spec: dict | None, drafter=None) -> float:
        """Start the engine for a cell's speculative settings; the seconds starting took."""
        raise NotImplementedError

    def generate(self, request, spec: dict | None):
        """One request (a :class:`~specbench.methods.Request`) -> its Generation with the engine record."""
        raise NotImplementedError

    def describe(self) -> dict:
        """The engine, its version and settings, for environment.json."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the engine (idempotent)."""

    def process_groups(self) -> list[int]:
        """The process groups of the engine's running processes (their CPU is the run's own)."""
        return []


def _imported_here(module: pkgutil.ModuleInfo) -> bool:
    return not module.name.endswith("_worker")  # run by the engine's own interpreter, not imported


BACKENDS: Registry[Backend] = Registry("engine", __name__, "BACKEND", modules=_imported_here)

# the recipe schema's literal; tests check it equals BACKENDS' keys
ENGINE_NAMES = ("llama.cpp", "openai", "vllm")


def is_remote(engine: str | None) -> bool:
    """Whether ``engine`` is a server specbench does not start (it holds no memory or process here)."""
    return engine in ENGINE_NAMES and BACKENDS[engine].attach is not None


def audit_model(model):
    """The model that tells a numerical tie from a mismatch in outputs of ``model``'s weights: specbench's
    own model itself; an engine model's copy of the weights where it holds one (``engine: openai`` with
    ``audit_weights``); None where specbench has none (the divergence stays unclassified)."""
    if isinstance(model, EngineModel):
        return getattr(model, "audit", None)
    return model


def option_problem(engine: str, options: dict) -> Problem:
    """The first ``engine_options`` entry the backend does not take or cannot use."""
    backend = BACKENDS[engine]
    for name in sorted(options):
        spec = backend.options.get(name)
        if spec is None:
            known = ", ".join(sorted(backend.options))
            return name, f"engine {engine} takes no option {name!r}", f"use {known}"
        value = options[name]
        wanted = float if spec.type is float else spec.type
        ok = isinstance(value, wanted) and not (isinstance(value, bool) and wanted is not bool)
        if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            return name, f"{value!r} is not {spec.type.__name__}", f"give {name} as {spec.type.__name__}"
        if spec.choices is not None and value not in spec.choices:
            return name, f"{value!r} is not one of {', '.join(map(str, spec.choices))}", "use one of them"
        if spec.minimum is not None and value < spec.minimum:
            return name, f"{value} is below {spec.minimum}", f"use a value >= {spec.minimum}"
        if spec.maximum is not None and value > spec.maximum:
            return name, f"{value} is above {spec.maximum}", f"use a value <= {spec.maximum}"
    return None
