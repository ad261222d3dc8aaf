"""EAGLE heads: the head's incremental drafting (its KV cache, tree attention and positions) equals its
from-scratch forward on the target's features, greedy output is the target's on both engines, sampled
output keeps the target's law, training lifts the head's agreement, the vLLM export computes the same
features, and the eagle: source refuses a head of another target."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import tiny_recipes
import torch
import yaml
from conftest import OpCount
from rich.progress import Progress
from test_acceptance import TINY_OPTIONS, assert_matches, exact_joint, softmax_at
from torch import nn
from typer.testing import CliRunner

from specbench import sources
from specbench.cli import app
from specbench.decoding import autoregressive, tree_speculative
from specbench.drafters import eagle
from specbench.drafters.draft_vocab import full_vocabulary
from specbench.drafters.heads import draft_head
from specbench.errors import SpecbenchError
from specbench.models.compiled import CompiledHFModel
from specbench.models.facts import DTYPE_BYTES
from specbench.models.hf import HFModel
from specbench.models.sampling import SamplingParams
from specbench.models.tree import TokenTree
from specbench.training.distill import StudentConfig
from specbench.training.eagle import train_head
from specbench.training.teacher import Sequence

pytestmark = pytest.mark.usefixtures("one_thread")


def random_head(
    target: HFModel,
    seed: int,
    vocab: torch.Tensor | None = None,
    static: bool = False,
    attention: str = "sdpa",
    step_graph: bool = False,
    fused: tuple[int, ...] = (),
) -> eagle.EagleDrafter:
    torch.manual_seed(seed)
    module = eagle.EagleHead.for_target(target.model, fused, fusion_norm=bool(fused))
    if module.fusion_norm is not None:  # not the identity's ones: a skipped norm shows
        nn.init.uniform_(module.fusion_norm.weight, 0.5, 1.5)
    weight = target.model.get_output_embeddings().weight.detach()
    module = module.to(weight.dtype)
    embeddings = target.model.get_input_embeddings()
    lm_head = draft_head(weight, vocab)
    return eagle.EagleDrafter("head", module, embeddings, lm_head, target.name, static, attention, step_graph)


class Recording:
    """The drafter, with what each root and level call returned."""

    def __init__(self, drafter: eagle.EagleDrafter):
        self.inner = drafter
        self.calls: list = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def root(self, tokens, last, accepted):
        logits = self.inner.root(tokens, last, accepted)
        if logits is not None:
            self.calls.append(("root", tokens.clone(), logits))
        return logits

    def level(self, tokens, level, tree, expand):
        logits = self.inner.level(tokens, level, tree, expand)
        self.calls.append(("level", tokens.clone(), (tree, list(expand), logits)))
        return logits


def from_scratch(drafter: eagle.EagleDrafter, target_weights, prompt, tokens, path_tokens):
    """The head's logits after the committed ``tokens`` and then ``path_tokens`` (a tree path), run
    over the whole sequence without a cache: the target's features at the committed positions, the
    head's own predicted features along the path."""
    sequence = torch.cat([prompt, tokens])
    with torch.no_grad():
        states = target_weights(sequence[None], output_hidden_states=True).hidden_states
        if drafter.head.fuse is None:
            features = states[-1][0]
        else:  # EAGLE-3: the fusion of the target's chosen layers
            features = drafter.head.read(torch.cat([states[i][0] for i in drafter.head.fused_layers], -1))
        inputs, feats = list(sequence[1:]), list(features[:-1])
        out = None
        for token in [None, *path_tokens]:
            if token is not None:
                inputs.append(token)
                feats.append(out[-1])
            n = len(inputs)
            out = drafter.head(
                drafter.embeddings(torch.stack(inputs)[None]),
                torch.stack(feats)[None],
                torch.arange(n)[None],
                eagle.causal_mask(0, n, "cpu"),
            )[0]
        return drafter.lm_head.subset(out[-1:])[0]  # over the draft vocabulary, as root and level


# static: the GPU's fixed-shape passes over a static cache (head_graphs.py; padded rows, a scratch
# slot, a cache that grows), run uncaptured on the CPU
# fused: an EAGLE-3 head reading the fusion of the target's embeddings and first layer's output
@pytest.mark.parametrize("static, fused", [(False, ()), (True, ()), (False, (0, 1)), (True, (1, 0))])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 2, 2, 6)])
def test_incremental_drafting_is_the_heads_forward_from_scratch(
    shape, static, fused, tiny_model, monkeypatch
):
    from specbench.drafters import head_graphs

    monkeypatch.setattr(head_graphs, "CAPACITY_STEP", 8)  # the static cache grows (and is copied) often
    depth, branch, frontier, nodes = shape
    weights = tiny_model("tiny-llama", 2, vocab_size=12, init_std=0.3).double()
    prompt = torch.tensor([3, 4, 5, 2, 7])
    target = HFModel(weights, "t")
    drafter = Recording(random_head(target, 2, static=static, fused=fused))
    assert drafter.target_layers == (fused or ("last",))
    out = tree_speculative.generate(
        target, drafter, prompt, depth=depth, branch=branch, frontier=frontier, nodes=nodes, max_new_tokens=14
    )
    assert any(accepted > 0 for _, accepted in out.steps)  # steps that commit several positions
    checked = 0
    for kind, tokens, record in drafter.calls:
        if kind == "root":
            want = from_scratch(drafter.inner, weights, prompt, tokens, [])
            torch.testing.assert_close(record[0], want, rtol=1e-9, atol=1e-9)
        else:
            tree, expand, logits = record
            for row, node in enumerate(expand):
                path = [tree.tokens[i] for i in tree.path(node)]
                want = from_scratch(drafter.inner, weights, prompt, tokens, path)
                torch.testing.assert_close(logits[row], want, rtol=1e-9, atol=1e-9)
        checked += 1
    assert checked >= len(out.steps) - 2  # not drafted: the prefill, and a last step with no room
    if static:
        assert drafter.inner._passes.capacity >= 8 * 3  # grown twice past the prompt


def test_a_static_passs_padded_rows_touch_only_the_scratch_slot(tiny_model):
    from specbench.drafters import head_graphs

    assert [head_graphs.bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    weights = tiny_model("tiny-llama", 2, vocab_size=12, init_std=0.3).double()
    drafter = random_head(HFModel(weights, "t"), 2, static=True)
    passes = drafter._passes
    features = torch.randn(3, weights.config.hidden_size, dtype=torch.float64)
    seen = torch.ones(3, 3, dtype=torch.bool).tril()
    out, logits = passes.run(torch.tensor([1, 2, 3]), features, torch.arange(3), seen, 0)
    assert out.shape[0] == logits.shape[0] == 3  # 3 rows, run as 4
    keys = passes._keys[0].clone()
    assert (keys[:, :3] != 0).any() and not (keys[:, 3:-1] != 0).any()  # the padded row: the last slot
    again, _ = passes.run(torch.tensor([1, 2, 3]), features, torch.arange(3), seen, 0)
    torch.testing.assert_close(again, out, rtol=0, atol=0)  # rewriting the same slots changes nothing


@pytest.mark.parametrize(
    "engine, static, fused",
    [
        ("eager", False, ()),
        ("compiled", False, ()),
        ("eager", True, ()),
        ("compiled", True, ()),
        ("eager", False, (0, 1)),
        ("compiled", True, (1, 0)),
    ],
)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (4, 1, 1, 4), (4, 3, 2, 10)])
def test_eagle_greedy_is_the_target_greedy_output(engine, static, fused, shape, tiny_model):
    depth, branch, frontier, nodes = shape
    weights = tiny_model("tiny-llama", 3, vocab_size=16, init_std=0.3)
    prompt = torch.tensor([3, 4, 5, 2, 9, 1])
    ar = autoregressive.generate(HFModel(weights, "t"), prompt, max_new_tokens=30)
    target = HFModel(weights, "t") if engine == "eager" else CompiledHFModel(weights, "t", quick=True)
    if engine == "compiled":
        target.prepare(64, hidden=True, tree_sizes=(nodes,))
    # seed 4: a random head that agrees with the target somewhere in every case (no vacuous pass)
    drafter = random_head(HFModel(weights, "t"), 4, static=static, fused=fused)
    out = tree_speculative.generate(
        target, drafter, prompt, depth=depth, branch=branch, frontier=frontier, nodes=nodes, max_new_tokens=30
    )
    assert out.tokens == ar.tokens
    assert out.steps[0] == (0, 0)  # the prefill: no features to draft from yet
    assert any(accepted > 0 for _, accepted in out.steps)
    assert out.forwards["t"]["forward_passes"] == len(out.steps)
    drafting = sum(1 for d, _ in out.steps if d)
    # a root pass per drafting step, then one pass per further level it grew
    assert drafting <= out.forwards["head"]["forward_passes"] <= depth * drafting


# (depth, branch, frontier, nodes): a chain; trees reranked; frontier wider than a level; every node kept
@pytest.mark.parametrize("shape", [(5, 1, 1, 5), (6, 4, 4, 24), (4, 3, 2, 10), (3, 2, 5, 20)])
def test_the_step_graphs_tree_is_the_host_loops_tree(shape, tiny_model, monkeypatch):
    """EagleDrafter.greedy_tree (every level at fixed shapes, masks and reranking on the device, run
    uncaptured here) drafts draft_tree's tree node for node, and counts one head pass a level."""
    from specbench.drafters import head_graphs

    monkeypatch.setattr(head_graphs, "CAPACITY_STEP", 16)  # the cache grows mid-run: the levels re-built
    depth, branch, frontier, nodes = shape
    weights = tiny_model("tiny-llama", 2, vocab_size=24, init_std=0.3).double()
    prompt = torch.tensor([3, 4, 5, 2, 7, 9, 1])
    vocab = torch.tensor([0, 1, 2, 3, 5, 7, 8, 9, 11, 13, 17, 19, 23])  # a draft vocabulary
    trees = {}
    real = tree_speculative.draft_tree
    for step_graph in (False, True):
        drawn = trees[step_graph] = []

        def recording(*args, drawn=drawn, **kwargs):
            tree = real(*args, **(kwargs | {"stop_early": False}))
            drawn.append((tree.tokens.tolist(), tree.parents))
            return tree

        monkeypatch.setattr(tree_speculative, "draft_tree", recording)
        target = HFModel(weights, "t")
        drafter = random_head(target, 2, vocab, static=True, step_graph=step_graph)
        out = tree_speculative.generate(
            target,
            drafter,
            prompt,
            depth=depth,
            branch=branch,
            frontier=frontier,
            nodes=nodes,
            max_new_tokens=24,
        )
        drawn.append(out)
    host, graphed = trees[False].pop(), trees[True].pop()
    assert trees[True] == trees[False]
    assert max(len(parents) for _, parents in trees[True]) == min(nodes, len(trees[True][1][1]))
    assert graphed.tokens == host.tokens and graphed.steps == host.steps
    timed = ("seconds", "prefill_seconds")
    without_time = [{k: v for k, v in out.forwards["t"].items() if k not in timed} for out in (graphed, host)]
    assert without_time[0] == without_time[1]
    # the host loop runs the levels it needs; the graph every one: a root pass and depth - 1 levels,
    # depth being the step's budget (shorter at the end)
    made = [sum(a + 1 for _, a in graphed.steps[:i]) for i in range(1, len(graphed.steps))]
    budgets = [min(depth, 24 - n - 1) for n in made]
    assert graphed.forwards["head"]["forward_passes"] == sum(budgets)
    assert graphed.forwards["head"]["forward_passes"] >= host.forwards["head"]["forward_passes"]
    assert drafter._levels  # the levels ran as one unit


def test_the_device_side_reranking_keeps_every_ancestor_of_a_kept_node():
    #            0     1  2  3  4  5  6
    parents = torch.tensor([-1, -1, 0, 0, 2, 4, 1])
    kept = torch.tensor([False, False, False, False, False, True, False])  # a tie kept node 5 alone
    assert eagle.with_ancestors(kept, parents, 4).tolist() == [True, False, True, False, True, True, False]
    assert eagle.with_ancestors(kept, parents, 3).tolist() == [False, False, True, False, True, True, False]


@pytest.mark.parametrize("engine", ["eager", "compiled"])
def test_a_step_graph_heads_greedy_output_is_the_target_greedy_output(engine, tiny_model):
    weights = tiny_model("tiny-llama", 3, vocab_size=16, init_std=0.3)
    prompt = torch.tensor([3, 4, 5, 2, 9, 1])
    ar = autoregressive.generate(HFModel(weights, "t"), prompt, max_new_tokens=30)
    target = HFModel(weights, "t") if engine == "eager" else CompiledHFModel(weights, "t", quick=True)
    if engine == "compiled":
        target.prepare(64, hidden=True, tree_sizes=(10,))
    drafter = random_head(HFModel(weights, "t"), 3, static=True, step_graph=True)
    out = tree_speculative.generate(
        target, drafter, prompt, depth=4, branch=3, frontier=2, nodes=10, max_new_tokens=30
    )
    assert out.tokens == ar.tokens
    assert any(accepted > 0 for _, accepted in out.steps)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_drafting_level_dispatches_as_many_operations_whatever_its_width(temperature, tiny_model):
    """On a GPU every dispatched operation is a kernel launch, and a step of a small model is bound by
    them: a tree level (the head's pass, its mask, the children's probabilities and ranks) must cost a
    fixed number of operations, not a few per node."""
    weights = tiny_model("tiny-llama", 3, vocab_size=64, init_std=0.3)
    sampling = SamplingParams(temperature=temperature)
    counts = []
    for branch in (2, 4):
        target = HFModel(weights, "t")
        drafter = random_head(HFModel(weights, "t"), 3)
        prompt = torch.tensor([3, 4, 5, 2, 9, 1])
        target.start(prompt)
        drafter.start(prompt)
        empty = TokenTree(prompt[:0], ())
        last, path, token = tree_speculative.verify(
            target, prompt[:0], empty, sampling, None, drafter.target_layers, drafter.fed_hidden
        )
        accepted = tree_speculative.accepted_rows(last, empty, path)
        with OpCount() as counted:
            tree = tree_speculative.draft_tree(
                drafter,
                torch.tensor([token]),
                last,
                accepted,
                depth=4,
                branch=branch,
                frontier=2,
                nodes=100,
                sampling=sampling,
                generator=torch.Generator().manual_seed(0),
            )
        assert len(tree) == branch + 3 * 2 * branch
        counts.append(counted.total)
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("fused", [(), (0,)])  # the 1-layer target: its embeddings
def test_eagle_sampling_reproduces_the_target_joint(fused, tiny_model):
    weights = tiny_model("tiny-llama", 1, **TINY_OPTIONS)
    prompt = torch.tensor([3, 4, 5, 2])
    reference = exact_joint(weights, prompt, 3, softmax_at(1.0))
    target = HFModel(weights, "t")
    drafter = random_head(target, 5, fused=fused)
    generator = torch.Generator().manual_seed(12)
    counts, steps = np.zeros_like(reference), Counter()
    for _ in range(1500):
        out = tree_speculative.generate(
            target, drafter, prompt, depth=2, branch=2, frontier=2, nodes=64, max_new_tokens=3,
            sampling=SamplingParams(temperature=1.0), generator=generator,
        )  # fmt: skip
        counts[tuple(out.tokens)] += 1
        steps.update(out.steps)
    assert_matches(counts, reference, "eagle sampling")
    assert steps[(1, 1)] > 0 and steps[(1, 0)] > 0, steps


@pytest.mark.parametrize("size, unroll", [("eagle", None), ("eagle", 3), ("eagle3", None)])
def test_training_lifts_the_heads_agreement_on_held_out_text(size, unroll, tiny_model, tmp_path):
    """A target that continues a cycle: the head learns its next token from features and tokens, at
    every unrolled step of the training-time test (2 by default, ``unroll`` when given); an eagle3
    head from its fusion of the target's layers, on the token loss alone."""
    weights = tiny_model("tiny-llama", 4, vocab_size=300, init_std=0.3)
    target = HFModel(weights, "t")
    cycle = torch.tensor([10, 20, 30, 40, 50, 60, 70])
    sequences = []
    for i in range(24):
        ids = torch.cat([torch.tensor([5 + i % 3]), cycle.roll(-(i % 7)).repeat(3)])
        sequences.append(Sequence(ids, 1, torch.zeros(0, 1), torch.zeros(0, 1)))
    config = StudentConfig(size, epochs=300.0, lr=1e-2, batch_tokens=256, unroll=unroll)
    vocab = torch.arange(300)
    with Progress(disable=True) as progress:
        head, record = train_head(
            target, sequences[:20], sequences[20:], config, vocab, progress, tmp_path / "f"
        )
    before, after = record["held_out_accuracy_before"], record["held_out_accuracy_after"]
    assert record["unroll"] == len(after) == len(before) == (unroll or 2)
    assert min(after) > 0.6 and after[0] > before[0] + 0.4, (before, after)
    assert record["curve"][-1]["loss"] < record["curve"][0]["loss"]
    kept = "f-layers0.1" if size == "eagle3" else "f"  # tiny-llama's 2 layers: EAGLE-3's 3 fall on 0, 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{kept}-held-4.pt", f"{kept}-train-20.pt"]
    if size == "eagle3":
        hidden = weights.config.hidden_size
        assert head.fused_layers == (0, 1) and head.fuse.weight.shape == (hidden, 2 * hidden)
        assert record["fused_layers"] == [0, 1] and record["feature_regression"] is False
        assert head.fusion_norm is not None and record["fusion_norm"] is True
        assert record["trainer_revision"] == 2  # part of the training digest: runs of unnormed heads go stale
        # the 2 layers, then the last
        assert torch.load(tmp_path / "f-layers0.1-held-4.pt")[0].shape[1:] == (3, hidden)
    else:
        assert head.fuse is None and "fused_layers" not in record


def test_a_deeper_training_time_test_is_an_eagle_option_saved_apart():
    from specbench.training import distill

    deeper = distill.student_config("eagle", unroll=3)
    assert deeper.name == "eagle-unroll3" and deeper.manifest()["unroll"] == 3
    default = distill.student_config("eagle")
    # heads trained before the option keep their identity: an unset unroll is not recorded
    assert default.name == "eagle" and "unroll" not in default.manifest()
    assert distill.student_config("eagle3", unroll=3).name == "eagle3-unroll3"
    with pytest.raises(SpecbenchError, match="--unroll"):
        distill.student_config("small", unroll=3)


def test_a_longer_training_sequence_is_a_head_option_saved_apart():
    from specbench.training import distill

    longer = distill.student_config("eagle", max_sequence=1024)
    assert longer.name == "eagle-seq1024" and longer.manifest()["max_sequence"] == 1024
    # heads trained before the option keep their identity: an unset max_sequence is not recorded
    assert "max_sequence" not in distill.student_config("eagle3").manifest()
    both = distill.student_config("eagle3", unroll=3, max_sequence=1024)
    assert both.name == "eagle3-unroll3-seq1024"
    assert distill.student_config("medusa", max_sequence=1024).name == "medusa-seq1024"
    with pytest.raises(SpecbenchError, match="--max-sequence"):
        distill.student_config("small", max_sequence=1024)


@pytest.mark.parametrize("longest, kept", [(None, 12), (25, 6)])
def test_the_head_trains_on_sequences_up_to_max_sequence(longest, kept, tiny_model, tmp_path):
    """Sequences past ``max_sequence`` tokens (512 unless given) are left out of training and of the
    held-out score, and the record says which limit applied."""
    target = HFModel(tiny_model("tiny-llama", 0, vocab_size=300), "t")
    sequences = [
        Sequence(torch.arange(10, 10 + (22 if i % 2 else 29)), 1, torch.zeros(0, 1), torch.zeros(0, 1))
        for i in range(16)
    ]
    config = StudentConfig("eagle", epochs=1.0, lr=1e-3, batch_tokens=256, max_sequence=longest)
    with Progress(disable=True) as progress:
        _, record = train_head(
            target, sequences[:12], sequences[12:], config, torch.arange(300), progress, tmp_path / "f"
        )
    assert record["sequences"] == kept and record["max_sequence"] == (longest or 512)
    held = 4 if longest is None else 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"f-held-{held}.pt", f"f-train-{kept}.pt"]


def test_the_vllm_export_holds_the_heads_weights_under_vllms_names(tmp_path, tiny_model):
    """vLLM's EagleLlamaForCausalLM: ``fc`` (no bias) and ``layers.0`` without an input norm, the
    target's embedding and LM head shared; loading the exported tensors back gives the same head."""
    from safetensors.torch import load_file

    weights = tiny_model("tiny-llama", 0, vocab_size=300)
    target = HFModel(weights, "t")
    drafter = random_head(target, 1)
    eagle.save_vllm(tmp_path, drafter.head, weights)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["EagleLlamaForCausalLM"] and config["num_hidden_layers"] == 1
    assert config["hidden_size"] == weights.config.hidden_size
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert "fc.weight" in tensors and "fc.bias" not in tensors
    assert not any("input_layernorm" in k or "embed" in k or "lm_head" in k for k in tensors)
    assert "layers.0.self_attn.q_proj.weight" in tensors and "layers.0.mlp.down_proj.weight" in tensors
    fresh = eagle.EagleHead.for_target(weights)
    state = {k.removeprefix("layers.0."): v for k, v in tensors.items() if k.startswith("layers.0.")}
    fresh.layer.load_state_dict(state)
    fresh.fc.load_state_dict({"weight": tensors["fc.weight"]})
    x = torch.randn(1, 4, weights.config.hidden_size)
    args = (x, x, torch.arange(4)[None], eagle.causal_mask(0, 4, "cpu"))
    torch.testing.assert_close(fresh.to(torch.float32)(*args), drafter.head.float()(*args))


def write_head(
    cache, target_weights, source: str = "tiny-llama", fused: tuple = (), norm: bool = False, **manifest
):
    head = eagle.EagleHead.for_target(target_weights, fused, fusion_norm=norm)
    if head.fusion_norm is not None:
        nn.init.uniform_(head.fusion_norm.weight, 0.5, 1.5)
    config = target_weights.config
    fields = {"hidden_size": config.hidden_size, "vocab_size": config.vocab_size}
    fields |= {"fused_layers": list(fused)} if fused else {}
    fields |= {"fusion_norm": True} if norm else {}
    fields |= {"num_hidden_layers": config.num_hidden_layers, "draft_vocab": None}
    fields["parameters"] = sum(p.numel() for p in head.parameters())
    eagle.save(cache / "drafters" / source / "eagle", head, fields | manifest)
    return head


def cached_head(tmp_path, monkeypatch):
    """A float64 tiny target (vocabulary 300) and a random EAGLE head for it in a fresh specbench cache."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    target = sources.load(
        sources.ModelRequest("target", "tiny-llama", "float64", "cpu", options=(("vocab_size", 300),))
    )
    write_head(tmp_path / "cache", target.model)
    return target


def recipe(method: str = "eagle", drafter: str = "head", engine: str = "eager") -> dict:
    return tiny_recipes.recipe(
        "eagle",
        {
            "target": tiny_recipes.tiny(vocab_size=300),
            "head": {"source": "eagle:tiny-llama/eagle", "options": {"of": "target"}},
            "medusa": {"source": "medusa:tiny-llama/medusa", "options": {"of": "target"}},
        },
        [
            tiny_recipes.ar(),
            {"name": "e", "method": method, "target": "target", "drafter": drafter, "params": {"depth": 3}},
        ],
        max_new_tokens=10,
        engine=engine,
    )


def run(tmp_path, data: dict, out: str = "out"):
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(data))
    return CliRunner().invoke(app, ["run", str(path), "--output-dir", str(tmp_path / out)])


@pytest.mark.parametrize("engine", ["eager", "compiled"])
def test_an_eagle_recipe_runs_lossless(tmp_path, monkeypatch, tiny_model, engine):
    cached_head(tmp_path, monkeypatch)
    data = recipe(engine=engine)
    data["models"].pop("medusa")
    result = run(tmp_path, data)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    eagle_rows = [row for row in rows if row["method"] == "eagle"]
    assert eagle_rows and all(row["divergence_class"] == "identical" for row in eagle_rows)
    # the head is recorded where it ran: on its target's device, in its target's dtype
    recorded = json.loads((tmp_path / "out" / "environment.json").read_text())["models"]
    assert recorded["head"]["dtype"] == recorded["target"]["dtype"] == "torch.float64"
    assert recorded["head"]["device"] == recorded["target"]["device"]
    resumed = CliRunner().invoke(
        app, ["run", str(tmp_path / "out.yaml"), "--output-dir", str(tmp_path / "out"), "--resume"]
    )
    assert resumed.exit_code == 0, resumed.output  # the head's recorded dtype does not refuse it
    if engine == "compiled":
        assert eagle_rows[0]["compile_s"] > 0 and all(row["compile_s"] == 0 for row in eagle_rows[1:])


def test_an_eagle3_head_loads_with_its_fusion_runs_lossless_and_no_engine_takes_it(
    tmp_path, monkeypatch, tiny_model
):
    target = cached_head(tmp_path, monkeypatch)
    request = sources.ModelRequest("head", "eagle:tiny-llama/eagle", options=(("of", "target"),))
    # a head trained before the fusion norm existed: its manifest names none, and it loads without
    write_head(tmp_path / "cache", target.model, fused=(0, 1))
    assert sources.load(request, {"target": target}.__getitem__).head.fusion_norm is None
    saved = write_head(tmp_path / "cache", target.model, fused=(0, 1), norm=True)
    drafter = sources.load(request, {"target": target}.__getitem__)
    assert drafter.target_layers == (0, 1)
    torch.testing.assert_close(drafter.head.fuse.weight, saved.fuse.weight.to(torch.float64))
    torch.testing.assert_close(drafter.head.fusion_norm.weight, saved.fusion_norm.weight.to(torch.float64))
    data = recipe()
    data["models"].pop("medusa")
    result = run(tmp_path, data)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    assert all(row["divergence_class"] == "identical" for row in rows if row["method"] == "e")
    folder = tmp_path / "cache" / "drafters" / "tiny-llama" / "eagle"
    with pytest.raises(SpecbenchError, match=r"models\.h\.source: .*fuses the target's layers \[0, 1\]"):
        eagle.HeadForEngine("h", folder)
    with pytest.raises(ValueError, match="no vLLM eagle layout"):
        eagle.save_vllm(tmp_path / "vllm", saved, target.model)


def test_distill_trains_an_eagle3_head_that_a_recipe_runs_lossless(tmp_path, monkeypatch):
    from test_distill import _data_dir

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    args = ["distill", "--target", "tiny-llama", "--data-dir", str(_data_dir(tmp_path / "data"))]
    args += ["--size", "eagle3", "--generate", "6", "--teacher-forced", "6", "--max-new-tokens", "6"]
    result = CliRunner().invoke(app, [*args, "--top-k", "8", "--epochs", "1"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "cache" / "drafters" / "tiny-llama" / "eagle3"
    manifest = json.loads((folder / eagle.MANIFEST).read_text())
    assert manifest["fused_layers"] == [0, 1] and manifest["feature_regression"] is False
    assert manifest["fusion_norm"] is True
    assert not (folder / "vllm").exists()  # no vLLM layout carries the fusion
    data = recipe()
    data["models"].pop("medusa")
    data["models"]["target"] = {"source": "tiny-llama", "dtype": "float64"}
    data["models"]["head"]["source"] = "eagle:tiny-llama/eagle3"
    result = run(tmp_path, data)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    assert all(row["divergence_class"] == "identical" for row in rows if row["method"] == "e")


def test_heads_of_the_wrong_kind_or_target_are_refused_before_the_first_row(
    tmp_path, monkeypatch, tiny_model
):
    target = cached_head(tmp_path, monkeypatch)
    from test_medusa import write_heads

    write_heads(tmp_path / "cache", "tiny-llama", 32, 300)
    bad = {
        "medusa heads to eagle": (recipe(drafter="medusa"), "use a eagle:<target>/<name> source"),
        "eagle head to medusa": (recipe(method="medusa"), "use a medusa:<target>/<name> source"),
        "eagle head to speculative": (recipe(method="speculative"), "use method eagle for these heads"),
    }
    for data, _ in bad.values():
        unused = "head" if data["methods"][1]["drafter"] == "medusa" else "medusa"
        data["models"].pop(unused)
    for label, (data, fix) in bad.items():
        result = run(tmp_path, data, "bad")
        assert result.exit_code == 2 and fix in result.output and "\n" not in result.output.strip(), label
    request = sources.ModelRequest("head", "eagle:tiny-llama/eagle", options=(("of", "target"),))
    for field, value in (("hidden_size", 64), ("vocab_size", 100), ("num_hidden_layers", 7)):
        write_head(tmp_path / "cache", target.model, **{field: value})
        with pytest.raises(SpecbenchError, match=rf"models\.head\.options\.of: .*{field} of {value}.*has"):
            sources.load(request, {"target": target}.__getitem__)
    missing = sources.ModelRequest("head", "eagle:tiny-llama/other", options=(("of", "target"),))
    with pytest.raises(SpecbenchError, match=r"no EAGLE head .* `specbench distill --size eagle`"):
        sources.load(missing, {"target": target}.__getitem__)


def test_plan_prices_an_eagle_cell_with_its_heads_own_size(tmp_path, monkeypatch, tiny_model):
    target = cached_head(tmp_path, monkeypatch)
    data = recipe()
    data["models"].pop("medusa")
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["plan", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    cell = next(cell for cell in plan["cells"] if cell["method"] == "eagle")
    assert "lower bound" in cell["rule"] and "depth passes" in cell["rule"]
    head = next(m for m in plan["models"] if m["name"] == "head")
    own = sum(p.numel() for p in eagle.EagleHead.for_target(target.model).parameters())
    assert head["params"] == own and head["shares"] == "target"
    # a head's pass reads its own weights and the target's LM head rows, not the target's pass
    base = next(m for m in plan["models"] if m["name"] == "target")
    config = target.model.config
    read = (own + config.vocab_size * config.hidden_size) * DTYPE_BYTES[base["dtype"]]
    assert head["pass_ms"] == pytest.approx(base["pass_ms"] * read / base["weight_bytes"])
    assert head["pass_ms_source"].endswith(f"{read / 2**20:.1f}/{base['weight_bytes'] / 2**20:.1f} MiB read")


def test_the_cuda_graphs_option_reaches_the_head_and_takes_only_true_or_false(
    tmp_path, monkeypatch, tiny_model
):
    target = cached_head(tmp_path, monkeypatch)
    loaded = {}
    real = eagle.load

    def spy(*args, **kwargs):
        drafter = real(*args, **kwargs)
        loaded[kwargs.get("cuda_graphs", "default")] = drafter.static
        return drafter

    monkeypatch.setattr(eagle, "load", spy)
    for value in (False, None):
        options = (("of", "target"),) + ((("cuda_graphs", value),) if value is not None else ())
        sources.load(
            sources.ModelRequest("head", "eagle:tiny-llama/eagle", options=options), {"target": target}.get
        )
    assert loaded == {False: False, "default": False}  # on a CPU the default runs the growing cache too
    data = recipe()
    data["models"].pop("medusa")
    data["models"]["head"]["options"]["cuda_graphs"] = "yes"
    result = run(tmp_path, data, "bad")
    assert result.exit_code == 2 and "cuda_graphs 'yes' is not true or false" in result.output


@pytest.mark.parametrize("nodes", [3, 6, 12])
def test_a_greedy_tree_stops_drafting_once_no_deeper_node_can_be_kept(nodes, tiny_model, monkeypatch):
    """The early stop (no deeper node can outrank the ``nodes`` kept: path probabilities only fall)
    drafts the very tree of drafting every level, with fewer head passes."""
    weights = tiny_model("tiny-llama", 3, vocab_size=64, init_std=0.3)
    prompt = torch.tensor([3, 4, 5, 2, 9, 1])
    drafting = tree_speculative.draft_tree
    runs = {}
    for stop_early in (False, True):
        trees = []

        def draft(*args, stop_early=stop_early, trees=trees, **kwargs):
            trees.append(drafting(*args, stop_early=stop_early, **kwargs))
            return trees[-1]

        monkeypatch.setattr(tree_speculative, "draft_tree", draft)
        drafter = random_head(HFModel(weights, "t"), 5)
        out = tree_speculative.generate(
            HFModel(weights, "t"),
            drafter,
            prompt,
            depth=6,
            branch=3,
            frontier=2,
            nodes=nodes,
            max_new_tokens=40,
        )
        runs[stop_early] = (out.forwards["head"]["forward_passes"], trees, out.tokens)
    (full, reference, tokens), (pruned, stopped, same) = runs[False], runs[True]
    assert len(reference) == len(stopped) > 5 and tokens == same
    for a, b in zip(reference, stopped, strict=True):
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents == b.parents
    assert pruned < full, (pruned, full)  # an untrained head's trees settle early: 71 / 201 passes at 3 nodes


def test_the_static_passes_compute_the_same_under_either_attention_implementation(tiny_model):
    """The static mask is additive: transformers' eager attention adds the mask it is given (a boolean
    one would add 0 or 1), SDPA takes either."""
    from specbench.drafters import head_graphs

    weights = tiny_model("tiny-llama", 2, vocab_size=12, init_std=0.3).double()
    features = torch.randn(
        3, weights.config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    seen = torch.ones(3, 3, dtype=torch.bool).tril()
    seen[2, 0] = False  # a row that must not see an earlier slot
    outs = []
    for attention in ("sdpa", "eager"):
        drafter = random_head(HFModel(weights, "t"), 2)
        passes = head_graphs.StaticHeadPasses(
            drafter.head, drafter.embeddings, drafter.lm_head, graphs=True, attention=attention
        )
        with torch.inference_mode():
            outs.append(passes.run(torch.tensor([1, 2, 3]), features, torch.arange(3), seen, 0))
    # transformers' eager attention takes its softmax in float32
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("static", [False, True])
def test_a_head_on_eager_attention_drafts_what_it_drafts_on_sdpa(static, tiny_model):
    """transformers' eager attention adds the mask it is given: the growing cache's boolean mask is made
    additive for it (a boolean one would add 0 or 1 and draft other trees)."""
    weights = tiny_model("tiny-llama", 2, vocab_size=12, init_std=0.3).double()
    prompt = torch.tensor([3, 4, 5, 2, 7])
    runs = {}
    for attention in ("sdpa", "eager"):
        drafter = Recording(random_head(HFModel(weights, "t"), 2, static=static, attention=attention))
        out = tree_speculative.generate(
            HFModel(weights, "t"), drafter, prompt, depth=3, branch=2, frontier=2, nodes=6, max_new_tokens=14
        )
        assert drafter.inner.head.layer.self_attn.config._attn_implementation == attention
        runs[attention] = (out, drafter.calls)
    (sdpa, sdpa_calls), (eager, eager_calls) = runs["sdpa"], runs["eager"]
    assert eager.tokens == sdpa.tokens and eager.steps == sdpa.steps
    assert len(eager_calls) == len(sdpa_calls) > 4
    for (kind, _, mine), (_, _, theirs) in zip(eager_calls, sdpa_calls, strict=True):
        mine, theirs = (mine, theirs) if kind == "root" else (mine[2], theirs[2])
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)  # eager's softmax is float32


def test_the_attention_option_reaches_the_head_and_takes_only_sdpa_or_eager(tmp_path, monkeypatch):
    target = cached_head(tmp_path, monkeypatch)
    options = (("of", "target"), ("attn_implementation", "eager"))
    drafter = sources.load(
        sources.ModelRequest("head", "eagle:tiny-llama/eagle", options=options), {"target": target}.get
    )
    assert drafter.attention == "eager" == drafter.head.layer.self_attn.config._attn_implementation
    data = recipe()
    data["models"].pop("medusa")
    data["models"]["head"]["options"]["attn_implementation"] = "flash_attention_2"
    result = run(tmp_path, data, "bad")
    assert result.exit_code == 2
    assert "attn_implementation" in result.output and "sdpa or eager" in result.output


def test_the_step_graph_option_reaches_the_head_and_needs_its_static_passes(tmp_path, monkeypatch):
    target = cached_head(tmp_path, monkeypatch)
    resolve = {"target": target}.get
    plain = sources.load(
        sources.ModelRequest("head", "eagle:tiny-llama/eagle", options=(("of", "target"),)), resolve
    )
    assert not plain.step_graph and plain._passes is None  # a CPU: the growing cache, the host loop
    options = (("of", "target"), ("step_graph", True))
    drafter = sources.load(sources.ModelRequest("head", "eagle:tiny-llama/eagle", options=options), resolve)
    assert drafter.step_graph and drafter._passes is not None  # the fixed shapes, uncaptured on a CPU
    data = recipe()
    data["models"].pop("medusa")
    data["models"]["head"]["options"] |= {"step_graph": True, "cuda_graphs": False}
    result = run(tmp_path, data, "bad")
    assert result.exit_code == 2
    assert "step_graph" in result.output and "cuda_graphs: false" in result.output


class FullRows:
    """The drafter as one without a draft vocabulary: every row scattered over the full vocabulary."""

    def __init__(self, drafter: eagle.EagleDrafter):
        self.inner = drafter

    def __getattr__(self, name):
        if name == "vocabulary":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def root(self, tokens, last, accepted):
        logits = self.inner.root(tokens, last, accepted)
        return (
            None if logits is None else full_vocabulary(logits, self.inner.vocabulary, self.inner.vocab_size)
        )

    def level(self, tokens, level, tree, expand):
        logits = self.inner.level(tokens, level, tree, expand)
        return full_vocabulary(logits, self.inner.vocabulary, self.inner.vocab_size)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_head_scoring_its_draft_vocabulary_drafts_the_trees_of_full_rows(
    temperature, tiny_model, monkeypatch
):
    """Root and level return the draft vocabulary's logits only: a greedy tree ranks them as they are
    (mapped back to token ids), a sampled one draws from full rows; both draft what full rows would."""
    weights = tiny_model("tiny-llama", 3, vocab_size=64, init_std=0.3).double()
    vocab = torch.tensor([1, 2, 3, 5, 8, 13, 21, 34, 40, 41, 42, 55, 60])
    prompt = torch.tensor([3, 4, 5, 2, 9, 1])
    drafting = tree_speculative.draft_tree
    runs = []
    for wrap in (lambda d: d, FullRows):
        trees = []

        def draft(*args, trees=trees, **kwargs):
            trees.append(drafting(*args, **kwargs))
            return trees[-1]

        monkeypatch.setattr(tree_speculative, "draft_tree", draft)
        out = tree_speculative.generate(
            HFModel(weights, "t"), wrap(random_head(HFModel(weights, "t"), 5, vocab)), prompt,
            depth=4, branch=3, frontier=2, nodes=64 if temperature else 6, max_new_tokens=30,
            sampling=SamplingParams(temperature=temperature), generator=torch.Generator().manual_seed(3),
        )  # fmt: skip
        runs.append((trees, out.tokens))
    (compact, tokens), (full, same) = runs
    assert len(compact) == len(full) > 5 and tokens == same
    for a, b in zip(compact, full, strict=True):
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents == b.parents
        assert set(a.tokens.tolist()) <= set(vocab.tolist())
        if temperature and len(a):  # the first step's tree is empty (no features yet)
            assert torch.equal(a.q, b.q) and a.q.shape[-1] == 64
