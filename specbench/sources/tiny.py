"""``tiny-llama`` / ``tiny-t5``: random-init models built in-process (tests, CI recipes) with a
byte-level tokenizer (:mod:`specbench.models.tiny`). ``dtype: auto`` keeps them float32, since tests
compare them exactly."""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.sources import LoadContext, Source, Weights

NAMES = ("tiny-llama", "tiny-t5")
DEFAULTS = {"hidden_size": 32, "heads": 4}


def _load(context: LoadContext) -> Weights:
    from specbench.models.tiny import build_tiny

    request = context.request
    opts = request.opts
    try:
        model, tokenizer = build_tiny(request.source, dtype=context.dtype, **opts)
    except TypeError as error:
        raise SpecbenchError(
            f"{context.where}.options",
            str(error),
            "use seed, vocab_size, hidden_size, layers, heads or init_std",
        ) from None
    return Weights(model, tokenizer, f"{request.source} (random init, seed {opts.get('seed', 0)})")


def _tokenizer(context: LoadContext):
    """The byte tokenizer and the configuration, the model built on the meta device (no weights)."""
    import torch

    from specbench.models.tiny import build_tiny
    from specbench.sources.tokenizers import Tokenizer

    with torch.device("meta"):
        model, tokenizer = build_tiny(context.request.source, **context.request.opts)
    return Tokenizer(tokenizer, model.config, f"{context.request.source} (tokenizer only)")


def _facts(name, models, dtype):
    import torch

    from specbench.models.facts import from_config
    from specbench.models.tiny import build_tiny

    spec = models[name]
    with torch.device("meta"):
        model, _ = build_tiny(spec.source, **spec.options)
    return from_config(name, spec.source, "in-process tiny model", dtype, {}, model.config)


def _check(source: str, options: dict):
    tiny = {**DEFAULTS, **options}
    if isinstance(tiny["hidden_size"], int) and isinstance(tiny["heads"], int):
        if tiny["hidden_size"] % tiny["heads"]:
            return (
                "heads",
                f"hidden_size {tiny['hidden_size']} is not a multiple of heads {tiny['heads']}",
                "choose heads that divide hidden_size",
            )
    return None


SOURCE = Source(
    "tiny",
    "tiny-llama or tiny-t5, random-init models built in-process (tests)",
    matches=lambda source: source in NAMES,
    load=_load,
    facts=_facts,
    options=("seed", "vocab_size", "hidden_size", "layers", "heads", "init_std"),
    bounds={
        "seed": (int, 0, 2**63 - 1),
        "vocab_size": (int, 260, 262_144),  # the byte tokenizer's 260 ids must fit
        "hidden_size": (int, 1, 4096),
        "layers": (int, 1, 64),
        "heads": (int, 1, 64),
        "init_std": ((int, float), 1e-6, 10.0),
    },
    check=_check,
    order=10,
    fixed_weights=True,
    dtype_rule="float32",
    load_tokenizer=_tokenizer,
)
