"""The quality tasks of the speculative cascades and SpecDec++ papers: builders on hub-schema rows,
metrics against hand-computed values (real sacreBLEU and rouge-score), offline and hub loading,
the opt-in code execution and its sandbox."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import sacrebleu

from specbench.errors import SpecbenchError
from specbench.pipeline.analysis.summary import summarise_cell
from specbench.recipe import parse_recipe
from specbench.tasks import TASKS, Example, get_task, humaneval, mbpp
from specbench.tasks.metrics import bleu_statistics, corpus_score, rouge2, sentence_bleu, squad_scores
from specbench.tasks.sandbox import Limits, fenced_code, run_program
from specbench.tasks.squad_v2 import answer_of

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NEW_TASKS = {
    "wmt14_en_de": ("wmt/wmt14", "de-en", "test", ("bleu",)),
    "xsum": ("EdinburghNLP/xsum", None, "test", ("rouge2",)),
    "cnn_dailymail": ("abisee/cnn_dailymail", "3.0.0", "test", ("rouge2",)),
    "mbpp": ("google-research-datasets/mbpp", "full", "test", ("pass@1",)),
    "humaneval": ("openai/openai_humaneval", None, "test", ("pass@1",)),
    "squad_v2": ("rajpurkar/squad_v2", None, "validation", ("exact_match", "f1")),
    "web_questions": ("stanfordnlp/web_questions", None, "test", ("exact_match", "f1")),
    "natural_questions": ("google-research-datasets/nq_open", None, "validation", ("exact_match", "f1")),
    "trivia_qa": ("mandarjoshi/trivia_qa", "rc.nocontext", "validation", ("exact_match", "f1")),
    # the few-shot prompts of the paper's Gemma cascades, on the same hub datasets
    "wmt14_en_de_fewshot": ("wmt/wmt14", "de-en", "test", ("bleu",)),
    "cnn_dailymail_fewshot": ("abisee/cnn_dailymail", "3.0.0", "test", ("rouge2",)),
    "gsm8k_fewshot": ("openai/gsm8k", "main", "test", ("accuracy",)),
}

# one row of each task in its hub schema
HUB_ROWS = {
    "wmt14_en_de": {"translation": {"de": "Das Haus ist klein.", "en": "The house is small."}},
    "xsum": {"document": "A long article.\nMore text.", "summary": "A short summary.", "id": "123"},
    "cnn_dailymail": {"article": "Some news story.", "highlights": "Point one .\nPoint two .", "id": "ab1"},
    "mbpp": {
        "task_id": 11,
        "text": "Write a python function to add two numbers.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    "humaneval": {
        "task_id": "HumanEval/999",
        "prompt": 'def add(a, b):\n    """Sum of a and b."""\n',
        "canonical_solution": "    return a + b\n",
        "test": "\ndef check(candidate):\n    assert candidate(2, 3) == 5\n",
        "entry_point": "add",
    },
    "squad_v2": {
        "id": "56be",
        "title": "Paris",
        "context": "Paris is the capital of France.",
        "question": "What is the capital of France?",
        "answers": {"text": ["Paris", "Paris"], "answer_start": [0, 0]},
    },
    "web_questions": {
        "url": "http://www.freebase.com/view/en/france",
        "question": "what is the capital of france?",
        "answers": ["Paris", "Paris, France"],
    },
    "natural_questions": {"question": "who wrote hamlet", "answer": ["William Shakespeare", "Shakespeare"]},
    "trivia_qa": {
        "question_id": "tc_1",
        "question": "Who wrote Hamlet?",
        "question_source": "http://www.quiz.example",
        "answer": {"value": "William Shakespeare", "aliases": ["Shakespeare", "William Shakespeare"]},
    },
    "gsm8k_fewshot": {
        "question": "Tom has 3 boxes of 4 apples. How many apples does he have?",
        "answer": "3 boxes of 4 apples is 3 * 4 = <<3*4=12>>12 apples.\n#### 12",
    },
}
HUB_ROWS["wmt14_en_de_fewshot"] = HUB_ROWS["wmt14_en_de"]
HUB_ROWS["cnn_dailymail_fewshot"] = HUB_ROWS["cnn_dailymail"]


@pytest.fixture
def data_dir(monkeypatch) -> Path:
    path = Path(os.environ.get("SPECBENCH_DATA_DIR") or SHARED_DATA)
    needed = ("wmt14_de_en/test.jsonl", "cnn_dailymail/test.jsonl", "humaneval/test.jsonl")
    if not all((path / name).is_file() for name in needed):
        pytest.skip(f"no offline data at {path}: set SPECBENCH_DATA_DIR")
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(path))
    return path


@pytest.fixture
def no_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(tmp_path / "empty"))


def build(name: str) -> Example:
    return TASKS[name].build(HUB_ROWS[name], f"{name}/test/0")


# -- registry and builders -------------------------------------------------------------------


def test_new_tasks_are_registered_with_their_hub_datasets_and_metrics():
    for name, (hub_id, config, split, metrics) in NEW_TASKS.items():
        task = get_task(name)
        assert (task.hub_id, task.hub_config, task.default_split) == (hub_id, config, split)
        assert (task.metrics or (task.metric,)) == metrics and task.metric == metrics[0]
        assert task.executes_code == (metrics == ("pass@1",))
        assert all(field in HUB_ROWS[name] for field in task.fields)


def test_translation_and_summarization_builders():
    wmt = build("wmt14_en_de")
    assert (
        wmt.prompt == "translate English to German: The house is small."
        and wmt.reference == "Das Haus ist klein."
    )
    xsum = build("xsum")
    assert (xsum.id, xsum.prompt, xsum.reference) == (
        "xsum/123",
        "summarize: A long article.\nMore text.",
        "A short summary.",
    )
    cnn = build("cnn_dailymail")
    assert cnn.id == "cnn_dailymail/ab1" and cnn.prompt == "summarize: Some news story."
    long_row = dict(HUB_ROWS["cnn_dailymail"], article=" ".join(f"w{i}" for i in range(3000)))
    long = TASKS["cnn_dailymail"].build(long_row, "x")
    assert long.prompt.split()[-1] == "w1499" and len(long.prompt.split()) == 1 + 1500  # "summarize:" + words


def test_code_builders_hold_the_tests_to_run():
    problem = build("humaneval")
    assert problem.id == "HumanEval/999" and problem.prompt == HUB_ROWS["humaneval"]["prompt"]
    assert problem.reference.rstrip().endswith("check(add)")
    task = build("mbpp")
    assert task.id == "mbpp/11" and task.reference.splitlines() == HUB_ROWS["mbpp"]["test_list"]
    assert task.prompt.count("[BEGIN]") == 4 and task.prompt.count("[DONE]") == 3
    assert task.prompt.endswith(
        "here is your task: Write a python function to add two numbers. "
        "Your code should pass these tests:\n\n"
        "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(-1, 1) == 0\n[BEGIN]\n"
    )


def test_qa_builders_keep_every_gold_answer_and_the_few_shot_format():
    assert build("web_questions").answers == ("Paris", "Paris, France")
    assert build("natural_questions").answers == ("William Shakespeare", "Shakespeare")
    trivia = build("trivia_qa")
    assert trivia.id == "trivia_qa/tc_1" and trivia.answers == ("William Shakespeare", "Shakespeare")
    assert trivia.prompt.endswith("\n\nQ: Who wrote Hamlet?\nA:") and trivia.prompt.count("\nA: ") == 5
    squad = build("squad_v2")
    assert squad.id == "squad_v2/56be" and squad.answers == ("Paris",)
    assert squad.prompt.endswith(
        "Passage: Paris is the capital of France.\nQ: What is the capital of France?\nA:"
    )
    assert 'answer "unanswerable"' in squad.prompt and "A: unanswerable" in squad.prompt
    unanswerable = TASKS["squad_v2"].build(
        dict(HUB_ROWS["squad_v2"], answers={"text": [], "answer_start": []}), "x"
    )
    assert unanswerable.answers == () and unanswerable.reference == ""


# -- metrics against hand-computed values ----------------------------------------------------


def test_sentence_bleu_by_hand():
    # 1- to 4-gram precisions 5/6, 3/5, 2/4, 1/3, equal lengths (no brevity penalty)
    expected = 100 * (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25
    assert sentence_bleu("the cat sat on a mat", "the cat sat on the mat") == pytest.approx(expected)
    assert sentence_bleu("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(100.0)


def test_corpus_bleu_from_summed_statistics_is_sacrebleus_corpus_bleu():
    outputs = ["the cat sat on a mat", "Hello there, General Kenobi", "x y z", "ein kleines Haus"]
    references = ["the cat sat on the mat", "Hello there, general Kenobi!", "a b c d", "ein kleines Haus"]
    statistics = [bleu_statistics(o, r) for o, r in zip(outputs, references, strict=True)]
    corpus = sacrebleu.corpus_bleu(outputs, [references]).score
    assert corpus_score("bleu", statistics) == pytest.approx(corpus, abs=1e-9)
    mean = sum(sentence_bleu(o, r) for o, r in zip(outputs, references, strict=True)) / len(outputs)
    assert abs(mean - corpus) > 1  # why the cell needs the statistics, not the rows' mean
    task, example = get_task("wmt14_en_de"), Example("w/0", "p", "the cat sat on the mat")
    assert task.score(example, "the cat sat on a mat\nextra line") == {
        "bleu": pytest.approx(53.7285, abs=1e-3)
    }
    assert task.corpus_statistics(example, "the cat sat on a mat") == {"bleu": [6, 6, 5, 3, 2, 1, 6, 5, 4, 3]}


def test_rouge2_f_measure_with_stemming_by_hand():
    # 5 bigrams each side, 3 shared ("the cat", "on the", "the mat"): P = R = F = 0.6
    assert rouge2("the cat sat on the mat", "the cat lay on the mat") == pytest.approx(60.0)
    assert rouge2("cats running", "cat run") == pytest.approx(100.0)  # Porter stemming
    assert rouge2("nothing shared here", "the cat lay") == 0.0
    example = Example("c/0", "p", "the cat lay on the mat")
    assert get_task("cnn_dailymail").score(example, " the cat sat on the mat\n") == {
        "rouge2": pytest.approx(60.0)
    }


def test_squad_exact_match_and_f1_by_hand():
    # "the Eiffel Tower in Paris" -> eiffel tower in paris (4 tokens); gold eiffel tower: P 1/2, R 1, F1 2/3
    assert squad_scores("the Eiffel Tower in Paris", ["Eiffel Tower"]) == {
        "exact_match": 0.0,
        "f1": pytest.approx(2 / 3),
    }
    assert squad_scores("The Eiffel tower.", ["Eiffel Tower", "tower"]) == {"exact_match": 1.0, "f1": 1.0}
    assert squad_scores("tower", ["Eiffel Tower", "the tower"]) == {
        "exact_match": 1.0,
        "f1": 1.0,
    }  # max over golds
    assert squad_scores("Paris", []) == {"exact_match": 0.0, "f1": 0.0}
    assert squad_scores("", []) == {"exact_match": 1.0, "f1": 1.0}


@pytest.mark.parametrize(
    ("output", "answers", "expected"),
    [
        ("Unanswerable.\nQ: next", (), 1.0),  # abstaining on an unanswerable question
        ("no answer", (), 1.0),
        ("   \n", (), 1.0),
        ("Paris", (), 0.0),
        ("unanswerable", ("Paris",), 0.0),  # abstaining on an answerable one
        ("Paris\nQ: something else", ("Paris",), 1.0),  # only the first line counts
    ],
)
def test_squad_v2_abstention(output, answers, expected):
    example = Example("s/0", "p", answers[0] if answers else "", answers)
    assert get_task("squad_v2").score(example, output) == {"exact_match": expected, "f1": expected}
    assert answer_of("The answer is unanswerable") == "The answer is unanswerable"  # not an abstention


def test_closed_book_qa_scores_the_first_line_against_every_alias():
    example = build("trivia_qa")
    assert get_task("trivia_qa").score(example, " shakespeare\n\nQ: Who") == {"exact_match": 1.0, "f1": 1.0}
    scores = get_task("natural_questions").score(build("natural_questions"), "Shakespeare, William")
    assert scores == {"exact_match": 0.0, "f1": 1.0}


# -- the few-shot prompts of the Gemma cascades (App. E.1: "We employ few-shot inference") -------


def test_gsm8k_fewshot_prompt_is_the_eight_shot_chain_of_thought_prompt():
    example = build("gsm8k_fewshot")
    blocks = example.prompt.split("\n\n")
    assert len(blocks) == 9 and all(b.startswith("Q: ") and "\nA: " in b for b in blocks[:-1])
    assert blocks[0] == (
        "Q: There are 15 trees in the grove. Grove workers will plant trees in the grove today. After "
        "they are done, there will be 21 trees. How many trees did the grove workers plant today?\n"
        "A: There are 15 trees originally. Then there were 21 trees after some more were planted. So "
        "there must have been 21 - 15 = 6. The answer is 6."
    )
    assert blocks[-1] == "Q: Tom has 3 boxes of 4 apples. How many apples does he have?\nA:"
    # every exemplar states the number its own arithmetic gives
    assert [b.rsplit("The answer is ", 1)[1] for b in blocks[:-1]] == [
        "6.",
        "5.",
        "39.",
        "8.",
        "9.",
        "29.",
        "33.",
        "8.",
    ]
    assert example.reference == "12" and get_task("gsm8k_fewshot").metric == "accuracy"


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (" 3 * 4 = 12. The answer is 12.", 1.0),
        (" 3 * 4 = 12. The answer is 12.\n\nQ: Ann has 7 pens and buys 5. How many?\nA: 7 + 5 = 12 ...", 1.0),
        # the model's own next question is cut off: its numbers never count
        (" He has 3 * 4 = 12 apples.\n\nQ: Ann has 7 pens and buys 6. The answer is 13.", 1.0),
        (" The answer is 1,200. Later 3 * 4 = 12.", 0.0),  # the stated answer wins over the last number
        (" The answer is $12.00.", 1.0),
        (" 3 boxes, 4 apples each", 0.0),  # no stated answer: the last number, 4
        ("\nQ: What now?", 0.0),  # nothing before the next question
    ],
)
def test_gsm8k_fewshot_grades_the_stated_answer_before_the_next_question(output, expected):
    assert get_task("gsm8k_fewshot").score(build("gsm8k_fewshot"), output) == {"accuracy": expected}


def test_wmt_fewshot_prompt_and_corpus_bleu_of_the_first_line():
    example = build("wmt14_en_de_fewshot")
    assert example.prompt.startswith("Translate English to German.\n\nEnglish: ")
    assert example.prompt.endswith("\n\nEnglish: The house is small.\nGerman:")
    assert example.prompt.count("\nGerman: ") == 5 and example.reference == "Das Haus ist klein."
    task = get_task("wmt14_en_de_fewshot")
    # the model goes on with the next exemplar; only the first line is its translation
    output = " Das Haus ist klein.\n\nEnglish: The dog barks.\nGerman: Der Hund bellt."
    assert task.score(example, output) == {"bleu": pytest.approx(100.0)}
    assert task.corpus_statistics(example, output) == {"bleu": [5, 5, 5, 4, 3, 2, 5, 4, 3, 2]}


def test_cnn_dailymail_fewshot_prompt_and_rouge2_before_the_next_article():
    example = build("cnn_dailymail_fewshot")
    assert example.prompt.startswith("Summarize each news article in a few short sentences.\n\nArticle: ")
    assert example.prompt.endswith("\n\nArticle: Some news story.\nSummary:")
    assert (
        example.prompt.count("\nSummary: ") == 1
        and example.reference == HUB_ROWS["cnn_dailymail"]["highlights"]
    )
    # reference "point one point two" (4 bigrams after tokenisation): the output before the next
    # article has exactly those, so ROUGE-2 is 100; the appended article would halve the precision
    output = " Point one.\nPoint two.\n\nArticle: Point one point two point three"
    assert get_task("cnn_dailymail_fewshot").score(example, output) == {"rouge2": pytest.approx(100.0)}


# -- malformed rows: one line naming the file, the row and the fix --------------------------------


@pytest.mark.parametrize(
    ("task", "row", "problem"),
    [
        (
            "wmt14_en_de",
            {"translation": {"en": "The house is small."}},
            "field 'translation' must be an object",
        ),
        ("natural_questions", {"question": "who wrote hamlet", "answer": []}, "field 'answer' holds no"),
        ("web_questions", {"question": "q?", "answers": ["", " "]}, "field 'answers' holds no"),
        ("mbpp", {"text": "Add.", "test_list": "assert add(1, 2) == 3"}, "field 'test_list' must be a list"),
        ("trivia_qa", {"question": "q?", "answer": "Paris"}, "field 'answer' must be an object"),
        ("squad_v2", {"context": "c", "question": "q?", "answers": ["Paris"]}, "field 'answers' must be an"),
    ],
)
def test_a_row_of_the_wrong_shape_is_one_line_naming_file_row_and_schema(
    tmp_path, no_data_dir, task, row, problem
):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(SpecbenchError) as error:
        get_task(task).load(data_files=str(path))
    message = str(error.value)
    assert message.startswith(f"{path}: row 0 does not fit task {task}") and problem in message
    assert "\n" not in message and f"fix: use a JSONL file in the schema of {TASKS[task].hub_id}" in message


def test_a_single_answer_string_is_one_gold_answer_not_its_letters():
    row = {"question": "capital of france?", "answers": "Paris"}
    example = TASKS["web_questions"].build(row, "w/0")
    assert example.answers == ("Paris",)
    assert get_task("web_questions").score(example, "P") == {"exact_match": 0.0, "f1": 0.0}


# -- the cell summary ------------------------------------------------------------------------


def fake_row(quality: dict, **extra) -> dict:
    one = {"forward_passes": 1, "seconds": 0.1, "tokens_scored": 1}
    return {
        "dataset": "wmt14_en_de/test", "cell": "ar", "method_name": "ar", "method": "autoregressive",
        "target": "t", "drafter": None, "params": {}, "n_tokens": 4, "walltime": 0.5, "ttft": 0.1,
        "forwards": {"t": one}, "steps": [[0, 1]], "costs": {"ms": {"t": 1.0}, "pw": {"t": 1.0}},
        "quality": quality, "first_divergence": None, **extra,
    }  # fmt: skip


def test_a_cells_decoding_pass_time_leaves_the_prefill_out_and_needs_every_row_timed_apart():
    timed = {
        "forward_passes": 5,
        "seconds": 1.3,
        "tokens_scored": 9,
        "prefill_passes": 1,
        "prefill_seconds": 0.9,
    }
    rows = [fake_row({}, forwards={"t": timed}), fake_row({}, forwards={"t": {**timed, "seconds": 1.7}})]
    out = summarise_cell(rows)
    assert json.loads(out["pass_ms"]) == {"t": pytest.approx(1000 * 3.0 / 10)}
    assert json.loads(out["decode_pass_ms"]) == {"t": pytest.approx(1000 * (3.0 - 1.8) / 8)}
    older = fake_row({}, forwards={"t": {"forward_passes": 1, "seconds": 0.1, "tokens_scored": 1}})
    assert json.loads(summarise_cell([*rows, older])["decode_pass_ms"]) == {}  # not every row has it


def test_summary_reports_corpus_bleu_and_why_pass_at_1_is_missing():
    task = get_task("wmt14_en_de")
    pairs = [("the cat sat on a mat", "the cat sat on the mat"), ("x y z", "a b c d")]
    rows = []
    for output, reference in pairs:
        example = Example("w", "p", reference)
        rows.append(
            fake_row(task.score(example, output), quality_statistics=task.corpus_statistics(example, output))
        )
    out = summarise_cell(rows)
    assert out["quality_bleu"] == pytest.approx(
        sacrebleu.corpus_bleu([o for o, _ in pairs], [[r for _, r in pairs]]).score
    )
    assert out["quality_bleu_mean"] == pytest.approx(sum(r["quality"]["bleu"] for r in rows) / 2)

    code = get_task("humaneval")
    assert code.score(build("humaneval"), "    return a + b\n") == {}  # never run without execute_code
    skipped = code.skipped(execute_code=False)
    assert list(skipped) == ["pass@1"] and "execute_code: true" in skipped["pass@1"]
    assert code.skipped(execute_code=True) == {} and get_task("gsm8k").skipped() == {}
    out = summarise_cell([fake_row({}, quality_skipped=skipped)])
    assert "quality_pass@1" not in out and out["quality_skipped"].startswith("pass@1: not computed")
    plain = summarise_cell([fake_row({"accuracy": 1.0}), fake_row({"accuracy": 0.0})])
    assert plain["quality_accuracy"] == 0.5 and "quality_skipped" not in plain  # the mean, as before


# -- loading: offline files, hub stand-in, offline failure ------------------------------------


def test_offline_files_load_through_the_data_dir(data_dir):
    pairs = get_task("wmt14_en_de").load(limit=80)
    first = json.loads((data_dir / "wmt14_de_en" / "test.jsonl").open().readline())["translation"]
    assert len(pairs) == 80 and pairs[0].reference == first["de"] and first["en"] in pairs[0].prompt
    articles = get_task("cnn_dailymail").load(limit=3)
    assert len(articles) == 3 and articles[0].id.startswith("cnn_dailymail/")
    assert all(a.prompt.startswith("summarize: ") and a.reference for a in articles)
    problems = get_task("humaneval").load()
    assert len(problems) == 164 and problems[0].id == "HumanEval/0"
    assert problems[0].reference.rstrip().endswith("check(has_close_elements)")


@pytest.fixture
def hub(monkeypatch, no_data_dir):
    """A stand-in for datasets.load_dataset that serves HUB_ROWS and records its calls."""
    import datasets

    from specbench.models import cache

    calls = []

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        task = next(
            t for t in TASKS.values() if t.hub_id == path and t.hub_config == name and t.name in HUB_ROWS
        )
        return [HUB_ROWS[task.name]] * 3

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(cache, "hub_reachable", lambda: True)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return calls


@pytest.mark.parametrize("name", sorted(NEW_TASKS))
def test_hub_loading_asks_for_the_papers_dataset(hub, name):
    hub_id, config, split, _ = NEW_TASKS[name]
    examples = get_task(name).load(limit=2)
    assert hub == [(hub_id, config, split)] and len(examples) == 2
    expected = build(name)
    assert (examples[0].prompt, examples[0].reference, examples[0].answers) == (
        expected.prompt,
        expected.reference,
        expected.answers,
    )


def test_no_local_file_and_no_hub_fails_fast_with_the_fix(monkeypatch, no_data_dir):
    from specbench.models import cache

    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(cache, "hub_reachable", lambda: False)
    start = time.monotonic()
    with pytest.raises(SpecbenchError, match="could not reach the Hugging Face Hub") as error:
        get_task("xsum").load(limit=1)
    assert time.monotonic() - start < 5
    assert "EdinburghNLP/xsum" in str(error.value) and "SPECBENCH_DATA_DIR" in str(error.value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecbenchError, match="unavailable offline") as error:
        get_task("wmt14_en_de").load()
    assert "wmt/wmt14" in str(error.value) and "\n" not in str(error.value)


# -- execute_code: the recipe's opt-in -------------------------------------------------------


def recipe_with(dataset: dict, tmp_path: Path):
    data = {
        "name": "t",
        "models": {"target": {"source": "tiny-llama"}},
        "datasets": [dataset],
        "methods": [{"name": "ar", "method": "autoregressive", "target": "target"}],
    }
    return parse_recipe(data, tmp_path / "r.yaml", known_tasks=set(TASKS))


def test_execute_code_is_an_opt_in_recipe_field(tmp_path):
    assert recipe_with({"task": "humaneval"}, tmp_path).datasets[0].execute_code is False
    assert recipe_with({"task": "humaneval", "execute_code": True}, tmp_path).datasets[0].execute_code is True
    with pytest.raises(SpecbenchError, match=r"datasets\[0\]\.execute_code") as error:
        recipe_with({"task": "humaneval", "execute_code": "yes"}, tmp_path)
    assert "\n" not in str(error.value)


def test_execute_code_on_a_task_without_code_is_an_error(tmp_path, monkeypatch):
    from specbench.pipeline.run.runner import Runner

    recipe = recipe_with({"task": "gsm8k", "execute_code": True}, tmp_path)
    with pytest.raises(
        SpecbenchError, match=r"datasets\[0\]\.execute_code: task gsm8k does not run generated code"
    ):
        Runner(recipe, tmp_path / "out").datasets()


# -- the sandbox -------------------------------------------------------------------------------


def test_sandbox_passes_a_correct_program_and_fails_an_assert():
    assert run_program("assert sum([1, 2]) == 3\nprint('ok')").status == "passed"
    failed = run_program("assert 1 + 1 == 3")
    assert failed.status == "failed" and "AssertionError" in failed.output


def test_sandbox_kills_an_infinite_loop_by_cpu_time():
    start = time.monotonic()
    outcome = run_program("while True:\n    pass", Limits(cpu_seconds=1, wall_seconds=20))
    assert outcome.status == "cpu_limit" and time.monotonic() - start < 15


def test_sandbox_stops_a_memory_hog_and_a_sleeper():
    hog = run_program("blocks = [bytearray(10**8) for _ in range(100)]", Limits(memory_bytes=512 * 1024**2))
    assert hog.status == "memory_limit" and not hog.passed
    sleeper = run_program("import time\ntime.sleep(60)", Limits(wall_seconds=1))
    assert sleeper.status == "timeout"


def test_sandbox_has_no_network_and_no_stdin():
    outcome = run_program("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)")
    assert outcome.status == "failed" and "network access is disabled" in outcome.output
    assert run_program("import sys\nassert sys.stdin.read() == ''").passed


# -- pass@1 on real problems -------------------------------------------------------------------


def test_humaneval_canonical_solutions_pass_and_a_wrong_one_fails(data_dir):
    task = get_task("humaneval")
    rows = [json.loads(line) for line in (data_dir / "humaneval" / "test.jsonl").open()][:3]
    for problem, row in zip(task.load(limit=3), rows, strict=True):
        assert task.score(problem, row["canonical_solution"], execute_code=True) == {"pass@1": 1.0}
    first = task.load(limit=1)[0]
    assert task.score(first, "    return False\n", execute_code=True) == {"pass@1": 0.0}
    # a chat model's fenced full function, and a continuation that runs on past the function
    fenced = f"Here you go:\n```python\n{first.prompt}{rows[0]['canonical_solution']}```\nDone."
    assert task.score(first, fenced, execute_code=True) == {"pass@1": 1.0}
    assert humaneval.completion("    return 1\n\ndef other():\n    pass") == "    return 1\n"


def test_mbpp_exemplars_pass_their_tests_and_answers_are_cut_at_done():
    for _, tests, code in mbpp.SHOTS:
        assert run_program(code + "\n\n" + "\n".join(tests)).passed
    problem = build("mbpp")
    right = "def add(a, b):\n    return a + b\n[DONE]\nYou are an expert"
    assert get_task("mbpp").score(problem, right, execute_code=True) == {"pass@1": 1.0}
    assert get_task("mbpp").score(problem, "def add(a, b):\n    return a - b\n[DONE]", execute_code=True) == {
        "pass@1": 0.0
    }
    assert fenced_code("```\nx = 1\n```") == "x = 1\n" and fenced_code("no code") is None
    fenced = "```python\ndef add(a, b):\n    return a + b\n```"
    assert get_task("mbpp").score(problem, fenced, execute_code=True) == {"pass@1": 1.0}
