"""Quality-vs-latency curves and Table 2 of Speculative Cascades (papers/spec_cascades); discard and
verification rates, the forward-time regression and Table 1 of SpecDec++ (papers/specdecpp). Every run
here is synthetic: example rows in the runner's schema, summarised by summary.py as a real run is."""

from __future__ import annotations

import json
import math
from io import StringIO
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import SpecbenchError
from specbench.papers.registry import render_paper
from specbench.papers.spec_cascades.curves import (
    curve_points,
    latency_to_match,
    pareto_frontier,
    quality_at_latency,
    run_points,
    table2_metrics,
)
from specbench.papers.spec_cascades.tables import _paper, paper_label, spec_cascades_reference
from specbench.papers.specdecpp.efficiency import (
    beside_sd_curve,
    discard_verification_rates,
    fit_forward_times,
    rates_frontier,
    rates_table,
    regression_table,
    time_per_token,
)
from specbench.papers.specdecpp.tables import specdecpp_reference
from specbench.pipeline.analysis.summary import write_cells_csv

runner = CliRunner()
DATASET = "arithmetic/test"


def _row(
    method_name, method, params, target, drafter, *, n_tokens, walltime, steps, passes, quality, **extra
):
    """One examples.jsonl row; ``passes`` = {model: forward passes}."""
    cell = f"{method_name}{json.dumps(params, sort_keys=True, separators=(',', ':'))}"
    return {
        "key": f"{cell}/{extra.pop('example', 0)}",
        "dataset": DATASET,
        "cell": cell,
        "method_name": method_name,
        "method": method,
        "params": params,
        "target": target,
        "drafter": drafter,
        "n_tokens": n_tokens,
        "walltime": walltime,
        "ttft": 0.01,
        "forwards": {
            m: {"forward_passes": n, "tokens_scored": n, "seconds": 1e-3 * n} for m, n in passes.items()
        },
        "steps": steps,
        "accepted_by_position": [
            [sum(d >= i for d, _ in steps), sum(a >= i for _, a in steps)]
            for i in range(1, max((d for d, _ in steps), default=0) + 1)
        ],
        "quality": {"accuracy": quality},
        "costs": {"ms": {"large": 1.0, "small": 0.1}, "pw": {"large": 1.0, "small": 0.1}},
        **extra,
    }


def _write(run_dir: Path, rows: list[dict], parameters: dict | None = None) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_cells_csv(run_dir, rows)
    models = parameters or {"large": ("t5-v1_1-large", 800_000_000), "small": ("t5-v1_1-small", 80_000_000)}
    recipe = {"name": "synthetic", "models": {n: {"source": s} for n, (s, _) in models.items()}}
    (run_dir / "resolved_recipe.yaml").write_text(yaml.safe_dump(recipe))
    environment = {"models": {n: {"source": s, "parameters": p} for n, (s, p) in models.items()}}
    (run_dir / "environment.json").write_text(json.dumps(environment))
    return run_dir


# -- Speculative Cascades --------------------------------------------------------------------------

# (α, relative latency L, accuracy) of one spec_cascade curve; (0.4, ...) is dominated by α = 0.3.
# The large model has accuracy 0.6 at L = 1 (10 tokens/s); the small one 0.3 at 40 tokens/s.
CURVE = [(0.1, 0.5, 0.4), (0.2, 0.7, 0.55), (0.4, 0.8, 0.5), (0.6, 0.9, 0.65), (0.8, 1.2, 0.7)]


def _cascade_rows(with_ar: bool = True) -> list[dict]:
    rows = []
    for example in range(2):  # two examples per cell, identical: means equal the per-example values
        if with_ar:
            rows.append(
                _row("ar-large", "autoregressive", {}, "large", None, n_tokens=100, walltime=10.0,
                     steps=[[0, 0]] * 100, passes={"large": 100}, quality=0.6, example=example)
            )  # fmt: skip
            rows.append(
                _row("ar-small", "autoregressive", {}, "small", None, n_tokens=100, walltime=2.5,
                     steps=[[0, 0]] * 100, passes={"small": 100}, quality=0.3, example=example)
            )  # fmt: skip
        for alpha, latency, accuracy in CURVE:
            # 100 tokens in 10·L seconds (L = AR tokens/s over ours) and 100·L target passes (SWI = 1/L)
            rows.append(
                _row("sc-token", "spec_cascade", {"rule": "token", "alpha": alpha}, "large", "small",
                     n_tokens=100, walltime=10.0 * latency, steps=[[5, 4]] * 20,
                     passes={"large": round(100 * latency), "small": 0}, quality=accuracy,
                     deferrals=round(50 * latency), example=example)
            )  # fmt: skip
        rows.append(
            _row("seq-chow", "seq_cascade", {"alpha": 0.5}, "large", "small", n_tokens=100, walltime=30.0,
                 steps=[], passes={"large": 300, "small": 0}, quality=0.5, deferrals=30, example=example)
        )  # fmt: skip
    return rows


@pytest.fixture
def cascade_run(tmp_path: Path) -> Path:
    return _write(tmp_path / "cascades", _cascade_rows())


def test_pareto_frontier_keeps_only_undominated_points_sorted_by_latency():
    latency = [0.9, 0.5, 0.8, 0.7, 1.2, math.nan, 0.7]
    quality = [0.65, 0.4, 0.5, 0.55, 0.7, 0.9, 0.50]
    assert pareto_frontier(latency, quality) == [1, 3, 0, 4]  # 0.8/0.5 and the tie 0.7/0.50 lose


def test_table2_metric_interpolates_along_the_frontier_on_a_known_curve():
    x, y = [0.5, 0.7, 0.9, 1.2], [0.4, 0.55, 0.65, 0.7]
    # quality 0.6 is reached halfway between L = 0.7 (0.55) and 0.9 (0.65): L = 0.8, 1.25x faster
    assert latency_to_match(x, y, 0.6) == pytest.approx(0.8)
    # at L = 1, a third of the way from 0.9 (0.65) to 1.2 (0.7)
    assert quality_at_latency(x, y, 1.0) == pytest.approx(0.65 + 0.05 / 3)
    assert math.isnan(latency_to_match(x, y, 0.8))  # never as good as the large model
    assert latency_to_match(x, y, 0.3) == 0.5  # its fastest point already beats it: read there
    assert math.isnan(quality_at_latency([1.1, 1.3], [0.7, 0.8], 1.0))  # always slower
    assert quality_at_latency([0.5, 0.8], [0.4, 0.6], 1.0) == 0.6  # the curve ends before L = 1


def test_curves_of_a_run_measure_latency_against_the_targets_ar_cell(cascade_run: Path):
    points = run_points(cascade_run)
    sc = points[points["curve"] == "sc-token"].set_index("alpha")
    assert sc.loc[0.6, "relative_latency_walltime"] == pytest.approx(0.9)
    assert sc.loc[0.6, "relative_latency_swi"] == pytest.approx(0.9)
    assert sc.loc[0.6, "deferral_rate"] == pytest.approx(0.45)
    assert sc.loc[0.6, "rejection_rate"] == pytest.approx(20 / 100)  # 20 steps, each rejected one
    assert sc.loc[0.6, "quality"] == 0.65 and sc.loc[0.6, "metric"] == "accuracy"
    assert list(sc["frontier_walltime"]) == [True, True, False, True, True]
    small = points[points["role"] == "small"].iloc[0]
    assert small["relative_latency_walltime"] == pytest.approx(0.25)  # 40 tokens/s against 10
    assert small["relative_latency_swi"] == pytest.approx(0.1)  # the MS cost of the small model
    assert small["quality"] == 0.3
    metrics = table2_metrics(points).set_index("curve")
    for axis in ("walltime", "swi"):
        assert metrics.loc["sc-token", f"latency_reduction_{axis}"] == pytest.approx(1.25)
        assert metrics.loc["sc-token", f"best_quality_{axis}"] == pytest.approx(0.65 + 0.05 / 3)
    assert math.isnan(metrics.loc["seq-chow", "latency_reduction_walltime"])  # 0.5 < 0.6, never matches
    assert math.isnan(metrics.loc["seq-chow", "best_quality_walltime"])  # 3x slower than the large model


def test_curves_split_a_method_entry_by_its_non_alpha_parameters():
    cells = pd.DataFrame(
        [
            {"dataset": "d", "cell": "ar", "method_name": "ar", "method": "autoregressive", "target": "L",
             "drafter": None, "params": "{}", "tokens_per_s": 10.0, "swi_ms": 1.0, "quality_accuracy": 0.5},
            *[
                {"dataset": "d", "cell": f"sc{rule}{a}", "method_name": "sc", "method": "spec_cascade",
                 "target": "L", "drafter": "S", "params": json.dumps({"rule": rule, "alpha": a}),
                 "tokens_per_s": 20.0, "swi_ms": 2.0, "quality_accuracy": a}
                for rule in ("chow", "opt")
                for a in (0.2, 0.4)
            ],
        ]
    )  # fmt: skip
    points = curve_points(cells)
    assert set(points.loc[points["role"] == "method", "curve"]) == {"sc [rule=chow]", "sc [rule=opt]"}
    assert points.loc[points["role"] == "method", "alpha"].tolist() == [0.2, 0.4, 0.2, 0.4]


def test_cli_plot_curves_writes_the_csvs_and_nonempty_pngs(cascade_run: Path):
    result = runner.invoke(app, ["plot", str(cascade_run), "--figure", "curves"])
    assert result.exit_code == 0, result.output
    curves = pd.read_csv(cascade_run / "curves.csv")
    assert {"quality", "relative_latency_walltime", "relative_latency_swi", "deferral_rate"} <= set(curves)
    assert set(curves["role"]) == {"method", "large", "small"}
    table = pd.read_csv(cascade_run / "cascades_table2.csv")
    assert table.set_index("curve").loc["sc-token", "latency_reduction_walltime"] == pytest.approx(1.25)
    for axis in ("walltime", "swi", "deferral"):
        png = cascade_run / f"pareto_{axis}.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000


def test_curves_need_an_ar_cell_of_the_target(tmp_path: Path):
    run = _write(tmp_path / "no-ar", _cascade_rows(with_ar=False))
    with pytest.raises(SpecbenchError, match="no cell here has an autoregressive cell of its target"):
        run_points(run)
    result = runner.invoke(app, ["plot", str(run), "--figure", "curves"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "add `method: autoregressive`" in result.output


def test_cli_plot_all_writes_what_applies_and_says_what_it_skipped(cascade_run: Path):
    result = runner.invoke(app, ["plot", str(cascade_run), "--figure", "all"])
    assert result.exit_code == 0, result.output
    assert (cascade_run / "acceptance_by_position.png").is_file() and (cascade_run / "curves.csv").is_file()
    assert "skipped specdecpp" in result.output and not (cascade_run / "specdecpp_rates.csv").exists()


def test_cli_plot_rejects_an_unknown_figure(cascade_run: Path):
    result = runner.invoke(app, ["plot", str(cascade_run), "--figure", "nosuch"])
    assert result.exit_code == 2 and "--figure: unknown figure 'nosuch'" in result.output


def test_spec_cascades_reference_holds_the_two_rows_of_table2_exactly():
    table = spec_cascades_reference()["table2"]
    rows = {r["method"]: r for r in table["rows"]}
    assert list(rows) == ["SeqCascade [Chow]", "TokenCascade [Chow]"]
    # every cell, digit by digit as the paper's text prints them (Narasimhan et al., ICLR 2025, Table 2)
    assert rows["SeqCascade [Chow]"]["latency_reduction"] == [1.55, 0.84, 0.98, 2.46, 0.93, 0.94]
    assert rows["SeqCascade [Chow]"]["best_quality"] == [16.56, 12.97, 9.91, 16.29, 16.40, 11.18]
    assert rows["TokenCascade [Chow]"]["latency_reduction"] == [1.03, 0.93, 1.40, 1.46, 0.82, 1.51]
    assert rows["TokenCascade [Chow]"]["best_quality"] == [16.52, 13.30, 10.36, 16.65, 17.09, 11.44]
    assert [tuple(c) for c in table["columns"]] == [
        (pair, dataset) for pair in ("Small→Large", "Small→XL") for dataset in ("WMT", "XSum", "CNNDM")
    ]
    assert table["caption"].startswith("Reduction in latency from different methods (T=1, γ=5) when matching")
    assert table["caption"].endswith(
        "Quality is measured in terms of the BLEU for WMT and ROUGE-2 for XSum and CNNDM. "
        "See Figure 2 for T=0.5 and § E.2 for T=0."
    )
    assert len(table["columns"]) == 6 and "not invented" in table["note"]
    # a run on one of the paper's datasets is shown that dataset's paper values, both model pairs
    ref = spec_cascades_reference()
    seq = rows["SeqCascade [Chow]"]
    assert _paper(seq, "latency_reduction", "xsum/validation", ref) == "Small→Large 0.84 / Small→XL 0.93"
    assert _paper(seq, "best_quality", "wmt14_en_de/test", ref) == "Small→Large 16.56 / Small→XL 16.29"


def test_report_paper_spec_cascades_prints_ours_beside_the_papers(cascade_run: Path):
    text = render_paper(cascade_run, "spec-cascades-table2", "markdown")
    assert "1.55×" in text and "16.56" in text  # the paper's SeqCascade row
    assert (
        "| sc-token | SpecCascade [Token] | accuracy | 0.60 | 1.25× | 1.25× | — | 0.67 | 0.67 | — | 5 |"
        in text
    )
    assert "| seq-chow | SeqCascade [Chow] |" in text and "1.55/0.84/0.98" in text
    assert "large = t5-v1_1-large" in text and "Not the paper's models" not in text
    # the original T5 (not v1.1) is not the paper's model family: the caption says so
    from specbench.papers.registry import PAPERS

    paper = PAPERS["spec-cascades-table2"]
    assert paper.is_target("google/t5-v1_1-large, google/t5-v1_1-small")
    assert not paper.is_target("google-t5/t5-large, google-t5/t5-small")
    frame = pd.read_csv(StringIO(render_paper(cascade_run, "spec-cascades-table2", "csv")))
    hit = frame[(frame["method"] == "sc-token") & (frame["metric"] == "latency_reduction_walltime")]
    assert hit["ours"].item() == pytest.approx(1.25)
    result = runner.invoke(app, ["report", str(cascade_run), "--paper", "spec-cascades-table2"])
    assert result.exit_code == 0, result.output
    assert "Speculative Cascades Table 2" in result.output and "0.84×" in result.output


def _cell(cell, method, *, n, walltime, tokens, swi, quality, target="L", drafter="S", params=None):
    """One cells.csv row as summary.py writes it (totals over the cell's ``n`` examples)."""
    return {
        "dataset": "d", "cell": cell, "method_name": cell.split("[")[0], "method": method,
        "target": target, "drafter": drafter, "params": json.dumps(params or {}), "n": n,
        "walltime_s": walltime, "generated_tokens": tokens, "tokens_per_s": tokens / walltime,
        "swi_ms": swi, "quality_rouge2": quality,
    }  # fmt: skip


def test_relative_latency_is_decoding_time_per_example_as_the_paper_measures_it():
    # large: 2 examples, 100 tokens and 10 s each. The cascade stops after 50 tokens in 6 s per
    # example: 0.6 of the large model's decoding time, although each token takes 1.2x as long.
    # MS cost: 80 target passes for 100 tokens (SWI 1.25), 40 per example against AR's 100: 0.4.
    # small: 60 tokens in 2.5 s per example (0.25), each of its passes 1/10 of the large's (MS
    # cost by parameter count), so 0.1 * 60 / 100 = 0.06 of the large model's cost.
    cells = pd.DataFrame(
        [
            _cell("ar-L", "autoregressive", n=2, walltime=20.0, tokens=200, swi=1.0, quality=20.0,
                  drafter=None),
            _cell("ar-S", "autoregressive", n=2, walltime=5.0, tokens=120, swi=1.0, quality=5.0,
                  target="S", drafter=None),
            _cell("sc[alpha=0.5]", "spec_cascade", n=2, walltime=12.0, tokens=100, swi=1.25, quality=18.0,
                  params={"rule": "token", "k": 5, "alpha": 0.5}),
        ]
    )  # fmt: skip
    environment = {"L": {"parameters": 1_000_000_000}, "S": {"parameters": 100_000_000}}
    points = curve_points(cells, environment).set_index("role")
    method, small, large = points.loc["method"], points.loc["small"], points.loc["large"]
    assert method["relative_latency_walltime"] == pytest.approx(0.6)
    assert method["relative_time_per_token"] == pytest.approx(1.2)
    assert method["relative_latency_swi"] == pytest.approx(0.4)
    assert small["relative_latency_walltime"] == pytest.approx(0.25)
    assert small["relative_latency_swi"] == pytest.approx(0.06)
    assert large["relative_latency_walltime"] == 1.0 and large["relative_latency_swi"] == 1.0


def test_table2_metrics_of_a_curve_that_matches_only_beyond_the_large_models_latency():
    # (relative latency, ROUGE-2) per α; α = 0.3 (1.2, 13) is dominated by α = 0.2 (1.1, 14).
    # The large model scores 15: reached between (1.1, 14) and (1.4, 16) at 1.1 + 0.5 * 0.3 = 1.25,
    # a 1 / 1.25 = 0.8x "reduction" (the paper prints such values, e.g. 0.84x). At latency 1 the
    # frontier is 0.4 / 0.5 of the way from (0.6, 10) to (1.1, 14): 10 + 0.8 * 4 = 13.2.
    curve = [(0.1, 0.6, 10.0), (0.2, 1.1, 14.0), (0.3, 1.2, 13.0), (0.4, 1.4, 16.0)]
    rows = [
        _cell("ar-L", "autoregressive", n=1, walltime=10.0, tokens=50, swi=1.0, quality=15.0, drafter=None)
    ]
    rows += [
        _cell(f"lossy[alpha={a}]", "spec_cascade", n=1, walltime=10.0 * x, tokens=50, swi=1.0 / x, quality=y,
              params={"rule": "lossy", "k": 5, "beta": 1.0, "tune_beta": False, "alpha": a})
        for a, x, y in curve
    ]  # fmt: skip
    metrics = table2_metrics(curve_points(pd.DataFrame(rows))).iloc[0]
    for axis in ("walltime", "swi"):
        assert metrics[f"latency_reduction_{axis}"] == pytest.approx(0.8)
        assert metrics[f"best_quality_{axis}"] == pytest.approx(13.2)
        assert metrics[f"frontier_alphas_{axis}"] == "0.1 0.2 0.4"
    assert metrics["large_quality"] == 15.0 and metrics["points"] == 4 and metrics["rule"] == "lossy"
    assert json.loads(metrics["params"]) == {"beta": 1.0, "k": 5, "rule": "lossy", "tune_beta": False}
    assert paper_label(metrics["method"], json.loads(metrics["params"])) == "SpecDecode [Lossy]"


@pytest.mark.parametrize(
    ("method", "params", "label"),
    [
        ("spec_cascade", {"rule": "lossy", "tune_beta": False, "alpha": 0.3}, "SpecDecode [Lossy]"),
        ("spec_cascade", {"rule": "lossy"}, "SpecDecode [Lossy]"),  # tune_beta not recorded: false
        ("spec_cascade", {"rule": "lossy", "tune_beta": True}, "SpecDecode [Lossy*]"),
        ("spec_cascade", {"rule": "sd"}, "SpecDecode"),
        ("spec_cascade", {"rule": "bild"}, "BiLD*"),
        ("spec_cascade", {"rule": "token"}, "SpecCascade [Token]"),
        ("spec_cascade", {"rule": "token_v2"}, "SpecCascade [TokenV2]"),
        ("spec_cascade", {"rule": "opt_log"}, None),  # not a rule the paper names
        ("token_cascade", {"rule": "chow", "max_small_tokens": 10}, "TokenCascade [Chow]"),
        ("token_cascade", {"rule": "chow_log"}, None),
        ("seq_cascade", {"alpha": 0.5}, "SeqCascade [Chow]"),
        ("oracle_cascade", {"rule": "diff"}, "Cascade [Diff] (oracle)"),
        ("oracle_cascade", {"rule": "chow"}, None),
        ("bild", {"fallback_alpha": 0.5}, "BiLD"),
        ("speculative", {"k": 5}, None),
    ],
)
def test_paper_label_names_the_papers_method_of_a_cell(method, params, label):
    assert paper_label(method, params) == label
    if set(params) <= {"rule"}:  # the older call with a rule name reads the same
        assert paper_label(method, params.get("rule", "")) == label


def test_a_broken_environment_json_is_one_line_naming_the_file(cascade_run: Path):
    (cascade_run / "environment.json").write_text("{not json")
    # named by whichever reader meets it first: the rows' check (unsigned rows: environment.json dates
    # them) or the curves'
    broken = r"environment\.json: (not a JSON object|is not readable)"
    with pytest.raises(SpecbenchError, match=broken) as error:
        run_points(cascade_run)
    assert "\n" not in str(error.value) and "fix:" in str(error.value)


# -- the recipes of the paper's settings -------------------------------------------------------------

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "spec_cascades"
GEMMA_TASKS = {  # task -> the paper's dataset label in App. E.1 (spec_cascades.yaml setup)
    "gsm8k_fewshot": "GSM8K", "mbpp": "MBPP", "squad_v2": "SQuAD2", "web_questions": "WebQuestions",
    "natural_questions": "NaturalQA", "trivia_qa": "TriviaQA", "wmt14_en_de_fewshot": "WMT",
    "cnn_dailymail_fewshot": "CNNDM",
}  # fmt: skip


def _recipes(pattern: str):
    from specbench.recipe import load_recipe
    from specbench.tasks import TASKS

    paths = sorted(p for p in RECIPES.glob(pattern) if not p.stem.endswith("-tiny"))
    return [(path, load_recipe(path, known_tasks=set(TASKS))) for path in paths]


def test_gpu_recipes_cover_the_papers_temperatures_and_block_sizes():
    t5 = _recipes("t5_small_large*.yaml")
    gemma = _recipes("gemma_2b_27b*.yaml")
    temperatures = {recipe.generation.temperature for _, recipe in t5}
    assert temperatures == {0.0, 0.1, 0.5, 1.0}  # Sec. 6
    for _, recipe in t5 + gemma:  # every recipe has the large and small AR points of its curves
        assert {c.target for c in recipe.cells() if c.method == "autoregressive"} == {"large", "small"}
    t5_k = {c.params["k"] for _, r in t5 for c in r.cells() if c.method == "spec_cascade"}
    gemma_k = {c.params["k"] for _, r in gemma for c in r.cells() if c.method == "spec_cascade"}
    assert t5_k == {3, 5, 7} and gemma_k == {1}  # App. E.4 for T5, Figure 3 for Gemma
    (table2,) = [r for p, r in t5 if p.name == "t5_small_large.yaml"]
    assert table2.generation.temperature == 1.0  # Table 2: T = 1, γ = 5, α swept per method
    rules = {c.params["rule"] for c in table2.cells() if c.method == "spec_cascade" and c.params["k"] == 5}
    assert {"sd", "lossy", "bild", "chow", "diff", "opt", "token"} <= rules
    assert {"token_cascade", "seq_cascade"} <= {c.method for c in table2.cells()}
    assert all(d.split == "validation" for _, r in t5 for d in r.datasets)  # App. E.1's samples


def test_gemma_recipes_run_every_dataset_few_shot_at_the_papers_output_length():
    lengths = spec_cascades_reference()["setup"]["gemma_max_output"]
    seen = set()
    for path, recipe in _recipes("gemma_2b_27b*.yaml"):
        assert {m.source for m in recipe.models.values()} == {"google/gemma-2-27b-it", "google/gemma-2-2b-it"}
        for dataset in recipe.datasets:
            label = GEMMA_TASKS[dataset.task]
            length = dataset.max_new_tokens or recipe.generation.max_new_tokens
            assert length == lengths[label], (path.name, dataset.task)
            seen.add(label)
    assert seen == set(lengths)  # the eight datasets of App. E.1


def test_t5_recipes_use_the_papers_output_length_per_dataset():
    lengths = spec_cascades_reference()["setup"]["t5_datasets"]
    labels = {"wmt14_en_de": "WMT", "xsum": "XSum", "cnn_dailymail": "CNNDM"}
    for path, recipe in _recipes("t5_small_large*.yaml"):
        for dataset in recipe.datasets:
            length = dataset.max_new_tokens or recipe.generation.max_new_tokens
            assert length == lengths[labels[dataset.task]]["max_output"], (path.name, dataset.task)


# -- SpecDec++ -------------------------------------------------------------------------------------

T_DRAFT, T_TARGET = 0.02, 0.1


def _sd_rows(rng: np.random.Generator, noise: float = 0.0, examples: int = 6) -> list[dict]:
    """speculative (k = 2, 4, 6) and specdecpp (threshold 0.3, 0.7) rows timed by Equation 2.1."""
    rows = []
    cells = [("sd", "speculative", {"k": k}) for k in (2, 4, 6)]
    cells += [("sdpp", "specdecpp", {"threshold": t}) for t in (0.3, 0.7)]
    for name, method, params in cells:
        for example in range(examples):
            k_max = params.get("k", 8)
            steps = []
            for _ in range(int(rng.integers(5, 30))):
                drafted = k_max if method == "speculative" else int(rng.integers(1, k_max + 1))
                steps.append([drafted, int(rng.integers(0, drafted + 1))])
            n_tokens = sum(a + 1 for _, a in steps)
            n_draft, n_target = sum(d for d, _ in steps), len(steps)
            walltime = T_DRAFT * n_draft + T_TARGET * n_target + noise * rng.standard_normal()
            rows.append(
                _row(name, method, params, "large", "small", n_tokens=n_tokens, walltime=walltime,
                     steps=steps, passes={"large": n_target, "small": n_draft}, quality=0.5, example=example)
            )  # fmt: skip
    for example in range(examples):
        n = int(rng.integers(20, 60))
        rows.append(
            _row("ar", "autoregressive", {}, "large", None, n_tokens=n, walltime=T_TARGET * n,
                 steps=[[0, 0]] * n, passes={"large": n}, quality=0.5, example=example)
        )  # fmt: skip
    return rows


LLAMA = {"large": ("meta-llama/Llama-2-70b-chat-hf", 69e9), "small": ("meta-llama/Llama-2-7b-chat-hf", 6.7e9)}


def test_discard_and_verification_rates_are_per_generated_token():
    steps = [(4, 4), (4, 1), (2, 0)]  # tokens: 5 + 2 + 1 = 8; discarded: 0 + 3 + 2 = 5
    assert discard_verification_rates(steps, 8) == (5 / 8, 3 / 8)
    assert discard_verification_rates([(0, 0)] * 7, 7) == (0.0, 1.0)  # autoregressive
    assert all(math.isnan(v) for v in discard_verification_rates([], 0))


def test_regression_recovers_exact_forward_times_with_r2_one():
    rows = _sd_rows(np.random.default_rng(0))
    fits = regression_table(rows).set_index(["setting", "dataset"])
    for setting in ("pooled", "speculative", "specdecpp"):
        fit = fits.loc[(setting, "all")]
        assert fit["t_draft_s"] == pytest.approx(T_DRAFT) and fit["t_target_s"] == pytest.approx(T_TARGET)
        assert fit["r2"] == pytest.approx(1.0)
    assert fits.loc[("stand-alone", DATASET), "t_target_s"] == pytest.approx(T_TARGET)
    # with exact times, Equation 2.3 predicts each cell's measured throughput exactly
    rates = rates_table(rows)
    sd = rates[rates["method"] != "autoregressive"]
    assert np.allclose(sd["predicted_tokens_per_s"], sd["tokens_per_s"])
    assert np.allclose(sd["predicted_tokens_per_s_counts"], sd["tokens_per_s"])
    one = sd.iloc[0]
    assert 1 / one["tokens_per_s"] == pytest.approx(
        time_per_token(T_DRAFT, T_TARGET, one["discard_rate"], one["verification_rate"])
    )


def test_regression_on_noisy_times_is_close_and_r2_below_one():
    rng = np.random.default_rng(1)
    n_draft = rng.integers(20, 200, size=400)
    n_target = rng.integers(5, 60, size=400)
    walltime = T_DRAFT * n_draft + T_TARGET * n_target + rng.normal(0, 0.05, size=400)
    fit = fit_forward_times(walltime, n_draft, n_target)
    assert fit.t_draft == pytest.approx(T_DRAFT, rel=0.03) and fit.t_target == pytest.approx(
        T_TARGET, rel=0.03
    )
    assert 0.98 < fit.r2 < 1.0 and fit.n == 400
    assert math.isnan(fit_forward_times([1.0, 2.0], [1, 2], [2, 4]).t_draft)  # collinear: no fit


def test_a_cell_is_read_against_sd_curve_at_its_own_discard_rate():
    # SD's cells (k = 2, 4, 6) at discard 0.1, 0.3, 0.5 verify 0.4, 0.2, 0.15: the curve at 0.2 is 0.3
    # and at 0.4 is 0.175; a cell outside SD's range, SD's own cells and AR read nothing
    rates = pd.DataFrame(
        [
            {"dataset": "d", "method": "speculative", "discard_rate": 0.5, "verification_rate": 0.15},
            {"dataset": "d", "method": "speculative", "discard_rate": 0.1, "verification_rate": 0.4},
            {"dataset": "d", "method": "speculative", "discard_rate": 0.3, "verification_rate": 0.2},
            {"dataset": "d", "method": "specdecpp", "discard_rate": 0.2, "verification_rate": 0.25},
            {"dataset": "d", "method": "specdecpp", "discard_rate": 0.4, "verification_rate": 0.18},
            {"dataset": "d", "method": "specdecpp", "discard_rate": 0.7, "verification_rate": 0.1},
            {"dataset": "e", "method": "speculative", "discard_rate": 0.0, "verification_rate": 9.0},
            {"dataset": "e", "method": "speculative", "discard_rate": 1.0, "verification_rate": 9.0},
            {"dataset": "e", "method": "autoregressive", "discard_rate": 0.0, "verification_rate": 1.0},
        ]
    ).assign(target="t", drafter="q")
    out = beside_sd_curve(rates)
    curve = out["sd_curve_verification_rate"].tolist()
    assert curve[3] == pytest.approx(0.3) and curve[4] == pytest.approx(0.175)
    assert all(math.isnan(c) for c in curve[:3] + curve[5:])
    assert out["below_sd_curve"].tolist() == ["", "", "", True, False, "", "", "", ""]


def test_rates_frontier_prefers_lower_discard_and_verification():
    discard = [0.1, 0.3, 0.2, 0.5]
    verify = [0.5, 0.2, 0.6, 0.25]
    assert rates_frontier(discard, verify) == [0, 1]


def test_cli_plot_specdecpp_writes_rates_regression_and_figure4(tmp_path: Path):
    run = _write(tmp_path / "sdpp", _sd_rows(np.random.default_rng(2)), LLAMA)
    result = runner.invoke(app, ["plot", str(run), "--figure", "specdecpp"])
    assert result.exit_code == 0, result.output
    rates = pd.read_csv(run / "specdecpp_rates.csv")
    assert {"discard_rate", "verification_rate", "predicted_tokens_per_s", "threshold", "k"} <= set(rates)
    regression = pd.read_csv(run / "specdecpp_regression.csv")
    assert regression.loc[regression["setting"] == "pooled", "r2"].min() == pytest.approx(1.0)
    png = run / "specdecpp_pareto.png"
    assert png.is_file() and png.stat().st_size > 1000


def test_specdecpp_reference_prints_table1_rows_swapped_with_the_reason():
    ref = specdecpp_reference()
    rows = {r["algorithm"]: r for r in ref["table1"]["rows"]}
    assert rows["SpecDec++"] == {
        "algorithm": "SpecDec++",
        "Alpaca": 18.88,
        "HumanEval": 20.61,
        "GSM8K": 20.95,
    }
    assert ref["table1"]["as_printed"]["SpecDec (baseline)"]["Alpaca"] == 18.88  # what the text shows
    for algorithm, speedups in ref["table1"]["speedups"].items():
        for dataset, speedup in speedups.items():
            assert rows[algorithm][dataset] / ref["autoregressive_tokens_per_s"] == pytest.approx(
                speedup, abs=0.006
            )


def test_report_paper_specdecpp_prints_ours_beside_table1(tmp_path: Path):
    run = _write(tmp_path / "sdpp", _sd_rows(np.random.default_rng(3)), LLAMA)
    cells = pd.read_csv(run / "cells.csv")
    best_pp = cells[cells["method"] == "specdecpp"]["tokens_per_s"].max()
    text = render_paper(run, "specdecpp", "markdown")
    assert f"| sdpp | arithmetic | SpecDec++ | {best_pp:.2f} | — |" in text
    assert "| sdpp | Alpaca | SpecDec++ | — | 18.88 | — | 2.04 |" in text
    assert "| sdpp | Alpaca | SpecDec | — | 17.62 | — | 1.90 |" in text
    assert "printed swapped" in text and "large = meta-llama/Llama-2-70b-chat-hf" in text
    assert "Not the paper's models" not in text
    assert "| sdpp | pooled | all | 20.00 | 100.00 | 1.0000 |" in text  # the fit, in ms
    result = runner.invoke(app, ["report", str(run), "--paper", "specdecpp"])
    assert result.exit_code == 0, result.output
    assert "18.88" in result.output and "SpecDec++ Table 1" in result.output


def test_report_paper_specdecpp_needs_speculative_cells(cascade_run: Path):
    result = runner.invoke(app, ["report", str(cascade_run), "--paper", "specdecpp"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "no speculative or specdecpp cells" in result.output


def test_specdecpp_view_has_the_oracle_and_table_3_by_head_name(tmp_path):
    from specbench.papers.base import Run
    from specbench.papers.specdecpp.tables import table1

    head = "specdecpp:t/d/{}"
    cells = pd.DataFrame(
        [
            {"dataset": "alpaca/train", "cell": "ar", "method": "autoregressive", "params": "{}",
             "tokens_per_s": 10.0, "speedup_vs_ar": 1.0},
            {"dataset": "alpaca/train", "cell": "o", "method": "oracle_sd", "params": "{}",
             "tokens_per_s": 30.0, "speedup_vs_ar": 3.0},
            *(
                {"dataset": "alpaca/train", "cell": f"pp{t}", "method": "specdecpp",
                 "params": json.dumps({"head": head.format("wrej6-d3"), "threshold": t}),
                 "tokens_per_s": 20.0 + t, "speedup_vs_ar": 2.0}
                for t in (0.3, 0.7)
            ),
            {"dataset": "gsm8k/test", "cell": "pp1", "method": "specdecpp",
             "params": json.dumps({"head": head.format("wrej1-d0")}), "tokens_per_s": 15.0,
             "speedup_vs_ar": 1.5},
        ]
    )  # fmt: skip
    (tmp_path / "heads").mkdir()
    manifest = {"train": {"binary_kl": 0.4567}, "eval": {"binary_kl": 0.4321}}  # specdecpp train's keys
    (tmp_path / "heads" / "wrej6-d3.json").write_text(json.dumps(manifest))
    views, _ = table1([Run("r", tmp_path, cells)])
    rows = {(r["Dataset"], r["Algorithm"]): r for r in views[0].rows}
    assert rows[("Alpaca", "Oracle")]["tok/s ours"] == "30.00"
    assert rows[("Alpaca", "Oracle")]["×AR paper"] == "2.92"  # Sec. 2.1, Alpaca only
    assert rows[("GSM8K", "Oracle")]["tok/s paper"] == "—"
    ablation = {(r["w_rej"], r["D"]): r for r in views[1].rows}
    assert len(ablation) == 20 and ablation[("6", "3")]["Alpaca paper"] == "18.80"
    assert ablation[("6", "3")]["Alpaca ours"] == "20.70"  # the best threshold of that head
    assert ablation[("1", "0")]["GSM8K ours"] == "15.00" and ablation[("1", "0")]["Alpaca ours"] == "—"
    assert ablation[("12", "4")]["Alpaca ours"] == "—"  # wrej1-d0 is not wrej12-d4 or wrej1-d00
    # each head's KLs come from the manifest a run directory keeps of it
    assert (ablation[("6", "3")]["train KL ours"], ablation[("6", "3")]["eval KL ours"]) == ("0.457", "0.432")
    assert ablation[("6", "3")]["eval KL paper"] == "0.582" and ablation[("1", "0")]["eval KL ours"] == "—"


def test_specdecpp_table_3_caption_compares_the_kl_trends_and_says_why_ours_differs():
    from specbench.papers.specdecpp.tables import kl_orderings, specdecpp_reference

    rows = specdecpp_reference()["table3"]["rows"]

    def head(w, d):  # KL rises with w_rej; falls with depth, except at w_rej 12 (the linear head)
        kl = 0.3 + 0.01 * w - (0.01 * d if w != 12 else -0.01 * d)
        return {"eval": {"binary_kl": kl, "mean_label": 0.125, "mean_prediction": 0.1 if d == 0 else 0.02}}

    manifests = {(r["w_rej"], r["depth"]): head(r["w_rej"], r["depth"]) for r in rows}
    (caption,) = kl_orderings(rows, manifests)
    assert (
        "eval KL paper: rises with w_rej at 5 of 5 depths; lower at D = 4 than at D = 0 for 4 of 4" in caption
    )
    assert (
        "eval KL ours: rises with w_rej at 5 of 5 depths; lower at D = 4 than at D = 0 for 3 of 4" in caption
    )
    assert (
        "Ours is lower at D = 0 for w_rej 12: mean predicted acceptance against a mean label of 0.125"
        in caption
    )
    assert "w_rej 12: D = 0 0.100, D = 4 0.020" in caption
    assert kl_orderings(rows, {key: None for key in manifests}) == []  # no heads kept: no caption


def _timed_passes(rows: list[dict], t_ar: float) -> list[dict]:
    """The rows with each model's forward seconds as Equation 2.1 timed them (the AR cell's one-token
    passes at ``t_ar`` seconds, its walltime too)."""
    for row in rows:
        for model, forwards in row["forwards"].items():
            per_pass = (
                t_ar if row["method"] == "autoregressive" else T_TARGET if model == "large" else T_DRAFT
            )
            forwards["seconds"] = per_pass * forwards["forward_passes"]
        if row["method"] == "autoregressive":
            row["walltime"] = t_ar * row["forwards"]["large"]["forward_passes"]
    return rows


def test_equation_2_3_priced_at_the_measured_pass_times_where_the_fit_cannot_separate_them():
    from specbench.papers.specdecpp.efficiency import measured_times

    rows = _timed_passes(_sd_rows(np.random.default_rng(4)), t_ar=0.1)
    times = measured_times(rows)
    assert times[("large", "small", DATASET)] == pytest.approx((T_DRAFT, T_TARGET))
    assert times[("large", "small", "all")] == pytest.approx((T_DRAFT, T_TARGET))
    rates = rates_table(rows)
    sd = rates[rates["method"] != "autoregressive"]
    assert np.allclose(sd["predicted_tokens_per_s_measured"], sd["tokens_per_s"])
    assert np.allclose(sd["relative_error_measured"], 0.0, atol=1e-9)
    # the same rows with collinear counts (every draft as long as its round): no fit, still a price
    for row in [r for r in rows if r["method"] != "autoregressive"]:
        row["forwards"]["small"]["forward_passes"] = 3 * row["forwards"]["large"]["forward_passes"]
        row["forwards"]["small"]["seconds"] = T_DRAFT * row["forwards"]["small"]["forward_passes"]
    rates = rates_table(rows)
    sd = rates[rates["method"] != "autoregressive"]
    assert sd["predicted_tokens_per_s"].isna().all()
    assert sd["predicted_tokens_per_s_measured"].notna().all()
    assert rates.loc[rates["method"] == "autoregressive", "predicted_tokens_per_s_measured"].isna().all()


@pytest.mark.parametrize(("t_ar", "predicted"), [(0.02, True), (0.1, False)])
def test_specdecpp_view_says_whether_equation_2_3_predicts_running_slower_than_the_target(
    tmp_path, t_ar, predicted
):
    run = _write(tmp_path / "sdpp", _timed_passes(_sd_rows(np.random.default_rng(5)), t_ar), LLAMA)
    text = render_paper(run, "specdecpp", "markdown")
    notes = [line for line in text.splitlines() if line.startswith("sdpp arithmetic: SpecDec++'s best")]
    if not predicted:  # one-token passes as dear as a verification: SpecDec++ is the faster here
        assert not notes
        return
    (note,) = notes
    assert f"cost {1000 * T_TARGET:.1f} ms against {1000 * t_ar:.1f} ms for its one-token pass" in note
    assert "so the theory predicts the reversal" in note and "the best SD cell runs" in note
