"""``eagle1:<dir or org/name>``: a published EAGLE-1 or EAGLE-2 head (SafeAILab/EAGLE's layout,
:mod:`specbench.drafters.eagle1_layout`) drafting for the recipe model ``options.of`` in the ``eagle``
method's chain and tree loops. A directory is read as it is; an ``org/name`` Hub id from the local
Hugging Face cache, or from the Hub when it answers (offline and not cached: one line, at once). The
head's shapes are checked against the target before any row; environment.json records its layout and
digest. The options beside ``of`` are the ``eagle:`` source's: ``cuda_graphs``,
``attn_implementation``, ``step_graph``. A target on a serving engine does not take one.

    models:
      target: {source: lmsys/vicuna-7b-v1.3}
      head: {source: "eagle1:yuhuili/EAGLE-Vicuna-7B-v1.3", options: {of: target}}
"""

from __future__ import annotations

from pathlib import Path

from specbench.errors import SpecbenchError, expand_home
from specbench.sources import LoadContext, Source
from specbench.sources import checkpoints as ckpt
from specbench.sources.eagle import head_options_problem

PREFIX = "eagle1:"
OPTIONS = ("cuda_graphs", "attn_implementation", "step_graph")


def published_folder(source: str, prefix: str, where: str, network: bool = True) -> Path:
    """The folder of the published head ``source`` (``<prefix><dir or org/name>``) names."""
    from specbench.sources.hub import hub_folder

    named = source.removeprefix(prefix)
    path = expand_home(named, where)
    if path.is_dir():
        return path
    if not ckpt.is_hub_id(named):
        raise SpecbenchError(
            where,
            f"{named!r} is neither a directory nor a hub id",
            f"write {prefix}<folder of the head> or {prefix}<org/name>",
        )
    return hub_folder(named, where, network)


def target_of(context: LoadContext, what: str):
    """The HFModel the head drafts for (``options.of``), refused in one line when it is not named or
    runs on a serving engine (published heads draft in specbench's own loops)."""
    request, where = context.request, context.where
    of = request.opts.get("of")
    if of is None:
        raise SpecbenchError(f"{where}.options.of", f"{what}: no target named", "add of: TARGET")
    served = context.resolve(of) if context.resolve is not None else None
    if getattr(served, "serving_dtype", None) is not None:
        raise SpecbenchError(
            f"{where}.source",
            f"{what} draft in specbench's own loops; {of} runs on a serving engine",
            f"run {of} with engine: eager or compiled",
        )
    return context.base_model(of, what)


def _load(context: LoadContext):
    from specbench.drafters import eagle1_layout

    request, where = context.request, context.where
    target = target_of(context, "a published EAGLE-1/2 head")
    chosen = {name: request.opts[name] for name in OPTIONS if name in request.opts}
    folder = published_folder(request.source, PREFIX, f"{where}.source")
    drafter = eagle1_layout.load(folder, request.name, target, where, **chosen)
    drafter.origin = f"EAGLE-1/2 head {folder} on {request.opts['of']}"
    return drafter


def published_head(source: str, prefix: str, digest) -> tuple[Path, str]:
    """(folder, ``digest(folder, where)``) of the published head ``source`` names, the network not asked."""
    folder = published_folder(source, prefix, "source", network=False)
    return folder, digest(folder, str(folder))


def _published(source: str) -> tuple[Path, str]:
    from specbench.drafters.eagle1_layout import digest

    return published_head(source, PREFIX, digest)


def _facts(name, models, dtype):
    from specbench.drafters.eagle1_layout import parameters
    from specbench.models.facts import DTYPE_BYTES, ModelFacts

    spec, where = models[name], f"models.{name}.source"
    folder = published_folder(spec.source, PREFIX, where, network=False)
    params, embedding = parameters(folder, where)
    vocab, hidden = _sizes(folder)
    size = DTYPE_BYTES[dtype]
    # a pass reads the head's layer and fc (a few embedding rows) and the target's LM head it shares
    read = params - embedding + vocab * hidden
    return ModelFacts(
        name, spec.source, f"published EAGLE-1/2 head on {spec.options.get('of')}", dtype, params,
        params * size, 0, shares=spec.options.get("of"), pass_bytes=read * size,
    )  # fmt: skip


def _sizes(folder: Path) -> tuple[int, int]:
    """(vocabulary, hidden size) the head's config names; (0, 0) where it does not say."""
    import json

    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if not isinstance(config, dict):
        config = {}
    vocab, hidden = config.get("vocab_size"), config.get("hidden_size")
    return (vocab, hidden) if isinstance(vocab, int) and isinstance(hidden, int) else (0, 0)


SOURCE = Source(
    "eagle1",
    f"{PREFIX}<dir or org/name>: a published EAGLE-1/2 head (SafeAILab/EAGLE's layout) on options.of",
    matches=lambda source: source.startswith(PREFIX),
    load=_load,
    facts=_facts,
    options=("of", *OPTIONS),
    order=38,
    neural=False,
    fixed_weights=True,
    dtype_rule=None,
    heads=True,
    heads_for="eagle",
    check=head_options_problem,
    published=_published,
)
