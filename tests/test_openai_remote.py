"""``engine: openai`` as a remote model (issue 54, part 4's gaps): specbench loads its tokenizer alone,
never its weights, unless ``audit_weights`` asks for its copy to tell ties; ``plan`` bills nothing for
it; and two servers (an AR one and a speculative one) are paired by ``engine_options.baseline``. The
stand-in vLLM server (tests/fixtures/stub_vllm) plays both servers on 127.0.0.1."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import tiny_recipes
import yaml
from test_openai_backend import _invoke, remote  # noqa: F401  (a fixture)
from test_vllm_backend import stub_engine  # noqa: F401  (a fixture)
from typer.testing import CliRunner

from specbench.cli import app
from specbench.sources import checkpoints
from specbench.sources.tokenizers import parameters_of

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def _model(source, port: int, **options) -> dict:
    return {
        "source": str(source),
        "dtype": "float64",
        "engine": "openai",
        "engine_options": {"base_url": f"http://127.0.0.1:{port}/v1", "api_key_env": "THEIR_KEY", **options},
    }


def _recipe(models: dict, methods: list, concurrency=(1, 2)) -> dict:
    return {
        "name": "remote",
        "models": models,
        "generation": {"max_new_tokens": 24},
        "datasets": [{"task": "passages", "limit": 3, "chat_template": False}],
        "methods": methods,
        "load": {"concurrency": list(concurrency), "requests": 4, "slo_ttft_s": 5.0},
    }


def _tokenizer_folder(tmp_path: Path, name: str = "tokenizer-only", extra: str | None = None) -> Path:
    """The served model's tokenizer files alone: no weights, no config.json."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    if extra:
        tokenizer.add_tokens([extra])
    tokenizer.save_pretrained(tmp_path / name)
    return tmp_path / name


@pytest.fixture
def no_weights(monkeypatch):
    """Every transformers weight loader fails the test: a spy on specbench's checkpoint loader and on
    transformers' own from_pretrained of models."""
    from transformers import PreTrainedModel

    calls = []

    def refuse(*args, **kwargs):
        calls.append(args[:1])
        raise AssertionError(f"weights loaded: {args[:1]}")

    monkeypatch.setattr(checkpoints, "from_pretrained", refuse)
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(lambda cls, *a, **k: refuse(*a)))
    return calls


def test_a_remote_model_needs_its_tokenizer_alone_and_says_why_divergences_stay_unclassified(
    remote,  # noqa: F811
    no_weights,
):
    tmp_path, start = remote
    folder = _tokenizer_folder(tmp_path)
    assert not [p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES or p.name == "config.json"]
    port = start(STUB_SERVE_DIVERGE_IN_FLIGHT="2")  # requests batched with others end otherwise
    recipe = _recipe({"theirs": _model(folder, port)}, [tiny_recipes.ar("their-server", "theirs")])
    result = _invoke(tmp_path, recipe)
    assert result.exit_code == 0, result.output
    message = " ".join(result.output.split())
    rows = pd.read_csv(tmp_path / "load" / "load.csv").set_index("concurrency")
    assert rows.loc[1, "eq_engine_identical"] == 4 and pd.isna(rows.loc[1, "eq_note"])
    assert rows.loc[2, "eq_engine_unclassified"] >= 1 and rows.loc[2, "eq_engine_mismatches"] == 0
    assert rows.loc[2, "eq_note"].startswith("unclassified: specbench holds no copy of the server's weights")
    assert "! their-server x2: outputs under load are not the outputs alone" in message
    assert "engine_options.audit_weights: true loads one)" in message
    model = json.loads((tmp_path / "load" / "environment.json").read_text())["models"]["theirs"]
    assert model["serving"]["settings"]["tokenizer"] == f"local:{folder} (tokenizer only)"
    assert model["dtype"] is None and model["parameters"] is None  # the server's; no config here
    run = _invoke(tmp_path, recipe, "run")
    assert run.exit_code == 0, run.output
    examples = (tmp_path / "run" / "examples.jsonl").read_text().splitlines()
    assert len(examples) == 3 and all(json.loads(line)["n_tokens"] == 24 for line in examples)
    assert no_weights == []


def test_audit_weights_loads_specbenchs_copy_to_tell_ties(remote, monkeypatch):  # noqa: F811
    tmp_path, start = remote
    loaded = []
    real = checkpoints.from_pretrained
    monkeypatch.setattr(checkpoints, "from_pretrained", lambda *a, **k: loaded.append(a[0]) or real(*a, **k))
    port = start(STUB_SERVE_DIVERGE_IN_FLIGHT="2")
    theirs = _model(tmp_path / "model", port, audit_weights=True)
    result = _invoke(tmp_path, _recipe({"theirs": theirs}, [tiny_recipes.ar("their-server", "theirs")]))
    assert result.exit_code == 0, result.output
    assert loaded == [str(tmp_path / "model")]  # once, on the user's word
    rows = pd.read_csv(tmp_path / "load" / "load.csv").set_index("concurrency")
    assert rows.loc[2, "eq_engine_unclassified"] == 0 and rows.loc[2, "eq_engine_mismatches"] >= 1
    assert rows.eq_note.isna().all()
    model = json.loads((tmp_path / "load" / "environment.json").read_text())["models"]["theirs"]
    assert model["serving"]["settings"]["audit_weights"] is True and model["parameters"] > 0


def test_the_parameters_of_a_configuration_are_counted_without_weights(stub_engine):  # noqa: F811
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(stub_engine / "model")
    model = AutoModelForCausalLM.from_pretrained(stub_engine / "model")
    assert parameters_of(config) == sum(p.numel() for p in model.parameters())
    assert parameters_of(None) is None


def test_the_plan_bills_nothing_for_a_remote_model(tmp_path):
    recipe = {
        "name": "remote-plan",
        "models": {
            "ours": {"source": "tiny-llama"},
            "theirs": {
                "source": "someorg/remote-70b",  # no config here: its facts cannot be had, nor are needed
                "engine": "openai",
                "engine_options": {"base_url": "http://10.0.0.7:8000/v1"},
            },
        },
        "generation": {"max_new_tokens": 16},
        "datasets": [{"task": "passages", "limit": 2, "chat_template": False}],
        "methods": [tiny_recipes.ar(target="ours"), tiny_recipes.ar("their-server", "theirs")],
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["plan", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    bill = plan["host_memory"]
    models = {m["name"]: m for m in plan["models"]}
    assert models["theirs"]["footprint_bytes"] == 0 and models["theirs"]["kv_bytes"] == 0
    assert bill["engines"] == [{"model": "theirs", "engine": "openai", "remote": True, "bytes": 0}]
    assert bill["own_bytes"] == models["ours"]["footprint_bytes"] == bill["needed_bytes"]
    table = CliRunner().invoke(app, ["plan", str(path)])
    assert table.exit_code == 0, table.output
    assert "theirs (openai) remote: not billed" in " ".join(table.output.split())


def test_a_speculative_server_is_paired_with_the_ar_server_its_baseline_names(remote, no_weights):  # noqa: F811
    tmp_path, start = remote
    folder = _tokenizer_folder(tmp_path)
    plain, speculating = start(), start(speculating=True)  # 1 token a chunk, and 3
    models = {"plain": _model(folder, plain), "spec": _model(folder, speculating, baseline="plain")}
    methods = [tiny_recipes.ar("plain-ar", "plain"), tiny_recipes.ar("spec-eagle", "spec")]
    recipe = _recipe(models, methods, concurrency=(1,))
    result = _invoke(tmp_path, recipe)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "load" / "load.csv").set_index("cell")
    assert list(rows.speedup_over) == ["plain", "plain"] and rows.loc["plain-ar", "speedup_throughput"] == 1
    assert rows.loc["spec-eagle", "speedup_throughput"] > 1.2  # 3 tokens a 5 ms chunk against 1
    summary = pd.read_csv(tmp_path / "load" / "load_summary.csv").set_index("cell")
    assert summary.loc["spec-eagle", "speedup_throughput"] > 1.2
    assert math.isfinite(summary.loc["spec-eagle", "speedup_throughput_low"])  # paired by repeat
    # a run row needs one verification a chunk, which the stand-in's speculation does not stream: a
    # second plain server stands for the deployment, paired all the same
    models["spec"] = _model(folder, start(), baseline="plain")
    run = _invoke(tmp_path, recipe, "run")
    assert run.exit_code == 0, run.output
    cells = pd.read_csv(tmp_path / "run" / "cells.csv").set_index("cell")
    spec, plain = cells.loc["spec-eagle"], cells.loc["plain-ar"]
    assert spec.speedup_over == "plain" and plain.speedup_over == "plain" and plain.speedup_vs_ar == 1
    assert spec.speedup_vs_ar == pytest.approx(spec.tokens_per_s / plain.tokens_per_s)
    assert math.isfinite(spec.speedup_vs_ar_low)  # paired by example
    assert no_weights == []


def test_a_baseline_that_is_no_ar_server_of_the_same_tokenizer_is_one_line(remote):  # noqa: F811
    tmp_path, start = remote
    port = start()
    ours = {"source": str(tmp_path / "model"), "dtype": "float64"}
    spec = _model(tmp_path / "model", port, baseline="ours")
    methods = [tiny_recipes.ar(target="ours"), tiny_recipes.ar("spec-eagle", "spec")]
    for baseline, models, wanted in [
        ("ours", {"ours": ours, "spec": spec}, "'ours' runs on specbench; a baseline is an AR server"),
        ("nowhere", {"ours": ours, "spec": spec}, "'nowhere' is not another model of the recipe"),
    ]:
        models["spec"]["engine_options"]["baseline"] = baseline
        result = _invoke(tmp_path, _recipe(models, methods))
        message = " ".join(result.output.split())
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert "models.spec.engine_options.baseline" in message and wanted in message
    other = _tokenizer_folder(tmp_path, "other-tokenizer", extra="<their-own-token>")
    models = {"plain": _model(other, port), "spec": _model(tmp_path / "model", port, baseline="plain")}
    methods = [tiny_recipes.ar("plain-ar", "plain"), tiny_recipes.ar("spec-eagle", "spec")]
    result = _invoke(tmp_path, _recipe(models, methods))
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "models.spec.engine_options.baseline: 'plain' does not share 'spec''s tokenizer" in message
