"""CS Drafting: greedy output is the target's token for token, sampling keeps the target's law even
with lenient inner reviews, every pass is a review, K conventions, recipe validation, CLI end to end.

Tiny random-init float64 models, ids fed directly. Drafters: the target's own weights ("twin":
everything accepted, so long blocks and budget overshoots), a noisy copy of the target ("noisy":
partial acceptance), an unrelated seed ("other": mostly rejected); Max-Gram is always the bottom.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tiny_recipes
import torch
from conftest import ENGINES, engine_model, model_roles
from test_acceptance import P, Q, assert_matches, exact_joint, softmax_at
from typer.testing import CliRunner

from specbench.cli import app
from specbench.decoding import autoregressive, cascade_drafting, cascade_tree
from specbench.decoding.acceptance import speculative_accept
from specbench.decoding.cascade_drafting import (
    cumulative_from_increments,
    increments_from_cumulative,
    review_law,
)
from specbench.drafters.maxgram import MaxGramDrafter
from specbench.errors import SpecbenchError
from specbench.methods import METHODS, Request
from specbench.models.base import Draft, ForwardCounter
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams
from specbench.recipe import parse_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 16
KINDS = ("tiny-llama", "tiny-t5")
WITH_COMPILED = (*KINDS, "tiny-llama/compiled")  # kind[/engine]
F64 = torch.float64


@pytest.fixture(scope="module")
def weights(tiny_model):
    """``weights(kind, seed, role)``: the target's weights for "twin", a noisy copy of them for
    "noisy" (built once), an unrelated model for "other"."""
    return model_roles(tiny_model, VOCAB, 0.08, same=("target", "twin"))


def prompt_for(seed: int) -> torch.Tensor:
    """A repetitive prompt of length 3..9, so that Max-Gram finds something to copy."""
    gen = torch.Generator().manual_seed(seed)
    pattern = torch.randint(2, VOCAB, (2 + seed % 3,), generator=gen)
    return pattern.repeat(5)[: 3 + seed % 7]


# (drafter roles largest first, cumulative K, lenience, reference_compat): every depth, budgets that
# blocks overshoot (K = [[1]] under a twin), a drafter that never drafts at the top (k12 = k11).
CASCADES = [
    (("noisy",), [[3]], 1.0, False),
    (("twin",), [[1]], 3.0, True),
    (("noisy",), [[2]], 2.0, False),
    (("twin", "noisy"), [[2, 4], [0, 3]], 2.0, False),
    (("noisy", "other"), [[1, 1], [0, 2]], 1.0, True),
    (("noisy", "other"), [[3, 6], [0, 1]], 3.0, True),
    (("twin", "noisy", "other"), [[1, 3, 5], [0, 2, 4], [0, 0, 2]], 2.0, False),
]


def run_cascade(weights, kind, seed, roles, K, *, max_new_tokens, convention="cumulative", **options):
    """One greedy generation through the method adapter (``specbench.methods``), as the runner calls it."""
    kind, _, engine = kind.partition("/")
    target = engine_model(weights(kind, seed), "target", engine or "eager")
    drafters = [
        engine_model(weights(kind, seed, role), f"d{i + 1}", engine or "eager")
        for i, role in enumerate(roles)
    ]
    eos = options.pop("eos", [])
    params = {
        "K": K if convention == "cumulative" else increments_from_cumulative(K),
        "k_convention": convention,
        "lenience": 1.0,
        "mag_tokens": 10,
        "mag_tail": 10,
        "mag_lenience": True,
        "reference_compat": False,
        "tree_children": 1,
        "tree_nodes": 32,
    } | options
    request = Request(prompt_for(seed), max_new_tokens, SamplingParams(), eos, torch.Generator())
    return METHODS["cs_drafting"].run(params, target, [*drafters, MaxGramDrafter("mag")], request)


def check_invariants(gen, *, kind, prompt, n_drafters, max_new_tokens, mag_tail: int = 10) -> None:
    """One target pass per target review, one drafter pass per review by that drafter (no drafter
    ever runs an autoregressive loop), drafts within what max_new_tokens allows."""
    generated = 0
    for drafted, accepted in gen.steps:
        assert 0 <= accepted <= drafted <= max_new_tokens - generated - 1
        generated += accepted + 1
    assert len(gen.tokens) <= min(generated, max_new_tokens)
    target = gen.forwards["target"]
    assert target["forward_passes"] == len(gen.steps)
    prefix = 1 if kind == "tiny-t5" else prompt.shape[0]  # the target never recomputes a position
    assert target["tokens_scored"] == prefix + sum(d for d, _ in gen.steps) + len(gen.steps) - 1
    names = [f"d{i + 1}" for i in range(n_drafters)]
    assert set(gen.inner_steps) == set(names)
    for name in names:
        assert gen.forwards[name]["forward_passes"] == len(gen.inner_steps[name])
        assert all(0 <= a <= d for d, a in gen.inner_steps[name])
    # Max-Gram drafts once for each of the smallest drafter's reviews and, in its column of K, while a
    # level's draft is shorter than its budget: every call adds a token, so at most mag_tail calls per
    # review of any level (never when no draft fits)
    reviews = len(gen.steps) + sum(len(v) for v in gen.inner_steps.values())
    assert gen.forwards["mag"]["forward_passes"] <= len(gen.inner_steps[names[-1]]) + reviews * mag_tail


@pytest.mark.parametrize("kind", WITH_COMPILED)
def test_greedy_cascade_matches_target_greedy(kind, weights):
    stats = Counter()
    max_new = 16
    for seed in range(6):
        prompt = prompt_for(seed)
        expected = autoregressive.generate(
            HFModel(weights(kind.split("/")[0], seed), "target"), prompt, max_new_tokens=max_new
        )
        for index, (roles, K, lenience, compat) in enumerate(CASCADES):
            convention = ("cumulative", "increment")[(seed + index) % 2]
            gen = run_cascade(
                weights,
                kind,
                seed,
                roles,
                K,
                max_new_tokens=max_new,
                convention=convention,
                lenience=lenience,
                reference_compat=compat,
                mag_tail=(tail := (0, 3, 10)[(seed + index) % 3]),
                mag_lenience=bool(seed % 2),
            )
            assert gen.tokens == expected.tokens, f"seed={seed} {roles} K={K} l={lenience} compat={compat}"
            assert not gen.stopped_by_eos
            assert sum(a + 1 for _, a in gen.steps) == len(gen.tokens) == max_new
            check_invariants(
                gen, kind=kind, prompt=prompt, n_drafters=len(roles), max_new_tokens=max_new, mag_tail=tail
            )
            stats["overshoot"] += any(d > K[0][-1] for d, _ in gen.steps)
            stats["partial"] += any(0 < a < d for d, a in gen.steps)
            stats["rejected_first"] += any(d > 0 and a == 0 for d, a in gen.steps)
            for reviews in gen.inner_steps.values():
                stats["inner_partial"] += any(0 < a < d for d, a in reviews)
                stats["inner_all"] += any(0 < a == d for d, a in reviews)
            if lenience > 1:  # the switches change the inner reviews, never the output
                plain = run_cascade(
                    weights, kind, seed, roles, K, max_new_tokens=max_new, reference_compat=compat
                )
                stats["lenience_matters"] += plain.inner_steps != gen.inner_steps
                if compat:
                    own = run_cascade(
                        weights, kind, seed, roles, K, max_new_tokens=max_new, lenience=lenience
                    )
                    stats["compat_matters"] += own.inner_steps != gen.inner_steps
    keys = ("overshoot", "partial", "rejected_first", "inner_partial", "inner_all")
    assert all(stats[key] > 0 for key in (*keys, "lenience_matters", "compat_matters")), stats


@pytest.mark.parametrize("kind", KINDS)
def test_short_budgets(kind, weights):
    """max_new_tokens = 1, 2, 3, 5: the target's greedy prefix, and nothing drafted past the end."""
    for seed in (0, 5):
        prompt = prompt_for(seed)
        expected = autoregressive.generate(HFModel(weights(kind, seed), "target"), prompt, max_new_tokens=5)
        for roles, K, lenience, compat in (CASCADES[1], CASCADES[3], CASCADES[6]):
            for max_new in (1, 2, 3, 5):
                gen = run_cascade(
                    weights,
                    kind,
                    seed,
                    roles,
                    K,
                    max_new_tokens=max_new,
                    lenience=lenience,
                    reference_compat=compat,
                )
                assert gen.tokens == expected.tokens[:max_new], f"seed={seed} {roles} max_new={max_new}"
                assert sum(a + 1 for _, a in gen.steps) == max_new
                check_invariants(gen, kind=kind, prompt=prompt, n_drafters=len(roles), max_new_tokens=max_new)
                if max_new == 1:  # no room for a draft: one plain target pass, no drafter runs
                    assert gen.steps == [(0, 0)]
                    assert all(
                        gen.forwards[name]["forward_passes"] == 0 for name in gen.forwards if name != "target"
                    )


@pytest.mark.parametrize("kind", KINDS)
def test_eos_inside_an_accepted_block(kind, weights):
    """An EOS the target accepts as a draft with more accepted drafts after it: the output stops right
    after it, as autoregressive decoding does, and the step that drafted it is the last."""
    found = 0
    max_new = 16
    roles, K = ("twin", "noisy"), [[2, 4], [0, 3]]
    for seed in range(6):
        free = run_cascade(weights, kind, seed, roles, K, max_new_tokens=max_new)
        start = 0
        for step, (_, accepted) in enumerate(free.steps):
            for offset in range(accepted - 1):  # an accepted draft followed by accepted drafts
                eos = free.tokens[start + offset]
                if free.tokens.index(eos) != start + offset:
                    continue
                ar = autoregressive.generate(
                    HFModel(weights(kind, seed), "target"),
                    prompt_for(seed),
                    max_new_tokens=max_new,
                    eos_token_id=eos,
                )
                gen = run_cascade(weights, kind, seed, roles, K, max_new_tokens=max_new, eos=[eos, VOCAB + 3])
                assert gen.tokens == ar.tokens == free.tokens[: start + offset + 1] and gen.stopped_by_eos
                assert gen.steps == free.steps[: step + 1]
                found += 1
            start += accepted + 1
    assert found >= 4, "too few EOS inside accepted blocks were exercised"


def test_reference_rows_follow_the_reference_codes_bookkeeping():
    """What reference_compat's lenient test reads: one-hot rows, except token j >= 1 of the last block
    (here the block at offset 1 whose reviewer accepted 2 tokens), which gets that reviewer's row j - 1."""
    drafts = torch.tensor([3, 1, 4, 1, 5])
    p = torch.full((6, 6), 1 / 6, dtype=F64)
    block = torch.tensor([[0.5, 0.5, 0, 0, 0, 0], [0, 0, 0.5, 0.5, 0, 0]], dtype=F64)
    rows = cascade_drafting._reference_rows(drafts, p, (1, block))
    one_hot = torch.nn.functional.one_hot(drafts, 6).to(F64)
    assert torch.equal(rows[[0, 1, 4]], one_hot[[0, 1, 4]])
    assert torch.equal(rows[2:4], block)
    assert torch.equal(cascade_drafting._reference_rows(drafts, p, None), one_hot)


# ---------------------------------------------------------------------------------------------
# sampling: the lenient review's law, and the target's law through the whole cascade


@pytest.mark.parametrize("lenience", [1.0, 2.0, 3.0])
@pytest.mark.parametrize("draft", ["q", "one-hot"])
def test_review_law_is_the_lenient_rules_output_distribution(draft, lenience):
    """Monte-Carlo of speculative_accept at one drafted position against the closed form
    min(q, l p) + (1 - sum min(q, l p)) norm(max(0, p - q / l)) (``review_law``), which is p at l = 1."""
    p, trials = P[:2], 6000
    q = Q[:1] if draft == "q" else torch.nn.functional.one_hot(torch.tensor([2]), 6).to(F64)
    gen = torch.Generator().manual_seed(17)
    counts = np.zeros(6)
    for x in torch.multinomial(q[0], trials, replacement=True, generator=gen):
        verdict = speculative_accept(x.view(1), None if draft == "one-hot" else q, p, gen, lenience=lenience)
        counts[int(x) if int(verdict.n_accepted) else int(verdict.next_token)] += 1
    law = review_law(q, p[:1], lenience)[0]
    assert_matches(counts, law.numpy(), f"{draft} l={lenience}")
    # the same law by enumeration: x kept with probability min(1, l p(x) / q(x)), else the residual
    keep = torch.where(q[0] > 0, (lenience * p[0] / q[0]).clamp(max=1.0), torch.zeros(6, dtype=F64))
    residual = torch.clamp(p[0] - q[0] / lenience, min=0.0)
    enumerated = q[0] * keep + (q[0] * (1 - keep)).sum() * residual / residual.sum()
    assert torch.allclose(law, enumerated, atol=1e-12)
    if lenience == 1.0:
        assert torch.allclose(law, p[0], atol=1e-12)  # the exact rule emits p
    else:
        assert not torch.allclose(law, p[0], atol=1e-3)  # lenience really changes the law


# a 6-token vocabulary, spread-out distributions, ~1 ms per forward
TINY_OPTIONS = dict(vocab_size=6, init_std=0.3, hidden_size=16, layers=1, heads=2)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("lenience, trials", [(1.0, 1000), (3.0, 2000)])
def test_sampling_reproduces_the_target_joint(lenience, trials, engine, tiny_model):
    """Two neural drafters and Max-Gram; the first three of four tokens follow the target's exact
    joint law, also when the drafters' reviews are lenient (their reported q is then the lenient
    rule's output law, which the strict target review needs)."""
    target = engine_model(tiny_model("tiny-llama", 1, **TINY_OPTIONS), "target", engine)
    drafters = [
        engine_model(tiny_model("tiny-llama", seed, **TINY_OPTIONS), f"d{seed - 1}", engine)
        for seed in (2, 3)
    ]
    prompt = torch.tensor([2, 4, 2, 4, 5, 2])  # Max-Gram copies "4 5 2 ..." after the final 2
    reference = exact_joint(target.model, prompt, 3, softmax_at(1.0))
    gen = torch.Generator().manual_seed(2024)
    counts = np.zeros_like(reference)
    steps, inner = Counter(), Counter()
    for _ in range(trials):
        out = cascade_drafting.generate(
            target,
            drafters,
            MaxGramDrafter("mag"),
            prompt,
            K=[[2, 3], [0, 2]],
            max_new_tokens=4,
            sampling=SamplingParams(temperature=1.0),
            generator=gen,
            lenience=lenience,
            mag_tokens=3,
        )
        assert len(out.tokens) == 4
        counts[tuple(out.tokens[:3])] += 1
        steps.update(outcome(d, a) for d, a in out.steps)
        for name, reviews in out.inner_steps.items():
            inner.update((name, outcome(d, a)) for d, a in reviews)
    assert_matches(counts, reference, f"l={lenience}")
    # every review outcome occurs (d2 reviews at most 1 Max-Gram token here, so never partially)
    assert all(steps[kind] for kind in ("rejected", "partial", "all")), steps
    assert all(inner["d1", kind] for kind in ("rejected", "partial", "all")), inner
    assert inner["d2", "rejected"] and inner["d2", "all"], inner


def outcome(drafted: int, accepted: int) -> str:
    if drafted == 0:
        return "no draft"
    return "all" if accepted == drafted else "partial" if accepted else "rejected"


# ---------------------------------------------------------------------------------------------
# tree attention (Appendix B: the chain's tokens get siblings from their reviewer's law)


def test_sibling_tree_gives_each_chain_token_its_laws_next_candidates():
    drafts = torch.tensor([3, 1, 4])
    q = torch.tensor(
        [
            [0.0, 0.1, 0.2, 0.5, 0.15, 0.05],  # chain token 3 is the mode: siblings 2, 4, 1
            [0.0, 0.4, 0.0, 0.0, 0.6, 0.0],  # chain token 1 is not the mode (a lenient review)
            [0.0, 0.0, 0.0, 0.0, 1.0, 0.0],  # one-hot (Max-Gram): no sibling
        ]
    )
    tree = cascade_tree.sibling_tree(drafts, q, 4, 32, SamplingParams(), None)
    assert tree.tokens.tolist() == [3, 2, 4, 1, 1, 4, 4]
    assert tree.parents == (-1, -1, -1, -1, 0, 0, 4)
    assert tree.depth == 3 and tree.q is None
    assert cascade_tree.chain_prefix(tree, [0, 4, 6]) == 3
    assert cascade_tree.chain_prefix(tree, [0, 5]) == 1
    assert cascade_tree.chain_prefix(tree, [2]) == 0
    # nodes caps the chain first, then the siblings from the first position on
    cut = cascade_tree.sibling_tree(drafts, q, 4, 5, SamplingParams(), None)
    assert cut.tokens.tolist() == [3, 2, 4, 1, 4] and cut.parents == (-1, -1, -1, 0, 3)
    short = cascade_tree.sibling_tree(drafts, q, 4, 2, SamplingParams(), None)
    assert short.tokens.tolist() == [3, 1] and short.parents == (-1, 0)
    # sampled: siblings are drawn from the law without the chain token, and carry the law
    sampled = cascade_tree.sibling_tree(
        drafts, q, 8, 32, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)
    )
    assert sorted(sampled.tokens[1:5].tolist()) == [1, 2, 4, 5] and sampled.tokens[5] == 1
    assert sampled.tokens[6:].tolist() == [4, 4] and torch.equal(sampled.q[6], q[1])
    assert torch.equal(sampled.q[:5], q[[0] * 5])


@pytest.mark.parametrize("kind", ["tiny-llama", "tiny-llama/compiled"])
def test_greedy_tree_cascade_matches_target_greedy(kind, weights, sibling_paths):
    """Chain and siblings verified in one pass keep the target's greedy output; siblings are
    accepted where a chain token was not (more tokens per target pass than the chain)."""
    max_new, gained = 16, 0
    for seed in range(6):
        prompt = prompt_for(seed)
        expected = autoregressive.generate(
            HFModel(weights("tiny-llama", seed), "target"), prompt, max_new_tokens=max_new
        )
        for roles, K, lenience in ((("noisy",), [[1]], 1.0), (("noisy", "other"), [[1, 3], [0, 1]], 2.0)):
            options = dict(max_new_tokens=max_new, lenience=lenience, mag_tokens=1, mag_tail=2)
            chain = run_cascade(weights, kind, seed, roles, K, **options)
            tree = run_cascade(weights, kind, seed, roles, K, tree_children=8, tree_nodes=12, **options)
            assert tree.tokens == chain.tokens == expected.tokens, f"seed={seed} {roles}"
            target = tree.forwards["target"]
            assert target["forward_passes"] == len(tree.steps)
            generated = 0
            for depth, accepted in tree.steps:
                assert 0 <= accepted <= depth <= max_new - generated - 1
                generated += accepted + 1
            gained += len(chain.steps) - len(tree.steps)
    assert gained > 0 and sibling_paths["sibling"] > 0, sibling_paths


@pytest.fixture
def sibling_paths(monkeypatch):
    """Counts the target's accepted paths that end on a sibling (they leave the chain)."""
    seen = Counter()
    own = cascade_drafting.chain_prefix

    def counted(tree, path):
        trunk = own(tree, path)
        seen["sibling" if trunk < len(path) else "chain"] += 1
        return trunk

    monkeypatch.setattr(cascade_drafting, "chain_prefix", counted)
    return seen


@pytest.mark.parametrize("engine", ENGINES)
def test_sampled_tree_cascade_reproduces_the_target_joint(engine, tiny_model, sibling_paths):
    """Siblings drawn without replacement after each chain token, verified by recursive rejection
    sampling, keep the target's law, with lenient inner reviews too."""
    target = engine_model(tiny_model("tiny-llama", 1, **TINY_OPTIONS), "target", engine)
    drafter = engine_model(tiny_model("tiny-llama", 2, **TINY_OPTIONS), "d1", engine)
    prompt = torch.tensor([2, 4, 2, 4, 5, 2])
    reference = exact_joint(target.model, prompt, 3, softmax_at(1.0))
    gen = torch.Generator().manual_seed(7)
    counts = np.zeros_like(reference)
    for trial in range(1500):
        out = cascade_drafting.generate(
            target,
            [drafter],
            MaxGramDrafter("mag"),
            prompt,
            K=[[2]],
            max_new_tokens=4,
            sampling=SamplingParams(temperature=1.0),
            generator=gen,
            lenience=(1.0, 2.0)[trial % 2],
            mag_tokens=1,
            mag_tail=1,
            tree_children=3,
            tree_nodes=16,
        )
        assert len(out.tokens) == 4
        counts[tuple(out.tokens[:3])] += 1
    assert_matches(counts, reference, "tree")
    assert sibling_paths["sibling"] > 100 and sibling_paths["chain"] > 100, sibling_paths


def test_tree_cascades_are_checked():
    data = recipe(params={"K": [[2, 4], [0, 3]], "tree_children": 8, "reference_compat": True})
    with pytest.raises(SpecbenchError, match=r"^bad.yaml: methods\[1\].params.tree_children: .*fix: "):
        parse_recipe(data, "bad.yaml")
    data = recipe(params={"K": [[2, 4], [0, 3]], "tree_children": 8}, replay=True)
    data["methods"].insert(0, {"name": "ar", "method": "autoregressive", "target": "target"})
    with pytest.raises(SpecbenchError, match=r"^bad.yaml: methods\[2\].replay: .*token trees"):
        parse_recipe(data, "bad.yaml")
    cell = parse_recipe(recipe(params={"K": [[2, 4], [0, 3]], "tree_children": 8}), "ok.yaml").cells()[1]
    assert METHODS["cs_drafting"].tree_sizes(cell.params) == (32,)
    chain = parse_recipe(recipe(params={"K": [[2, 4], [0, 3]]}), "ok.yaml").cells()[1]
    assert METHODS["cs_drafting"].tree_sizes(chain.params) == ()
    assert "tree_children" not in chain.id  # a chain cell keeps its id and fingerprint


# ---------------------------------------------------------------------------------------------
# K conventions


def test_k_conventions_convert_both_ways():
    # CS Drafting Table 5 (MMLU, MS): k11 = 5, k12 = 19, k22 = 1; the reference code writes [[5, 14], [0, 1]]
    assert cumulative_from_increments([[5, 14], [0, 1]]) == [[5, 19], [0, 1]]
    assert increments_from_cumulative([[5, 19], [0, 1]]) == [[5, 14], [0, 1]]
    assert cumulative_from_increments([[5, 14, 10], [0, 1, 10], [0, 0, 10]]) == [
        [5, 19, 29],
        [0, 1, 11],
        [0, 0, 10],
    ]
    assert cumulative_from_increments([[4]]) == increments_from_cumulative([[4]]) == [[4]]
    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 4):
        inc = torch.randint(0, 6, (n, n), generator=gen).triu()
        inc.diagonal().clamp_(min=1)
        inc = inc.tolist()
        cum = cumulative_from_increments(inc)
        assert increments_from_cumulative(cum) == inc
        assert cumulative_from_increments(increments_from_cumulative(cum)) == cum
        assert all(row[r:] == sorted(row[r:]) for r, row in enumerate(cum))  # cumulative rows never decrease


def test_generate_rejects_a_malformed_k(weights):
    target = HFModel(weights("tiny-llama", 0), "target")
    drafter = HFModel(weights("tiny-llama", 0, "noisy"), "d1")
    for K, n in (([[0]], 1), ([[2, 3], [0, 0]], 2), ([[3, 2], [0, 1]], 2), ([[2]], 2)):
        drafters = [drafter] * n
        with pytest.raises(ValueError):
            cascade_drafting.generate(
                target, drafters, MaxGramDrafter(), prompt_for(0), K=K, max_new_tokens=4
            )
    with pytest.raises(ValueError):
        cascade_drafting.generate(target, [], MaxGramDrafter(), prompt_for(0), K=[], max_new_tokens=4)
    with pytest.raises(ValueError, match="greedily only"):  # the reference code does not sample
        cascade_drafting.generate(
            target,
            [drafter],
            MaxGramDrafter(),
            prompt_for(0),
            K=[[2]],
            max_new_tokens=4,
            sampling=SamplingParams(temperature=1.0),
            reference_compat=True,
        )


# ---------------------------------------------------------------------------------------------
# recipes


def recipe(method: dict | None = None, **fields) -> dict:
    cs = tiny_recipes.cs_drafting(["d1", "d2", "mag"], [[2, 4], [0, 3]])
    if "params" in fields or "grid" in fields:
        del cs["params"]
    data = tiny_recipes.recipe(
        "t",
        {
            "target": tiny_recipes.tiny(dtype=None),
            "d1": tiny_recipes.tiny(dtype=None, layers=1) | {"cost": {"pw": 0.2}},
            "d2": tiny_recipes.tiny(dtype=None, hidden_size=16),
            "mag": tiny_recipes.maxgram(),
            "lookup": tiny_recipes.lookup(),
        },
        [tiny_recipes.speculative("d1", None), method if method is not None else cs | fields],
    )
    return without_unused_models(data)


def without_unused_models(data: dict) -> dict:
    """A recipe lists only models its methods use (an unused one is an error)."""
    used = set()
    for entry in data["methods"]:
        drafters = entry.get("drafters")
        used |= {entry.get("target"), entry.get("drafter"), *(drafters if isinstance(drafters, list) else ())}
    data["models"] = {name: spec for name, spec in data["models"].items() if name in used}
    return data


def test_cascade_cells_ids_and_fingerprints():
    grid = {"K": [[[2, 4], [0, 3]], [[1, 5], [0, 2]]], "lenience": [1, 2]}
    parsed = parse_recipe(recipe(grid=grid, params={"k_convention": "increment"}), "r.yaml")
    cells = parsed.cells()
    assert [c.id for c in cells[1:]] == [
        "cs[K=[[2,4],[0,3]],lenience=1.0]",
        "cs[K=[[2,4],[0,3]],lenience=2.0]",
        "cs[K=[[1,5],[0,2]],lenience=1.0]",
        "cs[K=[[1,5],[0,2]],lenience=2.0]",
    ]
    cs = cells[1]
    assert cs.drafters == ("d1", "d2", "mag") and cs.drafter is None
    assert cs.params == {
        "K": [[2, 4], [0, 3]],
        "k_convention": "increment",
        "lenience": 1.0,
        "mag_tokens": 10,
        "mag_tail": 10,
        "mag_lenience": True,
        "reference_compat": False,
        "tree_children": 1,
        "tree_nodes": 32,
    }
    again = parse_recipe(parsed.resolved(), "resolved.yaml")
    assert [c.fingerprint(again) for c in again.cells()] == [c.fingerprint(parsed) for c in cells]

    base = {c.id: c.fingerprint(parsed) for c in cells}
    other = recipe(grid=grid, params={"k_convention": "increment"})
    other["models"]["d2"]["options"] = {"hidden_size": 8}  # only the cascade uses d2
    changed = {
        c.id: c.fingerprint(parse_recipe(other, "r.yaml")) for c in parse_recipe(other, "r.yaml").cells()
    }
    assert changed["sd"] == base["sd"]
    assert all(changed[cell] != base[cell] for cell in base if cell != "sd")
    alone = parse_recipe(
        recipe(method={"name": "ar", "method": "autoregressive", "target": "target"}), "r.yaml"
    )
    assert alone.cells()[0].fingerprint(alone) == base["sd"]  # a cascade beside it changes nothing


BAD = {
    "K not triangular": (
        dict(params={"K": [[2, 4], [1, 3]]}),
        "params.K",
        "K[1][0] = 1 (k21) lies below the diagonal",
    ),
    "K wrong size": (dict(params={"K": [[3]]}), "params.K", "is not 2 x 2, for 2 neural drafters (d1, d2)"),
    "K ragged": (dict(params={"K": [[2, 4], [3]]}), "params.K", "is not 2 x 2"),
    "K zero budget": (dict(params={"K": [[0, 4], [0, 3]]}), "params.K", "K[0][0] = 0 (k11) is below 1"),
    "K cumulative row decreases": (
        dict(params={"K": [[4, 2], [0, 3]]}),
        "params.K",
        "K[0][1] = 2 (k12) < K[0][0] = 4: row 0 of the cumulative K",
    ),
    "K negative increment": (
        dict(params={"K": [[4, -1], [0, 3]], "k_convention": "increment"}),
        "params.K",
        "K[0][1] = -1 (k12) is below 0",
    ),
    "K missing": (dict(params={}), "params.K", "needs K"),
    "K not a list": (dict(params={"K": 3}), "params.K", "3 is not a list"),
    "K holds a float": (dict(params={"K": [[2.5, 4], [0, 3]]}), "params.K", "not a list of rows of integers"),
    "K in a grid": (dict(grid={"K": [[[2, 4], [0, 3]], [[2, 4], [1, 3]]]}), "grid.K", "below the diagonal"),
    "lenience below 1": (
        dict(params={"K": [[2, 4], [0, 3]], "lenience": 0.5}),
        "params.lenience",
        "out of range",
    ),
    "mag_tokens zero": (
        dict(params={"K": [[2, 4], [0, 3]], "mag_tokens": 0}),
        "params.mag_tokens",
        "out of range",
    ),
    "unknown convention": (
        dict(params={"K": [[2, 4], [0, 3]], "k_convention": "paper"}),
        "params.k_convention",
        "not allowed",
    ),
    "compat not a bool": (
        dict(params={"K": [[2, 4], [0, 3]], "reference_compat": "yes"}),
        "params.reference_compat",
        "not true or false",
    ),
    "unknown drafter": (dict(drafters=["d1", "big", "mag"]), "drafters[1]", "no model named 'big'"),
    "statistical not last": (
        dict(drafters=["d1", "mag", "d2", "lookup"]),
        "drafters[1]",
        "statistical drafter but not the last",
    ),
    "no statistical bottom": (dict(drafters=["d1", "d2"]), "drafters", "no statistical bottom"),
    "duplicate drafter": (
        dict(drafters=["d1", "d1", "mag"]),
        "drafters[1]",
        "appears twice (also drafters[0])",
    ),
    "target as drafter": (dict(drafters=["target", "d1", "mag"]), "drafters[0]", "is the target"),
    "statistical alone": (dict(drafters=["mag"]), "drafters", "at least one neural drafter"),
    "no drafters": (dict(drafters=[]), "drafters", "needs drafters"),
    "drafter instead of drafters": (dict(drafters=None, drafter="d1"), "drafter", "takes drafters: (a list)"),
}


def test_reference_compat_is_greedy_only():
    data = recipe(params={"K": [[2, 4], [0, 3]], "reference_compat": True})
    parse_recipe(data, "ok.yaml")
    data["generation"]["temperature"] = 0.7
    with pytest.raises(
        SpecbenchError, match=r"^bad.yaml: methods\[1\].params.reference_compat: .*greedily only"
    ):
        parse_recipe(data, "bad.yaml")


@pytest.mark.parametrize("case", list(BAD))
def test_bad_cascade_is_one_line_naming_field_and_fix(case):
    fields, field, problem = BAD[case]
    with pytest.raises(SpecbenchError) as caught:
        parse_recipe(recipe(**fields), "bad.yaml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"bad.yaml: methods[1].{field}: "), message
    assert problem in message and " — fix: " in message, message


def test_drafters_list_only_for_cascades():
    sd = {
        "name": "sd2",
        "method": "speculative",
        "target": "target",
        "drafter": "d1",
        "drafters": ["d1", "mag"],
    }
    with pytest.raises(SpecbenchError, match=r"^bad.yaml: methods\[1\].drafters: .*takes no drafters list"):
        parse_recipe(recipe(method=sd), "bad.yaml")


# ---------------------------------------------------------------------------------------------
# the shipped tiny recipe through the CLI


def test_cli_runs_the_tiny_cascade_recipe(tmp_path: Path):
    runner = CliRunner()
    out = tmp_path / "cs"
    path = ROOT / "recipes" / "cs_drafting" / "quickstart-tiny.yaml"
    result = runner.invoke(app, ["run", str(path), "--output-dir", str(out), "--limit", "2"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    cells = pd.read_csv(out / "cells.csv").set_index("cell")
    cascade = [cell for cell in cells.index if cell.startswith("cs[")]
    assert cascade == ["cs[K=[[2,4],[0,3]]]", "cs[K=[[1,5],[0,2]]]"] and len(rows) == 6
    for cell in cascade:
        row = cells.loc[cell]
        assert row["drafter"] == "d1+d2+mag"
        assert row["lossless_checked"] == row["lossless_identical"] == 2  # greedy: the AR output exactly
        assert row["acceptance_length"] > 1
        mine = [r for r in rows if r["cell"] == cell]
        passes = Counter()
        for r in mine:
            assert r["drafters"] == ["d1", "d2", "mag"] and set(r["inner_steps"]) == {"d1", "d2"}
            assert r["costs"]["pw"] == {"target": 1.0, "d1": 0.3, "d2": 0.1, "mag": 0.0}
            assert (
                r["costs"]["ms"]["d1"] == 1.0
                and 0 < r["costs"]["ms"]["d2"] < 1
                and r["costs"]["ms"]["mag"] == 0
            )
            passes.update({name: f["forward_passes"] for name, f in r["forwards"].items()})
        assert row["drafter_forwards"] == passes["d1"] + passes["d2"] + passes["mag"]
        spent = passes["target"] + 0.3 * passes["d1"] + 0.1 * passes["d2"]
        assert row["swi_pw"] == pytest.approx(row["generated_tokens"] / spent)
    report = runner.invoke(app, ["report", str(out), "--format", "csv"])
    assert report.exit_code == 0 and "d1+d2+mag" in report.output and '"[[2,4],[0,3]]"' in report.output


class OracleMag:
    """A statistical drafter that proposes the target's own greedy continuation: every draft is
    accepted, so a drafter's blocks overshoot their budget as far as they can."""

    name, num_parameters = "mag", 0

    def __init__(self, continuation: list[int]):
        self.continuation = torch.tensor(continuation)
        self.counter = ForwardCounter()

    def start(self, prompt_ids: torch.Tensor) -> None:
        pass

    def rollback(self, n_tokens: int) -> None:
        pass

    def propose(self, tokens, k, sampling, generator) -> Draft:
        if k == 0:
            return Draft(tokens[:0], None)
        self.counter.forward_passes += 1
        return Draft(self.continuation[tokens.shape[0] : tokens.shape[0] + k], None)


@pytest.mark.parametrize(
    ("mag_tokens", "mag_tail", "steps", "d1_steps", "mag_calls"),
    [
        # Hand-traced, K = [[1]], max_new_tokens 12, every draft accepted. MaG drafts 3 tokens for d1,
        # d1 keeps them and adds one: 4 tokens, past Max-Gram's budget K + mag_tail = 3, so MaG's column
        # is skipped and the target reviews 4 (5 tokens a step). At generated = 10 only one token is left
        # to draft: d1 reviews an empty draft and writes 1 (its MaG level has no room).
        (3, 2, [(4, 4), (4, 4), (1, 1)], [(3, 3), (3, 3), (0, 0)], 2),
        # MaG drafts 1 token for d1 (2 tokens: 1 short of the budget 1 + 3 = 4), then, 1 token a call,
        # twice more in its column: 4 drafts, 5 tokens a step; at generated = 10 one token is left.
        (1, 3, [(4, 4), (4, 4), (1, 1)], [(1, 1), (1, 1), (0, 0)], 2 * 3),
        # mag_tail 0: no MaG column, d1's 2 tokens (3 a step) are the whole draft
        (1, 0, [(2, 2), (2, 2), (2, 2), (2, 2)], [(1, 1)] * 4, 4),
    ],
)
def test_max_gram_drafts_only_within_its_column_budget(
    weights, mag_tokens, mag_tail, steps, d1_steps, mag_calls
):
    """CS Drafting's Algorithm 1 / the reference's horizontal loop: Max-Gram is K's last column and runs
    only while a level's draft is shorter than K[r][n-1] + mag_tail (lfsszd/CS-Drafting, csd.py)."""
    prompt = prompt_for(0)
    target = HFModel(weights("tiny-llama", 0, "target"), "target")
    expected = autoregressive.generate(target, prompt, max_new_tokens=12).tokens
    d1 = HFModel(weights("tiny-llama", 0, "twin"), "d1")  # the target's weights: accepts every draft
    gen = cascade_drafting.generate(
        target,
        [d1],
        OracleMag(expected),
        prompt,
        K=[[1]],
        max_new_tokens=12,
        mag_tokens=mag_tokens,
        mag_tail=mag_tail,
    )
    assert gen.tokens == expected
    assert gen.steps == steps and gen.inner_steps["d1"] == d1_steps
    assert gen.forwards["target"]["forward_passes"] == len(steps)
    assert gen.forwards["d1"]["forward_passes"] == len(d1_steps)
    assert gen.forwards["mag"]["forward_passes"] == mag_calls
