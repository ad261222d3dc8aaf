"""SpecDec++ (Huang et al. 2024): the acceptance head, its training data, the stopping rule, losslessness,
the Lemma 2.1 oracle, HF's adaptive baselines, and the recipes.

Tiny random-init float64 Llamas, ids fed directly (vocabulary 16, or 4 for the chi-square test).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import ENGINES, engine_model
from rich.progress import Progress
from scipy.stats import chisquare

from specbench.decoding import autoregressive, hf_generate, speculative
from specbench.decoding.specdecpp import OracleDrafter, SpecDecPPDrafter, should_stop
from specbench.drafters import acceptance_head
from specbench.drafters.acceptance_head import AcceptanceHead
from specbench.errors import SpecbenchError
from specbench.methods import METHODS, Request
from specbench.models.base import ModelDrafter
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams
from specbench.papers.specdecpp import head_data
from specbench.papers.specdecpp import training as specdecpp
from specbench.papers.specdecpp.efficiency import discard_verification_rates, time_per_token
from specbench.papers.specdecpp.train_config import TrainConfig
from specbench.recipe import load_recipe, parse_recipe
from specbench.tasks import TASKS

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 16
HIDDEN = 32  # tiny-llama's hidden size
RECIPES = Path(__file__).resolve().parent.parent / "recipes" / "specdecpp"


def noisy(model: torch.nn.Module, seed: int, scale: float = 0.15) -> torch.nn.Module:
    """A perturbed copy of ``model``: a drafter that agrees with it often but not always."""
    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(30_000 + seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.numel() > 1:
                param.add_(scale * param.std() * torch.randn(param.shape, generator=gen, dtype=param.dtype))
    return model


def prompt_for(seed: int, vocab: int = VOCAB) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (2 + seed % 5,), generator=gen)


def random_head(seed: int, depth: int = 2) -> AcceptanceHead:
    torch.manual_seed(seed)
    head = AcceptanceHead(HIDDEN, depth)
    with torch.no_grad():
        head.out.bias.fill_(1.0)  # predictions spread around 0.5-0.9: rounds of varied length
    return head


# -- the head ----------------------------------------------------------------------------------


def test_head_shapes_and_depth_zero_is_one_linear_layer():
    head = AcceptanceHead(HIDDEN, 3)
    x = torch.randn(5, HIDDEN)
    assert head(x).shape == (5,) and head(x[0]).shape == ()
    p = head.probability(x.double())
    assert p.dtype == torch.float32 and bool(((p > 0) & (p < 1)).all())
    assert len(head.blocks) == 3 and len({id(b.linear.weight) for b in head.blocks}) == 3  # own weights
    linear = AcceptanceHead(HIDDEN, 0)
    assert len(linear.blocks) == 0 and sum(p.numel() for p in linear.parameters()) == HIDDEN + 1
    expected = torch.sigmoid(x @ linear.out.weight[0] + linear.out.bias[0])
    torch.testing.assert_close(linear.probability(x), expected)
    # D = 3 by hand: h <- h + SiLU(W_d h + b_d) three times, then a linear read-out and a sigmoid
    h = x
    for block in head.blocks:
        z = h @ block.linear.weight.T + block.linear.bias
        h = h + z / (1 + torch.exp(-z))
    expected = 1 / (1 + torch.exp(-(h @ head.out.weight[0] + head.out.bias[0])))
    torch.testing.assert_close(head.probability(x), expected)


# -- training data -----------------------------------------------------------------------------


def _examples(n: int, length: int, seed: int = 0) -> list[head_data.Example]:
    gen = torch.Generator().manual_seed(seed)
    return [
        head_data.Example(
            torch.randint(2, VOCAB, (2 + i % 4,), generator=gen),
            torch.randint(2, VOCAB, (length,), generator=gen),
        )
        for i in range(n)
    ]


@pytest.fixture
def pair(tiny_model):
    target = tiny_model("tiny-llama", 0, vocab_size=VOCAB)
    return target, noisy(target, 0)


def _build(pair, examples, finished=None, on_batch=None, **overrides):
    config = TrainConfig(**({"teacher_batch": 3} | overrides))
    with Progress(disable=True) as progress:
        return head_data.build_examples(
            pair[0], pair[1], examples, config, progress, finished=finished, on_batch=on_batch
        )


def test_labels_are_min_one_p_over_q_and_only_draft_tokens_are_supervised(pair):
    target, drafter = pair
    examples = _examples(5, 9)
    features = _build(pair, examples)
    for e, feats in zip(examples, features, strict=True):
        a, m = e.prompt.shape[0], e.response.shape[0]
        full = torch.cat([e.prompt, e.response])[None]
        with torch.no_grad():
            p = torch.softmax(target(full).logits[0, a - 1 : a + m - 1], -1)
            q = torch.softmax(drafter(full).logits[0, a - 1 : a + m - 1], -1)
        rows = torch.arange(m)
        expected = torch.minimum(torch.ones(m, dtype=torch.float64), p[rows, e.draft] / q[rows, e.draft])
        torch.testing.assert_close(e.label, expected, rtol=1e-12, atol=1e-12)
        assert torch.equal(e.mixed, torch.where(e.keep, e.response, e.draft))
        # one feature per draft (Z) position, none for the target's kept tokens: the loss sees Z only
        assert feats.shape == (int((~e.keep).sum()), HIDDEN)
        with torch.no_grad():
            hidden = drafter(torch.cat([e.prompt, e.mixed])[None], output_hidden_states=True).hidden_states[
                -1
            ]
        torch.testing.assert_close(feats, hidden[0, a : a + m][~e.keep].float())


def test_mixing_ratio_is_respected_in_expectation(pair):
    for r in (0.15, 0.6):
        examples = _examples(20, 60, seed=1)
        _build(pair, examples, mixing_ratio=r)
        kept = torch.cat([e.keep for e in examples]).double()
        assert abs(float(kept.mean()) - r) < 4 * math.sqrt(r * (1 - r) / kept.numel())


def test_draft_tokens_are_samples_of_q_on_the_targets_prefix(pair):
    """Z_i ~ q_i(. | x, Y_<i): 800 copies of one (x, Y), each with its own seed, against q by chi-square."""
    prompt, response = prompt_for(2), torch.tensor([5, 9, 3])
    examples = [head_data.Example(prompt, response) for _ in range(800)]
    _build(pair, examples, teacher_batch=200)
    a = prompt.shape[0]
    with torch.no_grad():
        logits = pair[1](torch.cat([prompt, response])[None]).logits[0, a - 1 : a + 2]
    q = torch.softmax(logits, -1)
    for i in range(3):
        counts = torch.bincount(torch.stack([e.draft[i] for e in examples]), minlength=VOCAB)
        expected = 800 * q[i]
        big = expected >= 5  # pool the rare tokens into one cell
        observed = [*counts[big].tolist(), int(counts[~big].sum())]
        wanted = [*expected[big].tolist(), float(expected[~big].sum())]
        assert chisquare(observed, wanted).pvalue > 1e-3


def test_draft_samples_do_not_depend_on_the_batching(pair):
    one, other = _examples(7, 8), _examples(7, 8)
    features = _build(pair, one, teacher_batch=2)
    again = _build(pair, other, teacher_batch=7)
    for a, b, fa, fb in zip(one, other, features, again, strict=True):
        assert torch.equal(a.draft, b.draft) and torch.equal(a.keep, b.keep)
        torch.testing.assert_close(a.label, b.label)
        torch.testing.assert_close(fa, fb)


def test_training_is_deterministic_to_the_byte(pair, tmp_path):
    examples = _examples(10, 12)
    features = _build(pair, examples)
    labels = [e.label[~e.keep] for e in examples]
    config = TrainConfig(epochs=2, batch_size=4, lr=1e-2)
    digests = []
    for run in range(2):
        with Progress(disable=True) as progress:
            head, record = specdecpp.train_head(features, labels, config, progress)
        out = acceptance_head.save_head(head, {"hidden_size": HIDDEN, "depth": 3}, tmp_path / f"run{run}")
        digests.append(hashlib.sha256((out / acceptance_head.HEAD_FILE).read_bytes()).hexdigest())
    assert digests[0] == digests[1] and record["steps"] == 6
    scores = specdecpp.evaluate(head, features, labels)
    assert 0 <= scores["binary_kl"] and 0 <= scores["accuracy"] <= 1


def test_binary_kl_and_weighted_bce():
    y = torch.tensor([1.0, 0.0, 0.25, 0.5])
    p = torch.tensor([0.5, 0.5, 0.25, 0.9])
    kl = specdecpp.binary_kl(y, p)
    assert kl[2] == pytest.approx(0.0, abs=1e-9) and kl[0] == pytest.approx(math.log(2))
    assert kl[3] == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1))
    logits = torch.logit(p)
    loss = specdecpp.weighted_bce(logits, y, 1.0, 6.0)
    manual = -(y * p.log() + 6 * (1 - y) * (1 - p).log()).sum() / (y.sum() + 6 * (1 - y).sum())
    assert float(loss) == pytest.approx(float(manual))


# -- the stopping rule -------------------------------------------------------------------------


class ScriptedHead(torch.nn.Module):
    """Hand-set predictions p̂_1, p̂_2, ... in the order the drafter asks for them."""

    def __init__(self, predictions: list[float]):
        super().__init__()
        self.hidden_size, self.predictions, self.calls = HIDDEN, list(predictions), 0

    def probability(self, hidden: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.tensor(self.predictions[self.calls - 1], dtype=torch.float64)


@pytest.mark.parametrize(
    "predictions, threshold, min_length, max_length, expected",
    [
        ([0.9] * 10, 0.3, 2, 20, 5),  # 1 - 0.9^4 = 0.344 > 0.3 after candidate 5 (release timing)
        ([0.9] * 10, 0.5, 2, 20, 8),  # 1 - 0.9^7 = 0.522
        ([0.1] * 10, 0.3, 2, 20, 2),  # stops at the lower bound
        ([0.1] * 10, 0.3, 4, 20, 4),  # ... which is inclusive
        ([1.0] * 10, 0.3, 2, 6, 6),  # never predicted to fail: the upper bound
        ([0.99, 0.5, 0.5], 0.0, 1, 20, 2),  # h = 0: stop as soon as a prediction exists
        ([0.95, 0.95, 0.2, 0.9], 0.3, 2, 20, 4),
    ],
)
def test_stop_positions_from_hand_set_predictions(
    tiny_model, predictions, threshold, min_length, max_length, expected
):
    assert should_stop(predictions, threshold, min_length, max_length) == expected
    head = ScriptedHead(predictions)
    model = HFModel(tiny_model("tiny-llama", 0, vocab_size=VOCAB), "drafter")
    drafter = SpecDecPPDrafter(model, head, threshold=threshold, min_length=min_length)
    prompt = prompt_for(3)
    drafter.start(prompt)
    draft = drafter.propose(torch.empty(0, dtype=torch.long), max_length, SamplingParams(), None)
    assert len(draft) == expected and draft.q.shape == (expected, VOCAB)
    assert head.calls == expected - 1  # p̂ of candidates 1..n-1: the pass that fed candidate n is never run
    assert model.counter.forward_passes == expected


class RecordingHead(AcceptanceHead):
    """A real head that keeps every hidden state the drafter shows it."""

    def __init__(self, hidden_size: int, depth: int):
        super().__init__(hidden_size, depth)
        self.seen: list[torch.Tensor] = []

    def probability(self, hidden: torch.Tensor) -> torch.Tensor:
        self.seen.append(hidden.clone())
        return super().probability(hidden)


def test_the_head_reads_at_inference_what_training_feeds_it(tiny_model):
    """At inference the head gets the draft's final hidden state at candidate Y_i's own position, the
    feature build_examples computes for Z_i; the round length then follows by hand from those p̂."""
    weights = tiny_model("tiny-llama", 2, vocab_size=VOCAB)
    model = HFModel(weights, "drafter")
    lengths = set()
    for seed, threshold in itertools.product(range(3), (0.3, 0.6, 0.9)):
        torch.manual_seed(seed)
        head = RecordingHead(HIDDEN, 2)
        with torch.no_grad():
            head.out.bias.fill_(1.5)
        drafter = SpecDecPPDrafter(model, head, threshold=threshold, min_length=2)
        prompt = prompt_for(seed)
        drafter.start(prompt)
        draft = drafter.propose(torch.empty(0, dtype=torch.long), 12, SamplingParams(), None)
        n, a = len(draft), prompt.shape[0]
        with torch.no_grad():
            features = head_data._hidden(weights, [torch.cat([prompt, draft.tokens])])[0, a : a + n]
            p_hat = AcceptanceHead.probability(head, features).tolist()  # p̂_1, ..., p̂_n
        torch.testing.assert_close(torch.stack(head.seen), features[: n - 1])
        assert n == should_stop(p_hat, threshold, 2, 12)
        lengths.add(n)
    assert len(lengths) >= 3


def test_an_eos_candidate_ends_the_round(tiny_model):
    model = HFModel(tiny_model("tiny-llama", 0, vocab_size=VOCAB), "drafter")
    prompt = prompt_for(4)
    first = ModelDrafter(model)
    first.start(prompt)
    token = int(first.propose(torch.empty(0, dtype=torch.long), 1, SamplingParams(), None).tokens[0])
    drafter = SpecDecPPDrafter(model, ScriptedHead([1.0] * 8), threshold=0.3, eos_token_id=[token])
    drafter.start(prompt)
    assert len(drafter.propose(torch.empty(0, dtype=torch.long), 8, SamplingParams(), None)) == 1


# -- losslessness ------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_greedy_specdecpp_matches_autoregressive_token_for_token(engine, tiny_model):
    lengths = Counter()
    for seed in range(4):
        weights = tiny_model("tiny-llama", seed, vocab_size=VOCAB)
        target = engine_model(weights, "target", engine)
        draft_model = engine_model(noisy(weights, seed), "drafter", engine)
        for threshold, (low, high), depth in itertools.product((0.1, 0.5, 0.9), ((1, 6), (2, 20)), (0, 3)):
            prompt = prompt_for(seed)
            expected = autoregressive.generate(target, prompt, max_new_tokens=20).tokens
            drafter = SpecDecPPDrafter(
                draft_model, random_head(seed, depth), threshold=threshold, min_length=low
            )
            got = speculative.generate(target, drafter, prompt, k=high, max_new_tokens=20)
            assert got.tokens == expected
            lengths.update(d for d, _ in got.steps)
            # Eq. 2.1-2.3 hold for the counted passes: n candidates cost n draft passes
            n_draft = got.forwards["drafter"]["forward_passes"]
            n_target = got.forwards["target"]["forward_passes"]
            assert n_draft == sum(d for d, _ in got.steps) and n_target == len(got.steps)
            r_discard, r_verify = discard_verification_rates(got.steps, len(got.tokens))
            assert 20 * time_per_token(0.02, 0.1, r_discard, r_verify) == pytest.approx(
                0.02 * n_draft + 0.1 * n_target
            )
    assert len(lengths) >= 5  # the rounds really had adaptive lengths


@pytest.mark.parametrize("engine", ENGINES)
def test_sampled_specdecpp_preserves_the_target_distribution(engine, tiny_model):
    vocab, runs, new = 4, 2000, 3
    weights = tiny_model("tiny-llama", 7, vocab_size=vocab, init_std=0.3)
    target = engine_model(weights, "target", engine, (3,))
    drafter_model = engine_model(noisy(weights, 7, scale=0.6), "drafter", engine, (3,))
    drafter = SpecDecPPDrafter(drafter_model, random_head(7, 1), threshold=0.4, min_length=1)
    sampling = SamplingParams(temperature=1.0)
    prompt = prompt_for(5, vocab)
    # exact distribution of the first `new` tokens under the target
    exact = {}
    with torch.no_grad():
        for seq in itertools.product(range(vocab), repeat=new):
            ids = torch.cat([prompt, torch.tensor(seq[:-1])])[None]
            probs = torch.softmax(weights(ids).logits[0, prompt.shape[0] - 1 :], -1)
            exact[seq] = math.prod(float(probs[i, t]) for i, t in enumerate(seq))
    generator = torch.Generator().manual_seed(0)
    counts, lengths = Counter(), Counter()
    for _ in range(runs):
        out = speculative.generate(
            target, drafter, prompt, k=3, max_new_tokens=new + 1, sampling=sampling, generator=generator
        )
        counts[tuple(out.tokens[:new])] += 1
        lengths.update(d for d, _ in out.steps)
    cells = sorted(exact)
    observed = [counts[c] for c in cells]
    expected = [exact[c] * runs for c in cells]
    assert sum(observed) == runs and len(lengths) >= 2
    assert chisquare(observed, expected).pvalue > 1e-3


# -- the oracle of Lemma 2.1 -------------------------------------------------------------------


def _agreement_by_hand(draft_weights, prompt: torch.Tensor, reference: list[int], g: int) -> int:
    """Draft greedily from prompt + reference[:g], one full forward per token, until it disagrees."""
    n = 0
    with torch.no_grad():
        while g + n < len(reference):
            ids = torch.cat([prompt, torch.tensor(reference[: g + n], dtype=torch.long)])[None]
            if int(draft_weights(ids).logits[0, -1].argmax()) != reference[g + n]:
                break
            n += 1
    return n


def test_oracle_drafts_exactly_the_agreement_lengths(tiny_model):
    for seed in range(3):
        weights = tiny_model("tiny-llama", seed, vocab_size=VOCAB)
        draft_weights = noisy(weights, seed)
        target, draft_model = HFModel(weights, "target"), HFModel(draft_weights, "drafter")
        prompt = prompt_for(seed)
        reference = autoregressive.generate(target, prompt, max_new_tokens=24).tokens
        oracle = OracleDrafter(draft_model, prompt, reference)
        out = speculative.generate(target, oracle, prompt, k=24, max_new_tokens=24)
        assert out.tokens == reference
        assert all(d == a for d, a in out.steps)  # nothing is ever discarded (N_discard = 0)
        g = 0
        for d, a in out.steps:
            budget = 24 - g - 1
            assert d == min(budget, _agreement_by_hand(draft_weights, prompt, reference, g))
            g += a + 1
        # the drafter's passes are exactly the drafted tokens (the hindsight pass is not counted)
        assert out.forwards["drafter"]["forward_passes"] == sum(d for d, _ in out.steps)
        # and through the method table, with the reference ids the runner passes
        request = Request(prompt, 24, SamplingParams(), [], torch.Generator(), reference_ids=reference)
        assert METHODS["oracle_sd"].run({}, target, draft_model, request).tokens == reference


def _oracle_pair(tiny_model, seed: int):
    """A tiny target, its noisy drafter, a prompt, the target's greedy output and a reference that
    leaves it at token 6 (as a bf16 near-tie makes it)."""
    weights = tiny_model("tiny-llama", seed, vocab_size=VOCAB)
    target, draft_model = HFModel(weights, "target"), HFModel(noisy(weights, seed), "drafter")
    prompt = prompt_for(seed)
    greedy = autoregressive.generate(target, prompt, max_new_tokens=24).tokens
    wrong = greedy[:6] + [(greedy[6] + 1) % VOCAB] + greedy[7:]
    return target, draft_model, prompt, greedy, wrong


def test_the_oracle_rederives_its_hindsight_when_the_run_leaves_the_reference(tiny_model):
    # a reference that is not the target's greedy output (as a bf16 near-tie makes it, from the tie on):
    # a run on it follows the target off the reference, where its lengths no longer fit; the row is
    # the run whose reference is its own output, round for round the oracle on the true greedy output
    target, draft_model, prompt, greedy, wrong = _oracle_pair(tiny_model, 0)

    def run(reference):
        return speculative.generate(
            target, OracleDrafter(draft_model, prompt, reference), prompt, k=24, max_new_tokens=24
        )

    exact, stale = run(greedy), run(wrong)
    assert stale.tokens == greedy and stale.steps != exact.steps
    request = Request(prompt, 24, SamplingParams(), [], torch.Generator(), reference_ids=wrong)
    out = METHODS["oracle_sd"].run({}, target, draft_model, request)
    assert out.tokens == greedy and out.steps == exact.steps
    assert out.forwards["drafter"]["forward_passes"] == sum(d for d, _ in out.steps)


def test_the_oracle_follows_the_reference_the_committed_text_matches(tiny_model):
    # two references that part at token 6 (as a bf16 tie that goes one way when a pass drafts through it
    # and the other way when the round stops before it): the latest, wrong one leads until the target
    # commits the other token; from there the rounds are the exact oracle's on the matching reference
    target, draft_model, prompt, greedy, wrong = _oracle_pair(tiny_model, 2)
    true_lengths = OracleDrafter(draft_model, prompt, greedy).agreements[0]
    oracle = OracleDrafter(draft_model, prompt, greedy, wrong)
    out = speculative.generate(target, oracle, prompt, k=24, max_new_tokens=24)
    assert out.tokens == greedy
    g, checked = 0, 0
    for d, a in out.steps:
        if g > 6:
            assert d == min(24 - g - 1, true_lengths[g])
            checked += 1
        g += a + 1
    assert checked >= 1
    stale = speculative.generate(
        target, OracleDrafter(draft_model, prompt, wrong), prompt, k=24, max_new_tokens=24
    )
    assert stale.steps != out.steps


def test_the_oracle_ends_a_round_where_the_live_draft_leaves_the_reference(tiny_model):
    # lengths longer than the live drafter agrees with (as a bf16 tie between its one-token passes and
    # the teacher-forced pass makes them): each round stops at the first live token off the reference,
    # whose pass ran (counted) but whose token is not proposed, so nothing is discarded
    target, draft_model, prompt, greedy, _ = _oracle_pair(tiny_model, 1)
    oracle = OracleDrafter(draft_model, prompt, greedy)
    true_lengths = list(oracle.agreements[0])
    oracle.agreements[0] = [24] * len(true_lengths)
    out = speculative.generate(target, oracle, prompt, k=24, max_new_tokens=24)
    assert out.tokens == greedy
    assert all(d == a for d, a in out.steps)
    g = 0
    for d, a in out.steps:
        assert d == min(24 - g - 1, true_lengths[g])
        g += a + 1
    stopped = sum(1 for d, _ in out.steps if d < min(24, len(greedy)) - 1)
    assert out.forwards["drafter"]["forward_passes"] >= sum(d for d, _ in out.steps) + 1
    assert stopped >= 1


# -- HF's adaptive baselines -------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule, threshold", [("heuristic", 0.0), ("heuristic_transient", 0.0), ("constant", 0.4)]
)
def test_hf_assisted_adaptive_settings_run_and_stay_lossless(tiny_model, schedule, threshold):
    weights = tiny_model("tiny-llama", 1, vocab_size=VOCAB)
    target, assistant = HFModel(weights, "target"), HFModel(noisy(weights, 1), "drafter")
    prompt = prompt_for(1)
    expected = autoregressive.generate(target, prompt, max_new_tokens=16).tokens
    params = {"k": 3, "num_assistant_tokens_schedule": schedule, "assistant_confidence_threshold": threshold}
    request = Request(prompt, 16, SamplingParams(), [], torch.Generator())
    out = METHODS["hf_assisted"].run(params, target, assistant, request)
    assert out.tokens == expected
    config = assistant.model.generation_config
    assert config.num_assistant_tokens_schedule != schedule or schedule == "constant"  # restored
    direct = hf_generate.generate(
        target,
        prompt,
        max_new_tokens=16,
        assistant=assistant,
        k=3,
        schedule=schedule,
        confidence_threshold=threshold,
    )
    assert direct.tokens == expected


# -- recipes -----------------------------------------------------------------------------------


def test_specdecpp_recipes_parse():
    paths = sorted(RECIPES.glob("*.yaml"))
    assert {p.name for p in paths} >= {
        "llama2_chat_7b_70b.yaml",
        "llama2_chat_7b_70b-tiny.yaml",
        "smollm2_offline.yaml",
    }
    for path in paths:
        recipe = load_recipe(path)
        methods = {spec.method for spec in recipe.methods}
        assert {"specdecpp", "speculative", "autoregressive"} <= methods
        assert "oracle_sd" in methods or recipe.generation.temperature > 0  # the oracle is greedy
        drafted = [c for c in recipe.cells() if c.method != "autoregressive"]
        assert all(METHODS[c.method].lossless(c.params) for c in drafted)
        missing = {d.task for d in recipe.datasets} - set(TASKS)
        assert missing <= {"humaneval"} and (not missing or path.name == "llama2_chat_7b_70b.yaml")


def _recipe(methods: list[dict], temperature: float = 0.0) -> dict:
    return {
        "name": "t",
        "generation": {"max_new_tokens": 8, "temperature": temperature},
        "models": {
            "t": {"source": "tiny-llama"},
            "d": {"source": "tiny-llama"},
            "lookup": {"source": "prompt-lookup"},
        },
        "datasets": [{"task": "arithmetic"}],
        "methods": [{"name": "ar", "method": "autoregressive", "target": "t"}, *methods],
    }


@pytest.mark.parametrize(
    "method, temperature, message",
    [
        ({"method": "specdecpp", "drafter": "d"}, 0.0, "specbench specdecpp train"),
        (
            {"method": "specdecpp", "drafter": "d", "params": {"head": "specdecpp:x"}},
            0.0,
            "specdecpp:<target>",
        ),
        (
            {
                "method": "specdecpp",
                "drafter": "d",
                "params": {"head": "h", "min_length": 5, "max_length": 3},
            },
            0.0,
            "min_length 5 exceeds max_length 3",
        ),
        (
            {"method": "specdecpp", "drafter": "d", "params": {"head": "h", "threshold": 1.5}},
            0.0,
            "out of range",
        ),
        ({"method": "specdecpp", "drafter": "lookup", "params": {"head": "h"}}, 0.0, "needs a model drafter"),
        ({"method": "oracle_sd", "drafter": "d"}, 0.7, "greedy oracle"),
        (
            {"method": "hf_assisted", "drafter": "d", "params": {"num_assistant_tokens_schedule": "ada"}},
            0.0,
            "not allowed",
        ),
        (
            {"method": "hf_assisted", "drafter": "d", "params": {"assistant_confidence_threshold": 2.0}},
            0.0,
            "out of range",
        ),
    ],
)
def test_recipe_errors_are_one_line(method, temperature, message):
    data = _recipe([{"name": "m", "target": "t", **method}], temperature)
    with pytest.raises(SpecbenchError, match=message) as error:
        parse_recipe(data, "r.yaml")
    assert "\n" not in str(error.value)


def test_oracle_needs_the_autoregressive_output():
    data = _recipe([{"name": "o", "method": "oracle_sd", "target": "t", "drafter": "d"}])
    data["methods"] = data["methods"][1:]
    with pytest.raises(SpecbenchError, match="autoregressive"):
        parse_recipe(data, "r.yaml")


def test_train_warns_when_the_head_is_no_better_than_a_constant():
    """The Qwen pair's 105 training sequences left the paper's head (D = 3, 3 epochs: 12 optimiser
    steps) at a held-out KL of 1.207 against a constant's 0.353; train says so, and why."""
    from specbench.papers.specdecpp.commands import underfit_warning

    def manifest(head_kl, w_rej=1.0):
        return {
            "eval": {"binary_kl": head_kl}, "eval_constant_predictor": {"binary_kl": 0.353},
            "steps": 12, "train_sequences": 105, "config": {"depth": 3, "w_rej": w_rej, "w_acc": 1.0},
        }  # fmt: skip

    assert underfit_warning(manifest(0.332)) is None
    line = underfit_warning(manifest(0.353))
    assert line.startswith(
        "! the head's held-out binary KL 0.3530 is not below a constant predictor's 0.3530"
    )
    assert "12 optimiser steps over 105 sequences, depth 3" in line and "w_rej" not in line
    assert "w_rej 6 against w_acc 1 skews every prediction" in underfit_warning(manifest(1.207, w_rej=6.0))


def test_a_missing_head_says_how_to_train_it(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(SpecbenchError, match="specbench specdecpp train") as error:
        acceptance_head.load_head(
            "specdecpp:smollm2-135m-instruct/distilled-smollm2-135m-instruct--small", "cpu"
        )
    assert "\n" not in str(error.value)


# -- end to end: train a tiny head, run the tiny recipe ----------------------------------------


def _data_dir(root: Path) -> Path:
    rows = {
        "gsm8k/train.jsonl": [
            {
                "question": f"Tom has {i} apples and buys {i + 2} more. How many?",
                "answer": f"#### {2 * i + 2}",
            }
            for i in range(8)
        ],
        "mmlu/dev.jsonl": [
            {"question": "2+2?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1}
        ],
        "alpaca_seed/train.jsonl": [{"instruction": "Say hi.", "input": "", "output": "hi"}],
    }
    for name, items in rows.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return root


def test_train_a_tiny_head_and_run_the_tiny_recipe(tmp_path, monkeypatch):
    from specbench.pipeline.run.runner import Runner

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    recipe = load_recipe(RECIPES / "llama2_chat_7b_70b-tiny.yaml")
    head_params = {spec.params.get("head") for spec in recipe.methods if spec.method == "specdecpp"}
    target, drafter = recipe.models["target"], recipe.models["draft"]
    config = TrainConfig(
        target=target.source, drafter=drafter.source, target_options=target.options,
        drafter_options=drafter.options, name="tiny", data_dir=str(_data_dir(tmp_path / "data")),
        prompts=10, max_new_tokens=12, epochs=2, batch_size=4, dtype="float64",
    )  # fmt: skip
    with Progress(disable=True) as progress:
        folder = specdecpp.train(config, progress)
    manifest = json.loads((folder / acceptance_head.MANIFEST).read_text())
    assert head_params == {manifest["reference"]}
    assert manifest["eval"]["draft_tokens"] > 0 and manifest["data"]["eval_sequences"] == 1
    assert not list((tmp_path / "cache").rglob("*.partial-*"))  # finished: no resume state left
    with Progress(disable=True) as progress:  # again: the cached data, the same head bytes
        again = specdecpp.train(config, progress)
    assert (again / acceptance_head.HEAD_FILE).read_bytes() == (
        folder / acceptance_head.HEAD_FILE
    ).read_bytes()
    Runner(recipe, tmp_path / "out", limit=2).run()
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    assert {"specdecpp", "oracle_sd"} <= {row["method"] for row in rows}


def test_the_papers_head_data_trains_on_alpaca_train_and_evaluates_on_dev(tmp_path, monkeypatch):
    """--prompt-set alpaca (Huang et al., Sec. 4 / App. C): heads see Alpaca's train partition with
    the target's sampled responses, are scored on dev, and never see the test partition."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    data = _data_dir(tmp_path / "data")
    seeds = [
        {"instruction": f"Write {i} words about the sea.", "input": "", "output": "ok"} for i in range(20)
    ]
    (data / "alpaca_seed" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in seeds))
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(data))
    parts = {s: TASKS["alpaca"].load(split=f"specdecpp-{s}") for s in ("train", "dev", "test")}
    assert [len(parts[s]) for s in ("train", "dev", "test")] == [12, 4, 4]
    prompts = {s: {e.prompt for e in examples} for s, examples in parts.items()}
    assert not (prompts["train"] & prompts["test"]) and not (prompts["dev"] & prompts["test"])
    recipe = load_recipe(RECIPES / "llama2_chat_7b_70b-tiny.yaml")
    target, drafter = recipe.models["target"], recipe.models["draft"]
    common = dict(
        target=target.source, drafter=drafter.source, target_options=target.options,
        drafter_options=drafter.options, data_dir=str(data), max_new_tokens=6, epochs=1,
        batch_size=4, dtype="float64", prompt_set="alpaca",
    )  # fmt: skip
    sampled = TrainConfig(name="sampled", temperature=0.8, top_p=0.9, top_k=20, **common)
    greedy = TrainConfig(name="greedy", **common)
    assert sampled.data_key("f") != greedy.data_key("f") != TrainConfig().data_key("f")
    with Progress(disable=True) as progress:
        manifest = json.loads((specdecpp.train(sampled, progress) / acceptance_head.MANIFEST).read_text())
    assert (manifest["data"]["train_sequences"], manifest["data"]["eval_sequences"]) == (12, 4)
    assert (
        "Alpaca specdecpp-train" in manifest["data"]["sources"] and "sampled" in manifest["data"]["sources"]
    )
    rendered = [head_data._prompt_examples(None, sampled)[i].prompt for i in range(16)]
    assert set(rendered) == prompts["train"] | prompts["dev"]


def test_an_interrupted_response_generation_resumes_at_the_first_unfinished_batch(tmp_path, monkeypatch):
    """The target's sampled responses are hours of a real pair's CPU time: each finished teacher batch
    is kept, a rerun generates only the others, and the result is what one uninterrupted run gives."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    spec = load_recipe(RECIPES / "llama2_chat_7b_70b-tiny.yaml").models["target"]
    config = TrainConfig(
        target=spec.source, target_options=spec.options, data_dir=str(_data_dir(tmp_path / "data")),
        prompts=8, max_new_tokens=5, temperature=0.8, top_p=0.9, top_k=20, teacher_batch=3, dtype="float64",
    )  # fmt: skip
    target = head_data._load("target", config.target, config.target_options, config)
    generate, calls, stop_at = target.model.generate, [], [3]

    def counted(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        if len(calls) == stop_at[0]:
            raise KeyboardInterrupt
        return generate(*args, **kwargs)

    monkeypatch.setattr(target.model, "generate", counted)
    with Progress(disable=True) as progress, pytest.raises(KeyboardInterrupt):
        head_data.target_responses(target, config, progress)
    assert len(list((tmp_path / "cache").rglob("*.partial-b3.pt"))) == 1
    calls.clear()
    stop_at[0] = 0
    with Progress(disable=True) as progress:
        resumed = head_data.target_responses(target, config, progress)
    assert calls == [2]  # 8 prompts in batches of 3, 3 and 2: only the last is generated again
    assert not list((tmp_path / "cache").rglob("*.partial-*"))
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "fresh"))
    with Progress(disable=True) as progress:
        whole = head_data.target_responses(target, config, progress)
    assert len(whole) == len(resumed) == 8
    for a, b in zip(whole, resumed, strict=True):
        assert torch.equal(a.prompt, b.prompt) and torch.equal(a.response, b.response)


def test_an_interrupted_labelling_resumes_at_the_first_unfinished_batch(pair, monkeypatch):
    """Labels and draft features are kept batch by batch: after an interruption only the unfinished
    batches run the models again, and the result is byte-equal to one uninterrupted build."""
    kept: dict[int, dict] = {}
    calls, interrupt = [], [True]
    hidden = head_data._hidden

    def counted(model, seqs):
        calls.append(len(seqs))
        if interrupt[0] and len(kept) >= 6:  # in the third batch of 3, after two were kept
            raise KeyboardInterrupt
        return hidden(model, seqs)

    monkeypatch.setattr(head_data, "_hidden", counted)
    with pytest.raises(KeyboardInterrupt):
        _build(pair, _examples(8, 9), on_batch=kept.update)
    lengths = [e.prompt.shape[0] + e.response.shape[0] for e in _examples(8, 9)]
    first_two = head_data._batches(8, lengths, 3)[:2]
    assert sorted(kept) == sorted(j for batch in first_two for j in batch)
    calls.clear()
    interrupt[0] = False
    resumed = _examples(8, 9)
    features = _build(pair, resumed, finished=dict(kept), on_batch=kept.update)
    assert calls == [2, 2, 2]  # the last batch's two sequences: drafter q, target p, drafter hidden
    monkeypatch.setattr(head_data, "_hidden", hidden)
    whole = _examples(8, 9)
    expected = _build(pair, whole)
    for a, b, fa, fb in zip(whole, resumed, expected, features, strict=True):
        assert torch.equal(a.draft, b.draft) and torch.equal(a.keep, b.keep) and torch.equal(a.label, b.label)
        assert torch.equal(fa, fb)


def test_responses_from_a_file_replace_generation_and_must_be_this_runs(tmp_path, monkeypatch):
    """--responses: a responses file an earlier run wrote (committed beside a run, say) is read instead
    of sampling the target again; a file for other prompts, a file that is not one, or none, is one
    clear error."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    spec = load_recipe(RECIPES / "llama2_chat_7b_70b-tiny.yaml").models["target"]
    common = dict(
        target=spec.source, target_options=spec.options, data_dir=str(_data_dir(tmp_path / "data")),
        max_new_tokens=5, temperature=0.8, top_p=0.9, top_k=20, teacher_batch=3, dtype="float64",
    )  # fmt: skip
    config = TrainConfig(prompts=8, **common)
    target = head_data._load("target", config.target, config.target_options, config)
    with Progress(disable=True) as progress:
        generated = head_data.target_responses(target, config, progress)
    (written,) = (tmp_path / "cache").rglob("responses-*.pt")
    shared = tmp_path / "shared-responses.pt"
    shared.write_bytes(written.read_bytes())

    def no_generation(*args, **kwargs):
        raise AssertionError("the target generated responses although a file holds them")

    monkeypatch.setattr(target.model, "generate", no_generation)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "fresh"))
    from_file = TrainConfig(prompts=8, responses=str(shared), **common)
    with Progress(disable=True) as progress:
        read = head_data.target_responses(target, from_file, progress)
    assert len(read) == len(generated) == 8
    for a, b in zip(generated, read, strict=True):
        assert torch.equal(a.prompt, b.prompt) and torch.equal(a.response, b.response)
    # the labels are keyed by the file's bytes, so its data never mixes with generated data
    assert from_file.data_key("f") != config.data_key("f")

    with Progress(disable=True) as progress, pytest.raises(SpecbenchError, match="prompts are not this run"):
        head_data.target_responses(target, TrainConfig(prompts=4, responses=str(shared), **common), progress)
    garbage = tmp_path / "garbage.pt"
    garbage.write_text("not a tensor file")
    with Progress(disable=True) as progress, pytest.raises(SpecbenchError, match="not a responses file"):
        head_data.target_responses(target, TrainConfig(prompts=8, responses=str(garbage), **common), progress)
    with pytest.raises(SpecbenchError, match="no such file"):
        TrainConfig(prompts=8, responses=str(tmp_path / "missing.pt"), **common).data_key("f")
