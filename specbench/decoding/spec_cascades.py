"""Speculative cascades (Narasimhan et al. 2025, Algorithms 4-6): speculative decoding against π = T(q, p).

GenSpecSample (Algorithm 4), one step: the drafter samples γ tokens x_t..x_{t+γ-1} from q; the
target scores them in ONE forward pass, giving p_t..p_{t+γ}; π_{t+j} = T(q_{t+j}, p_{t+j}) for the
chosen rule (specbench.decoding.deferral); x_{t+j} is accepted with probability min(1, π/q), the
first rejected one is replaced by a draw from norm(max(0, π − q)), and after γ acceptances the bonus
token is drawn from π_{t+γ} as Algorithm 4 writes it (for lossy SD, whose π does not sum to 1,
from the law a drafted token follows there: deferral.output_law). π_{t+γ} needs q_{t+γ}: one more
drafter pass over the last draft (its KV entry is kept when the block is accepted). Rule ``sd``
(π = p) needs no q there and skips that pass, so it is exactly speculative.generate: same tokens,
same random draws, same forward counts.

Temperature 0, the paper's convention (Lemma 9, App. E.2): both models decode greedily, so the rows
drafted from and checked against are q̃, p̃, one-hot on argmax q and argmax p (OPT's rejection cost
becomes D_TV(p̃, q̃) = 1(argmax q ≠ argmax p)); the deferral decision reads the models' softmax q, p
at T = 1, as one-hot rows would make every confidence 1. Every step is then deterministic. At T > 0,
q and p are the tempered (top-k / top-p) distributions and the decision reads those same rows.

``Generation.deferrals`` counts rejections: each takes a token from π's residual (the large model)
instead of the small model's draft. One host sync per step (``commit``).
"""

from __future__ import annotations

import torch

from specbench.decoding.acceptance import cascade_accept
from specbench.decoding.deferral import RULES, output_law, resolve_discrepancy, target
from specbench.decoding.generation import Generation, Stopwatch, commit, eos_set, truncate_at_eos
from specbench.decoding.sampling import SamplingParams
from specbench.models.base import LanguageModel, ModelDrafter


def one_hot(tokens: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(tokens, like.shape[-1]).to(like.dtype)


def step_target(
    rule: str, params: dict, q_conf, q_chosen, p_logits, sampling: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q rows the drafts came from, π rows) of one step of Algorithm 4.

    ``q_conf``: the drafter's rows as ``sampling.probs`` gives them (softmax at T = 1 when greedy),
    at the d drafts and, except for rule ``sd``, at the bonus position; ``q_chosen``: the greedy
    drafter's tokens at those rows; ``p_logits``: the target's d + 1 rows.
    """
    p_conf = sampling.probs(p_logits)
    q_conf = q_conf.to(p_conf.dtype)
    q, p = q_conf, p_conf
    if sampling.greedy:
        q, p = one_hot(q_chosen, q_conf), one_hot(p_logits.argmax(-1), p_conf)
    d = p_logits.shape[0] - 1
    if rule == "sd":
        return q[:d], p
    pi = target(rule, q, p, params, q_conf=q_conf, p_conf=p_conf)
    if rule == "lossy":  # π is no distribution: the bonus follows the law a drafted token would have
        pi = torch.cat([pi[:d], output_law(q[d:], pi[d:])])
    return q[:d], pi


def generate(
    target_model: LanguageModel,
    drafter: ModelDrafter,
    prompt_ids: torch.Tensor,
    *,
    rule: str,
    params: dict,
    k: int,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_id=None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Generate with block size γ = ``k`` and the deferral ``rule`` (a key of deferral.RULES);
    ``params`` holds the rule's parameters (alpha, beta, tune_beta, discrepancy)."""
    if k < 1:
        raise ValueError(f"block size k must be >= 1, got {k}")
    if rule not in RULES:
        raise ValueError(f"unknown deferral rule {rule!r} (use one of {', '.join(RULES)})")
    params = dict(params)
    if rule == "bild":
        params["discrepancy"] = resolve_discrepancy(params.get("discrepancy", "auto"), sampling.greedy)
    small = drafter.model
    eos = eos_set(eos_token_id)
    target_model.counter.reset()
    drafter.counter.reset()
    watch = Stopwatch(target_model.device)
    target_model.start(prompt_ids)
    drafter.start(prompt_ids)

    out = torch.empty(max_new_tokens + k + 1, dtype=torch.long, device=target_model.device)
    tokens: list[int] = []
    steps: list[tuple[int, int]] = []
    generated = 0
    stopped = False
    while generated < max_new_tokens and not stopped:
        budget = min(k, max_new_tokens - generated - 1)  # the step's +1 token must fit too
        drafts, q_conf = out[:0], torch.empty(0, small.vocab_size, device=out.device)
        if budget > 0:
            draft = drafter.propose(out[:generated], budget, sampling, generator)
            drafts, q_conf = draft.tokens, draft.q
        d = drafts.shape[0]
        out[generated : generated + d] = drafts
        p_logits = target_model.score(out[: generated + d], d)
        q_chosen = drafts
        if rule != "sd":  # q_{t+γ}, for the bonus row π_{t+γ}
            last = small.score(out[: generated + d], 0)[-1]
            q_conf = torch.cat([q_conf.to(last.dtype), sampling.probs(last)[None]])
            q_chosen = torch.cat([drafts, last.argmax().view(1)])
        q, pi = step_target(rule, params, q_conf, q_chosen, p_logits, sampling)
        verdict = cascade_accept(drafts, q, pi, generator)

        n, new = commit(verdict, drafts, out, generated)
        target_model.rollback(generated + n)
        drafter.rollback(generated + n)
        new, stopped = truncate_at_eos(new, eos)
        steps.append((d, n))
        tokens.extend(new)
        generated += n + 1
        watch.mark_first_token()
    walltime, ttft = watch.stop()
    forwards = {target_model.name: target_model.counter.snapshot(), drafter.name: drafter.counter.snapshot()}
    deferrals = sum(n < d for d, n in steps)
    return Generation(tokens, walltime, ttft, steps, forwards, stopped, deferrals=deferrals)
