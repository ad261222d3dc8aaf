"""The load sweeps issue 54 asked for, as committed (results/engines/README.md quotes them): every level
of the recipe that made each one, at every repeat, pooled with 95% intervals that hold the point, and
the output equivalence the README states: vLLM's outputs under load all equal to its batch-1 AR and to
specbench's AR; llama.cpp's not all equal to its own."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest

from specbench.engines.load import LOAD_SUMMARY, read_load, read_verified
from specbench.recipe.loading import load_recipe

ROOT = Path(__file__).resolve().parents[1]
MACHINE = "amd-epyc-family25-avx512-bf16"
SWEEPS = {  # directory -> the recipe that made it
    "smollm2_load": "smollm2_load.yaml",
    "qwen_load": "qwen_load.yaml",
    "smollm2_openai_llamacpp": "smollm2_openai_llamacpp.yaml",
}


def _summary(name: str) -> list[dict]:
    text = read_verified(ROOT / "results/engines" / name / MACHINE / LOAD_SUMMARY)
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize("name", SWEEPS)
def test_every_level_of_the_recipe_is_measured_at_every_repeat_with_its_interval(name: str):
    recipe = load_recipe(ROOT / "recipes/engines" / SWEEPS[name])
    levels = [f"x{c}" for c in recipe.load.concurrency] + [f"@{r:g} req/s" for r in recipe.load.request_rate]
    cells = [method.name for method in recipe.methods if recipe.models[method.target].engine is not None]
    rows = read_load(ROOT / "results/engines" / name / MACHINE)
    assert {(r["cell"], r["repeat"]) for r in rows if r["complete"]} == {
        (cell, repeat) for cell in cells for repeat in range(recipe.load.repeats)
    }
    summary = _summary(name)
    assert sorted((r["cell"], r["level"]) for r in summary) == sorted((c, lv) for c in cells for lv in levels)
    for row in summary:
        assert int(row["repeats"]) == recipe.load.repeats and int(row["incomplete"]) == 0
        assert int(row["completed"]) == int(row["requests"]) and int(row["errors"]) == 0
        for figure in ("throughput_tok_s", "per_request_tok_s", "speedup_throughput", "speedup_per_request"):
            value, low, high = (float(row[f"{figure}{end}"]) for end in ("", "_low", "_high"))
            assert math.isfinite(low) and low <= value <= high, (row["cell"], row["level"], figure)


def _equal(row: dict, reference: str) -> tuple[int, int]:
    return int(float(row[f"eq_{reference}_identical"])), int(float(row[f"eq_{reference}_checked"]))


@pytest.mark.parametrize("name", ["smollm2_load", "qwen_load"])
def test_every_vllm_output_under_load_equals_its_batch_1_ar_and_ours(name: str):
    vllm = [row for row in _summary(name) if row["engine"] == "vllm"]
    assert vllm
    for row in vllm:
        assert _equal(row, "engine") == _equal(row, "ours") == (int(row["requests"]),) * 2, row["level"]


def test_llama_cpps_outputs_under_load_differ_from_its_own_alone_at_every_level():
    llama = [row for row in _summary("smollm2_load") if row["engine"] == "llama.cpp"]
    assert len(llama) == 18
    for row in llama:
        identical, checked = _equal(row, "engine")
        assert checked == int(row["requests"]) and 0 < checked - identical < checked / 4, row["level"]
        assert int(float(row["eq_engine_unclassified"])) == checked - identical
