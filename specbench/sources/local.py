"""A local model directory (``config.json``, weights and a tokenizer), as ``save_pretrained`` writes it; a
``.gguf`` file beside them (llama.cpp's ``convert_hf_to_gguf.py`` writes one) is what llama.cpp serves."""

from __future__ import annotations

from pathlib import Path

from specbench.errors import SpecbenchError, expand_home
from specbench.models.options import LOADER_OPTIONS
from specbench.sources import LoadContext, Source, Weights, tokenizers
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


def gguf_in(folder: Path, source: str, where: str) -> Path:
    """The one ``.gguf`` file in a model's folder: the same weights for an engine that reads GGUF."""
    found = sorted(Path(folder).glob("*.gguf"))
    if len(found) != 1:
        held = f"{len(found)} .gguf files ({', '.join(p.name for p in found)})" if found else "no .gguf file"
        raise SpecbenchError(
            where,
            f"{source} holds {held}, and llama.cpp serves one GGUF file of these weights",
            "put the model's one GGUF file in its folder (llama.cpp's convert_hf_to_gguf.py writes it), "
            "or name the file in engine_options.gguf",
        )
    return found[0]


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
    gguf=lambda source, where: gguf_in(expand_home(source, where), source, where),
    load_tokenizer=tokenizers.of_folder,
)
