"""The decoding methods a recipe can name, each a thin adapter onto its algorithm module.

A method gets the cell's resolved hyperparameters, the loaded target, its drafter (None, a model or
a statistical drafter; for cascades the list of drafters, largest first, statistical last) and one
prompt, and returns a :class:`~specbench.decoding.generation.Generation`. Later algorithms add
one entry here and their hyperparameter schema in ``specbench.recipe.METHODS``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specbench.decoding import (
    autoregressive,
    cascade_drafting,
    hf_generate,
    sequential_cascades,
    spec_cascades,
    speculative,
)
from specbench.decoding import specdecpp as specdecpp_decoding
from specbench.decoding.acceptance import lenience_factor
from specbench.decoding.generation import Generation
from specbench.decoding.sampling import SamplingParams
from specbench.models.base import ModelDrafter
from specbench.models.hf import HFModel


@dataclass(frozen=True)
class Request:
    prompt_ids: torch.Tensor
    max_new_tokens: int
    sampling: SamplingParams
    eos_token_id: list[int]
    generator: torch.Generator
    # the target's autoregressive output ids for this example, for methods that declare
    # ``needs_reference`` (oracles); None otherwise
    reference_ids: list[int] | None = None


def _autoregressive(params: dict, target, drafter, r: Request) -> Generation:
    return autoregressive.generate(
        target,
        r.prompt_ids,
        max_new_tokens=r.max_new_tokens,
        sampling=r.sampling,
        eos_token_id=r.eos_token_id,
        generator=r.generator,
    )


def _speculative(params: dict, target, drafter, r: Request) -> Generation:
    if isinstance(drafter, HFModel):
        drafter = ModelDrafter(drafter)
    return speculative.generate(
        target,
        drafter,
        r.prompt_ids,
        k=params["k"],
        max_new_tokens=r.max_new_tokens,
        sampling=r.sampling,
        eos_token_id=r.eos_token_id,
        generator=r.generator,
        lenience=lenience_factor(params.get("lenience", 1.0), params.get("lenience_convention", "cs")),
    )


def _hf(params: dict, target, drafter, r: Request, *, prompt_lookup: bool = False) -> Generation:
    return hf_generate.generate(
        target,
        r.prompt_ids,
        max_new_tokens=r.max_new_tokens,
        sampling=r.sampling,
        eos_token_id=r.eos_token_id,
        generator=r.generator,
        assistant=drafter,
        k=params["k"],
        prompt_lookup=prompt_lookup,
        max_ngram=params.get("max_ngram", 2),
        schedule=params.get("num_assistant_tokens_schedule", "constant"),
        confidence_threshold=params.get("assistant_confidence_threshold", 0.0),
    )


def _cs_drafting(params: dict, target, drafters: list, r: Request) -> Generation:
    *neural, mag = drafters
    K = params["K"]
    if params["k_convention"] == "increment":
        K = cascade_drafting.cumulative_from_increments(K)
    return cascade_drafting.generate(
        target,
        neural,
        mag,
        r.prompt_ids,
        K=K,
        max_new_tokens=r.max_new_tokens,
        sampling=r.sampling,
        eos_token_id=r.eos_token_id,
        generator=r.generator,
        lenience=params["lenience"],
        mag_tokens=params["mag_tokens"],
        mag_tail=params["mag_tail"],
        mag_lenience=params["mag_lenience"],
        reference_compat=params["reference_compat"],
    )


def _specdecpp(params: dict, target, drafter: HFModel, r: Request) -> Generation:
    """SpecDec++ (Huang et al. 2024): the SD loop with k = max_length and a head-stopped drafter."""
    from specbench.drafters.acceptance_head import load_head

    head = load_head(params["head"], drafter.device)
    adaptive = specdecpp_decoding.SpecDecPPDrafter(
        drafter,
        head,
        threshold=params["threshold"],
        min_length=params["min_length"],
        eos_token_id=r.eos_token_id,
    )
    try:
        return speculative.generate(
            target,
            adaptive,
            r.prompt_ids,
            k=params["max_length"],
            max_new_tokens=r.max_new_tokens,
            sampling=r.sampling,
            eos_token_id=r.eos_token_id,
            generator=r.generator,
        )
    finally:
        drafter.keep_hidden = False  # other cells share this drafter: back to the fast path


def _oracle_sd(params: dict, target, drafter: HFModel, r: Request) -> Generation:
    """Lemma 2.1's greedy oracle: draft lengths from the target's own AR output (Request.reference_ids)."""
    oracle = specdecpp_decoding.OracleDrafter(drafter, r.prompt_ids, r.reference_ids or [])
    return speculative.generate(
        target,
        oracle,
        r.prompt_ids,
        k=r.max_new_tokens,
        max_new_tokens=r.max_new_tokens,
        sampling=r.sampling,
        eos_token_id=r.eos_token_id,
        generator=r.generator,
    )


def _cascade_kwargs(r: Request) -> dict:
    return dict(
        max_new_tokens=r.max_new_tokens,
        sampling=r.sampling,
        eos_token_id=r.eos_token_id,
        generator=r.generator,
    )


def _spec_cascade(params: dict, target, drafter: HFModel, r: Request) -> Generation:
    """Speculative cascades (Narasimhan et al. 2025, Algorithm 4) with deferral rule ``rule``."""
    return spec_cascades.generate(
        target,
        ModelDrafter(drafter),
        r.prompt_ids,
        rule=params["rule"],
        params=params,
        k=params["k"],
        **_cascade_kwargs(r),
    )


def _token_cascade(params: dict, target, drafter: HFModel, r: Request) -> Generation:
    return sequential_cascades.token_cascade(
        target,
        drafter,
        r.prompt_ids,
        rule=params["rule"],
        alpha=params["alpha"],
        max_small_tokens=params["max_small_tokens"],
        **_cascade_kwargs(r),
    )


def _seq_cascade(params: dict, target, drafter: HFModel, r: Request) -> Generation:
    return sequential_cascades.seq_cascade(
        target, drafter, r.prompt_ids, alpha=params["alpha"], **_cascade_kwargs(r)
    )


def _oracle_cascade(params: dict, target, drafter: HFModel, r: Request) -> Generation:
    return sequential_cascades.oracle_cascade(
        target, drafter, r.prompt_ids, rule=params["rule"], params=params, **_cascade_kwargs(r)
    )


def _bild(params: dict, target, drafter: HFModel, r: Request) -> Generation:
    return sequential_cascades.bild(
        target,
        drafter,
        r.prompt_ids,
        alpha=params["alpha"],
        fallback_alpha=params["fallback_alpha"],
        k=params["k"],
        discrepancy_metric=params["discrepancy"],
        **_cascade_kwargs(r),
    )


METHOD_FUNCTIONS: dict[str, Callable[[dict, object, object, Request], Generation]] = {
    "autoregressive": _autoregressive,
    "speculative": _speculative,
    "hf_assisted": _hf,
    "hf_prompt_lookup": functools.partial(_hf, prompt_lookup=True),
    "cs_drafting": _cs_drafting,
    "spec_cascade": _spec_cascade,
    "token_cascade": _token_cascade,
    "seq_cascade": _seq_cascade,
    "oracle_cascade": _oracle_cascade,
    "bild": _bild,
    "specdecpp": _specdecpp,
    "oracle_sd": _oracle_sd,
}


def is_lossless(method: str, params: dict) -> bool:
    """Whether the method must reproduce the target's own output (checked against the AR cell when greedy)."""
    if method == "speculative":
        return params.get("lenience", 1.0) == 1.0
    if method == "spec_cascade":  # π = p exactly: the sd rule, or lossy SD with α = 0 and β = 1
        lossy_as_sd = params.get("alpha") == 0 and params.get("beta") == 1 and not params.get("tune_beta")
        return params.get("rule") == "sd" or (params.get("rule") == "lossy" and lossy_as_sd)
    # CS Drafting's lenience loosens only the drafters' reviews; the target's stays strict
    return method in ("hf_assisted", "hf_prompt_lookup", "cs_drafting", "specdecpp", "oracle_sd")
