"""Model sources: what a recipe's ``source:`` names, and the registry that turns it into a model.

Every module of this package that defines a kind of source declares it next to its loader, as a
module-level ``SOURCE = Source(...)``: which ``source:`` strings it recognises, the options it takes
with their bounds, how it loads, what it costs before it loads (the size facts ``plan`` reads), and
its rule for ``dtype: auto``. :data:`SOURCES` collects them the first time it is read, in their
``order``, so a new kind of drafter or head is one new module here plus its tests, and nothing else
in specbench asks which kind a source is.

The kinds, in the order they are tried: statistical (``prompt-lookup``, ``maxgram``), tiny
(``tiny-llama``, ``tiny-t5``), SmolLM2 (``smollm2-135m-instruct``), distilled
(``distilled:<target>/<size>``), heads specbench trains (``medusa:``, ``eagle:``), published EAGLE-3
heads (``eagle3:<dir or hub id>``), early exit (``early-exit``), a ``.gguf`` file, a local directory,
and last a Hugging Face Hub id (``org/name``; offline it must already be in the local cache).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.errors import SpecbenchError
from specbench.models.options import option_bounds_problem, placement_problem
from specbench.registry import Registry

if TYPE_CHECKING:
    from specbench.models.facts import ModelFacts
    from specbench.models.hf import HFModel


@dataclass(frozen=True)
class ModelRequest:
    name: str  # the recipe's name for this model (used in counters and results)
    source: str
    dtype: str = "auto"
    device: str = "auto"
    revision: str | None = None
    options: tuple = ()  # sorted (key, value) pairs
    # or "compiled" (specbench.models.compiled), or a serving engine (specbench.engines)
    engine: str = "eager"
    engine_options: tuple = ()  # sorted (key, value) pairs of a serving engine's options
    linear: str = "aten"  # eager: aten, onednn or auto; compiled: aten or inductor (specbench.models.linear)

    @property
    def opts(self) -> dict:
        return dict(self.options)


@dataclass
class LoadContext:
    """What a source's loader is handed: the request, the recipe's other models, and (for sources with
    weights) the device and dtype the registry resolved."""

    request: ModelRequest
    resolve: Callable[[str], Any] | None = None  # another recipe model by name, already loaded
    device: Any = None  # torch.device
    dtype: Any = None  # torch.dtype

    @property
    def where(self) -> str:
        return f"models.{self.request.name}"

    def base_model(self, of, what: str):
        """The recipe model ``of`` that a source builds on (early exit, heads), already loaded, or a
        one-line error naming ``options.of``."""
        from specbench.models.hf import HFModel

        where = f"{self.where}.options"
        if self.resolve is None:
            raise SpecbenchError(where, f"{what} needs the recipe's other models", "load it through a recipe")
        try:
            base = self.resolve(of)
        except KeyError:
            raise SpecbenchError(
                f"{where}.of", f"no model named {of!r}", "name a model under models:"
            ) from None
        if not isinstance(base, HFModel):
            raise SpecbenchError(
                f"{where}.of", f"{of!r} is not a neural model", "name the recipe's target model"
            )
        return base


@dataclass(frozen=True)
class Weights:
    """A loaded transformers module, before the registry places it and wraps it in its engine."""

    module: Any
    tokenizer: Any
    origin: str  # where the weights came from, recorded in environment.json


@dataclass(frozen=True)
class Served:
    """Weights for a serving engine (``engine: vllm``): what :mod:`specbench.engines` opens the engine
    with, the dtype and device resolved as for any model."""

    weights: Weights
    dtype: str
    device: Any
    dtype_reason: str


# (option, problem, fix) or None
Problem = tuple[str, str, str] | None


@dataclass(frozen=True)
class Source:
    kind: str
    help: str
    matches: Callable[[str], bool]
    # load(context) -> Weights (the registry moves them to the device and wraps them in the request's
    # engine) or a finished model or drafter
    load: Callable[[LoadContext], Any]
    # facts(name, models, dtype) -> ModelFacts: sizes before loading (models: the recipe's ModelSpecs)
    facts: Callable[[str, Mapping, str], ModelFacts]
    options: tuple[str, ...] = ()
    # option -> (type, lowest, highest): values a loader would take but cannot use
    bounds: Mapping[str, tuple] = field(default_factory=dict)
    check: Callable[[str, dict], Problem] | None = None  # a rule across options
    order: int = 50  # tried from lowest to highest; the hub id, which takes any name, is last
    neural: bool = True  # a model with weights (an engine applies), not a statistical drafter
    fixed_weights: bool = False  # one set of weights: a revision would be silently meaningless
    # what dtype: auto means (specbench.models.devices.dtype_choice): "auto" (bfloat16 where the
    # device computes it fast) or "float32"; None: no dtype of its own (statistical drafters; early exit
    # runs in its base model's)
    dtype_rule: str | None = "auto"
    # heads on a target's hidden states (Medusa): only methods that hand them the target's states
    # (Method.takes_heads) take such a drafter
    heads: bool = False
    # the kind of heads a method takes these as (Method.takes_heads), where it is not the source's own:
    # published EAGLE-3 heads (eagle3:) draft in the eagle method's loops
    heads_for: str | None = None
    # trained_in(source) -> the folder of weights specbench trained (distilled drafters, heads), whose
    # distill.json says how: its digest goes into environment.json so a stale result can be told
    # apart, and its prompts are checked against what a run evaluates
    trained_in: Callable[[str], Path] | None = None
    # published(source) -> (folder, digest of its config and weights) of a published head as it is now,
    # found without the network: its loader records the digest (environment.json's checkpoint), and a
    # resume or specbench check refuses rows measured with the head since replaced at that source
    published: Callable[[str], tuple[Path, str]] | None = None
    # tokenizer(source) -> the name of the tokenizer its weights use, where it is known before they load
    # (an alias of a published family, or a drafter trained on one): a recipe that pairs two known
    # tokenizers that differ is refused before any model loads; None: known only once loaded
    tokenizer: Callable[[str], str | None] | None = None
    # gguf(source, where) -> the GGUF file its weights come from (fetched if need be), for an engine that
    # reads GGUF itself (llama.cpp); None: the kind has no such file
    gguf: Callable[[str, str], Path] | None = None
    # load_tokenizer(context) -> specbench.sources.tokenizers.Tokenizer: the tokenizer (and config) alone,
    # never the weights, for a model a server elsewhere holds (engine: openai); None: the kind cannot
    load_tokenizer: Callable[[LoadContext], Any] | None = None


def _recognition_order(source: Source) -> tuple[int, str]:
    return source.order, source.kind


# Kind -> Source, from every module of this package that declares ``SOURCE``, in recognition order.
SOURCES: Registry[Source] = Registry(
    "source kind", __name__, "SOURCE", name=lambda source: source.kind, order=_recognition_order
)


def source_of(source: str, registry: Mapping[str, Source] = SOURCES) -> Source:
    """The kind that recognises ``source`` (the hub id takes whatever no other kind does)."""
    return next(kind for kind in registry.values() if kind.matches(source))


def tokenizer_of(source: str) -> str | None:
    """The tokenizer the weights of ``source`` use, where its kind knows it before loading, else None."""
    kind = source_of(source)
    return kind.tokenizer(source) if kind.tokenizer is not None else None


def trained_record(source: str) -> dict | None:
    """How specbench trained the weights of ``source`` (their ``distill.json``), or None: weights
    trained elsewhere, or not yet trained."""
    from specbench.models import cache

    kind = source_of(source)
    return cache.trained_record(kind.trained_in(source)) if kind.trained_in is not None else None


def identity(source: str) -> str | None:
    """How the weights of ``source`` were trained, as a digest (Source.trained_in), or None."""
    from specbench.models import cache

    kind = source_of(source)
    return cache.trained_identity(kind.trained_in(source)) if kind.trained_in is not None else None


def published_head(source: str) -> tuple[Path, str] | None:
    """(folder, digest) of the published head ``source`` names as it is now (Source.published), or
    None for other kinds; one line where its files cannot be found here."""
    kind = source_of(source)
    return kind.published(source) if kind.published is not None else None


def option_problem(source: str, options: dict) -> Problem:
    """(option, problem, fix) for the first option ``source``'s kind does not take or cannot use; None
    when all fit. Checked when a recipe is validated, before anything loads."""
    kind = source_of(source)
    for name in sorted(options):
        if name not in kind.options:
            fix = (
                f"use {', '.join(kind.options)}"
                if kind.options
                else "remove options: (this source takes none)"
            )
            return name, f"source {source!r} takes no option {name!r}", fix
    problem = option_bounds_problem(options, kind.bounds) or placement_problem(options)
    if problem is None and kind.check is not None:
        problem = kind.check(source, options)
    return problem


def dtype_choice(dtype: str, device, source: str = "") -> tuple[str, str]:
    """(dtype name, why) for a model's ``dtype:`` on ``device`` under its source's rule."""
    from specbench.models import devices

    rule = source_of(source).dtype_rule if source else "auto"
    return devices.dtype_choice(rule or "auto", dtype, device)


def model_facts(name: str, models: Mapping, dtype: str) -> ModelFacts:
    """What the recipe model ``name`` costs before it loads (``models``: the recipe's ModelSpecs) at
    ``dtype``; with a bitsandbytes ``quantization`` option, its linear layers at 4 or 8 bits
    (embeddings, head and norms stay at ``dtype``)."""
    from specbench.models.facts import DTYPE_BYTES

    fact = source_of(models[name].source).facts(name, models, dtype)
    quantization = models[name].options.get("quantization") or {}
    bits = 4 if quantization.get("load_in_4bit") else 8 if quantization.get("load_in_8bit") else None
    if bits and fact.numels:
        size = DTYPE_BYTES[dtype]
        kept = sum(n for key, n in fact.numels.items() if re.search(r"embed|lm_head|norm|shared", key))
        fact.weight_bytes = kept * size + math.ceil((fact.params - kept) * bits / 8)
        fact.origin += f", {bits}-bit linear layers"
    return fact


def load(request: ModelRequest, resolve=None):
    """Load one recipe model: an :class:`HFModel` (with ``.tokenizer``, ``.origin`` and
    ``.dtype_reason``) or a statistical drafter.

    ``resolve(name)`` returns another recipe model, already loaded (sources such as ``early-exit``
    build on the target's own weights).
    """
    kind = source_of(request.source)
    problem = option_problem(request.source, request.opts)
    if problem:
        option, text, fix = problem
        raise SpecbenchError(f"models.{request.name}.options.{option}", text, fix)
    context = LoadContext(request, resolve)
    if kind.dtype_rule is None:
        return kind.load(context)
    import torch

    from specbench.models import devices

    context.device = devices.resolve_device(request.device)
    dtype_name, dtype_reason = devices.dtype_choice(kind.dtype_rule, request.dtype, context.device)
    context.dtype = devices.DTYPES[dtype_name]
    try:
        loaded = kind.load(context)
    except (torch.OutOfMemoryError, MemoryError) as error:
        raise _out_of_memory(request, error) from None
    except RuntimeError as error:
        if "alloc" not in str(error).lower() and "out of memory" not in str(error).lower():
            raise
        raise _out_of_memory(request, error) from None
    if isinstance(loaded, Weights) and request.engine not in ("eager", "compiled"):
        # a serving engine loads the weights itself, from where these came (specbench.engines opens it)
        return Served(loaded, dtype_name, context.device, dtype_reason)
    if isinstance(loaded, Weights):
        placed = any(name in request.opts for name in ("device_map", "quantization"))  # by accelerate
        module = loaded.module if placed else loaded.module.to(context.device)
        model = wrap(request, module, loaded.tokenizer)
        model.origin = loaded.origin
    else:
        model = loaded
    model.dtype_reason = dtype_reason
    return model


def _out_of_memory(request: ModelRequest, error: BaseException) -> SpecbenchError:
    return SpecbenchError(
        f"models.{request.name}",
        f"out of memory while loading {request.source} ({str(error).splitlines()[0][:120]})",
        "use a smaller model or dtype, or a device with more memory",
    )


def _with_linear(model: HFModel, request: ModelRequest) -> HFModel:
    """The eager model with the linear layers' library it asked for (specbench.models.linear), recorded
    as ``model.linear`` (and ``model.linear_probe``: what ``auto`` timed). Swapped after HFModel has
    counted the parameters (oneDNN's reordered copies are not parameters)."""
    from specbench.models import linear

    if request.linear == "onednn" and not linear.can_use_onednn(model.model):
        raise SpecbenchError(
            f"models.{request.name}.linear",
            f"oneDNN serves float32 and bfloat16 models on the CPU of a torch built with it (bfloat16 where "
            f"the CPU has AVX512 or AVX-NE-CONVERT); {request.name} is "
            f"{next(model.model.parameters()).dtype} on {model.device}",
            "use linear: auto (oneDNN where it serves and is faster) or aten",
        )
    model.linear, model.linear_probe = linear.resolve(model.model, request.linear)
    return model


def wrap(request: ModelRequest, module, tokenizer) -> HFModel:
    """A loaded module behind the interface of the request's engine."""
    from specbench.models.hf import HFModel

    if request.engine == "eager":
        return _with_linear(HFModel(module, request.name, tokenizer), request)
    from specbench.models.compiled import CompiledHFModel

    if module.config.is_encoder_decoder:
        raise SpecbenchError(
            f"models.{request.name}.engine",
            "the compiled engine serves decoder-only models (this one is an encoder-decoder)",
            "use engine: eager for this model",
        )
    if getattr(module, "hf_device_map", None) and len(set(module.hf_device_map.values())) > 1:
        raise SpecbenchError(
            f"models.{request.name}.engine",
            "the compiled engine runs a model on one device (this one is split by device_map)",
            "use engine: eager for a split model, or place it on one device",
        )
    if request.linear == "inductor" and next(module.parameters()).device.type != "cpu":
        raise SpecbenchError(
            f"models.{request.name}.linear",
            "linear: inductor freezes the weights into inductor's C++ GEMM templates, which run on the CPU",
            "remove linear (on CUDA the compiled engine records CUDA graphs), or run the model on the CPU",
        )
    return CompiledHFModel(module, request.name, tokenizer, linear=request.linear)
