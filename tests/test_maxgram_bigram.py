"""CS Drafting's Max-Gram: bigram tables, the bigram fill, the vectorised suffix match, losslessness."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from specbench.decoding import autoregressive, speculative
from specbench.drafters.bigram import BigramDrafter, BigramTable, cs_drafting_maxgram
from specbench.drafters.maxgram import MaxGramDrafter, longest_suffix_match, longest_suffix_match_vectorised
from specbench.errors import SpecbenchError
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams
from specbench.models.tiny import build_tiny

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: 1 intra-op thread, restored after

DATA = Path(os.environ.get("SPECBENCH_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")
DATA = DATA / "cs_drafting_bigram"
# a toy table over V = 10: next_token[v] = (v + 1) % 10, so chains are easy to write by hand
SUCCESSOR = BigramTable(torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 0]))


def draft(drafter, prompt: list[int], tokens: list[int], k: int) -> list[int]:
    drafter.start(torch.tensor(prompt, dtype=torch.long))
    out = drafter.propose(torch.tensor(tokens, dtype=torch.long), k, SamplingParams(), None)
    assert out.q is None and out.tokens.dtype == torch.long
    return out.tokens.tolist()


# ---------------------------------------------------------------------------------------------
# Max-Gram, hand-worked


@pytest.mark.parametrize("vectorised", (False, True))
def test_cs_maxgram_hand_examples(vectorised):
    def maxgram(**options):
        drafter = cs_drafting_maxgram(SUCCESSOR, **options)
        drafter.vectorised = vectorised
        return drafter

    assert maxgram().max_copy == 10 and maxgram().max_ngram is None and maxgram().num_parameters == 0
    # context 5 6 7 8 | 5 6: the suffix "5 6" occurs at 0 -> copy what followed: 7 8 5 6
    assert draft(maxgram(), [5, 6, 7, 8], [5, 6], 4) == [7, 8, 5, 6]
    # k = 6: the copy stops at the end of the context (7 8 5 6), the bigram continues from 6: 7 8
    assert draft(maxgram(), [5, 6, 7, 8], [5, 6], 6) == [7, 8, 5, 6, 7, 8]
    # max_copy = 2: copy 7 8, then the chain continues from the last COPIED token 8: 9 0
    assert draft(maxgram(max_copy=2), [5, 6, 7, 8], [5, 6], 4) == [7, 8, 9, 0]
    # no match (4 never occurred before): the bigram chain from the last context token 4: 5 6 7
    assert draft(maxgram(), [1, 2, 3], [4], 3) == [5, 6, 7]
    # nothing generated yet, no match in 1 2 3: the chain starts from the last prompt token 3
    assert draft(maxgram(), [1, 2, 3], [], 2) == [4, 5]
    # leftmost occurrence: 4 1 2 8 1 2 6 1 2 -> "1 2" at 1 and at 4; copy after the first: 8 1 2
    assert draft(maxgram(), [4, 1, 2, 8, 1, 2, 6], [1, 2], 3) == [8, 1, 2]
    # the longest match wins over a shorter, earlier one: 2 3 5 1 2 3 7 1 2 3 -> "1 2 3" at 3: 7 1 2
    assert draft(maxgram(), [2, 3, 5, 1, 2, 3, 7, 1, 2, 3], [], 3) == [7, 1, 2]
    # a one-token match is enough: 9 3 0 | 9 -> "9" at 0 -> copy 3 0 9, then chain from 9: 0
    assert draft(maxgram(), [9, 3, 0], [9], 4) == [3, 0, 9, 0]
    # copies at most max_copy = 10 tokens; the rest comes from the chain
    prompt = list(range(0, 10)) + list(range(0, 10)) + [0]  # "0" at 0 -> copy 1..9 0 (10 tokens)
    assert draft(maxgram(), prompt, [], 12) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]


def test_fill_sees_the_copy_and_counts_calls():
    fill = BigramDrafter(SUCCESSOR)
    drafter = MaxGramDrafter("maxgram", max_copy=2, fill=fill)
    assert draft(drafter, [5, 6, 7, 8], [5, 6], 4) == [7, 8, 9, 0]
    assert draft(drafter, [5, 6, 7, 8], [5, 6], 2) == [7, 8]  # a full copy needs no fill
    assert drafter.counter.forward_passes == 2 and fill.counter.forward_passes == 1
    assert fill.counter.tokens_scored == 0 and fill.num_parameters == 0


def test_bigram_drafter_chain():
    drafter = BigramDrafter(SUCCESSOR)
    assert draft(drafter, [3], [7], 4) == [8, 9, 0, 1]  # from the last generated token
    assert draft(drafter, [3], [], 2) == [4, 5]  # from the last prompt token
    assert draft(drafter, [], [], 2) == []  # no context at all: nothing to continue
    assert draft(drafter, [3], [42], 2) == [42, 42]  # outside the table: maps to itself
    assert draft(drafter, [3], [1], 0) == []
    assert drafter.counter.forward_passes == 4  # k = 0 is no drafting call


# ---------------------------------------------------------------------------------------------
# bigram tables


@pytest.mark.parametrize(
    "filename, vocab",
    (
        ("wiki_bigram_naive_bayers_greedy_next_token.json", 32100),
        ("wiki_bigram_naive_bayers_greedy_llama_next_token.json", 32000),
    ),
)
def test_published_tables_load(filename, vocab):
    path = DATA / filename
    if not path.exists():
        pytest.skip(f"{path} not available")
    table = BigramTable.load(path)
    assert len(table) == vocab and table.next_token.dtype == torch.long
    assert int(table.next_token.min()) >= 0 and int(table.next_token.max()) < vocab
    assert table.next_token.tolist() == json.loads(path.read_text())
    # the CS Max-Gram over the real table runs and proposes k in-vocabulary tokens
    out = draft(cs_drafting_maxgram(table), [100, 200, 300], [400], 10)
    assert len(out) == 10 and all(0 <= t < vocab for t in out)


def test_build_hand_computed_argmax():
    # pairs: 0->1 twice, 0->2 once; 1->0; 2->0; 3->4 twice, 3->2 once; 4->3 twice; 5 never first
    corpus = [[0, 1, 0, 2, 0, 1], torch.tensor([3, 4, 3, 4, 3, 2]), [5], []]
    assert BigramTable.build(corpus, 6).next_token.tolist() == [1, 0, 0, 4, 3, 5]
    # ties -> the smallest id: 1->3 once, 1->2 once -> 2; 3->1; unseen 0 and 2 map to themselves
    assert BigramTable.build([[1, 3, 1, 2]], 4).next_token.tolist() == [0, 2, 2, 1]
    assert BigramTable.build([], 3).next_token.tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        BigramTable.build([[0, 7]], 4)


def test_build_large_vocab_matches_counting():
    rng = random.Random(1)
    vocab = 32000
    hot = [rng.randrange(vocab) for _ in range(40)]  # few distinct tokens, so counts collide
    corpus = [[rng.choice(hot) for _ in range(rng.randint(0, 60))] for _ in range(50)]
    counts: dict[int, dict[int, int]] = {}
    for seq in corpus:
        for v, w in zip(seq[:-1], seq[1:], strict=True):
            counts.setdefault(v, {}).setdefault(w, 0)
            counts[v][w] += 1
    table = BigramTable.build(corpus, vocab).next_token
    expected = torch.arange(vocab)
    for v, row in counts.items():
        expected[v] = min(row, key=lambda w: (-row[w], w))
    assert torch.equal(table, expected)


def test_save_load_round_trip(tmp_path):
    table = BigramTable.build([[0, 1, 0, 2, 0, 1], [3, 4, 3, 4, 3, 2]], 6)
    path = tmp_path / "table.json"
    table.save(path)
    assert json.loads(path.read_text()) == [1, 0, 0, 4, 3, 5]
    assert torch.equal(BigramTable.load(path).next_token, table.next_token)


@pytest.mark.parametrize(
    "text, problem",
    (
        ("[1, 2", "not valid JSON"),
        ('{"0": 1}', "non-empty JSON list"),
        ("[]", "non-empty JSON list"),
        ('[1, "2", 0]', "entry 1"),
        ("[1, 2.0, 0]", "entry 1"),
        ("[1, true, 0]", "entry 1"),
        ("[1, 3, 0]", "entry 1 is 3, outside the vocabulary"),
        ("[1, 0, -1]", "entry 2 is -1"),
    ),
)
def test_malformed_tables_raise(tmp_path, text, problem):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(SpecbenchError) as error:
        BigramTable.load(path)
    assert str(path) in str(error.value) and problem in str(error.value) and error.value.fix


def test_missing_table_raises(tmp_path):
    with pytest.raises(SpecbenchError, match="not found"):
        BigramTable.load(tmp_path / "absent.json")


# ---------------------------------------------------------------------------------------------
# the vectorised suffix match


def test_vectorised_match_equals_simple():
    rng = random.Random(0)
    cases = [[], [5], [7, 7], [7, 8], [1, 1, 1, 1], [1, 2, 3, 4], [1, 2, 3, 9, 1, 2, 3]]
    for _ in range(600):
        alphabet = rng.choice((1, 2, 3, 4))
        cases.append([rng.randrange(alphabet) for _ in range(rng.randint(0, 40))])
    for seq in cases:
        tensor = torch.tensor(seq, dtype=torch.long)
        for cap in (None, 1, 2, 3, 5, 100):
            expected = longest_suffix_match(tensor, cap)
            assert longest_suffix_match_vectorised(tensor, cap) == expected, (seq, cap)
            assert longest_suffix_match_vectorised(tensor, cap, block=3) == expected, (seq, cap)


def test_vectorised_drafter_equals_simple():
    rng = random.Random(2)
    for _ in range(100):
        prompt = [rng.randrange(3) for _ in range(rng.randint(0, 15))]
        tokens = [rng.randrange(3) for _ in range(rng.randint(0, 10))]
        k, cap, copy = rng.randint(1, 8), rng.choice((None, 2)), rng.choice((None, 3))
        simple = MaxGramDrafter(max_ngram=cap, max_copy=copy, fill=BigramDrafter(SUCCESSOR))
        fast = MaxGramDrafter(max_ngram=cap, max_copy=copy, fill=BigramDrafter(SUCCESSOR), vectorised=True)
        assert draft(simple, prompt, tokens, k) == draft(fast, prompt, tokens, k)


# ---------------------------------------------------------------------------------------------
# losslessness


def test_greedy_speculative_with_cs_maxgram_is_lossless():
    model, _ = build_tiny("tiny-llama", dtype=torch.float64, vocab_size=32, init_std=0.5)
    target = HFModel(model, "target")
    rng = random.Random(3)
    prompts = []
    for _ in range(3):
        motif = [rng.randrange(32) for _ in range(4)]
        prompts.append(torch.tensor(motif * 3 + [rng.randrange(32)], dtype=torch.long))
    references = [autoregressive.generate(target, p, max_new_tokens=24).tokens for p in prompts]
    # a table fitted to the target's own outputs, so the bigram fill is accepted some of the time
    table = BigramTable.build([p.tolist() + r for p, r in zip(prompts, references, strict=True)], 32)
    accepted = 0
    for trial, (prompt, reference) in enumerate(zip(prompts, references, strict=True)):
        for k in (1, 4, 10):
            drafter = cs_drafting_maxgram(table, max_copy=3 + trial)
            run = speculative.generate(target, drafter, prompt, k=k, max_new_tokens=24)
            assert run.tokens == reference, (trial, k)
            assert drafter.counter.forward_passes > 0
            accepted += sum(step[1] for step in run.steps)
    assert accepted > 0  # drafts were really used, not all rejected


def test_bigram_build_command_and_maxgram_source_with_a_bigram_fill(tmp_path):
    from typer.testing import CliRunner

    from specbench import sources
    from specbench.cli import app
    from specbench.drafters.bigram import corpus_texts

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"q": "abab", "a": ["ab"], "n": 3}\n\n{"q": "ba\u2028b"}\n')
    assert corpus_texts([corpus]) == ["abab", "ab", "ba\u2028b"]
    out = tmp_path / "table.json"
    args = ["bigram", "build", "--tokenizer", "tiny-llama", "--corpus", str(corpus), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = BigramTable.load(out)
    a, b = ord("a"), ord("b")  # the byte tokenizer: ids 0-255 are the bytes
    assert int(table.next_token[a]) == b and int(table.next_token[b]) == a
    mag = sources.load(sources.ModelRequest("mag", "maxgram", options=(("bigram", str(out)),)))
    assert mag.fill is not None and mag.max_copy == 10 and mag.max_ngram is None
    with pytest.raises(SpecbenchError, match="bigram build"):
        sources.load(sources.ModelRequest("mag", "maxgram", options=(("bigram", str(tmp_path / "no")),)))
    with pytest.raises(SpecbenchError, match="takes no option 'colour'"):
        sources.load(sources.ModelRequest("mag", "maxgram", options=(("colour", 1),)))


def test_bigram_path_expands_environment_variables(tmp_path, monkeypatch):
    from specbench import sources

    BigramTable(torch.tensor([1, 2, 0])).save(tmp_path / "t.json")

    def load(path):
        return sources.load(sources.ModelRequest("mag", "maxgram", options=(("bigram", path),)))

    monkeypatch.setenv("SPECBENCH_TEST_TABLES", str(tmp_path))
    assert load("$SPECBENCH_TEST_TABLES/t.json").fill.table.next_token.tolist() == [1, 2, 0]
    assert load("${SPECBENCH_TEST_TABLES}/t.json").fill is not None
    monkeypatch.delenv("SPECBENCH_TEST_TABLES")
    with pytest.raises(SpecbenchError, match=r"names \$SPECBENCH_TEST_TABLES, which is not set") as error:
        load("$SPECBENCH_TEST_TABLES/t.json")
    assert error.value.where == "models.mag.options.bigram"
    assert "export SPECBENCH_TEST_TABLES" in error.value.fix


# -- the reference code's Max-Gram (variant: reference) -------------------------------------------


def reference_table() -> torch.Tensor:
    """next_token[v] = v except 0 -> 0 (as CS Drafting's T5 table), 5 -> 7 and 7 -> 8."""
    table = torch.arange(50)
    table[5], table[7] = 7, 8
    return table


@pytest.mark.parametrize(
    ("prompt", "generated", "k", "decoder_start", "draft", "quirk"),
    [
        # decoder-only, empty generation: the prompt stands twice in the corpus and matches itself at
        # its start, so the draft is the prompt's head
        ([1, *range(10, 21)], [], 5, None, [1, 10, 11, 12, 13], "duplicated prompt"),
        # a suffix matched at the prompt's end continues into its start
        ([1, *range(10, 21)], [19], 5, None, [20, 1, 10, 11, 12], "copy wraps into the prompt"),
        # the first copy out of the generation stops one token early ([4]); the second search, in the
        # doubled extended sequence, adds [3, 1]: 3 tokens for k = 2
        ([1, 2], [3, 4, 3], 2, None, [4, 3, 1], "second search, longer than k"),
        (
            [1, *range(10, 21)],
            [30, 31, 32, 33, 30, 31, 32],
            5,
            None,
            [33, 30, 31, 32, 33, 30, 1, 10],
            "2k - 2",
        ),
        # nothing to copy: the greedy bigram chain from the last token fills exactly k
        ([5], [], 3, None, [7, 8, 8], "bigram fill"),
        # encoder-decoder: the decoder start token 0 is the query; it is not in the encoder input, and
        # the table maps 0 to 0, so the first draft is k decoder-start tokens
        ([4, 9, 1], [], 3, 0, [0, 0, 0], "T5 first draft"),
        # ... and from the second search on the decoder start is in the corpus
        ([4, 9, 1], [2, 0, 2], 3, 0, [0, 2, 0, 2], "T5 decoder start in the corpus"),
    ],
)
def test_reference_maxgram_hand_derived_quirks(prompt, generated, k, decoder_start, draft, quirk):
    from specbench.drafters.reference_maxgram import ReferenceMaxGramDrafter

    drafter = ReferenceMaxGramDrafter(BigramTable(reference_table()), decoder_start=decoder_start)
    drafter.start(torch.tensor(prompt))
    tokens = torch.tensor(generated, dtype=torch.long)
    full = drafter.propose(tokens, k, SamplingParams(), None, limit=100)
    assert full.tokens.tolist() == draft, quirk
    assert full.q is None and drafter.counter.forward_passes == 1
    assert drafter.propose(tokens, k, SamplingParams(), None).tokens.tolist() == draft[:k]  # no limit: <= k
    assert drafter.propose(tokens, 0, SamplingParams(), None).tokens.tolist() == []


def test_reference_search_is_the_longest_suffix_leftmost_in_corpus_plus_query():
    from specbench.drafters.reference_maxgram import reference_search

    corpus, query = torch.tensor([7, 1, 2, 9, 1, 2, 3]), torch.tensor([5, 1, 2])
    assert reference_search(query, corpus, 3).tolist() == [9, 1, 2]  # "1 2" at 1, not at 4
    assert reference_search(torch.tensor([5, 6]), corpus, 3) is None  # 6 is nowhere
    assert reference_search(torch.tensor([3]), corpus, 3).tolist() == []  # found at the corpus' end


def test_cascade_with_the_reference_maxgram_is_lossless(tmp_path):
    from specbench import sources
    from specbench.decoding import cascade_drafting
    from specbench.drafters.reference_maxgram import ReferenceMaxGramDrafter

    model, _ = build_tiny("tiny-llama", dtype=torch.float64, vocab_size=32, init_std=0.5)
    small, _ = build_tiny("tiny-llama", dtype=torch.float64, vocab_size=32, init_std=0.5, seed=1)
    target, drafter = HFModel(model, "target"), HFModel(small, "d1")
    prompt = torch.tensor([3, 4, 5, 6] * 3 + [7])
    expected = autoregressive.generate(target, prompt, max_new_tokens=30).tokens
    path = tmp_path / "table.json"
    path.write_text(json.dumps(list(range(1, 32)) + [0]))
    options = (("bigram", str(path)), ("variant", "reference"))
    mag = sources.load(sources.ModelRequest("mag", "maxgram", options=options))
    assert isinstance(mag, ReferenceMaxGramDrafter)
    for K in ([[1]], [[4]]):
        gen = cascade_drafting.generate(target, [drafter], mag, prompt, K=K, max_new_tokens=30)
        assert gen.tokens == expected
        assert all(d <= 30 - sum(a + 1 for _, a in gen.steps[:i]) - 1 for i, (d, _) in enumerate(gen.steps))
    for bad, problem in (
        ((("variant", "paper"),), "unknown Max-Gram variant"),
        ((("variant", "reference"),), "fills with a bigram table"),
        ((("variant", "reference"), ("bigram", str(path)), ("max_copy", 3)), "has no max_copy"),
        ((("bigram", str(path)), ("decoder_start", 0)), "belongs to the reference"),
    ):
        with pytest.raises(SpecbenchError, match=problem):
            sources.load(sources.ModelRequest("mag", "maxgram", options=bad))
