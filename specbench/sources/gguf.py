"""A path to a ``.gguf`` file, read (and de-quantised) by transformers (needs the ``gguf`` package)."""

from __future__ import annotations

from pathlib import Path

from specbench.errors import SpecbenchError, expand_home
from specbench.models.options import LOADER_OPTIONS
from specbench.sources import LoadContext, Source, Weights
from specbench.sources import checkpoints as ckpt


def _file(source: str, where: str) -> Path:
    path = expand_home(source, where)
    if not path.is_file():
        raise SpecbenchError(
            where, f"GGUF file {source} not found", "give the path of an existing .gguf file"
        )
    return path


def _load(context: LoadContext) -> Weights:
    request, where = context.request, f"{context.where}.source"
    path = _file(request.source, where)
    with ckpt.unreadable(where, request.source, "a GGUF file transformers can read (pip install gguf)"):
        model, tokenizer = ckpt.from_pretrained(
            str(path.parent), context.dtype, ckpt.loader_options(request.opts), gguf_file=path.name
        )
    return Weights(model, tokenizer, f"gguf:{path}")


def _facts(name, models, dtype):
    """Its size on disk (quantised; no parameter count, no KV cache)."""
    from specbench.models.facts import ModelFacts

    source = models[name].source
    path = _file(source, f"models.{name}.source")
    size = path.stat().st_size
    return ModelFacts(name, source, "gguf file size", dtype, None, size, 0, config_path=str(path))


SOURCE = Source(
    "gguf",
    "a path to a .gguf file",
    matches=lambda source: source.endswith(".gguf"),
    load=_load,
    facts=_facts,
    options=LOADER_OPTIONS,
    order=60,
    gguf=_file,
)
