"""How often each engine's rule would accept the same sampled drafts (T > 0), and each rule as a sampler.

Serving engines verify a sampled draft token x at a position where the target's distribution is p and
the drafter's is q by one of three rules:

* ``pq`` — speculative sampling (Leviathan et al., "Fast Inference from Transformers via Speculative
  Decoding", ICML 2023; Chen et al., "Accelerating Large Language Model Decoding with Speculative
  Sampling", 2023): x ~ q is accepted with probability min(1, p(x) / q(x)); a rejection draws from
  norm(max(0, p − q)). specbench's own loops, and vLLM with ``draft_sample_method: probabilistic``.
* ``one_hot`` — the same test with q taken as one-hot at x: accepted with probability p(x); a rejection
  draws from p with x removed, renormalised. vLLM's rejection sampler when no draft probabilities are
  passed (its default ``draft_sample_method: greedy``: the draft is the drafter's argmax, and
  ``draft_probs`` is None), and EAGLE-2's reference code (SafeAILab/EAGLE, ``evaluate_posterior``
  takes qx = 1 and zeroes a rejected token in p; its EAGLE-1 version divided by the draft's q).
* ``sample_match`` — the target samples y ~ p at every drafted position and keeps the draft while
  y = x; the first y ≠ x is the correction. llama.cpp's server (``common_sampler_sample_and_accept_n``),
  whose ``draft-simple`` drafts are the drafter's top token.

Relationships, for one drafted token x (conditional on it):

* ``one_hot`` and ``sample_match`` accept with the same probability p(x), and a rejection gives the
  same law, p conditioned on "not x" (y ~ p given y ≠ x): they are one rule in distribution, differing
  only in how they spend random numbers. Both are lossless for any drafts, even drafts not drawn from
  q (greedy ones): the token a position commits is distributed as p.
* ``pq`` accepts with min(1, p(x) / q(x)) ≥ p(x), since q(x) ≤ 1; equality holds exactly when p(x) = 0,
  p(x) = 1 or q(x) = 1. It is lossless only when x ~ q.
* Averaged over x ~ q: ``pq`` accepts Σ_v min(p(v), q(v)) = 1 − D_TV(p, q), the others Σ_v p(v) q(v),
  which is never larger. With greedy drafts x* = argmax q (what vLLM and llama.cpp draft by default)
  the match rules accept p(x*), which is neither always below nor always above 1 − D_TV(p, q).

Accepted length: a step accepts its first i drafts with probability Π_{j ≤ i} a_j, a_j the acceptance
probability of draft j given the ones before, so the expected number of accepted drafts is
Σ_i Π_{j ≤ i} a_j. :class:`RuleTally` accumulates these on the device from specbench's own sampled
loop, where p and q are known at every drafted position: per position the mean acceptance probability
under each rule and per step the expected accepted length, all from the same drafts, so a report can
set each engine's measured acceptance beside what its rule alone would give. Drafts after the first
depend on the first (its context), so the greedy-draft figure is exact for the first position only
(``first_greedy``: p_1(argmax q_1)).
"""

from __future__ import annotations

import json
import math

import torch

from specbench.decoding.acceptance import Verdict, speculative_accept
from specbench.models.sampling import greedy_token

RULES = ("pq", "one_hot", "sample_match")
RULE_NAMES = {
    "pq": "p/q test (Leviathan et al.; Chen et al.)",
    "one_hot": "one-hot draft distribution (vLLM without draft probabilities; EAGLE-2's code)",
    "sample_match": "strict match of the target's sample (llama.cpp)",
}


def acceptance_probabilities(drafts: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor) -> torch.Tensor:
    """[len(RULES), d] float64: each drafted token's acceptance probability under each rule, given the
    drafts before it; ``q`` None is a drafter without a distribution (one-hot at the draft)."""
    d = drafts.shape[0]
    rows = torch.arange(d, device=p.device)
    px = p[rows, drafts].double()
    qx = torch.ones_like(px) if q is None else q[rows, drafts].double()
    # a token the drafter gave no mass was not drawn from q; the p/q test rejects it (vLLM does too)
    pq = torch.where(qx > 0, (px / qx.clamp(min=torch.finfo(torch.float64).tiny)).clamp(max=1.0), 0.0)
    return torch.stack([pq, px, px])


def expected_accepted(probabilities: torch.Tensor) -> torch.Tensor:
    """[R] expected accepted drafts of one step, Σ_i Π_{j ≤ i} a_j, from [R, d] acceptance probabilities."""
    return probabilities.cumprod(dim=-1).sum(dim=-1)


class RuleTally:
    """The rules' acceptance on one request's steps, kept on the device: ``add`` per step is tensor work
    only (a gather of p(x) and q(x), a cumulative product), ``record`` reads it back once."""

    def __init__(self, k: int, device):
        self.k = k
        self.by_position = torch.zeros(len(RULES), k, dtype=torch.float64, device=device)
        self.expected = torch.zeros(len(RULES), dtype=torch.float64, device=device)
        self.first_greedy = torch.zeros((), dtype=torch.float64, device=device)
        self.drafted = [0] * k  # host counts: draft lengths are known without a sync
        self.steps = 0

    def add(self, drafts: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor) -> None:
        """One step: ``drafts`` [d], ``q`` [d, V] or None, ``p`` [≥ d, V] the target's distributions."""
        self.steps += 1
        d = drafts.shape[0]
        if d == 0:
            return
        probabilities = acceptance_probabilities(drafts, q, p)
        self.by_position[:, :d] += probabilities
        self.expected += expected_accepted(probabilities)
        greedy = drafts[:1] if q is None else greedy_token(q[:1])
        self.first_greedy += p[0].gather(0, greedy).double().squeeze(0)
        for i in range(d):
            self.drafted[i] += 1

    def record(self) -> dict:
        """The tally as a row's ``rule_acceptance`` (sums, so turns and rows add up): one host sync."""
        values = torch.cat([self.by_position.flatten(), self.expected, self.first_greedy.view(1)]).tolist()
        width = self.k * len(RULES)
        return {
            "steps": self.steps,
            "drafted": list(self.drafted),
            "accepted": {rule: values[i * self.k : (i + 1) * self.k] for i, rule in enumerate(RULES)},
            "expected_accepted": dict(zip(RULES, values[width : width + len(RULES)], strict=True)),
            "first_greedy": values[-1],
        }


def merged(records: list[dict]) -> dict | None:
    """Several tallies (a conversation's turns, a cell's rows) as one; None for none."""
    if not records:
        return None
    width = max(len(r["drafted"]) for r in records)

    def padded(values: list) -> list:
        return list(values) + [0] * (width - len(values))

    return {
        "steps": sum(r["steps"] for r in records),
        "drafted": [sum(x) for x in zip(*(padded(r["drafted"]) for r in records), strict=True)],
        "accepted": {
            rule: [sum(x) for x in zip(*(padded(r["accepted"][rule]) for r in records), strict=True)]
            for rule in RULES
        },
        "expected_accepted": {rule: sum(r["expected_accepted"][rule] for r in records) for rule in RULES},
        "first_greedy": sum(r["first_greedy"] for r in records),
    }


def cell_metrics(rows: list[dict], steps: list) -> dict:
    """A sampled speculative cell's columns: per rule the tokens per target pass its rule would give on
    the cell's drafts (``rule_<rule>_tokens_per_step``: 1 + expected accepted drafts per step) and the
    acceptance probability by draft position (JSON), and ``rule_first_greedy``: the first position's
    acceptance by the match rules had the drafts been the drafter's argmax."""
    total = merged([r["rule_acceptance"] for r in rows if r.get("rule_acceptance")])
    if total is None or not total["steps"]:
        return {}
    out = {}
    for rule in RULES:
        out[f"rule_{rule}_tokens_per_step"] = 1 + total["expected_accepted"][rule] / total["steps"]
        rates = [a / n if n else None for a, n in zip(total["accepted"][rule], total["drafted"], strict=True)]
        out[f"rule_{rule}_by_position"] = json.dumps([None if r is None else round(r, 6) for r in rates])
    first = total["drafted"][0] if total["drafted"] else 0
    out["rule_first_greedy"] = total["first_greedy"] / first if first else math.nan
    return out


def engine_rule(record: dict) -> str | None:
    """The rule an engine's record says it verified sampled drafts by (None: not known)."""
    method = record.get("rejection_sample_method")
    if method == "sample-match":
        return "sample_match"
    if record.get("engine") == "vllm" and method in (None, "standard"):
        drafting = (record.get("settings") or {}).get("speculative.draft_sample_method") or "greedy"
        return "pq" if drafting == "probabilistic" else "one_hot"
    return None


def sample_match_accept(
    drafts: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, generator: torch.Generator | None
) -> Verdict:
    """llama.cpp's verification: y_i ~ p_i at each of the k + 1 positions; the drafts are kept while
    y_i = x_i and the first y_i that differs (or y_{k+1}) is the next token. ``q`` is not read."""
    k = drafts.shape[0]
    samples = torch.multinomial(p[: k + 1], 1, generator=generator).squeeze(-1)
    n = torch.cumprod((samples[:k] == drafts).long(), dim=0).sum()
    return Verdict(n, samples[n])


def one_hot_accept(
    drafts: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, generator: torch.Generator | None
) -> Verdict:
    """vLLM's rejection sampler without draft probabilities: speculative sampling with q one-hot at
    each draft (accept with probability p(x); a rejection draws from p without x)."""
    return speculative_accept(drafts, None, p, generator)


SAMPLERS = {"pq": speculative_accept, "one_hot": one_hot_accept, "sample_match": sample_match_accept}
