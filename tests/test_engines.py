"""The compiled engine (static cache, rollback by pointer, padded fixed shapes, compiled passes)
against the eager one: float64 tiny models, so every difference is a bug, never rounding.

The decoding loops' own lossless and distribution tests run on both engines too (their ``engine``
parameter); these tests pin what only the compiled engine has.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import tiny_recipes
import torch
import yaml
from conftest import engine_model
from typer.testing import CliRunner

from specbench import sources
from specbench.cli import app
from specbench.decoding import autoregressive, speculative
from specbench.errors import SpecbenchError
from specbench.models.base import LAST, ModelDrafter
from specbench.models.compiled import FROZEN_OPTIONS, CompiledHFModel
from specbench.models.hf import HFModel
from specbench.recipe import parse_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 16


def random_prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(2, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


def test_compiled_autoregressive_is_the_eager_one(tiny_model):
    for seed in range(3):
        weights = tiny_model("tiny-llama", seed)
        prompt = random_prompt(seed, 1 + 7 * seed)
        eager = autoregressive.generate(HFModel(weights, "t"), prompt, max_new_tokens=30)
        compiled = autoregressive.generate(engine_model(weights, "t", "compiled"), prompt, max_new_tokens=30)
        assert compiled.tokens == eager.tokens
        assert compiled.forwards["t"]["forward_passes"] == eager.forwards["t"]["forward_passes"]
        assert compiled.forwards["t"]["tokens_scored"] == eager.forwards["t"]["tokens_scored"]


def test_rollback_by_pointer_and_padding_never_leak_stale_entries(tiny_model):
    """Random reviews of 0-8 candidates, each followed by a rollback to a random accepted length, on a
    compiled model with the buckets 1 and 5 only: reviews of 2-4 tokens pad up to 5 (their padding's
    entries, and every rolled-back entry, stay in the cache past the pointer), 6 or more run eagerly.
    Every review's logits must equal the eager model's up to float32 rounding: transformers computes
    the rotary tables in float32 even for a float64 model, and inductor's vectorized cos/sin differ
    from ATen's in the last bit (1e-6 in the logits); an entry that leaked would move them by ~0.1."""
    weights = tiny_model("tiny-llama", 4)
    eager = HFModel(weights, "e")
    compiled = engine_model(weights, "c", "compiled", draft_lengths=(4,))
    assert compiled.buckets == (1, 5)
    gen = torch.Generator().manual_seed(0)
    prompt = random_prompt(4, 6)
    eager.start(prompt)
    compiled.start(prompt)
    committed = torch.empty(0, dtype=torch.long)
    for _ in range(60):
        n = int(torch.randint(0, 9, (), generator=gen))
        candidates = torch.randint(2, VOCAB, (n,), generator=gen)
        sequence = torch.cat([committed, candidates])
        expected = eager.score(sequence, n).logits
        got = compiled.score(sequence, n).logits
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
        accepted = int(torch.randint(0, n + 1, (), generator=gen))
        eager.rollback(committed.shape[0] + accepted)
        compiled.rollback(committed.shape[0] + accepted)
        committed = torch.cat([sequence[: committed.shape[0] + accepted], torch.randint(2, VOCAB, (1,))])
    assert eager.counter.tokens_scored == compiled.counter.tokens_scored  # padding is not "scored"
    assert committed.shape[0] > 60


def test_prepare_compiles_every_shape_and_decoding_compiles_nothing(tiny_model):
    weights = tiny_model("tiny-llama", 5)
    target = engine_model(weights, "target", "compiled", draft_lengths=(3,))
    drafter = ModelDrafter(
        engine_model(tiny_model("tiny-llama", 6), "drafter", "compiled", draft_lengths=(3,))
    )
    before = target.compile_seconds, drafter.model.compile_seconds
    prompt = random_prompt(5, 9)
    gen = speculative.generate(target, drafter, prompt, k=3, max_new_tokens=24)
    assert (target.compile_seconds, drafter.model.compile_seconds) == before
    assert gen.tokens == autoregressive.generate(HFModel(weights, "e"), prompt, max_new_tokens=24).tokens


def test_a_request_longer_than_the_cache_grows_it_and_counts_the_compilation(tiny_model):
    weights = tiny_model("tiny-llama", 7)
    target = engine_model(weights, "target", "compiled", draft_lengths=(2,))
    capacity, before = target.capacity, target.compile_seconds
    prompt = random_prompt(7, capacity + 10)
    got = speculative.generate(target, ModelDrafter(HFModel(weights, "d")), prompt, k=2, max_new_tokens=12)
    assert target.capacity > capacity and target.compile_seconds > before
    assert got.tokens == autoregressive.generate(HFModel(weights, "e"), prompt, max_new_tokens=12).tokens


def test_the_hidden_state_is_the_last_real_position_not_the_padding(tiny_model):
    weights = tiny_model("tiny-llama", 8)
    eager, compiled = HFModel(weights, "e"), engine_model(weights, "c", "compiled", draft_lengths=(6,))
    prompt, tokens = random_prompt(8, 5), random_prompt(9, 4)
    for model in (eager, compiled):
        model.start(prompt)
        model.score(tokens[:1], 0)  # the prefill
    for upto, candidates in ((4, 2), (2, 0)):  # 3 tokens padded to 7; then 1 token after a rollback
        passes = []
        for model in (eager, compiled):
            model.rollback(1)
            passes.append(model.score(tokens[:upto], candidates, hidden=(LAST, 1)))
        for layer in (LAST, 1):
            torch.testing.assert_close(passes[1].hidden[layer], passes[0].hidden[layer], rtol=1e-4, atol=1e-5)


def test_encoder_decoders_and_statistical_drafters_have_no_compiled_engine(tmp_path):
    request = sources.ModelRequest("t", "tiny-t5", "float64", "cpu", engine="compiled")
    with pytest.raises(SpecbenchError, match=r"models\.t\.engine.*decoder-only"):
        sources.load(request)
    recipe = tmp_path / "r.yaml"
    data = {
        "name": "r",
        "models": {
            "t": {"source": "tiny-llama"},
            "lookup": {"source": "prompt-lookup", "engine": "compiled"},
        },
        "datasets": [{"task": "arithmetic"}],
        "methods": [{"name": "sd", "method": "speculative", "target": "t", "drafter": "lookup"}],
    }
    recipe.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["run", str(recipe), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "models.lookup.engine" in result.output and "statistical drafter" in result.output


def test_the_engine_enters_fingerprints_only_when_compiled(tmp_path):
    base = {
        "name": "r",
        "models": {"t": {"source": "tiny-llama"}, "lookup": {"source": "prompt-lookup"}},
        "datasets": [{"task": "arithmetic"}],
        "methods": [{"name": "sd", "method": "speculative", "target": "t", "drafter": "lookup"}],
    }

    def fingerprint(**changes):
        data = json.loads(json.dumps(base))
        for where, value in changes.items():
            if where == "recipe":
                data["engine"] = value
            else:
                data["models"][where]["engine"] = value
        recipe = parse_recipe(data, tmp_path / "r.yaml")
        return recipe.cells()[0].fingerprint(recipe), recipe

    plain, recipe = fingerprint()
    assert recipe.engine_of("t") == recipe.engine_of("lookup") == "eager"
    assert fingerprint(recipe="eager")[0] == fingerprint(t="eager")[0] == plain
    compiled, recipe = fingerprint(recipe="compiled")
    assert recipe.engine_of("t") == "compiled" and recipe.engine_of("lookup") == "eager"
    assert compiled != plain and fingerprint(t="compiled")[0] == compiled
    assert fingerprint(recipe="compiled", t="eager")[0] == plain


def test_a_compiled_recipe_reports_compile_time_apart_from_walltime(tmp_path):
    recipe = tmp_path / "r.yaml"
    data = tiny_recipes.recipe(
        "compiled",
        {"target": tiny_recipes.tiny(vocab_size=300), "draft": tiny_recipes.tiny(vocab_size=300, seed=1)},
        [tiny_recipes.ar(), tiny_recipes.speculative(k=3)],
        limit=3,
        max_new_tokens=12,
        engine="compiled",
    )
    recipe.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(recipe), "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    assert all("compile_s" in row for row in rows)
    by_cell = {}
    for row in rows:
        by_cell.setdefault(row["cell"], []).append(row["compile_s"])
    assert all(seconds[0] >= 0 and seconds[1:] == [0.0] * (len(seconds) - 1) for seconds in by_cell.values())
    assert sum(sum(s) for s in by_cell.values()) > 0
    assert all(row.get("divergence_class") == "identical" for row in rows if row["method"] == "speculative")
    cells = pd.read_csv(out / "cells.csv")
    assert "compile_s" in cells.columns and (cells["compile_s"] >= 0).all()
    environment = json.loads((out / "environment.json").read_text())
    assert {m["engine"] for m in environment["models"].values()} == {"compiled"}


SECOND_PROCESS = """
import json, torch
from specbench.models.compiled import CompiledHFModel
from specbench.models.tiny import build_tiny

weights, _ = build_tiny("tiny-llama", dtype=torch.float32, seed=3, vocab_size=32)
model = CompiledHFModel(weights, "t", quick=True)
model.prepare(48, (2,))
model.start(torch.tensor([3, 4, 5]))
model.score(torch.tensor([6]), 0)
logits = model.score(torch.tensor([6, 7, 8, 9]), 2).logits
print(json.dumps({"cache": dict(model.compile_cache), "folder": model.compile_cache_dir,
                  "logits": logits.flatten().tolist()}))
"""


@pytest.mark.slow  # two processes that compile or load: ~45 s on 2 cores
def test_a_second_process_loads_its_graphs_from_the_specbench_compile_cache(tmp_path):
    """The graphs live under the folder specbench names (one per machine and torch build by default):
    a second process loads the passes the first compiled ("hit") instead of compiling them ("miss"),
    compile_cache says which, and the loaded passes compute what the compiled ones did."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPECBENCH_COMPILE_CACHE": str(tmp_path / "compile")}
    seen = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", SECOND_PROCESS], env=env, capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, out.stderr[-2000:]
        seen.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = seen
    assert first["folder"] == second["folder"] == str(tmp_path / "compile")
    assert first["cache"] == {"miss": 2} and second["cache"] == {"hit": 2}
    assert second["logits"] == first["logits"]
    assert len(list((tmp_path / "compile" / "graphs").glob("*.graph"))) == 2


def test_the_compile_cache_folder_is_per_machine_and_torch_build(monkeypatch, tmp_path):
    from specbench.models.compiled import use_compile_cache
    from specbench.models.machine import this_machine

    monkeypatch.delenv("SPECBENCH_COMPILE_CACHE", raising=False)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "elsewhere")
    folder = use_compile_cache()
    assert folder == str(tmp_path / "compile" / f"torch-{torch.__version__}-{this_machine().id}")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == folder


def test_inductor_linear_layers_freeze_the_weights_autotune_and_decode_as_eager(tiny_model):
    """``linear: inductor``: a frozen graph (never stored), each matmul's kernel autotuned, and the same
    greedy tokens as the eager engine (one bucket: the frozen compile is the slow part). Whether the
    template or oneDNN won a shape is inductor's autotuning, cached on disk, so not asserted."""
    weights = tiny_model("tiny-llama", 4).float()
    model = CompiledHFModel(weights, "t", linear="inductor")
    model.prepare(64)
    assert model._store is None and model._options == FROZEN_OPTIONS and model.linear == "inductor"
    prompt = random_prompt(4, 9)
    eager = autoregressive.generate(HFModel(weights, "t"), prompt, max_new_tokens=24)
    assert autoregressive.generate(model, prompt, max_new_tokens=24).tokens == eager.tokens
    with pytest.raises(ValueError, match="aten or inductor, not 'onednn'"):
        CompiledHFModel(weights, "t", linear="onednn")


def test_inductor_linear_layers_are_refused_off_the_cpu(tiny_model, monkeypatch):
    """On CUDA the compiled engine records CUDA graphs: a model asked for frozen CPU GEMMs there is
    refused, not run as CUDA graphs and recorded as ``linear: inductor``."""
    import specbench.models.compiled as compiled

    monkeypatch.setattr(compiled, "input_device", lambda model: torch.device("cuda"))
    with pytest.raises(ValueError, match="run on the CPU"):
        CompiledHFModel(tiny_model("tiny-llama", 4), "t", linear="inductor")
