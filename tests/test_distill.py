"""Distilled and early-exit drafters: the loss, weight sharing, training, caching, loading, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from rich.progress import Progress
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from specbench import sources
from specbench.cli import app
from specbench.decoding import autoregressive, speculative
from specbench.drafters import draft_vocab
from specbench.drafters.early_exit import ExitHead, early_exit_model
from specbench.errors import SpecbenchError
from specbench.models.base import ModelDrafter
from specbench.models.hf import HFModel
from specbench.training import distill
from specbench.training import teacher as teaching


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
    target = sources.load(sources.ModelRequest("t", "tiny-llama", "float64", "cpu", options=(("layers", 3),)))
    request = sources.ModelRequest("d", "early-exit", "float64", "cpu", options=(("layers", 2), ("of", "t")))
    draft = sources.load(request, {"t": target}.__getitem__)
    assert isinstance(draft, HFModel) and draft.tokenizer is target.tokenizer
    assert "layer 2 of t" in draft.origin
    with pytest.raises(SpecbenchError, match="no model named 'x'"):
        bad = sources.ModelRequest("d", "early-exit", "float64", "cpu", options=(("layers", 2), ("of", "x")))
        sources.load(bad, {"t": target}.__getitem__)
    with pytest.raises(SpecbenchError, match="options of"):
        sources.load(
            sources.ModelRequest("d", "early-exit", options=(("of", "t"),)), {"t": target}.__getitem__
        )


def test_missing_distilled_drafter_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(SpecbenchError, match="make drafts"):
        sources.load(sources.ModelRequest("d", "distilled:smollm2-135m-instruct/small"))


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
    teacher = teaching.TeacherConfig(
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

    target = sources.load(sources.ModelRequest("t", "tiny-llama", "float64", "cpu"))
    small = sources.load(sources.ModelRequest("d", "distilled:tiny-llama/small", "float64", "cpu"))
    assert small.tokenizer.get_vocab() == target.tokenizer.get_vocab()
    assert small.model.config.hidden_size == 160 and small.origin.startswith("distilled:")
    # the base student starts as the target's first two layers and trains its tied embedding too
    base = sources.load(sources.ModelRequest("b", "distilled:tiny-llama/base", "float64", "cpu"))
    assert base.model.config.num_hidden_layers == 2
    base_embedding, target_embedding = (
        base.model.get_input_embeddings().weight,
        target.model.get_input_embeddings().weight,
    )
    assert base_embedding.shape == target_embedding.shape and not torch.equal(
        base_embedding, target_embedding
    )
    # an exit head loads onto the target's own layers
    exit_request = sources.ModelRequest(
        "e",
        "early-exit",
        "float64",
        "cpu",
        options=(("exit_head", str(saved[2])), ("layers", 1), ("of", "t")),
    )
    exit1 = sources.load(exit_request, {"t": target}.__getitem__)
    assert "exit head" in exit1.origin
    prompt = target.tokenizer("Tom has 3 apples", return_tensors="pt").input_ids[0]
    reference = autoregressive.generate(target, prompt, max_new_tokens=12).tokens
    for drafter in (small, base, exit1):
        assert (
            speculative.generate(target, ModelDrafter(drafter), prompt, k=3, max_new_tokens=12).tokens
            == reference
        )


def test_a_named_drafter_is_saved_beside_the_size_it_trains_not_over_it(tmp_path, monkeypatch, one_thread):
    """--name keeps a second drafter of one size (the committed runs' `small` stays as it was), records
    the name, loads as distilled:<target>/<name>; a name for two sizes or not a folder name is refused."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    data = _data_dir(tmp_path / "data")
    common = ["distill", "--target", "tiny-llama", "--data-dir", str(data), "--size", "small"]
    common += ["--generate", "4", "--teacher-forced", "4", "--max-new-tokens", "6", "--top-k", "4"]
    assert CliRunner().invoke(app, [*common, "--epochs", "1"]).exit_code == 0
    drafters = tmp_path / "cache" / "drafters" / "tiny-llama"
    first = (drafters / "small" / "model.safetensors").read_bytes()
    result = CliRunner().invoke(app, [*common, "--epochs", "3", "--name", "small-e3"])
    assert result.exit_code == 0, result.output
    assert (drafters / "small" / "model.safetensors").read_bytes() == first
    record = json.loads((drafters / "small-e3" / "distill.json").read_text())
    assert record["student"]["label"] == "small-e3" and record["student"]["epochs"] == 3
    assert "label" not in json.loads((drafters / "small" / "distill.json").read_text())["student"]
    named = sources.load(sources.ModelRequest("d", "distilled:tiny-llama/small-e3", "float64", "cpu"))
    assert named.model.config.hidden_size == 160
    for extra, says in (
        (["--size", "base", "--name", "two"], "one name for 2 sizes"),
        (["--name", "../up"], "is not a folder name"),
    ):
        result = CliRunner().invoke(app, [*common, *extra])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert says in result.output and "--name" in result.output


def test_teacher_data_is_cached_and_training_is_deterministic(tiny_distill, monkeypatch):
    first = tiny_distill("small", epochs=2)[0]
    weights = (first / "model.safetensors").read_bytes()

    def no_teacher(*args, **kwargs):
        raise AssertionError("the teacher ran again although its data is cached")

    monkeypatch.setattr(teaching, "_generated", no_teacher)
    monkeypatch.setattr(teaching, "_teacher_forced", no_teacher)
    again = tiny_distill("small", epochs=2)[0]
    assert (again / "model.safetensors").read_bytes() == weights  # same seed, same bytes
    other = tiny_distill("small", epochs=2, seed=1)[0]
    assert (other / "model.safetensors").read_bytes() != weights


def test_a_killed_teacher_build_resumes_at_its_first_unfinished_batch(tmp_path, monkeypatch, one_thread):
    """Generation batches of 4 (6 prompts: 2 batches), teacher-forced batches of 2 (6 answers: 3): a
    build killed in its second forced batch keeps three finished batches, and the resumed build runs
    only the two left and gives the bytes an uninterrupted build gives."""
    target = sources.load(sources.ModelRequest("t", "tiny-llama", "float64", "cpu"))
    config = teaching.TeacherConfig(
        "tiny-llama", generate=6, max_new_tokens=6, teacher_forced=6, top_k=4, batch_size=4,
        data_dir=str(_data_dir(tmp_path / "data")),
    )  # fmt: skip
    calls, kill_at = {"generated": 0, "forced": 0}, {"forced": 0}
    left, right = teaching.left_padded, teaching.right_padded

    def counted_left(*args):
        calls["generated"] += 1
        return left(*args)

    def counted_right(*args):
        calls["forced"] += 1
        if calls["forced"] == kill_at["forced"]:
            raise KeyboardInterrupt
        return right(*args)

    monkeypatch.setattr(teaching, "left_padded", counted_left)
    monkeypatch.setattr(teaching, "right_padded", counted_right)

    def build(cache: Path):
        monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
        with Progress(disable=True) as progress:
            return teaching.teacher_data(target, config, progress)

    whole = build(tmp_path / "whole")
    kill_at["forced"] = 2
    calls.update(generated=0, forced=0)
    with pytest.raises(KeyboardInterrupt):
        build(tmp_path / "killed")
    folder = tmp_path / "killed" / "distill" / "tiny-llama"
    assert not list(folder.glob("teacher-*.pt"))  # no whole cache yet, only its finished batches
    assert sorted(p.name for p in folder.glob("*.parts/*")) == [
        "forced-000000.pt", "generated-000000.pt", "generated-000004.pt"
    ]  # fmt: skip
    kill_at["forced"] = 0
    calls.update(generated=0, forced=0)
    resumed = build(tmp_path / "killed")
    assert calls == {"generated": 0, "forced": 2}
    assert not list(folder.glob("*.parts"))  # the parts go once the whole is saved
    assert len(resumed) == len(whole) == 12
    for a, b in zip(whole, resumed, strict=True):
        assert a.start == b.start and all(
            torch.equal(getattr(a, f), getattr(b, f)) for f in ("ids", "top_ids", "top_logp")
        )


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
    for word in ("small", "base", "exit", "distilled:", "--draft-vocab", "FR-Spec"):
        assert word in result.output


def test_teacher_cache_key_follows_the_data_not_its_folder(tmp_path):
    here = teaching.TeacherConfig("tiny-llama", data_dir=str(_data_dir(tmp_path / "a")))
    moved = teaching.TeacherConfig("tiny-llama", data_dir=str(_data_dir(tmp_path / "b")))
    assert here.key() == moved.key()
    (tmp_path / "b" / "gsm8k" / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    assert here.key() != moved.key()
    assert here.key() != teaching.TeacherConfig("tiny-llama", top_k=8, data_dir=here.data_dir).key()


def _spec_bench(data: Path, rows: int) -> None:
    path = data / "spec_bench" / "question.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    items = [
        {"question_id": 100 + i, "category": "qa", "turns": [f"What is {i} plus {i}?"]} for i in range(rows)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in items))


def _evaluating_recipe(path: Path) -> Path:
    path.write_text(
        "name: eval\nmodels:\n  t: {source: tiny-llama}\n"
        "datasets:\n  - {task: spec_bench, split: question, limit: 2, every: 3}\n"
        "methods:\n  - {name: ar, method: autoregressive, target: t}\n"
    )
    return path


def test_extra_prompts_are_answered_apart_and_never_what_a_recipe_evaluates(
    tmp_path, monkeypatch, one_thread
):
    """--extra-prompts adds a split's rows but those --leave-out's recipes evaluate (rows 0 and 3 of 7
    here: limit 2, every 3), cached beside the untouched base data; the drafter gets its own name."""
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    data = _data_dir(tmp_path / "data")
    _spec_bench(data, 7)
    recipe = _evaluating_recipe(tmp_path / "eval.yaml")
    common = ["distill", "--target", "tiny-llama", "--data-dir", str(data), "--size", "small"]
    common += [
        "--generate",
        "6",
        "--teacher-forced",
        "6",
        "--max-new-tokens",
        "6",
        "--top-k",
        "8",
        "--epochs",
        "1",
    ]
    answered = []
    real = teaching._generated

    def recording(target, prompts, config, progress, parts=None):
        answered.append([target.tokenizer.decode(p) for p in prompts])
        return real(target, prompts, config, progress, parts)

    monkeypatch.setattr(teaching, "_generated", recording)
    assert CliRunner().invoke(app, common).exit_code == 0
    base_files = sorted(p.name for p in (tmp_path / "cache" / "distill" / "tiny-llama").iterdir())
    result = CliRunner().invoke(
        app, [*common, "--extra-prompts", "spec_bench:question", "--leave-out", str(recipe)]
    )
    assert result.exit_code == 0, result.output
    extra = answered[-1]  # the base data came from the cache: only the extras were answered
    assert len(answered) == 2 and len(extra) == 5
    assert not any("What is 0 plus 0" in p or "What is 3 plus 3" in p for p in extra)
    assert all(any(f"What is {i} plus {i}" in p for p in extra) for i in (1, 2, 4, 5, 6))
    files = sorted(p.name for p in (tmp_path / "cache" / "distill" / "tiny-llama").iterdir())
    assert set(base_files) < set(files) and any("-extra-" in f for f in files)
    folder = tmp_path / "cache" / "drafters" / "tiny-llama" / "small+spec_bench-question"
    record = json.loads((folder / "distill.json").read_text())
    assert record["teacher"]["extra"] == ["spec_bench:question"]
    assert record["teacher"]["left_out"] == ["spec_bench/100", "spec_bench/103"]
    plain = json.loads(
        (tmp_path / "cache" / "drafters" / "tiny-llama" / "small" / "distill.json").read_text()
    )
    assert "extra" not in plain["teacher"] and "left_out" not in plain["teacher"]

    # a run may evaluate what the drafter left out, and nothing it was trained on
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(data))
    held_out = tmp_path / "held_out.yaml"
    held_out.write_text(
        "name: eval\nmodels:\n  t: {source: tiny-llama}\n"
        "  d: {source: 'distilled:tiny-llama/small+spec_bench-question'}\n"
        "generation: {max_new_tokens: 2}\n"
        "datasets:\n  - {task: spec_bench, split: question, limit: 2, every: 3}\n"
        "methods:\n  - {name: sd, method: speculative, target: t, drafter: d, params: {k: 2}}\n"
    )
    result = CliRunner().invoke(app, ["run", str(held_out), "-o", str(tmp_path / "ok")])
    assert result.exit_code == 0, result.output
    seen = tmp_path / "seen.yaml"
    seen.write_text(held_out.read_text().replace("limit: 2, every: 3", "limit: 3"))
    result = CliRunner().invoke(app, ["run", str(seen), "-o", str(tmp_path / "seen")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "models.d.source" in result.output and "trained on 2 spec_bench/question" in result.output
    assert "spec_bench/101, spec_bench/102" in result.output and "--leave-out" in result.output
    assert not (tmp_path / "seen" / "examples.jsonl").exists()


def test_extra_prompts_need_a_stated_leave_out_and_a_known_split(tmp_path, monkeypatch):
    data = _data_dir(tmp_path / "data")
    _spec_bench(data, 4)
    common = ["distill", "--target", "tiny-llama", "--data-dir", str(data)]
    result = CliRunner().invoke(app, [*common, "--extra-prompts", "spec_bench:question"])
    assert result.exit_code == 2 and "--leave-out RECIPE" in result.output
    result = CliRunner().invoke(app, [*common, "--extra-prompts", "nonsense", "--leave-out", "none"])
    assert result.exit_code == 2 and "TASK:SPLIT" in result.output
    elsewhere = tmp_path / "gsm8k_eval.yaml"
    elsewhere.write_text(
        _evaluating_recipe(tmp_path / "e.yaml")
        .read_text()
        .replace("spec_bench, split: question", "gsm8k, split: train")
    )
    result = CliRunner().invoke(
        app, [*common, "--extra-prompts", "spec_bench:question", "--leave-out", str(elsewhere)]
    )
    assert result.exit_code == 2 and "evaluates none of spec_bench/question" in result.output
    result = CliRunner().invoke(app, [*common, "--leave-out", "none"])
    assert result.exit_code == 2 and "--extra-prompts" in result.output


# -- draft vocabulary (FR-Spec head) -------------------------------------------------------------


def test_frequent_tokens_rank_by_count_then_id_and_keep_eos():
    counts = torch.tensor([5, 0, 9, 5, 1, 0, 7])
    assert draft_vocab.frequent_tokens(counts, 3).tolist() == [0, 2, 6]  # 9, 7, then 5 (id 0 < id 3)
    assert draft_vocab.frequent_tokens(counts, 3, always=[5]).tolist() == [2, 5, 6]
    assert draft_vocab.frequent_tokens(counts, 99).tolist() == list(range(7))
    where = draft_vocab.positions(torch.tensor([2, 5, 6]), 7)
    assert where.tolist() == [-1, -1, 0, -1, -1, 1, 2]


def test_distill_loss_moves_teacher_mass_outside_the_draft_vocabulary_to_the_tail():
    gen = torch.Generator().manual_seed(1)
    teacher = torch.randn(4, 10, generator=gen, dtype=torch.float64).softmax(-1)
    student = torch.randn(4, 6, generator=gen, dtype=torch.float64)  # scores tokens 0..5 only
    top = teacher.argsort(-1, descending=True)[:, :4]
    p_top = teacher.gather(1, top)
    rows = torch.where(top < 6, top, torch.full_like(top, -1))
    loss, agree = distill.distill_loss(student, rows, p_top.log())
    q = student.softmax(-1)
    expected = []
    for r in range(4):
        inside = [(p_top[r, j].item(), q[r, top[r, j]].item()) for j in range(4) if top[r, j] < 6]
        p_in, q_in = sum(p for p, _ in inside), sum(x for _, x in inside)
        expected.append(-sum(p * math.log(x) for p, x in inside) - (1 - p_in) * math.log(1 - q_in))
    assert loss.item() == pytest.approx(sum(expected) / 4, rel=1e-6)
    hits = [student[r].argmax().item() == top[r, 0].item() for r in range(4)]
    assert agree.item() == pytest.approx(sum(hits) / 4)


def test_draft_vocab_head_scores_its_tokens_like_the_full_head_and_nothing_else():
    target = sources.load(sources.ModelRequest("t", "tiny-llama", "float64", "cpu"))
    model = target.model
    hidden = torch.randn(3, model.config.hidden_size, dtype=torch.float64)
    full = model.lm_head(hidden)
    ids = torch.tensor([0, 7, 42, 258])
    head = draft_vocab.DraftVocabHead(model.lm_head.weight.detach(), ids, model.config.vocab_size)
    restricted = head(hidden)
    assert torch.allclose(restricted[:, ids], full[:, ids])
    outside = torch.ones(model.config.vocab_size, dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(restricted[:, outside]).all()


def test_drafter_with_a_draft_vocabulary_saves_loads_and_stays_lossless(tiny_distill):
    (folder,) = tiny_distill("small", epochs=2, batch_tokens=256, draft_vocab=40)
    ids = json.loads((folder / draft_vocab.DRAFT_VOCAB_FILE).read_text())["token_ids"]
    target = sources.load(sources.ModelRequest("t", "tiny-llama", "float64", "cpu"))
    assert len(ids) == 40 and set(target.eos_token_ids()) <= set(ids)
    assert json.loads((folder / "distill.json").read_text())["student"]["draft_vocab"] == 40
    small = sources.load(sources.ModelRequest("d", "distilled:tiny-llama/small", "float64", "cpu"))
    assert "40 most frequent tokens" in small.origin
    # the restricted head copies rows of the tied embedding: the model's size (MS cost) is unchanged
    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64)
    assert small.num_parameters == sum(p.numel() for p in plain.parameters())
    prompt = target.tokenizer("Tom has 3 apples", return_tensors="pt").input_ids[0]
    small.start(prompt)
    logits = small.score(torch.empty(0, dtype=torch.long), 0).logits[-1]
    assert torch.isfinite(logits).sum().item() == 40
    reference = autoregressive.generate(target, prompt, max_new_tokens=12).tokens
    for k in (1, 3):
        assert (
            speculative.generate(target, ModelDrafter(small), prompt, k=k, max_new_tokens=12).tokens
            == reference
        )


def test_teacher_forced_top_k_are_the_targets_own_next_token_log_probs(one_thread):
    target = sources.load(sources.ModelRequest("t", "tiny-llama", "float64", "cpu"))
    pairs = [
        (torch.tensor([5, 6, 7]), torch.tensor([8, 9])),
        (torch.tensor([1, 2]), torch.tensor([3, 4, 5, 6])),
    ]
    config = teaching.TeacherConfig("tiny-llama", top_k=4, batch_size=4)
    with Progress(disable=True) as progress:
        sequences = teaching._teacher_forced(target, pairs, config, progress)
    for (prompt, answer), seq in zip(pairs, sequences, strict=True):
        full = torch.cat([prompt, answer])
        logp = target.model(input_ids=full[None]).logits[0].log_softmax(-1)[prompt.shape[0] - 1 : -1]
        values, ids = logp.topk(4, dim=-1)
        assert torch.equal(seq.ids, full) and seq.start == prompt.shape[0]
        assert torch.equal(seq.top_ids.long(), ids)
        assert torch.allclose(seq.top_logp.float(), values.float(), atol=2e-3)  # stored as float16


def test_exit_heads_keep_the_full_vocabulary():
    assert distill.student_config("exit4", draft_vocab=4096).draft_vocab == 0
    assert distill.student_config("small", draft_vocab=4096).draft_vocab == 4096
    assert distill.student_config("base").draft_vocab == 8192


def test_micro_and_mini_sit_at_cs_draftings_parameter_ratios():
    """Chen et al., NeurIPS 2024, Table 2's MS costs: FLAN-T5-small and -base over XXL."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specbench.models import facts
    from specbench.papers.cs_drafting.theory import PARAM_COSTS

    smollm2 = facts.shipped_facts()["HuggingFaceTB/SmolLM2-135M-Instruct"]
    config = {k: v for k, v in smollm2["config"].items() if k != "model_type"} | {"num_hidden_layers": 2}
    target = LlamaForCausalLM(LlamaConfig(**config))  # SmolLM2's embedding, two layers are enough
    for size, paper in (("micro", PARAM_COSTS["small"]), ("mini", PARAM_COSTS["base"])):
        student = distill.build_student(target, size, seed=0)
        assert student.config.num_hidden_layers == 2 and student.config.tie_word_embeddings
        ratio = sum(p.numel() for p in student.parameters()) / smollm2["params"]
        assert ratio == pytest.approx(paper, rel=0.08), size


def test_a_saved_teacher_batch_is_taken_only_for_the_indices_it_answered(tmp_path):
    batches = teaching._Batches(tmp_path / "parts", "generated")
    seq = teaching.Sequence(
        torch.tensor([1, 2, 3]),
        2,
        torch.zeros(1, 4, dtype=torch.int32),
        torch.zeros(1, 4, dtype=torch.float16),
    )
    batches.save(0, [3, 5], [seq, seq])
    assert batches.load(4, [3, 5]) is None  # another batch position
    assert batches.load(0, [5, 3]) is None  # the same position, other prompts (another order)
    loaded = batches.load(0, [3, 5])
    assert loaded is not None and len(loaded) == 2 and torch.equal(loaded[0].ids, seq.ids)
    assert teaching._Batches(None, "generated").load(0, [3, 5]) is None  # no folder: nothing kept
