"""Medusa heads: drafting from the target's own states keeps greedy output exact and sampled output
in the target's law, training lifts the heads' accuracy, and the medusa: source refuses heads of
another target and methods that cannot feed them."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import tiny_recipes
import torch
import yaml
from rich.progress import Progress
from test_acceptance import TINY_OPTIONS, assert_matches, exact_joint, softmax_at
from typer.testing import CliRunner

from specbench import sources
from specbench.cli import app
from specbench.decoding import autoregressive, tree_speculative
from specbench.decoding.medusa import MedusaTreeDrafter
from specbench.drafters import medusa
from specbench.drafters.heads import draft_head
from specbench.errors import SpecbenchError
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams
from specbench.training.distill import StudentConfig
from specbench.training.medusa import train_heads
from specbench.training.teacher import Sequence

pytestmark = pytest.mark.usefixtures("one_thread")


def random_heads(target: HFModel, heads: int, seed: int, scale: float = 0.5) -> medusa.MedusaDrafter:
    hidden = target.model.config.hidden_size
    module = medusa.MedusaHeads(hidden, heads)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in module.blocks:
            block.linear.weight.copy_(torch.randn(hidden, hidden, generator=generator) * scale / hidden**0.5)
    weight = target.model.get_output_embeddings().weight.detach()
    module = module.to(weight.dtype)
    return medusa.MedusaDrafter("heads", module, draft_head(weight, None), target.name)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 3, 2, 12), (4, 4, 4, 40)])
def test_medusa_greedy_is_the_target_greedy_output(seed, shape, tiny_model):
    depth, branch, frontier, nodes = shape
    weights = tiny_model("tiny-llama", seed, vocab_size=300, init_std=0.3)
    prompt = torch.randint(4, 260, (6,), generator=torch.Generator().manual_seed(seed))
    ar = autoregressive.generate(HFModel(weights, "t"), prompt, max_new_tokens=30)
    target = HFModel(weights, "t")
    drafter = MedusaTreeDrafter(random_heads(target, 4, seed, scale=0.0 if seed == 0 else 0.5))
    out = tree_speculative.generate(
        target, drafter, prompt, depth=depth, branch=branch, frontier=frontier, nodes=nodes, max_new_tokens=30
    )
    assert out.tokens == ar.tokens
    assert out.steps[0] == (0, 0)  # the prefill: no state to draft from yet
    assert out.forwards["t"]["forward_passes"] == len(out.steps)
    assert out.forwards["heads"]["forward_passes"] == sum(1 for drafted, _ in out.steps if drafted)


def test_medusa_sampling_reproduces_the_target_joint(tiny_model):
    weights = tiny_model("tiny-llama", 1, **TINY_OPTIONS)
    prompt = torch.tensor([3, 4, 5, 2])
    reference = exact_joint(weights, prompt, 3, softmax_at(1.0))
    target = HFModel(weights, "t")
    drafter = MedusaTreeDrafter(random_heads(target, 2, 5))
    generator = torch.Generator().manual_seed(11)
    counts, steps = np.zeros_like(reference), Counter()
    for _ in range(1500):
        out = tree_speculative.generate(
            target, drafter, prompt, depth=2, branch=2, frontier=2, nodes=64, max_new_tokens=3,
            sampling=SamplingParams(temperature=1.0), generator=generator,
        )  # fmt: skip
        counts[tuple(out.tokens)] += 1
        steps.update(out.steps)
    assert_matches(counts, reference, "medusa sampling")
    assert steps[(1, 1)] > 0 and steps[(1, 0)] > 0, steps


def test_training_lifts_the_heads_accuracy_on_held_out_text(tiny_model):
    """A target that continues a cycle: the heads learn to see k + 1 tokens ahead."""
    weights = tiny_model("tiny-llama", 4, vocab_size=300, init_std=0.3)
    target = HFModel(weights, "t")
    cycle = torch.tensor([10, 20, 30, 40, 50, 60, 70])
    sequences = []
    for i in range(24):
        ids = torch.cat([torch.tensor([5 + i % 3]), cycle.roll(-(i % 7)).repeat(4)])
        sequences.append(Sequence(ids, 1, torch.zeros(0, 1), torch.zeros(0, 1)))
    config = StudentConfig("medusa", epochs=200.0, lr=1e-2, batch_tokens=256)
    vocab = torch.arange(300)
    with Progress(disable=True) as progress:
        heads, record = train_heads(target, sequences[:20], sequences[20:], config, vocab, progress)
    assert all(after > 0.7 for after in record["held_out_accuracy_after"]), record["held_out_accuracy_after"]
    assert (
        record["held_out_accuracy_before"][0] < 0.5
        and record["curve"][-1]["loss"] < record["curve"][0]["loss"]
    )
    assert record["max_sequence"] == 512 and record["sequences"] == 20


def test_medusa_trains_on_sequences_up_to_max_sequence(tiny_model):
    target = HFModel(tiny_model("tiny-llama", 0, vocab_size=300), "t")
    sequences = [
        Sequence(torch.arange(10, 10 + (22 if i % 2 else 29)), 1, torch.zeros(0, 1), torch.zeros(0, 1))
        for i in range(16)
    ]
    config = StudentConfig("medusa", epochs=1.0, lr=1e-3, batch_tokens=256, max_sequence=25)
    with Progress(disable=True) as progress:
        _, record = train_heads(target, sequences[:12], sequences[12:], config, torch.arange(300), progress)
    # the six 22-token training sequences, each supervised at its answer positions
    assert record["max_sequence"] == 25 and record["sequences"] == 6


def write_heads(cache, target_source: str, hidden: int, vocab: int, heads: int = 2, draft_vocab=None) -> None:
    folder = cache / "drafters" / target_source / "medusa"
    module = medusa.MedusaHeads(hidden, heads)
    manifest = {"heads": heads, "hidden_size": hidden, "vocab_size": vocab, "draft_vocab": draft_vocab}
    medusa.save(folder, module, manifest)


def recipe(tmp_path, method: str = "medusa", drafter: str = "heads", of: str = "target") -> dict:
    return tiny_recipes.recipe(
        "medusa",
        {
            "target": tiny_recipes.tiny(vocab_size=300),
            "heads": {"source": "medusa:tiny-llama/medusa", "options": {"of": of}},
            "draft": tiny_recipes.tiny(vocab_size=300, seed=1),
        },
        [
            tiny_recipes.ar(),
            {"name": "m", "method": method, "target": "target", "drafter": drafter, "params": {"depth": 2}},
            tiny_recipes.speculative(k=2),
        ],
        max_new_tokens=10,
    )


def run(tmp_path, data: dict, out: str = "out"):
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(data))
    return CliRunner().invoke(app, ["run", str(path), "--output-dir", str(tmp_path / out)])


def test_a_medusa_recipe_runs_lossless_and_bad_pairings_are_recipe_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_heads(tmp_path / "cache", "tiny-llama", 32, 300)
    result = run(tmp_path, recipe(tmp_path))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    assert all(row["divergence_class"] == "identical" for row in rows if row["method"] == "medusa")
    bad = {
        "speculative with heads": (recipe(tmp_path, "speculative"), "cannot use it"),
        "medusa with a model": (recipe(tmp_path, drafter="draft"), "drafts with medusa heads"),
        "heads of another model": (recipe(tmp_path, of="draft"), "set models.heads.options.of: target"),
    }
    for label, (data, fix) in bad.items():
        result = run(tmp_path, data, "bad")
        assert result.exit_code == 2 and fix in result.output and "\n" not in result.output.strip(), label
    deep = recipe(tmp_path)
    deep["methods"][1]["params"]["depth"] = 3  # the heads are 2
    result = run(tmp_path, deep, "deep")
    assert result.exit_code == 2 and "use depth <= 2" in result.output, result.output


def test_heads_of_another_target_are_refused_before_the_first_row(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_heads(tmp_path / "cache", "tiny-llama", 64, 300)  # trained for a 64-wide target
    target = sources.load(
        sources.ModelRequest("target", "tiny-llama", "float64", "cpu", options=(("vocab_size", 300),))
    )
    request = sources.ModelRequest("heads", "medusa:tiny-llama/medusa", options=(("of", "target"),))
    with pytest.raises(SpecbenchError, match=r"models\.heads\.options\.of: .*hidden_size of 64.*has 32"):
        sources.load(request, {"target": target}.__getitem__)
    missing = sources.ModelRequest("heads", "medusa:tiny-llama/other", options=(("of", "target"),))
    with pytest.raises(SpecbenchError, match=r"no Medusa heads .* `specbench distill --size medusa`"):
        sources.load(missing, {"target": target}.__getitem__)


def test_the_vllm_export_holds_what_vllm_computes_the_same_logits_from(tmp_path, tiny_model):
    """vLLM's Medusa: each block x + SiLU(W x + b), then the original LM head cut to token_map and
    scattered back into the full vocabulary; the exported weights give our heads' logits."""
    from safetensors.torch import load_file

    target = HFModel(tiny_model("tiny-llama", 0, vocab_size=300), "t")
    drafter = random_heads(target, 3, 1)
    vocab = torch.tensor([0, 5, 7, 40, 299])
    weight = target.model.get_output_embeddings().weight.detach()
    medusa.save_vllm(tmp_path, drafter.heads, weight, vocab)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["model_type"], config["num_heads"], config["truncated_vocab_size"]) == ("medusa", 3, 5)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    feature = torch.randn(32, dtype=torch.float64)
    ours = medusa.MedusaDrafter("h", drafter.heads, draft_head(weight, vocab), "t").logits(feature)
    for k in range(3):
        w, b = tensors[f"blocks.{k}.layers.0.weight"], tensors[f"blocks.{k}.layers.0.bias"]
        x = feature.float()
        x = x + torch.nn.functional.silu(x @ w.T + b)
        theirs = torch.full((300,), float("-inf"))
        theirs[tensors["token_map"]] = x @ tensors["lm_heads.0.weight"][tensors["token_map"]].T
        torch.testing.assert_close(ours[k].float(), theirs, rtol=1e-5, atol=1e-5)


def test_plan_prices_tree_and_medusa_cells(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_heads(tmp_path / "cache", "tiny-llama", 32, 300, draft_vocab=list(range(100)))
    data = recipe(tmp_path)
    data["methods"].append(
        {"name": "tree", "method": "tree_speculative", "target": "target", "drafter": "draft"}
    )
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["plan", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    cells = {cell["method"]: cell for cell in plan["cells"]}
    assert "lower bound" in cells["medusa"]["rule"] and "lower bound" in cells["tree_speculative"]["rule"]
    heads = next(m for m in plan["models"] if m["name"] == "heads")
    assert heads["params"] == 2 * (32 * 32 + 32) and heads["shares"] == "target"
    # their pass reads their weights and the 100 rows of the LM head that their draft vocabulary keeps
    base = next(m for m in plan["models"] if m["name"] == "target")
    read = (heads["params"] + 100 * 32) * 8
    assert heads["pass_ms"] == pytest.approx(base["pass_ms"] * read / base["weight_bytes"])


def test_a_compiled_medusa_cell_compiles_its_state_graphs_before_the_first_timed_example(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_heads(tmp_path / "cache", "tiny-llama", 32, 300)
    data = recipe(tmp_path)
    data["engine"] = "compiled"
    data["methods"] = data["methods"][:2]
    data["models"].pop("draft")
    from specbench.models.compiled import CompiledHFModel

    original, compiled_during_passes = CompiledHFModel.score_tree, []

    def score_tree(self, *args, **kwargs):
        before = len(self._compiled)
        scored = original(self, *args, **kwargs)
        compiled_during_passes.append(len(self._compiled) - before)
        return scored

    monkeypatch.setattr(CompiledHFModel, "score_tree", score_tree)
    result = run(tmp_path, data)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    medusa_rows = [row for row in rows if row["method"] == "medusa"]
    assert medusa_rows[0]["compile_s"] > 0 and all(row["compile_s"] == 0 for row in medusa_rows[1:])
    assert all(row["divergence_class"] == "identical" for row in medusa_rows)
    assert compiled_during_passes and not any(compiled_during_passes)  # every graph compiled up front
