"""A local model directory (``config.json``, weights and a tokenizer), as ``save_pretrained`` writes it."""

from __future__ import annotations

from pathlib import Path

from specbench.models.options import LOADER_OPTIONS
from specbench.sources import LoadContext, Source, Weights
from specbench.sources import checkpoints as ckpt


def _load(context: LoadContext) -> Weights:
    request = context.request
    path = Path(request.source).expanduser()
    where = f"{context.where}.source"
    with ckpt.unreadable(where, request.source, "a directory with config.json, weights and a tokenizer"):
        model, tokenizer = ckpt.from_pretrained(str(path), context.dtype, ckpt.loader_options(request.opts))
    return Weights(model, tokenizer, f"local:{path}")


def _facts(name, models, dtype):
    source = models[name].source
    config = Path(source).expanduser() / "config.json"
    return ckpt.config_facts(name, source, "local directory", dtype, config, f"models.{name}.source")


SOURCE = Source(
    "local",
    "a local model directory",
    matches=lambda source: Path(source).expanduser().is_dir(),
    load=_load,
    facts=_facts,
    options=LOADER_OPTIONS,
    order=70,
)
