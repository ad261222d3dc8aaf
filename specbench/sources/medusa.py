"""``medusa:<target>/<name>``: Medusa heads trained by ``specbench distill --size medusa`` on the
recipe model ``options.of`` (their target, whose last hidden state they read and whose LM head they
share), from ``<cache>/drafters/<target>/<name>`` (:mod:`specbench.drafters.medusa`)."""

from __future__ import annotations

import json

from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.sources import LoadContext, Source

PREFIX = "medusa:"


def folder(source: str):
    return cache.distilled_dir(source.removeprefix(PREFIX))


def _load(context: LoadContext):
    from specbench.drafters import medusa

    request, where = context.request, context.where
    of = request.opts.get("of")
    if of is None:
        raise SpecbenchError(f"{where}.options.of", "Medusa heads read a target's states", "add of: TARGET")
    served = context.resolve(of) if context.resolve is not None else None
    if getattr(served, "serving_dtype", None) is not None:  # a serving engine's target loads them itself
        return medusa.HeadsForEngine(request.name, folder(request.source))
    base = context.base_model(of, "Medusa heads")
    heads = medusa.load(folder(request.source), request.name, base, where)
    heads.origin = f"medusa heads {folder(request.source)} on {of}"
    return heads


def _facts(name, models, dtype):
    from specbench.drafters.medusa import MANIFEST
    from specbench.models.facts import DTYPE_BYTES, ModelFacts

    spec = models[name]
    path = folder(spec.source) / MANIFEST
    if not path.is_file():
        raise SpecbenchError(
            f"models.{name}.source",
            f"no Medusa heads at {path.parent}",
            "train them with specbench distill --size medusa",
        )
    manifest = json.loads(path.read_text())
    hidden = manifest["hidden_size"]
    params = manifest["heads"] * (hidden * hidden + hidden)
    origin = f"{manifest['heads']} Medusa heads on {spec.options.get('of')} (share its LM head)"
    return ModelFacts(
        name,
        spec.source,
        origin,
        dtype,
        params,
        params * DTYPE_BYTES[dtype],
        0,
        shares=spec.options.get("of"),
    )


SOURCE = Source(
    "medusa",
    "medusa:<target>/<name>: Medusa heads trained by specbench distill --size medusa",
    matches=lambda source: source.startswith(PREFIX),
    load=_load,
    facts=_facts,
    options=("of",),
    order=35,
    neural=False,
    fixed_weights=True,
    dtype_rule=None,
    heads=True,
)
