"""``early-exit``: the first ``options.layers`` layers of the recipe model ``options.of`` with its
final norm and head, sharing its weights (``options.exit_head``: a trained exit head's folder or
``distilled:<target>/<name>``). Its device and dtype are the base model's."""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.models import cache
from specbench.models.cache import DISTILLED_PREFIX
from specbench.sources import LoadContext, Source

NAME = "early-exit"


def _load(context: LoadContext):
    from specbench.drafters.early_exit import early_exit_model, load_exit_head
    from specbench.sources import wrap

    request, where = context.request, f"{context.where}.options"
    opts = dict(request.opts)
    of, layers, exit_head = opts.pop("of", None), opts.pop("layers", None), opts.pop("exit_head", None)
    if opts or of is None or not isinstance(layers, int) or isinstance(layers, bool):
        raise SpecbenchError(
            where,
            "early-exit takes options of (a recipe model name), layers (an integer) and exit_head",
            "e.g. options: {of: target, layers: 4}",
        )
    base = context.base_model(of, "early-exit")
    head = None
    if isinstance(exit_head, str) and exit_head.startswith(DISTILLED_PREFIX):
        exit_head = cache.distilled_dir(exit_head.removeprefix(DISTILLED_PREFIX))
    if exit_head is not None:
        weight = base.model.get_input_embeddings().weight
        head = load_exit_head(exit_head, base.model.config.hidden_size, weight)
    draft = wrap(request, early_exit_model(base.model, layers, head), base.tokenizer)
    draft.origin = f"early exit after layer {layers} of {of}" + (f" + exit head {exit_head}" if head else "")
    return draft


def _facts(name, models, dtype):
    """The first ``layers`` of its base model, whose weights it shares: 0 bytes of its own; KV cache
    and pass time are the base's times layers / L."""
    from specbench.models.facts import ModelFacts
    from specbench.sources import model_facts

    spec = models[name]
    of, layers = spec.options.get("of"), spec.options.get("layers")
    if of not in models or not isinstance(layers, int):
        raise SpecbenchError(
            f"models.{name}.options",
            "early-exit needs of: MODEL and layers: N",
            "e.g. {of: target, layers: 4}",
        )
    base = model_facts(of, models, dtype)
    fraction = min(1.0, layers / base.layers) if base.layers else 1.0
    return ModelFacts(
        name,
        spec.source,
        f"early exit after layer {layers} of {of} (shares its weights)",
        dtype,
        0,
        0,
        round(base.kv_bytes_per_token * fraction),
        architecture=base.architecture,
        layers=layers,
        shares=of,
        pass_fraction=fraction,
    )


SOURCE = Source(
    "early-exit",
    "early-exit: the first layers of another recipe model, sharing its weights",
    matches=lambda source: source == NAME,
    load=_load,
    facts=_facts,
    options=("of", "layers", "exit_head"),
    bounds={"layers": (int, 1, 1000)},
    order=40,
    fixed_weights=True,
    dtype_rule=None,
)
