"""``medusa-heads:<dir or org/name>``: published Medusa heads (FasterDecoding/Medusa's
``medusa_lm_head`` layout, :mod:`specbench.drafters.medusa_layout`) drafting for the recipe model
``options.of`` in the ``medusa`` method's tree loop, each head with its own LM head. Read from a
directory, the local Hugging Face cache or the Hub, as ``eagle1:`` heads are; their shapes are checked
against the target before any row; environment.json records the layout, digest and the base model they
name. (``medusa:<target>/<name>`` are the heads ``specbench distill`` trains.)

    models:
      target: {source: lmsys/vicuna-7b-v1.3}
      heads: {source: "medusa-heads:FasterDecoding/medusa-vicuna-7b-v1.3", options: {of: target}}
"""

from __future__ import annotations

from specbench.sources import LoadContext, Source
from specbench.sources.eagle1 import published_folder, published_head, target_of

PREFIX = "medusa-heads:"


def _load(context: LoadContext):
    from specbench.drafters import medusa_layout

    request, where = context.request, context.where
    target = target_of(context, "published Medusa heads")
    folder = published_folder(request.source, PREFIX, f"{where}.source")
    drafter = medusa_layout.load(folder, request.name, target, where)
    drafter.origin = f"Medusa heads {folder} on {request.opts['of']}"
    return drafter


def _published(source: str):
    from specbench.drafters.medusa_layout import digest

    return published_head(source, PREFIX, digest)


def _facts(name, models, dtype):
    from specbench.drafters.medusa_layout import parameters
    from specbench.models.facts import DTYPE_BYTES, ModelFacts

    spec, where = models[name], f"models.{name}.source"
    params = parameters(published_folder(spec.source, PREFIX, where, network=False), where)
    size = DTYPE_BYTES[dtype]
    return ModelFacts(
        name, spec.source, f"published Medusa heads on {spec.options.get('of')}", dtype, params,
        params * size, 0, shares=spec.options.get("of"), pass_bytes=params * size,
    )  # fmt: skip


SOURCE = Source(
    "medusa-heads",
    f"{PREFIX}<dir or org/name>: published Medusa heads (medusa_lm_head layout) on options.of",
    matches=lambda source: source.startswith(PREFIX),
    load=_load,
    facts=_facts,
    options=("of",),
    order=39,
    neural=False,
    fixed_weights=True,
    dtype_rule=None,
    heads=True,
    heads_for="medusa",
    published=_published,
)
