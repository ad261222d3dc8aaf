"""Spec-Bench's leaderboard view (``specbench report RUN --by category``) on synthetic example rows
whose speedups are computed by hand: per category and overall, Spec-Bench's mean-of-rates speedup
over the AR cell with its paired bootstrap interval, #Mean Accepted Tokens, "—" where nothing was
timed, and the one-line error for a run whose rows carry no category."""

from __future__ import annotations

import json
import math
from io import StringIO
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.pipeline.analysis.statistics import paired_bootstrap_ratio
from specbench.pipeline.analysis.summary import summarise
from specbench.pipeline.views.categories import MEAN_ACCEPTED, category_speedups, leaderboard

runner = CliRunner()
DATASET = "spec_bench/question"
# question -> raw category: two MT-Bench questions (different raw labels, one headline) and two
# translations
CATEGORY = {"q1": "writing", "q2": "coding", "q3": "translation", "q4": "translation"}


def _row(cell: str, method: str, example: str, n_tokens: int, walltime: float, steps, turn=0, **extra):
    """One examples.jsonl row with the fields the summary and the categories view read."""
    name = cell.split("[")[0]
    return {
        "key": f"{cell}/{example}/{turn}",
        "dataset": DATASET,
        "cell": cell,
        "method_name": name,
        "method": method,
        "params": {"k": 2} if method == "speculative" else {},
        "target": "t",
        "drafter": "d" if method == "speculative" else None,
        "example_id": f"spec_bench/{example}",
        "category": CATEGORY[example],
        "n_tokens": n_tokens,
        "walltime": walltime,
        "ttft": 0.01,
        "forwards": {"t": {"forward_passes": len(steps), "tokens_scored": n_tokens, "seconds": walltime}},
        "steps": steps,
        "accepted_by_position": [],
        "quality": {},
        "costs": {"ms": {"t": 1.0, "d": 0.1}, "pw": {"t": 1.0, "d": 0.1}},
        **extra,
    }


def _rows(with_category: bool = True) -> list[dict]:
    """AR: 10, 10, 20, 20 tokens/s on q1..q4; SD: 20, 20, 25, 25 (q1 in two turns: 60 tokens in 3 s,
    then 40 in 2 s); a replayed SD cell (no time) and a cell that ran the MT-Bench questions only."""
    ar = [[0, 0]]
    rows = [
        _row("ar", "autoregressive", "q1", 100, 10.0, ar),
        _row("ar", "autoregressive", "q2", 100, 10.0, ar),
        _row("ar", "autoregressive", "q3", 50, 2.5, ar),
        _row("ar", "autoregressive", "q4", 50, 2.5, ar),
        _row("sd[k=2]", "speculative", "q1", 60, 3.0, [[2, 2], [2, 0]]),
        _row("sd[k=2]", "speculative", "q1", 40, 2.0, [[2, 1]], turn=1),
        _row("sd[k=2]", "speculative", "q2", 100, 5.0, [[2, 2]]),
        _row("sd[k=2]", "speculative", "q3", 50, 2.0, [[2, 0]]),
        _row("sd[k=2]", "speculative", "q4", 50, 2.0, [[2, 1]]),
        _row("partial[k=2]", "speculative", "q1", 100, 4.0, [[2, 1]]),
        _row("partial[k=2]", "speculative", "q2", 100, 4.0, [[2, 1]]),
    ]
    for example in CATEGORY:
        rows.append(
            _row("replay[k=2]", "speculative", example, 50, math.nan, [[2, 2], [2, 2]], replayed=True)
        )
    if not with_category:
        for row in rows:
            del row["category"]
    return rows


def _write(run_dir: Path, rows: list[dict]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def _board() -> dict[str, dict]:
    frame = leaderboard(category_speedups(_rows()))
    return {row["method"] + row["k"]: row for row in frame.to_dict("records")}


def test_speedup_per_headline_category_pairs_questions_with_the_ar_cell():
    tidy = category_speedups(_rows()).set_index(["cell", "category"])
    # MT-Bench: q1 (writing, two turns summed: 100 tokens in 5 s) and q2 (coding): 20 / 10 tokens/s
    mt = tidy.loc[("sd[k=2]", "mt_bench")]
    assert mt["speedup"] == pytest.approx(2.0) and mt["n"] == 2
    assert (mt["speedup_low"], mt["speedup_high"]) == pytest.approx((2.0, 2.0))  # every resample: 2
    translation = tidy.loc[("sd[k=2]", "translation")]
    assert translation["speedup"] == pytest.approx(25 / 20) and translation["n"] == 2
    # overall, Spec-Bench's ratio of mean rates: mean(20, 20, 25, 25) / mean(10, 10, 20, 20) = 1.5,
    # not the ratio of sums (300 tokens / 14 s over 300 / 25 s = 1.79) that cells.csv reports
    overall = tidy.loc[("sd[k=2]", "overall")]
    assert overall["speedup"] == pytest.approx(1.5) and overall["n"] == 4
    ones = np.ones(4)
    assert (overall["speedup_low"], overall["speedup_high"]) == pytest.approx(
        paired_bootstrap_ratio([20, 20, 25, 25], ones, [10, 10, 20, 20], ones)
    )
    assert 1.25 <= overall["speedup_low"] < 1.5 < overall["speedup_high"] <= 2.0
    cells = summarise(_rows()).set_index("cell")
    assert cells.loc["sd[k=2]", "speedup_vs_ar"] == pytest.approx((300 / 14) / (300 / 25))
    # mean accepted tokens: accepted 2, 0, 1, 2, 0, 1 over six steps, + 1 per step
    assert overall["accepted_per_step_mean"] == pytest.approx(2.0)
    assert tidy.loc[("sd[k=2]", "mt_bench"), "accepted_per_step_mean"] == pytest.approx(
        (2 + 0 + 1 + 2) / 4 + 1
    )
    assert tidy.loc[("ar", "overall"), "speedup"] == pytest.approx(1.0)
    assert tidy.loc[("ar", "overall"), "accepted_per_step_mean"] == pytest.approx(1.0)


def test_leaderboard_has_spec_bench_columns_and_dashes_where_nothing_was_timed():
    board = _board()
    sd = board["sd2"]
    assert list(sd) == ["dataset", "method", "k", "MT-Bench", "Translation", MEAN_ACCEPTED, "Overall", "n"]
    assert sd["MT-Bench"] == "2.00x [2.00, 2.00]" and sd["Translation"] == "1.25x [1.25, 1.25]"
    assert sd["Overall"].startswith("1.50x [") and sd[MEAN_ACCEPTED] == "2.00" and sd["n"] == 4
    replay = board["replay2"]  # replayed: its steps count, its time does not
    assert replay["MT-Bench"] == replay["Translation"] == replay["Overall"] == "—"
    assert replay[MEAN_ACCEPTED] == "3.00"
    partial = board["partial2"]  # ran MT-Bench only: 25 tokens/s over 10
    assert partial["MT-Bench"] == "2.50x [2.50, 2.50]" and partial["Translation"] == "—"
    assert partial["Overall"] == "2.50x [2.50, 2.50]" and partial["n"] == 2
    assert board["ar"]["Overall"] == "1.00x [1.00, 1.00]" and board["ar"][MEAN_ACCEPTED] == "1.00"


def test_report_by_category_prints_every_format(tmp_path: Path):
    run = _write(tmp_path / "sb", _rows())
    markdown = runner.invoke(app, ["report", str(run), "--by", "category", "--format", "markdown"])
    assert markdown.exit_code == 0, markdown.output
    assert "### sb · spec_bench/question" in markdown.output
    assert "| method | k | MT-Bench | Translation | #Mean Accepted Tokens | Overall | n |" in markdown.output
    assert "| sd | 2 | 2.00x [2.00, 2.00] | 1.25x [1.25, 1.25] | 2.00 | 1.50x [" in markdown.output
    csv = runner.invoke(app, ["report", str(run), "--by", "category", "-f", "csv"])
    frame = pd.read_csv(StringIO(csv.output)).set_index("method")
    assert list(frame.columns[:3]) == ["run", "dataset", "k"]
    assert (
        frame.loc["partial", "Translation"] == "—" and frame.loc["sd", "Translation"] == "1.25x [1.25, 1.25]"
    )
    latex = runner.invoke(app, ["report", str(run), "--by", "category", "-f", "latex"])
    assert latex.exit_code == 0 and r"\#Mean Accepted Tokens" in latex.output and "1.25x" in latex.output
    table = runner.invoke(app, ["report", str(tmp_path), "--by", "category"])  # a folder of runs
    assert table.exit_code == 0 and "MT-Bench" in table.output and "2.00x [2.00, 2.00]" in table.output


def test_report_by_category_on_rows_without_a_category_is_one_line_exit_2(tmp_path: Path):
    run = _write(tmp_path / "arith", _rows(with_category=False))
    result = runner.invoke(app, ["report", str(run), "--by", "category"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "carry no category" in result.output and "spec_bench" in result.output and "fix:" in result.output
    unknown = runner.invoke(app, ["report", str(run), "--by", "dataset"])
    assert unknown.exit_code == 2 and "use --by category" in unknown.output
    empty = runner.invoke(app, ["report", str(tmp_path / "nowhere"), "--by", "category"])
    assert empty.exit_code == 2 and "examples.jsonl" in empty.output
