"""The engines' verification rules on the same sampled drafts: the expected acceptance each rule gives
(decoding.verification_rules) against closed forms and full enumeration on a small vocabulary, each
rule's own accept/reject sampler against that expectation (Monte Carlo), and the tally specbench's
sampled loop records, through to the report's line beside an engine cell."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import chisquare

from specbench.decoding import speculative
from specbench.decoding.generation import Generation
from specbench.decoding.verification_rules import (
    RULES,
    SAMPLERS,
    RuleTally,
    acceptance_probabilities,
    cell_metrics,
    engine_rule,
    expected_accepted,
    merged,
)
from specbench.models.sampling import SamplingParams
from specbench.pipeline.views.notes import engines_note

# three drafted positions over a 4-token vocabulary, and the target's rows (one more: the bonus)
Q = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]], dtype=torch.float64)
P = torch.tensor(
    [[0.5, 0.3, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1], [0.2, 0.2, 0.5, 0.1], [0.4, 0.3, 0.2, 0.1]],
    dtype=torch.float64,
)
DRAFTS = torch.tensor([1, 1, 0])


def test_acceptance_probabilities_are_the_rules_closed_forms():
    got = acceptance_probabilities(DRAFTS, Q, P)
    # p/q: min(1, p(x)/q(x)) = min(1, .3/.6), min(1, .6/.25), min(1, .2/.7); the match rules: p(x)
    pq = [0.5, 1.0, 0.2 / 0.7]
    match = [0.3, 0.6, 0.2]
    assert torch.allclose(got, torch.tensor([pq, match, match], dtype=torch.float64))
    assert torch.all(got[0] >= got[1])  # min(1, p/q) >= p since q <= 1
    # a drafter without a distribution (prompt lookup) is one-hot at its draft: every rule gives p(x)
    assert torch.allclose(acceptance_probabilities(DRAFTS, None, P), torch.tensor([match] * 3).double())


def enumerated_expected_accepted(probabilities: list[float]) -> float:
    """E[accepted drafts] by enumerating every accept/reject outcome of the positions in order."""
    total = 0.0
    for outcome in itertools.product((True, False), repeat=len(probabilities)):
        chance = math.prod(a if kept else 1 - a for a, kept in zip(probabilities, outcome, strict=True))
        accepted = next((i for i, kept in enumerate(outcome) if not kept), len(outcome))
        total += chance * accepted
    return total


def test_expected_accepted_length_equals_enumeration():
    probabilities = acceptance_probabilities(DRAFTS, Q, P)
    got = expected_accepted(probabilities)
    for r in range(len(RULES)):
        assert got[r].item() == pytest.approx(
            enumerated_expected_accepted(probabilities[r].tolist()), abs=1e-12
        )
    assert got[0].item() == pytest.approx(0.5 + 0.5 * 1.0 + 0.5 * 1.0 * 0.2 / 0.7)


def test_tally_averaged_over_drafts_from_q_gives_one_minus_tv_and_sum_pq():
    """Context-free rows: over every draft x ~ q (weighted by its chance) the tally's expectation is
    Σ_i Π_{j≤i} (1 − D_TV(p_j, q_j)) for p/q and Σ_i Π_{j≤i} Σ_v p_j(v) q_j(v) for the match rules."""
    tally = RuleTally(3, "cpu")
    weights = []
    for drafts in itertools.product(range(4), repeat=3):
        drafts = torch.tensor(drafts)
        tally.add(drafts, Q, P)
        weights.append(math.prod(Q[i, x].item() for i, x in enumerate(drafts.tolist())))
    # the tally sums; weight the per-draft expectations by re-running each with its weight
    weighted = torch.zeros(len(RULES), dtype=torch.float64)
    for drafts, weight in zip(itertools.product(range(4), repeat=3), weights, strict=True):
        weighted += weight * expected_accepted(acceptance_probabilities(torch.tensor(drafts), Q, P))
    overlap = torch.minimum(P[:3], Q).sum(-1)  # 1 − D_TV per position
    inner = (P[:3] * Q).sum(-1)
    closed = [overlap.cumprod(0).sum().item(), inner.cumprod(0).sum().item()]
    assert weighted[0].item() == pytest.approx(closed[0], abs=1e-12)
    assert weighted[1].item() == pytest.approx(closed[1], abs=1e-12)
    assert weighted[2].item() == pytest.approx(closed[1], abs=1e-12)
    record = tally.record()
    assert record["steps"] == 64 and record["drafted"] == [64, 64, 64]
    # the tally's unweighted sums are those of the enumeration's terms
    assert record["expected_accepted"]["pq"] == pytest.approx(
        sum(expected_accepted(acceptance_probabilities(torch.tensor(d), Q, P))[0].item()
            for d in itertools.product(range(4), repeat=3))
    )  # fmt: skip
    # first position with greedy drafts: p_1(argmax q_1) = p_1(1) on every step
    assert record["first_greedy"] == pytest.approx(64 * 0.3)


@pytest.mark.parametrize("rule", RULES)
def test_each_rules_sampler_accepts_as_often_as_its_expectation(rule):
    """Monte Carlo of the rule's own accept/reject: its mean accepted count and its acceptance at each
    position match the expectation computed from p(x) and q(x) (4 standard errors)."""
    trials = 6000
    generator = torch.Generator().manual_seed(59)
    accepted = np.array(
        [int(SAMPLERS[rule](DRAFTS, Q, P, generator).n_accepted) for _ in range(trials)], dtype=float
    )
    probabilities = acceptance_probabilities(DRAFTS, Q, P)[RULES.index(rule)].tolist()
    expected = expected_accepted(torch.tensor([probabilities]))[0].item()
    assert abs(accepted.mean() - expected) < 4 * accepted.std() / math.sqrt(trials), (rule, accepted.mean())
    # P(accepted >= i) = Π_{j≤i} a_j for each position
    for i in range(1, 4):
        chance = math.prod(probabilities[:i])
        share = (accepted >= i).mean()
        assert abs(share - chance) < 4 * math.sqrt(chance * (1 - chance) / trials) + 1e-9, (rule, i, share)


@pytest.mark.parametrize("rule", ["one_hot", "sample_match"])
def test_match_rules_are_lossless_for_greedy_drafts(rule):
    """With the drafter's argmax as the draft (what vLLM and llama.cpp draft), the one-hot and the
    strict-match rules still commit a first token distributed as p_1."""
    greedy = Q.argmax(-1)[:1]
    generator = torch.Generator().manual_seed(7)
    counts = np.zeros(4)
    for _ in range(4000):
        verdict = SAMPLERS[rule](greedy, Q[:1], P[:2], generator)
        first = greedy[0] if int(verdict.n_accepted) == 1 else verdict.next_token
        counts[int(first)] += 1
    assert chisquare(counts, 4000 * P[0].numpy()).pvalue > 1e-3


def test_engine_records_name_their_rule():
    assert engine_rule({"engine": "llama.cpp", "rejection_sample_method": "sample-match"}) == "sample_match"
    assert engine_rule({"engine": "vllm", "rejection_sample_method": "standard", "settings": {}}) == "one_hot"
    probabilistic = {"speculative.draft_sample_method": "probabilistic"}
    assert (
        engine_rule({"engine": "vllm", "rejection_sample_method": "standard", "settings": probabilistic})
        == "pq"
    )
    assert engine_rule({"engine": "vllm", "rejection_sample_method": "synthetic", "settings": {}}) is None


# a 6-token vocabulary with spread-out distributions (as tests/test_acceptance.py)
TINY_OPTIONS = dict(vocab_size=6, init_std=0.3, hidden_size=16, layers=1, heads=2)


def test_sampled_loop_records_the_rules_and_its_own_rule_matches_what_it_accepted(tiny_pair):
    """specbench's sampled loop tallies every rule on its drafts; the p/q rule's expectation is what
    the loop (which verifies by p/q) accepted, up to sampling noise; greedy decoding records none."""
    target, drafter = tiny_pair("tiny-llama", 1, 2, "eager", (3,), **TINY_OPTIONS)
    prompt = torch.tensor([3, 4, 5, 2])
    generator = torch.Generator().manual_seed(11)
    sampling = SamplingParams(temperature=0.8)
    options = dict(k=3, max_new_tokens=24, sampling=sampling, generator=generator)
    outs = [speculative.generate(target, drafter, prompt, **options) for _ in range(60)]
    total = merged([out.rule_acceptance for out in outs])
    steps = [s for out in outs for s in out.steps]
    assert total["steps"] == len(steps)
    assert total["drafted"][0] == sum(1 for d, _ in steps if d >= 1)
    expected = total["expected_accepted"]
    # per request, accepted drafts minus the p/q expectation given its drafts: mean 0 (4 standard errors)
    gaps = np.array(
        [sum(a for _, a in out.steps) - out.rule_acceptance["expected_accepted"]["pq"] for out in outs]
    )
    assert abs(gaps.mean()) < 4 * gaps.std(ddof=1) / math.sqrt(len(gaps)), gaps
    assert expected["one_hot"] == pytest.approx(expected["sample_match"])
    assert expected["pq"] >= expected["one_hot"]
    for position in range(3):
        assert total["accepted"]["pq"][position] >= total["accepted"]["one_hot"][position] - 1e-9
    joined = Generation.joined(outs[:2])
    assert joined.rule_acceptance == merged([outs[0].rule_acceptance, outs[1].rule_acceptance])
    greedy = speculative.generate(target, drafter, prompt, k=3, max_new_tokens=8)
    assert greedy.rule_acceptance is None

    rows = [{"rule_acceptance": out.rule_acceptance} for out in outs]
    columns = cell_metrics(rows, steps)
    assert columns["rule_pq_tokens_per_step"] == pytest.approx(1 + expected["pq"] / len(steps))
    by_position = json.loads(columns["rule_one_hot_by_position"])
    assert len(by_position) == 3 and 0 < by_position[0] < 1
    assert 0 < columns["rule_first_greedy"] < 1
    assert cell_metrics([{"steps": [[1, 1]]}], [(1, 1)]) == {}


def test_report_sets_the_rules_beside_an_engine_cell():
    common = dict(dataset="gsm8k", method="speculative", params="{'k': 4}", drafter="small")
    ours = dict(
        common,
        cell="sd",
        engine_name=None,
        acceptance_length=3.0,
        rule_pq_tokens_per_step=3.0,
        rule_one_hot_tokens_per_step=2.4,
        rule_sample_match_tokens_per_step=2.4,
        rule_sample_match_by_position=json.dumps([0.55, 0.5, 0.45, 0.4]),
        rule_first_greedy=0.7,
    )
    engine = dict(
        common,
        cell="sd_llamacpp",
        engine_name="llama.cpp b1",
        engine_acceptance_length=2.9,
        engine_drafting_share=0.95,
        engine_rejection="sample-match",
        engine_rule="sample_match",
        acceptance_length=2.7,
        lossless_checked=0,
        lossless_identical=0,
    )
    note = engines_note(pd.DataFrame([ours, engine]))
    assert "rules alone give p/q 3.00, one-hot 2.40, sample-match 2.40" in note
    assert "the engine's rule (sample_match) alone predicts -20.0% of the measured -10.0%" in note
    assert "first position 0.70 of the time against 0.55" in note
