"""Token trees: one target pass scores every node as its own path, the accepted path's cache is kept,
greedy tree decoding is the target's greedy output, and sampled tree decoding follows its law."""

from __future__ import annotations

import copy
import json
from collections import Counter

import numpy as np
import pytest
import tiny_recipes
import torch
import yaml
from conftest import ENGINES, OpCount, engine_model
from test_acceptance import TINY_OPTIONS, assert_matches, exact_joint, softmax_at
from typer.testing import CliRunner

from specbench.cli import app
from specbench.decoding import autoregressive, tree_speculative
from specbench.decoding.tree_speculative import verify_greedy, verify_sampled
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams
from specbench.models.tree import ROOT, TokenTree, move_path_entries

pytestmark = pytest.mark.usefixtures("one_thread")
F64 = torch.float64


def full_next(weights, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return weights(input_ids=torch.tensor(ids)[None], use_cache=False).logits[0, -1]


TREES = {
    "chain": (-1, 0, 1),
    "siblings": (-1, -1, -1),
    "branching": (-1, -1, 0, 0, 2, 1),
}


@pytest.mark.parametrize("shape", list(TREES))
def test_a_tree_pass_scores_every_node_as_its_own_path(shape, tiny_model):
    weights = tiny_model("tiny-llama", 3, vocab_size=300, layers=2)
    model = HFModel(weights, "m")
    prompt, generated = [5, 6, 7, 8], [9, 10]
    parents = TREES[shape]
    tree = TokenTree(torch.arange(20, 20 + len(parents)), parents)
    model.start(torch.tensor(prompt))
    scored = model.score_tree(torch.tensor(generated), tree, hidden=("last",))
    base = prompt + generated
    torch.testing.assert_close(scored.logits[0], full_next(weights, base), atol=1e-10, rtol=0)
    for node in range(len(tree)):
        path = [20 + i for i in tree.path(node)]
        torch.testing.assert_close(
            scored.logits[node + 1], full_next(weights, base + path), atol=1e-10, rtol=0
        )
    assert scored.hidden["last"].shape == (len(tree) + 1, weights.config.hidden_size)
    snap = model.counter.snapshot()
    assert (snap["forward_passes"], snap["tokens_scored"]) == (1, len(base) + len(tree))


@pytest.mark.parametrize("path", [[], [0], [0, 2, 4], [1, 5]])
def test_keep_path_keeps_the_accepted_nodes_cache_and_forgets_the_rest(path, tiny_model):
    weights = tiny_model("tiny-llama", 3, vocab_size=300, layers=2)
    model = HFModel(weights, "m")
    prompt, generated = [5, 6, 7, 8], [9]
    tree = TokenTree(torch.arange(20, 26), TREES["branching"])
    model.start(torch.tensor(prompt))
    model.score(torch.tensor(generated[:0], dtype=torch.long), 0)  # the prompt cached, as in a loop
    model.score_tree(torch.tensor(generated), tree)
    model.keep_path(path)
    accepted = generated + [20 + i for i in path]
    nxt = accepted + [42]
    scored = model.score(torch.tensor(nxt), 0)
    torch.testing.assert_close(scored.logits[-1], full_next(weights, prompt + nxt), atol=1e-10, rtol=0)
    assert model.counter.snapshot()["tokens_scored"] == 4 + (1 + 6) + 1  # the bonus alone is fed


def test_a_path_already_in_place_moves_no_cache_entry(tiny_model):
    """A chain's accepted path (nodes 0, 1, ...) sits where keep_path would copy it: no kernel runs;
    a path that leaves the first children moves only from where it leaves them."""
    model = HFModel(tiny_model("tiny-llama", 3, vocab_size=300, layers=2), "m")
    model.start(torch.tensor([5, 6, 7, 8]))
    model.score_tree(torch.tensor([9]), TokenTree(torch.arange(20, 26), TREES["branching"]))
    layers = model._cache.layers
    before = [layer.keys.clone() for layer in layers]
    start = 5
    with torch.inference_mode(), OpCount() as counted:
        move_path_entries(layers, start, [0], model.device)
    assert counted.total == 0
    with torch.inference_mode(), OpCount() as counted:
        move_path_entries(layers, start, [0, 2, 4], model.device)
    assert counted.ops["aten.index_select"] == 2 * len(layers)
    for layer, old in zip(layers, before, strict=True):
        torch.testing.assert_close(layer.keys[..., start, :], old[..., start, :], rtol=0, atol=0)
        moved = old[..., [start + 2, start + 4], :]
        torch.testing.assert_close(layer.keys[..., start + 1 : start + 3, :], moved, rtol=0, atol=0)


def test_trees_are_checked():
    with pytest.raises(ValueError, match="parent 1 must be -1 or an earlier node"):
        TokenTree(torch.tensor([1, 2]), (-1, 1))
    with pytest.raises(ValueError, match="3 tokens for 2 parents"):
        TokenTree(torch.tensor([1, 2, 3]), (-1, 0))
    tree = TokenTree(torch.tensor([7, 8, 9]), TREES["chain"])
    assert tree.depth == 3 and tree.path(2) == [0, 1, 2] and tree.children(ROOT) == [0]


def test_encoder_decoders_take_no_tree(tiny_model):
    model = HFModel(tiny_model("tiny-t5", 0, vocab_size=300), "t5")
    model.start(torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="decoder-only"):
        model.score_tree(torch.tensor([], dtype=torch.long), TokenTree(torch.tensor([5]), (-1,)))


def test_greedy_walk_follows_the_target_choice_and_adds_its_next_token():
    tree = TokenTree(torch.tensor([1, 2, 3, 4, 5]), (-1, -1, 1, 1, 3))
    logits = torch.zeros(6, 8)
    for row, best in enumerate([2, 0, 4, 7, 5, 6]):  # row i + 1 follows node i: root 2, node 1 4, node 3 5
        logits[row, best] = 1.0
    assert verify_greedy(tree, logits) == ([1, 3, 4], 6)
    logits[0] = 0
    logits[0, 7] = 1.0  # the target wants a token no child has: nothing accepted
    assert verify_greedy(tree, logits) == ([], 7)


def noisy(weights, scale: float, seed: int):
    copied = copy.deepcopy(weights)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copied.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.add_(noise * parameter.std() * scale)
    return copied


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("depth", "branch", "frontier", "nodes"), [(1, 1, 1, 1), (4, 2, 2, 8), (6, 3, 3, 24)]
)
@pytest.mark.parametrize("drafter_kind", ["same", "noisy", "unrelated"])
def test_greedy_tree_decoding_is_the_target_greedy_output(
    engine, seed, depth, branch, frontier, nodes, drafter_kind, tiny_model
):
    weights = tiny_model("tiny-llama", seed, vocab_size=300, init_std=0.3)
    draft_weights = {
        "same": weights,
        "noisy": noisy(weights, 0.2, seed),
        "unrelated": tiny_model("tiny-llama", seed + 100, vocab_size=300, init_std=0.3),
    }[drafter_kind]
    prompt = torch.randint(4, 260, (7,), generator=torch.Generator().manual_seed(seed))
    eos = [int(autoregressive.generate(HFModel(weights, "t"), prompt, max_new_tokens=30).tokens[17])]
    for eos_token_id in (None, eos):
        ar = autoregressive.generate(
            HFModel(weights, "t"), prompt, max_new_tokens=30, eos_token_id=eos_token_id
        )
        target, drafter = engine_model(weights, "t", engine), engine_model(draft_weights, "d", engine)
        tree = tree_speculative.generate(
            target, drafter, prompt, depth=depth, branch=branch, frontier=frontier, nodes=nodes,
            max_new_tokens=30, eos_token_id=eos_token_id,
        )  # fmt: skip
        assert tree.tokens == ar.tokens and tree.stopped_by_eos == ar.stopped_by_eos
        assert tree.forwards["t"]["forward_passes"] == len(tree.steps)
        assert all(0 <= accepted <= drafted <= depth for drafted, accepted in tree.steps)
    if drafter_kind == "same" and depth > 1:
        assert tree.accepted_per_step > 2  # the drafter is the target: whole paths are accepted


def test_sampled_walk_keeps_the_target_law_at_a_node():
    """One node's children drawn without replacement from q: the committed token follows p."""
    p = torch.tensor([0.30, 0.05, 0.25, 0.00, 0.25, 0.15], dtype=F64)
    q = torch.tensor([0.05, 0.40, 0.05, 0.30, 0.10, 0.10], dtype=F64)
    generator = torch.Generator().manual_seed(7)
    counts, via_second = np.zeros(6), 0
    for _ in range(6000):
        keys = torch.log(q) - torch.log(-torch.log(torch.rand(6, generator=generator, dtype=F64)))
        children = torch.topk(keys, 3).indices
        tree = TokenTree(children, (-1, -1, -1), q.expand(3, 6))
        rows = torch.stack([p] + [torch.full((6,), 1 / 6, dtype=F64)] * 3)
        path, token = verify_sampled(tree, rows, generator)
        first = int(tree.tokens[path[0]]) if path else token
        counts[first] += 1
        via_second += bool(path) and path[0] > 0
    assert_matches(counts, p.numpy(), "first token")
    assert via_second > 0  # later children were accepted after a first rejection


@pytest.mark.parametrize(("branch", "frontier"), [(2, 1), (3, 2)])
def test_sampled_tree_decoding_reproduces_the_target_joint(branch, frontier, tiny_model):
    weights = tiny_model("tiny-llama", 1, **TINY_OPTIONS)
    draft_weights = tiny_model("tiny-llama", 2, **TINY_OPTIONS)
    prompt = torch.tensor([3, 4, 5, 2])
    sampling = SamplingParams(temperature=1.0)
    reference = exact_joint(weights, prompt, 3, softmax_at(1.0))
    generator = torch.Generator().manual_seed(2024)
    counts, steps = np.zeros_like(reference), Counter()
    target, drafter = HFModel(weights, "t"), HFModel(draft_weights, "d")
    for _ in range(1500):
        out = tree_speculative.generate(
            target, drafter, prompt, depth=2, branch=branch, frontier=frontier, nodes=64,
            max_new_tokens=3, sampling=sampling, generator=generator,
        )  # fmt: skip
        counts[tuple(out.tokens)] += 1
        steps.update(out.steps)
    assert_matches(counts, reference, f"branch {branch}")
    assert steps[(2, 2)] > 0 and steps[(2, 0)] > 0 and steps[(2, 1)] > 0, steps


def test_a_tree_recipe_runs_lossless_end_to_end(tmp_path):
    recipe = tmp_path / "tree.yaml"
    tree = {"name": "tree", "method": "tree_speculative", "target": "target", "drafter": "draft"}
    data = tiny_recipes.recipe(
        "tree",
        {"target": tiny_recipes.tiny(vocab_size=300), "draft": tiny_recipes.tiny(vocab_size=300, seed=1)},
        [tiny_recipes.ar(), tree | {"grid": {"depth": [2, 4]}, "params": {"branch": 2, "nodes": 8}}],
        max_new_tokens=12,
    )
    recipe.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(recipe), "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    trees = [row for row in rows if row["method"] == "tree_speculative"]
    assert len(trees) == 4 and all(row["divergence_class"] == "identical" for row in trees)
    report = CliRunner().invoke(app, ["report", str(out)])
    rows = [line for line in report.output.splitlines() if line.startswith("│ tree")]
    assert [row.split()[1] for row in rows] == ["tree[depth=2]", "tree[depth=4]"]  # labels are no markup
    bad = {
        "nodes below depth": ({"params": {"branch": 2, "nodes": 1}}, "use nodes >= depth"),
        # depth 4, branch 2, frontier 2: 2 + 4 + 4 + 4 nodes, all kept when sampled
        "sampled tree past nodes": ({"temperature": 1.0}, "a sampled tree keeps all 14 nodes"),
        "encoder-decoder target": ({"target": "tiny-t5"}, "which serve decoder-only targets"),
    }
    for label, (change, message) in bad.items():
        case = yaml.safe_load(yaml.safe_dump(data))
        case["methods"][1].update(change.get("params") and {"params": change["params"]} or {})
        if "temperature" in change:
            case["generation"]["temperature"] = change["temperature"]
        if "target" in change:
            case["models"] = {
                name: {"source": "tiny-t5", "dtype": "float64", "options": {"vocab_size": 300, "seed": i}}
                for i, name in enumerate(case["models"])
            }
        recipe.write_text(yaml.safe_dump(case))
        result = CliRunner().invoke(app, ["run", str(recipe), "--output-dir", str(tmp_path / "bad")])
        assert result.exit_code == 2 and message in result.output, (label, result.output)
        assert len(result.output.strip().splitlines()) == 1, label


def test_compiled_tree_passes_run_their_padded_bucket_and_match_eager(tiny_model):
    weights = tiny_model("tiny-llama", 3, vocab_size=300, layers=2)
    eager = HFModel(weights, "e")
    compiled = engine_model(weights, "c", "compiled")
    for hidden in (False, True):  # a bucket of 7 tokens: trees of 4 nodes are padded
        compiled.prepare(64, (2,), hidden=hidden, tree_sizes=(6,))
    prompt = torch.tensor([5, 6, 7, 8])
    tree = TokenTree(torch.arange(20, 24), (-1, -1, 0, 2))
    for model in (eager, compiled):
        model.start(prompt)
        model.score(torch.tensor([9]), 0)  # the prefill; the cache then lacks only the last token
    passes = [model.score_tree(torch.tensor([9, 10]), tree, hidden=("last",)) for model in (eager, compiled)]
    assert ("tree", 7, compiled.capacity, True) in compiled._compiled
    torch.testing.assert_close(passes[1].logits, passes[0].logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(passes[1].hidden["last"], passes[0].hidden["last"], rtol=1e-5, atol=1e-5)
    for model in (eager, compiled):
        model.keep_path([0, 2])
    after = [model.score(torch.tensor([9, 10, 20, 22, 42]), 0).logits for model in (eager, compiled)]
    torch.testing.assert_close(after[1], after[0], rtol=1e-5, atol=1e-5)
    assert compiled.counter.snapshot()["tokens_scored"] == eager.counter.snapshot()["tokens_scored"]
