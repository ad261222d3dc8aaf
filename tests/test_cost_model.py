"""Walltime predicted from counts: pass shapes recorded and reconstructed, pass costs fitted and probed,
held-out and carried predictions, and the probe/predict commands."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import tiny_recipes
import torch
from conftest import TWO_CELL_RECIPE
from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import SpecbenchError
from specbench.models.base import ForwardCounter
from specbench.models.tiny import build_tiny
from specbench.pipeline.analysis import cost_model, prediction, profiles
from specbench.pipeline.records.results import read_examples

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results" / "prediction" / "amd-epyc-family26-avx512-bf16" / "demo"


# -- shapes: what a pass fed and read ----------------------------------------------------------------


def test_a_models_passes_record_tokens_fed_and_context_read():
    from specbench.models.hf import HFModel

    model = HFModel(build_tiny("tiny-llama", seed=0, dtype=torch.float64)[0], "m")
    model.start(torch.tensor([3, 4, 5, 6]))
    model.score(torch.tensor([7]), 0)  # prefill: prompt + 1 token at context 0
    model.score(torch.tensor([7, 8, 9, 10]), 2)  # 3 fed after 5 cached
    model.rollback(2)
    model.score(torch.tensor([7, 8, 11]), 0)  # 1 fed (11) after 6 cached
    assert model.counter.snapshot()["shapes"] == {"5": [1, 0], "3": [1, 5], "1": [1, 6]}
    with model.counter.kept():  # passes that are not the method's leave the shapes alone
        model.score(torch.tensor([7, 8, 11, 12]), 0)
    assert model.counter.shapes == {5: [1, 0], 3: [1, 5], 1: [1, 6]}
    model.counter.reset()
    assert "shapes" not in model.counter.snapshot()


def test_an_encoder_pass_is_a_shape_of_its_own():
    from specbench.models.hf import HFModel

    model = HFModel(build_tiny("tiny-t5", seed=0, dtype=torch.float64)[0], "m")
    model.start(torch.tensor([3, 4, 5]))
    model.score(torch.tensor([7]), 0)
    snapshot = model.counter.snapshot()
    assert snapshot["encoder_passes"] == 1 and snapshot["shapes"]["encoder:3"] == [1, 0]
    shapes, recorded = cost_model.row_shapes({"forwards": {"m": snapshot}}, "m")
    assert recorded and (3.0, 1, 0.0) in shapes


def test_committed_rows_without_shapes_are_reconstructed_exactly_for_ar_and_speculative_cells():
    """Rows from before shapes were recorded are rebuilt from prompt length, steps and token counts;
    on rows that recorded both, the rebuilt shapes equal the recorded ones."""
    rows = read_examples(COMMITTED)
    checked = 0
    for row in rows:
        for model, counts in row["forwards"].items():
            if "shapes" not in counts:
                continue
            recorded, _ = cost_model.row_shapes(row, model)
            legacy = copy.deepcopy(row)
            del legacy["forwards"][model]["shapes"]
            rebuilt, was_recorded = cost_model.row_shapes(legacy, model)
            assert not was_recorded and sorted(rebuilt) == sorted(recorded), (row["cell"], row["example_id"])
            checked += 1
    assert checked == len(rows)


def test_reconstruction_falls_back_to_a_prefill_and_mean_passes():
    row = {"prompt_tokens": 10, "n_tokens": 6, "steps": [], "target": "t"}
    row["forwards"] = {"d": {"forward_passes": 4, "tokens_scored": 16, "encoder_passes": 0}}
    shapes, _ = cost_model.row_shapes(row, "d")
    assert shapes == [(10.0, 1, 0.0), (2.0, 3, 3 * 13.0)]
    assert cost_model.shape_sums(shapes)[2] == 16  # every token scored is in a shape


# -- pass costs ---------------------------------------------------------------------------------------


def test_a_linear_cost_is_recovered_from_row_sums():
    truth = cost_model.Linear(a1=0.018, a=0.02, b=4e-4, e=1.5e-5, f=2e-7)
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(30):
        shapes = [(float(n), int(rng.integers(1, 40)), float(rng.integers(0, 20000))) for n in (1, 3, 5, 90)]
        samples.append((shapes, truth.seconds(shapes)))
    fitted = cost_model.fit_linear(samples)
    for name in ("a1", "a", "b", "e", "f"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name


def test_nnls_keeps_coefficients_non_negative():
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # least squares would give a negative slope
    b = cost_model.nnls(x, y)
    assert (b >= 0).all() and b[1] == 0 and b[0] == pytest.approx(2.0)


def test_a_size_table_is_exact_at_probed_points_and_linear_between():
    points = [
        (n, c, 0.01 + 0.001 * n + 1e-6 * c * (2 if n == 1 else 1)) for n in (1, 4, 16) for c in (0, 500, 1000)
    ]
    table = cost_model.fit_size_table(points)
    for n, c, seconds in points:
        assert table.pass_seconds(n, c) == pytest.approx(seconds)
    assert table.pass_seconds(10, 0) == pytest.approx(0.01 + 0.001 * 10)  # between 4 and 16
    assert table.pass_seconds(0.5, 0) == pytest.approx(table.pass_seconds(1, 0))  # held below the smallest
    assert cost_model.fit_quality(table, points)["max_relative_error"] == pytest.approx(0, abs=1e-9)
    shapes = [(4.0, 3, 1500.0)]  # three passes at a mean context of 500
    assert table.seconds(shapes) == pytest.approx(3 * table.pass_seconds(4, 500))


def test_a_roofline_is_bound_by_memory_for_small_passes_and_by_compute_for_large_ones():
    roof = cost_model.Roofline(
        weight_bytes=2e9, flops_per_token=2e9, kv_bytes_per_token=1e5, bandwidth=2e12, peak_flops=1e15
    )
    assert roof.pass_seconds(1, 0) == pytest.approx(1e-3)  # 2 GB at 2 TB/s
    assert roof.pass_seconds(4, 0) == pytest.approx(1e-3)  # still memory-bound
    assert roof.pass_seconds(4000, 0) == pytest.approx(8e-3)  # 8 TFLOP at 1 PFLOP/s
    assert roof.pass_seconds(1, 1000) == pytest.approx(1e-3 + 1e8 / 2e12)


# -- predictions ----------------------------------------------------------------------------------------


def _synthetic_rows(cost, loop_per_step: float) -> list[dict]:
    """AR and SD rows whose walltimes a known pass cost and loop overhead give exactly."""
    rows = []
    for i in range(6):
        prompt = 20 + 5 * i
        for cell, method, steps in (
            ("ar", "autoregressive", [[0, 0]] * 12),
            ("sd", "speculative", [[3, 2]] * 4),
        ):
            fed = [d + 1 for d, _ in steps]
            fed[0] += prompt - 1
            counts = {"forward_passes": len(steps), "tokens_scored": sum(fed), "encoder_passes": 0}
            row = {
                "key": f"{cell}-{i}",
                "dataset": "d",
                "cell": cell,
                "method": method,
                "target": "t",
                "example_id": f"e{i}",
                "prompt_tokens": prompt,
                "n_tokens": 12,
                "steps": steps,
                "forwards": {"t": counts},
            }
            shapes, _ = cost_model.row_shapes(row, "t")
            counts["seconds"] = cost.seconds(shapes)
            row["walltime"] = counts["seconds"] + loop_per_step * len(steps)
            rows.append(row)
    return rows


def test_held_out_predictions_are_exact_when_one_linear_cost_made_the_times():
    rows = _synthetic_rows(cost_model.Linear(0.018, 0.02, 5e-4, 1e-5, 0.0), loop_per_step=1e-3)
    predicted = prediction.cross_validated(rows, lambda r: "m")
    assert set(predicted) == {r["key"] for r in rows}
    for row in rows:
        assert predicted[row["key"]] == pytest.approx(row["walltime"], rel=1e-6)
    table = prediction.cell_predictions(rows, predicted, lambda r: "m")
    sd = table[table["cell"] == "sd"].iloc[0]
    assert sd["speedup_predicted"] == pytest.approx(sd["speedup"], rel=1e-6)
    assert prediction.median_abs_error(table) == pytest.approx(0, abs=1e-6)


def test_a_rows_prediction_is_fitted_without_the_row_itself():
    """One row made 5x slower (its passes and walltime) is predicted by the other examples' fit, which
    the clean rows make exact: its prediction is its clean walltime. Fitted in-sample, the outlier
    would pull its own prediction up."""
    rows = _synthetic_rows(cost_model.Linear(0.018, 0.02, 5e-4, 1e-5, 0.0), loop_per_step=1e-3)
    outlier = next(r for r in rows if r["key"] == "sd-3")
    clean = outlier["walltime"]
    outlier["forwards"]["t"]["seconds"] *= 5
    outlier["walltime"] *= 5
    folds = {prediction._fold(r) for r in rows}
    assert len(folds) > 1  # the examples split: there is another half to fit on
    predicted = prediction.cross_validated(rows, lambda r: "m")
    assert predicted["sd-3"] == pytest.approx(clean, rel=1e-6)
    assert prediction.missed_rows(rows, predicted, lambda r: "m") == {("d", "sd", "m"): 1}


def test_the_pass_cost_fit_weighs_each_row_by_the_inverse_of_its_time():
    """Two rows of one-token passes: 1 pass in 1.0 s and 100 passes in 50 s. Weighted by 1 / seconds
    (relative error), t = k x passes with k = sum(p / y) / sum((p / y)^2) = (1 + 2) / (1 + 4) = 0.6;
    unweighted, k = sum(p y) / sum(p^2) = 5001 / 10001, about 0.5."""
    samples = [([(1.0, 1, 0.0)], 1.0), ([(1.0, 100, 0.0)], 50.0)]
    fitted = cost_model.fit_linear(samples)
    assert fitted.seconds([(1.0, 10, 0.0)]) == pytest.approx(6.0, rel=1e-9)


def test_summary_carries_the_held_out_prediction_beside_the_measured_speedup():
    from specbench.pipeline.analysis.summary import summarise

    rows = _synthetic_rows(cost_model.Linear(0.018, 0.02, 5e-4, 1e-5, 0.0), loop_per_step=1e-3)
    for row in rows:
        row.update(
            method_name=row["cell"],
            params={},
            drafter=None,
            ttft=0.0,
            quality={},
            costs={"ms": {"t": 1.0}, "pw": {"t": 1.0}},
            accepted_by_position=[],
            first_divergence=None,
        )
    table = summarise(rows, "m").set_index("cell")
    assert table.loc["sd", "speedup_predicted"] == pytest.approx(table.loc["sd", "speedup_vs_ar"], rel=1e-6)
    assert table.loc["sd", "speedup_prediction_error"] == pytest.approx(0, abs=1e-6)


SMOLLM2 = {"source": "smollm2-135m-instruct", "revision": None, "options": {}}


def test_a_probe_profile_prices_a_run_and_names_what_it_lacks(tmp_path):
    """A profile prices a run's model by its recipe name and weights (format 2) or, as profiles of
    format 1 did, by its source; a profile without an entry for a run's model is of other models."""
    entry = {"table": {"sizes": [1, 5, 100], "alpha": [0.02, 0.022, 0.06], "gamma": [1e-5, 1e-5, 1e-5]}}
    by_name = {
        "format": profiles.FORMAT,
        "kind": "probe",
        "models": {"smollm2": entry | {"identity": SMOLLM2}},
    }
    by_source = {"format": profiles.FORMAT_BY_SOURCE, "kind": "probe", "models": {SMOLLM2["source"]: entry}}
    table = prediction.predict_run(COMMITTED, by_name)
    assert set(table["cell"]) == {"ar", "sd-lookup[k=4]", "hf-lookup"}
    assert (table["tokens_per_s_predicted"] > 0).all()
    assert table.equals(prediction.predict_run(COMMITTED, by_source))
    for other in (dict(by_name, models={"tiny": entry}), dict(by_source, models={"tiny-llama": entry})):
        with pytest.raises(SpecbenchError, match="no entry for the run's model 'smollm2'.*specbench probe"):
            prediction.predict_run(COMMITTED, other)
    tiny = dict(by_name, models={"smollm2": entry | {"identity": SMOLLM2 | {"source": "tiny-llama"}}})
    with pytest.raises(
        SpecbenchError, match="models.smollm2.identity: the profile's 'smollm2' is other weights"
    ):
        prediction.predict_run(COMMITTED, tiny)


def test_profiles_are_read_from_files_or_named_devices(tmp_path):
    assert profiles.read_profile("h100")["kind"] == "roofline"
    with pytest.raises(SpecbenchError, match="neither a profile file nor a known device.*h100"):
        profiles.read_profile(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "other"}')
    with pytest.raises(SpecbenchError, match="format is not"):
        profiles.read_profile(str(bad))


def test_probe_then_predict_from_the_command_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TWO_CELL_RECIPE)
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", str(recipe), "--output-dir", str(out)]).exit_code == 0
    cells = (out / "cells.csv").read_text().splitlines()[0].split(",")
    assert {"tokens_per_s_predicted", "speedup_predicted", "speedup_prediction_error"} <= set(cells)
    rows = read_examples(out)
    assert all("shapes" in r["forwards"]["target"] for r in rows)

    profile = tmp_path / "profile.json"
    probed = runner.invoke(
        app,
        [
            "probe",
            str(recipe),
            "--out",
            str(profile),
            "--sizes",
            "1,3",
            "--contexts",
            "4,16",
            "--rounds",
            "1",
            "--roofline",
        ],
    )
    assert probed.exit_code == 0, probed.output
    written = json.loads(profile.read_text())
    assert written["format"] == profiles.FORMAT and written["machine"]["id"]
    entry = written["models"]["target"]  # by the recipe's name, with the model's weights
    assert entry["identity"] == {
        "source": "tiny-llama",
        "revision": None,
        "options": {"seed": 1, "init_std": 0.3},
    }
    assert [p[:2] for p in entry["points"]] == [[1.0, 5.0], [1.0, 17.0], [3.0, 5.0], [3.0, 17.0]]
    assert entry["dtype"] == "float64" and entry["engine"] == "eager"

    held_out = runner.invoke(app, ["predict", str(out)])
    assert held_out.exit_code == 0 and "held out" in held_out.output
    carried = runner.invoke(app, ["predict", str(out), "--profile", str(profile), "--against", str(out)])
    assert carried.exit_code == 0, carried.output
    assert "speedup there" in carried.output and "Median |speedup error|" in carried.output
    no_fp64 = runner.invoke(app, ["predict", str(out), "--profile", "h100"])
    assert no_fp64.exit_code == 2 and "no peak FLOP/s for float64" in no_fp64.output
    roof = runner.invoke(app, ["predict", str(out), "--profile", "h100", "--dtype", "bfloat16", "-f", "csv"])
    assert roof.exit_code == 0, roof.output  # priced from the models' facts and the H100's figures
    # --dtype prices by a roofline: with a probe's entries it would change nothing, so it is refused
    ignored = runner.invoke(app, ["predict", str(out), "--profile", str(profile), "--dtype", "float32"])
    assert ignored.exit_code == 2 and "--dtype" in ignored.output and "--roofline" in ignored.output
    measured_roof = ["predict", str(out), "--profile", str(profile), "--roofline", "--dtype", "float64"]
    assert runner.invoke(app, measured_roof).exit_code == 0  # the probe's measured roofline, in float64
    assert written["roofline"]["bandwidth"] > 0 and written["roofline"]["peak_flops"]["float64"] > 0
    as_csv = runner.invoke(app, ["predict", str(out), "--profile", str(profile), "--format", "csv"])
    assert as_csv.output.splitlines()[0].startswith("dataset,cell,rows,tokens_per_s")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--profile", "tpu-v9"], "neither a profile file nor a known device"),
        (["--loop", "sometimes"], "--loop: unknown value"),
        (["--against", "elsewhere"], "--against: needs --profile"),
        (["--dtype", "bfloat16"], "--dtype: prices by a profile's roofline: needs --profile"),
        (["--roofline"], "--roofline: prices by a profile's roofline: needs --profile"),
        (["--profile", "h100", "--dtype", "int3"], "--dtype: unknown dtype 'int3'"),
    ],
)
def test_bad_predict_input_is_one_line(arguments, message):
    result = runner.invoke(app, ["predict", str(COMMITTED), *arguments])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output


def test_probe_refuses_a_grid_it_cannot_time(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TWO_CELL_RECIPE)
    result = runner.invoke(app, ["probe", str(recipe), "--out", str(tmp_path / "p.json"), "--sizes", "0,x"])
    assert result.exit_code == 2 and "--sizes" in result.output


def test_a_counter_without_passes_keeps_its_old_shape():
    assert ForwardCounter().snapshot() == {
        "forward_passes": 0,
        "tokens_scored": 0,
        "encoder_passes": 0,
        "seconds": 0.0,
    }


def test_the_turns_of_a_conversation_sum_their_shapes():
    from specbench.decoding.generation import Generation

    def turn(shapes):
        counts = {"forward_passes": sum(p for p, _ in shapes.values()), "tokens_scored": 0, "seconds": 0.1}
        return Generation(
            tokens=[1], walltime=0.1, ttft=0.1, steps=[(0, 0)], forwards={"t": counts | {"shapes": shapes}}
        )

    joined = Generation.joined([turn({"9": [1, 0], "1": [3, 30]}), turn({"14": [1, 0], "1": [2, 40]})])
    assert joined.forwards["t"]["shapes"] == {"9": [1, 0], "1": [5, 70], "14": [1, 0]}
    assert joined.forwards["t"]["forward_passes"] == 7


COMMITTED_RUNS = sorted(p.parent for p in (ROOT / "results").glob("**/examples.jsonl"))


@pytest.mark.parametrize("run", COMMITTED_RUNS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_every_committed_run_is_predicted_held_out(run):
    rows = read_examples(run)
    timed = {(r["dataset"], r["cell"]) for r in rows if prediction.timed(r)}
    machine_of = lambda r: r.get("machine", "")  # noqa: E731
    table = prediction.cell_predictions(rows, prediction.cross_validated(rows, machine_of), machine_of)
    assert set(zip(table["dataset"], table["cell"], strict=True)) == timed
    assert (table["tokens_per_s_predicted"] > 0).all()


def test_a_probe_profile_with_roofline_figures_prices_models_it_did_not_probe_only_when_asked():
    profile = profiles.read_profile(str(COMMITTED.parent / "profile_bfloat16_eager.json"))
    assert profile["roofline"]["bandwidth"] > 0
    probed = prediction.predict_run(COMMITTED, profile)
    roofline = prediction.predict_run(COMMITTED, profile, roofline=True)
    ar = roofline["method"] == "autoregressive"
    # a SmolLM2 pass here is far from the CPU's bounds: the roofline is faster than the probe
    assert (roofline.loc[ar, "tokens_per_s_predicted"] > 2 * probed.loc[ar, "tokens_per_s_predicted"]).all()
    unprobed = dict(profile, models={})  # a profile of other models: refused, --roofline named as the way
    with pytest.raises(SpecbenchError, match="no entry for the run's model 'smollm2'.*or add --roofline"):
        prediction.predict_run(COMMITTED, unprobed, loop=False)
    everything = prediction.predict_run(COMMITTED, unprobed, loop=False, roofline=True)
    assert everything.equals(prediction.predict_run(COMMITTED, profile, loop=False, roofline=True))
    with pytest.raises(SpecbenchError, match="no roofline figures.*probe again with --roofline"):
        prediction.predict_run(COMMITTED, dict(profile, roofline=None), roofline=True)


def test_the_report_predicts_for_a_cells_csv_written_before_predictions(tmp_path):
    import pandas as pd

    from specbench.pipeline.records.results import CELLS, CELLS_SHA, text_checksum
    from specbench.pipeline.views.report import load_cells

    recipe = tmp_path / "r.yaml"
    recipe.write_text(TWO_CELL_RECIPE)
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", str(recipe), "--output-dir", str(out)]).exit_code == 0
    written = pd.read_csv(out / CELLS)
    old = written.drop(columns=list(prediction.HELD_OUT_COLUMNS)).to_csv(index=False)
    (out / CELLS).write_text(old)  # as an older specbench wrote it, checksum and all
    (out / CELLS_SHA).write_text(text_checksum(old) + "\n")
    cells = load_cells(out).set_index("cell")
    assert cells.loc["sd", "speedup_predicted"] == pytest.approx(
        written.set_index("cell").loc["sd", "speedup_predicted"]
    )
    assert (out / CELLS).read_text() == old  # read, never rewritten


# -- a profile is bound to the models it probed; --against to the same experiment ------------------------

ONE_SOURCE_TWICE = tiny_recipes.recipe(
    "one-source-twice",  # every tiny recipe: the target and its drafter are both tiny-llama
    {"target": tiny_recipes.tiny(seed=1, init_std=0.3), "draft": tiny_recipes.tiny(layers=1)},
    [tiny_recipes.ar(), tiny_recipes.speculative(k=2)],
    limit=2,
    max_new_tokens=8,
    temperature=0.0,
    seed=0,
    warmup=0,
)


def test_a_recipe_naming_one_source_twice_gets_each_models_own_prices(tmp_path):
    """probe keyed its profile by source, so the drafter's entry priced the target; now each recipe
    model has its own entry, and a profile of format 1 for such a run is refused as ambiguous."""
    import yaml

    from specbench.pipeline.records.results import read_environment

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(ONE_SOURCE_TWICE))
    out, profile_path = tmp_path / "run", tmp_path / "p.json"
    assert runner.invoke(app, ["run", str(recipe), "-o", str(out)]).exit_code == 0
    grid = ["--sizes", "1,3", "--contexts", "4,16", "--rounds", "1"]
    probed = runner.invoke(app, ["probe", str(recipe), "--out", str(profile_path), *grid])
    assert probed.exit_code == 0, probed.output
    profile = profiles.read_profile(str(profile_path))
    target, draft = profile["models"]["target"], profile["models"]["draft"]
    assert target["source"] == draft["source"] == "tiny-llama"
    assert target["identity"] != draft["identity"] and target["parameters"] > draft["parameters"]
    costs = prediction.run_costs(out, read_environment(out), profile)
    assert costs["target"].cost == profiles.probed_cost(target)
    assert costs["draft"].cost == profiles.probed_cost(draft)
    assert costs["target"].cost != costs["draft"].cost
    old = {k: v for k, v in profile.items() if k != "models"} | {"format": profiles.FORMAT_BY_SOURCE}
    old["models"] = {"tiny-llama": draft}  # what format 1 kept: the last model probed of that source
    with pytest.raises(SpecbenchError, match="models.tiny-llama: is keyed by source.*cannot tell which"):
        prediction.predict_run(out, old)


def test_a_profile_of_format_1_still_prices_a_run_that_loads_its_source_once(monkeypatch):
    """The committed profiles (format 1, by source) give the committed carried predictions
    (results/prediction/carried.md) unchanged."""
    monkeypatch.syspath_prepend(str(ROOT))  # scripts/ sits beside the package, not in it
    from scripts.prediction import validate

    assert validate.carried() + "\n" == (ROOT / "results/prediction/carried.md").read_text()


@pytest.mark.parametrize("field", ["alpha", "gamma"])
@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf")])
def test_a_profile_with_a_negative_or_nan_cost_is_refused(tmp_path, field, value):
    profile = json.loads((COMMITTED.parent / "profile_float32_eager.json").read_text())
    profile["models"]["smollm2-135m-instruct"]["table"][field][0] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    result = runner.invoke(app, ["predict", str(COMMITTED), "--profile", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"models.smollm2-135m-instruct.table.{field}" in " ".join(result.output.split())


def test_a_probes_fit_is_never_negative():
    # a cost that grows faster than linearly in the context: least squares would cut alpha below 0
    points = [(1.0, c, 1e-9 * c * c) for c in (10.0, 500.0, 1000.0)]
    table = cost_model.fit_size_table(points)
    assert table.alpha[0] == 0 and table.gamma[0] > 0
    assert all(table.pass_seconds(1, c) > 0 for _, c, _ in points)


def test_a_size_table_never_extrapolates_below_its_largest_size():
    """A noisy probe of a tiny model can time 3 tokens faster than 1 (here 0.94 against 1.16 ms): the
    line through the two priced a 20-token prefill at -0.9 ms, and a whole AR cell below zero."""
    table = cost_model.SizeTable((1.0, 3.0), (0.00116, 0.00094), (0.0, 0.0))
    assert table.pass_seconds(20, 0) == pytest.approx(0.00094)
    rising = cost_model.SizeTable((1.0, 3.0), (0.001, 0.002), (0.0, 0.0))
    assert rising.pass_seconds(5, 0) == pytest.approx(0.003)  # extrapolated where it rises


P = COMMITTED.parent
README_RUN = ROOT / "results" / "demo" / "amd-epyc-avx512-bf16"  # measured on an EPYC of family 25


@pytest.mark.parametrize(
    ("run", "profile", "against", "message"),
    [
        (P / "demo", "profile_float32_eager.json", P / "demo_float32", None),  # carried to float32, there
        (README_RUN, "profile_bfloat16_eager.json", P / "demo", None),  # results/prediction/README.md
        (P / "demo", "profile_bfloat16_eager.json", P / "demo_float32", "measured smollm2 in float32 eager"),
        (P / "demo", "profile_bfloat16_eager.json", P / "demo_compiled", "in bfloat16 compiled, and the"),
        (P / "quickstart", "profile_bfloat16_eager.json", P / "demo", "measured another experiment"),
        (P / "demo", "profile_bfloat16_eager.json", README_RUN, "was measured on AMD EPYC (family 25"),
        (P / "demo", "profile_bfloat16_eager.json", P / "nowhere", "is no run directory"),
    ],
)
def test_against_is_a_run_of_the_same_experiment_measured_where_the_profile_was(
    run, profile, against, message
):
    result = runner.invoke(
        app, ["predict", str(run), "--profile", str(P / profile), "--against", str(against)]
    )
    if message is None:
        assert result.exit_code == 0, result.output
        assert "speedup there" in result.output and "nan%" not in result.output
    else:
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert message in " ".join(result.output.split()) and "--against" in result.output


def _copy_run(source: Path, to: Path, change) -> Path:
    """A copy of a committed run with ``change(row)`` applied to its rows (checksums made again)."""
    import shutil

    from specbench.pipeline.records.results import CHECKSUM, row_checksum

    shutil.copytree(source, to)
    rows = [json.loads(line) for line in (to / "examples.jsonl").read_text().splitlines()]
    for row in rows:
        change(row)
        row[CHECKSUM] = row_checksum(row)
    (to / "examples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return to


def test_against_a_run_of_two_machines_is_refused(tmp_path):
    def elsewhere(row):
        if row["example_id"] == read_examples(P / "demo")[0]["example_id"]:
            row["machine"] = "0123456789ab"

    mixed = _copy_run(P / "demo", tmp_path / "mixed", elsewhere)
    profile = str(P / "profile_bfloat16_eager.json")
    result = runner.invoke(app, ["predict", str(P / "demo"), "--profile", profile, "--against", str(mixed)])
    assert result.exit_code == 2 and "holds rows of 2 machines" in " ".join(result.output.split())


def test_a_prediction_that_is_no_walltime_is_refused(tmp_path):
    def faster_than_its_passes(row):  # its passes took ten times its walltime: a negative loop overhead
        for counts in row["forwards"].values():
            counts["seconds"] = 10 * counts.get("seconds", 0.0)

    run = _copy_run(P / "demo", tmp_path / "edited", faster_than_its_passes)
    profile = profiles.read_profile(str(P / "profile_bfloat16_eager.json"))
    with pytest.raises(SpecbenchError, match="is predicted to take -.* s, which no walltime is"):
        prediction.predict_run(run, profile)
    assert (prediction.predict_run(run, profile, loop=False)["walltime_predicted_s"] > 0).all()


def test_probe_threads_are_set_and_recorded(tmp_path):
    """probe --threads once assigned to the frozen recipe (a pydantic error for any value)."""
    recipe, profile = tmp_path / "r.yaml", tmp_path / "p.json"
    recipe.write_text(TWO_CELL_RECIPE)
    before = torch.get_num_threads()
    try:
        grid = ["--sizes", "1", "--contexts", "4", "--rounds", "1", "--threads", "1"]
        result = runner.invoke(app, ["probe", str(recipe), "--out", str(profile), *grid])
        assert result.exit_code == 0, result.output
        assert json.loads(profile.read_text())["machine"]["threads"] == 1
    finally:
        torch.set_num_threads(before)
