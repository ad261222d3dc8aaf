"""Target replay and ``specbench tune``: a replayed cell's output, steps and every model's counts equal
a live cell's, a replayed grid costs the target one autoregressive run (plus the checked examples),
the replay check stops a run at the first difference, and successive halving keeps the better half.

Tiny random-init float64 models. The recipe is recipes/cs_drafting/quickstart-tiny.yaml (d1 is a twin
of the target, so the target accepts something) with a six-cell K grid.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.decoding import autoregressive, cascade_drafting, speculative
from specbench.decoding.generation import first_difference
from specbench.drafters.maxgram import MaxGramDrafter
from specbench.errors import SpecbenchError
from specbench.models.base import ModelDrafter
from specbench.models.hf import HFModel
from specbench.models.replay import ReplayError, ReplayTarget
from specbench.pipeline.analysis.summary import summarise_cell
from specbench.pipeline.experiments.tune import BEST_YAML, TUNE_CSV, tune
from specbench.pipeline.run.runner import Runner
from specbench.pipeline.views.report import render
from specbench.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[1]
TINY_CASCADE = ROOT / "recipes" / "cs_drafting" / "quickstart-tiny.yaml"
VOCAB = 16
F64 = torch.float64
GRID = [
    [[1, 1], [0, 1]],
    [[2, 4], [0, 3]],
    [[1, 5], [0, 2]],
    [[3, 6], [0, 2]],
    [[4, 8], [0, 3]],
    [[2, 2], [0, 4]],
]
EXAMPLES = 8
SWI_COLUMNS = ["swi_ms", "swi_pw", "swi_ms_mean", "swi_pw_mean", "acceptance_length", "draft_acceptance_rate"]
COUNT_COLUMNS = ["n", "generated_tokens", "target_forwards", "drafter_forwards", "forwards"]

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# ReplayTarget directly, through the decoding functions


def noisy_copy(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The target's weights plus noise: a drafter the target partly agrees with."""
    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.numel() > 1:
                param.add_(0.08 * param.std() * torch.randn(param.shape, generator=gen, dtype=F64))
    return model


def prompt_for(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (2 + seed % 3,), generator=gen).repeat(5)[: 3 + seed % 7]


def assert_same(replayed, live, what: str) -> None:
    assert replayed.tokens == live.tokens, what
    assert replayed.steps == live.steps and replayed.inner_steps == live.inner_steps, what
    for name, counts in live.forwards.items():
        mine = replayed.forwards[name]
        assert [mine[c] for c in ("forward_passes", "tokens_scored", "encoder_passes")] == [
            counts[c] for c in ("forward_passes", "tokens_scored", "encoder_passes")
        ], f"{what}: {name}"
    assert first_difference(replayed, live) is None


@pytest.mark.parametrize("kind", ["tiny-llama", "tiny-t5"])
def test_replayed_sd_and_cascade_equal_live(kind, tiny_model):
    """SD (lenience 1) and CS Drafting (inner lenience 2) with a ReplayTarget: output, steps, inner
    reviews and every model's counts as live, also when the output ends with an EOS that a draft runs
    past (the one review that needs the target then runs it: ``live_passes``)."""
    target_weights = tiny_model(kind, 0, vocab_size=VOCAB)
    d1, d2 = noisy_copy(target_weights, 1), tiny_model(kind, 5, vocab_size=VOCAB)
    live = HFModel(target_weights, "target")
    max_new, fallbacks, eos_runs = 16, 0, 0
    for seed in range(5):
        prompt = prompt_for(seed)
        free = autoregressive.generate(live, prompt, max_new_tokens=max_new)
        for eos in (None, free.tokens[4 + seed % 3]):  # the AR output runs to max_new_tokens, or to an EOS
            ar = autoregressive.generate(live, prompt, max_new_tokens=max_new, eos_token_id=eos)
            eos_runs += ar.stopped_by_eos
            for k in (1, 3, 5):

                def sd(target, k=k, eos=eos, prompt=prompt):
                    drafter = ModelDrafter(HFModel(d1, "d1"))
                    return speculative.generate(
                        target, drafter, prompt, k=k, max_new_tokens=max_new, eos_token_id=eos
                    )

                replay = ReplayTarget(live, ar.tokens, ar.stopped_by_eos)
                assert_same(sd(replay), sd(live), f"SD seed={seed} k={k} eos={eos}")
                fallbacks += replay.live_passes
            for K in ([[2, 4], [0, 3]], [[1, 5], [0, 2]]):

                def cs(target, K=K, eos=eos, prompt=prompt):
                    drafters = [HFModel(d1, "d1"), HFModel(d2, "d2")]
                    return cascade_drafting.generate(
                        target,
                        drafters,
                        MaxGramDrafter("mag"),
                        prompt,
                        K=K,
                        max_new_tokens=max_new,
                        eos_token_id=eos,
                        lenience=2.0,
                    )

                replay = ReplayTarget(live, ar.tokens, ar.stopped_by_eos)
                assert_same(cs(replay), cs(live), f"CS seed={seed} K={K} eos={eos}")
                fallbacks += replay.live_passes
    assert eos_runs == 5 and fallbacks > 0, "no draft ran past an EOS: the fallback went untested"


def test_replay_target_counts_and_refuses_what_lossless_methods_never_ask(tiny_model):
    live = HFModel(tiny_model("tiny-llama", 0, vocab_size=VOCAB), "target")
    prompt = prompt_for(2)
    ar = autoregressive.generate(live, prompt, max_new_tokens=8)
    replay = ReplayTarget(live, ar.tokens, stopped_by_eos=False)
    assert (replay.name, replay.vocab_size, replay.num_parameters) == ("target", VOCAB, live.num_parameters)
    out = torch.tensor(ar.tokens)
    # a scripted review sequence: the same calls on both, the same counts after each
    live.start(prompt)
    replay.start(prompt)
    live.counter.reset()
    for length, n, rollback in ((3, 3, 1), (5, 3, 4), (7, 3, 6), (7, 0, None)):
        expected = live.score(out[:length], n).logits
        logits = replay.score(out[:length], n).logits
        assert logits.shape == expected.shape and logits.dtype == expected.dtype
        assert torch.equal(logits.argmax(-1), out[length - n : length + 1])  # y at the positions scored
        assert replay.counter.forward_passes == live.counter.forward_passes
        assert replay.counter.tokens_scored == live.counter.tokens_scored
        if rollback is not None:
            live.rollback(rollback)
            replay.rollback(rollback)
    wrong = out.clone()
    wrong[1] = (wrong[1] + 1) % VOCAB
    replay.start(prompt)
    with pytest.raises(ReplayError, match="position 1 .* not lossless"):
        replay.score(wrong[:4], 2)  # a committed prefix that is not the target's output
    replay.start(prompt)
    with pytest.raises(ReplayError, match="past the target's 8-token output"):
        replay.score(out[:8], 1)  # position 8 of an output that stopped at max_new_tokens = 8


# ---------------------------------------------------------------------------------------------
# through the runner


def recipe_data(*, replay: bool, grid=GRID) -> dict:
    data = yaml.safe_load(TINY_CASCADE.read_text())
    data["datasets"][0]["limit"] = EXAMPLES
    cascade = data["methods"][1]
    cascade["grid"] = {"K": grid}
    if replay:
        cascade["replay"] = True
    return data


def load(data: dict, path: Path):
    return parse_recipe(data, path)


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """The six-cell grid run live on all examples: rows and cells.csv, the reference of the tests below."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("live")
        Runner(load(recipe_data(replay=False), out / "live.yaml"), out).run()
    finally:
        torch.set_num_threads(before)
    rows = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    return rows, pd.read_csv(out / "cells.csv").set_index("cell")


@pytest.fixture
def target_passes(monkeypatch):
    """Counts the forward passes the real target runs (any HFModel named "target")."""
    calls = {"target": 0}
    score = HFModel.score

    def counted(self, tokens, n_candidates):
        calls[self.name] = calls.get(self.name, 0) + 1
        return score(self, tokens, n_candidates)

    monkeypatch.setattr(HFModel, "score", counted)
    return calls


def test_replayed_grid_costs_one_target_run_and_equals_live(live_run, target_passes, tmp_path):
    live_rows, live_cells = live_run
    recipe = load(recipe_data(replay=True), tmp_path / "replay.yaml")
    assert recipe.replay_check == 2
    Runner(recipe, tmp_path).run()
    rows = [json.loads(line) for line in (tmp_path / "examples.jsonl").read_text().splitlines()]
    cells = pd.read_csv(tmp_path / "cells.csv").set_index("cell")

    # the target ran for the AR cell (its warm-up example too) and the checked examples only
    ar = [r for r in rows if r["method"] == "autoregressive"]
    replayed = [r for r in rows if r["method"] == "cs_drafting"]
    assert len(ar) == EXAMPLES and len(replayed) == EXAMPLES * len(GRID)
    first_two = {r["example_id"] for r in ar[:2]}
    expected = ar[0]["forwards"]["target"]["forward_passes"]  # warm-up
    expected += sum(r["forwards"]["target"]["forward_passes"] for r in ar)
    expected += sum(
        r["forwards"]["target"]["forward_passes"] for r in replayed if r["example_id"] in first_two
    )
    expected += sum(r["replay_live_passes"] for r in replayed)
    assert target_passes["target"] == expected
    live_total = sum(r["forwards"]["target"]["forward_passes"] for r in live_rows)
    assert target_passes["target"] < 0.6 * live_total  # a live grid runs the target once per cell

    # SWI and every count as live; only the keys and the time differ
    assert list(cells.index) == list(live_cells.index)
    for column in SWI_COLUMNS:  # NaN where both are (AR drafts nothing)
        pd.testing.assert_series_equal(cells[column], live_cells[column], rtol=1e-12)
    for column in COUNT_COLUMNS:
        assert cells[column].tolist() == live_cells[column].tolist(), column
    live_by = {(r["cell"], r["example_id"]): r for r in live_rows}
    for r in replayed:
        twin = live_by[r["cell"], r["example_id"]]
        assert r["replayed"] is True and r["key"] != twin["key"]
        assert (r["output_ids"], r["steps"], r["inner_steps"]) == (
            twin["output_ids"],
            twin["steps"],
            twin["inner_steps"],
        )
        assert math.isnan(r["walltime"]) and r["walltime_replayed"] > 0 and math.isnan(r["ttft"])
        assert math.isnan(r["forwards"]["target"]["seconds"]) and r["first_divergence"] == -1
    assert all("replayed" not in r for r in ar)
    cascade = cells[cells["method"] == "cs_drafting"]
    assert cascade["tokens_per_s"].isna().all() and cascade["speedup_vs_ar"].isna().all()
    assert cells.loc["ar", "speedup_vs_ar"] == pytest.approx(1.0)
    report = render(tmp_path, "csv")  # NaN times print as blanks, not errors
    assert "[[3,6],[0,2]]" in report


def test_replay_check_stops_at_the_first_difference(monkeypatch, tmp_path):
    score = ReplayTarget.score

    def drops_a_pass(self, tokens, n_candidates):  # the second review of every request goes uncounted
        logits = score(self, tokens, n_candidates)
        if self.counter.forward_passes == 2 and not getattr(self, "dropped", False):
            self.counter.forward_passes, self.dropped = 1, True
        return logits

    monkeypatch.setattr(ReplayTarget, "score", drops_a_pass)
    recipe = load(recipe_data(replay=True, grid=GRID[:2]), tmp_path / "r.yaml")
    with pytest.raises(SpecbenchError) as caught:
        Runner(recipe, tmp_path / "out").run()
    message = str(caught.value)
    assert "\n" not in message and " — fix: " in message
    # the first cascade cell the (interleaved) schedule reaches
    assert message.startswith(f"{tmp_path / 'r.yaml'}: methods.cs.replay: cell cs[K="), message
    counts = re.search(
        r"the replayed run differs from the live one, target forward_passes: replayed (\d+), live (\d+)",
        message,
    )
    assert counts and int(counts[1]) == int(counts[2]) - 1, message
    rows = [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == {"autoregressive"}  # the mismatched row was never written


# ---------------------------------------------------------------------------------------------
# recipes


def method_with_replay(data: dict, **fields) -> dict:
    data = copy.deepcopy(data)
    data["methods"][1] |= fields
    return data


BAD_REPLAYS = {
    "sampling": (
        lambda d: d | {"generation": {"max_new_tokens": 24, "temperature": 0.7}},
        "replay needs greedy decoding, but generation.temperature is 0.7",
    ),
    "hf method": (
        lambda d: method_with_replay(
            d,
            method="hf_assisted",
            drafter="d2",
            drafters=None,
            params={"k": 2},
            grid={},
        ),
        "method 'hf_assisted' cannot replay the target: HF generate calls the model itself",
    ),
    "no AR cell": (
        lambda d: d | {"methods": d["methods"][1:]},
        "replay reuses the autoregressive output of 'target', but no method produces it",
    ),
    "lenient SD": (
        lambda d: method_with_replay(
            d, method="speculative", drafter="d2", drafters=None, params={"k": 2}, grid={"lenience": [1, 3]}
        ),
        "speculative with k=2, lenience=3.0 is not lossless",
    ),
    "AR itself": (
        lambda d: d | {"methods": [d["methods"][0] | {"replay": True}, d["methods"][1]]},
        "the autoregressive output is what other cells replay",
    ),
}


@pytest.mark.parametrize("case", list(BAD_REPLAYS))
def test_bad_replay_is_one_line_naming_field_and_fix(case):
    edit, problem = BAD_REPLAYS[case]
    with pytest.raises(SpecbenchError) as caught:
        parse_recipe(edit(recipe_data(replay=True)), "bad.yaml")
    message = str(caught.value)
    index = 0 if case in ("no AR cell", "AR itself") else 1  # the method named in the message
    assert "\n" not in message and " — fix: " in message, message
    assert message.startswith(f"bad.yaml: methods[{index}].replay: "), message
    assert problem in message, message


def test_replay_is_part_of_the_fingerprint_only_where_set(tmp_path):
    plain = load(recipe_data(replay=False), tmp_path / "a.yaml")
    replayed = load(recipe_data(replay=True), tmp_path / "a.yaml")
    before = {c.id: c.fingerprint(plain) for c in plain.cells()}
    after = {c.id: c.fingerprint(replayed) for c in replayed.cells()}
    assert before["ar"] == after["ar"]
    assert all(before[cell] != after[cell] for cell in before if cell != "ar")
    again = parse_recipe(replayed.resolved(), tmp_path / "resolved.yaml")
    assert [c.fingerprint(again) for c in again.cells()] == list(after.values())
    checked_less = load(recipe_data(replay=True) | {"replay_check": 0}, tmp_path / "a.yaml")
    assert {c.id: c.fingerprint(checked_less) for c in checked_less.cells()} == after


# ---------------------------------------------------------------------------------------------
# tune


def test_tune_halves_to_the_best_cell(live_run, target_passes, tmp_path):
    """Rounds on 2, 4, 8 examples with 6, 3, 2 cells; each keeps the better half by SWI (PW); every
    evaluation equals the live grid's SWI on the same examples, and the winner is the live grid's best
    on all examples (checked to be in the top half of every round, so halving must find it)."""
    live_rows, live_cells = live_run
    recipe = load(recipe_data(replay=False), tmp_path / "tune.yaml")
    out = tmp_path / "tune"
    frame, best = tune(recipe, out, table="pw", start=2)
    table = pd.read_csv(out / TUNE_CSV)
    assert table[["round", "examples"]].drop_duplicates().values.tolist() == [[1, 2], [2, 4], [3, 8]]
    assert table.groupby("round").size().tolist() == [6, 3, 2] and table["replayed"].all()

    order = [r["example_id"] for r in live_rows if r["cell"] == "ar"]
    for rnd, group in table.groupby("round"):
        for record in group.itertuples():  # SWI on the first `examples` examples, from the live rows
            mine = [
                r
                for r in live_rows
                if r["cell"] == record.cell and r["example_id"] in order[: record.examples]
            ]
            assert record.swi_pw == pytest.approx(summarise_cell(mine)["swi_pw"], rel=1e-12)
            assert record.swi_ms == pytest.approx(summarise_cell(mine)["swi_ms"], rel=1e-12)
        keep = 1 if rnd == 3 else math.ceil(len(group) / 2)
        assert set(group[group["kept"]]["cell"]) == set(group.nlargest(keep, "swi_pw")["cell"])
        if rnd < 3:
            assert set(table[table["round"] == rnd + 1]["cell"]) == set(group[group["kept"]]["cell"])

    winner = live_cells[live_cells["method"] == "cs_drafting"]["swi_pw"].idxmax()
    assert winner in set(table[table["round"] == 3]["cell"])  # the premise: halving cannot miss it
    chosen = yaml.safe_load((out / BEST_YAML).read_text())["cs"]["arithmetic/test"]
    assert chosen["cell"] == winner == best["cs"]["arithmetic/test"]["cell"]
    assert chosen["params"] == {"lenience": 2.0, "K": json.loads(winner[len("cs[K=") : -1])}
    assert chosen["swi_pw"] == pytest.approx(live_cells.loc[winner, "swi_pw"], abs=1e-4)
    assert chosen["examples"] == EXAMPLES and chosen["rounds"] == 3

    # the search ran the target for AR on all examples and for two checked examples of each cell only
    rows = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    ar = [r for r in rows if r["method"] == "autoregressive"]
    checked = {r["example_id"] for r in ar[:2]}
    expected = sum(r["forwards"]["target"]["forward_passes"] for r in ar)
    expected += sum(
        r["forwards"]["target"]["forward_passes"]
        for r in rows
        if r.get("replayed") and r["example_id"] in checked
    )
    assert target_passes["target"] == expected + sum(r.get("replay_live_passes", 0) for r in rows)
    cells = pd.read_csv(out / "cells.csv").set_index("cell")
    assert cells.loc[winner, "n"] == EXAMPLES and cells.loc["ar", "n"] == EXAMPLES

    # the tune directory resumes like any run: nothing runs again, the same choice comes out
    with pytest.raises(SpecbenchError, match="--resume"):
        tune(recipe, out, table="pw", start=2)
    target_passes["target"] = 0
    again, _ = tune(recipe, out, table="pw", start=2, resume=True)
    assert target_passes["target"] == 0 and again.equals(frame)


def test_tune_command_line(tmp_path):
    runner = CliRunner()
    help_text = " ".join(runner.invoke(app, ["tune", "--help"]).output.split())
    assert "K = [[k11, k12], [0, k22]]" in help_text and "lenience: [1, 3, 5]" in help_text
    data = recipe_data(replay=False, grid=GRID[:2])
    data["datasets"][0]["limit"] = 2
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    result = runner.invoke(app, ["tune", str(path), "--start", "1", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert "best cs on arithmetic/test" in result.output
    assert (out / TUNE_CSV).is_file() and (out / "cells.csv").is_file()
    assert yaml.safe_load((out / BEST_YAML).read_text())["cs"]["arithmetic/test"]["cell"] in result.output
    bad = runner.invoke(app, ["tune", str(path), "--table", "xx", "--output-dir", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "--table" in bad.output and "fix:" in bad.output
