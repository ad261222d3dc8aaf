"""Output equivalence under load (issue 54, part 3): every load request's output token ids against the
engine's batch-1 AR output and specbench's AR output, classified by the batch-1 lossless audit's own
code (identical / a numerical tie / a mismatch), counted per level in load.csv and load_summary.csv,
shown in the table and flagged by a "!" line. The classes on a designed target whose two best tokens
tie exactly; whole sweeps through the stand-in vLLM server (tests/fixtures/stub_vllm), which can change
a request's last token when it is batched with others."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml
from test_numerics_lossless import A, B, DesignedTarget
from test_vllm_backend import _no_server_left, _recipe, stub_engine  # noqa: F401  (a fixture)
from typer.testing import CliRunner

from specbench.cli import app
from specbench.models.checksums import row_checksum
from specbench.pipeline.analysis.load_equivalence import COLUMNS, Auditor, Reference, column, flag, pooled
from specbench.pipeline.run.provenance import check_run
from specbench.pipeline.views.load_view import equivalence, equivalence_flags

PROMPT = [30]
ALONE = [31, 32, 33, A, A + 1, A + 2]  # the designed target's greedy output: A where A and B tie


def _record(index: int, output, error=None) -> dict:
    return {"index": index, "output_ids": output, "error": error}


def test_each_output_is_classified_as_the_lossless_audit_classifies_a_row():
    target = DesignedTarget()
    auditor = Auditor([PROMPT], {"engine": {0: Reference(ALONE, True)}}, target)
    records = [
        _record(0, ALONE),
        _record(1, [31, 32, 33, B, B + 1, B + 2]),  # the other of two tied tokens: a tie
        _record(2, [31, 32, 90, 91, 92, 93]),  # a token that is not among the two best: a mismatch
        _record(3, None, "HTTP/1.1 500"),  # failed: not checked
        _record(4, None),  # no token ids from the server: not checked
    ]
    counts = auditor.audit(records)
    engine = {
        count: counts[column("engine", count)] for count in ("checked", "identical", "ties", "mismatches")
    }
    assert engine == {"checked": 3, "identical": 1, "ties": 1, "mismatches": 1}
    assert counts[column("engine", "unclassified")] == 0
    assert all(math.isnan(counts[column("ours", count)]) for count in ("checked", "identical"))  # no run
    assert [r["equivalence"] for r in records] == [
        {"engine": "identical"},
        {"engine": "tie"},
        {"engine": "mismatch"},
        {},
        {},
    ]
    calls = target.calls
    auditor.audit([_record(5, [31, 32, 33, B, B + 1, B + 2])])  # the same divergence: classified once
    assert target.calls == calls
    # without specbench's copy of the server's weights a divergence stays unclassified
    blind = Auditor([PROMPT], {"engine": {0: Reference(ALONE, True)}})
    assert blind.classify("engine", 0, [31, 32, 33, B]) == "unclassified"
    assert blind.classify("engine", 0, ALONE) == "identical"


def test_a_run_row_cut_by_its_budget_covers_its_own_length_only():
    ours = Reference(ALONE[:4], covers_all=False)  # specbench's run stopped at 4 tokens, not at EOS
    auditor = Auditor(
        [PROMPT], {"ours": {0: ours}, "engine": {0: Reference(ALONE[:4], True)}}, DesignedTarget()
    )
    assert auditor.classify("ours", 0, ALONE) == "identical"  # the load's longer output agrees where both ran
    assert auditor.classify("engine", 0, ALONE) == "mismatch"  # the same budget: the whole output counts
    assert auditor.classify("ours", 0, ALONE[:3]) == "mismatch"  # ended early: no token where AR has A


def test_levels_pool_their_repeats_and_a_difference_beyond_a_tie_is_flagged():
    first = {name: 0 for name in COLUMNS} | {column("engine", "checked"): 4, column("engine", "identical"): 4}
    second = dict(first) | {column("engine", "identical"): 1, column("engine", "ties"): 2}
    second[column("engine", "mismatches")] = 1
    for row in (first, second):
        for count in ("checked", "identical", "ties", "mismatches", "unclassified"):
            row[column("ours", count)] = math.nan
    both = pooled([first, second])
    assert both[column("engine", "checked")] == 8 and both[column("engine", "identical")] == 5
    assert math.isnan(both[column("ours", "checked")])
    summary = [
        {"cell": "sd", "level": "x4", "concurrency": 4, **both},
        {"cell": "sd", "level": "x1", **first},
    ]
    summary[1]["concurrency"] = 1
    assert equivalence(summary[0], "engine") == "5/8 (2 ties, 1 mismatch)"
    assert equivalence(summary[0], "ours") == "not checked"
    assert flag(first, "sd x1") is None  # identical and ties are not flagged
    assert equivalence_flags(summary) == [
        "! sd x4: outputs under load are not the outputs alone: 1 of 8 differ from the engine's batch-1 AR "
        "(mismatches or unclassified divergences; load_requests.jsonl marks each request's class)"
    ]


# -- whole sweeps through the stand-in server ------------------------------------------------------


def _load(tmp_path, recipe: dict, *extra: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return CliRunner().invoke(app, ["load", str(path), "-o", str(tmp_path / "load"), *extra])


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_outputs_batched_with_others_are_checked_against_the_engine_alone(stub_engine, monkeypatch):  # noqa: F811
    tmp_path = stub_engine
    monkeypatch.setenv("STUB_SERVE_DIVERGE_IN_FLIGHT", "2")  # a request among others ends otherwise
    result = _load(tmp_path, _recipe(tmp_path, load={"concurrency": [1, 2], "requests": 4}))
    assert result.exit_code == 0, result.output
    message = " ".join(result.output.split())
    references = _lines(tmp_path / "load" / "load_reference.jsonl")
    assert [(r["target"], r["prompt"]) for r in references] == [("served", i) for i in range(3)]
    assert all(len(r["output_ids"]) == 24 and r["error"] is None for r in references)  # measured alone
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    alone, batched = rows[rows.concurrency == 1], rows[rows.concurrency == 2]
    assert (alone.eq_engine_checked == 4).all() and (alone.eq_engine_identical == 4).all()
    assert (batched.eq_engine_checked == 4).all() and (batched.eq_engine_mismatches >= 1).all()
    counted = batched[[column("engine", c) for c in ("identical", "ties", "mismatches", "unclassified")]]
    assert (counted.sum(axis=1) == 4).all()
    assert rows.eq_ours_checked.isna().all() and rows.eq_note.isna().all()
    assert "not checked against specbench's AR (ours): give --reference RUN_DIR" in message
    for cell in ("vllm-ar", "vllm-ngram"):
        assert f"! {cell} x2: outputs under load are not the outputs alone" in message
        assert f"! {cell} x1" not in message
    requests = _lines(tmp_path / "load" / "load_requests.jsonl")
    assert all(len(r["output_ids"]) == 24 for r in requests)
    assert {r["equivalence"]["engine"] for r in requests if r["level"] == "x1"} == {"identical"}
    assert "mismatch" in {r["equivalence"]["engine"] for r in requests if r["level"] == "x2"}
    summary = pd.read_csv(tmp_path / "load" / "load_summary.csv")
    assert (summary[summary.concurrency == 1].eq_engine_identical == 4).all()
    assert _no_server_left(tmp_path)


def test_a_run_of_the_recipe_is_specbench_s_reference(stub_engine):  # noqa: F811
    tmp_path = stub_engine
    recipe = _recipe(tmp_path, load={"concurrency": [1], "requests": 3})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    run = CliRunner().invoke(app, ["run", str(path), "-o", str(tmp_path / "run")])
    assert run.exit_code == 0, run.output
    ours = {
        r["example_id"]: r["output_ids"]
        for r in _lines(tmp_path / "run" / "examples.jsonl")
        if r["cell"] == "ar"
    }
    result = _load(tmp_path, recipe, "--reference", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    # the stand-in echoes the prompt: no output is the tiny model's own AR, each a mismatch, flagged
    assert (rows.eq_ours_checked == 3).all() and (rows.eq_ours_identical == 0).all()
    assert (rows.eq_ours_mismatches + rows.eq_ours_ties == 3).all() and len(ours) == 3
    assert (rows.eq_engine_identical == 3).all()
    assert "differ from specbench's AR" in " ".join(result.output.split())
    elsewhere = ["load", str(path), "-o", str(tmp_path / "load2"), "--reference", str(tmp_path / "nowhere")]
    missing = CliRunner().invoke(app, elsewhere)
    message = " ".join(missing.output.split())
    assert (
        missing.exit_code == 2
        and "nowhere: holds no examples.jsonl: not a specbench run directory" in message
    )


def test_sampled_outputs_are_not_checked(stub_engine):  # noqa: F811
    tmp_path = stub_engine
    recipe = _recipe(tmp_path, load={"concurrency": [1], "requests": 2}, **{"generation.temperature": 0.7})
    result = _load(tmp_path, recipe)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "load" / "load.csv")
    assert (rows.eq_note == "not checked: temperature > 0 (outputs are samples)").all()
    assert rows.eq_engine_checked.isna().all() and not (tmp_path / "load" / "load_reference.jsonl").exists()
    summary = pd.read_csv(tmp_path / "load" / "load_summary.csv").to_dict("records")
    assert {equivalence(row, kind) for row in summary for kind in ("engine", "ours")} == {"not checked"}


@pytest.mark.parametrize("kind", ["engine", "ours"])
def test_a_level_without_counts_reads_not_checked(kind):
    assert equivalence({column(kind, "checked"): math.nan}, kind) == "not checked"
    assert equivalence({}, kind) == "not checked"


def test_an_edited_or_stripped_reference_line_is_refused_on_resume(stub_engine):  # noqa: F811
    """load_reference.jsonl decides every output's class: each line carries its checksum, and a resume
    that would read an edited line, or one stripped of its checksum, stops in one line naming it."""
    tmp_path = stub_engine
    assert _load(tmp_path, _recipe(tmp_path, load={"concurrency": [1], "requests": 4})).exit_code == 0
    path = tmp_path / "load" / "load_reference.jsonl"
    original = path.read_text()
    lines = _lines(path)
    assert all(r["row_sha"] == row_checksum({k: v for k, v in r.items() if k != "row_sha"}) for r in lines)
    grown = _recipe(tmp_path, load={"concurrency": [1, 2], "requests": 4})
    for edit in ("edited", "stripped"):
        changed = [dict(r) for r in lines]
        if edit == "edited":
            changed[1]["output_ids"] = [7, *changed[1]["output_ids"][1:]]
        else:
            changed[1].pop("row_sha")
        path.write_text("".join(json.dumps(r) + "\n" for r in changed))
        result = _load(tmp_path, grown, "--resume")
        message = " ".join(result.output.split())
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        assert "load_reference.jsonl: line 2" in message
        assert ("edited after it was written" if edit == "edited" else "has no checksum") in message
        finding = check_run(tmp_path / "load")  # specbench check's verdict, before its table wraps it
        assert any("load_reference.jsonl: line 2" in line for line in finding.altered), finding.altered
        assert CliRunner().invoke(app, ["check", str(tmp_path / "load")]).exit_code == 1
    path.write_text(original)
    assert _load(tmp_path, grown, "--resume").exit_code == 0
    assert _no_server_left(tmp_path)
