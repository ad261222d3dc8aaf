"""Distilled and early-exit drafters: the loss, weight sharing, training, caching, loading, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rich.progress import Progress
from typer.testing import CliRunner

from specbench import distill
from specbench.cli import app
from specbench.decoding import autoregressive, speculative
from specbench.errors import SpecbenchError
from specbench.models import registry
from specbench.models.base import ModelDrafter
from specbench.models.early_exit import ExitHead, early_exit_model
from specbench.models.hf import HFModel


def test_distill_loss_is_forward_kl_cross_entropy_on_top_k_and_tail():
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(5, 12, generator=gen, dtype=torch.float64) * 2
    student = torch.randn(5, 12, generator=gen, dtype=torch.float64)
    p, logq = teacher.softmax(-1), student.log_softmax(-1)
    # all 12 tokens kept: exactly the cross-entropy -sum p log q
    ids = teacher.argsort(-1, descending=True)
    loss, agree = distill.distill_loss(student, ids, p.gather(1, ids).log())
    assert loss.item() == pytest.approx(-(p * logq).sum(-1).mean().item(), rel=1e-6)
    assert agree.item() == pytest.approx((student.argmax(-1) == teacher.argmax(-1)).double().mean().item())
    # top 3 kept: the other 9 tokens are lumped into one tail outcome on both sides
    top = ids[:, :3]
    p_top, q_top = p.gather(1, top), logq.exp().gather(1, top)
    expected = -(p_top * q_top.log()).sum(-1) - (1 - p_top.sum(-1)) * (1 - q_top.sum(-1)).log()
    loss, _ = distill.distill_loss(student, top, p_top.log())
    assert loss.item() == pytest.approx(expected.mean().item(), rel=1e-6)
    # the minimum over students is the teacher itself (Gibbs' inequality)
    best, _ = distill.distill_loss(teacher, top, p_top.log())
    assert best.item() < loss.item()


def _tiny_target(layers: int = 4, seed: int = 0):
    from specbench.models.tiny import build_tiny

    model, tokenizer = build_tiny(
        "tiny-llama", dtype=torch.float64, seed=seed, vocab_size=300, layers=layers, init_std=0.3
    )
    return model, tokenizer


def test_early_exit_shares_weights_and_equals_the_truncated_target(one_thread):
    target, _ = _tiny_target()
    draft = early_exit_model(target, 2)
    target_ids = {id(p) for p in target.parameters()}
    assert all(id(p) in target_ids for p in draft.parameters())  # no copy, no new weights
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = target(input_ids=ids, output_hidden_states=True).hidden_states[2]
        expected = target.lm_head(target.model.norm(hidden))
        assert torch.allclose(draft(input_ids=ids).logits, expected, atol=1e-10)
        # an untrained exit head is the identity: the same early exit
        headed = early_exit_model(target, 2, ExitHead(target.config.hidden_size).double())
        assert torch.allclose(headed(input_ids=ids).logits, expected, atol=1e-10)


def test_greedy_sd_with_an_early_exit_drafter_is_lossless(one_thread):
    target, _ = _tiny_target()
    verifier = HFModel(target, "target")
    drafter = ModelDrafter(HFModel(early_exit_model(target, 1), "exit1"))
    for seed in range(4):
        prompt = torch.randint(3, 300, (5,), generator=torch.Generator().manual_seed(seed))
        reference = autoregressive.generate(verifier, prompt, max_new_tokens=20).tokens
        for k in (1, 3, 5):
            out = speculative.generate(verifier, drafter, prompt, k=k, max_new_tokens=20)
            assert out.tokens == reference
            assert out.forwards["exit1"]["forward_passes"] > 0


def test_early_exit_rejects_impossible_layer_counts_and_non_llama_targets():
    target, _ = _tiny_target(layers=3)
    for layers in (0, 3, 7):
        with pytest.raises(SpecbenchError, match="use 1 to 2"):
            early_exit_model(target, layers)
    from specbench.models.tiny import build_tiny

    t5, _ = build_tiny("tiny-t5")
    with pytest.raises(SpecbenchError, match="Llama-family"):
        early_exit_model(t5, 1)


def test_early_exit_source_resolves_the_named_recipe_model():
    target = registry.load(
        registry.ModelRequest("t", "tiny-llama", "float64", "cpu", options=(("layers", 3),))
    )
    request = registry.ModelRequest("d", "early-exit", "float64", "cpu", options=(("layers", 2), ("of", "t")))
    draft = registry.load(request, {"t": target}.__getitem__)
    assert isinstance(draft, HFModel) and draft.tokenizer is target.tokenizer
    assert "layer 2 of t" in draft.origin
    with pytest.raises(SpecbenchError, match="no model named 'x'"):
        bad = registry.ModelRequest("d", "early-exit", "float64", "cpu", options=(("layers", 2), ("of", "x")))
        registry.load(bad, {"t": target}.__getitem__)
    with pytest.raises(SpecbenchError, match="options of"):
        registry.load(
            registry.ModelRequest("d", "early-exit", options=(("of", "t"),)), {"t": target}.__getitem__
        )


def test_missing_distilled_drafter_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(SpecbenchError, match="make drafts"):
        registry.load(registry.ModelRequest("d", "distilled:smollm2-135m-instruct/small"))


# -- training end to end on a tiny teacher -----------------------------------------------------------


def _data_dir(root: Path) -> Path:
    gsm8k = [
        {
            "question": f"Tom has {i} apples and buys {i + 2} more. How many?",
            "answer": f"{i}+{i + 2}=#### {2 * i + 2}",
        }
        for i in range(14)
    ]
    rows = {
        "gsm8k/train.jsonl": gsm8k,
        "mmlu/dev.jsonl": [
            {"question": "2+2?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1},
        ],
        "alpaca_seed/train.jsonl": [{"instruction": "Say hi.", "input": "", "output": "hi"}],
    }
    for name, items in rows.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return root


@pytest.fixture
def tiny_distill(tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    teacher = distill.TeacherConfig(
        "tiny-llama", generate=6, max_new_tokens=12, teacher_forced=6, top_k=8, batch_size=4,
        data_dir=str(_data_dir(tmp_path / "data")),
    )  # fmt: skip

    def run(*sizes: str, **overrides):
        students = [distill.student_config(s, **overrides) for s in sizes]
        with Progress(disable=True) as progress:
            return distill.distill(teacher, students, progress, held_out_fraction=0.25)

    return run


def test_distilled_drafters_train_save_and_load_as_sources(tiny_distill):
    saved = tiny_distill("small", "base", "exit1", epochs=8, batch_tokens=256)
    records = {p.name: json.loads((p / "distill.json").read_text()) for p in saved}
    assert set(records) == {"small", "base", "exit1"}
    for name in ("small", "base"):  # training lowers the held-out cross-entropy to the teacher
        before, after = records[name]["held_out_before"], records[name]["held_out_after"]
        assert after["cross_entropy"] < before["cross_entropy"], name
    assert records["base"]["teacher"]["target"] == "tiny-llama" and records["base"]["steps"] > 0

    target = registry.load(registry.ModelRequest("t", "tiny-llama", "float64", "cpu"))
    small = registry.load(registry.ModelRequest("d", "distilled:tiny-llama/small", "float64", "cpu"))
    assert small.tokenizer.get_vocab() == target.tokenizer.get_vocab()
    assert small.model.config.hidden_size == 160 and small.origin.startswith("distilled:")
    # the base student keeps the target's (frozen) embedding
    base = registry.load(registry.ModelRequest("b", "distilled:tiny-llama/base", "float64", "cpu"))
    assert torch.equal(base.model.get_input_embeddings().weight, target.model.get_input_embeddings().weight)
    # an exit head loads onto the target's own layers
    exit_request = registry.ModelRequest(
        "e",
        "early-exit",
        "float64",
        "cpu",
        options=(("exit_head", str(saved[2])), ("layers", 1), ("of", "t")),
    )
    exit1 = registry.load(exit_request, {"t": target}.__getitem__)
    assert "exit head" in exit1.origin
    prompt = target.tokenizer("Tom has 3 apples", return_tensors="pt").input_ids[0]
    reference = autoregressive.generate(target, prompt, max_new_tokens=12).tokens
    for drafter in (small, base, exit1):
        assert (
            speculative.generate(target, ModelDrafter(drafter), prompt, k=3, max_new_tokens=12).tokens
            == reference
        )


def test_teacher_data_is_cached_and_training_is_deterministic(tiny_distill, monkeypatch):
    first = tiny_distill("small", epochs=2)[0]
    weights = (first / "model.safetensors").read_bytes()

    def no_teacher(*args, **kwargs):
        raise AssertionError("the teacher ran again although its data is cached")

    monkeypatch.setattr(distill, "_generated", no_teacher)
    monkeypatch.setattr(distill, "_teacher_forced", no_teacher)
    again = tiny_distill("small", epochs=2)[0]
    assert (again / "model.safetensors").read_bytes() == weights  # same seed, same bytes
    other = tiny_distill("small", epochs=2, seed=1)[0]
    assert (other / "model.safetensors").read_bytes() != weights


def test_unknown_size_and_missing_data_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(SpecbenchError, match="exit<N>"):
        distill.student_config("huge")
    monkeypatch.delenv("SPECBENCH_DATA_DIR", raising=False)
    result = CliRunner().invoke(app, ["distill", "--target", "tiny-llama"])
    assert result.exit_code == 2 and "--data-dir" in result.output
    result = CliRunner().invoke(app, ["distill", "--target", "tiny-llama", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "training data" in result.output


def test_distill_help_explains_sizes_and_cache():
    result = CliRunner().invoke(app, ["distill", "--help"])
    assert result.exit_code == 0
    for word in ("small", "base", "exit", "distilled:"):
        assert word in result.output
