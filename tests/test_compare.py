"""``specbench compare``: the same cells of several runs side by side, from cells.csv files written by
the summary from synthetic rows (and one from before the interval columns), with hand-computed values."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pandas as pd
import pytest
from conftest import TWO_CELL_RECIPE
from typer.testing import CliRunner

from specbench.cli import app
from specbench.pipeline.analysis.summary import write_cells_csv
from specbench.pipeline.views.compare import compare_frame, labels, load_run

runner = CliRunner()


def _rows(cell: str, rate: float, dataset: str = "arithmetic/test") -> list[dict]:
    """Two examples of 100 tokens at ``rate`` tokens/s. AR: 100 target passes; SD (k=2): 50 target
    passes and 100 drafter passes at cost 0.1, so SWI MS = 100 / (50 + 10) and 2 tokens per step."""
    speculative = cell != "ar"
    passes = {"t": 50, "d": 100} if speculative else {"t": 100}
    steps = [[2, 1]] * 50 if speculative else [[0, 0]] * 100
    return [
        {
            "key": f"{cell}/{example}",
            "dataset": dataset,
            "cell": cell,
            "method_name": cell.split("[")[0],
            "method": "speculative" if speculative else "autoregressive",
            "params": {"k": 2} if speculative else {},
            "target": "t",
            "drafter": "d" if speculative else None,
            "example_id": f"ex{example}",
            "n_tokens": 100,
            "walltime": 100 / rate,
            "ttft": 0.01,
            "forwards": {
                m: {"forward_passes": n, "tokens_scored": n, "seconds": 0.5 / rate} for m, n in passes.items()
            },
            "steps": steps,
            "accepted_by_position": [],
            "quality": {},
            "costs": {"ms": {"t": 1.0, "d": 0.1}, "pw": {"t": 1.0, "d": 0.1}},
        }
        for example in range(2)
    ]


def _run(path: Path, cells: dict[str, float], dataset: str = "arithmetic/test") -> Path:
    path.mkdir(parents=True)
    write_cells_csv(path, [row for cell, rate in cells.items() for row in _rows(cell, rate, dataset)])
    return path


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    a = _run(tmp_path / "a", {"ar": 10.0, "sd[k=2]": 20.0, "only-a[k=2]": 15.0})
    b = _run(tmp_path / "b", {"ar": 12.0, "sd[k=2]": 30.0, "only-b[k=2]": 9.0})
    return a, b


def _by_method(frame: pd.DataFrame) -> dict[str, dict]:
    return {row["method"]: row for row in frame.to_dict("records")}


def test_cells_side_by_side_with_intervals_and_the_ratio_to_the_first_run(tmp_path: Path):
    a, b = _runs(tmp_path)
    frame = compare_frame([("a", load_run(a)), ("b", load_run(b))])
    assert list(frame["method"]) == ["ar", "sd", "only-a", "only-b"]  # a's order, then b's new cells
    rows = _by_method(frame)
    sd = rows["sd"]
    assert (sd["a tok/s"], sd["b tok/s"]) == ("20.0", "30.0")
    assert sd["a speedup"] == "2.00x [2.00, 2.00]" and sd["b speedup"] == "2.50x [2.50, 2.50]"
    assert sd["a SWI MS"] == sd["b SWI MS"] == "1.67 [1.67, 1.67]"  # 100 / (50 + 100 x 0.1)
    assert sd["a acc. len"] == sd["b acc. len"] == "2.00"
    assert sd["tok/s b/a"] == "1.50x" and rows["ar"]["tok/s b/a"] == "1.20x" and sd["k"] == "2"
    only_a, only_b = rows["only-a"], rows["only-b"]
    assert only_a["a tok/s"] == "15.0" and only_a["b tok/s"] == only_a["b speedup"] == "—"
    assert only_b["a tok/s"] == only_b["a SWI MS"] == "—" and only_b["b tok/s"] == "9.0"
    assert only_a["tok/s b/a"] == only_b["tok/s b/a"] == "—"


def test_older_cells_csv_without_intervals_shows_the_value_alone(tmp_path: Path):
    a, b = _runs(tmp_path)
    old = pd.read_csv(b / "cells.csv")
    old.drop(columns=[c for c in old.columns if c.endswith(("_low", "_high"))]).to_csv(
        b / "cells.csv", index=False
    )
    (b / "cells.sha256").unlink()  # files from before the intervals had no checksum either,
    (b / "checksums.json").unlink()  # nor the record that their directory writes one
    rows = _by_method(compare_frame([("a", load_run(a)), ("b", load_run(b))]))
    assert rows["sd"]["b speedup"] == "2.50x" and rows["sd"]["b SWI MS"] == "1.67"
    assert rows["sd"]["a speedup"] == "2.00x [2.00, 2.00]"


def test_compare_command_formats_and_three_runs(tmp_path: Path):
    a, b = _runs(tmp_path)
    c = _run(tmp_path / "c", {"ar": 5.0, "sd[k=2]": 10.0})
    csv = runner.invoke(app, ["compare", str(a), str(b), str(c), "--format", "csv"])
    assert csv.exit_code == 0, csv.output
    frame = pd.read_csv(StringIO(csv.output), dtype=str).set_index("method")
    assert frame.loc["sd", "tok/s b/a"] == "1.50x" and frame.loc["sd", "tok/s c/a"] == "0.50x"
    assert frame.loc["only-b", "c tok/s"] == "—" and frame.loc["ar", "dataset"] == "arithmetic/test"
    markdown = runner.invoke(app, ["compare", str(a), str(b), "-f", "markdown"])
    assert "### arithmetic/test" in markdown.output
    assert "| sd | 2 | 20.0 | 2.00x [2.00, 2.00] | 1.67 [1.67, 1.67] | 2.00 | 30.0 |" in markdown.output
    latex = runner.invoke(app, ["compare", str(a), str(b), "-f", "latex"])
    assert latex.exit_code == 0 and r"\begin{tabular}" in latex.output and "1.50x" in latex.output
    table = runner.invoke(app, ["compare", str(a), str(b)])
    assert table.exit_code == 0 and "1.50x" in table.output and "—" in table.output


def test_runs_with_the_same_folder_name_are_told_apart_by_path(tmp_path: Path):
    assert labels([tmp_path / "x" / "run", tmp_path / "y" / "run", tmp_path / "z"]) == [
        str(tmp_path / "x" / "run"),
        str(tmp_path / "y" / "run"),
        "z",
    ]


def _one_line_error(args: list[str]) -> str:
    result = runner.invoke(app, ["compare", *args])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    return result.output


def test_compare_errors_are_one_line_exit_2(tmp_path: Path):
    a, b = _runs(tmp_path)
    assert "no such run directory" in _one_line_error([str(a), str(tmp_path / "missing")])
    other = _run(tmp_path / "other", {"ar": 10.0}, dataset="gsm8k/test")
    message = _one_line_error([str(a), str(other)])
    assert "no cell in common with a" in message and "other" in message
    assert "needs two runs or more" in _one_line_error([str(a)])
    (tmp_path / "empty").mkdir()
    assert "cells.csv" in _one_line_error([str(a), str(tmp_path / "empty")])
    assert "holds 3 run directories (a, b, other)" in _one_line_error([str(a), str(tmp_path)])
    assert "unknown format" in _one_line_error([str(a), str(b), "-f", "html"])


# -- runs of real recipes: the same experiment, or not ------------------------------------------------

RECIPE = TWO_CELL_RECIPE.replace("name: two-cells", "name: experiment")


def _measured(tmp_path: Path, name: str, text: str = RECIPE) -> Path:
    from specbench.pipeline.run.runner import Runner
    from specbench.recipe import load_recipe

    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(text)
    out = tmp_path / name
    Runner(load_recipe(recipe), out).run()
    return out


def test_runs_of_one_experiment_in_other_dtypes_compare_and_say_so(tmp_path: Path):
    """Machine, dtype and engine may differ: comparing them is what compare is for."""
    a = _measured(tmp_path, "a")
    b = _measured(tmp_path, "b", RECIPE.replace("float64", "float32"))
    result = runner.invoke(app, ["compare", str(a), str(b), "-f", "csv"])
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(StringIO(result.output.split("\n\n")[0]), dtype=str).set_index("method")
    assert "≠" not in result.output and frame.loc["sd", "b acc. len"] == frame.loc["sd", "a acc. len"]


def test_a_run_from_before_a_generation_setting_existed_compares_with_one_that_leaves_it_unset(
    tmp_path: Path,
):
    a = _measured(tmp_path, "a")
    b = _measured(tmp_path, "b")
    resolved = b / "resolved_recipe.yaml"
    assert "max_length: null" in resolved.read_text()
    resolved.write_text(resolved.read_text().replace("  max_length: null\n", ""))  # an older run's file
    result = runner.invoke(app, ["compare", str(a), str(b)])
    assert result.exit_code == 0 and "≠" not in result.output, result.output


@pytest.mark.parametrize(
    "change, aspect",
    [
        (("max_new_tokens: 8", "max_new_tokens: 6"), "generation settings"),
        (("max_new_tokens: 8", "max_new_tokens: 8, max_length: 200"), "generation settings"),
        (("limit: 3", "limit: 2"), "examples"),
        (("limit: 3}", "limit: 3, max_new_tokens: 6}"), "generation settings"),  # the dataset's own budget
        (("limit: 3}", "limit: 3, chat_template: false}"), "prompts"),
        (("params: {k: 2}", "params: {k: 2, lenience: 2.0}"), "method and parameters"),
        (("init_std: 0.3", "init_std: 0.2"), "models"),  # the same source, built with other options
    ],
)
def test_a_cell_that_is_another_experiment_is_refused_unless_allowed(tmp_path: Path, change, aspect):
    a = _measured(tmp_path, "a")
    b = _measured(tmp_path, "b", RECIPE.replace(*change))
    refused = runner.invoke(app, ["compare", str(a), str(b)])
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert f"is another experiment than in a: its {aspect} differ" in refused.output
    assert "--allow-incomparable" in refused.output
    shown = runner.invoke(app, ["compare", str(a), str(b), "--allow-incomparable"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert f"≠ sd on arithmetic/test in b is another experiment: its {aspect} differ" in text
    marked = runner.invoke(app, ["compare", str(a), str(b), "--allow-incomparable", "-f", "csv"]).output
    frame = pd.read_csv(StringIO(marked), dtype=str).set_index("method")
    assert frame.loc["sd", "tok/s b/a"].endswith(" ≠")


def test_a_run_measured_beside_other_work_is_flagged_under_the_comparison(tmp_path: Path):
    quiet = _run(tmp_path / "quiet", {"ar": 10.0, "sd[k=2]": 20.0})
    busy = tmp_path / "busy"
    busy.mkdir()
    rows = [
        row | {"others_cpu": 0.6, "cpu_headroom": -1.0}
        for cell in ("ar", "sd[k=2]")
        for row in _rows(cell, 5.0)
    ]
    write_cells_csv(busy, rows)
    result = runner.invoke(app, ["compare", str(quiet), str(busy)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert text.count("other processes used more than") == 1
    assert "busy: ! 2 cell(s) (arithmetic/test ar" in text


def test_the_same_example_ids_with_other_gold_answers_or_prompt_texts_are_another_experiment(tmp_path: Path):
    """Example ids alone do not make the same experiment: the gold answers the rows were scored against
    count, and so do the prompts' tokens, not only their number (issue 58)."""

    def with_rows(name: str, rows: list[dict]) -> str:
        data = tmp_path / f"{name}.jsonl"
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return RECIPE.replace(
            "{task: arithmetic, limit: 3}", f"{{task: arithmetic, limit: 2, data_files: {data}}}"
        )

    rows = [
        {"id": "q1", "question": "What is 1 + 2?", "answer": "3"},
        {"id": "q2", "question": "What is 3 + 4?", "answer": "7"},
    ]
    a = _measured(tmp_path, "a", with_rows("a", rows))
    gold = [{**rows[0], "answer": "4"}, rows[1]]
    swapped = [{**rows[0], "question": "What is 2 + 1?"}, rows[1]]  # the same tokens, in another order
    for name, changed, aspect in (("gold", gold, "examples"), ("texts", swapped, "prompt texts")):
        b = _measured(tmp_path, name, with_rows(name, changed))
        lengths = {
            path.name: sorted(json.loads(line)["prompt_tokens"] for line in (path / "examples.jsonl").open())
            for path in (a, b)
        }
        assert lengths[a.name] == lengths[b.name]  # the counts alone would call them the same
        refused = runner.invoke(app, ["compare", str(a), str(b)])
        assert refused.exit_code == 2 and f"its {aspect} differ" in refused.output, refused.output
