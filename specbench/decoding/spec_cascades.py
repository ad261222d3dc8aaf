"""Speculative cascades (Narasimhan et al. 2025, Algorithms 4-6): speculative decoding against π = T(q, p).

GenSpecSample (Algorithm 4) is the speculative-decoding loop (:mod:`specbench.decoding.speculative`)
with a different acceptance rule: the drafter samples γ tokens x_t..x_{t+γ-1} from q; the target
scores them in ONE forward pass, giving p_t..p_{t+γ}; π_{t+j} = T(q_{t+j}, p_{t+j}) for the chosen
rule (specbench.decoding.deferral); x_{t+j} is accepted with probability min(1, π/q), the first
rejected one is replaced by a draw from norm(max(0, π − q)), and after γ acceptances the bonus token
is drawn from π_{t+γ} as Algorithm 4 writes it (for lossy SD, whose π does not sum to 1, from the law
a drafted token follows there: deferral.output_law). π_{t+γ} needs q_{t+γ}: :class:`BonusRowDrafter`
makes one more drafter pass over the last draft (its KV entry is kept when the block is accepted).
Rule ``sd`` (π = p) needs no q there: it *is* speculative.generate, same tokens, draws and counts.

Temperature 0, the paper's convention (Lemma 9, App. E.2): both models decode greedily, so the rows
drafted from and checked against are q̃, p̃, one-hot on argmax q and argmax p (OPT's rejection cost
becomes D_TV(p̃, q̃) = 1(argmax q ≠ argmax p)); the deferral decision reads the models' softmax q, p
at T = 1, as one-hot rows would make every confidence 1. Every step is then deterministic. At T > 0,
q and p are the tempered (top-k / top-p) distributions and the decision reads those same rows.

``Generation.deferrals`` counts rejections: each takes a token from π's residual (the large model)
instead of the small model's draft. One host sync per step (the loop's ``commit``).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from specbench.decoding import speculative, theory
from specbench.decoding.acceptance import AcceptanceRule, Verdict, cascade_accept
from specbench.decoding.deferral import (
    CASCADE_ALPHA,
    DISCREPANCY,
    RULES,
    check_rule_params,
    output_law,
    resolve_discrepancy,
    target,
)
from specbench.decoding.generation import Generation
from specbench.decoding.steps import reviewed_and_rejected
from specbench.methods import SPECULATIVE_PASSES, Method, ParamSpec, Request, given_params
from specbench.models.base import Draft, LanguageModel, ModelDrafter
from specbench.models.sampling import SamplingParams


def one_hot(tokens: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(tokens, like.shape[-1]).to(like.dtype)


def step_target(
    rule: str, params: dict, q_conf, q_chosen, p_conf, sampling: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q rows the drafts came from, π rows) of one step of Algorithm 4.

    ``q_conf``, ``p_conf``: the drafter's and the target's d + 1 rows as ``sampling.probs`` gives
    them (softmax at T = 1 when greedy); ``q_chosen``: the greedy drafter's tokens at those rows.
    """
    q_conf = q_conf.to(p_conf.dtype)
    q, p = q_conf, p_conf
    if sampling.greedy:
        q, p = one_hot(q_chosen, q_conf), one_hot(p_conf.argmax(-1), p_conf)
    d = p_conf.shape[0] - 1
    pi = target(rule, q, p, params, q_conf=q_conf, p_conf=p_conf)
    if rule == "lossy":  # π is no distribution: the bonus follows the law a drafted token would have
        pi = torch.cat([pi[:d], output_law(q[d:], pi[d:])])
    return q[:d], pi


class BonusRowDrafter(ModelDrafter):
    """A model drafter whose draft carries one row more than it has tokens: q_{t+γ}, the drafter's
    distribution after its last draft token (``sampling.probs`` of one more pass), which π_{t+γ} reads."""

    def propose(
        self, tokens: torch.Tensor, k: int, sampling: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        draft = super().propose(tokens, k, sampling, generator)
        last = sampling.probs(self.model.score(torch.cat([tokens, draft.tokens]), 0).logits[-1])
        rows = last[None] if draft.q is None else torch.cat([draft.q, last[None]])
        return Draft(draft.tokens, rows)


def cascade_rule(
    rule: str, params: dict, sampling: SamplingParams, chances: list | None = None
) -> AcceptanceRule:
    """Algorithm 4's verification for deferral ``rule``: drafts, the drafter's d + 1 rows (from
    :class:`BonusRowDrafter`) and the target's d + 1 rows ``sampling.probs(logits)`` -> Verdict.

    With ``chances`` (a list) it appends, for each step, the drafts the target reviewed (those up to
    the first rejection) summed as [c, c (1 - c)] with c their chance of rejection, a tensor left on
    the device: a draft x ~ q is rejected with probability sum_v max(0, q(v) - π(v)) = D_TV(π, q),
    which for π = (1 - r) q + r p is r D_TV(p, q) (Lemma 5); c (1 - c) is that Bernoulli's variance."""

    def verify(drafts, q_conf, p_conf, generator) -> Verdict:
        q_chosen = torch.cat([drafts, q_conf[-1].argmax().view(1)])
        q, pi = step_target(rule, params, q_conf, q_chosen, p_conf, sampling)
        verdict = cascade_accept(drafts, q, pi, generator)
        if chances is not None:
            d = drafts.shape[0]
            chance = (q - pi[:d]).clamp(min=0).sum(-1)
            reviewed = torch.arange(d, device=chance.device) <= verdict.n_accepted
            chance = chance * reviewed
            chances.append(torch.stack([chance.sum(), (chance * (1 - chance)).sum()]))
        return verdict

    return verify


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
    if rule not in RULES:
        raise ValueError(f"unknown deferral rule {rule!r} (use one of {', '.join(RULES)})")
    params = dict(params)
    if rule == "bild":
        params["discrepancy"] = resolve_discrepancy(params.get("discrepancy", "auto"), sampling.greedy)
    verify, chances = None, []
    if rule != "sd":
        drafter, verify = BonusRowDrafter(drafter.model), cascade_rule(rule, params, sampling, chances)
    out = speculative.generate(
        target_model,
        drafter,
        prompt_ids,
        k=k,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        eos_token_id=eos_token_id,
        generator=generator,
        rule=verify,
    )
    expected = variance = 0.0 if verify else None
    if chances:
        expected, variance = torch.stack(chances).sum(0).tolist()  # one sync
    return dataclasses.replace(
        out,
        deferrals=sum(n < d for d, n in out.steps),
        expected_rejections=expected,
        rejection_variance=variance,
    )


def _check(params: dict, spec, generation) -> tuple[str, str, str] | None:
    problem = check_rule_params(params, spec, ("alpha", "beta", "tune_beta", "discrepancy"), tuple(RULES))
    if problem or params["rule"] != "lossy":
        return problem
    if params["tune_beta"] and "beta" in given_params(spec):
        return (
            "beta",
            "beta is given, but tune_beta: true chooses β itself",
            "remove beta, or set tune_beta: false",
        )
    if not params["tune_beta"] and params["beta"] < 1 - params["alpha"]:
        return (
            "beta",
            f"lossy SD needs β >= 1 - α (Sec. 2), got β = {params['beta']} with α = {params['alpha']}",
            f"use beta >= {1 - params['alpha']:g}, or tune_beta: true",
        )
    return None


def _lossless(params: dict) -> bool:
    """π = p exactly: the sd rule, or lossy SD with α = 0 and β = 1."""
    lossy_as_sd = params.get("alpha") == 0 and params.get("beta") == 1 and not params.get("tune_beta")
    return params.get("rule") == "sd" or (params.get("rule") == "lossy" and lossy_as_sd)


def _run(params: dict, target: LanguageModel, drafter, r: Request) -> Generation:
    return generate(
        target,
        ModelDrafter(drafter),
        r.prompt_ids,
        rule=params["rule"],
        params=params,
        k=params["k"],
        **r.decoding(),
    )


def _theory(rows: list[dict], iid: bool) -> theory.Expectation | None:
    """Speculative decoding against π instead of p: its expectation from the cell's own acceptance,
    with one more drafter pass a step for q at the bonus position where π needs it (every rule but sd)."""
    return theory.of_speculative(rows, iid, bonus_pass=rows[0]["params"].get("rule") != "sd")


def _cell_metrics(rows: list[dict], steps: list) -> dict:
    """Per draft the target reviewed (up to a step's first rejection): the rejections that happened,
    and Lemma 5's D_TV(π, q) summed over the same drafts."""
    reviewed, rejected = reviewed_and_rejected(steps)
    out = {"reviewed_drafts": reviewed, "rejection_rate": rejected / reviewed if reviewed else math.nan}
    if all("expected_rejections" in r for r in rows):  # every rule but sd, since Lemma 5 was
        expected = sum(r["expected_rejections"] for r in rows)
        out["rejection_rate_lemma5"] = expected / reviewed if reviewed else math.nan
    return out


METHODS = (
    Method(
        "spec_cascade",
        "speculative cascade (Narasimhan et al. 2025, Algorithm 4): "
        "SD against π = T(q, p) of a deferral rule",
        _run,
        {
            "rule": ParamSpec(
                str,
                None,
                "deferral rule: sd, lossy, bild (BiLD*), chow, diff, opt, chow_log, diff_log, opt_log, "
                "token_v1, token_v2, token (the paper's Token, Eq. 15)",
                choices=tuple(RULES),
            ),
            "alpha": CASCADE_ALPHA,
            "beta": ParamSpec(float, 1.0, "lossy only: β >= 1 - α of the residual norm(max{0, p/β - q})", 0),
            "tune_beta": ParamSpec(
                bool, False, "lossy only: β per prefix from Tran-Thien's condition (App. E.6)"
            ),
            "discrepancy": DISCREPANCY,
            "k": ParamSpec(
                int, 5, "block size γ, draft tokens per verification (paper: 5 for T5, 1 for Gemma)", 1, 64
            ),
        },
        needs_drafter=True,
        neural_drafter_only=True,
        check=_check,
        lossless=_lossless,
        plan=SPECULATIVE_PASSES,
        theory=_theory,
        cell_metrics=_cell_metrics,
    ),
)
