"""A Hugging Face Hub id (``org/name``): the local Hugging Face cache first, which works offline; the
Hub when it answers; else one line saying how to get the model here."""

from __future__ import annotations

from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.models.options import LOADER_OPTIONS
from specbench.sources import LoadContext, Source, Weights, tokenizers
from specbench.sources import checkpoints as ckpt

KNOWN_ALIASES = (
    "tiny-llama",
    "tiny-t5",
    "smollm2-135m-instruct",
    "qwen2.5-coder-1.5b-instruct",
    "qwen2.5-coder-0.5b-instruct",
)


PREFER = ("auto", "hub", "gguf")  # where an alias of a published model loads from (smollm2, qwen_coder)


def prefer_check(family: str):
    """The ``check`` of an alias source with a ``prefer:`` option: its value must be one of PREFER."""

    def check(source: str, options: dict):
        if options.get("prefer", "auto") not in PREFER:
            return (
                "prefer",
                f"prefer {options['prefer']!r} is not a {family} origin",
                f"use {', '.join(PREFER)}",
            )
        return None

    return check


def load_hub(name: str, hub_id: str, dtype, revision: str | None, loader=None) -> Weights:
    where = f"models.{name}.source"
    if not ckpt.is_hub_id(hub_id):
        raise SpecbenchError(
            where,
            f"{hub_id!r} is neither an existing directory, a .gguf file, an alias nor a hub id",
            f"use a local path, an 'org/name' hub id, or one of {', '.join(KNOWN_ALIASES)}",
        )
    try:  # a copy already in the local Hugging Face cache works offline
        model, tokenizer = ckpt.from_pretrained(
            hub_id, dtype, loader, revision=revision, local_files_only=True
        )
        return Weights(model, tokenizer, f"hub-cache:{hub_id}")
    except OSError:
        pass
    if not cache.hub_reachable():
        raise SpecbenchError(
            where,
            f"hub model {hub_id!r} is not in the local Hugging Face cache and the Hub is unreachable",
            "download it on a connected machine (hf download) or point source at a local directory",
        )
    model, tokenizer = ckpt.from_pretrained(hub_id, dtype, loader, revision=revision)
    return Weights(model, tokenizer, f"hub:{hub_id}")


def hub_folder(hub_id: str, where: str, network: bool = True) -> Path:
    """A Hub repository's files as a local folder (heads loaded from their own files, not by
    transformers): the local Hugging Face cache first, which works offline; then, with ``network``,
    the Hub when it answers; else one line saying how to get it here."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(hub_id, local_files_only=True))
    except OSError:  # not cached (huggingface_hub's LocalEntryNotFoundError is a FileNotFoundError)
        pass
    if not network or not cache.hub_reachable():
        raise SpecbenchError(
            where,
            f"hub repository {hub_id!r} is not in the local Hugging Face cache"
            + (" and the Hub is unreachable" if network else ""),
            f"download it on a connected machine (hf download {hub_id}) or point at a local directory",
        )
    return Path(snapshot_download(hub_id))


def _load(context: LoadContext) -> Weights:
    request = context.request
    loader = ckpt.loader_options(request.opts)
    return load_hub(request.name, request.source, context.dtype, request.revision, loader)


def _facts(name, models, dtype):
    spec = models[name]
    return ckpt.hub_facts(name, spec.source, spec.source, spec.revision, dtype)


SOURCE = Source(
    "hub",
    "a Hugging Face Hub id, org/name (offline: from the local Hugging Face cache)",
    matches=lambda source: True,
    load=_load,
    facts=_facts,
    options=LOADER_OPTIONS,
    order=100,
    load_tokenizer=tokenizers.of_hub,
)
