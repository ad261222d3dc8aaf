"""What the sources of heads on a target's states share (``medusa:``, ``eagle:``): a name
``<kind>:<target>/<name>`` for a folder under the distilled-drafter cache, the option ``of`` naming
the recipe model whose states they read, a loader that checks they were trained for it, and size facts
read from their manifest before anything loads. Each kind is one call of :func:`heads_source`."""

from __future__ import annotations

import json
from collections.abc import Callable

from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.sources import LoadContext, Source


def heads_source(
    kind: str,
    title: str,
    drafter: str,
    parameters: Callable[[dict], int],
    order: int,
    for_engine: str,
    options: tuple[str, ...] = (),
    check: Callable | None = None,
) -> Source:
    """A :class:`Source` for ``<kind>:<target>/<name>``: ``drafter`` the module of
    :mod:`specbench.drafters` that holds ``MANIFEST`` and ``load``; ``parameters(manifest)`` their
    own weights (the target's shared embedding and LM head not counted); ``for_engine`` the class in
    that module that stands for them when their target runs on a serving engine; ``options`` the
    options beside ``of`` that its ``load`` takes as keywords, ``check`` (source, options) -> the
    (option, problem, fix) of a value they cannot take, or None."""
    prefix = f"{kind}:"

    def folder(source: str):
        return cache.distilled_dir(source.removeprefix(prefix))

    def module():
        import importlib

        return importlib.import_module(f"specbench.drafters.{drafter}")

    def load(context: LoadContext):
        request, where = context.request, context.where
        of = request.opts.get("of")
        if of is None:
            raise SpecbenchError(f"{where}.options.of", f"{title}: no target named", "add of: TARGET")
        served = context.resolve(of) if context.resolve is not None else None
        if getattr(served, "serving_dtype", None) is not None:  # a serving engine loads them itself
            return getattr(module(), for_engine)(request.name, folder(request.source))
        base = context.base_model(of, title)
        chosen = {name: request.opts[name] for name in options if name in request.opts}
        heads = module().load(folder(request.source), request.name, base, where, **chosen)
        heads.origin = f"{kind} {folder(request.source)} on {of}"
        heads.checkpoint = trained_record(folder(request.source))
        return heads

    def trained_record(path) -> dict:
        """What environment.json records of how they were trained (the report names a run that
        differs: specbench.pipeline.views.head_alarms)."""
        manifest = json.loads((path / module().MANIFEST).read_text())
        teacher = manifest.get("teacher") or {}
        return {
            "layout": f"specbench {kind}",
            "path": str(path),
            "trained_on": teacher.get("target"),
            "chat_template": True,  # specbench distill renders every training prompt in it
            **({"aux_layer_ids": manifest["fused_layers"]} if manifest.get("fused_layers") else {}),
        }

    def facts(name, models, dtype):
        from specbench.models.facts import DTYPE_BYTES, ModelFacts

        spec = models[name]
        path = folder(spec.source) / module().MANIFEST
        if not path.is_file():
            raise SpecbenchError(
                f"models.{name}.source",
                f"{path.parent} holds no manifest of {title}",
                f"train them with specbench distill --size {kind}",
            )
        manifest = json.loads(path.read_text())
        params = parameters(manifest)
        origin = f"{title} on {spec.options.get('of')} (share its LM head)"
        lm_head_rows = len(manifest.get("draft_vocab") or ()) or manifest["vocab_size"]
        return ModelFacts(
            name,
            spec.source,
            origin,
            dtype,
            params,
            params * DTYPE_BYTES[dtype],
            0,
            shares=spec.options.get("of"),
            pass_bytes=(params + lm_head_rows * manifest["hidden_size"]) * DTYPE_BYTES[dtype],
        )

    return Source(
        kind,
        f"{prefix}<target>/<name>: {title} trained by specbench distill --size {kind}",
        matches=lambda source: source.startswith(prefix),
        load=load,
        facts=facts,
        options=("of", *options),
        order=order,
        neural=False,
        fixed_weights=True,
        dtype_rule=None,
        heads=True,
        trained_in=folder,
        check=check,
    )
