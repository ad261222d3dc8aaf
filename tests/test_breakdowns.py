"""report --baseline CELL and report --by step (specbench/pipeline/analysis/breakdowns.py): by hand on
small rows, and against the outputs the experiment scripts they replace wrote for committed runs."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.pipeline.analysis.breakdowns import against_cell, step_parts

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def row(cell: str, example: str, tokens: int, seconds: float, output=(1, 2), dataset: str = "d") -> dict:
    return {
        "dataset": dataset,
        "cell": cell,
        "example_id": example,
        "n_tokens": tokens,
        "walltime": seconds,
        "output_ids": list(output),
    }


def test_a_cell_against_another_is_a_ratio_of_sums_on_the_examples_both_ran():
    rows = [
        row("base", "a", 10, 1.0),
        row("base", "b", 10, 3.0),
        row("fast", "a", 10, 0.5, output=(9,)),
        row("fast", "b", 10, 1.5),
        row("fast", "c", 10, 0.1),  # the baseline never ran c: left out
        row("replayed", "a", 10, math.nan),
        row("base", "a", 10, 1.0, dataset="other-has-no-fast"),
        row("alone", "a", 10, 1.0, dataset="no-baseline"),
    ]
    frame = against_cell(rows, "base").set_index(["dataset", "cell"])
    fast = frame.loc[("d", "fast")]
    assert fast["speedup"] == pytest.approx((20 / 2.0) / (20 / 4.0)) and fast["n"] == 2
    assert fast["speedup_low"] <= fast["speedup"] <= fast["speedup_high"]
    assert fast["outputs_differ"] == 1 and fast["tokens_per_s"] == pytest.approx(10.0)
    assert frame.loc[("d", "base")][["speedup", "speedup_low", "speedup_high"]].tolist() == [1.0, 1.0, 1.0]
    assert math.isnan(frame.loc[("d", "replayed")]["speedup"])
    assert ("no-baseline", "alone") not in frame.index


def graded(cell: str, scores: tuple[int, ...], **other_metrics: float) -> list[dict]:
    return [
        dict(row(cell, example, 10, 1.0), quality={"accuracy": score, **other_metrics})
        for example, score in zip("abcd", scores, strict=True)
    ]


def test_a_quality_metric_against_the_baseline_is_a_paired_difference_of_means():
    rows = graded("large", (1, 1, 0, 0), bleu=1.0) + graded("small", (0, 1, 0, 0), bleu=1.0)
    frame = against_cell(rows + graded("same", (1, 1, 0, 0)), "large").set_index("cell")
    assert frame.loc["small", "accuracy_diff"] == pytest.approx(-0.25)
    # one discordant question of four: the resamples' differences are -k/4, k = 0..4, so the interval
    # reaches 0 (a question both cells score alike adds no spread)
    assert (
        frame.loc["small", "accuracy_diff_low"] <= -0.25 and frame.loc["small", "accuracy_diff_high"] == 0.0
    )
    assert frame.loc["same", ["accuracy_diff", "accuracy_diff_low", "accuracy_diff_high"]].tolist() == [
        0,
        0,
        0,
    ]
    assert "bleu_diff" not in frame.columns  # corpus BLEU is not a mean over examples


def test_a_step_splits_into_target_drafter_and_what_is_outside_any_pass():
    cells = pd.DataFrame(
        [
            {"dataset": "d", "cell": "ar", "method": "autoregressive", "target": "t", "n": 2,
             "walltime_s": 2.0, "generated_tokens": 100, "target_forwards": 100},
            {"dataset": "d", "cell": "sd", "method": "speculative", "target": "t", "n": 2, "walltime_s": 1.0,
             "generated_tokens": 100, "target_forwards": 42, "drafter_forwards": 80, "drafter_pass_ms": 2.0,
             "pass_ms": '{"t": 15.0, "d": 2.0}', "tokens_per_s": 100.0, "speedup_vs_ar": 2.0,
             "acceptance_length": 2.5},
        ]
    )  # fmt: skip
    (parts,) = step_parts(cells).to_dict("records")
    assert parts["step_ms"] == pytest.approx(1000 / 40) and parts["drafter_passes_per_step"] == 2.0
    assert parts["outside_ms_per_step"] == pytest.approx(25 - 15 * 42 / 40 - 2 * 2)
    assert parts["target_only_bound"] == pytest.approx(20 / (15 / 2.5))  # AR: 20 ms a token


def _csv(args: list[str]) -> pd.DataFrame:
    result = runner.invoke(app, ["report", *args, "--format", "csv"])
    assert result.exit_code == 0, result.output
    return pd.read_csv(io.StringIO(result.output))


@pytest.mark.parametrize(
    "run, baseline, written",
    [
        ("heads/smollm2_eagle_onednn/intel-xeon-amx", "ar-compiled", "vs_compiled_ar.txt"),
        ("heads/smollm2_eagle_compiled_bf16/intel-xeon-amx", "sd-lookup", "vs_lookup.txt"),
    ],
)
def test_baseline_gives_the_numbers_the_script_it_replaces_wrote(run, baseline, written):
    frame = _csv([str(ROOT / "results" / run), "--baseline", baseline]).set_index("cell")
    lines = (ROOT / "results" / run / written).read_text().splitlines()[1:]
    assert len(lines) == len(frame)
    for line in lines:
        cell, speedup, low, high, rate, differ, n = re.fullmatch(
            r"(.+): ([\d.]+)x \[([\d.]+), ([\d.]+)\], ([\d.]+) tokens/s"
            r"(?: \((\d+) of (\d+) outputs differ\))?",
            line,
        ).groups()
        ours = frame.loc[cell]
        assert [f"{ours[c]:.2f}" for c in ("speedup", "speedup_low", "speedup_high")] == [speedup, low, high]
        assert f"{ours['tokens_per_s']:.1f}" == rate and ours["outputs_differ"] == int(differ or 0)
        assert n is None or ours["n"] == int(n)


def test_by_step_gives_the_numbers_the_script_it_replaces_wrote():
    run = ROOT / "results" / "heads" / "smollm2_eagle_gpu_graphs" / "nvidia-h100-80gb"
    frame = _csv([str(run), "--by", "step"]).set_index("cell")
    lines = (run / "step_parts.txt").read_text().splitlines()[3:]
    assert len(lines) == len(frame)
    for line in lines:
        cell, *numbers = line.rsplit(maxsplit=9)
        ours = frame.loc[cell.strip()]
        columns = ("step_ms", "target_ms", "drafter_passes_per_step", "outside_ms_per_step")
        assert [f"{ours[c]:.2f}" for c in columns] == [numbers[3], numbers[4], numbers[5], numbers[7]]
        assert f"{ours['target_only_bound']:.2f}x" == numbers[8]


def test_an_unknown_baseline_names_the_cells_it_could_be():
    run = ROOT / "results" / "heads" / "smollm2_eagle_onednn" / "intel-xeon-amx"
    result = runner.invoke(app, ["report", str(run), "--baseline", "nosuch"])
    assert result.exit_code == 2 and "ar-compiled" in result.output and "Traceback" not in result.output
    both = runner.invoke(app, ["report", str(run), "--baseline", "ar", "--by", "step"])
    assert both.exit_code == 2 and "cannot be combined" in both.output
