"""HF ``generate`` as the peer baseline: the same tokens as our loops, and counts that line up with ours.

Tiny random-init float64 models over a 16-token vocabulary, ids and EOS fed directly. Prompts
contain token 0, the models' pad id, which HF's assistant once masked out as padding. Where HF's
counts differ from ours for a structural reason, the test asserts that relation exactly.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers.utils import logging as hf_logging

from specbench.decoding import autoregressive, hf_generate, speculative
from specbench.drafters.maxgram import MaxGramDrafter
from specbench.models.base import ModelDrafter
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams
from specbench.models.tiny import build_tiny

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 16
KINDS = ("tiny-llama", "tiny-t5")
MAX_NEW = 14
COUNTS = ("forward_passes", "tokens_scored", "encoder_passes")


@pytest.fixture
def weights(tiny_model):
    return lambda kind, seed: tiny_model(kind, seed, vocab_size=VOCAB)


def prompt_for(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([torch.randint(2, VOCAB, (2 + seed % 4,), generator=gen), torch.tensor([0, 5, 0])])


def counts(generation, name: str) -> tuple:
    return tuple(generation.forwards[name][c] for c in COUNTS)


def eos_in_output(target: HFModel, prompt: torch.Tensor) -> list[int]:
    """An EOS id that greedy decoding hits midway (so the run stops early)."""
    tokens = autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW).tokens
    return [tokens[MAX_NEW // 2]]


def ours_and_hf_assisted(target: HFModel, drafter_weights, prompt, k: int, eos=None):
    ours = speculative.generate(
        target,
        ModelDrafter(HFModel(drafter_weights, "drafter")),
        prompt,
        k=k,
        max_new_tokens=MAX_NEW,
        eos_token_id=eos,
    )
    hf = hf_generate.generate(
        target,
        prompt,
        max_new_tokens=MAX_NEW,
        sampling=SamplingParams(),
        eos_token_id=eos,
        assistant=HFModel(drafter_weights, "drafter"),
        k=k,
    )
    return ours, hf


@pytest.mark.parametrize("stop", ["max-length", "eos"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", KINDS)
def test_plain_generate_matches_autoregressive(weights, kind, seed, stop):
    target = HFModel(weights(kind, seed), "target")
    prompt = prompt_for(seed)
    eos = eos_in_output(target, prompt) if stop == "eos" else None
    ours = autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW, eos_token_id=eos)
    hf = hf_generate.generate(
        target, prompt, max_new_tokens=MAX_NEW, sampling=SamplingParams(), eos_token_id=eos
    )
    assert hf.tokens == ours.tokens
    assert hf.stopped_by_eos == ours.stopped_by_eos == (stop == "eos")
    assert hf.steps == [(0, 0)] * len(hf.tokens)
    assert counts(hf, "target") == counts(ours, "target")  # one pass per token, encoder apart
    assert 0 < hf.ttft <= hf.walltime


@pytest.mark.parametrize("k", [1, 3, 4, 13, 20])
@pytest.mark.parametrize("kind", KINDS)
def test_assisted_with_the_targets_own_weights_matches_our_speculative(weights, kind, k):
    """Same weights: every draft accepted, and HF needs exactly our passes: ceil(n / (k + 1)).

    Both cap a step's draft at the remaining budget minus one, so each step commits min(k + 1, left)
    tokens; the target scores every position but the last exactly once.
    """
    for seed in range(2):
        target = HFModel(weights(kind, seed), "target")
        prompt = prompt_for(seed)
        ours, hf = ours_and_hf_assisted(target, copy.deepcopy(target.model), prompt, k)
        assert (
            hf.tokens == ours.tokens == autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW).tokens
        )
        assert hf.steps == ours.steps
        assert all(drafted == accepted for drafted, accepted in hf.steps)
        passes = math.ceil(MAX_NEW / (k + 1))
        prefix = 1 if target.is_encoder_decoder else prompt.shape[0]
        encoder = int(target.is_encoder_decoder)
        assert counts(hf, "target") == counts(ours, "target") == (passes, prefix + MAX_NEW - 1, encoder)
        assert counts(hf, "drafter") == counts(ours, "drafter")
        assert hf.forwards["drafter"]["forward_passes"] == MAX_NEW - passes


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", KINDS)
def test_assisted_with_another_drafter_is_lossless_and_steps_match_ours(weights, kind, seed, k):
    """Rejections: same steps and target counts as ours; HF's drafter re-reads one token more per round
    after a rejection (it crops the assistant's cache to the committed length - 2, always)."""
    target = HFModel(weights(kind, seed), "target")
    prompt = prompt_for(seed)
    ours, hf = ours_and_hf_assisted(target, weights(kind, 100 + seed), prompt, k)
    assert hf.tokens == autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW).tokens
    assert hf.steps == ours.steps
    assert sum(accepted + 1 for _, accepted in hf.steps) == len(hf.tokens)
    assert any(accepted < drafted for drafted, accepted in hf.steps)
    assert counts(hf, "target") == counts(ours, "target")
    ours_drafter, hf_drafter = counts(ours, "drafter"), counts(hf, "drafter")
    rejected_then_drafted = sum(
        accepted < drafted and next_drafted > 0
        for (drafted, accepted), (next_drafted, _) in zip(hf.steps, hf.steps[1:], strict=False)
    )
    assert hf_drafter[0] == ours_drafter[0] and hf_drafter[2] == ours_drafter[2]
    assert hf_drafter[1] == ours_drafter[1] + rejected_then_drafted


@pytest.mark.parametrize("kind", KINDS)
def test_assisted_stops_at_eos(weights, kind):
    for seed in range(3):
        target = HFModel(weights(kind, seed), "target")
        prompt = prompt_for(seed)
        eos = eos_in_output(target, prompt)
        expected = autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW, eos_token_id=eos)
        for drafter in (copy.deepcopy(target.model), weights(kind, 100 + seed)):
            ours, hf = ours_and_hf_assisted(target, drafter, prompt, 3, eos)
            assert hf.tokens == expected.tokens and hf.stopped_by_eos
            assert sum(accepted + 1 for _, accepted in hf.steps) == len(hf.tokens)
            assert hf.forwards["target"]["forward_passes"] == len(hf.steps)


@pytest.mark.parametrize("kind", KINDS)
def test_byte_vocab_models_with_a_chat_prompt(kind):
    """build_tiny's byte-vocabulary models set their start/EOS/pad ids on ``config`` only (their
    generation_config keeps T5's start id 0), and the chat prompt holds EOS tokens: HF must still
    decode exactly like our loops."""
    model, tokenizer = build_tiny(kind, dtype=torch.float64, seed=0)
    target = HFModel(model, "target", tokenizer)
    text = "<s>user\nhello there</s>\n<s>assistant\n"
    prompt = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
    eos = target.eos_token_ids()
    assert set(eos) & set(prompt.tolist())
    expected = autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW, eos_token_id=eos).tokens
    plain = hf_generate.generate(
        target, prompt, max_new_tokens=MAX_NEW, sampling=SamplingParams(), eos_token_id=eos
    )
    assert plain.tokens == expected
    ours, hf = ours_and_hf_assisted(target, copy.deepcopy(model), prompt, 4, eos)
    assert hf.tokens == ours.tokens == expected
    assert hf.steps == ours.steps and all(drafted == accepted for drafted, accepted in hf.steps)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", range(4))
def test_prompt_lookup_matches_our_maxgram_speculative(weights, seed, k):
    """Decoder-only: HF's prompt lookup is our Max-Gram (max_ngram=2) step for step, except that HF
    does not cap a draft at the remaining budget: where ours drafts exactly the budget, HF may draft
    more (scoring tokens it then discards), accepting the same."""
    target = HFModel(weights("tiny-llama", seed), "target")
    prompt = prompt_for(seed).repeat(2)
    for max_new in (5, MAX_NEW, 30):
        ours = speculative.generate(
            target, MaxGramDrafter("lookup", max_ngram=2), prompt, k=k, max_new_tokens=max_new
        )
        hf = hf_generate.generate(
            target, prompt, max_new_tokens=max_new, sampling=SamplingParams(), prompt_lookup=True, k=k
        )
        assert hf.tokens == autoregressive.generate(target, prompt, max_new_tokens=max_new).tokens
        assert list(hf.forwards) == ["target"]
        assert hf.forwards["target"]["forward_passes"] == ours.forwards["target"]["forward_passes"]
        assert [a for _, a in hf.steps] == [a for _, a in ours.steps]
        generated = 0
        for (hf_drafted, accepted), (our_drafted, _) in zip(hf.steps, ours.steps, strict=True):
            budget = min(k, max_new - generated - 1)
            assert hf_drafted == our_drafted or (our_drafted == budget < hf_drafted)
            generated += accepted + 1


def test_prompt_lookup_on_t5_is_lossless(weights):
    """T5: HF looks up in the decoder's tokens only (ours also in the prompt), so only losslessness."""
    for seed in range(3):
        target = HFModel(weights("tiny-t5", seed), "target")
        prompt = prompt_for(seed)
        hf = hf_generate.generate(
            target, prompt, max_new_tokens=MAX_NEW, sampling=SamplingParams(), prompt_lookup=True, k=3
        )
        assert hf.tokens == autoregressive.generate(target, prompt, max_new_tokens=MAX_NEW).tokens
        assert sum(accepted + 1 for _, accepted in hf.steps) == len(hf.tokens)
        assert hf.forwards["target"]["forward_passes"] == len(hf.steps)
        assert hf.forwards["target"]["encoder_passes"] == 1


def test_t5_encoder_passes_are_counted_apart(weights):
    target = HFModel(weights("tiny-t5", 0), "target")
    assistant = HFModel(weights("tiny-t5", 100), "drafter")
    prompt = prompt_for(0)
    plain = hf_generate.generate(target, prompt, max_new_tokens=MAX_NEW, sampling=SamplingParams())
    assert counts(plain, "target")[::2] == (MAX_NEW, 1)
    assisted = hf_generate.generate(
        target, prompt, max_new_tokens=MAX_NEW, sampling=SamplingParams(), assistant=assistant, k=3
    )
    assert counts(assisted, "target")[::2] == (len(assisted.steps), 1)
    drafts = sum(drafted for drafted, _ in assisted.steps)
    assert counts(assisted, "drafter")[::2] == (drafts, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_hooks_settings_and_logging_are_restored(weights, kind):
    target = HFModel(weights(kind, 0), "target")
    assistant = HFModel(weights(kind, 100), "drafter")
    before = assistant.model.generation_config.to_dict()
    verbosity = hf_logging.get_verbosity()
    modules = [m for model in (target, assistant) for m in (model.model, *_encoder(model))]

    def assert_clean():
        for module in modules:
            assert not module._forward_hooks and not module._forward_pre_hooks
            assert not module._forward_hooks_with_kwargs and not module._forward_pre_hooks_with_kwargs
        assert assistant.model.generation_config.to_dict() == before
        assert hf_logging.get_verbosity() == verbosity

    for options in ({}, {"assistant": assistant}, {"prompt_lookup": True}):
        hf_generate.generate(target, prompt_for(0), max_new_tokens=4, sampling=SamplingParams(), **options)
        assert_clean()
    with pytest.raises(ValueError):  # HF rejects max_new_tokens=0 inside generate, hooks in place
        hf_generate.generate(
            target, prompt_for(0), max_new_tokens=0, sampling=SamplingParams(), assistant=assistant
        )
    assert_clean()


def _encoder(model: HFModel) -> list[torch.nn.Module]:
    return [model.model.get_encoder()] if model.is_encoder_decoder else []


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_follows_the_generator_and_leaves_the_global_rng_alone(weights, kind):
    target = HFModel(weights(kind, 0), "target")
    assistant = HFModel(weights(kind, 100), "drafter")
    sampling = SamplingParams(temperature=0.8, top_k=0, top_p=0.95)
    state = torch.get_rng_state()
    for options in ({}, {"assistant": assistant}, {"prompt_lookup": True}):
        runs = [
            hf_generate.generate(
                target,
                prompt_for(0),
                max_new_tokens=MAX_NEW,
                sampling=sampling,
                eos_token_id=[1],
                generator=torch.Generator().manual_seed(seed),
                **options,
            )
            for seed in (7, 7, 8, 9)
        ]
        assert runs[0].tokens == runs[1].tokens
        assert runs[0].tokens != runs[2].tokens or runs[0].tokens != runs[3].tokens
        for run in runs:
            assert sum(accepted + 1 for _, accepted in run.steps) == len(run.tokens) <= MAX_NEW
    assert torch.equal(torch.get_rng_state(), state)


def test_rejects_ambiguous_setups(weights):
    target = HFModel(weights("tiny-llama", 0), "target")
    same_module = HFModel(target.model, "drafter")
    with pytest.raises(ValueError, match="separate module"):
        hf_generate.generate(target, prompt_for(0), max_new_tokens=4, assistant=same_module)
    other = HFModel(weights("tiny-llama", 100), "drafter")
    with pytest.raises(ValueError, match="not both"):
        hf_generate.generate(target, prompt_for(0), max_new_tokens=4, assistant=other, prompt_lookup=True)
