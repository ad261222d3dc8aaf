"""Greedy speculative decoding is lossless: token for token what greedy autoregressive decoding emits.

Tiny random-init float64 models over a 16-token vocabulary, ids fed directly (no tokenizer). The
drafters cover every acceptance pattern: the target's own weights (everything accepted), a noisy
copy of the target (partial acceptance, so mid-draft rollbacks), an unrelated seed (mostly
rejected), and prompt lookup (one-hot q, variable-length and empty drafts).
"""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
import torch
from conftest import engine_model

from specbench.decoding import autoregressive, speculative
from specbench.decoding.acceptance import exact_rule
from specbench.drafters.maxgram import MaxGramDrafter
from specbench.models.base import ModelDrafter
from specbench.models.hf import HFModel

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 16
KINDS = ("tiny-llama", "tiny-t5", "tiny-llama/compiled")  # kind[/engine]: the compiled engine too
SEEDS = range(10)
KS = range(1, 9)
MAX_NEW = 14
DRAFTERS = ("self", "noisy-copy", "other-seed", "maxgram", "maxgram-2")


class Models:
    """Targets and drafters by (kind, seed); weights are built once per session."""

    def __init__(self, build):
        self.build = build
        self.noisy = {}

    def weights(self, kind: str, seed: int, noisy: bool = False) -> torch.nn.Module:
        kind = kind.split("/")[0]
        model = self.build(kind, seed, vocab_size=VOCAB)
        if noisy:
            if (kind, seed) in self.noisy:
                return self.noisy[kind, seed]
            model = self.noisy[kind, seed] = copy.deepcopy(model)
            gen = torch.Generator().manual_seed(20_000 + seed)
            with torch.no_grad():
                for param in model.parameters():
                    if param.numel() > 1:
                        noise = torch.randn(param.shape, generator=gen, dtype=param.dtype)
                        param.add_(0.08 * param.std() * noise)
        return model

    def target(self, kind: str, seed: int) -> HFModel:
        return engine_model(self.weights(kind, seed), "target", engine(kind))

    def drafter(self, name: str, kind: str, seed: int):
        if name == "self":  # a second wrapper (own KV cache) around the very same weights
            return ModelDrafter(engine_model(self.weights(kind, seed), "drafter", engine(kind)))
        if name == "noisy-copy":
            return ModelDrafter(engine_model(self.weights(kind, seed, noisy=True), "drafter", engine(kind)))
        if name == "other-seed":
            return ModelDrafter(engine_model(self.weights(kind, 100 + seed), "drafter", engine(kind)))
        if name == "maxgram":
            return MaxGramDrafter("drafter")
        if name == "maxgram-2":
            return MaxGramDrafter("drafter", max_ngram=2)
        raise AssertionError(name)


@pytest.fixture(scope="module")
def models(tiny_model):
    return Models(tiny_model)


def prompt_for(seed: int, repetitive: bool = False) -> torch.Tensor:
    """Prompt of length 1..10 (by seed); repetitive prompts give prompt lookup something to copy."""
    gen = torch.Generator().manual_seed(seed)
    length = 1 + seed % 10
    if repetitive:
        pattern = torch.randint(2, VOCAB, (2 + seed % 3,), generator=gen)
        return pattern.repeat(10)[:length]
    return torch.randint(2, VOCAB, (length,), generator=gen)


def engine(kind: str) -> str:
    return kind.split("/")[1] if "/" in kind else "eager"


def prefix_length(kind: str, prompt: torch.Tensor) -> int:
    """Positions a model's decoder holds before the generation: the prompt, or T5's start token."""
    return 1 if kind == "tiny-t5" else prompt.shape[0]


def check_bookkeeping(gen, *, kind, prompt, k, max_new_tokens, drafter_name, stats: Counter) -> None:
    """Per-step budget rule and forward counts that hold for every run, EOS or not."""
    generated = 0
    budgets = []
    for drafted, accepted in gen.steps:
        budget = min(k, max_new_tokens - generated - 1)
        budgets.append(budget)
        assert 0 <= accepted <= drafted <= max(budget, 0)
        if drafter_name not in ("maxgram", "maxgram-2"):
            assert drafted == budget  # a model drafter always drafts its full budget
        generated += accepted + 1
        stats["drafted"] += drafted
        stats["accepted"] += accepted
        stats["partial"] += 0 < accepted < drafted
        stats["rejected_first"] += drafted > 0 and accepted == 0
    assert len(gen.tokens) <= min(generated, max_new_tokens)

    target = gen.forwards["target"]
    drafter = gen.forwards["drafter"]
    # one target pass per step; it feeds the prefix once, then per step the previous step's last
    # token plus the new drafts (no position is ever recomputed)
    assert target["forward_passes"] == len(gen.steps)
    drafted_total = sum(d for d, _ in gen.steps)
    assert target["tokens_scored"] == prefix_length(kind, prompt) + drafted_total + len(gen.steps) - 1
    assert target["encoder_passes"] == (1 if kind == "tiny-t5" else 0)
    if drafter_name.startswith("maxgram"):
        assert drafter["forward_passes"] == sum(b > 0 for b in budgets)  # one lookup per proposal
    else:
        assert drafter["forward_passes"] == drafted_total  # one drafter pass per drafted token


@pytest.mark.parametrize("drafter_name", DRAFTERS)
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_speculative_reproduces_autoregressive(kind, drafter_name, models):
    stats = Counter()
    # the unrelated drafter is the slowest (k drafter passes for ~1 token per step): 5 seeds
    for seed in SEEDS[:5] if drafter_name == "other-seed" else SEEDS:
        prompt = prompt_for(seed, repetitive=drafter_name.startswith("maxgram"))
        target = models.target(kind, seed)
        expected = autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW)
        assert len(expected.tokens) == MAX_NEW
        for k in KS[seed % 2 :: 2]:  # half the draft lengths per seed, every one over 5 seeds
            drafter = models.drafter(drafter_name, kind, seed)
            gen = speculative.generate(target, drafter, prompt, k=k, max_new_tokens=MAX_NEW)
            assert gen.tokens == expected.tokens, f"seed={seed} k={k} steps={gen.steps}"
            assert not gen.stopped_by_eos
            # without EOS every step commits its accepted drafts plus one token, exactly the budget
            assert sum(a + 1 for _, a in gen.steps) == len(gen.tokens) == MAX_NEW
            check_bookkeeping(
                gen,
                kind=kind,
                prompt=prompt,
                k=k,
                max_new_tokens=MAX_NEW,
                drafter_name=drafter_name,
                stats=stats,
            )

    assert stats["drafted"] > 0
    if drafter_name == "self":
        assert stats["accepted"] == stats["drafted"]
    else:
        # both outcomes happen, so the rollback paths are exercised
        assert 0 < stats["accepted"] < stats["drafted"], stats
        assert stats["rejected_first"] > 0, stats
    if drafter_name in ("noisy-copy", "maxgram"):
        assert stats["partial"] > 0, stats  # rejection in the middle of a draft


@pytest.mark.parametrize("kind", KINDS)
def test_self_drafter_forward_counts_follow_the_budget_rule(kind, models):
    """Everything accepted: each step commits min(k + 1, M - generated) tokens (budget
    min(k, M - generated - 1) drafts + 1), so there are ceil(M / (k + 1)) steps = target passes,
    every step but the last drafts k, the last drafts M - (steps - 1)(k + 1) - 1, and the drafter
    runs once per drafted token: M - steps passes."""
    seed = 3
    prompt = prompt_for(seed)
    target = models.target(kind, seed)
    expected = autoregressive.generate(target, prompt, max_new_tokens=20).tokens
    for k in KS:
        for max_new in (1, 2, k - 1, k, k + 1, k + 2, 2 * k + 2, 2 * k + 3, 20):
            if max_new < 1:
                continue
            gen = speculative.generate(
                target, models.drafter("self", kind, seed), prompt, k=k, max_new_tokens=max_new
            )
            assert gen.tokens == expected[:max_new]
            steps = math.ceil(max_new / (k + 1))
            last = max_new - (steps - 1) * (k + 1) - 1
            assert gen.steps == [(k, k)] * (steps - 1) + [(last, last)]
            assert gen.forwards["target"]["forward_passes"] == steps
            assert gen.forwards["drafter"]["forward_passes"] == max_new - steps
            assert sum(a + 1 for _, a in gen.steps) == len(gen.tokens) == max_new


@pytest.mark.parametrize("drafter_name", ("self", "other-seed", "maxgram"))
@pytest.mark.parametrize("kind", KINDS)
def test_short_budgets(kind, drafter_name, models):
    """max_new_tokens = 1, 2, k, k + 1 (and 0): same tokens as autoregressive, budget respected."""
    stats = Counter()
    for seed in (0, 7):
        prompt = prompt_for(seed, repetitive=drafter_name == "maxgram")
        target = models.target(kind, seed)
        expected = autoregressive.generate(target, prompt, max_new_tokens=9).tokens
        for k in KS:
            for max_new in sorted({1, 2, k, k + 1}):
                gen = speculative.generate(
                    target, models.drafter(drafter_name, kind, seed), prompt, k=k, max_new_tokens=max_new
                )
                assert gen.tokens == expected[:max_new], f"seed={seed} k={k} max_new={max_new}"
                assert sum(a + 1 for _, a in gen.steps) == max_new
                check_bookkeeping(
                    gen,
                    kind=kind,
                    prompt=prompt,
                    k=k,
                    max_new_tokens=max_new,
                    drafter_name=drafter_name,
                    stats=stats,
                )
                if max_new == 1:  # no room for a draft: one plain target pass
                    assert gen.steps == [(0, 0)]
                    assert gen.forwards["drafter"]["forward_passes"] == 0
        drafter = models.drafter(drafter_name, kind, seed)
        gen = speculative.generate(target, drafter, prompt, k=3, max_new_tokens=0)
        assert gen.tokens == [] and gen.steps == []


def test_draft_length_must_be_positive(models):
    target, drafter = models.target("tiny-llama", 0), models.drafter("self", "tiny-llama", 0)
    with pytest.raises(ValueError):
        speculative.generate(target, drafter, prompt_for(0), k=0, max_new_tokens=4)


@pytest.mark.parametrize("kind", KINDS)
def test_explicit_greedy_rule_on_probabilities_is_lossless(kind, models):
    """A custom rule receives softmax probabilities instead of raw logits; greedy stays exact."""
    for seed in (1, 5):
        prompt = prompt_for(seed)
        target = models.target(kind, seed)
        expected = autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW).tokens
        for k in (2, 5):
            for name in ("noisy-copy", "maxgram"):
                gen = speculative.generate(
                    target,
                    models.drafter(name, kind, seed),
                    prompt,
                    k=k,
                    max_new_tokens=MAX_NEW,
                    rule=exact_rule(True),
                )
                assert gen.tokens == expected


@pytest.mark.parametrize("kind", KINDS)
def test_eos_stops_speculative_where_autoregressive_stops(kind, models):
    """Every token the greedy output contains, used as EOS: both decoders stop at its first
    occurrence, keep it, and agree on everything before it."""
    cases = 0
    for seed in (0, 6, 9):
        prompt = prompt_for(seed)
        target = models.target(kind, seed)
        free = autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW).tokens
        for eos in sorted(set(free)):
            stop = free.index(eos)
            ar = autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW, eos_token_id=eos)
            assert ar.tokens == free[: stop + 1] and ar.stopped_by_eos
            runs = (("self", 1 + stop % 8), ("noisy-copy", 3), ("other-seed", 2), ("maxgram", 4))
            for drafter_name, k in runs:
                gen = speculative.generate(
                    target,
                    models.drafter(drafter_name, kind, seed),
                    prompt,
                    k=k,
                    max_new_tokens=MAX_NEW,
                    eos_token_id=[eos, VOCAB + 5],
                )
                assert gen.tokens == ar.tokens, f"seed={seed} eos={eos} {drafter_name} k={k}"
                assert gen.stopped_by_eos
                check_bookkeeping(
                    gen,
                    kind=kind,
                    prompt=prompt,
                    k=k,
                    max_new_tokens=MAX_NEW,
                    drafter_name=drafter_name,
                    stats=Counter(),
                )
                cases += 1
        # an EOS that never comes: nothing changes
        gen = speculative.generate(
            target,
            models.drafter("noisy-copy", kind, seed),
            prompt,
            k=3,
            max_new_tokens=MAX_NEW,
            eos_token_id=VOCAB + 5,
        )
        assert gen.tokens == free and not gen.stopped_by_eos
    assert cases >= 8


@pytest.mark.parametrize("kind", KINDS)
def test_eos_inside_an_accepted_draft_block(kind, models):
    """With the self-drafter step b commits positions b(k+1) .. b(k+1)+k, the last one the bonus.
    An EOS at a draft position with more accepted drafts after it must cut the block right there."""
    found = 0
    max_new = 20
    for seed in SEEDS:
        if found >= 6:
            break
        prompt = prompt_for(seed)
        target = models.target(kind, seed)
        free = autoregressive.generate(target, prompt, max_new_tokens=max_new).tokens
        for k in (3, 4, 6):
            for eos in sorted(set(free)):
                stop = free.index(eos)
                block, offset = divmod(stop, k + 1)
                full_budget = block * (k + 1) + k + 1 <= max_new
                if not (full_budget and offset < k - 1):  # a draft, followed by accepted drafts
                    continue
                gen = speculative.generate(
                    target,
                    models.drafter("self", kind, seed),
                    prompt,
                    k=k,
                    max_new_tokens=max_new,
                    eos_token_id=eos,
                )
                assert gen.tokens == free[: stop + 1] and gen.stopped_by_eos
                assert gen.steps == [(k, k)] * (block + 1)
                committed = sum(a + 1 for _, a in gen.steps)
                assert len(gen.tokens) == committed - (k - offset)  # the tail of the block is dropped
                found += 1
    assert found >= 6, "too few EOS inside accepted blocks were exercised"
