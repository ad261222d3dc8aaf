"""A model's tokenizer (and configuration, where it has one) without its weights: what specbench needs of
a model that a server it did not start serves (``engine: openai``), where a copy of a remote 70B's
weights would cost the benchmarking machine its memory and disk for nothing.

Each kind of source that can give its tokenizer alone declares how (``Source.load_tokenizer``): a
local directory its tokenizer files (a folder without weights serves), a Hub id the local Hugging Face
cache first (offline) and the Hub when it answers, an alias of a published model its Hub id, else
specbench's converted copy, else the tokenizer in its GGUF's metadata (the tensors are not read), a
tiny model its byte tokenizer. Nothing here reads a weight file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.sources import LoadContext, ModelRequest, option_problem, source_of
from specbench.sources import checkpoints as ckpt


@dataclass(frozen=True)
class Tokenizer:
    """What a source gives without its weights: the tokenizer, the configuration (None where none is at
    hand) and where they came from."""

    tokenizer: Any
    config: Any
    origin: str


@dataclass(frozen=True)
class Tokenized:
    """A recipe model's tokenizer for an engine that holds the weights itself, elsewhere: what
    :mod:`specbench.engines` opens the engine with instead of :class:`~specbench.sources.Served`."""

    tokenizer: Any
    config: Any
    origin: str
    dtype: str
    device: Any
    dtype_reason: str


def from_folder(folder: str | Path, trust: bool = False, **kwargs) -> tuple[Any, Any]:
    """(tokenizer, config or None) of a folder or Hub id; the configuration is optional (a folder of
    tokenizer files alone serves), the tokenizer is not."""
    from transformers import AutoConfig, AutoTokenizer

    if trust:
        kwargs["trust_remote_code"] = True
    with ckpt.quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **kwargs)
        try:
            config = AutoConfig.from_pretrained(str(folder), **kwargs)
        except (OSError, ValueError, KeyError):
            config = None
    return tokenizer, config


def from_hub(name: str, hub_id: str, revision: str | None, trust: bool = False, network=True) -> Tokenizer:
    """A Hub id's tokenizer: the local Hugging Face cache first (offline), then the Hub when it answers;
    else one line saying how to get it here."""
    where = f"models.{name}.source"
    if not ckpt.is_hub_id(hub_id):
        raise SpecbenchError(
            where,
            f"{hub_id!r} is neither an existing directory, an alias nor a hub id",
            "use a local folder with the served model's tokenizer files, or an 'org/name' hub id",
        )
    try:
        tokenizer, config = from_folder(hub_id, trust, revision=revision, local_files_only=True)
        return Tokenizer(tokenizer, config, f"hub-cache:{hub_id} (tokenizer only)")
    except OSError:
        pass
    if not network or not cache.hub_reachable():
        raise SpecbenchError(
            where,
            f"the tokenizer of {hub_id!r} is not in the local Hugging Face cache and the Hub is unreachable",
            f"download its tokenizer on a connected machine (hf download {hub_id} --include 'tokenizer*' "
            "config.json) or point source at a local folder holding its tokenizer files",
        )
    tokenizer, config = from_folder(hub_id, trust, revision=revision)
    return Tokenizer(tokenizer, config, f"hub:{hub_id} (tokenizer only)")


def of_folder(context: LoadContext) -> Tokenizer:
    """A local directory's tokenizer files (its weights, if any, are left alone)."""
    from specbench.errors import expand_home

    request = context.request
    where = f"{context.where}.source"
    path = expand_home(request.source, where)
    with ckpt.unreadable(where, request.source, "a folder with the served model's tokenizer files"):
        tokenizer, config = from_folder(path, bool(request.opts.get("trust_remote_code")))
    return Tokenizer(tokenizer, config, f"local:{path} (tokenizer only)")


def of_hub(context: LoadContext) -> Tokenizer:
    request = context.request
    trust = bool(request.opts.get("trust_remote_code"))
    return from_hub(request.name, request.source, request.revision, trust)


def of_alias(hub_id: str, converted: Callable[[], Iterable[Path]], gguf: Callable[[str], Path]):
    """The ``load_tokenizer`` of an alias of a published model: its Hub id (cache first; the Hub where
    the alias would load from it), else a converted copy in the specbench cache, else its GGUF's
    tokenizer (the file's metadata; fetched if need be)."""

    def load(context: LoadContext) -> Tokenizer:
        request = context.request
        where = f"{context.where}.source"
        prefer = request.opts.get("prefer", "auto")
        try:
            return from_hub(request.name, hub_id, request.revision, network=prefer != "gguf")
        except SpecbenchError:
            if prefer == "hub":
                raise
        for folder in converted():
            if (folder / "tokenizer_config.json").is_file():
                tokenizer, config = from_folder(folder)
                return Tokenizer(tokenizer, config, f"specbench cache:{folder.name} (tokenizer only)")
        path = gguf(where)
        with ckpt.unreadable(where, request.source, "its GGUF file"):
            tokenizer, config = from_folder(path.parent, gguf_file=path.name)
        return Tokenizer(tokenizer, config, f"gguf:{path.name} (tokenizer from its metadata)")

    return load


def load_tokenizer(request: ModelRequest) -> Tokenized:
    """The tokenizer of a recipe model whose weights an engine elsewhere holds, with the dtype and
    device resolved as for any model; a source that cannot give its tokenizer alone is one line."""
    from specbench.models import devices

    kind = source_of(request.source)
    where = f"models.{request.name}"
    problem = option_problem(request.source, request.opts)
    if problem:
        option, text, fix = problem
        raise SpecbenchError(f"{where}.options.{option}", text, fix)
    if kind.load_tokenizer is None:
        raise SpecbenchError(
            f"{where}.source",
            f"a {kind.kind} source cannot give its tokenizer without loading its weights",
            "name the served model's Hub id or a local folder holding its tokenizer files, or set "
            "engine_options.audit_weights: true to load specbench's copy",
        )
    context = LoadContext(request)
    context.device = devices.resolve_device(request.device)
    dtype_name, reason = devices.dtype_choice(kind.dtype_rule or "auto", request.dtype, context.device)
    found = kind.load_tokenizer(context)
    return Tokenized(found.tokenizer, found.config, found.origin, dtype_name, context.device, reason)


def parameters_of(config) -> int | None:
    """The parameters a configuration's model has, counted on the meta device (nothing allocated,
    nothing read); None without a configuration or where transformers cannot build it."""
    if config is None:
        return None
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    try:
        with torch.device("meta"):
            module = auto.from_config(config)
    except (ValueError, KeyError, TypeError, RuntimeError, ImportError):
        return None
    return sum(p.numel() for p in module.parameters())
