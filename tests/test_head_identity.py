"""A published head replaced in place (same folder or Hub id, other weights) is told apart from the one a
run's rows were measured with: a resume refuses in one line before any row, ``specbench check`` names
the model, the folder and both digests; the same head resumes as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
import yaml
from counter_target import counter_target
from test_eagle3_layouts import head_tensors, recipe, tiny_target, write_head
from test_published_heads import eagle1_tensors, load, medusa_tensors, write_eagle1, write_medusa
from typer.testing import CliRunner

from specbench import sources
from specbench.cli import app
from specbench.models.hf import HFModel
from specbench.pipeline.run.head_identity import head_changes
from specbench.pipeline.run.provenance import check_run

pytestmark = pytest.mark.usefixtures("one_thread")


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]


def run(tmp_path: Path, limit: int, *more: str):
    args = ["run", str(tmp_path / "r.yaml"), "--output-dir", str(tmp_path / "out"), "--limit", str(limit)]
    return CliRunner().invoke(app, [*args, *more])


def test_a_head_replaced_in_place_stops_a_resume_and_is_named_by_check(tmp_path):
    target = tiny_target()
    tensors = head_tensors(target.model, range(0, 300, 5), seed=2)
    folder = write_head(tmp_path / "head", "eagle", target.model, tensors)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe(str(folder))))  # two examples
    out = tmp_path / "out"
    first = run(tmp_path, 1)
    assert first.exit_code == 0, first.output
    measured = rows_of(out)
    recorded = json.loads((out / "environment.json").read_text())["models"]["head"]["checkpoint"]["digest"]
    assert check_run(out).problems == []

    # the same folder, other random weights of the same shapes: the cells' keys cannot tell
    write_head(folder, "eagle", target.model, head_tensors(target.model, range(0, 300, 5), seed=7))
    today = sources.published_head(f"eagle3:{folder}")[1]
    assert today != recorded
    refused = run(tmp_path, 2, "--resume")
    line = refused.output.strip()
    assert refused.exit_code == 2 and "\n" not in line, refused.output
    assert f"model head (eagle3:{folder}) was measured with the head at {folder}" in line
    assert f"(digest {recorded}); the head there has digest {today}" in line
    assert "restore the head" in line and "new --output-dir" in line
    assert rows_of(out) == measured  # nothing measured with the other head
    finding = check_run(out)
    assert finding.stale and len(finding.problems) == 1, finding.problems
    assert all(named in finding.problems[0] for named in ("model head", str(folder), recorded, today))
    checked = CliRunner().invoke(app, ["check", str(out)])
    assert checked.exit_code == 1 and "stale" in checked.output

    # the head its rows were measured with, restored: the resume adds the missing rows
    write_head(folder, "eagle", target.model, tensors)
    assert sources.published_head(f"eagle3:{folder}")[1] == recorded
    resumed = run(tmp_path, 2, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(rows_of(out)) == 2 * len(measured) and check_run(out).problems == []


def test_a_hub_head_counts_by_the_copy_in_the_local_cache(tmp_path, monkeypatch, tiny_model):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    target = tiny_model("tiny-llama", 3, vocab_size=64, init_std=0.3, layers=8)
    repo = tmp_path / "hub" / "models--org--eagle3-head"

    def cache_snapshot(commit: str, seed: int) -> Path:
        folder = write_head(
            repo / "snapshots" / commit, "speculators", target, head_tensors(target, [0, 3, 9], seed=seed)
        )
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        return folder

    first = cache_snapshot("a" * 40, seed=1)
    drafter = load("eagle3:org/eagle3-head", HFModel(target, "target"))
    found, digest = sources.published_head("eagle3:org/eagle3-head")
    assert found == first and digest == drafter.checkpoint["digest"]
    environment = {"head": {"source": "eagle3:org/eagle3-head", "checkpoint": drafter.checkpoint}}
    assert head_changes(environment) == ([], [])
    newer = cache_snapshot("b" * 40, seed=2)  # the cache's main now another head
    (changed,), unknown = head_changes(environment)
    assert unknown == [] and changed.path == str(newer) and changed.recorded_path == str(first)
    assert f"eagle3:org/eagle3-head now at {newer} has digest" in changed.describe()


@pytest.mark.parametrize("kind", ["eagle1", "medusa-heads"])
def test_eagle1_and_medusa_heads_are_known_by_the_digest_their_loader_records(kind, tmp_path):
    weights = counter_target(64, layers=2)
    folder = tmp_path / "head"
    if kind == "eagle1":
        write_eagle1(folder, weights, eagle1_tensors(weights))
    else:
        write_medusa(folder, medusa_tensors(weights))
    source = f"{kind}:{folder}"
    drafter = load(source, HFModel(weights, "target"))
    environment = {"head": {"source": source, "checkpoint": drafter.checkpoint}}
    assert sources.published_head(source) == (folder, drafter.checkpoint["digest"])
    assert head_changes(environment) == ([], [])
    if kind == "eagle1":  # the same folder, other weights
        write_eagle1(folder, weights, eagle1_tensors(weights, seed=5))
    else:
        write_medusa(folder, medusa_tensors(weights, seed=5))
    (changed,), unknown = head_changes(environment)
    assert unknown == [] and changed.recorded == drafter.checkpoint["digest"] != changed.today
    shutil.rmtree(folder)  # not here to compare with: a note, not a problem
    changed, (unknown,) = head_changes(environment)
    assert changed == [] and unknown.startswith(f"model head ({source}): its head is not here")
