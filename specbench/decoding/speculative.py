"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023), greedy and sampled.

Each step: the drafter proposes up to k tokens, the target scores all of them in ONE forward
pass, an acceptance rule (specbench.decoding.acceptance) keeps the longest accepted prefix and
supplies the next token (correction or bonus), and both KV caches roll back to the accepted length.
"""

from __future__ import annotations

import torch

from specbench.decoding import theory, verification_rules
from specbench.decoding.acceptance import AcceptanceRule, exact_rule, lenience_factor
from specbench.decoding.generation import Generation, Stopwatch, commit, eos_set, truncate_at_eos
from specbench.decoding.verification_rules import RuleTally
from specbench.methods import DRAFT_LENGTH, SPECULATIVE_PASSES, Method, ParamSpec, Request
from specbench.models.base import Drafter, LanguageModel, ModelDrafter
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams


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
    Sampled with the exact rule, the generation also records what the engines' verification rules
    would accept of the same drafts (:mod:`specbench.decoding.verification_rules`).
    """
    if k < 1:
        raise ValueError(f"draft length k must be >= 1, got {k}")
    raw_logits = rule is None and sampling.greedy and lenience == 1.0
    exact_sampled = rule is None and not sampling.greedy and lenience == 1.0
    rule = rule or exact_rule(sampling.greedy, lenience)
    eos = eos_set(eos_token_id)
    target.counter.reset()
    drafter.counter.reset()
    watch = Stopwatch(target.device)
    target.start(prompt_ids)
    drafter.start(prompt_ids)

    out = torch.empty(max_new_tokens + k + 1, dtype=torch.long, device=target.device)
    tally = RuleTally(k, target.device) if exact_sampled else None
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
        logits = target.score(out[: generated + d], d).logits
        p = logits if raw_logits else sampling.probs(logits)
        if tally is not None:
            tally.add(draft_tokens, q, p)
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
    rules = tally.record() if tally is not None else None
    return Generation(tokens, walltime, ttft, steps, forwards, stopped, rule_acceptance=rules)


def _check_lenience(params: dict, spec, generation) -> tuple[str, str, str] | None:
    lenience, convention = params["lenience"], params["lenience_convention"]
    if convention == "cs" and lenience < 1:
        return (
            "lenience",
            f"lenience {lenience} is below 1, which the cs convention does not allow",
            "use lenience >= 1, or lenience_convention: leviathan for lenience in (0, 1]",
        )
    if convention == "leviathan" and lenience > 1:
        return (
            "lenience",
            f"lenience {lenience} is above 1, which the leviathan convention does not allow",
            "use lenience in (0, 1], or lenience_convention: cs for lenience >= 1",
        )
    return None


def _positive(value: float) -> str | None:
    return None if value > 0 else "use a value > 0"


def _run(params: dict, target: LanguageModel, drafter, r: Request) -> Generation:
    if isinstance(drafter, HFModel):
        drafter = ModelDrafter(drafter)
    lenience = lenience_factor(params.get("lenience", 1.0), params.get("lenience_convention", "cs"))
    return generate(target, drafter, r.prompt_ids, k=params["k"], lenience=lenience, **r.decoding())


METHODS = (
    Method(
        "speculative",
        "speculative decoding (Leviathan et al. 2023), greedy or sampled",
        _run,
        {
            "k": DRAFT_LENGTH,
            "lenience": ParamSpec(float, 1.0, "loosens the review; 1 = lossless", validator=_positive),
            "lenience_convention": ParamSpec(
                str, "cs", "cs: lenience >= 1; leviathan: lenience in (0, 1]", choices=("cs", "leviathan")
            ),
        },
        needs_drafter=True,
        check=_check_lenience,
        lossless=lambda params: params.get("lenience", 1.0) == 1.0,
        plan=SPECULATIVE_PASSES,
        theory=theory.of_speculative,
        cell_metrics=verification_rules.cell_metrics,
    ),
)
