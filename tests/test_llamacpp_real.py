"""The real llama.cpp (``llama-server`` from ``make install-llamacpp``, or one named by SPECBENCH_LLAMA_SERVER
or on PATH) on SmolLM2-135M-Instruct's Q4_1 GGUF: an AR cell and two speculative cells (draft-simple with
the same file as its draft model, ngram-simple from prompt lookup), their steps read from the server's own
counters and audited against its own AR.

Slow (a server start per cell); run with SPECBENCH_SLOW=1. CI sets SPECBENCH_LLAMACPP_REQUIRED=1 after
``make install-llamacpp``, so a missing server fails there instead of skipping.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import tiny_recipes
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.engines.llamacpp_server import available

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server_here():
    missing = available({})
    if missing:
        if os.environ.get("SPECBENCH_LLAMACPP_REQUIRED") == "1":
            pytest.fail(f"{missing[0]}: {missing[1]}")
        pytest.skip(f"llama-server is not here ({missing[0]})")


def _servers_left() -> bool:
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return any("llama-server" in line and "SmolLM2-135M-Instruct" in line for line in out.splitlines())


def test_llama_cpp_cells_count_their_steps_and_pass_their_own_audit(server_here, tmp_path):
    recipe = tiny_recipes.recipe(
        "llamacpp-real",
        {
            "served": {
                "source": "smollm2-135m-instruct",
                "dtype": "float32",
                "engine": "llama.cpp",
                "engine_options": {"ctx_size": 2048, "threads": 2},
            },
            "self_draft": {"source": "smollm2-135m-instruct", "dtype": "float32"},
            "lookup": {"source": "prompt-lookup", "options": {"max_ngram": 3}},
        },
        [
            tiny_recipes.ar("ar", "served"),
            tiny_recipes.speculative("self_draft", 4, name="sd", target="served"),
            tiny_recipes.speculative("lookup", 4, name="ngram", target="served"),
        ],
        limit=2,
        max_new_tokens=48,
        task="passages",
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    for row in rows:
        steps, record = row["steps"], row["engine_record"]
        assert steps[0] == [0, 0] and all(0 <= a <= d for d, a in steps if d)
        # one step per target pass; each commits its accepted drafts + 1 (the last maybe cut)
        assert row["forwards"]["served"]["forward_passes"] == len(steps)
        assert sum(a + 1 for _, a in steps) >= row["n_tokens"]
        assert record["engine"] == "llama.cpp" and record["settings"]["command"][0].endswith("llama-server")
        assert record["timings"].get("draft_n", 0) == sum(d for d, _ in steps)
        assert record["timings"].get("draft_n_accepted", 0) == sum(a for _, a in steps)
    speculative = [r for r in rows if r["cell"] != "ar"]
    assert all(sum(d for d, _ in r["steps"]) > 0 for r in speculative if r["cell"].startswith("sd"))
    # greedy speculation reproduces the server's own AR, or parts from it where a verification's batch
    # sums in another order than a one-token pass (a numerical near-tie)
    assert sum(r["divergence_class"] == "identical" for r in speculative) >= len(speculative) // 2
    assert not _servers_left()


@pytest.mark.skipif(
    os.environ.get("SPECBENCH_LLAMACPP_EAGLE3") != "1",
    reason="trains a SmolLM2 EAGLE-3 head first (minutes on 2 cores), so .ci/run leaves it out: "
    "SPECBENCH_SLOW=1 SPECBENCH_LLAMACPP_EAGLE3=1 pytest tests/test_llamacpp_real.py -k eagle3",
)
def test_specbenchs_eagle3_head_runs_in_draft_eagle3(server_here, tmp_path):
    """specbench's EAGLE-3 layer for SmolLM2 (trained as tests/test_vllm_real.py trains it), converted by
    llama.cpp's own convert_hf_to_gguf.py, drafts in llama-server's draft-eagle3 on SmolLM2's Q4_1 GGUF:
    its rows are llama.cpp's own AR (ties allowed), it drafts and some drafts are accepted, and its tokens
    per target pass are printed beside specbench's own chain on the same prompts (float32 there, Q4_1
    here: close, not equal). Should llama.cpp's converter or server refuse the head, the run stops in one
    line naming the head, which this test records (xfail) rather than passing silently."""
    from test_vllm_real import _trained_smollm2_head

    chain = {"depth": 3, "branch": 1, "frontier": 1}
    served = {"ctx_size": 2048, "threads": 2}
    recipe = tiny_recipes.recipe(
        "llamacpp-eagle3-real",
        {
            "smollm2": {"source": "smollm2-135m-instruct", "dtype": "float32"},
            "served": {
                "source": "smollm2-135m-instruct",
                "dtype": "float32",
                "engine": "llama.cpp",
                "engine_options": served,
            },
        },
        [tiny_recipes.ar(target="smollm2"), tiny_recipes.ar("llamacpp-ar", "served")],
        limit=3,
        max_new_tokens=48,
        task="passages",
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    folder = _trained_smollm2_head(path, tmp_path / "head")
    recipe["models"]["head"] = {"source": f"eagle3:{folder}", "options": {"of": "smollm2"}}
    recipe["models"]["served_head"] = {"source": f"eagle3:{folder}", "options": {"of": "served"}}
    recipe["methods"] += [
        {"name": "eagle3", "method": "eagle", "target": "smollm2", "drafter": "head", "params": chain},
        {
            "name": "llamacpp-eagle3",
            "method": "eagle",
            "target": "served",
            "drafter": "served_head",
            "params": chain,
        },
    ]
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out")])
    if result.exit_code == 2 and "models.served_head" in result.output:
        pytest.xfail(f"llama.cpp refused the EAGLE-3 head: {result.output.strip().splitlines()[-1]}")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    ours = [r for r in rows if r["cell"] == "eagle3"]
    theirs = [r for r in rows if r["cell"] == "llamacpp-eagle3"]
    assert len(ours) == len(theirs) == 3
    for row in theirs:
        assert row["divergence_class"] in ("identical", "tie"), row["first_divergence"]
        config = row["engine_record"]["speculative_config"]
        assert config["spec_type"] == "draft-eagle3" and config["aux_layer_ids"] == [2, 15, 27]
    steps = [step for r in theirs for step in r["steps"]]
    assert sum(d for d, _ in steps) > 0 and sum(a for _, a in steps) > 0
    per_pass = {
        name: sum(r["n_tokens"] for r in cell) / sum(len(r["steps"]) for r in cell)
        for name, cell in (("ours", ours), ("llama.cpp", theirs))
    }
    print(f"tokens per target pass: {per_pass}")
    assert not _servers_left()
