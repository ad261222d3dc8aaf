"""Acceptance rules: exact greedy verdicts, and sampling that reproduces the target distribution.

Statistical tests draw from a fixed-seed ``torch.Generator`` and compare the empirical counts with
the EXACT reference distribution (chi-square goodness of fit, or an exact binomial test). Each test
asserts p-value > 1e-3: under a correct implementation the false-alarm rate is 0.1% per test, and
as the seed is fixed the outcome is deterministic in practice (a given seed passes or fails forever).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from conftest import ENGINES, engine_model
from scipy.stats import binomtest, chisquare

from specbench.decoding import speculative
from specbench.decoding.acceptance import exact_rule, greedy_accept, lenience_factor, speculative_accept
from specbench.drafters.maxgram import MaxGramDrafter
from specbench.models.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA = 1e-3
F64 = torch.float64

# Hand-made verifier rows p_1..p_4 and drafter rows q_1..q_3 on a 6-token vocabulary: q puts mass
# where p has none (token 3 in row 0), p puts mass where q has none (token 1 in row 1), and so on.
P = torch.tensor(
    [
        [0.30, 0.05, 0.25, 0.00, 0.25, 0.15],
        [0.10, 0.40, 0.10, 0.20, 0.00, 0.20],
        [0.05, 0.05, 0.50, 0.10, 0.10, 0.20],
        [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
    ],
    dtype=F64,
)
Q = torch.tensor(
    [
        [0.05, 0.40, 0.05, 0.30, 0.10, 0.10],
        [0.30, 0.00, 0.30, 0.10, 0.20, 0.10],
        [0.20, 0.20, 0.10, 0.20, 0.20, 0.10],
    ],
    dtype=F64,
)


def assert_matches(counts, probs, label: str = "") -> None:
    """Chi-square goodness of fit of ``counts`` against ``probs`` (any shape, same shape).

    Cells of probability 0 must be empty; cells expecting fewer than 5 are pooled (and the pool
    joins the smallest other cell if it still expects fewer than 5).
    """
    counts = np.asarray(counts, dtype=float).ravel()
    probs = np.asarray(probs, dtype=float).ravel()
    assert abs(probs.sum() - 1.0) < 1e-9
    assert counts[probs == 0].sum() == 0, f"{label}: impossible outcomes were drawn"
    n = counts.sum()
    expected = n * probs
    small = (expected < 5) & (probs > 0)
    obs = list(counts[~small & (probs > 0)])
    exp = list(expected[~small & (probs > 0)])
    if small.any():
        pool_obs, pool_exp = counts[small].sum(), expected[small].sum()
        if pool_exp < 5:
            i = int(np.argmin(exp))
            obs[i] += pool_obs
            exp[i] += pool_exp
        else:
            obs.append(pool_obs)
            exp.append(pool_exp)
    assert len(obs) >= 2
    exp = np.asarray(exp) * n / np.sum(exp)
    pvalue = chisquare(obs, exp).pvalue
    assert pvalue > ALPHA, f"{label}: chi-square p={pvalue:.2e}, observed {obs}, expected {exp.round(1)}"


def first_token(verdict, drafts) -> int:
    n = int(verdict.n_accepted)
    return int(drafts[0]) if n >= 1 else int(verdict.next_token)


# ---------------------------------------------------------------------------------------------
# speculative_accept at rule level


@pytest.mark.parametrize("k, trials", [(1, 10_000), (3, 20_000)])
def test_first_token_follows_p_when_drafts_are_sampled_from_q(k, trials):
    gen = torch.Generator().manual_seed(1234 + k)
    all_drafts = torch.multinomial(Q[:k], trials, replacement=True, generator=gen).T  # [trials, k]
    counts = np.zeros(6)
    outcomes = Counter()
    for drafts in all_drafts:
        verdict = speculative_accept(drafts, Q[:k], P[: k + 1], gen)
        counts[first_token(verdict, drafts)] += 1
        outcomes[int(verdict.n_accepted)] += 1
    assert_matches(counts, P[0], f"k={k}")
    assert set(outcomes) == set(range(k + 1))  # every accepted length occurs


def test_first_two_tokens_follow_a_context_free_target():
    """A target whose distribution at position t is P[t] whatever came before, and a drafter
    drafting position t from Q[t]: the first two committed tokens must be distributed P[0] x P[1].
    This runs the speculative loop by hand (k=2), so the second token comes either from the same
    step (an accepted draft, or the correction after it) or from the next step."""
    gen = torch.Generator().manual_seed(77)
    k, trials = 2, 6000
    counts = np.zeros((6, 6))
    for _ in range(trials):
        committed: list[int] = []
        while len(committed) < 2:
            pos = len(committed)
            drafts = torch.stack([torch.multinomial(Q[pos + i], 1, generator=gen)[0] for i in range(k)])
            verdict = speculative_accept(drafts, Q[pos : pos + k], P[pos : pos + k + 1], gen)
            n = int(verdict.n_accepted)
            committed += drafts[:n].tolist() + [int(verdict.next_token)]
        counts[committed[0], committed[1]] += 1
    assert_matches(counts, np.outer(P[0], P[1]), "context-free joint")


# [3, ...]: the verifier rules the first draft out (p_1(3) = 0), so it is always corrected
@pytest.mark.parametrize("drafts", [[1, 2, 0], [3, 1, 2], [4]])
def test_first_token_follows_p_with_a_deterministic_drafter(drafts):
    """q = None (one-hot on the drafts, as for prompt lookup): still exactly p."""
    drafts = torch.tensor(drafts)
    k = drafts.shape[0]
    gen = torch.Generator().manual_seed(99)
    trials = 3000
    counts = np.zeros(6)
    for _ in range(trials):
        counts[first_token(speculative_accept(drafts, None, P[: k + 1], gen), drafts)] += 1
    assert_matches(counts, P[0], f"drafts={drafts.tolist()}")


def test_drafter_equal_to_target_accepts_everything_and_bonus_follows_last_row():
    gen = torch.Generator().manual_seed(5)
    k, trials = 3, 4000
    counts = np.zeros(6)
    for _ in range(trials):
        drafts = torch.stack([torch.multinomial(P[i], 1, generator=gen)[0] for i in range(k)])
        verdict = speculative_accept(drafts, P[:k], P, gen)
        assert int(verdict.n_accepted) == k
        counts[int(verdict.next_token)] += 1
    assert_matches(counts, P[k], "bonus token")


def test_no_draft_samples_straight_from_p():
    gen = torch.Generator().manual_seed(6)
    counts = np.zeros(6)
    empty = torch.empty(0, dtype=torch.long)
    for _ in range(3000):
        verdict = speculative_accept(empty, None, P[:1], gen)
        assert int(verdict.n_accepted) == 0
        counts[int(verdict.next_token)] += 1
    assert_matches(counts, P[0], "k=0")


# ---------------------------------------------------------------------------------------------
# speculative.generate end to end: the exact joint law of the generated tokens


def exact_joint(model, prompt: torch.Tensor, length: int, warp) -> np.ndarray:
    """P(x_1..x_length) = prod_t warp(logits after prompt + x_<t)[x_t], enumerated with full
    no-cache forwards of the target (branches of probability 0 are skipped)."""
    vocab = model.config.vocab_size
    joint = np.zeros((vocab,) * length)

    def walk(prefix: tuple, prob: float) -> None:
        ids = torch.cat([prompt, torch.tensor(prefix, dtype=torch.long)])[None]
        row = warp(model(input_ids=ids).logits[0, -1]).numpy()
        for token in np.flatnonzero(row):
            if len(prefix) + 1 == length:
                joint[(*prefix, token)] = prob * row[token]
            else:
                walk((*prefix, int(token)), prob * row[token])

    with torch.no_grad():
        walk((), 1.0)
    return joint


def softmax_at(temperature: float):
    return lambda logits: torch.softmax(logits / temperature, dim=-1)


def top_k_softmax(k: int):
    def warp(logits):
        keep = torch.topk(logits, k).indices
        masked = torch.full_like(logits, float("-inf"))
        masked[keep] = logits[keep]
        return torch.softmax(masked, dim=-1)

    return warp


# a 6-token vocabulary, spread-out next-token distributions, ~1 ms per forward
TINY_OPTIONS = dict(vocab_size=6, init_std=0.3, hidden_size=16, layers=1, heads=2)

CASES = {
    # name: (sampling, k, max_new_tokens, trials, warp). max_new_tokens = 2 leaves a budget of
    # min(k, 2 - 0 - 1) = 1 draft in the first step whatever k is; 3 tokens allow k = 2 drafts.
    "T=1,k=2,3 tokens": (SamplingParams(temperature=1.0), 2, 3, 2000, softmax_at(1.0)),
    "T=0.7,k=3,2 tokens": (SamplingParams(temperature=0.7), 3, 2, 1500, softmax_at(0.7)),
    "T=1,top_k=3,k=2,2 tokens": (SamplingParams(temperature=1.0, top_k=3), 2, 2, 1200, top_k_softmax(3)),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_reproduces_the_target_joint(case, engine, tiny_pair):
    sampling, k, max_new, trials, warp = CASES[case]
    target, drafter = tiny_pair("tiny-llama", 1, 2, engine, (k,), **TINY_OPTIONS)
    prompt = torch.tensor([3, 4, 5, 2])

    reference = exact_joint(target.model, prompt, max_new, warp)
    gen = torch.Generator().manual_seed(2024)
    counts = np.zeros_like(reference)
    steps = Counter()
    for _ in range(trials):
        out = speculative.generate(
            target, drafter, prompt, k=k, max_new_tokens=max_new, sampling=sampling, generator=gen
        )
        assert len(out.tokens) == max_new
        counts[tuple(out.tokens)] += 1
        steps.update(out.steps)
    assert_matches(counts, reference, case)
    # the runs went through acceptances and rejections (both residual and bonus draws)
    first_budget = min(k, max_new - 1)
    assert steps[(first_budget, first_budget)] > 0 and steps[(first_budget, 0)] > 0, steps
    if first_budget > 1:
        assert any(0 < a < d for d, a in steps), steps


@pytest.mark.parametrize("engine", ENGINES)
def test_prompt_lookup_sampling_reproduces_the_target_joint(engine, tiny_model):
    """Deterministic drafts (q = None) through the whole loop: still the target's law. (Two
    tokens leave a budget of one draft; longer one-hot drafts are covered at rule level.)"""
    target_weights = tiny_model("tiny-llama", 1, **TINY_OPTIONS)
    target = engine_model(target_weights, "target", engine, (3,))
    prompt = torch.tensor([2, 4, 2, 4, 2, 4, 5, 2])  # ends in 2: lookup proposes the 4 after it
    reference = exact_joint(target_weights, prompt, 2, softmax_at(1.0))
    gen = torch.Generator().manual_seed(31)
    counts = np.zeros_like(reference)
    steps = Counter()
    for _ in range(1200):
        out = speculative.generate(
            target,
            MaxGramDrafter("drafter"),
            prompt,
            k=3,
            max_new_tokens=2,
            sampling=SamplingParams(temperature=1.0),
            generator=gen,
        )
        counts[tuple(out.tokens)] += 1
        steps.update(out.steps)
    assert_matches(counts, reference, "prompt lookup")
    assert steps[(1, 1)] > 0 and steps[(1, 0)] > 0, steps


# ---------------------------------------------------------------------------------------------
# greedy rule


def test_greedy_accept_all_drafts_then_bonus_is_argmax_of_last_row():
    # argmax rows of P: 0, 1, 2, (0: ties broken toward the first index by argmax)
    logits = torch.log(P.clamp(min=1e-12))
    for p in (P, logits):
        verdict = greedy_accept(torch.tensor([0, 1, 2]), None, p)
        assert int(verdict.n_accepted) == 3 and int(verdict.next_token) == int(P[3].argmax())


@pytest.mark.parametrize(
    "drafts, n, next_token",
    [
        ([4, 1, 2], 0, 0),  # first draft wrong: correction argmax p_1 = 0
        ([0, 3, 2], 1, 1),  # second wrong: argmax p_2 = 1
        ([0, 1, 5], 2, 2),  # third wrong: argmax p_3 = 2
        ([0, 5, 2], 1, 1),  # a later agreeing draft after a rejection does not count
        ([0], 1, 1),  # k = 1, accepted: bonus from p_2
        ([], 0, 0),  # no draft: argmax p_1
    ],
)
def test_greedy_accept_rejects_at_first_disagreement(drafts, n, next_token):
    k = len(drafts)
    verdict = greedy_accept(torch.tensor(drafts, dtype=torch.long), Q[:k] if k else None, P[: k + 1])
    assert int(verdict.n_accepted) == n
    assert int(verdict.next_token) == next_token


# ---------------------------------------------------------------------------------------------
# lenience


def test_lenience_conventions():
    assert lenience_factor(2.0) == 2.0
    assert lenience_factor(2.0, "cs") == 2.0
    assert lenience_factor(0.5, "leviathan") == 2.0
    assert lenience_factor(0.25, "leviathan") == 4.0
    assert lenience_factor(1.0, "cs") == lenience_factor(1.0, "leviathan") == 1.0
    for bad in [(0.5, "cs"), (0.0, "leviathan"), (-0.5, "leviathan"), (1.5, "leviathan"), (2.0, "paper")]:
        with pytest.raises(ValueError):
            lenience_factor(*bad)


def test_lenient_greedy_accepts_when_q_is_at_most_l_times_p():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]], dtype=F64)
    x = torch.tensor([1])  # not the argmax of p_1
    for q_x, lenience, accepted in [(0.5, 2.0, True), (0.6, 2.0, True), (0.7, 2.0, False), (0.5, 1.5, False)]:
        q = torch.tensor([[1 - q_x, q_x, 0.0, 0.0]], dtype=F64)
        verdict = greedy_accept(x, q, p, lenience=lenience)
        assert int(verdict.n_accepted) == int(accepted), (q_x, lenience)
        assert int(verdict.next_token) == (3 if accepted else 0)
    # one-hot q (q(x) = 1): accepted exactly when l p(x) >= 1
    assert int(greedy_accept(x, None, p, lenience=4.0).n_accepted) == 1
    assert int(greedy_accept(x, None, p, lenience=3.0).n_accepted) == 0
    # a token the verifier rules out is never accepted, however lenient
    q = torch.tensor([[0.0, 0.0, 0.0, 1e-9]], dtype=F64)
    assert int(greedy_accept(torch.tensor([3]), q, p, lenience=100.0).n_accepted) == 0
    # leading acceptance only: [lenient accept, reject, argmax]
    p3 = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.3, 0.3, 0.4]], dtype=F64)
    q3 = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.2, 0.7, 0.1]], dtype=F64)
    verdict = greedy_accept(torch.tensor([1, 2, 1]), q3, p3, lenience=2.0)
    assert int(verdict.n_accepted) == 1 and int(verdict.next_token) == 0


@pytest.mark.parametrize(
    "lenience, p_x, q_x",
    [
        (2.0, 0.2, 0.6),
        (1.5, 0.1, 0.5),
        (lenience_factor(0.5, "leviathan"), 0.15, 0.9),
        (1.0, 0.2, 0.5),  # the exact rule: p / q
        (2.0, 0.3, 0.5),  # l p >= q: always accepted
    ],
)
def test_lenient_sampling_accepts_with_probability_min_1_l_p_over_q(lenience, p_x, q_x):
    x = 2
    p = torch.tensor([[0.3, 0.3 - p_x, p_x, 0.4], [0.25, 0.25, 0.25, 0.25]], dtype=F64)
    q = torch.tensor([[0.5 - q_x / 2, 0.5 - q_x / 2, q_x, 0.0]], dtype=F64)
    gen = torch.Generator().manual_seed(4321)
    trials = 2500
    drafts = torch.tensor([x])
    verdicts = [speculative_accept(drafts, q, p, gen, lenience=lenience) for _ in range(trials)]
    accepted = sum(int(v.n_accepted) for v in verdicts)
    expected = min(1.0, lenience * p_x / q_x)
    assert binomtest(accepted, trials, expected).pvalue > ALPHA, (accepted, expected)


def test_lenient_sampling_first_token_law():
    """P(first = y) = q(y) min(1, l p(y)/q(y)) + P(reject) r(y), r = norm(max(0, p - q/l)),
    P(reject) = sum_x max(0, q(x) - l p(x))."""
    lenience = 2.0
    p, q = P[:2], Q[:1]
    accept = torch.where(q[0] > 0, torch.clamp(lenience * p[0] / q[0], max=1.0), torch.zeros(6, dtype=F64))
    residual = torch.clamp(p[0] - q[0] / lenience, min=0.0)
    reject = torch.clamp(q[0] - lenience * p[0], min=0.0).sum()
    law = q[0] * accept + reject * residual / residual.sum()
    gen = torch.Generator().manual_seed(8)
    drafts = torch.multinomial(q[0], 6000, replacement=True, generator=gen)
    counts = np.zeros(6)
    for x in drafts:
        counts[first_token(speculative_accept(x.view(1), q, p, gen, lenience=lenience), x.view(1))] += 1
    assert_matches(counts, law, "lenient first token")
    assert not torch.allclose(law, p[0])  # lenience really is lossy here


def test_lenience_one_is_the_exact_rule_in_both_conventions():
    for convention in ("cs", "leviathan"):
        lenience = lenience_factor(1.0, convention)
        exact, loose = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
        draw = torch.Generator().manual_seed(12)
        rule = exact_rule(False, lenience)
        for _ in range(300):
            drafts = torch.stack([torch.multinomial(Q[i], 1, generator=draw)[0] for i in range(3)])
            a = speculative_accept(drafts, Q, P, exact)
            b = rule(drafts, Q, P, loose)
            assert (int(a.n_accepted), int(a.next_token)) == (int(b.n_accepted), int(b.next_token))
        greedy = exact_rule(True, lenience)
        for drafts in ([0, 1, 2], [0, 3, 2], [1, 1, 1]):
            drafts = torch.tensor(drafts)
            a, b = greedy_accept(drafts, Q, P), greedy(drafts, Q, P, None)
            assert (int(a.n_accepted), int(a.next_token)) == (int(b.n_accepted), int(b.next_token))
