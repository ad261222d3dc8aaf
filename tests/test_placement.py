"""Model placement: loader options reach from_pretrained, and a model split by device_map (one layer
offloaded to disk, so accelerate's dispatch hooks really run) gives the same outputs and counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tiny_recipes
import torch
import yaml
from typer.testing import CliRunner

from specbench import sources
from specbench.cli import app
from specbench.errors import SpecbenchError
from specbench.models import devices
from specbench.models.tiny import build_tiny

runner = CliRunner()
SPLIT = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.norm": "cpu",
    "lm_head": "cpu",
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-checkpoint")
    model, tokenizer = build_tiny("tiny-llama", dtype=torch.float64, seed=1, init_std=0.3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _recipe(checkpoint: Path, folder: Path, options: dict) -> Path:
    data = tiny_recipes.recipe(
        "placement",
        {
            "target": {"source": str(checkpoint), "dtype": "float64", "options": options},
            "draft": {"source": str(checkpoint), "dtype": "float64"},
            "lookup": tiny_recipes.lookup(),
        },
        [
            tiny_recipes.ar(),
            tiny_recipes.speculative(k=[3]),
            tiny_recipes.speculative("lookup", [2], name="pl"),
        ],
        max_new_tokens=10,
        warmup=0,
    )
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _rows(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    keep = ("output_ids", "steps", "first_divergence")
    return {
        (r["cell"], r["example_id"]): (
            {k: r[k] for k in keep},
            {m: c["forward_passes"] for m, c in r["forwards"].items()},
        )
        for r in rows
    }


def test_a_model_split_with_a_layer_on_disk_gives_identical_outputs_and_counts(checkpoint, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    whole.mkdir(), split.mkdir()
    options = {"device_map": SPLIT, "offload_folder": str(tmp_path / "offload")}
    for folder, opts in ((whole, {}), (split, options)):
        result = runner.invoke(
            app, ["run", str(_recipe(checkpoint, folder, opts)), "-o", str(folder / "out")]
        )
        assert result.exit_code == 0, result.output
    assert _rows(whole / "out") == _rows(split / "out")
    env = json.loads((split / "out" / "environment.json").read_text())
    assert env["models"]["target"]["device_map"] == SPLIT  # recorded, and the disk entry really used
    assert env["models"]["draft"]["device_map"] is None


def test_the_split_model_takes_its_inputs_on_the_embeddings_device(checkpoint, tmp_path):
    options = (("device_map", SPLIT), ("offload_folder", str(tmp_path / "offload")))
    model = sources.load(sources.ModelRequest("t", str(checkpoint), "float64", options=options))
    assert model.device == torch.device("cpu") and model.model.hf_device_map == SPLIT
    on_disk = model.model.model.layers[1]
    # accelerate keeps the layer's weights off the device and its hook loads them for each forward
    assert hasattr(on_disk, "_hf_hook") and {p.device.type for p in on_disk.parameters()} == {"meta"}
    assert model.num_parameters == sum(p.numel() for p in build_tiny("tiny-llama")[0].parameters())


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"device_map": "everywhere"}, "device_map: 'everywhere' is not a device map"),
        ({"device_map": {"model": "gpu0"}}, "device_map: 'gpu0' is not a device"),
        ({"device_map": {}}, "device_map: an empty device_map places nothing"),
        ({"max_memory": {0: "70GiB"}}, "max_memory: max_memory limits a device_map"),
        ({"device_map": "auto", "max_memory": {0: "lots"}}, "max_memory: 0: 'lots' is not a device and size"),
        ({"attn_implementation": "fast"}, "attn_implementation: 'fast' is not an attention kernel"),
        ({"trust_remote_code": "yes"}, "trust_remote_code: trust_remote_code 'yes' is not true or false"),
        ({"quantization": "4bit"}, "quantization: quantization is not a mapping"),
        ({"torch_dtype": "bfloat16"}, "torch_dtype: source"),
    ],
)
def test_bad_loader_options_are_one_line_recipe_errors(checkpoint, tmp_path, options, problem):
    result = runner.invoke(
        app, ["run", str(_recipe(checkpoint, tmp_path, options)), "-o", str(tmp_path / "o")]
    )
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and f"models.target.options.{problem}" in message, message


def test_device_and_device_map_do_not_mix(checkpoint, tmp_path):
    path = _recipe(checkpoint, tmp_path, {"device_map": "auto"})
    data = yaml.safe_load(path.read_text())
    data["models"]["target"]["device"] = "cpu"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["run", str(path), "-o", str(tmp_path / "o")])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "models.target.device: device: cpu and options.device_map" in message


def test_loader_options_reach_from_pretrained(checkpoint, monkeypatch):
    from transformers import AutoModelForCausalLM

    seen = {}
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    options = (("attn_implementation", "eager"), ("low_cpu_mem_usage", True), ("device_map", "cpu"))
    with pytest.raises(SpecbenchError):  # "cpu" is a device, not a device map: refused first
        sources.load(sources.ModelRequest("t", str(checkpoint), "float64", options=options))
    options = (("attn_implementation", "eager"), ("low_cpu_mem_usage", True), ("device_map", "sequential"))
    sources.load(sources.ModelRequest("t", str(checkpoint), "float64", options=options))
    assert seen["attn_implementation"] == "eager" and seen["low_cpu_mem_usage"] is True
    assert seen["device_map"] == "sequential" and "trust_remote_code" not in seen


def test_dtype_auto_on_cpu_is_bfloat16_only_with_bf16_matrix_units(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(devices, "cpu_bf16_feature", lambda: "AVX512-BF16")
    assert sources.dtype_choice("auto", cpu, "org/model") == ("bfloat16", "auto: this CPU has AVX512-BF16")
    assert sources.dtype_choice("auto", cpu, "tiny-llama")[0] == "float32"  # test fixtures stay exact
    assert sources.dtype_choice("float64", cpu, "org/model") == ("float64", "set in the recipe")
    assert sources.dtype_choice("bfloat16", cpu, "org/model") == ("bfloat16", "set in the recipe")
    monkeypatch.setattr(devices, "cpu_bf16_feature", lambda: None)
    name, why = sources.dtype_choice("auto", cpu, "org/model")
    assert name == "float32" and "no bfloat16 matrix units" in why
    # a recipe's own bfloat16 is kept, and the reason says the CPU computes it without bf16 units
    assert sources.dtype_choice("bfloat16", cpu, "org/model") == (
        "bfloat16",
        "set in the recipe; this CPU has no bfloat16 matrix units (AMX, AVX512-BF16)",
    )
    assert sources.dtype_choice("float32", cpu, "org/model") == ("float32", "set in the recipe")


def test_a_resolved_bfloat16_enters_the_fingerprint(monkeypatch, tmp_path):
    from specbench.recipe import parse_recipe

    data = {
        "name": "f",
        "models": {"t": {"source": "org/model"}, "d": {"source": "org/small", "dtype": "float32"}},
        "datasets": [{"task": "arithmetic"}],
        "methods": [{"name": "sd", "method": "speculative", "target": "t", "drafter": "d"}],
    }
    recipe = parse_recipe(data, tmp_path / "r.yaml")
    (cell,) = recipe.cells()
    monkeypatch.setattr(devices, "cpu_bf16_feature", lambda: None)
    as_float32 = cell.fingerprint(recipe)
    monkeypatch.setattr(devices, "cpu_bf16_feature", lambda: "AMX")
    assert cell.fingerprint(recipe) != as_float32  # bf16 rows never resume as float32 ones
