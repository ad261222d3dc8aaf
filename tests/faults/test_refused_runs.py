"""Inputs that used to print a wrong number quietly or exhaust the machine: refused before any work,
with one line naming the file, the field and the fix."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import SpecbenchError
from specbench.recipe import load_recipe
from specbench.tasks import TASKS

runner = CliRunner()

RECIPE = """\
name: refused
generation: {max_new_tokens: 4, temperature: 0.0}
models:
  target: {source: tiny-llama, dtype: float64}
  lookup: {source: prompt-lookup}
datasets:
  - {task: arithmetic, limit: 2}
methods:
  - {name: ar, method: autoregressive, target: target}
  - {name: sd, method: speculative, target: target, drafter: lookup, grid: {k: [2, 4]}}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def _refused(tmp_path: Path, text: str, pattern: str) -> None:
    result = runner.invoke(app, ["run", str(_write(tmp_path, text)), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert "Traceback" not in result.output and pattern in line, line
    assert not (tmp_path / "out" / "examples.jsonl").exists()


@pytest.mark.parametrize(
    "second",
    ["  - {task: arithmetic, limit: 2}\n", "  - {task: arithmetic, split: test, max_new_tokens: 9}\n"],
)
def test_a_dataset_listed_twice_is_refused_naming_both(tmp_path: Path, second: str):
    text = RECIPE.replace("  - {task: arithmetic, limit: 2}\n", "  - {task: arithmetic, limit: 2}\n" + second)
    _refused(tmp_path, text, "datasets[1]: arithmetic/test is also datasets[0]")


def test_another_split_of_the_same_task_is_a_dataset_of_its_own(tmp_path: Path):
    text = RECIPE.replace(
        "  - {task: arithmetic, limit: 2}\n",
        "  - {task: arithmetic, split: test}\n  - {task: arithmetic, split: dev}\n",
    )
    recipe = load_recipe(_write(tmp_path, text), known_tasks=set(TASKS))
    assert [d.split for d in recipe.datasets] == ["test", "dev"]


def test_duplicate_example_ids_in_a_data_file_are_refused(tmp_path: Path):
    questions = tmp_path / "question.jsonl"
    rows = [
        {"question_id": 7, "category": "writing", "turns": ["Say hi."]},
        {"question_id": 8, "category": "math", "turns": ["1 + 1?"]},
        {"question_id": 7, "category": "qa", "turns": ["Who?"]},
    ]
    questions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = RECIPE.replace("{task: arithmetic, limit: 2}", f"{{task: spec_bench, data_files: {questions}}}")
    _refused(tmp_path, text, "example id 'spec_bench/7' is given twice (examples 1 and 3)")


def test_a_long_grid_is_checked_in_linear_time_and_a_huge_one_is_refused(tmp_path: Path):
    values = list(range(1, 250_001))
    text = RECIPE.replace("grid: {k: [2, 4]}", "grid: {k: " + json.dumps(values) + "}")
    started = time.perf_counter()
    with pytest.raises(SpecbenchError, match=r"methods\[1\].grid: .*gives 250,000 cells, more than 10,000"):
        load_recipe(_write(tmp_path, text))
    assert time.perf_counter() - started < 30
    repeated = RECIPE.replace("grid: {k: [2, 4]}", "grid: {k: [2, 3, 2]}")
    with pytest.raises(SpecbenchError, match=r"grid.k: 2 appears twice"):
        load_recipe(_write(tmp_path, repeated))


def test_cells_over_every_method_count_against_the_cap(tmp_path: Path):
    grid = "grid: {k: " + json.dumps(list(range(1, 61))) + ", lenience: [1, 1.5, 2, 3, 4]}"  # 300 each
    methods = "".join(
        f"  - {{name: sd{i}, method: speculative, target: target, drafter: lookup, {grid}}}\n"
        for i in range(40)
    )
    head = RECIPE.split("methods:\n")[0].replace("max_new_tokens: 4,", "max_new_tokens: 64,")
    text = f"{head}methods:\n  - {{name: ar, method: autoregressive, target: target}}\n{methods}"
    with pytest.raises(SpecbenchError, match=r"methods: give 12,001 cells in all, more than 10,000"):
        load_recipe(_write(tmp_path, text))


def test_the_specdecpp_view_never_prints_a_negative_throughput():
    """On a run whose drafter is statistical (prompt lookup: no time per pass), Equation 2.1's fit gives
    t_draft < 0; its Equation 2.3 prediction is left out, not printed as -155.72 tok/s."""
    from specbench.papers.specdecpp.efficiency import rates_table, regression_table
    from specbench.pipeline.records.results import read_examples

    rows = read_examples(Path(__file__).resolve().parents[2] / "results/quickstart")
    assert (regression_table(rows)["t_draft_s"] < 0).any()  # the fit this guards against
    predicted = rates_table(rows)["predicted_tokens_per_s"]
    assert not (predicted <= 0).any()


@pytest.mark.parametrize(
    "content, problem",
    [
        (
            b'{"question": "x", "answer": "#### 1"}\n' + b'{"question": "' + b"a" * (5 * 2**20) + b'"}\n',
            "line 2): is longer than 4 MiB",
        ),
        (b'{"question": "\\ud800", "answer": "#### 1"}\n', "line 1): holds a lone UTF-16 surrogate"),
    ],
)
def test_unbounded_or_unencodable_data_lines_are_refused_by_line(
    tmp_path: Path, content: bytes, problem: str
):
    data = tmp_path / "data.jsonl"
    data.write_bytes(content)
    text = RECIPE.replace("{task: arithmetic, limit: 2}", f"{{task: gsm8k, data_files: {data}}}")
    _refused(tmp_path, text, problem)


def test_a_byte_order_mark_is_not_part_of_the_first_row(tmp_path: Path):
    from specbench.tasks import get_task

    data = tmp_path / "data.jsonl"
    data.write_bytes(b'\xef\xbb\xbf{"question": "1 + 1?", "answer": "2 #### 2"}\n')
    (example,) = get_task("gsm8k").load(split="test", data_files=str(data))
    assert "1 + 1?" in example.prompt


def test_a_prompt_and_budget_beyond_the_models_context_is_refused_before_the_first_row(tmp_path: Path):
    """tiny-llama has 4,096 positions: arithmetic prompts (~40 tokens) + 4,090 new tokens do not fit."""
    text = RECIPE.replace("max_new_tokens: 4,", "max_new_tokens: 4090,")
    _refused(tmp_path, text, "new tokens exceed the context of target (4096 positions)")


TINY = Path(__file__).resolve().parents[2] / "recipes" / "quickstart-tiny.yaml"


def _one_line(result, pattern: str) -> None:
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output and pattern in text, text


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda t: "x: " + "[" * 3000 + "]" * 3000 + "\n" + t, "is nested too deeply to be a recipe"),
        (lambda t: t.replace("name: quickstart-tiny", "name: '..'"), "name: '..' is not a valid name"),
        (
            lambda t: t.replace("name: quickstart-tiny", "name: " + "a" * 300),
            "is not a valid name — fix: use up to 100",
        ),
        (lambda t: t.replace("temperature: 0.0", "temperature: .inf"), "generation.temperature: Infinity"),
    ],
    ids=["deep", "dots", "long-name", "infinite-temperature"],
)
def test_hostile_recipes_are_one_line(tmp_path: Path, edit, pattern: str):
    path = _write(tmp_path, edit(TINY.read_text()))
    _one_line(runner.invoke(app, ["plan", str(path)]), pattern)


def test_yaml_merge_keys_are_yaml(tmp_path: Path):
    text = (
        TINY.read_text()
        .replace(
            "generation:\n  max_new_tokens: 24\n  temperature: 0.0\n",
            "generation: &gen\n  max_new_tokens: 24\n  temperature: 0.0\n",
        )
        .replace(
            "  draft:\n    source: tiny-llama\n    dtype: float64\n",
            "  draft:\n    <<: {source: tiny-llama}\n    dtype: float64\n",
        )
    )
    recipe = load_recipe(_write(tmp_path, text))
    assert recipe.models["draft"].source == "tiny-llama"


@pytest.mark.parametrize("out", ["", ".", ".."])
def test_results_never_go_into_the_current_folder_or_above(tmp_path: Path, out: str, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line(
        runner.invoke(app, ["run", str(TINY), "-o", out, "--limit", "1"]),
        "is the current folder or one above it",
    )
    assert not (tmp_path / "examples.jsonl").exists()


def test_an_unwritable_output_directory_is_one_line(tmp_path: Path, monkeypatch):
    def read_only(directory):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("specbench.pipeline.run.runner.RunLock", read_only)
    result = runner.invoke(app, ["run", str(TINY), "-o", str(tmp_path / "out"), "--limit", "1"])
    _one_line(result, "out: cannot be written (Read-only file system) — fix: choose a writable --output-dir")


def test_a_terminal_that_cannot_encode_our_tables_gets_question_marks(tmp_path: Path):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    out = subprocess.run(
        [sys.executable, "-m", "specbench.cli", "report", str(root / "results/quickstart")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-500:]
    assert "quickstart ? passages/test" in out.stdout


def test_a_corrupt_environment_under_a_paper_view_is_one_line(tmp_path: Path):
    import shutil

    root = Path(__file__).resolve().parents[2]
    run = tmp_path / "run"
    shutil.copytree(root / "results/cs_drafting/table2_smollm2_offline", run)
    (run / "environment.json").write_text("{broken")
    result = runner.invoke(app, ["report", str(run), "--paper", "cs-drafting-table2"])
    _one_line(result, "environment.json: is not readable JSON (corrupted or edited)")


def test_bigram_build_refuses_a_binary_corpus_and_an_unwritable_table(tmp_path: Path):
    binary = tmp_path / "corpus.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    args = ["bigram", "build", "--tokenizer", "tiny-llama", "--out", str(tmp_path / "t.json")]
    _one_line(runner.invoke(app, [*args, "--corpus", str(binary)]), "corpus.jsonl:2: is not UTF-8 text")
    good = tmp_path / "ok.jsonl"
    good.write_text('{"text": "a b c"}\n')
    blocked = tmp_path / "file"
    blocked.write_text("a file where a folder should be")
    result = runner.invoke(app, [*args[:-1], str(blocked / "t.json"), "--corpus", str(good)])
    _one_line(result, "cannot write the table")


def test_bench_with_a_statistical_drafter_is_one_line():
    result = runner.invoke(
        app, ["bench", "--target", "tiny-llama", "--drafter", "prompt-lookup", "--engine", "compiled"]
    )
    _one_line(result, "--drafter: prompt-lookup is a statistical drafter")


def test_a_schema_is_never_named_none(tmp_path: Path):
    data = tmp_path / "question.jsonl"
    data.write_text('{"question_id": 1, "category": "qa"}\n')
    text = RECIPE.replace("{task: arithmetic, limit: 2}", f"{{task: spec_bench, data_files: {data}}}")
    result = runner.invoke(app, ["run", str(_write(tmp_path, text)), "-o", str(tmp_path / "out")])
    _one_line(result, "has no field 'turns'")
    assert "None" not in result.output


def test_an_unreachable_ray_address_fails_in_seconds():
    from specbench.pipeline.run.ray_executor import _check_reachable

    started = time.perf_counter()
    with pytest.raises(SpecbenchError, match=r"--address: no Ray cluster answers at 127.0.0.1:1"):
        _check_reachable("127.0.0.1:1")
    assert time.perf_counter() - started < 10
    _check_reachable("auto")  # Ray finds (or refuses) the local cluster itself, quickly


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (
            ("{task: arithmetic, limit: 2}", "{task: arithmetic, limit: 2, data_files: ~nosuchuser/x.jsonl}"),
            "datasets[0].data_files: cannot expand ~nosuchuser in ~nosuchuser/x.jsonl: there is no user",
        ),
        (
            ("{source: tiny-llama, dtype: float64}", "{source: ~nosuchuser/model}"),
            "models.target.source: cannot expand ~nosuchuser",
        ),
        (
            ("{source: prompt-lookup}", "{source: maxgram, options: {bigram: ~nosuchuser/bigram.json}}"),
            "models.lookup.options.bigram: cannot expand ~nosuchuser",
        ),
    ],
    ids=["data-file", "model-folder", "bigram-table"],
)
def test_a_home_that_cannot_be_expanded_is_one_line(tmp_path: Path, edit, pattern: str):
    _refused(tmp_path, RECIPE.replace(*edit), pattern)


def test_a_path_under_an_unset_home_is_one_line(monkeypatch):
    from specbench.errors import expand_home

    monkeypatch.setattr(Path, "expanduser", lambda self: (_ for _ in ()).throw(RuntimeError("no home")))
    with pytest.raises(SpecbenchError, match=r"^field: cannot expand ~ in ~/x: HOME is not set — fix"):
        expand_home("~/x", "field")
