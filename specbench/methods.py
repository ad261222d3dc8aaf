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

from specbench.decoding import autoregressive, cascade_drafting, hf_generate, speculative
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


METHOD_FUNCTIONS: dict[str, Callable[[dict, object, object, Request], Generation]] = {
    "autoregressive": _autoregressive,
    "speculative": _speculative,
    "hf_assisted": _hf,
    "hf_prompt_lookup": functools.partial(_hf, prompt_lookup=True),
    "cs_drafting": _cs_drafting,
}


def is_lossless(method: str, params: dict) -> bool:
    """Whether the method must reproduce the target's own output (checked against the AR cell when greedy)."""
    if method == "speculative":
        return params.get("lenience", 1.0) == 1.0
    # CS Drafting's lenience loosens only the drafters' reviews; the target's stays strict
    return method in ("hf_assisted", "hf_prompt_lookup", "cs_drafting")
