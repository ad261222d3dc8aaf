"""Tasks: prompt templates, scorers, and the loader (real data from ../shared, never the network)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from specbench.errors import SpecbenchError
from specbench.models.tiny import CHAT_TEMPLATE, byte_tokenizer
from specbench.tasks import TASKS, Example, get_task, render_prompt, render_turn
from specbench.tasks.gsm8k import last_number, reference_answer
from specbench.tasks.mmlu import chosen_letter
from specbench.tasks.spec_bench import HEADLINE_CATEGORY, HEADLINES, headline_category

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def data_dir(monkeypatch) -> Path:
    """The offline copies of the Hub datasets: $SPECBENCH_DATA_DIR, else ../shared/data."""
    path = Path(os.environ.get("SPECBENCH_DATA_DIR") or SHARED_DATA)
    if not (path / "gsm8k" / "test.jsonl").is_file() or not (path / "mmlu" / "test.jsonl").is_file():
        pytest.skip(f"no offline data at {path}: set SPECBENCH_DATA_DIR")
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(path))
    return path


@pytest.fixture
def no_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(tmp_path / "empty"))


def first_row(path: Path) -> dict:
    with path.open() as lines:
        return json.loads(next(lines))


def example(task: str, reference: str) -> Example:
    return Example(f"{task}/test/0", "prompt", reference)


def test_registry_names_and_unknown_task_lists_them():
    assert set(TASKS) == {
        "alpaca",
        "arithmetic",
        "passages",
        "gsm8k",
        "mmlu",
        "spec_bench",
        "wmt14_en_de",
        "xsum",
        "cnn_dailymail",
        "humaneval",
        "mbpp",
        "squad_v2",
        "web_questions",
        "natural_questions",
        "trivia_qa",
        "gsm8k_fewshot",
        "wmt14_en_de_fewshot",
        "cnn_dailymail_fewshot",
    }
    assert get_task("gsm8k").hub_id == "openai/gsm8k" and get_task("gsm8k").hub_config == "main"
    assert get_task("mmlu").hub_id == "cais/mmlu" and get_task("mmlu").hub_config == "all"
    assert get_task("arithmetic").hub_id is None
    with pytest.raises(SpecbenchError, match="gsm8k") as error:
        get_task("gsm9k")
    assert "gsm9k" in str(error.value) and "arithmetic" in str(error.value) and "mmlu" in str(error.value)


def test_templates_are_the_papers_exact_strings():
    assert get_task("gsm8k").template.format(question="What is 2+2?") == (
        "Reason the math question below step by step. Question: What is 2+2?.\n Answer: "
    )
    assert get_task("arithmetic").template == get_task("gsm8k").template
    assert get_task("mmlu").template.format(question="Q?", a="w", b="x", c="y", d="z") == (
        "Question: Q?\n(A) w (B) x (C) y (D) z\n Answer: \n Let's think step by step. "
    )


@pytest.mark.parametrize(
    ("output", "reference", "expected"),
    [
        ("16 - 3 - 4 = 9 eggs, so she makes 9 * 2 = 18 dollars.", "18", 1.0),
        ("The answer is 18.", "18", 1.0),
        ("So the total is $1,234.", "1234", 1.0),
        ("It costs 1,234,567 dollars", "1234567", 1.0),
        ("The temperature is -8 degrees", "-8", 1.0),
        ("It costs 3.50 dollars.", "3.5", 1.0),
        ("18 apples, then 5 more: 23", "18", 0.0),  # the last number counts
        ("The answer is eighteen.", "18", 0.0),
        ("", "18", 0.0),
        ("between 10-20 minutes", "20", 1.0),  # a range's dash is not a minus sign
    ],
)
def test_gsm8k_scorer(output, reference, expected):
    assert get_task("gsm8k").score(example("gsm8k", reference), output) == {"accuracy": expected}


def test_last_number_edge_cases():
    assert last_number("1,2,3") == 3.0
    assert last_number("costs .5 dollars") == 0.5
    assert last_number("no digits here") is None


def test_gsm8k_reference_from_real_rows(data_dir):
    row = first_row(data_dir / "gsm8k" / "test.jsonl")
    assert reference_answer(row["answer"]) == "18"  # Janet's ducks
    assert reference_answer("Total 1000 + 234\n#### 1,234") == "1234"
    examples = get_task("gsm8k").load(limit=50)
    assert all(e.reference.lstrip("-").replace(".", "", 1).isdigit() for e in examples)
    assert all("####" not in e.prompt for e in examples)


def test_load_gsm8k_from_data_dir_with_limit(data_dir):
    examples = get_task("gsm8k").load(limit=5)
    row = first_row(data_dir / "gsm8k" / "test.jsonl")
    assert len(examples) == 5
    assert [e.id for e in examples] == [f"gsm8k/test/{i}" for i in range(5)]
    assert examples[0].prompt == get_task("gsm8k").template.format(question=row["question"])
    assert examples[0].reference == "18"
    assert len(get_task("gsm8k").load(split="train", limit=3)) == 3


def test_load_mmlu_from_data_dir_with_limit(data_dir):
    examples = get_task("mmlu").load(limit=3)
    row = first_row(data_dir / "mmlu" / "test.jsonl")
    assert len(examples) == 3 and examples[0].id == "mmlu/test/0"
    a, b, c, d = row["choices"]
    expected_prompt = get_task("mmlu").template.format(question=row["question"], a=a, b=b, c=c, d=d)
    assert examples[0].prompt == expected_prompt
    assert examples[0].reference == "ABCD"[row["answer"]]
    assert {e.reference for e in get_task("mmlu").load(split="dev")} == set("ABCD")


@pytest.mark.parametrize(
    ("output", "letter"),
    [
        ("Let's think. (A) is wrong, so the answer is (B).", "B"),
        ("Answer: C", "C"),
        ("answer:D", "D"),
        ("The answer is A. Wait, the answer is (C)", "C"),  # the last explicit statement wins
        ("Option (A) fails; (D) holds.", "D"),  # bare "(X)" only when no "answer is"
        ("The answer is B, not (A).", "B"),  # "answer is" outranks a later bare "(X)"
        ("The answer is a dog.", None),  # lowercase "a" is not choice A
        ("The answer is Because", None),
        ("I am not sure.", None),
    ],
)
def test_mmlu_letter_extraction(output, letter):
    assert chosen_letter(output) == letter
    expected = 1.0 if letter == "B" else 0.0
    assert get_task("mmlu").score(example("mmlu", "B"), output) == {"accuracy": expected}


def test_embedded_arithmetic_set(no_data_dir):
    examples = get_task("arithmetic").load()
    assert len(examples) == 40
    assert len({e.id for e in examples}) == 40 and examples[0].id == "arith-001"
    assert len({e.prompt for e in examples}) == 40
    for e in examples:
        int(e.reference)  # integer answers
        assert e.prompt.startswith("Reason the math question below step by step. Question: ")
    assert [e.id for e in get_task("arithmetic").load(limit=2)] == ["arith-001", "arith-002"]
    first = examples[0]
    assert get_task("arithmetic").score(first, f"So the answer is {first.reference}.") == {"accuracy": 1.0}


def test_embedded_passages_set(no_data_dir):
    """Each answer copies from its passage (what prompt lookup drafts from), scored by ROUGE-2."""
    task = get_task("passages")
    examples = task.load()
    assert len(examples) == 12 and len({e.id for e in examples}) == 12 and examples[0].id == "passage-001"
    for e in examples:
        instruction, passage = e.prompt.split("\n\nPassage: ")
        assert instruction and passage and e.reference
        shared = set(e.reference.lower().split()) & set(passage.lower().split())
        assert len(shared) >= len(set(e.reference.lower().split())) / 2  # mostly words of the passage
    first = examples[0]
    assert task.score(first, first.reference) == {"rouge2": 100.0}
    assert task.score(first, "Something else entirely.") == {"rouge2": 0.0}


def test_data_files_overrides_and_missing_fields(tmp_path, no_data_dir):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"question": "What is 1+1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n")
    (only,) = get_task("gsm8k").load(data_files=str(mine))
    assert (only.id, only.reference) == ("gsm8k/test/0", "2")
    mine.write_text(json.dumps({"question": "What is 1+1?", "answer": "2"}) + "\n")
    assert [e.reference for e in get_task("arithmetic").load(data_files=str(mine))] == ["2"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "What is 1+1?", "solution": "2"}) + "\n")
    with pytest.raises(SpecbenchError, match="'answer'") as error:
        get_task("gsm8k").load(data_files=str(bad))
    assert str(bad) in str(error.value)

    with pytest.raises(SpecbenchError, match="not found") as error:
        get_task("gsm8k").load(data_files=str(tmp_path / "missing.jsonl"))
    assert "missing.jsonl" in str(error.value) and "data_files" in str(error.value)

    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("this is not json\n")
    with pytest.raises(SpecbenchError, match="garbage.jsonl"):
        get_task("gsm8k").load(data_files=str(garbage))


def test_hub_path_fails_fast_offline(monkeypatch, no_data_dir):
    import datasets

    from specbench.models import cache

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    monkeypatch.setattr(cache, "hub_reachable", lambda: True)  # get past the probe to load_dataset
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.monotonic()
    with pytest.raises(SpecbenchError, match="openai/gsm8k") as error:
        get_task("gsm8k").load(limit=1)
    assert time.monotonic() - start < 5
    assert "data_files" in str(error.value) and "SPECBENCH_DATA_DIR" in str(error.value)

    monkeypatch.setattr(cache, "hub_reachable", lambda: False)
    with pytest.raises(SpecbenchError, match="could not reach"):
        get_task("mmlu").load(limit=1)

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SpecbenchError, match="offline") as error:
        get_task("mmlu").load(limit=1)
    assert "SPECBENCH_DATA_DIR" in str(error.value)


def tiny_tokenizer(chat_template: str | None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = chat_template
    return tokenizer


def test_render_prompt_with_and_without_chat_template():
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    item = Example("x/test/0", "What is 2+2?", "4")
    assert render_prompt(item, tiny_tokenizer(template), True) == "<|user|>What is 2+2?<|end|><|assistant|>"
    assert render_prompt(item, tiny_tokenizer(None), False) == "What is 2+2?"
    with pytest.raises(SpecbenchError, match="chat template") as error:
        render_prompt(item, tiny_tokenizer(None), True)
    assert "chat_template: false" in str(error.value)


def test_jsonl_reads_without_the_datasets_package(monkeypatch):
    """A minimal install (e.g. a GPU image without `datasets`) still reads the embedded set."""
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets" or name.startswith("datasets."):
            raise ImportError("datasets is not installed")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    examples = get_task("arithmetic").load(limit=3)
    assert [e.id for e in examples] == ["arith-001", "arith-002", "arith-003"]


def test_spec_bench_first_turns_and_alpaca_seed_from_the_data_dir(data_dir):
    questions = get_task("spec_bench").load(limit=480)
    assert len(questions) == 480 and len({q.id for q in questions}) == 480
    first = json.loads((data_dir / "spec_bench" / "question.jsonl").open().readline())
    assert (
        questions[0].prompt == first["turns"][0] and questions[0].id == f"spec_bench/{first['question_id']}"
    )
    assert get_task("spec_bench").score(questions[0], "anything") == {}  # a speed-only prompt set
    seeds = get_task("alpaca").load()  # alpaca_seed/ when there is no alpaca/ folder
    assert len(seeds) == 175 and all(s.prompt for s in seeds)
    with_input = next(s for s in seeds if "\n\n" in s.prompt)
    assert with_input.prompt.split("\n\n")[1].strip()


@pytest.fixture
def spec_bench_questions(monkeypatch) -> list[Example]:
    """Spec-Bench's 480 questions from $SPECBENCH_DATA_DIR, else ../shared/data; skipped without them."""
    path = Path(os.environ.get("SPECBENCH_DATA_DIR") or SHARED_DATA)
    if not (path / "spec_bench" / "question.jsonl").is_file():
        pytest.skip(f"no spec_bench/question.jsonl at {path}: set SPECBENCH_DATA_DIR")
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(path))
    return get_task("spec_bench").load()


def test_spec_bench_keeps_every_category_and_the_six_headlines_hold_80_questions_each(spec_bench_questions):
    assert len(spec_bench_questions) == 480
    raw = {q.category for q in spec_bench_questions}
    assert raw == set(HEADLINE_CATEGORY) and len(raw) == 13  # every raw label is mapped, none is left over
    counts = {h: sum(headline_category(q.category) == h for q in spec_bench_questions) for h in HEADLINES}
    assert counts == dict.fromkeys(HEADLINES, 80)
    assert (
        headline_category("writing") == "mt_bench" and headline_category("math_reasoning") == "math_reasoning"
    )
    with pytest.raises(SpecbenchError, match="'poetry'"):
        headline_category("poetry")


def test_spec_bench_multi_turn_questions_keep_their_second_turn(spec_bench_questions):
    multi = [q for q in spec_bench_questions if q.turns]
    assert len(multi) == 80 and all(len(q.turns) == 1 for q in multi)  # 2 turns: prompt + turns[0]
    assert {headline_category(q.category) for q in multi} == {"mt_bench"}
    assert all(q.turns == () for q in spec_bench_questions if headline_category(q.category) != "mt_bench")
    first = multi[0]  # question 81 of the file: the Hawaii travel blog, then "Rewrite ... letter A."
    assert first.id == "spec_bench/81" and first.prompt.startswith("Compose an engaging travel blog post")
    assert first.turns == ("Rewrite your previous response. Start every sentence with the letter A.",)


def _two_turns() -> Example:
    return Example("mt/1", "Name a colour.", "", category="writing", turns=("Now a fruit.",))


def test_render_turn_zero_is_render_prompt_and_turn_one_follows_the_models_own_answer():
    tokenizer = byte_tokenizer()
    assert tokenizer.chat_template == CHAT_TEMPLATE  # a real Jinja chat template, built in-process
    example = _two_turns()
    assert render_turn(example, [], tokenizer, True) == render_prompt(example, tokenizer, True)
    turn1 = render_turn(example, ["  Blue.\n"], tokenizer, True)
    # the template: "<s>{role}\n{content}</s>\n" per message, then "<s>assistant\n"; the answer stripped
    assert turn1 == (
        "<s>user\nName a colour.</s>\n<s>assistant\nBlue.</s>\n<s>user\nNow a fruit.</s>\n<s>assistant\n"
    )
    assert turn1.index("Name a colour.") < turn1.index("Blue.") < turn1.index("Now a fruit.")
    # another template: the same messages in order, whatever the markup
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    assert render_turn(example, ["Blue."], tokenizer, True) == (
        "[user] Name a colour.\n[assistant] Blue.\n[user] Now a fruit.\n[assistant] "
    )


def test_render_turn_without_a_chat_template_continues_the_plain_text():
    example = _two_turns()
    assert render_turn(example, [], None, False) == render_prompt(example, None, False) == "Name a colour."
    # the answer exactly as generated after the prompt, a blank line, the next question
    assert render_turn(example, [" Blue."], None, False) == "Name a colour. Blue.\n\nNow a fruit."


def test_render_turn_refuses_a_turn_the_example_does_not_have_and_a_missing_template():
    with pytest.raises(SpecbenchError, match="has 2 turn"):
        render_turn(_two_turns(), ["Blue.", "Apple."], None, False)
    with pytest.raises(SpecbenchError, match="has 1 turn"):
        render_turn(example("spec_bench", ""), ["answer"], None, False)
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(SpecbenchError, match="no chat template"):
        render_turn(_two_turns(), ["Blue."], tokenizer, True)


def test_a_task_without_a_hub_dataset_names_the_local_file_it_needs(no_data_dir):
    with pytest.raises(SpecbenchError, match="spec_bench/question.jsonl"):
        get_task("spec_bench").load()
