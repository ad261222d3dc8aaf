"""A local model directory (``config.json``, weights and a tokenizer), as ``save_pretrained`` writes it."""

from __future__ import annotations

from pathlib import Path

from specbench.errors import expand_home
from specbench.models.options import LOADER_OPTIONS
from specbench.sources import LoadContext, Source, Weights
from specbench.sources import checkpoints as ckpt


def _load(context: LoadContext) -> Weights:
    request = context.request
    where = f"{context.where}.source"
    path = expand_home(request.source, where)
    with ckpt.unreadable(where, request.source, "a directory with config.json, weights and a tokenizer"):
        model, tokenizer = ckpt.from_pretrained(str(path), context.dtype, ckpt.loader_options(request.opts))
    return Weights(model, tokenizer, f"local:{path}")


def _facts(name, models, dtype):
    source = models[name].source
    config = expand_home(source, f"models.{name}.source") / "config.json"
    return ckpt.config_facts(name, source, "local directory", dtype, config, f"models.{name}.source")


def _is_dir(source: str) -> bool:
    """A local directory; a path under a home that cannot be expanded is one too, so that loading it
    names the problem rather than the hub failing to find it."""
    try:
        return Path(source).expanduser().is_dir()
    except RuntimeError:
        return True


SOURCE = Source(
    "local",
    "a local model directory",
    matches=_is_dir,
    load=_load,
    facts=_facts,
    options=LOADER_OPTIONS,
    order=70,
)
