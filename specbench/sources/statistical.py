"""``prompt-lookup`` / ``maxgram``: the statistical copy drafter (no weights, cost 0 in every cost table).

``options.bigram`` (a table file) gives CS Drafting's Max-Gram with the greedy bigram fill, copying at
most ``max_copy`` (default 10) tokens; ``variant: reference`` the CS Drafting authors' Max-Gram
(:mod:`specbench.drafters.reference_maxgram`)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from specbench.errors import SpecbenchError, expand_home
from specbench.models import cache
from specbench.models.cache import DISTILLED_PREFIX
from specbench.sources import LoadContext, ModelRequest, Source

NAMES = ("prompt-lookup", "maxgram")
BIGRAM_FILE = "bigram.json"
# specbench: Max-Gram as the paper describes it; reference: as the authors' code runs it
VARIANTS = ("specbench", "reference")


def _load(context: LoadContext):
    request, where = context.request, f"{context.where}.options"
    opts = dict(request.opts)
    variant = opts.get("variant", "specbench")
    if variant == "reference":
        return _load_reference(request, opts, where)
    if "bigram" in opts:
        from specbench.drafters.bigram import BigramTable, cs_drafting_maxgram

        path = bigram_path(request, opts["bigram"])
        return cs_drafting_maxgram(BigramTable.load(path), opts.get("max_copy", 10), request.name)
    from specbench.drafters.maxgram import MaxGramDrafter

    return MaxGramDrafter(request.name, max_ngram=opts.get("max_ngram"), max_copy=opts.get("max_copy"))


def _load_reference(request: ModelRequest, opts: dict, where: str):
    from specbench.drafters.bigram import BigramTable
    from specbench.drafters.reference_maxgram import ReferenceMaxGramDrafter

    if "bigram" not in opts:
        raise SpecbenchError(
            f"{where}.bigram", "the reference Max-Gram fills with a bigram table", "add bigram: TABLE"
        )
    table = BigramTable.load(bigram_path(request, opts["bigram"]))
    return ReferenceMaxGramDrafter(table, request.name, decoder_start=opts.get("decoder_start"))


def bigram_path(request: ModelRequest, value) -> Path:
    """The bigram table file: ``distilled:NAME``, or a path where ``~`` and ``$VARIABLES`` expand
    (recipes name published tables as ``$SPECBENCH_DATA_DIR/cs_drafting_bigram/...``)."""
    unset = [name for name in re.findall(r"\$\{?(\w+)", str(value)) if name not in os.environ]
    if unset:
        raise SpecbenchError(
            f"models.{request.name}.options.bigram",
            f"{value} names ${unset[0]}, which is not set",
            f"set {unset[0]} (e.g. export {unset[0]}=/path/to/data), or give the table's path",
        )
    path = expand_home(os.path.expandvars(str(value)), f"models.{request.name}.options.bigram")
    if str(value).startswith(DISTILLED_PREFIX):
        path = cache.distilled_dir(str(value).removeprefix(DISTILLED_PREFIX)) / BIGRAM_FILE
    if not path.is_file():
        raise SpecbenchError(
            f"models.{request.name}.options.bigram",
            f"no bigram table at {path}",
            "build one with `specbench bigram build` (make drafts builds the SmolLM2 one)",
        )
    return path


def _facts(name, models, dtype):
    from specbench.models.facts import ModelFacts

    return ModelFacts(name, models[name].source, "statistical drafter (no weights)", dtype, 0, 0, 0)


def _check(source: str, options: dict):
    variant = options.get("variant", "specbench")
    if variant not in VARIANTS:
        return "variant", f"unknown Max-Gram variant {variant!r}", "use specbench or reference"
    if variant == "reference":
        for name in ("max_ngram", "max_copy"):
            if name in options:
                return (
                    name,
                    f"the reference Max-Gram has no {name}",
                    f"remove {name} (or use variant: specbench)",
                )
        start = options.get("decoder_start")
        if start is not None and (type(start) is not int or start < 0):
            return (
                "decoder_start",
                f"{start!r} is not a token id",
                "give the decoder start token id (FLAN-T5: 0)",
            )
    elif "decoder_start" in options:
        return "decoder_start", "decoder_start belongs to the reference Max-Gram", "add variant: reference"
    return None


SOURCE = Source(
    "statistical",
    "prompt-lookup or maxgram: copies n-grams from the prompt and output (no weights)",
    matches=lambda source: source in NAMES,
    load=_load,
    facts=_facts,
    options=("max_ngram", "max_copy", "bigram", "variant", "decoder_start"),
    bounds={
        "max_ngram": (int, 1, 1_000_000),
        "max_copy": (int, 1, 1_000_000),
        "decoder_start": (int, 0, 10_000_000),
    },
    check=_check,
    order=0,
    neural=False,
    fixed_weights=True,
    dtype_rule=None,
)
