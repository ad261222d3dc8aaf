"""Autoregressive decoding: one target forward pass per token (the baseline of every speedup)."""

from __future__ import annotations

import torch

from specbench.decoding.generation import Generation, Stopwatch, eos_set
from specbench.methods import BASELINE, TARGET, Method, PassRule, Request
from specbench.models.base import LanguageModel
from specbench.models.sampling import SamplingParams


def generate(
    model: LanguageModel,
    prompt_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_id=None,
    generator: torch.Generator | None = None,
) -> Generation:
    eos = eos_set(eos_token_id)
    model.counter.reset()
    watch = Stopwatch(model.device)
    model.start(prompt_ids)
    out = torch.empty(max_new_tokens, dtype=torch.long, device=model.device)
    tokens: list[int] = []
    stopped = False
    for i in range(max_new_tokens):
        logits = model.score(out[:i], 0).logits[-1]
        probs = None if sampling.greedy else sampling.probs(logits)
        out[i] = sampling.choose(probs, logits, generator)
        token = int(out[i])
        tokens.append(token)
        watch.mark_first_token()
        if token in eos:
            stopped = True
            break
    walltime, ttft = watch.stop()
    steps = [(0, 0)] * len(tokens)
    return Generation(tokens, walltime, ttft, steps, {model.name: model.counter.snapshot()}, stopped)


def _run(params: dict, target: LanguageModel, drafter: None, r: Request) -> Generation:
    return generate(target, r.prompt_ids, **r.decoding())


METHODS = (
    Method(
        BASELINE,
        "one target forward pass per token",
        _run,
        {},
        baseline=True,
        plan=PassRule("T target passes", lambda params, tokens, alpha: ([(TARGET, tokens)], None)),
    ),
)
