"""The eager engine's linear layers on oneDNN (specbench.models.linear): same outputs as ATen's within
the dtype's rounding, chosen as a recipe asks, recorded, kept by a resume, refused where it cannot run."""

import json
from pathlib import Path

import pytest
import torch
from conftest import TWO_CELL_RECIPE
from torch import nn

from specbench import sources
from specbench.errors import SpecbenchError
from specbench.models import linear
from specbench.models.hf import HFModel
from specbench.pipeline.run.measure import model_request
from specbench.pipeline.run.runner import Runner
from specbench.recipe import load_recipe

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")

FLOAT32 = TWO_CELL_RECIPE.replace("dtype: float64", "dtype: float32")


def _recipe(tmp_path: Path, text: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return load_recipe(path)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("bias", [True, False])
def test_a_reordered_layer_computes_what_the_layer_computes(dtype, tolerance, bias):
    if not linear.reorders(dtype):
        pytest.skip(f"this CPU's oneDNN does not reorder {dtype} weights (an AVX2-only CPU)")
    torch.manual_seed(0)
    layer = nn.Linear(96, 200, bias=bias).to(dtype)
    swapped = linear.OneDNNLinear(layer)
    for shape in [(1, 96), (5, 96), (2, 3, 96)]:  # a decode row, a verification, batched leading dims
        x = torch.randn(shape).to(dtype)
        expected, got = layer(x).float(), swapped(x).float()
        assert got.shape == expected.shape
        assert torch.allclose(got, expected, rtol=tolerance, atol=tolerance)


def _tiny(dtype=torch.float32) -> nn.Module:
    request = sources.ModelRequest("m", "tiny-llama", "float32", "cpu", options=(("seed", 1),))
    return sources.load(request).model.to(dtype)


def test_onednn_swaps_every_linear_layer_and_the_model_scores_as_before():
    module = _tiny()
    plain = HFModel(_tiny(), "plain")
    model = HFModel(module, "onednn")
    layers = sum(type(m) is nn.Linear for m in module.modules())
    assert linear.resolve(module, "onednn") == ("onednn", {})
    assert not any(type(m) is nn.Linear for m in module.modules())
    assert sum(isinstance(m, linear.OneDNNLinear) for m in module.modules()) == layers > 0
    assert model.num_parameters == plain.num_parameters  # counted before the swap
    # heads read the LM head's weight (EAGLE's, Medusa's): it stays, the embedding's own if tied
    output = module.get_output_embeddings()
    assert isinstance(output, linear.OneDNNLinear) and output.weight.shape == (
        module.config.vocab_size,
        module.config.hidden_size,
    )
    assert not hasattr(module.model.layers[0].mlp.up_proj, "weight")  # other layers' originals are freed
    prompt = torch.tensor([3, 4, 5, 6, 7])
    for m in (plain, model):
        m.start(prompt)
    tokens = torch.tensor([1, 2, 3])
    expected, got = plain.score(tokens, 2).logits, model.score(tokens, 2).logits
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_aten_keeps_the_layers_and_onednn_cannot_serve_float64():
    module = _tiny()
    assert linear.resolve(module, "aten") == ("aten", {})
    assert any(type(m) is nn.Linear for m in module.modules())
    wide = _tiny(torch.float64)
    assert not linear.can_use_onednn(wide)
    assert linear.resolve(wide, "auto") == ("aten", {})  # auto: oneDNN only where it serves
    with pytest.raises(ValueError, match="unknown linear backend 'mkl'"):
        linear.resolve(module, "mkl")


def test_auto_times_both_libraries_and_keeps_aten_within_the_margin(monkeypatch):
    chosen, took, packed = linear.fastest(_tiny())
    assert set(took) == {"aten", "onednn"} and all(ms > 0 for ms in took.values())
    assert chosen == ("onednn" if took["onednn"] <= linear.MARGIN * took["aten"] else "aten")
    assert packed and all(isinstance(layer, linear.OneDNNLinear) for layer in packed)
    assert linear.choose({"aten": 10.0, "onednn": 9.5}) == "aten"  # a near tie keeps the default
    assert linear.choose({"aten": 10.0, "onednn": 8.9}) == "onednn"
    assert linear.choose({"aten": 10.0, "onednn": 12.0}) == "aten"


def test_a_recipe_names_the_library_per_model_and_only_non_default_choices_change_row_keys(tmp_path):
    plain = _recipe(tmp_path, FLOAT32)
    explicit = _recipe(tmp_path, FLOAT32.replace("seed: 0\n", "seed: 0\nlinear: aten\n"))
    onednn = _recipe(tmp_path, FLOAT32.replace("init_std: 0.3}", "init_std: 0.3}, linear: onednn"))
    assert plain.linear_of("target") == explicit.linear_of("target") == "aten"
    assert onednn.linear_of("target") == "onednn" and onednn.linear_of("lookup") == "aten"
    assert model_request(onednn, "target").linear == "onednn"
    assert model_request(plain, "target").linear == "aten"
    assert plain.identity() == explicit.identity() != onednn.identity()  # the default written out: same
    keys = [[c.fingerprint(r) for c in r.cells()] for r in (plain, explicit, onednn)]
    assert keys[0] == keys[1] and not set(keys[0]) & set(keys[2])


def test_onednn_on_another_engine_is_a_one_line_error(tmp_path):
    compiled = FLOAT32.replace("init_std: 0.3}", "init_std: 0.3}, linear: onednn, engine: compiled")
    with pytest.raises(SpecbenchError, match=r"models\.target\.linear: linear: onednn applies to the eager"):
        _recipe(tmp_path, compiled)
    everything_compiled = FLOAT32.replace("seed: 0\n", "seed: 0\nengine: compiled\nlinear: auto\n")
    with pytest.raises(
        SpecbenchError, match=r"recipe\.yaml: linear: linear: auto applies to models on the eager"
    ):
        _recipe(tmp_path, everything_compiled)


def test_the_compiled_engine_takes_inductor_which_changes_its_rows_keys_and_the_eager_engine_refuses_it(
    tmp_path,
):
    compiled = FLOAT32.replace("init_std: 0.3}", "init_std: 0.3}, engine: compiled")
    frozen = FLOAT32.replace("init_std: 0.3}", "init_std: 0.3}, engine: compiled, linear: inductor")
    plain, inductor = _recipe(tmp_path, compiled), _recipe(tmp_path, frozen)
    assert plain.linear_of("target") == "aten" and inductor.linear_of("target") == "inductor"
    assert model_request(inductor, "target").linear == "inductor"
    keys = [{c.fingerprint(r) for c in r.cells()} for r in (plain, inductor)]
    assert not keys[0] & keys[1]
    eager = FLOAT32.replace("init_std: 0.3}", "init_std: 0.3}, linear: inductor")
    with pytest.raises(SpecbenchError, match=r"target\.linear: linear: inductor applies to the compiled"):
        _recipe(tmp_path, eager)
    problem, fix = linear.model_problem("target", "inductor", "vllm")
    assert "runs on the vllm engine" in problem and "set engine: eager or compiled" in fix


def test_a_cpu_whose_onednn_refuses_bfloat16_runs_it_on_aten_and_names_the_field(monkeypatch):
    # what torch 2.13's oneDNN says on an AVX2-only AMD EPYC (family 25) for a bfloat16 weight
    def refuse(weight):
        if weight.dtype == torch.bfloat16:
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert")
        return torch.ops.mkldnn._reorder_linear_weight(weight, 4)

    monkeypatch.setattr(linear, "reorder", refuse)
    linear.reorders.cache_clear()
    try:
        assert linear.reorders(torch.float32) and not linear.reorders(torch.bfloat16)
        half = _tiny(torch.bfloat16)
        assert not linear.can_use_onednn(half)
        assert linear.resolve(half, "auto") == ("aten", {})  # auto: no probe, no traceback
        request = sources.ModelRequest("target", "tiny-llama", "bfloat16", "cpu", linear="onednn")
        with pytest.raises(
            SpecbenchError, match=r"models\.target\.linear: .*bfloat16 where the CPU has AVX512"
        ):
            sources.load(request)
    finally:
        linear.reorders.cache_clear()


def test_loading_onednn_where_it_cannot_serve_names_the_field():
    request = sources.ModelRequest("target", "tiny-llama", "float64", "cpu", linear="onednn")
    with pytest.raises(SpecbenchError, match=r"models\.target\.linear: oneDNN serves float32 and bfloat16"):
        sources.load(request)


def test_a_run_records_its_library_and_a_resume_keeps_what_auto_chose(tmp_path):
    recipe = _recipe(tmp_path, FLOAT32.replace("seed: 0\n", "seed: 0\nlinear: auto\n"))
    out = tmp_path / "run"
    Runner(recipe, out, limit=1).run()
    env_path = out / "environment.json"
    env = json.loads(env_path.read_text())
    first = env["models"]["target"]["linear"]
    assert first in ("aten", "onednn") and set(env["models"]["target"]["linear_probe_ms"]) == {
        "aten",
        "onednn",
    }
    assert "linear" not in env["models"]["lookup"]
    # whatever auto would choose now, a resume takes the first session's choice
    other = "aten" if first == "onednn" else "onednn"
    env["models"]["target"]["linear"] = other
    env_path.write_text(json.dumps(env))
    resumed = Runner(recipe, out, resume=True)  # measures the two examples left: loads the target
    resumed.run()
    assert resumed.linear_kept == {"target": other}
    assert json.loads(env_path.read_text())["models"]["target"]["linear"] == other
    named = _recipe(tmp_path, FLOAT32.replace("seed: 0\n", "seed: 0\nlinear: onednn\n"))
    env["models"]["target"]["linear"] = "aten"
    env_path.write_text(json.dumps(env))
    with pytest.raises(
        SpecbenchError, match="was measured with linear: aten; this recipe runs it with linear: onednn"
    ):
        Runner(named, out, resume=True).run()


def test_heads_on_a_onednn_target_run_on_onednn_and_stay_lossless(tmp_path):
    from test_eagle import write_head

    from specbench.decoding import autoregressive, tree_speculative
    from specbench.drafters import eagle, medusa

    options = (("seed", 3), ("vocab_size", 300))
    plain, fast = (
        sources.load(
            sources.ModelRequest("target", "tiny-llama", "float32", "cpu", options=options, linear=lib)
        )
        for lib in ("aten", "onednn")
    )
    write_head(tmp_path, plain.model)
    folder = tmp_path / "drafters" / "tiny-llama" / "eagle"
    heads = {model.linear: eagle.load(folder, "head", model, "models.head") for model in (plain, fast)}
    assert heads["onednn"].num_parameters == heads["aten"].num_parameters > 0  # counted before the swap
    assert not any(type(m) is nn.Linear for m in heads["onednn"].head.modules())
    assert heads["onednn"].lm_head.packed is not None and heads["aten"].lm_head.packed is None
    prompt = torch.tensor([5, 17, 42, 7, 99, 3])
    x = torch.randn(3, plain.model.config.hidden_size)
    assert torch.allclose(heads["onednn"].lm_head(x), heads["aten"].lm_head(x), rtol=1e-4, atol=1e-5)
    tree = {"depth": 3, "branch": 2, "frontier": 2, "nodes": 6, "max_new_tokens": 12}
    reference = autoregressive.generate(fast, prompt, max_new_tokens=12).tokens
    assert tree_speculative.generate(fast, heads["onednn"], prompt, **tree).tokens == reference
    medusa_heads = medusa.MedusaHeads(plain.model.config.hidden_size, 2)
    drafter = medusa.MedusaDrafter("m", medusa_heads, heads["onednn"].lm_head, "target")
    before = drafter.num_parameters
    from specbench.drafters.heads import follow_linear

    follow_linear(fast, drafter.heads)
    assert drafter.num_parameters == before and not any(type(m) is nn.Linear for m in drafter.heads.modules())


def test_bench_times_the_onednn_copies_beside_the_eager_engine():
    from rich.console import Console

    from specbench.pipeline.experiments.bench import parse_engines, print_bench, run_bench

    with pytest.raises(SpecbenchError, match="unknown engine 'mkl'.*use eager, compiled, onednn, inductor"):
        parse_engines("eager,mkl")
    console = Console(file=open("/dev/null", "w"), width=160)  # noqa: SIM115
    with pytest.raises(
        SpecbenchError, match=r"--engine: onednn serves float32 and bfloat16 models on the CPU"
    ):
        run_bench("tiny-llama", "same", 2, 1, 6, "float64", "cpu", "arithmetic", console, engines=("onednn",))
    engines = parse_engines("eager,onednn")
    result = run_bench(
        "tiny-llama", "same", 2, 1, 6, "float32", "cpu", "arithmetic", console, engines=engines
    )
    assert {"ours onednn: AR", "ours onednn: SD k=2", "ours eager: AR"} <= set(result.tallies)
    assert result.tallies["ours onednn: AR"].target_passes == result.tallies["ours eager: AR"].target_passes
    assert "ours onednn: AR vs ours eager: AR" in result.classes
    ratios = print_bench(result, console)
    assert ratios["oneDNN AR vs our eager AR"] > 0 and "oneDNN SD k=2 vs oneDNN AR" in ratios


def test_prediction_tables_name_the_library_a_run_used():
    from specbench.pipeline.views.prediction_view import model_setups

    models = {
        "a": {"parameters": 9, "dtype": "torch.float32", "engine": "eager", "linear": "onednn"},
        "b": {"parameters": 9, "dtype": "torch.float32", "engine": "compiled", "linear": "aten"},
        "c": {"parameters": 9, "dtype": "torch.float32"},  # a run from before the choice existed
        "d": {"parameters": 9, "dtype": "torch.bfloat16", "engine": "compiled", "linear": "inductor"},
    }
    assert model_setups({"models": models}) == (
        "bfloat16 compiled inductor, float32 compiled, float32 eager, float32 eager oneDNN"
    )


def test_bench_times_the_compiled_engine_on_frozen_weights():
    from rich.console import Console

    from specbench.pipeline.experiments.bench import print_bench, run_bench

    console = Console(file=open("/dev/null", "w"), width=160)  # noqa: SIM115
    result = run_bench(
        "tiny-llama", "same", 2, 1, 6, "float32", "cpu", "arithmetic", console, engines=("eager", "inductor")
    )
    assert {"ours inductor: AR", "ours inductor: SD k=2"} <= set(result.tallies)
    assert result.tallies["ours inductor: AR"].target_passes == result.tallies["ours eager: AR"].target_passes
    assert set(result.classes["ours inductor: AR vs ours eager: AR"]) <= {"identical", "tie"}
    assert {"target (inductor)", "drafter (inductor)"} <= set(result.compile_s)
    ratios = print_bench(result, console)
    assert ratios["inductor AR / bandwidth limit"] > 0 and "inductor SD k=2 vs inductor AR" in ratios
