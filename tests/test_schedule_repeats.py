"""The timing design: the interleaved order, repeats, and the turns of a conversation joined."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.decoding.generation import Generation
from specbench.errors import SpecbenchError
from specbench.pipeline.run.schedule import work_order

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "quickstart-tiny.yaml"
runner = CliRunner()


@dataclass(frozen=True)
class Thing:
    id: str
    method: str = "speculative"


@dataclass(frozen=True)
class Data:
    label: str
    examples: tuple


CELLS = [Thing("sd1"), Thing("ar", "autoregressive"), Thing("sd2"), Thing("sd3"), Thing("sd4")]
DATA = Data("d", tuple(Thing(f"e{i}") for i in range(6)))


def test_interleaved_runs_every_cell_per_example_ar_first_in_a_seeded_order():
    order = work_order([(DATA, CELLS)], lambda d, c, e: True, "interleaved", seed=0)
    blocks = [order[i : i + len(CELLS)] for i in range(0, len(order), len(CELLS))]
    assert len(blocks) == len(DATA.examples)
    for example, block in zip(DATA.examples, blocks, strict=True):
        assert {e for _, _, e in block} == {example}  # one example at a time
        assert block[0][1].id == "ar" and {c.id for _, c, _ in block} == {c.id for c in CELLS}
    permutations = {tuple(c.id for _, c, _ in block) for block in blocks}
    assert len(permutations) > 1  # shuffled per example, not one fixed order
    assert order == work_order([(DATA, CELLS)], lambda d, c, e: True, "interleaved", seed=0)
    assert order != work_order([(DATA, CELLS)], lambda d, c, e: True, "interleaved", seed=1)


def test_a_resume_keeps_the_order_of_what_is_left():
    full = work_order([(DATA, CELLS)], lambda d, c, e: True, "interleaved", seed=0)
    done = set(full[:7])
    left = work_order([(DATA, CELLS)], lambda d, c, e: (d, c, e) not in done, "interleaved", seed=0)
    assert left == full[7:]


def test_by_cell_runs_each_cell_over_all_examples_ar_first():
    order = work_order([(DATA, CELLS)], lambda d, c, e: e.id != "e2", "by-cell", seed=0)
    assert [c.id for _, c, _ in order[:5]] == ["ar"] * 5
    assert [(c.id, e.id) for _, c, e in order[5:10]] == [("sd1", f"e{i}") for i in (0, 1, 3, 4, 5)]
    with pytest.raises(ValueError):
        work_order([(DATA, CELLS)], lambda d, c, e: True, "random", seed=0)


def test_turns_join_into_one_generation():
    first = Generation([1, 2, 3], 1.0, 0.25, [(2, 2)], {"t": {"forward_passes": 1, "seconds": 0.5}})
    second = Generation(
        [4, 5], 2.0, 0.5, [(2, 0), (2, 1)], {"t": {"forward_passes": 2, "seconds": 1.5}}, stopped_by_eos=True
    )
    joined = Generation.joined([first, second])
    assert joined.tokens == [1, 2, 3, 4, 5] and joined.walltime == 3.0 and joined.ttft == 0.25
    assert joined.steps == [(2, 2), (2, 0), (2, 1)] and joined.stopped_by_eos
    assert joined.forwards == {"t": {"forward_passes": 3, "seconds": 2.0}} and joined.deferrals is None
    assert joined.accepted_by_position() == [(3, 2), (3, 1)]


@pytest.fixture(scope="module")
def repeated(tmp_path_factory) -> Path:
    recipe = tmp_path_factory.mktemp("repeats") / "r.yaml"
    recipe.write_text(TINY.read_text().replace("limit: 4", "limit: 2"))
    out = recipe.parent / "out"
    result = runner.invoke(app, ["run", str(recipe), "-o", str(out), "--repeats", "3"])
    assert result.exit_code == 0, result.output
    return out


def test_repeats_keep_every_measurement_and_their_mean(repeated: Path):
    rows = [json.loads(line) for line in (repeated / "examples.jsonl").read_text().splitlines()]
    for row in rows:  # nothing is replayed here, so every row is timed
        assert len(row["walltime_repeats"]) == 3 and len(row["ttft_repeats"]) == 3
        assert row["walltime"] == pytest.approx(sum(row["walltime_repeats"]) / 3)
        assert row["peak_memory_mb"] > 0
        target = row["forwards"][row["target"]]  # its clocks are means too, the prefill's apart
        assert 0 < target["prefill_seconds"] < target["seconds"] and target["prefill_passes"] == 1
    cells = pd.read_csv(repeated / "cells.csv")
    for pass_ms, decode_pass_ms in zip(cells["pass_ms"], cells["decode_pass_ms"], strict=True):
        assert set(json.loads(decode_pass_ms)) == set(json.loads(pass_ms))
    env = json.loads((repeated / "environment.json").read_text())
    assert env["sessions"][0]["rows"] == len(rows)


def test_repeats_enter_the_row_key(repeated: Path, tmp_path: Path):
    once = tmp_path / "once"
    recipe = repeated.parent / "r.yaml"
    assert runner.invoke(app, ["run", str(recipe), "-o", str(once)]).exit_code == 0
    keys = {json.loads(line)["key"] for line in (once / "examples.jsonl").read_text().splitlines()}
    repeated_keys = {
        json.loads(line)["key"] for line in (repeated / "examples.jsonl").read_text().splitlines()
    }
    assert keys.isdisjoint(repeated_keys)  # a run with repeats: 3 never reuses rows measured once


def test_a_repeat_that_differs_stops_the_run(tmp_path: Path, monkeypatch):
    from specbench.decoding import speculative

    real = speculative.generate
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        generation = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:  # the second measurement of the first row comes out different
            generation.tokens = generation.tokens[:-1]
        return generation

    monkeypatch.setattr(speculative, "generate", flaky)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        TINY.read_text()
        .replace("limit: 4", "limit: 1")
        .replace("warmup: 1", "warmup: 0")
        .replace("grid: {k: [2, 4]}", "grid: {k: [2]}")
    )
    with pytest.raises(
        SpecbenchError, match=r"repeats: repeat 2 of cell sd-\w+\[k=2\] .* differs from the first"
    ):
        from specbench.pipeline.run.runner import Runner
        from specbench.recipe import load_recipe

        loaded = load_recipe(recipe).model_copy(update={"repeats": 2})
        Runner(loaded, tmp_path / "out").run()


def test_a_multi_turn_question_is_one_row_with_its_category(tmp_path: Path):
    questions = tmp_path / "question.jsonl"
    rows = [
        {"question_id": 81, "category": "writing", "turns": ["Say hi.", "Now say it twice."]},
        {"question_id": 101, "category": "translation", "turns": ["Translate: Hund"]},
    ]
    questions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        TINY.read_text()
        .replace("task: arithmetic", f"task: spec_bench\n    data_files: {questions}")
        .replace("max_new_tokens: 24", "max_new_tokens: 6")
    )
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(recipe), "-o", str(out)])
    assert result.exit_code == 0, result.output
    written = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    ar = {r["example_id"]: r for r in written if r["cell"] == "ar"}
    assert {r["category"] for r in ar.values()} == {"writing", "translation"}
    first, single = ar["spec_bench/81"], ar["spec_bench/101"]
    assert first["n_tokens"] == 12 and first["forwards"]["target"]["forward_passes"] == 12  # two turns
    assert single["n_tokens"] == 6
    for row in written:  # every lossless cell follows the target through both turns
        if row["first_divergence"] is not None:
            assert row["first_divergence"] == -1, row["cell"]
    assert len([r for r in written if r["cell"] == "sd-draft[k=2]"]) == 2  # one row per question

    replayed = tmp_path / "replayed.yaml"
    replayed.write_text(
        recipe.read_text().replace("    grid: {k: [2, 4]}\n", "    grid: {k: [2, 4]}\n    replay: true\n", 1)
    )
    result = runner.invoke(app, ["run", str(replayed), "-o", str(tmp_path / "out2")])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "has 2 turns, and replay follows one AR output per prompt" in message


def test_cells_csv_gives_the_run_to_run_spread_of_repeats(repeated: Path):
    import pandas as pd

    cells = pd.read_csv(repeated / "cells.csv")
    rows = [json.loads(line) for line in (repeated / "examples.jsonl").read_text().splitlines()]
    ar = cells[cells.cell == "ar"].iloc[0]
    ar_rows = [r for r in rows if r["cell"] == "ar"]
    tokens = sum(r["n_tokens"] for r in ar_rows)
    rates = [tokens / sum(r["walltime_repeats"][i] for r in ar_rows) for i in range(3)]
    mean = sum(rates) / 3
    std = (sum((x - mean) ** 2 for x in rates) / 2) ** 0.5
    assert ar.repeats == 3
    assert ar.tokens_per_s_repeat_mean == pytest.approx(mean)
    assert ar.tokens_per_s_repeat_std == pytest.approx(std)
    assert ar.peak_memory_mb == max(r["peak_memory_mb"] for r in ar_rows)


def test_environment_samples_the_gpu_at_each_cells_start_and_end(tmp_path: Path, monkeypatch):
    fake = tmp_path / "bin" / "nvidia-smi"  # what nvidia-smi prints for two GPUs, one without power
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '1980, 2619, 312.50, 54'\necho '1410, 2619, [N/A], 40'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{__import__('os').environ['PATH']}")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(TINY.read_text().replace("limit: 4", "limit: 2"))
    out = tmp_path / "out"
    assert runner.invoke(app, ["run", str(recipe), "-o", str(out)]).exit_code == 0
    (session,) = json.loads((out / "environment.json").read_text())["sessions"]
    cells = {row["cell"] for row in map(json.loads, (out / "examples.jsonl").read_text().splitlines())}
    samples = session["gpu_samples"]
    assert sorted((s["cell"], s["at"]) for s in samples) == sorted(
        (c, at) for c in cells for at in ("start", "end")
    )
    assert samples[0]["gpus"] == [
        {"clocks.sm": 1980.0, "clocks.mem": 2619.0, "power.draw": 312.5, "temperature.gpu": 54.0},
        {"clocks.sm": 1410.0, "clocks.mem": 2619.0, "power.draw": "[N/A]", "temperature.gpu": 40.0},
    ]
    assert "PyTorch version" in session["collect_env"]
