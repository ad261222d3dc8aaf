"""EAGLE-3's own layer trained with its training-time test (specbench.training.eagle3): the attention
mask of each unrolled step is the paper's, each step computes what drafting computes at inference, one
step is plain teacher-forced training, the loss falls on a tiny dataset in float64, and the trained head
loads through ``eagle3:`` (by path and by its name in the cache) and runs lossless in the chain and tree
loops."""

from __future__ import annotations

import copy
import json

import pytest
import tiny_recipes
import torch
import yaml
from rich.progress import Progress
from transformers import DynamicCache
from typer.testing import CliRunner

from specbench import sources
from specbench.cli import app
from specbench.decoding import autoregressive, tree_speculative
from specbench.drafters.eagle import causal_mask
from specbench.models.hf import HFModel
from specbench.training import distill
from specbench.training.distill import StudentConfig
from specbench.training.eagle3 import (
    StepKeys,
    batch_loss,
    new_head,
    save,
    train_layer,
    ttt_mask,
    unroll,
)
from specbench.training.teacher import Sequence

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = 8  # the head reads the inputs of layers 2, 4 and 5
AUX = (2, 4, 5)
VOCAB = 64


def target_and_head(tiny_model, vocab=None, vocab_size: int = VOCAB):
    weights = tiny_model("tiny-llama", 3, vocab_size=vocab_size, init_std=0.3, layers=LAYERS)
    target = HFModel(weights, "t")
    torch.manual_seed(0)
    ids = torch.arange(vocab_size) if vocab is None else vocab
    head, _ = new_head(target, AUX, ids, torch.float64)
    return target, head


def states(target, ids: torch.Tensor):
    """(aux states concatenated [1, L, 3H], final states [1, L, H]) of the target on ``ids`` [1, L]."""
    with torch.no_grad():
        out = target.model.base_model(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in AUX], dim=-1), out.last_hidden_state


IDS = torch.tensor([[3, 4, 5, 2, 9, 1, 7, 8, 6, 10, 11, 12, 13, 14]])


def test_each_steps_mask_is_the_prefix_and_the_querys_own_drafted_positions():
    """Step 2's query at row t (standing for position t + 1) sees step 1's rows 0..t (the target's
    states of the prefix) and its own row, never step 1's row t + 1 (the target's state there)."""
    assert ttt_mask(3, 0).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert ttt_mask(3, 1).int().tolist() == [
        [1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1],
    ]
    assert ttt_mask(3, 2).int().tolist() == [
        [1, 0, 0, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 0, 0, 1],
    ]


def test_an_unrolled_step_computes_what_drafting_computes_and_never_reads_the_targets_next_state(
    tiny_model,
):
    target, head = target_and_head(tiny_model)
    steps, width = 3, IDS.shape[1] - 3
    reads, _ = states(target, IDS)
    embed = target.model.get_input_embeddings().weight
    with torch.no_grad():
        outs = unroll(head, embed, IDS, reads[:, :width], steps)
        # drafting at inference (EagleDrafter): the committed pairs 0..t read with a causal mask, then
        # each drafted token fed the previous output, seeing every committed pair and its ancestors
        t = 6
        cache = DynamicCache()
        committed = head(
            embed[IDS[:, 1 : t + 2]],
            head.read(reads[:, : t + 1]),
            torch.arange(t + 1)[None],
            causal_mask(0, t + 1, "cpu"),
            cache,
        )
        torch.testing.assert_close(committed, outs[0][:, : t + 1], rtol=1e-10, atol=1e-10)
        feature = committed[:, t:]
        for step in range(1, steps):
            seen = torch.ones(1, 1, 1, t + 1 + step, dtype=torch.bool)
            token = IDS[:, t + 1 + step : t + 2 + step]
            feature = head(embed[token], feature, torch.tensor([[t + step]]), seen, cache)
            torch.testing.assert_close(feature[:, 0], outs[step][:, t], rtol=1e-10, atol=1e-10)
        # the target's states after row t change: no step of rows 0..t moves, row t + 1 of step 1 does
        changed = reads.clone()
        changed[:, t + 1 :] += torch.randn(changed[:, t + 1 :].shape, dtype=changed.dtype)
        moved = unroll(head, embed, IDS, changed[:, :width], steps)
    for step in range(steps):
        torch.testing.assert_close(moved[step][:, : t + 1], outs[step][:, : t + 1], rtol=0, atol=1e-12)
    assert not torch.allclose(moved[0][:, t + 1], outs[0][:, t + 1])


def test_one_step_is_plain_teacher_forced_training_on_the_targets_states(tiny_model):
    vocab = torch.arange(0, VOCAB, 2)  # the odd tokens are no draft tokens: their positions leave the loss
    target, head = target_and_head(tiny_model, vocab)
    width = IDS.shape[1] - 2
    reads, finals = states(target, IDS)
    embed = target.model.get_input_embeddings().weight
    weight = target.model.get_output_embeddings().weight.detach()
    labels = (finals[0] @ weight.T).argmax(-1)
    labels[:3] = -1  # the prompt
    labels = torch.cat([labels, torch.full((1,), -1)])[None]
    padded = torch.cat([finals, torch.zeros(1, 1, finals.shape[2], dtype=finals.dtype)], dim=1)
    batch = (torch.cat([IDS, torch.zeros(1, 1, dtype=torch.long)], 1), reads[:, :width], padded, labels)
    total, losses, hits, counts = batch_loss(head, embed, weight[vocab], batch, 1)
    plain = head(
        embed[IDS[:, 1 : width + 1]],
        head.read(reads[:, :width]),
        torch.arange(width)[None],
        causal_mask(0, width, "cpu"),
    )
    torch.testing.assert_close(unroll(head, embed, batch[0], batch[1], 1)[0], plain, rtol=0, atol=0)
    wanted = labels[0, 1 : width + 1]
    kept = (wanted >= 0) & (wanted % 2 == 0)
    assert 0 < int(kept.sum()) < int((wanted >= 0).sum())
    p = torch.softmax(finals[0, 1 : width + 1][kept] @ weight[vocab].T, dim=-1)
    expected = -(p * torch.log_softmax(head.subset(plain[0][kept]), dim=-1)).sum(-1).mean()
    torch.testing.assert_close(total, expected, rtol=1e-12, atol=1e-12)
    assert len(losses) == 1 and counts == [int((wanted >= 0).sum())]
    guesses = vocab[head.subset(plain[0][wanted >= 0]).argmax(-1)]
    assert hits == [float((guesses == wanted[wanted >= 0]).sum())]


def cyclic_sequences(count: int) -> list[Sequence]:
    cycle = torch.tensor([10, 20, 30, 40, 50, 60, 70])
    out = []
    for i in range(count):
        ids = torch.cat([torch.tensor([5 + i % 3]), cycle.roll(-(i % 7)).repeat(3)])
        out.append(Sequence(ids, 2, torch.zeros(0, 1), torch.zeros(0, 1)))
    return out


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """A head trained with 3 unrolled steps on a target that continues a cycle (float64)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    weights = tiny_model("tiny-llama", 4, vocab_size=300, init_std=0.3, layers=LAYERS)
    target = HFModel(weights, "t")
    sequences = cyclic_sequences(24)
    config = StudentConfig("eagle3-layer", epochs=120.0, lr=1e-2, batch_tokens=256, unroll=3)
    vocab = torch.arange(1, 300)  # every token but the padding: d2t is 1 throughout
    features = tmp_path_factory.mktemp("features") / "f"
    with Progress(disable=True) as progress:
        head, fields, record = train_layer(
            target, sequences[:20], sequences[20:], config, vocab, progress, features
        )
    torch.set_num_threads(threads)
    return weights, head, fields, record, features.parent


def test_the_training_time_tests_loss_falls_and_every_step_learns(trained):
    _, head, _, record, kept = trained
    before, after = record["held_out_accuracy_before"], record["held_out_accuracy_after"]
    assert record["unroll"] == len(before) == len(after) == 3
    assert record["aux_layer_ids"] == list(AUX) and record["step_weight"] == 0.8
    # the target's next-token distributions are nearly flat (entropy ~4.7 nats, the loss's floor), so
    # its argmax is a fine margin: 0 -> 0.41, 0.45, 0.43 here
    assert all(a > b + 0.3 for a, b in zip(after, before, strict=True)), (before, after)
    first, last = record["curve"][0], record["curve"][-1]
    assert last["loss"] < 0.9 * first["loss"], (first, last)
    assert all(late < early for early, late in zip(first["step_losses"], last["step_losses"], strict=True))
    assert sorted(p.name for p in kept.iterdir()) == ["f-layers2.4.5-held-4.pt", "f-layers2.4.5-train-20.pt"]
    assert head.lm_head.weight.shape[0] == 299 and head.d2t.eq(1).all() and not head.t2d[0]


@pytest.mark.parametrize("shape", [(4, 1, 1, 4), (3, 2, 2, 6)])
def test_the_trained_head_loads_through_eagle3_and_is_lossless_in_the_chain_and_the_tree(
    trained, tmp_path, shape
):
    weights, head, fields, record, _ = trained
    folder = save(tmp_path / "head", head, fields, "tiny-llama", {"size": "eagle3-layer", **record})
    config = json.loads((folder / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [
        2,
        4,
        5,
    ]
    assert (
        config["norm_before_residual"] is False
        and config["transformer_layer_config"]["model_type"] == "llama"
    )
    assert (folder / "distill.json").is_file() and (folder / "training_curve.png").is_file()
    target = HFModel(weights, "target")
    request = sources.ModelRequest("head", f"eagle3:{folder}", options=(("of", "target"),))
    drafter = sources.load(request, {"target": target}.__getitem__)
    assert drafter.target_layers == AUX and drafter.checkpoint["layout"] == "speculators"
    as_saved = copy.deepcopy(head).float().state_dict()
    saved = {k: v.double() if v.is_floating_point() else v for k, v in as_saved.items()}
    for name, tensor in drafter.head.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    prompt = torch.tensor([6, 30, 40, 50, 60, 70, 10, 20])
    ar = autoregressive.generate(target, prompt, max_new_tokens=24)
    depth, branch, frontier, nodes = shape
    out = tree_speculative.generate(
        target, drafter, prompt, depth=depth, branch=branch, frontier=frontier, nodes=nodes, max_new_tokens=24
    )
    assert out.tokens == ar.tokens
    assert sum(accepted for _, accepted in out.steps) > 0, out.steps


def test_the_step_keys_concatenate_each_steps_keys():
    keys = StepKeys()
    first = keys.update(torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
    assert first[0].shape == (1, 2, 3, 4)
    both = keys.update(2 * torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), 0)
    assert both[0].shape == (1, 2, 6, 4) and both[0][0, 0, 3:].eq(2).all() and both[1][0, 0, :3].eq(0).all()


def test_unroll_is_the_training_time_test_option_and_names_the_head():
    assert distill.student_config("eagle3-layer").name == "eagle3-layer"
    deeper = distill.student_config("eagle3-layer", unroll=3)
    assert deeper.name == "eagle3-layer-unroll3" and deeper.manifest()["unroll"] == 3


def test_distill_trains_the_layer_that_eagle3_loads_by_name_and_runs_lossless(tmp_path, monkeypatch):
    from test_distill import _data_dir

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    args = ["distill", "--target", "tiny-llama", "--data-dir", str(_data_dir(tmp_path / "data"))]
    args += ["--size", "eagle3-layer", "--unroll", "2", "--generate", "6", "--teacher-forced", "6"]
    result = CliRunner().invoke(app, [*args, "--max-new-tokens", "6", "--top-k", "8", "--epochs", "1"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "cache" / "drafters" / "tiny-llama" / "eagle3-layer-unroll2"
    manifest = json.loads((folder / "distill.json").read_text())
    assert manifest["unroll"] == 2 and manifest["layout"] == "speculators"
    assert manifest["aux_layer_ids"] == [0, 1]  # tiny-llama's 2 layers: EAGLE-3's 3 fall on 0 and 1
    assert json.loads((folder / "config.json").read_text())["speculators_model_type"] == "eagle3"
    data = tiny_recipes.recipe(
        "trained-layer",
        {
            "target": {"source": "tiny-llama", "dtype": "float64"},
            "head": {"source": "eagle3:tiny-llama/eagle3-layer-unroll2", "options": {"of": "target"}},
        },
        [
            tiny_recipes.ar(),
            {"name": "e", "method": "eagle", "target": "target", "drafter": "head", "params": {"depth": 3}},
        ],
        max_new_tokens=10,
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(app, ["run", str(path), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    assert any(row["method"] == "eagle" for row in rows)
    assert all(row["divergence_class"] == "identical" for row in rows if row["method"] == "eagle")
