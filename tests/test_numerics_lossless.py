"""The lossless check tells a numerical near-tie from a real mismatch
(specbench/pipeline/analysis/numerics.py): margins at the first divergence under batch and incremental
scoring, the dtype's tolerance, the classes in rows, cells.csv and the report, and the target's
counters left as they were."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import tiny_recipes
import torch
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.decoding import autoregressive
from specbench.decoding.generation import Generation
from specbench.errors import SpecbenchError
from specbench.methods import METHODS, Method, always
from specbench.models.base import ForwardCounter, Pass
from specbench.models.hf import HFModel
from specbench.models.tiny import BYTE_VOCAB, byte_tokenizer
from specbench.pipeline.analysis.numerics import (
    RELATIVE,
    classify,
    counter_kept,
    divergence_fields,
    tolerance,
)
from specbench.pipeline.analysis.summary import summarise
from specbench.pipeline.run.runner import Runner
from specbench.pipeline.views.report import display_frame, format_lossless
from specbench.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "quickstart-tiny.yaml"
A, B = 65, 66  # the tied tokens ("A", "B")
TIE_AT = 3  # the generated position where they tie
NEW_TOKENS = 8


class DesignedTarget:
    """A decoder-only target with hand-written logits: after token x the next is (x + 1) mod 256 (logit 1,
    the rest 0), except at generated position ``tie_at``, where A and B both have logit 1. ``nudge``
    adds to B's logit in a pass that feeds several positions and to A's in a one-position pass: the
    rounding difference between a verification and an AR step, written out. It keeps a cache as
    HFModel does (a pass feeds the positions it lacks) and counts every ``score`` call in ``calls``."""

    name, num_parameters, vocab_size, is_encoder_decoder = "target", 1000, BYTE_VOCAB, False
    device = torch.device("cpu")

    def __init__(self, tie_at: int = TIE_AT, nudge: float = 0.0, dtype: torch.dtype = torch.float64):
        self.tie_at, self.nudge, self.dtype = tie_at, nudge, dtype
        self.tokenizer = byte_tokenizer()
        self.counter = ForwardCounter()
        self.calls = 0

    def eos_token_ids(self) -> list[int]:
        return [self.tokenizer.eos_token_id]

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.prompt, self.cached = prompt_ids, 0

    def rollback(self, n_tokens: int) -> None:
        self.cached = min(self.cached, self.prompt.shape[0] + n_tokens)

    def score(self, tokens: torch.Tensor, n_candidates: int, hidden=()) -> Pass:
        total = self.prompt.shape[0] + tokens.shape[0]
        fed = total - min(self.cached, total - n_candidates - 1)
        self.calls += 1
        started = self.counter.begin(self.device)
        self.cached = total
        rows = torch.zeros(n_candidates + 1, self.vocab_size, dtype=self.dtype)
        for row, position in enumerate(range(tokens.shape[0] - n_candidates, tokens.shape[0] + 1)):
            if position == self.tie_at:
                rows[row, [A, B]] = 1.0
                rows[row, B if fed > 1 else A] += self.nudge
            else:
                last = int(tokens[position - 1]) if position else int(self.prompt[-1])
                rows[row, (last + 1) % 256] = 1.0
        self.counter.end(started, fed, self.device)
        return Pass(rows)


def last_of_ties(params: dict, target, drafter, request) -> Generation:
    """Greedy decoding that takes the highest id among tied maxima (AR takes the lowest): as lossless
    as AR, and different exactly where the target ties."""
    target.counter.reset()
    target.start(request.prompt_ids)
    out = torch.empty(request.max_new_tokens, dtype=torch.long)
    for i in range(request.max_new_tokens):
        logits = target.score(out[:i], 0).logits[-1]
        out[i] = logits.shape[0] - 1 - int(logits.flip(0).argmax())
    tokens = out.tolist()
    return Generation(tokens, 1e-3, 1e-4, [(0, 0)] * len(tokens), {target.name: target.counter.snapshot()})


def designed_recipe(tmp_path: Path):
    data = {
        "name": "designed-tie",
        "warmup": 0,
        "generation": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
        "models": {"target": {"source": "tiny-llama", "dtype": "float64"}},
        "datasets": [{"task": "arithmetic", "limit": 2, "chat_template": False}],
        "methods": [
            {"name": "ar", "method": "autoregressive", "target": "target"},
            {"name": "lt", "method": "last_of_ties", "target": "target"},
        ],
    }
    return parse_recipe(data, tmp_path / "designed.yaml")


def read_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "examples.jsonl").read_text().splitlines()]


# -- (a) an exact tie ---------------------------------------------------------------------------


def test_an_exact_tie_is_classified_tie_and_leaves_the_counts(tmp_path):
    with METHODS.registered(Method("last_of_ties", "", last_of_ties, {}, lossless=always)):
        runner = Runner(designed_recipe(tmp_path), tmp_path / "out")
        target = runner.models["target"] = DesignedTarget()  # loaded models are cached by name
        runner.run()
    rows = read_rows(tmp_path / "out")
    ar = {r["example_id"]: r for r in rows if r["method"] == "autoregressive"}
    tied = [r for r in rows if r["method"] == "last_of_ties"]
    assert len(ar) == len(tied) == 2
    for row in tied:
        reference = ar[row["example_id"]]["output_ids"]
        assert reference[TIE_AT] == A and row["output_ids"][TIE_AT] == B
        assert row["output_ids"][:TIE_AT] == reference[:TIE_AT]
        assert row["first_divergence"] == TIE_AT
        assert row["divergence_class"] == "tie"
        assert row["divergence_margin"] == {"batch": 0.0, "incremental": 0.0}
        assert row["divergence_tokens"] == {"ar": A, "method": B, "batch": A, "incremental": A}
        assert row["divergence_top2"] is True
        assert row["divergence_tolerance"] == pytest.approx(RELATIVE[torch.float64])  # |top-1| = 1
        # the method's own passes only: one a token, the prompt first, then one token each
        counts = row["forwards"]["target"]
        assert counts["forward_passes"] == NEW_TOKENS
        assert counts["tokens_scored"] == row["prompt_tokens"] + NEW_TOKENS - 1
    assert all("divergence_class" not in r for r in ar.values())  # AR rows are the reference
    # the check ran its passes (one batch pass and TIE_AT + 1 incremental ones per tied row) ...
    assert target.calls == 2 * 2 * NEW_TOKENS + 2 * (1 + TIE_AT + 1)
    # ... and left the counter at the last row's own counts (the last row written is a tied one)
    assert rows[-1]["method"] == "last_of_ties"
    assert target.counter.forward_passes == rows[-1]["forwards"]["target"]["forward_passes"]
    assert target.counter.tokens_scored == rows[-1]["forwards"]["target"]["tokens_scored"]
    cells = pd.read_csv(tmp_path / "out" / "cells.csv").set_index("cell")
    lt = cells.loc["lt"]
    assert (lt["lossless_checked"], lt["lossless_identical"]) == (2, 0)
    assert (lt["lossless_ties"], lt["lossless_mismatches"]) == (2, 0)
    frame = display_frame(cells.reset_index().assign(run="out")).set_index("method")
    assert frame.loc["lt", "lossless"] == "0/2 (2 ties)" and frame.loc["ar", "lossless"] == ""


def test_batch_and_incremental_scoring_may_prefer_different_tied_tokens():
    """A verification (several positions a pass) and AR (one) break a near-tie differently: each
    computation's preferred token and margin are recorded, and the dtype's tolerance decides."""
    prompt = torch.tensor([10, 20, 30])
    reference = [31, 32, 33, A, 66, 67]  # AR's output: A at the tie
    tokens = [31, 32, 33, B, 67, 68]  # a verification's: B
    fields = classify(DesignedTarget(nudge=1e-12), prompt, reference, tokens, TIE_AT)
    assert fields["divergence_class"] == "tie" and fields["divergence_top2"] is True
    assert fields["divergence_margin"]["batch"] == pytest.approx(1e-12, rel=1e-3)
    assert fields["divergence_margin"]["incremental"] == pytest.approx(1e-12, rel=1e-3)
    assert fields["divergence_tokens"] == {"ar": A, "method": B, "batch": B, "incremental": A}
    # a float64 target whose tied tokens are 0.01 apart: more than rounding explains
    assert classify(DesignedTarget(nudge=0.01), prompt, reference, tokens, TIE_AT)["divergence_class"] == (
        "mismatch"
    )
    # the same 2^-6 is two bfloat16 spacings at 1: a tie in bfloat16, a mismatch in float32
    for dtype, expected in ((torch.bfloat16, "tie"), (torch.float32, "mismatch")):
        fields = classify(DesignedTarget(nudge=2**-6, dtype=dtype), prompt, reference, tokens, TIE_AT)
        assert fields["divergence_margin"]["batch"] == 2**-6
        assert fields["divergence_class"] == expected, dtype
    # a method that takes a third token at a tie is not explained by the tie
    third = [31, 32, 33, 67, 68, 69]
    fields = classify(DesignedTarget(), prompt, reference, third, TIE_AT)
    assert fields["divergence_margin"] == {"batch": 0.0, "incremental": 0.0}
    assert fields["divergence_top2"] is False and fields["divergence_class"] == "mismatch"


class ThreeWayTarget(DesignedTarget):
    """At the tie, AR's token A on 16.625, B on 16.5 and C on 16.375 in bfloat16, as the Qwen2.5-Coder-1.5B
    scored MMLU problem 9900 a token a pass (results/cs_drafting/qwen_table3_offline)."""

    def score(self, tokens: torch.Tensor, n_candidates: int, hidden=()) -> Pass:
        scored = super().score(tokens, n_candidates, hidden)
        rows = scored.logits
        for row, position in enumerate(range(tokens.shape[0] - n_candidates, tokens.shape[0] + 1)):
            if position == self.tie_at:
                rows[row].zero_()
                rows[row, [A, B, C]] = torch.tensor([16.625, 16.5, 16.375], dtype=rows.dtype)
        return Pass(rows)


C = B + 1  # a third token; the top-2 pair at the tie is then {A, B}


def test_a_three_way_near_tie_explains_the_third_token_and_a_far_token_does_not():
    """A method that takes C, third and 0.25 below A (bfloat16 tolerance 0.52 at a logit of 16.6), is a
    tie although {A, C} is not the top-2 pair; one that takes a token 16.625 below A is a mismatch. The
    gap recorded is the top logit minus the lower of the two tokens'."""
    prompt = torch.tensor([10, 20, 30])
    reference = [31, 32, 33, A, 66, 67]
    target = ThreeWayTarget(dtype=torch.bfloat16)
    fields = classify(target, prompt, reference, [31, 32, 33, C, 67, 68], TIE_AT)
    assert fields["divergence_top2"] is False  # B is second
    assert fields["divergence_gap"] == {"batch": 0.25, "incremental": 0.25}
    assert fields["divergence_tolerance"] == pytest.approx(16.625 * 4 * 2**-7)
    assert fields["divergence_class"] == "tie"
    far = classify(target, prompt, reference, [31, 32, 33, 200, 67, 68], TIE_AT)
    assert far["divergence_gap"] == {"batch": 16.625, "incremental": 16.625}
    assert far["divergence_class"] == "mismatch"


def test_tolerance_is_relative_to_the_top_logit_and_set_by_dtype():
    assert tolerance(torch.float64, 0.5) == 1e-9
    assert tolerance(torch.float32, -20.0) == pytest.approx(20 * 1e-4)
    assert tolerance(torch.bfloat16, 20.0) == pytest.approx(20 * 4 * 2**-7)
    assert tolerance(torch.float16, 1.0) == pytest.approx(4 * 2**-10)
    assert tolerance(torch.float32, 1.0, torch.device("cpu")) == 1e-4  # TF32 is a CUDA matter only


@pytest.mark.parametrize("kind", ["tiny-llama", "tiny-t5"])
def test_margins_of_a_real_target_agree_and_counters_are_kept(tiny_model, one_thread, kind):
    """On a float64 tiny model (decoder-only, and T5's decoder prefix) both computations prefer the AR
    token with the same margin, and the counter (encoder passes too) is as before the check."""
    target = HFModel(tiny_model(kind, 3), "target")
    prompt = torch.tensor([3, 5, 7, 2, 11])
    reference = autoregressive.generate(target, prompt, max_new_tokens=10).tokens
    i = 4
    flipped = [*reference[:i], (reference[i] + 1) % 16, *reference[i + 1 :]]
    before = target.counter.snapshot()
    fields = divergence_fields(target, prompt, reference, flipped, i, single_turn=True)
    assert target.counter.snapshot() == before
    assert fields["divergence_tokens"]["batch"] == fields["divergence_tokens"]["incremental"] == reference[i]
    margins = fields["divergence_margin"]
    assert margins["batch"] == pytest.approx(margins["incremental"], rel=1e-9)
    assert margins["batch"] > fields["divergence_tolerance"] and fields["divergence_class"] == "mismatch"
    assert divergence_fields(target, prompt, reference, reference, -1, single_turn=True) == {
        "divergence_class": "identical"
    }
    assert divergence_fields(target, prompt, reference, flipped, i, single_turn=False) == {}


def test_counter_kept_restores_every_field():
    counter = ForwardCounter(
        forward_passes=3,
        tokens_scored=7,
        encoder_passes=1,
        prefill_passes=1,
        _seconds=0.5,
        _prefill_seconds=0.2,
    )
    with counter_kept(counter):
        counter.reset()
        counter.end(counter.begin(torch.device("cpu")), 9, torch.device("cpu"))  # a prefill: no cache
        assert counter.forward_passes == counter.prefill_passes == 1
    assert counter.snapshot() == {
        "forward_passes": 3,
        "tokens_scored": 7,
        "encoder_passes": 1,
        "seconds": 0.5,
        "prefill_passes": 1,
        "prefill_seconds": 0.2,
    }


# -- (b) a real mismatch ------------------------------------------------------------------------


def test_a_broken_verification_is_a_mismatch(tmp_path):
    """Speculative decoding that commits a wrong token at position 2: every checked row is a mismatch
    with a margin far above the float64 tolerance, and the report says so."""
    run = METHODS["speculative"].run
    flipped_at = 2

    def broken(params, target, drafter, request):
        generation = run(params, target, drafter, request)
        tokens = list(generation.tokens)
        tokens[flipped_at] = (tokens[flipped_at] + 1) % 256
        return dataclasses.replace(generation, tokens=tokens)

    out = tmp_path / "run"
    with METHODS.registered(dataclasses.replace(METHODS["speculative"], run=broken), replace=True):
        result = CliRunner().invoke(app, ["run", str(TINY), "--output-dir", str(out), "--limit", "1"])
    assert result.exit_code == 0, result.output
    rows = read_rows(out)
    ar = next(r for r in rows if r["method"] == "autoregressive")
    broken_rows = [r for r in rows if r["method"] == "speculative"]
    assert len(broken_rows) == 4
    for row in broken_rows:
        assert row["first_divergence"] == flipped_at and row["divergence_class"] == "mismatch"
        margins = row["divergence_margin"]
        assert min(margins.values()) > 1e3 * row["divergence_tolerance"]
        assert margins["batch"] == pytest.approx(margins["incremental"], rel=1e-9)
        tokens = row["divergence_tokens"]
        assert tokens["ar"] == tokens["batch"] == tokens["incremental"] == ar["output_ids"][flipped_at]
        assert tokens["method"] == row["output_ids"][flipped_at] != tokens["ar"]
    others = [r for r in rows if r["method"] in ("hf_assisted", "hf_prompt_lookup")]
    assert others and all(r["divergence_class"] == "identical" for r in others)
    cells = pd.read_csv(out / "cells.csv").set_index("cell")
    sd = cells[cells["method"] == "speculative"]
    assert (sd["lossless_checked"] == 1).all() and (sd["lossless_identical"] == 0).all()
    assert (sd["lossless_mismatches"] == 1).all() and (sd["lossless_ties"] == 0).all()
    report = CliRunner().invoke(app, ["report", str(out), "--format", "csv"])
    assert report.exit_code == 0 and report.output.count("0/1 (1 mismatch)") == 4


# -- (c) the real lossless methods on float64 tiny models ----------------------------------------


def t5_recipe(seed: int) -> dict:
    return tiny_recipes.recipe(
        f"t5-lossless-{seed}",
        {
            "target": tiny_recipes.tiny("tiny-t5", seed=seed, layers=2),
            "draft": tiny_recipes.tiny("tiny-t5", seed=seed, layers=1),
            "mag": tiny_recipes.maxgram(),
        },
        [tiny_recipes.ar(), tiny_recipes.speculative(), tiny_recipes.cs_drafting(["draft", "mag"], [[3]])],
        temperature=0.0,
        seed=seed,
        warmup=0,
    )


def llama_recipe(seed: int) -> dict:
    data = yaml.safe_load(TINY.read_text())
    for name in ("target", "draft"):
        data["models"][name]["options"]["seed"] = seed
    data["seed"] = seed
    return data


@pytest.mark.parametrize(
    ("recipe", "seed"), [(llama_recipe, 1), (llama_recipe, 2), (llama_recipe, 3), (t5_recipe, 1)]
)
def test_lossless_methods_in_float64_are_identical(tmp_path, recipe, seed):
    data = recipe(seed)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(path), "--output-dir", str(out), "--limit", "2"])
    assert result.exit_code == 0, result.output
    cells = pd.read_csv(out / "cells.csv")
    checked = cells[cells["method"] != "autoregressive"]
    assert len(checked) >= 3 and (checked["lossless_checked"] == 2).all()
    assert (checked["lossless_identical"] == 2).all()
    assert (checked["lossless_ties"] == 0).all() and (checked["lossless_mismatches"] == 0).all()
    classes = [r.get("divergence_class") for r in read_rows(out) if r["method"] != "autoregressive"]
    assert classes == ["identical"] * len(classes)


# -- (d) cells.csv and the report ----------------------------------------------------------------


def row(example: str, first_divergence, cls: str | None = None, method: str = "speculative") -> dict:
    ar = method == "autoregressive"
    out = {
        "key": f"{method}/{example}", "dataset": "toy", "cell": "ar" if ar else "sd",
        "method_name": "ar" if ar else "sd", "method": method, "params": {} if ar else {"k": 2},
        "target": "t", "drafter": None if ar else "d", "example_id": example, "n_tokens": 4,
        "walltime": 1.0, "ttft": 0.1, "forwards": {"t": {"forward_passes": 4 if ar else 2, "seconds": 0.5}},
        "steps": [[0, 0]] * 4 if ar else [[2, 1], [2, 1]], "accepted_by_position": [], "quality": {},
        "first_divergence": first_divergence,
        "costs": {"ms": {"t": 1.0, "d": 0.1}, "pw": {"t": 1.0, "d": 0.5}},
    }  # fmt: skip
    if not ar:
        out["forwards"]["d"] = {"forward_passes": 4, "seconds": 0.25}
    if cls is not None:
        out["divergence_class"] = cls
    return out


def test_cells_count_ties_and_mismatches_and_leave_older_rows_unclassified():
    rows = [row(f"e{i}", None, method="autoregressive") for i in range(8)]
    classes = [(-1, "identical")] * 4 + [(3, "tie"), (1, "mismatch"), (0, "mismatch"), (5, None)]
    rows += [row(f"e{i}", d, c) for i, (d, c) in enumerate(classes)]
    cells = summarise(rows).set_index("cell")
    sd = cells.loc["sd"]
    assert (sd["lossless_checked"], sd["lossless_identical"]) == (8, 4)
    assert (sd["lossless_ties"], sd["lossless_mismatches"]) == (1, 2)  # the unclassified one in neither
    columns = list(cells.columns)
    at = columns.index("lossless_checked")
    assert columns[at : at + 4] == [
        "lossless_checked",
        "lossless_identical",
        "lossless_ties",
        "lossless_mismatches",
    ]
    assert format_lossless(sd.to_dict()) == "4/8 (1 tie, 2 mismatches)"
    assert cells.loc["ar", "lossless_checked"] == 0 and format_lossless(cells.loc["ar"].to_dict()) == ""


def counts(checked, identical, ties=None, mismatches=None) -> dict:
    record = {"lossless_checked": checked, "lossless_identical": identical}
    if ties is not None:
        record.update(lossless_ties=ties, lossless_mismatches=mismatches)
    return record


@pytest.mark.parametrize(
    ("record", "shown"),
    [
        (counts(8, 7, 1, 0), "7/8 (1 tie)"),
        (counts(8, 6, 0, 2), "6/8 (2 mismatches)"),
        (counts(8, 5, 2, 1), "5/8 (2 ties, 1 mismatch)"),
        (counts(8, 8, 0, 0), "8/8"),
        (counts(8, 6), "6/8"),  # a cells.csv from before the classes
        (counts(8.0, 6.0, math.nan, math.nan), "6/8"),  # beside one of them in a concatenated frame
        (counts(0, 0, 0, 0), ""),  # not checked (AR, sampled, lossy)
        ({}, ""),
    ],
)
def test_report_shows_the_classes_beside_identical_over_checked(record, shown):
    assert format_lossless(record) == shown


def test_report_of_an_older_cells_csv_shows_identical_over_checked(tmp_path):
    rows = [row(f"e{i}", None, method="autoregressive") for i in range(2)] + [row("e0", -1), row("e1", 2)]
    cells = summarise(rows).drop(columns=["lossless_ties", "lossless_mismatches"])
    frame = display_frame(cells.assign(run="old")).set_index("method")
    assert frame.loc["sd", "lossless"] == "1/2"


# -- the replay check across a tie ----------------------------------------------------------------


class ReplayableTarget(DesignedTarget):
    """DesignedTarget with the module a ReplayTarget reads the dtype from."""

    def __init__(self, nudge: float):
        super().__init__(nudge=nudge)
        self.model = torch.nn.Linear(1, 1, dtype=self.dtype)


def replayed_recipe(tmp_path: Path):
    data = {
        "name": "replayed-tie",
        "warmup": 0,
        "replay_check": 1,
        "generation": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0},
        "models": {
            "target": {"source": "tiny-llama", "dtype": "float64"},
            "draft": {"source": "tiny-llama", "dtype": "float64"},
        },
        "datasets": [{"task": "arithmetic", "limit": 2, "chat_template": False}],
        "methods": [
            {"name": "ar", "method": "autoregressive", "target": "target"},
            {"name": "sd", "method": "speculative", "target": "target", "drafter": "draft", "replay": True,
             "params": {"k": 2}},
        ],
    }  # fmt: skip
    return parse_recipe(data, tmp_path / "replayed.yaml")


def test_a_replay_check_whose_live_run_parts_at_a_tie_keeps_the_replay_and_says_where(tmp_path):
    """A verification pass rounds the tie at TIE_AT to B, the AR step to A: the live SD run follows
    another text than the replayed one. Within the float64 tolerance that is a tie, so the replay stands
    (the count on the AR output) and its first row names the token; a margin beyond it stops the run."""
    runner = Runner(replayed_recipe(tmp_path), tmp_path / "tie")
    runner.models["target"] = ReplayableTarget(nudge=RELATIVE[torch.float64] / 10)
    runner.run()
    rows = [r for r in read_rows(tmp_path / "tie") if r["cell"].startswith("sd")]
    ar = {r["example_id"]: r["output_ids"] for r in read_rows(tmp_path / "tie") if r["cell"] == "ar"}
    assert len(rows) == 2 and all(r["replayed"] for r in rows)
    assert all(r["output_ids"] == ar[r["example_id"]] for r in rows)  # the replay follows AR's text
    checked, unchecked = rows
    assert checked["replay_live_tie"] == TIE_AT and "replay_live_tie" not in unchecked

    runner = Runner(replayed_recipe(tmp_path), tmp_path / "mismatch")
    runner.models["target"] = ReplayableTarget(nudge=0.5)
    with pytest.raises(SpecbenchError, match="the replayed run differs from the live one"):
        runner.run()
