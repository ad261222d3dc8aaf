"""The report's alarms for a misconfigured head (specbench.pipeline.views.head_alarms) and the
model-card view ``report RUN --by k`` (specbench.pipeline.views.by_k), on tiny real runs: a target whose
greedy output is known (counter_target.py) and a published EAGLE-3 head wired to draft it right from
the target's states at layers 2, 4 and 5. Fed the states of layers 3, 5 and 6 instead (its config's aux
ids shifted by one), the same weights accept nothing, and the report says so, naming the causes; the
right ones draft, and the report is quiet."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from counter_target import counter_target, scorer
from test_eagle3_layouts import write_head
from typer.testing import CliRunner

from specbench.cli import app
from specbench.models.tiny import byte_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

HIDDEN, HALF, VOCAB, LAYERS = 32, 16, 260, 8
JUNK = 5  # the layer that writes the states' second half: inputs of layers 2..5 agree, of 6 differ


def target_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "target"
    if not folder.is_dir():
        counter_target(VOCAB, HIDDEN, LAYERS, junk_layer=JUNK).save_pretrained(folder)
        byte_tokenizer().save_pretrained(folder)
    return folder


def wired_head(target, seed: int = 0) -> dict:
    """EAGLE-3 tensors that draft two tokens on from the target's states at layers (a, b, c): ``fc``
    takes the token half of a's and adds a mix of the other half of b's minus c's, which cancels where
    no layer between b and c wrote there (2, 4, 5) and swamps the token otherwise (3, 5, 6); attention
    and MLP add nothing, so the head's output is that feature."""
    generator = torch.Generator().manual_seed(seed)
    rows = target.get_input_embeddings().weight.detach()

    def normal(*shape):
        return torch.randn(*shape, generator=generator) / shape[-1] ** 0.5

    fc = torch.zeros(HIDDEN, 3 * HIDDEN)
    fc[:HALF, :HALF] = torch.eye(HALF)
    mix = 5 * normal(HALF, HIDDEN - HALF)
    fc[:HALF, HIDDEN + HALF : 2 * HIDDEN] = mix
    fc[:HALF, 2 * HIDDEN + HALF :] = -mix
    ones = torch.ones(HIDDEN)
    return {
        "fc.weight": fc,
        "midlayer.input_layernorm.weight": ones.clone(),
        "midlayer.hidden_norm.weight": ones.clone(),
        "midlayer.self_attn.q_proj.weight": normal(HIDDEN, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": normal(HIDDEN // 2, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": normal(HIDDEN // 2, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": torch.zeros(HIDDEN, HIDDEN),
        "midlayer.post_attention_layernorm.weight": ones.clone(),
        "midlayer.mlp.gate_proj.weight": normal(2 * HIDDEN, HIDDEN),
        "midlayer.mlp.up_proj.weight": normal(2 * HIDDEN, HIDDEN),
        "midlayer.mlp.down_proj.weight": torch.zeros(HIDDEN, 2 * HIDDEN),
        "norm.weight": ones.clone(),
        "lm_head.weight": scorer(rows, 2).float(),
        "d2t": torch.zeros(VOCAB, dtype=torch.long),
        "t2d": torch.ones(VOCAB, dtype=torch.bool),
    }


def run(
    tmp_path: Path, name: str, head: Path | None, methods: list[dict], chat_template: bool = True
) -> Path:
    models = {"target": {"source": str(target_folder(tmp_path)), "dtype": "float64"}}
    if any(method.get("drafter") == "lookup" for method in methods):
        models["lookup"] = {"source": "prompt-lookup"}
    if head is not None:
        models["head"] = {"source": f"eagle3:{head}", "options": {"of": "target"}}
    data = {
        "name": name,
        "generation": {"max_new_tokens": 16},
        "models": models,
        "datasets": [{"task": "arithmetic", "limit": 2, "chat_template": chat_template}],
        "methods": [{"name": "ar", "method": "autoregressive", "target": "target"}, *methods],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / name
    result = CliRunner().invoke(app, ["run", str(path), "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    return out


LOOKUP = {
    "name": "sd-lookup",
    "method": "speculative",
    "target": "target",
    "drafter": "lookup",
    "grid": {"k": [1, 2, 4]},
}
CHAIN = {
    "name": "eagle3-chain",
    "method": "eagle",
    "target": "target",
    "drafter": "head",
    "params": {"depth": 1, "branch": 1, "frontier": 1, "nodes": 1},
}


def report(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["report", *map(str, args)])
    return result.exit_code, " ".join(result.output.split())  # Rich wraps long lines


def cells(out: Path) -> dict[str, dict]:
    import pandas as pd

    return {r["cell"]: r for r in pd.read_csv(out / "cells.csv").to_dict("records")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the right head's run, the shifted head's run with prompts outside the chat template, their
    folder)."""
    tmp_path = tmp_path_factory.mktemp("alarms")
    target = counter_target(VOCAB, HIDDEN, LAYERS, junk_layer=JUNK)  # the saved target's weights
    tensors = wired_head(target)
    right = write_head(tmp_path / "heads" / "right", "eagle", target, tensors)  # default layers 2, 4, 5
    shifted = write_head(
        tmp_path / "heads" / "shifted",
        "speculators",
        target,
        tensors,
        eagle_aux_hidden_state_layer_ids=[3, 5, 6],
        eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5]},  # SpecForge's field, read second
    )
    return (
        run(tmp_path, "right", right, [LOOKUP, CHAIN]),
        run(tmp_path, "shifted", shifted, [LOOKUP, CHAIN], chat_template=False),
        tmp_path,
    )


def test_a_head_fed_shifted_states_is_flagged_and_the_right_one_is_not(runs):
    right, shifted, _ = runs
    good, bad = cells(right), cells(shifted)
    assert good["eagle3-chain"]["acceptance_length"] > 1.5  # it drafts right: two tokens a pass
    assert abs(bad["eagle3-chain"]["acceptance_length"] - 1.0) <= 0.05  # the same weights, other states
    assert min(run["sd-lookup[k=4]"]["acceptance_length"] for run in (good, bad)) >= 1.3
    assert all(r["lossless_identical"] == r["lossless_checked"] for r in (*good.values(), *bad.values()))
    code, text = report(right)
    assert code == 0 and "misconfigured" not in text and "run otherwise than" not in text, text
    code, text = report(shifted)
    assert code == 0, text
    assert "! misconfigured drafter? arithmetic/test eagle3-chain commits 1.00 tokens per target pass" in text
    assert re.search(r"while sd-lookup\[k=\d\] \(prompt lookup\) commits \d\.\d\d on the same prompts", text)
    assert (
        "aux layer ids (it read the inputs of layers [3, 5, 6], from its eagle_aux_hidden_state_layer_ids)"
        in text
    )
    assert "draft vocabulary mapping" in text and "chat template" in text and "norm_before_residual" in text
    # what its files record against the run: another target, no chat template, aux ids named twice
    assert "! heads run otherwise than they were trained: shifted head:" in text
    assert "its files name tiny-llama as the target it was trained for" in text
    assert "renders arithmetic without it (chat_template: false)" in text
    assert "names aux layers [3, 5, 6] and, in eagle_config, [2, 4, 5]" in text


def _expected(run_dir: Path) -> dict[tuple[str, int], tuple[float, float, int]]:
    rows = [json.loads(line) for line in (run_dir / "examples.jsonl").read_text().splitlines()]
    out = {}
    for cell, k in (("sd-lookup[k=1]", 1), ("sd-lookup[k=2]", 2), ("sd-lookup[k=4]", 4), ("eagle3-chain", 1)):
        mine = [r for r in rows if r["cell"] == cell]
        tokens, passes = sum(r["n_tokens"] for r in mine), sum(len(r["steps"]) for r in mine)
        ratios = [r["n_tokens"] / len(r["steps"]) for r in mine]
        out[(cell.split("[")[0], k)] = (tokens / passes, sum(ratios) / len(ratios), len(mine))
    return out


def test_report_by_k_gives_the_model_card_table_pooled_and_per_request(runs):
    right, _, tmp_path = runs
    code, text = report(right, "--by", "k")
    assert code == 0, text
    assert (
        "right · arithmetic/test" in text and all(f"k={k}" in text for k in (1, 2, 4)) and "k=3" not in text
    )
    assert "pooled" in text and "mean of requests" in text
    result = CliRunner().invoke(app, ["report", str(right), "--by", "k", "--format", "csv"])
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(result.output)))
    got = {
        (r["series"], int(r["k"])): (float(r["pooled"]), float(r["mean_of_requests"]), int(r["requests"]))
        for r in rows
    }
    expected = _expected(right)
    assert got.keys() == expected.keys()
    for key, (pooled, mean, requests) in expected.items():
        assert got[key][0] == pytest.approx(pooled, abs=1e-4) and got[key][1] == pytest.approx(mean, abs=1e-4)
        assert got[key][2] == requests == 2
    page, twin = tmp_path / "by_k.html", tmp_path / "by_k.json"
    code, text = report(right, "--by", "k", "--html", page, "--json", twin)
    assert code == 0, text
    assert "Acceptance length by k" in page.read_text() and "mean of requests" in page.read_text()
    records = json.loads(twin.read_text())["sections"]["Acceptance length by k"]
    assert {(r["series"], r["k"]) for r in records} == set(expected)


def test_report_by_k_without_speculative_cells_or_a_k_is_one_line(runs):
    _, _, tmp_path = runs
    only_ar = run(tmp_path, "only-ar", None, [])
    code, text = report(only_ar, "--by", "k")
    assert code == 2 and "holds no speculative cells (only the AR baseline)" in text
    head = tmp_path / "heads" / "again"
    target = counter_target(VOCAB, HIDDEN, LAYERS, junk_layer=JUNK)
    write_head(head, "eagle", target, wired_head(target))
    tree = {**CHAIN, "name": "eagle3-tree", "params": {"depth": 2, "branch": 2, "frontier": 2, "nodes": 4}}
    trees = run(tmp_path, "trees", head, [tree])
    code, text = report(trees, "--by", "k")
    assert code == 2 and "none of its drafting cells has a draft length k" in text
