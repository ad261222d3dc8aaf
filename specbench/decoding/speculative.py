"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023), greedy and sampled.

Each step: the drafter proposes up to k tokens, the target scores all of them in ONE forward
pass, an acceptance rule (specbench.decoding.acceptance) keeps the longest accepted prefix and
supplies the next token (correction or bonus), and both KV caches roll back to the accepted length.
"""

from __future__ import annotations

import torch

from specbench.decoding.acceptance import AcceptanceRule, exact_rule
from specbench.decoding.generation import Generation, Stopwatch, commit, eos_set, truncate_at_eos
from specbench.decoding.sampling import SamplingParams
from specbench.models.base import Drafter, LanguageModel


def generate(
    target: LanguageModel,
    drafter: Drafter,
    prompt_ids: torch.Tensor,
    *,
    k: int,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_id=None,
    generator: torch.Generator | None = None,
    lenience: float = 1.0,
    rule: AcceptanceRule | None = None,
) -> Generation:
    """Generate with draft length k; ``lenience`` is in the CS convention (l >= 1, 1 = lossless).

    A custom ``rule`` receives probabilities p (``sampling.probs`` of the target's logits); the
    default strict greedy rule receives raw logits, so its argmax is exactly autoregressive greedy's.
    """
    if k < 1:
        raise ValueError(f"draft length k must be >= 1, got {k}")
    raw_logits = rule is None and sampling.greedy and lenience == 1.0
    rule = rule or exact_rule(sampling.greedy, lenience)
    eos = eos_set(eos_token_id)
    target.counter.reset()
    drafter.counter.reset()
    watch = Stopwatch(target.device)
    target.start(prompt_ids)
    drafter.start(prompt_ids)

    out = torch.empty(max_new_tokens + k + 1, dtype=torch.long, device=target.device)
    tokens: list[int] = []
    steps: list[tuple[int, int]] = []
    generated = 0
    stopped = False
    while generated < max_new_tokens and not stopped:
        budget = min(k, max_new_tokens - generated - 1)  # the step's +1 token must fit too
        draft = drafter.propose(out[:generated], budget, sampling, generator)
        draft_tokens, q = draft.tokens, draft.q
        d = draft_tokens.shape[0]
        out[generated : generated + d] = draft_tokens
        logits = target.score(out[: generated + d], d)
        p = logits if raw_logits else sampling.probs(logits)
        verdict = rule(draft_tokens, q, p, generator)

        n, new = commit(verdict, draft_tokens, out, generated)
        target.rollback(generated + n)
        drafter.rollback(generated + n)
        new, stopped = truncate_at_eos(new, eos)
        steps.append((d, n))
        tokens.extend(new)
        generated += n + 1
        watch.mark_first_token()
    walltime, ttft = watch.stop()
    forwards = {target.name: target.counter.snapshot(), drafter.name: drafter.counter.snapshot()}
    return Generation(tokens, walltime, ttft, steps, forwards, stopped)
