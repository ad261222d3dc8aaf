"""`specbench plan`: model sizes from configurations on the meta device, placement on declared GPUs,
forward passes and α, on the command line and as data. Meta device only: nothing is downloaded or loaded."""

from __future__ import annotations

import contextlib
import csv
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import SpecbenchError
from specbench.models import facts
from specbench.models.checksums import CHECKSUM, row_checksum
from specbench.pipeline.planning import placement, plan
from specbench.pipeline.run.datasets import load_datasets
from specbench.recipe import load_recipe, parse_recipe
from specbench.sources import source_of
from specbench.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]
LLAMA_70B = ROOT / "recipes" / "specdecpp" / "llama2_chat_7b_70b.yaml"
TINY = ROOT / "recipes" / "quickstart-tiny.yaml"
GiB = 2**30
runner = CliRunner()


@pytest.mark.parametrize("hub_id", sorted(facts.shipped_facts()))
def test_meta_built_parameter_count_matches_the_published_count(hub_id):
    entry = facts.shipped_facts()[hub_id]
    built = facts.from_config("m", hub_id, "test", "float32", entry["config"])
    assert built.params == pytest.approx(entry["params"], rel=0.01), hub_id


def test_every_hub_id_of_a_shipped_recipe_has_facts():
    sources = set()
    for path in (ROOT / "recipes").rglob("*.yaml"):
        for model in (yaml.safe_load(path.read_text()).get("models") or {}).values():
            sources.add(model["source"])
    hub_ids = {s for s in sources if source_of(s).kind == "hub"}
    assert hub_ids and hub_ids <= set(facts.shipped_facts())


def test_weight_bytes_follow_the_dtype():
    entry = facts.shipped_facts()["meta-llama/Llama-2-7b-chat-hf"]["config"]
    half = facts.from_config("m", "s", "test", "bfloat16", entry)
    full = facts.from_config("m", "s", "test", "float32", entry)
    assert half.params == full.params == 6_738_415_616
    assert half.weight_bytes == 2 * half.params and full.weight_bytes == 4 * full.params


def test_kv_cache_bytes_by_hand():
    llama = facts.from_config(
        "m", "s", "test", "bfloat16", facts.shipped_facts()["meta-llama/Llama-2-70b-chat-hf"]["config"]
    )
    assert llama.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2  # K and V x layers x KV heads x head dim x bf16
    t5 = facts.from_config(
        "m", "s", "test", "float32", facts.shipped_facts()["google/flan-t5-small"]["config"]
    )
    assert t5.kv_bytes_per_token == 2 * 8 * 6 * 64 * 4  # decoder layers x heads x d_kv, float32
    # the T5 v1.1 checkpoints keep their own output head, although transformers 5 ties T5's
    assert t5.params == 76_961_152


def test_the_70b_recipe_fits_on_two_80gib_gpus():
    result = runner.invoke(
        app, ["plan", str(LLAMA_70B), "--gpus", "2", "--gpu-memory", "80GiB", "-f", "json"]
    )
    assert result.exit_code == 0, result.output
    bill = json.loads(result.stdout)
    gpus = bill["placement"]["gpus"]
    assert [[e["name"] for e in g["models"]] for g in gpus] == [["target"], ["target", "draft"]]
    assert all(g["used_bytes"] <= g["usable_bytes"] for g in gpus)
    assert bill["placement"]["gpus_needed"] == 2
    target = next(m for m in bill["models"] if m["name"] == "target")
    assert target["params"] == 68_976_648_192 and target["origin"].endswith("model_facts.yaml")


def test_the_70b_recipe_on_one_gpu_is_a_one_line_error():
    result = runner.invoke(app, ["plan", str(LLAMA_70B), "--gpus", "1", "--gpu-memory", "80GiB"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert "models.target" in lines[0] and "needs 2 x 80 GiB" in lines[0]


def test_the_table_names_cells_sizes_and_assumptions():
    result = runner.invoke(app, ["plan", str(LLAMA_70B), "--gpus", "2"])
    assert result.exit_code == 0, result.output
    for text in ("128.48 GiB", "target (part 1/2)", "sd[k=4]", "GPU-hours", "Leviathan"):
        assert text in result.output, text


def test_a_balanced_split_capped_by_max_memory_is_refused_with_the_reason():
    # accelerate's balanced split caps GPU 0 at half the model plus a layer: 8 GiB would go to disk
    data = yaml.safe_load(LLAMA_70B.read_text())
    data["models"]["target"]["options"]["device_map"] = "auto"
    recipe = parse_recipe(data, LLAMA_70B, set(TASKS))
    with pytest.raises(SpecbenchError, match="on disk .*device_map: sequential keeps max_memory"):
        plan.build_plan(recipe, plan.Hardware(gpus=2))


def test_speculative_passes_follow_leviathan_by_hand():
    cell = next(c for c in load_recipe(TINY).cells() if c.id == "sd-draft[k=4]")
    passes, k = plan.expected_passes(cell, 512, 0.6)
    expected = 512 / ((1 - 0.6**5) / (1 - 0.6))  # tokens / E[accepted + 1]
    assert k == 4 and passes["target"] == pytest.approx(expected) == pytest.approx(222.07, abs=0.01)
    assert passes["draft"] == pytest.approx(4 * expected)
    ar = next(c for c in load_recipe(TINY).cells() if c.id == "ar")
    assert plan.expected_passes(ar, 512, 0.6) == ({"target": 512}, None)


def _previous_run(directory: Path) -> Path:
    """Two rows of ``sd-draft[k=4]`` under the keys a run of TINY gives them, its models renamed."""
    directory.mkdir()
    recipe = load_recipe(TINY)
    cell = next(c for c in recipe.cells() if c.id == "sd-draft[k=4]")
    dataset = load_datasets(recipe, None, lambda field: contextlib.nullcontext())[0]
    rows = [
        {
            "key": plan.PlannedKeys(recipe).row_key(cell, dataset, example),
            "dataset": "arithmetic/test",
            "cell": "sd-draft[k=4]",
            "example_id": example.id,
            "prompt_tokens": 90,
            "forwards": {"big": {"forward_passes": 10, "seconds": 0.5}},
        }
        for example in dataset.examples[:2]
    ]
    signed = [{**r, CHECKSUM: row_checksum(r)} for r in rows]  # as a run writes them (resolved_recipe.yaml)
    (directory / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in signed))
    with open(directory / "cells.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["dataset", "cell", "target", "drafter", "draft_acceptance_rate"])
        writer.writeheader()
        writer.writerow(
            {
                "dataset": "arithmetic/test",
                "cell": "sd-draft[k=4]",
                "target": "big",
                "drafter": "little",
                "draft_acceptance_rate": 0.8,
            }
        )
    recipe = yaml.safe_load(TINY.read_text())
    models = {"big": recipe["models"]["target"], "little": recipe["models"]["draft"]}
    (directory / "resolved_recipe.yaml").write_text(yaml.safe_dump({"models": models}))
    return directory


def test_alpha_rows_and_pass_time_come_from_a_previous_run(tmp_path):
    previous = _previous_run(tmp_path / "run")  # the same models under other names
    bill = plan.build_plan(load_recipe(TINY), plan.Hardware(), output_dir=previous)
    cells = {c["cell"]: c for c in bill["cells"]}
    assert cells["sd-draft[k=2]"]["alpha"] == 0.8 and cells["sd-draft[k=2]"]["alpha_source"] == "previous run"
    assert cells["sd-lookup[k=2]"]["alpha"] == 0.6  # another drafter: the assumption
    assert cells["sd-draft[k=4]"]["rows"] == 2 and cells["sd-draft[k=4]"]["rows_done"] == 2
    target = next(m for m in bill["models"] if m["name"] == "target")
    assert target["pass_ms"] == pytest.approx(50.0) and target["pass_ms_source"].startswith("previous run")
    assert bill["assumptions"]["datasets"][0]["prompt_tokens"] == 90
    # rows done are rows a resume skips: under another seed the same cell's rows are new rows
    reseeded = parse_recipe(yaml.safe_load(TINY.read_text()) | {"seed": 1}, TINY, set(TASKS))
    cells = {c["cell"]: c for c in plan.build_plan(reseeded, plan.Hardware(), output_dir=previous)["cells"]}
    assert cells["sd-draft[k=4]"]["rows"] == 4 and cells["sd-draft[k=4]"]["rows_done"] == 0


def test_rows_done_are_the_rows_a_resume_skips(tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", str(TINY), "-o", str(out), "--limit", "1"]).exit_code == 0
    cells = plan.build_plan(load_recipe(TINY), plan.Hardware(), output_dir=out)["cells"]
    assert {(c["rows_done"], c["rows"]) for c in cells} == {(1, 3)}


def test_json_output_parses_and_pass_ms_is_used():
    result = runner.invoke(
        app, ["plan", str(TINY), "-f", "json", "--pass-ms", "target=2", "--pass-ms", "draft=1"]
    )
    assert result.exit_code == 0, result.output
    bill = json.loads(result.stdout)
    assert {m["name"]: m["pass_ms_source"] for m in bill["models"]}["target"] == "--pass-ms"
    ar = next(c for c in bill["cells"] if c["cell"] == "ar")
    # 4 examples + 1 warm-up, 24 tokens each, 2 ms a pass
    assert ar["rows"] == 4 and ar["seconds"] == pytest.approx(5 * 24 * 2 / 1000)
    assert bill["placement"] is None and bill["totals"]["gpu_hours"] is None


def test_placement_splits_only_what_one_gpu_cannot_hold():
    big = placement.Demand("big", 100 * GiB, 0, 0.0)
    small = placement.Demand("small", 10 * GiB, 0, 0.0)
    sits, failed, _ = placement.place([small, big], 2, 79 * GiB)
    assert (
        failed is None
        and sits[0] == [("big", 79 * GiB)]
        and sits[1] == [("big", 21 * GiB), ("small", 10 * GiB)]
    )
    assert placement.gpus_needed([big, small], 40 * GiB) == 3


@pytest.mark.parametrize(
    ("text", "expected"), [("80GiB", 80 * GiB), ("80 GB", 80e9), ("81920MiB", 80 * GiB), (1024, 1024.0)]
)
def test_sizes_take_binary_and_decimal_units(text, expected):
    assert placement.parse_size(text, "--gpu-memory") == expected
    assert placement.parse_size("2TB/s", "--bandwidth", per_second=True) == 2e12
    with pytest.raises(SpecbenchError, match="not a positive size"):
        placement.parse_size("80", "--gpu-memory")


@pytest.mark.parametrize(("feature", "dtype"), [("AVX512-BF16", "bfloat16"), (None, "float32")])
def test_dtype_auto_on_the_cpu_is_planned_as_the_loader_resolves_it(monkeypatch, feature, dtype):
    from specbench.models import devices

    monkeypatch.setattr(devices, "cpu_bf16_feature", lambda: feature)
    recipe = load_recipe(ROOT / "recipes" / "demo.yaml")
    bill = plan.build_plan(recipe, plan.Hardware())
    smollm2 = next(m for m in bill["models"] if m["name"] == "smollm2")
    assert smollm2["dtype"] == dtype


@pytest.mark.parametrize(("feature", "flagged"), [("AVX512-BF16", []), (None, ["target_bf16", "draft_bf16"])])
def test_a_plan_warns_of_bfloat16_on_a_cpu_without_bf16_units(monkeypatch, feature, flagged):
    from specbench.models import devices
    from specbench.pipeline.views.plan_view import notes

    monkeypatch.setattr(devices, "cpu_bf16_feature", lambda: feature)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    recipe = load_recipe(ROOT / "recipes" / "engines" / "qwen_dtypes.yaml")
    bill = plan.build_plan(recipe, plan.Hardware())
    assert bill["bf16_without_units"] == flagged  # the float32 models are never flagged
    warning = [line for line in notes(bill) if line.startswith("! bfloat16 on this CPU")]
    assert bool(warning) == bool(flagged)
    if flagged:
        assert "target_bf16, draft_bf16 compute in bfloat16" in warning[0] and "specbench probe" in warning[0]
    # planned for GPUs, the models are not placed on this CPU: nothing to warn of
    assert plan.build_plan(recipe, plan.Hardware(gpus=1))["bf16_without_units"] == []


def test_a_cost_profile_gives_the_time_per_pass_of_the_models_it_probed():
    from specbench.pipeline.analysis.profiles import probed_cost

    path = ROOT / "results/prediction/amd-epyc-family26-avx512-bf16/profile_bfloat16_eager.json"
    profile = json.loads(path.read_text())
    recipe = load_recipe(ROOT / "recipes" / "demo.yaml")
    bill = plan.build_plan(recipe, plan.Hardware(), profile=profile)
    models = {m["name"]: m for m in bill["models"]}
    assert models["smollm2"]["pass_ms_source"].startswith("--profile (bfloat16 eager, one-token pass after")
    after = int(models["smollm2"]["pass_ms_source"].split("after ")[1].split()[0])
    cost = probed_cost(profile["models"]["smollm2-135m-instruct"])
    assert models["smollm2"]["pass_ms"] == pytest.approx(1000 * cost.pass_seconds(1, after))
    assert models["lookup"]["pass_ms_source"] == "statistical drafter"


def _tiny_profile(alpha: dict[str, float], format: str | None = None) -> dict:
    """A profile of quickstart-tiny's target and draft (both tiny-llama), each at its own price."""
    from specbench.pipeline.analysis.profiles import FORMAT, weights

    recipe = load_recipe(TINY)
    models = {
        name: {
            "source": "tiny-llama",
            "identity": weights(recipe.models[name].model_dump(mode="json")),
            "dtype": "float64",
            "engine": "eager",
            "table": {"sizes": [1, 4], "alpha": [ms / 1000, ms / 500], "gamma": [0.0, 0.0]},
        }
        for name, ms in alpha.items()
    }
    return {"format": format or FORMAT, "kind": "probe", "models": models}


def test_a_profile_prices_two_models_of_one_source_apart():
    """A profile keys each model by its recipe name and weights: quickstart-tiny's target and draft
    load one source, and each gets its own time per pass (format 1, keyed by source, gave both one)."""
    from specbench.pipeline.analysis.profiles import FORMAT_BY_SOURCE

    recipe = load_recipe(TINY)
    bill = plan.build_plan(recipe, plan.Hardware(), profile=_tiny_profile({"target": 30.0, "draft": 3.0}))
    models = {m["name"]: m for m in bill["models"]}
    assert models["target"]["pass_ms"] == pytest.approx(30.0) and models["draft"]["pass_ms"] == pytest.approx(
        3.0
    )
    assert models["target"]["pass_ms_source"].startswith("--profile (float64 eager")
    by_source = _tiny_profile({"draft": 3.0}, FORMAT_BY_SOURCE)
    by_source["models"] = {"tiny-llama": by_source["models"]["draft"]}
    with pytest.raises(SpecbenchError, match="keyed by source.*2 configurations.*cannot tell which"):
        plan.build_plan(recipe, plan.Hardware(), profile=by_source)
    swapped = _tiny_profile({"target": 30.0})
    swapped["models"]["target"]["identity"] = _tiny_profile({"draft": 3.0})["models"]["draft"]["identity"]
    with pytest.raises(
        SpecbenchError, match="models.target.identity: the profile's 'target' is other weights"
    ):
        plan.build_plan(recipe, plan.Hardware(), profile=swapped)


def test_plan_refuses_a_profile_with_a_negative_cost(tmp_path):
    profile = _tiny_profile({"target": 30.0})
    profile["models"]["target"]["table"]["alpha"][1] = -0.002
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    result = runner.invoke(app, ["plan", str(TINY), "--profile", str(path)])
    assert result.exit_code == 2 and "models.target.table.alpha" in " ".join(result.output.split())
    profile["models"]["target"]["table"]["alpha"][1] = 0.002
    path.write_text(json.dumps(profile))
    assert runner.invoke(app, ["plan", str(TINY), "--profile", str(path)]).exit_code == 0


def _E(alpha: float, k: int) -> float:  # Leviathan et al. 2023, Eq. 1
    return (1 - alpha ** (k + 1)) / (1 - alpha)


S1, S3, S4 = 100 / _E(0.5, 1), 100 / _E(0.5, 3), 100 / _E(0.5, 4)
# (method, params, drafter, drafters) -> passes in the plan's order, and k; T = 100 tokens, α = 0.5
DECLARED_RULES = [
    ("autoregressive", {}, None, (), [("t", 100)], None),
    ("speculative", {"k": 3}, "d", (), [("t", S3), ("d", 3 * S3)], 3),
    ("hf_assisted", {"k": 3}, "d", (), [("t", S3), ("d", 3 * S3)], 3),
    ("hf_prompt_lookup", {"k": 3}, None, (), [("t", S3)], 3),
    ("spec_cascade", {"k": 3}, "d", (), [("t", S3), ("d", 3 * S3)], 3),
    ("bild", {"k": 3}, "d", (), [("t", S3), ("d", 3 * S3)], 3),
    ("specdecpp", {"min_length": 3, "max_length": 20}, "d", (), [("t", S3), ("d", 3 * S3)], 3),
    ("specdecpp", {"min_length": 1, "max_length": 1}, "d", (), [("t", S1), ("d", S1)], 1),
    ("oracle_sd", {}, "d", (), [("t", 50), ("d", 100)], None),
    (
        "cs_drafting",
        {"K": [[1, 4], [0, 2]], "k_convention": "cumulative"},
        None,
        ("d1", "d2", "mag"),
        [("t", S4), ("d1", S4), ("d2", 4 * S4)],
        4,
    ),
    (
        "cs_drafting",
        {"K": [[1, 3], [0, 2]], "k_convention": "increment"},
        None,
        ("d1", "d2", "mag"),
        [("t", S4), ("d1", S4), ("d2", 4 * S4)],
        4,
    ),
    ("token_cascade", {}, "d", (), [("d", 100), ("t", 50)], None),
    ("seq_cascade", {}, "d", (), [("d", 100), ("t", 50)], None),
    ("oracle_cascade", {}, "d", (), [("d", 100), ("t", 100)], None),
    ("tree_speculative", {"depth": 3}, "d", (), [("t", S3), ("d", 3 * S3)], 3),
    ("medusa", {"depth": 3}, "d", (), [("t", S3), ("d", S3)], 3),
    ("eagle", {"depth": 3}, "d", (), [("t", S3), ("d", 3 * S3)], 3),
]


@pytest.mark.parametrize("method, params, drafter, drafters, passes, k", DECLARED_RULES, ids=lambda v: str(v))
def test_each_method_declares_the_passes_plan_expects(method, params, drafter, drafters, passes, k):
    from types import SimpleNamespace

    cell = SimpleNamespace(method=method, params=params, target="t", drafter=drafter, drafters=drafters)
    got, got_k = plan.expected_passes(cell, 100, 0.5)
    assert [(name, pytest.approx(count)) for name, count in passes] == list(got.items()) and got_k == k


def test_every_shipped_method_has_a_rule_and_a_method_without_one_is_one_target_pass_a_token():
    from types import SimpleNamespace

    from specbench.methods import METHODS, Method

    assert {name for name in METHODS if METHODS[name].plan is None} == set()
    assert {name for name, *_ in DECLARED_RULES} == set(METHODS)
    bare = Method("bare", "a method that declares no rule", lambda *a: None, {})
    with METHODS.registered(bare):
        cell = SimpleNamespace(method="bare", params={}, target="t", drafter="d", drafters=())
        assert plan.expected_passes(cell, 100, 0.5) == ({"t": 100}, None)
