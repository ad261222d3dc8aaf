"""``distilled:<target>/<size>``: a drafter trained by ``specbench distill`` (``make drafts``), read from
``<cache>/drafters/<target>/<size>``; a saved draft vocabulary restricts its head (FR-Spec). A ``.gguf``
conversion in that folder is what llama.cpp loads as a draft model (its head scores every token)."""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.models.cache import DISTILLED_PREFIX
from specbench.models.options import LOADER_OPTIONS
from specbench.sources import LoadContext, Source, Weights
from specbench.sources import checkpoints as ckpt
from specbench.sources.local import gguf_in


def _path(source: str):
    return cache.distilled_dir(source.removeprefix(DISTILLED_PREFIX))


def _folder(source: str, where: str):
    path = _path(source)
    if not (path / "config.json").is_file():
        raise SpecbenchError(
            where,
            f"no distilled drafter {source!r} in {path.parent}",
            "build it with `make drafts` (or `specbench distill`), or set SPECBENCH_CACHE to where it is",
        )
    return path


def _tokenizer(source: str) -> str | None:
    """A distilled drafter keeps its target's tokenizer (``distilled:<target>/<size>``)."""
    from specbench.sources import tokenizer_of

    target = source.removeprefix(DISTILLED_PREFIX).partition("/")[0]
    return tokenizer_of(target) if target else None


def _load(context: LoadContext) -> Weights:
    request = context.request
    path = _folder(request.source, f"{context.where}.source")
    model, tokenizer = ckpt.from_pretrained(str(path), context.dtype, ckpt.loader_options(request.opts))
    from specbench.drafters import draft_vocab

    restricted = draft_vocab.restrict_if_saved(model, path)
    suffix = f" (head over its {restricted} most frequent tokens)" if restricted else ""
    return Weights(model, tokenizer, f"distilled:{path}{suffix}")


def _facts(name, models, dtype):
    source, where = models[name].source, f"models.{name}.source"
    config = _folder(source, where) / "config.json"
    return ckpt.config_facts(name, source, "distilled drafter", dtype, config, where)


SOURCE = Source(
    "distilled",
    "distilled:<target>/<size>, a drafter trained by specbench distill",
    matches=lambda source: source.startswith(DISTILLED_PREFIX),
    load=_load,
    facts=_facts,
    options=LOADER_OPTIONS,
    order=30,
    trained_in=_path,
    tokenizer=_tokenizer,
    gguf=lambda source, where: gguf_in(_folder(source, where), source, where),
)
