"""Speculative cascades end to end on tiny float64 models: π = p is speculative decoding token for
token, sampled outputs follow the cascade's exact law, greedy speculative execution equals the
oracle cascade it implements, the sequential cascades' tokens (against plain step-by-step readings
of the paper) and forward counts, recipes and their errors.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ENGINES, engine_model, model_roles
from test_acceptance import TINY_OPTIONS, assert_matches
from test_deferral import expected_position
from typer.testing import CliRunner

from specbench.cli import app
from specbench.decoding import autoregressive, spec_cascades, speculative
from specbench.decoding import sequential_cascades as seq
from specbench.decoding.deferral import RULES
from specbench.errors import SpecbenchError
from specbench.methods import METHODS
from specbench.models.base import ModelDrafter
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams
from specbench.recipe import load_recipe, parse_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 16
F64 = torch.float64
TEMPERATURES = (0.0, 0.1, 0.5, 1.0)
MIXTURE_RULES = [name for name, rule in RULES.items() if rule.kind == "mixture"]
ALPHAS = {"bild": 1.0, "chow_log": 1.0, "diff_log": 0.2, "opt_log": 0.2}  # others: 0.2
MAX_NEW = 12


@pytest.fixture(scope="module")
def weights(tiny_model):
    """``weights(kind, seed, role)``: the target's weights, a noisy copy (partial agreement), or an
    unrelated model."""
    return model_roles(tiny_model, VOCAB, 0.15)


def prompt_for(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (2 + seed % 5,), generator=gen)


def pair(
    weights, kind: str, seed: int, role: str = "noisy", engine: str = "eager"
) -> tuple[HFModel, HFModel]:
    return (
        engine_model(weights(kind, seed), "large", engine),
        engine_model(weights(kind, seed, role), "small", engine),
    )


def params_for(rule: str) -> dict:
    return {"alpha": ALPHAS.get(rule, 0.2), "beta": 1.0, "tune_beta": False, "discrepancy": "auto"}


def cascade(large, small, prompt, rule, temperature, seed=0, k=3, max_new=MAX_NEW, params=None):
    return spec_cascades.generate(
        large,
        ModelDrafter(small),
        prompt,
        rule=rule,
        params=params or params_for(rule),
        k=k,
        max_new_tokens=max_new,
        sampling=SamplingParams(temperature=temperature),
        generator=torch.Generator().manual_seed(seed),
    )


# -- π = p is speculative decoding ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tiny-llama", "tiny-t5", "tiny-llama/compiled"])
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sd_rule_is_speculative_decoding_token_for_token(weights, kind, temperature):
    """Same seed: same tokens, steps and forward counts as specbench.decoding.speculative."""
    kind, _, engine = kind.partition("/")
    for seed in range(3):
        large, small = pair(weights, kind, seed, engine=engine or "eager")
        prompt, sampling = prompt_for(seed), SamplingParams(temperature=temperature)
        for k in (1, 3, 5):
            ours = cascade(large, small, prompt, "sd", temperature, seed=seed, k=k)
            theirs = speculative.generate(
                large,
                ModelDrafter(small),
                prompt,
                k=k,
                max_new_tokens=MAX_NEW,
                sampling=sampling,
                generator=torch.Generator().manual_seed(seed),
            )
            assert ours.tokens == theirs.tokens and ours.steps == theirs.steps
            for model in ("large", "small"):
                for key in ("forward_passes", "tokens_scored", "encoder_passes"):
                    assert ours.forwards[model][key] == theirs.forwards[model][key]
            assert ours.deferrals == sum(n < d for d, n in ours.steps)
            if temperature == 0:
                expected = autoregressive.generate(large, prompt, max_new_tokens=MAX_NEW).tokens
                assert ours.tokens == expected


@pytest.mark.parametrize("temperature", (0.5, 1.0))
def test_lossy_with_alpha_0_and_beta_1_samples_what_sd_samples(weights, temperature):
    """π = max{min{q, p}, p} = p: the same random draws give the same tokens; the only difference is
    the drafter pass at position γ that the bonus row π_{t+γ} reads (one per step)."""
    for seed in range(3):
        large, small = pair(weights, "tiny-llama", seed)
        params = {"alpha": 0.0, "beta": 1.0, "tune_beta": False}
        lossy = cascade(large, small, prompt_for(seed), "lossy", temperature, seed=seed, params=params)
        sd = cascade(large, small, prompt_for(seed), "sd", temperature, seed=seed)
        assert lossy.tokens == sd.tokens and lossy.steps == sd.steps
        extra = lossy.forwards["small"]["forward_passes"] - sd.forwards["small"]["forward_passes"]
        assert extra == len(lossy.steps)


# -- greedy: speculative execution of T_δ is the oracle cascade of the same δ ---------------------


@pytest.mark.parametrize("kind", ["tiny-llama", "tiny-t5", "tiny-llama/compiled"])
@pytest.mark.parametrize("rule", MIXTURE_RULES)
def test_greedy_speculative_cascade_equals_the_oracle_cascade(weights, kind, rule):
    """At T = 0 every step is deterministic and commits, position by position, argmax of
    π_t = T_δ(q̃_t, p̃_t): exactly the token Algorithm 3 picks with the same δ."""
    kind, _, engine = kind.partition("/")
    deferred = 0
    for seed in range(3):
        large, small = pair(weights, kind, seed, engine=engine or "eager")
        prompt = prompt_for(seed)
        oracle = seq.oracle_cascade(
            large, small, prompt, rule=rule, params=params_for(rule), max_new_tokens=MAX_NEW
        )
        for k in (1, 4):
            ours = cascade(large, small, prompt, rule, 0.0, k=k)
            assert ours.tokens == oracle.tokens, f"seed={seed} k={k}"
        deferred += oracle.deferrals
    assert deferred > 0 or rule in ("chow_log",)


def test_lemma_9_opt_and_diff_decode_the_same_tokens_greedily(weights):
    for seed in range(4):
        large, small = pair(weights, "tiny-llama", seed)
        for alpha in (0.0, 0.1, 0.3, 0.6):
            runs = [
                cascade(large, small, prompt_for(seed), rule, 0.0, params={"alpha": alpha})
                for rule in ("opt", "diff")
            ]
            assert runs[0].tokens == runs[1].tokens and runs[0].steps == runs[1].steps


def test_forward_counts_and_deferrals(weights):
    """Per step: one target pass; the drafter's d passes plus one at position γ (rule != sd)."""
    for temperature, rule in itertools.product(TEMPERATURES, ("token", "opt", "lossy")):
        large, small = pair(weights, "tiny-llama", 1)
        gen = cascade(large, small, prompt_for(1), rule, temperature)
        assert sum(n + 1 for _, n in gen.steps) == len(gen.tokens) == MAX_NEW
        assert gen.forwards["large"]["forward_passes"] == len(gen.steps)
        assert gen.forwards["small"]["forward_passes"] == sum(d for d, _ in gen.steps) + len(gen.steps)
        assert gen.deferrals == sum(n < d for d, n in gen.steps)


@pytest.mark.parametrize("rule", ["chow", "diff", "opt", "token", "lossy", "bild"])
def test_lemma_5_rejection_chance_is_exact_greedily_and_the_sampled_rate_on_average(weights, rule):
    # Narasimhan et al., Lemma 5: a draft from q is rejected with probability D_TV(π, q) (r D_TV(p, q)
    # for the mixtures); greedily both are 0/1 per draft, so the sums agree exactly
    large, small = pair(weights, "tiny-llama", 2)
    greedy = cascade(large, small, prompt_for(2), rule, 0.0)
    assert greedy.expected_rejections == pytest.approx(greedy.deferrals)
    assert greedy.rejection_variance == 0  # each chance is 0 or 1
    rejected = expected = variance = 0.0
    for seed in range(40):
        sampled = cascade(large, small, prompt_for(seed), rule, 1.0, seed=seed)
        rejected += sampled.deferrals
        expected += sampled.expected_rejections
        variance += sampled.rejection_variance
    # rejections minus chances are a martingale with variance Σ c (1 - c) <= Σ c
    assert expected > 20 and 0 < variance < expected
    assert abs(rejected - expected) < 4 * variance**0.5


@pytest.mark.parametrize("rule", ["diff", "opt"])
def test_lemma_5_holds_in_bfloat16_over_a_large_vocabulary(rule):
    # the real pair runs in bfloat16 over 151,936 tokens, where the rows' rounding and a bfloat16
    # uniform draw could bias the counted rejections; a 4,096-token bfloat16 pair shows no bias
    from specbench.models.tiny import build_tiny

    vocab = 4096
    large, _ = build_tiny("tiny-llama", dtype=torch.float64, seed=1, vocab_size=vocab, init_std=0.5)
    small = copy.deepcopy(large)
    noise = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in small.parameters():
            if param.numel() > 1:
                param.add_(0.3 * param.std() * torch.randn(param.shape, generator=noise, dtype=F64))
    large, small = HFModel(large.to(torch.bfloat16), "large"), HFModel(small.to(torch.bfloat16), "small")
    rejected = expected = 0.0
    for seed in range(120):
        prompt = torch.randint(2, vocab, (3 + seed % 5,), generator=torch.Generator().manual_seed(seed))
        out = cascade(large, small, prompt, rule, 1.0, seed=seed, k=5, max_new=24)
        rejected += out.deferrals
        expected += out.expected_rejections
    assert expected > 150 and abs(rejected - expected) < 4 * expected**0.5


# -- sampled outputs follow the cascade's law ----------------------------------------------------


def exact_cascade_joint(large, small, prompt, rule, params, sampling) -> np.ndarray:
    """P(x_1, x_2) = law_1(x_1)·law_2(x_2 | x_1), law_t the law of a token Algorithm 4 emits from
    q_t against π_t = T(q_t, p_t), from the paper's formulas (test_deferral.expected_position) and
    full no-cache forwards of both models."""

    def law(prefix: tuple) -> torch.Tensor:
        ids = torch.cat([prompt, torch.tensor(prefix, dtype=torch.long)])[None]
        with torch.no_grad():
            q = sampling.probs(small(input_ids=ids).logits[0, -1]).tolist()
            p = sampling.probs(large(input_ids=ids).logits[0, -1]).tolist()
        kept, residual = expected_position(rule, q, p, params)
        return torch.tensor(kept, dtype=F64) + (1 - sum(kept)) * torch.tensor(residual, dtype=F64)

    first = law(())
    vocab = first.shape[0]
    return np.array([[float(first[a] * law((a,))[b]) for b in range(vocab)] for a in range(vocab)])


@pytest.mark.parametrize(
    "rule, params, temperature",
    [
        ("token", {"alpha": 0.3}, 1.0),
        ("opt", {"alpha": 0.05}, 0.5),
        ("lossy", {"alpha": 0.5, "beta": 1.0}, 1.0),
    ],
    ids=["token-T1", "opt-T0.5", "lossy-T1"],
)
@pytest.mark.parametrize("engine", ENGINES)
def test_sampled_cascade_follows_its_exact_law(tiny_model, rule, params, temperature, engine):
    """Two tokens with k = 1: the first step commits a draft + bonus (from π_{t+1}) or a residual
    draw, the second (budget 0) draws from π directly; the pairs follow the exact joint law."""
    large_w = tiny_model("tiny-llama", 0, **TINY_OPTIONS)
    small_w = tiny_model("tiny-llama", 1, **TINY_OPTIONS)
    large, small = engine_model(large_w, "large", engine, (1,)), engine_model(small_w, "small", engine, (1,))
    prompt, sampling = torch.tensor([2, 3, 4]), SamplingParams(temperature=temperature)
    joint = exact_cascade_joint(large_w, small_w, prompt, rule, params, sampling)
    gen = torch.Generator().manual_seed(2024)
    counts = np.zeros_like(joint)
    drafter = ModelDrafter(small)
    for _ in range(1500):
        out = spec_cascades.generate(
            large,
            drafter,
            prompt,
            rule=rule,
            params=params,
            k=1,
            max_new_tokens=2,
            sampling=sampling,
            generator=gen,
        )
        counts[tuple(out.tokens)] += 1
    assert_matches(counts, joint / joint.sum(), f"{rule} T={temperature}")


# -- sequential cascades -------------------------------------------------------------------------


def test_token_cascade_extremes_and_cap(weights):
    large, small = pair(weights, "tiny-llama", 2, role="other")
    prompt = prompt_for(2)
    small_ar = autoregressive.generate(small, prompt, max_new_tokens=MAX_NEW).tokens
    large_ar = autoregressive.generate(large, prompt, max_new_tokens=MAX_NEW).tokens
    run = dict(rule="chow", max_new_tokens=MAX_NEW)
    never = seq.token_cascade(large, small, prompt, alpha=1.0, max_small_tokens=0, **run)
    assert never.tokens == small_ar and never.deferrals == 0
    assert never.forwards["large"]["forward_passes"] == 0 and never.forwards["small"]["forward_passes"] == 12
    always = seq.token_cascade(large, small, prompt, alpha=0.0, max_small_tokens=0, **run)
    assert always.tokens == large_ar and always.deferrals == MAX_NEW
    assert always.forwards["large"]["forward_passes"] == always.forwards["small"]["forward_passes"] == 12
    capped = seq.token_cascade(large, small, prompt, alpha=1.0, max_small_tokens=3, **run)
    # every 4th token is the large model's; the small model is not asked at those positions
    assert capped.deferrals == 3 and capped.tokens[:3] == small_ar[:3]
    assert capped.forwards["large"]["forward_passes"] == 3 and capped.forwards["small"]["forward_passes"] == 9
    # the large model catches up on the skipped positions in its one pass
    assert capped.forwards["large"]["tokens_scored"] == prompt.shape[0] + 11


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sequential_cascades_count_every_pass(weights, temperature):
    large, small = pair(weights, "tiny-llama", 3)
    prompt, sampling = prompt_for(3), SamplingParams(temperature=temperature)
    kw = dict(max_new_tokens=MAX_NEW, sampling=sampling, generator=torch.Generator().manual_seed(0))
    token = seq.token_cascade(large, small, prompt, rule="chow", alpha=0.3, max_small_tokens=4, **kw)
    # one large pass per deferral; a small pass for every token but the cap's forced deferrals
    assert token.forwards["large"]["forward_passes"] == token.deferrals
    assert MAX_NEW - token.deferrals <= token.forwards["small"]["forward_passes"] <= MAX_NEW
    oracle = seq.oracle_cascade(large, small, prompt, rule="diff", params={"alpha": 0.1}, **kw)
    assert oracle.forwards["large"]["forward_passes"] == oracle.forwards["small"]["forward_passes"] == MAX_NEW
    for alpha in (0.0, 1.0):
        sequence = seq.seq_cascade(large, small, prompt, alpha=alpha, **kw)
        assert sequence.forwards["small"]["forward_passes"] == MAX_NEW
        assert (
            sequence.forwards["large"]["forward_passes"]
            == sequence.deferrals
            == (MAX_NEW if alpha == 0 else 0)
        )
    bild = seq.bild(large, small, prompt, alpha=1.0, fallback_alpha=0.3, k=4, discrepancy_metric="auto", **kw)
    assert bild.forwards["large"]["forward_passes"] == len(bild.steps) == bild.deferrals
    assert sum(n + 1 for _, n in bild.steps) == len(bild.tokens) == MAX_NEW


def test_bild_window_and_rollback_extremes(weights):
    large, small = pair(weights, "tiny-llama", 5)
    prompt = prompt_for(5)
    large_ar = autoregressive.generate(large, prompt, max_new_tokens=MAX_NEW).tokens
    # α = 0: every draft with p(x) < 1 is rolled back, so each step emits the large model's argmax
    strict = seq.bild(large, small, prompt, alpha=0.0, fallback_alpha=1.0, k=3, discrepancy_metric="greedy",
                      max_new_tokens=MAX_NEW)  # fmt: skip
    assert strict.tokens == large_ar
    # fallback_alpha = 1: never unsure, so full windows of k drafts (k passes per step, no extra one)
    loose = seq.bild(large, small, prompt, alpha=50.0, fallback_alpha=1.0, k=3, discrepancy_metric="greedy",
                     max_new_tokens=MAX_NEW)  # fmt: skip
    budgets = [3, 3, 3]  # 3 drafts + the large model's token: 12 tokens in 3 steps
    assert loose.steps == [(b, b) for b in budgets]
    assert loose.forwards["small"]["forward_passes"] == sum(budgets)
    # fallback_alpha = 0: unsure at once, one drafter pass and one large-model token per step
    unsure = seq.bild(large, small, prompt, alpha=50.0, fallback_alpha=0.0, k=3, discrepancy_metric="greedy",
                      max_new_tokens=MAX_NEW)  # fmt: skip
    assert unsure.tokens == large_ar and unsure.steps == [(0, 0)] * MAX_NEW
    assert unsure.forwards["small"]["forward_passes"] == MAX_NEW - 1  # the last step has no budget


def test_seq_cascade_keeps_or_replaces_the_whole_response(weights):
    large, small = pair(weights, "tiny-llama", 6, role="other")
    prompt = prompt_for(6)
    small_ar = autoregressive.generate(small, prompt, max_new_tokens=MAX_NEW).tokens
    large_ar = autoregressive.generate(large, prompt, max_new_tokens=MAX_NEW).tokens
    assert seq.seq_cascade(large, small, prompt, alpha=1.0, max_new_tokens=MAX_NEW).tokens == small_ar
    assert seq.seq_cascade(large, small, prompt, alpha=0.0, max_new_tokens=MAX_NEW).tokens == large_ar


def softmax_rows(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """The T = 1 next-token distribution after ``ids``, from one full no-cache forward."""
    with torch.no_grad():
        return torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], -1)


def reference_token_cascade(large_w, small_w, prompt, alpha, cap):
    """Algorithm 2 with Chow's δ (Eq. 2), greedy: the large model's argmax where max q < 1 − α or after
    ``cap`` small-model tokens in a row (App. E.1; 0: no cap), the small model's argmax otherwise."""
    out, run = [], 0
    while len(out) < MAX_NEW:
        prefix = prompt.tolist() + out
        defer = run == cap > 0 or float(softmax_rows(small_w, prefix).max()) < 1 - alpha
        out.append(int(softmax_rows(large_w if defer else small_w, prefix).argmax()))
        run = 0 if defer else run + 1
    return out


def reference_bild(large_w, small_w, prompt, alpha, fallback_alpha, k):
    """Original BiLD, greedy: the small model drafts while max q >= 1 − α_f, at most k tokens; the
    large model keeps the drafts before the first −log p(argmax q) > α and adds its argmax."""
    out = []
    while len(out) < MAX_NEW:
        drafts = []
        while len(drafts) < min(k, MAX_NEW - len(out) - 1):
            q = softmax_rows(small_w, prompt.tolist() + out + drafts)
            if float(q.max()) < 1 - fallback_alpha:
                break
            drafts.append(int(q.argmax()))
        for j in range(len(drafts) + 1):
            p = softmax_rows(large_w, prompt.tolist() + out + drafts[:j])
            if j == len(drafts) or -float(p[drafts[j]].log()) > alpha:
                out += drafts[:j] + [int(p.argmax())]
                break
    return out


def test_sequential_baselines_match_a_plain_reading_of_the_paper(weights):
    """Greedy TokenCascade (with its cap), SeqCascade (Eq. 1) and BiLD at thresholds that make them
    mix both models, against step-by-step references built from full forwards of the raw models."""
    mixed = {"token": set(), "bild": set()}  # some run mixes both models (BiLD: a partial rollback)
    for seed in range(3):
        large_w, small_w = weights("tiny-llama", seed), weights("tiny-llama", seed, "noisy")
        large, small = HFModel(large_w, "large"), HFModel(small_w, "small")
        prompt = prompt_for(seed)
        for alpha, cap in ((0.3, 0), (0.5, 3), (0.7, 2)):
            ours = seq.token_cascade(
                large, small, prompt, rule="chow", alpha=alpha, max_small_tokens=cap, max_new_tokens=MAX_NEW
            )
            assert ours.tokens == reference_token_cascade(large_w, small_w, prompt, alpha, cap)
            mixed["token"].add(0 < ours.deferrals < MAX_NEW)
        for alpha, fallback_alpha, k in ((0.5, 0.5, 4), (1.0, 0.7, 3), (2.0, 0.9, 10)):
            ours = seq.bild(
                large, small, prompt, alpha=alpha, fallback_alpha=fallback_alpha, k=k,
                discrepancy_metric="greedy", max_new_tokens=MAX_NEW,
            )  # fmt: skip
            assert ours.tokens == reference_bild(large_w, small_w, prompt, alpha, fallback_alpha, k)
            mixed["bild"].add(any(0 < n < d for d, n in ours.steps))
        small_ar = autoregressive.generate(small, prompt, max_new_tokens=MAX_NEW).tokens
        large_ar = autoregressive.generate(large, prompt, max_new_tokens=MAX_NEW).tokens
        q_response = np.prod(
            [float(softmax_rows(small_w, prompt.tolist() + small_ar[:i])[x]) for i, x in enumerate(small_ar)]
        )
        # Eq. 1: the large model's response iff q(small model's response) < 1 − α
        for alpha, defers in ((1 - 2 * q_response, True), (1 - q_response / 2, False)):
            ours = seq.seq_cascade(large, small, prompt, alpha=alpha, max_new_tokens=MAX_NEW)
            assert ours.tokens == (large_ar if defers else small_ar)
    assert True in mixed["token"] and True in mixed["bild"], mixed


# -- recipes ---------------------------------------------------------------------------------------


def test_only_pi_equal_p_is_lossless():
    lossless = METHODS["spec_cascade"].lossless
    assert lossless({"rule": "sd", "alpha": 0.3})
    assert lossless({"rule": "lossy", "alpha": 0.0, "beta": 1.0, "tune_beta": False})
    assert not lossless({"rule": "lossy", "alpha": 0.1, "beta": 1.0, "tune_beta": False})
    assert not lossless({"rule": "token", "alpha": 0.0})
    for method in ("token_cascade", "seq_cascade", "oracle_cascade", "bild"):
        assert method in METHODS and not METHODS[method].lossless({})


BASE = {
    "name": "sc",
    "models": {
        "large": {"source": "tiny-llama"},
        "small": {"source": "tiny-llama", "options": {"layers": 1}},
        "mag": {"source": "maxgram"},
    },
    "datasets": [{"task": "arithmetic"}],
    "methods": [{"name": "ar", "method": "autoregressive", "target": "large"}],
}


def with_method(**entry) -> dict:
    data = copy.deepcopy(BASE)
    data["methods"].append({"name": "m", "target": "large", "drafter": "small"} | entry)
    if data["methods"][-1].get("drafter") != "mag":
        del data["models"]["mag"]  # a recipe lists only models its methods use
    return data


BAD = [
    (
        dict(method="spec_cascade"),
        r"params\.rule: spec_cascade needs rule:.*fix: add rule: with one of sd, lossy",
    ),
    (dict(method="spec_cascade", params={"rule": "tokn"}), r"params\.rule: \"tokn\" is not allowed.*'token'"),
    (
        dict(method="spec_cascade", params={"rule": "diff", "beta": 0.9}),
        r"params\.beta: rule 'diff' takes no",
    ),
    (
        dict(method="spec_cascade", params={"beta": 2.0}, grid={"rule": ["lossy", "opt"]}),
        r"params\.beta: rule 'opt' takes no parameter 'beta'.*own method entry",
    ),
    (
        dict(method="spec_cascade", params={"rule": "chow", "discrepancy": "greedy"}),
        r"takes no parameter 'discrep",
    ),
    (
        dict(method="spec_cascade", params={"rule": "lossy", "alpha": 1.0}),
        r"params\.alpha: lossy SD needs α < 1",
    ),
    (dict(method="spec_cascade", params={"rule": "lossy", "alpha": 0.2, "beta": 0.5}), r"needs β >= 1 - α"),
    (
        dict(method="spec_cascade", params={"rule": "lossy", "beta": 2.0, "tune_beta": True}),
        r"params\.beta: beta is given, but tune_beta",
    ),
    (
        dict(method="spec_cascade", params={"rule": "token"}, grid={"alpha": [0.5, 1.5]}),
        r"grid\.alpha: .* never",
    ),
    (
        dict(method="spec_cascade", params={"rule": "opt", "k": 0}),
        r"params\.k: 0 is out of range \(k: block size",
    ),
    (dict(method="spec_cascade", drafter="mag", params={"rule": "opt"}), r"needs a model drafter"),
    (dict(method="token_cascade", params={"rule": "diff"}), r"params\.rule: \"diff\" is not allowed"),
    (dict(method="oracle_cascade", params={"rule": "token"}), r"params\.rule: \"token\" is not allowed"),
    (dict(method="oracle_cascade", params={"rule": "diff", "discrepancy": "greedy"}), r"takes no parameter"),
    (dict(method="seq_cascade", params={"alpha": 1.5}), r"params\.alpha: 1\.5 is out of range"),
    (dict(method="bild", params={"fallback_alpha": -0.1}), r"params\.fallback_alpha: -0\.1 is out of range"),
    (dict(method="bild", drafter=None), r"\.drafter: method 'bild' needs a drafter"),
]


@pytest.mark.parametrize("entry, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_cascade_parameters_are_one_line_errors(tmp_path, entry, message):
    with pytest.raises(SpecbenchError, match=message) as error:
        parse_recipe(with_method(**entry), tmp_path / "r.yaml")
    assert "\n" not in str(error.value) and " — fix: " in str(error.value)


def test_a_default_written_out_is_not_a_parameter_given(tmp_path):
    # a resolved recipe writes every default (alpha: 0.0 under rule sd, beta: 1.0 beside tune_beta):
    # it must load again as it ran, so a value equal to the default counts as not given
    entry = dict(method="spec_cascade", params={"rule": "sd", "alpha": 0.0, "beta": 1.0, "k": 5})
    assert parse_recipe(with_method(**entry), tmp_path / "r.yaml").cells()
    tuned = dict(method="spec_cascade", params={"rule": "lossy", "beta": 1.0, "tune_beta": True})
    assert parse_recipe(with_method(**tuned), tmp_path / "r.yaml").cells()


def test_valid_cascade_entries_expand_to_cells(tmp_path):
    data = with_method(
        method="spec_cascade", params={"k": 3}, grid={"rule": ["opt", "token"], "alpha": [0.1, 0.2]}
    )
    cells = parse_recipe(data, tmp_path / "r.yaml").cells()
    assert [c.id for c in cells[1:]] == [
        f"m[alpha={a},rule={r}]" for a, r in itertools.product((0.1, 0.2), ("opt", "token"))
    ]


RECIPES = sorted((ROOT / "recipes" / "spec_cascades").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_spec_cascades_recipes_parse(path):
    from specbench.tasks import TASKS

    cells = load_recipe(path, known_tasks=set(TASKS)).cells()
    methods = {cell.method for cell in cells}
    assert {"autoregressive", "spec_cascade"} <= methods


def test_the_recipes_folder_is_complete():
    names = {path.name for path in RECIPES}
    assert names >= {"t5_small_large.yaml", "gemma_2b_27b.yaml", "smollm2_offline.yaml"}
    assert names >= {"t5_small_large-tiny.yaml", "gemma_2b_27b-tiny.yaml"}


def test_cli_runs_a_tiny_cascade_recipe(tmp_path):
    out = tmp_path / "sc"
    path = ROOT / "recipes" / "spec_cascades" / "gemma_2b_27b-tiny.yaml"
    result = CliRunner().invoke(app, ["run", str(path), "--output-dir", str(out), "--limit", "2"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    cascades = [row for row in rows if row["method"] != "autoregressive"]
    assert cascades and all("deferrals" in row for row in cascades)
    cells = pd.read_csv(out / "cells.csv")
    assert "deferral_rate" in cells.columns
    # Lemma 5's view: every speculative-cascade cell, its rejections beside Lemma 5's expectation
    from specbench.papers.base import load_runs
    from specbench.papers.spec_cascades.tables import lemma5

    view = lemma5(load_runs(out))
    speculative = cells[cells["method"] == "spec_cascade"]
    assert len(view.rows) == len(speculative) > 0
    with_rule = speculative[speculative["rejection_rate_lemma5"].notna()]
    assert len(with_rule) and (with_rule["rejection_rate"].between(0, 1)).all()
    # the difference of the two rates, with the interval Lemma 5 bounds (lemma5_interval)
    # (the rows record Σ c (1 - c), so no interval is the bound's, marked *)
    shown = {(row["Dataset"], row["Method"]): row["ours - Lemma 5 [95%]"] for row in view.rows}
    for cell in with_rule.itertuples():
        gap, low, high = map(
            float, re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", shown[cell.dataset, cell.cell]).groups()
        )
        assert gap == pytest.approx(cell.rejection_rate - cell.rejection_rate_lemma5, abs=5e-4)
        variance = sum(r["rejection_variance"] for r in rows if r.get("cell") == cell.cell)
        half = 1.96 * variance**0.5 / cell.reviewed_drafts
        assert (low, high) == pytest.approx((gap - half, gap + half), abs=1e-3)


def test_lemma_5_interval_is_the_martingale_bound_by_hand():
    from specbench.papers.spec_cascades.tables import lemma5_interval

    # 30 rejections counted where the D_TV chances sum to 25 over 100 drafts: m = 0.25,
    # 1.96 sqrt(0.25 · 0.75 / 100) = 0.08487
    gap, half = lemma5_interval(30, 25.0, 100)
    assert gap == pytest.approx(0.05) and half == pytest.approx(0.084870, abs=1e-6)
    # four times the drafts halve it; no rejections expected leaves no room
    assert lemma5_interval(120, 100.0, 400)[1] == pytest.approx(half / 2)
    assert lemma5_interval(0, 0.0, 50) == (0.0, 0.0)
    # the recorded Σ c (1 - c) replaces the bound: chances of 0 or 0.5, say 40 of 0.5 and 60 of 0, sum
    # to 20 with variance 10 (the bound: 100 · 0.2 · 0.8 = 16), so 1.96 sqrt(10) / 100 = 0.061981
    assert lemma5_interval(25, 20.0, 100, 10.0) == pytest.approx((0.05, 0.061981), abs=1e-6)
    assert lemma5_interval(25, 20.0, 100)[1] == pytest.approx(1.96 * 16**0.5 / 100)
