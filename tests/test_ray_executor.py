"""``specbench run --executor ray`` on a local two-CPU Ray cluster: the rows and cells.csv equal a local
run's, replayed cells get their AR rows, a worker killed mid-run loses and duplicates nothing, a failing
cell (an exception, or a worker that dies on every try) is reported while the others finish, and
``--resume`` skips finished rows.

Faults are injected into the workers by Ray's ``worker_process_setup_hook``: it wraps
``Measurer.measure`` in every worker process, and marker files in the cluster's fault folder say when
to kill the process (once) or which cell to fail.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from specbench.cli import app

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed: pip install 'specbench-llm[ray]'"
)

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "quickstart-tiny.yaml"
CELLS = 7  # ar, sd-lookup[k=2,4], sd-draft[k=2,4], hf-assisted, hf-lookup
EXAMPLES = 2
COUNTED = ["n", "generated_tokens", "target_forwards", "drafter_forwards", "forwards"]
COUNTED_PREFIXES = ("swi_", "accept", "draft_acceptance", "quality_", "lossless_")
runner = CliRunner()


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """A local Ray cluster (2 CPUs) whose workers obey the marker files in the returned folder:
    ``kill``: the first worker to measure an sd-draft example exits at once (and leaves ``killed``, so
    the retry succeeds); ``fail``: the cell whose id it holds raises; ``crash``: the worker measuring
    the cell whose id it holds exits, every time."""
    import ray

    folder = tmp_path_factory.mktemp("faults")

    def install_faults():  # runs in every worker process; pickled by value (a nested function)
        import os
        from pathlib import Path

        from specbench.pipeline.run.measure import Measurer

        real = Measurer.measure
        marks = Path(folder)

        def measure(self, dataset, cell, example, models):
            if (marks / "kill").exists() and cell.method_name == "sd-draft":
                try:
                    with open(marks / "killed", "x") as handle:  # only the first one dies
                        handle.write(str(os.getpid()))
                except FileExistsError:
                    pass
                else:
                    os._exit(1)
            if (marks / "fail").exists() and (marks / "fail").read_text() == cell.id:
                raise RuntimeError(f"injected failure in {cell.id}")
            if (marks / "crash").exists() and (marks / "crash").read_text() == cell.id:
                os._exit(1)
            return real(self, dataset, cell, example, models)

        Measurer.measure = measure

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        runtime_env={"worker_process_setup_hook": install_faults},
    )
    yield folder
    ray.shutdown()


def write_recipe(path: Path, *, replay: bool = False) -> Path:
    data = yaml.safe_load(TINY.read_text())
    data["datasets"][0]["limit"] = EXAMPLES
    data["generation"]["max_new_tokens"] = 8
    for method in data["methods"]:
        if replay and method["method"] == "speculative":
            method["replay"] = True
    path.write_text(yaml.safe_dump(data))
    return path


def run(recipe: Path, out: Path, *extra: str):
    return runner.invoke(app, ["run", str(recipe), "-o", str(out), *extra])


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]


def untimed(row: dict) -> dict:
    """What a row says apart from clocks and memory: outputs, counts, steps, quality, divergence."""
    timed = ("seconds", "prefill_seconds")
    forwards = {m: {k: v for k, v in c.items() if k not in timed} for m, c in row["forwards"].items()}
    keep = ("output_ids", "steps", "accepted_by_position", "quality", "first_divergence", "n_tokens")
    return {"forwards": forwards, **{k: row[k] for k in keep}}


def counted(out: Path) -> pd.DataFrame:
    cells = pd.read_csv(out / "cells.csv")
    keep = [c for c in cells.columns if c in ("dataset", "cell", *COUNTED) or c.startswith(COUNTED_PREFIXES)]
    return cells[keep].sort_values(["dataset", "cell"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("local")
    out = folder / "out"
    result = run(write_recipe(folder / "r.yaml"), out)
    assert result.exit_code == 0, result.output
    return out


def test_a_ray_run_gives_the_rows_and_cells_of_a_local_run(faults, local: Path, tmp_path: Path):
    out = tmp_path / "ray"
    result = run(write_recipe(tmp_path / "r.yaml"), out, "--executor", "ray")
    assert result.exit_code == 0, result.output
    mine, theirs = rows(out), rows(local)
    assert len(mine) == CELLS * EXAMPLES and len({r["key"] for r in mine}) == len(mine)
    assert {r["key"]: untimed(r) for r in mine} == {r["key"]: untimed(r) for r in theirs}
    assert all(r["first_divergence"] == -1 for r in mine if r["method"] != "autoregressive")
    pd.testing.assert_frame_equal(counted(out), counted(local))
    env = json.loads((out / "environment.json").read_text())
    assert env["models"]["target"]["dtype"] == "torch.float64"  # as the workers loaded it
    (session,) = env["sessions"]
    assert session["executor"]["name"] == "ray" and session["executor"]["workers"]


def test_replayed_cells_run_on_ray_with_the_ar_rows_shipped(faults, local: Path, tmp_path: Path):
    out = tmp_path / "replayed"
    result = run(write_recipe(tmp_path / "r.yaml", replay=True), out, "--executor", "ray")
    assert result.exit_code == 0, result.output
    live = {(r["cell"], r["example_id"]): untimed(r) for r in rows(local)}
    replayed = rows(out)
    assert len(replayed) == CELLS * EXAMPLES
    assert {r["cell"] for r in replayed if r.get("replayed")} == {
        "sd-lookup[k=2]",
        "sd-lookup[k=4]",
        "sd-draft[k=2]",
        "sd-draft[k=4]",
    }
    for row in replayed:  # the replay check also ran each example live on the worker
        assert untimed(row) == live[row["cell"], row["example_id"]], row["cell"]


def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(faults: Path, local: Path, tmp_path: Path):
    (faults / "kill").touch()
    try:
        out = tmp_path / "killed"
        result = run(write_recipe(tmp_path / "r.yaml"), out, "--executor", "ray")
    finally:
        (faults / "kill").unlink()
    assert (faults / "killed").exists(), "no worker was killed"
    assert result.exit_code == 0, result.output
    mine = rows(out)
    assert sorted(r["key"] for r in mine) == sorted(r["key"] for r in rows(local))  # each row once
    assert {r["key"]: untimed(r) for r in mine} == {r["key"]: untimed(r) for r in rows(local)}


@pytest.fixture(scope="module")
def failed(faults: Path, tmp_path_factory):
    """A Ray run in which the cell hf-lookup raises on its worker and hf-assisted kills its worker on
    every try: (recipe, results, CLI result)."""
    folder = tmp_path_factory.mktemp("failed")
    (faults / "fail").write_text("hf-lookup")
    (faults / "crash").write_text("hf-assisted")
    try:
        recipe = write_recipe(folder / "r.yaml")
        result = run(recipe, folder / "out", "--executor", "ray")
    finally:
        (faults / "fail").unlink()
        (faults / "crash").unlink()
    return recipe, folder / "out", result


def test_failing_cells_are_reported_and_the_others_finish(failed):
    _, out, result = failed
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "2 cell(s) failed" in output
    assert "hf-lookup on arithmetic/test: RuntimeError: injected failure in hf-lookup" in output
    assert "hf-assisted on arithmetic/test: its worker died 3 times" in output
    written = rows(out)
    assert len(written) == (CELLS - 2) * EXAMPLES
    assert not {"hf-lookup", "hf-assisted"} & {r["cell"] for r in written}
    assert len(pd.read_csv(out / "cells.csv")) == CELLS - 2


def test_a_resume_on_ray_runs_only_the_missing_rows(failed, local: Path, tmp_path: Path):
    recipe, failed_out, _ = failed
    out = tmp_path / "resumed"
    shutil.copytree(failed_out, out)
    before = (out / "examples.jsonl").read_text()
    result = run(recipe, out, "--executor", "ray", "--resume")
    assert result.exit_code == 0, result.output
    after = (out / "examples.jsonl").read_text()
    assert after.startswith(before)  # finished rows kept, byte for byte
    added = [json.loads(line) for line in after[len(before) :].splitlines()]
    assert {r["cell"] for r in added} == {"hf-lookup", "hf-assisted"} and len(added) == 2 * EXAMPLES
    assert {r["key"]: untimed(r) for r in rows(out)} == {r["key"]: untimed(r) for r in rows(local)}
    assert len(json.loads((out / "environment.json").read_text())["sessions"]) == 2
    again = run(recipe, out, "--executor", "ray", "--resume")  # nothing left: nothing runs
    assert again.exit_code == 0, again.output
    assert (out / "examples.jsonl").read_text() == after
