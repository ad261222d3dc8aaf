"""``eagle3:<dir or hub id>``: a published EAGLE-3 head, in the EAGLE / SpecForge layout or the
speculators one (:mod:`specbench.drafters.head_layouts`), drafting for the recipe model ``options.of``
(its target, whose aux states it reads) in the ``eagle`` method's chain and tree loops. A directory is
read as it is; an ``org/name`` Hub id from the local Hugging Face cache, or from the Hub when it answers
(offline and not cached: one line, at once). Every shape is checked against the target when it loads,
before any row (hidden size, aux layers, ``fc`` width, vocabulary, ``d2t``), and environment.json
records the head's layout, digest and aux layers. The options beside ``of`` are the ``eagle:``
source's: ``cuda_graphs``, ``attn_implementation``, ``step_graph``. A head trained by ``specbench
distill --size eagle3-layer`` is found by its name in the specbench cache, ``<target>/<name>``. On a
target served by vLLM (``engine: vllm``) the engine runs the head (method ``eagle3``) from its export
in the speculators layout, written once into the specbench cache by the head's digest
(:mod:`specbench.drafters.eagle3_engine`).

    models:
      target: {source: meta-llama/Llama-3.1-8B-Instruct}
      head: {source: "eagle3:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", options: {of: target}}
"""

from __future__ import annotations

import math
from pathlib import Path

from specbench.errors import SpecbenchError, expand_home
from specbench.models import cache
from specbench.sources import LoadContext, Source
from specbench.sources import checkpoints as ckpt
from specbench.sources.eagle import head_options_problem

PREFIX = "eagle3:"
OPTIONS = ("cuda_graphs", "attn_implementation", "step_graph")


def head_folder(source: str, where: str, network: bool = True) -> Path:
    """The folder of the head ``source`` names (``network``: the Hub may be asked)."""
    from specbench.sources.hub import hub_folder

    named = source.removeprefix(PREFIX)
    path = expand_home(named, where)
    if path.is_dir():
        return path
    trained = cache.distilled_dir(named)  # specbench distill --size eagle3-layer
    if (trained / "config.json").is_file():
        return trained
    if not ckpt.is_hub_id(named):
        raise SpecbenchError(
            where,
            f"{named!r} is neither a directory nor a hub id",
            "write eagle3:<folder of the head> or eagle3:<org/name>",
        )
    return hub_folder(named, where, network)


def _load(context: LoadContext):
    from specbench.drafters import head_layouts

    request, where = context.request, context.where
    of = request.opts.get("of")
    if of is None:
        raise SpecbenchError(
            f"{where}.options.of", "a published EAGLE-3 head: no target named", "add of: TARGET"
        )
    served = context.resolve(of) if context.resolve is not None else None
    if getattr(served, "serving_dtype", None) is not None:  # the engine loads the head itself
        from specbench.drafters.eagle3_engine import Eagle3HeadForEngine

        folder = head_folder(request.source, f"{where}.source")
        return Eagle3HeadForEngine(request.name, folder, served, where)
    base = context.base_model(of, "a published EAGLE-3 head")
    chosen = {name: request.opts[name] for name in OPTIONS if name in request.opts}
    folder = head_folder(request.source, f"{where}.source")
    drafter = head_layouts.load(folder, request.name, base, where, **chosen)
    drafter.origin = f"EAGLE-3 head ({drafter.checkpoint['layout']} layout) {folder} on {of}"
    return drafter


def _published(source: str) -> tuple[Path, str]:
    from specbench.drafters.head_layouts import digest

    folder = head_folder(source, "source", network=False)
    return folder, digest(folder, str(folder))


def _facts(name, models, dtype):
    from specbench.drafters.head_layouts import tensor_shapes
    from specbench.models.facts import DTYPE_BYTES, ModelFacts

    spec, where = models[name], f"models.{name}.source"
    shapes = tensor_shapes(head_folder(spec.source, where, network=False), where)
    sizes = {key: math.prod(shape) for key, shape in shapes.items() if key not in ("d2t", "t2d")}
    params = sum(sizes.values())
    read = params - sizes.get("embed_tokens.weight", 0)  # a pass reads a few rows of its embedding
    of = spec.options.get("of")
    size = DTYPE_BYTES[dtype]
    return ModelFacts(
        name, spec.source, f"published EAGLE-3 head on {of}", dtype, params, params * size, 0,
        shares=of, pass_bytes=read * size,
    )  # fmt: skip


SOURCE = Source(
    "eagle3",
    f"{PREFIX}<dir or org/name>: a published EAGLE-3 head (EAGLE or speculators layout) on options.of",
    matches=lambda source: source.startswith(PREFIX),
    load=_load,
    facts=_facts,
    options=("of", *OPTIONS),
    order=37,
    neural=False,
    fixed_weights=True,
    dtype_rule=None,
    heads=True,
    heads_for="eagle",
    check=head_options_problem,
    published=_published,
)
