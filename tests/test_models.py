"""The model interface: cached scoring equals a full forward, prompt lookup, sampling warps."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specbench.drafters.maxgram import MaxGramDrafter, longest_suffix_match
from specbench.models.base import LAST, Draft, LanguageModel
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

KINDS = ("tiny-llama", "tiny-t5")
VOCAB = 16


class FeedRecorder:
    """Wraps a transformers model and records how many positions each forward actually feeds."""

    def __init__(self, model):
        self.inner = model
        self.fed: list[int] = []

    def __call__(self, **kwargs):
        ids = kwargs.get("decoder_input_ids", kwargs.get("input_ids"))
        self.fed.append(ids.shape[1])
        return self.inner(**kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def full_logits(model, kind: str, prompt: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Row i: next-token logits after the prefix and tokens[:i], from one no-cache forward."""
    generated = torch.tensor(tokens, dtype=torch.long)
    with torch.no_grad():
        if kind == "tiny-t5":
            start = torch.tensor([model.config.decoder_start_token_id])
            decoder_ids = torch.cat([start, generated])[None]
            return model(input_ids=prompt[None], decoder_input_ids=decoder_ids, use_cache=False).logits[0]
        ids = torch.cat([prompt, generated])[None]
        return model(input_ids=ids, use_cache=False).logits[0, prompt.shape[0] - 1 :]


@pytest.mark.parametrize("kind", KINDS)
def test_cached_score_equals_full_forward_through_rollbacks(kind, tiny_model):
    weights = tiny_model(kind, 7, vocab_size=VOCAB)
    model = HFModel(weights, "m")
    assert isinstance(model, LanguageModel)
    recorder = model.model = FeedRecorder(model.model)
    rng = random.Random(kind)
    checked = rollbacks = 0
    for request in range(3):
        prompt = torch.tensor([rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 8))])
        prefix = 1 if kind == "tiny-t5" else prompt.shape[0]
        model.start(prompt)
        assert model.counter.encoder_passes == (request + 1 if kind == "tiny-t5" else 0)
        tokens: list[int] = []
        valid = 0  # positions of (prefix + tokens) whose cache entries are still correct
        for _ in range(25):
            # m new tokens; the last n are candidates (n may reach back before or stop short of
            # the new ones: committed tokens past a rollback point must be fed too)
            m = rng.randint(0, 4)
            tokens = tokens + [rng.randrange(VOCAB) for _ in range(m)]
            n = rng.randint(0, min(len(tokens), m + 1))
            passes, scored = model.counter.forward_passes, model.counter.tokens_scored
            logits = model.score(torch.tensor(tokens, dtype=torch.long), n).logits
            expected = full_logits(weights, kind, prompt, tokens)[len(tokens) - n :]
            assert logits.shape == (n + 1, VOCAB)
            torch.testing.assert_close(logits, expected, atol=1e-9, rtol=0)
            checked += 1

            total = prefix + len(tokens)
            feed = total - min(valid, total - n - 1)  # everything not validly cached, plus >= n + 1
            assert recorder.fed[-1] == feed
            assert model.counter.forward_passes == passes + 1
            assert model.counter.tokens_scored == scored + feed
            valid = total

            if rng.random() < 0.75:  # reject some candidates (or none), and forget them
                keep = rng.randint(0, len(tokens))
                model.rollback(keep)
                valid = min(valid, prefix + keep)
                tokens = tokens[:keep]
                rollbacks += 1
            if rng.random() < 0.3:  # a rollback past the end is a no-op
                model.rollback(len(tokens) + rng.randint(0, 3))
    assert model.counter.tokens_scored == sum(recorder.fed[-model.counter.forward_passes :])
    assert checked == 75 and rollbacks > 30


@pytest.mark.parametrize("kind", KINDS)
def test_replaced_continuation_is_scored_from_the_new_tokens(kind, tiny_model):
    """Score a draft, roll back into it, score a different draft of the same length: the second
    result must not depend on the first draft at all."""
    weights = tiny_model(kind, 3, vocab_size=VOCAB)
    model = HFModel(weights, "m")
    prompt = torch.tensor([5, 6, 7])
    model.start(prompt)
    model.score(torch.tensor([1, 2, 3, 4, 5]), 3)
    model.rollback(2)
    second = model.score(torch.tensor([1, 2, 9, 10, 11]), 3).logits
    fresh = HFModel(weights, "fresh")
    fresh.start(prompt)
    torch.testing.assert_close(
        second, fresh.score(torch.tensor([1, 2, 9, 10, 11]), 3).logits, atol=1e-9, rtol=0
    )
    torch.testing.assert_close(
        second, full_logits(weights, kind, prompt, [1, 2, 9, 10, 11])[2:], atol=1e-9, rtol=0
    )


def test_counter_reset_and_snapshot(tiny_model):
    model = HFModel(tiny_model("tiny-t5", 0, vocab_size=VOCAB), "m")
    model.start(torch.tensor([3, 4]))
    model.score(torch.tensor([], dtype=torch.long), 0)
    model.score(torch.tensor([5, 6]), 1)
    snap = model.counter.snapshot()
    assert (snap["forward_passes"], snap["tokens_scored"], snap["encoder_passes"]) == (2, 1 + 2, 1)
    assert snap["seconds"] >= snap["prefill_seconds"] > 0.0  # the encoder pass is the prompt's prefill
    assert snap["prefill_passes"] == 0  # the decoder's first pass fed one token: a decoding pass
    model.counter.reset()
    assert model.counter.snapshot() == {
        "forward_passes": 0,
        "tokens_scored": 0,
        "encoder_passes": 0,
        "seconds": 0.0,
    }


def test_the_prompts_prefill_is_timed_apart_from_decoding_passes(tiny_model, monkeypatch):
    """A decoder's pass on no cache over more than one token is the prefill; every later pass, and a
    one-token pass on no cache, decodes. Each pass takes 1 s on a fake clock here."""
    import specbench.models.base as base

    model = HFModel(tiny_model("tiny-llama", 0, vocab_size=VOCAB), "m")
    clock = iter(range(100))
    monkeypatch.setattr(base.time, "perf_counter", lambda: float(next(clock)))
    model.start(torch.tensor([3, 4, 5]))
    model.score(torch.tensor([6, 7]), 2)  # prompt and two candidates: the prefill
    model.score(torch.tensor([6, 7, 8]), 1)
    model.score(torch.tensor([6, 7, 8, 9]), 1)
    snap = model.counter.snapshot()
    assert (snap["forward_passes"], snap["prefill_passes"]) == (3, 1)
    assert (snap["seconds"], snap["prefill_seconds"]) == (3.0, 1.0)
    model.start(torch.tensor([3]))
    model.score(torch.tensor([], dtype=torch.long), 0)  # a one-token prompt costs as a decoding pass
    assert model.counter.snapshot()["prefill_passes"] == 1


# ---------------------------------------------------------------------------------------------
# prompt lookup


def brute_force_match(seq: list[int], max_ngram: int | None) -> tuple[int, int]:
    """Longest m (<= max_ngram) with seq[j:j+m] == seq[-m:] for some j + m < len(seq); leftmost j."""
    length = len(seq)
    longest = length - 1 if max_ngram is None else min(max_ngram, length - 1)
    for m in range(longest, 0, -1):
        for j in range(length - m):
            if seq[j : j + m] == seq[length - m :]:
                return m, j
    return 0, -1


@pytest.mark.parametrize(
    "seq, max_ngram, expected",
    [
        ([1, 2, 3, 9, 1, 2, 3], None, (3, 0)),
        ([1, 2, 3, 9, 1, 2, 3], 2, (2, 1)),
        ([1, 2, 3, 9, 1, 2, 3], 1, (1, 2)),
        ([4, 1, 2, 8, 1, 2, 6, 1, 2], None, (2, 1)),  # two earlier [1, 2]: the leftmost
        ([2, 3, 5, 1, 2, 3, 7, 1, 2, 3], None, (3, 3)),
        ([2, 3, 5, 1, 2, 3, 7, 1, 2, 3], 2, (2, 0)),  # the cap changes which occurrence is leftmost
        ([1, 1, 1, 1], None, (3, 0)),  # overlapping occurrence
        ([1, 2, 1, 2], None, (2, 0)),
        ([1, 2, 3, 4], None, (0, -1)),
        ([5], None, (0, -1)),
        ([], None, (0, -1)),
        ([7, 7], None, (1, 0)),
    ],
)
def test_longest_suffix_match_hand_examples(seq, max_ngram, expected):
    assert longest_suffix_match(torch.tensor(seq, dtype=torch.long), max_ngram) == expected
    assert brute_force_match(seq, max_ngram) == expected


def test_longest_suffix_match_agrees_with_brute_force():
    rng = random.Random(0)
    for _ in range(400):
        seq = [rng.randrange(3) for _ in range(rng.randint(0, 14))]
        for cap in (None, 1, 2, 3):
            found = longest_suffix_match(torch.tensor(seq, dtype=torch.long), cap)
            assert found == brute_force_match(seq, cap), (seq, cap)


def propose(drafter: MaxGramDrafter, prompt: list[int], tokens: list[int], k: int) -> Draft:
    drafter.start(torch.tensor(prompt, dtype=torch.long))
    return drafter.propose(torch.tensor(tokens, dtype=torch.long), k, SamplingParams(), None)


def test_maxgram_proposes_the_continuation_of_the_match():
    drafter = MaxGramDrafter()
    assert drafter.num_parameters == 0
    draft = propose(drafter, [1, 2, 3, 9], [1, 2, 3], 3)  # sequence 1 2 3 9 1 2 3: match at 0
    assert draft.tokens.tolist() == [9, 1, 2] and draft.q is None and len(draft) == 3
    assert draft.tokens.dtype == torch.long

    def copy(prompt, tokens, k, **options):
        return propose(MaxGramDrafter(**options), prompt, tokens, k).tokens.tolist()

    assert copy([1, 2, 3, 9], [1, 2, 3], 1) == [9]
    assert copy([1, 2, 3, 9], [1, 2, 3], 8) == [9, 1, 2, 3]  # the copy stops at the sequence end
    assert copy([1, 2, 3, 9, 1], [2, 3], 3) == [9, 1, 2]  # match spans prompt and generation
    assert copy([], [4, 1, 2, 8, 1, 2, 6, 1, 2], 3) == [8, 1, 2]  # leftmost of two occurrences
    assert copy([2, 3, 5, 1, 2, 3, 7, 1, 2, 3], [], 3) == [7, 1, 2]
    assert copy([2, 3, 5, 1, 2, 3, 7, 1, 2, 3], [], 3, max_ngram=2) == [5, 1, 2]
    assert copy([1, 2, 3, 9], [1, 2, 3], 3, max_copy=2) == [9, 1]
    none = propose(drafter, [1, 2], [3, 4], 3)
    assert none.tokens.tolist() == [] and none.tokens.dtype == torch.long and len(none) == 0
    assert copy([5], [], 3) == []


def test_maxgram_counts_calls_and_fills_short_copies():
    calls = []

    class StubFill:
        def start(self, prompt_ids):
            calls.append(("start", prompt_ids.tolist()))

        def rollback(self, n_tokens):
            calls.append(("rollback", n_tokens))

        def propose(self, tokens, k, sampling, generator):
            calls.append(("propose", tokens.tolist(), k))
            return Draft(torch.arange(100, 100 + k), None)

    drafter = MaxGramDrafter(fill=StubFill())
    drafter.start(torch.tensor([1, 2, 3, 9]))
    full = drafter.propose(torch.tensor([1, 2, 3]), 3, SamplingParams(), None)
    assert full.tokens.tolist() == [9, 1, 2]  # a full copy needs no fill
    short = drafter.propose(torch.tensor([1, 2, 3]), 6, SamplingParams(), None)
    assert short.tokens.tolist() == [9, 1, 2, 3, 100, 101]
    empty = drafter.propose(torch.tensor([4]), 2, SamplingParams(), None)
    assert empty.tokens.tolist() == [100, 101]
    drafter.rollback(2)
    assert calls == [
        ("start", [1, 2, 3, 9]),
        ("propose", [1, 2, 3, 9, 1, 2, 3], 2),  # the generation plus the copy it continues
        ("propose", [4], 2),
        ("rollback", 2),
    ]
    assert drafter.counter.forward_passes == 3


# ---------------------------------------------------------------------------------------------
# sampling warps

BASE = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
LOGITS = BASE.log()


def dist(*values) -> torch.Tensor:
    out = torch.tensor(values, dtype=torch.float64)
    return out / out.sum()


@pytest.mark.parametrize(
    "params, expected",
    [
        (SamplingParams(), BASE),  # greedy: the plain softmax, for lenient rules only
        (SamplingParams(temperature=1.0), BASE),
        (SamplingParams(temperature=0.5), dist(0.25, 0.09, 0.0225, 0.0025)),  # p^(1/T)
        (SamplingParams(temperature=2.0), dist(*BASE.sqrt().tolist())),
        (SamplingParams(temperature=1.0, top_k=2), dist(0.5, 0.3, 0, 0)),
        (SamplingParams(temperature=1.0, top_k=1), dist(1, 0, 0, 0)),
        (SamplingParams(temperature=1.0, top_k=4), BASE),
        (SamplingParams(temperature=1.0, top_k=9), BASE),
        (SamplingParams(temperature=1.0, top_p=0.3), dist(1, 0, 0, 0)),  # always keeps the top token
        (SamplingParams(temperature=1.0, top_p=0.75), dist(0.5, 0.3, 0, 0)),
        (SamplingParams(temperature=1.0, top_p=0.9), dist(0.5, 0.3, 0.15, 0)),
        (SamplingParams(temperature=1.0, top_p=0.97), BASE),
        # top-k first, then top-p on the renormalised top-k mass: 0.5 + 0.3 = 0.842 of it >= 0.83
        (SamplingParams(temperature=1.0, top_k=3, top_p=0.83), dist(0.5, 0.3, 0, 0)),
        (SamplingParams(temperature=1.0, top_k=3, top_p=0.9), dist(0.5, 0.3, 0.15, 0)),
        # T = 2: p ~ sqrt(base) = .379 .294 .208 .120, so top-p 0.6 keeps two tokens
        (SamplingParams(temperature=2.0, top_p=0.6), dist(math.sqrt(0.5), math.sqrt(0.3), 0, 0)),
    ],
)
def test_sampling_probs_hand_examples(params, expected):
    torch.testing.assert_close(params.probs(LOGITS), expected, atol=1e-12, rtol=0)
    # the same row in a permuted vocabulary order, and inside a batch of rows
    order = torch.tensor([2, 0, 3, 1])
    torch.testing.assert_close(params.probs(LOGITS[order]), expected[order], atol=1e-12, rtol=0)
    batch = params.probs(torch.stack([LOGITS, LOGITS[order]]))
    torch.testing.assert_close(batch, torch.stack([expected, expected[order]]), atol=1e-12, rtol=0)


def test_choose_is_argmax_when_greedy_and_samples_the_warped_row_otherwise():
    greedy = SamplingParams()
    assert greedy.greedy and int(greedy.choose(greedy.probs(LOGITS), LOGITS, None)) == 0
    params = SamplingParams(temperature=1.0, top_k=2)
    gen = torch.Generator().manual_seed(0)
    probs = params.probs(LOGITS)
    drawn = {int(params.choose(probs, LOGITS, gen)) for _ in range(200)}
    assert drawn == {0, 1}


def test_every_drafter_proposes_nothing_for_k_0(tiny_model):
    """k = 0 (one token left to generate): an empty draft and no counted pass, whatever the drafter."""
    from specbench.decoding.specdecpp import AcceptanceHead, OracleDrafter, SpecDecPPDrafter
    from specbench.drafters.bigram import BigramDrafter, BigramTable
    from specbench.models.base import ModelDrafter

    weights = tiny_model("tiny-llama", 0)
    prompt, generated = torch.tensor([1, 2, 3]), torch.tensor([4, 5])
    hidden = weights.config.hidden_size
    drafters = [
        ModelDrafter(HFModel(weights, "draft")),
        MaxGramDrafter(fill=BigramDrafter(BigramTable(torch.arange(1, 17) % 16))),
        BigramDrafter(BigramTable(torch.arange(1, 17) % 16)),
        SpecDecPPDrafter(HFModel(weights, "head-draft"), AcceptanceHead(hidden, 1), threshold=0.5),
        OracleDrafter(HFModel(weights, "oracle"), prompt, [4, 5, 6, 7]),
    ]
    for drafter in drafters:
        drafter.start(prompt)
        before = drafter.counter.forward_passes
        draft = drafter.propose(generated, 0, SamplingParams(), None)
        assert len(draft) == 0 and draft.tokens.dtype == torch.long, type(drafter).__name__
        assert drafter.counter.forward_passes == before, type(drafter).__name__


def full_hidden(model, kind: str, prompt: torch.Tensor, tokens: list[int]) -> tuple[torch.Tensor, ...]:
    """Every layer's hidden states from one no-cache forward, rows aligned with :func:`full_logits`."""
    generated = torch.tensor(tokens, dtype=torch.long)
    with torch.no_grad():
        if kind == "tiny-t5":
            start = torch.tensor([model.config.decoder_start_token_id])
            decoder_ids = torch.cat([start, generated])[None]
            out = model(input_ids=prompt[None], decoder_input_ids=decoder_ids, output_hidden_states=True)
            return tuple(state[0] for state in out.decoder_hidden_states)
        ids = torch.cat([prompt, generated])[None]
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        return tuple(state[0, prompt.shape[0] - 1 :] for state in out.hidden_states)


@pytest.mark.parametrize("kind", KINDS)
def test_a_pass_returns_the_named_layers_hidden_states_at_the_scored_positions(kind, tiny_model):
    weights = tiny_model(kind, 7, vocab_size=VOCAB, layers=3)
    model = HFModel(weights, "m")
    prompt, tokens = torch.tensor([3, 4, 5]), [1, 2, 9, 10, 11]
    model.start(prompt)
    plain = model.score(torch.tensor(tokens[:2]), 1)
    assert plain.hidden == {}  # nothing asked, nothing computed
    model.rollback(1)
    scored = model.score(torch.tensor(tokens), 3, hidden=(LAST, 0, 2))  # cached prefix, 4 fed positions
    states = full_hidden(weights, kind, prompt, tokens)
    assert set(scored.hidden) == {LAST, 0, 2}
    for layer, expected in ((LAST, states[-1]), (0, states[0]), (2, states[2])):
        torch.testing.assert_close(scored.hidden[layer], expected[-4:], atol=1e-9, rtol=0)
    # the last state is what the LM head reads: the logits come from it
    head = weights.get_output_embeddings()
    if kind == "tiny-llama":
        with torch.inference_mode():
            torch.testing.assert_close(head(scored.hidden[LAST]), scored.logits, atol=1e-9, rtol=0)
    for bad in (3, -1, "middle", True):
        model.rollback(4)
        with pytest.raises(ValueError, match=r"no hidden layer .* ask for 'last' or a layer from 0 to 2"):
            model.score(torch.tensor(tokens), 0, hidden=(bad,))
