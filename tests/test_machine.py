"""A run directory is one machine's measurement: machines identified, recorded, never mixed silently."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import TWO_CELL_RECIPE
from typer.testing import CliRunner

from specbench.cli import app
from specbench.errors import SpecbenchError
from specbench.models import machine as machine_module
from specbench.models.machine import Machine, recorded_machine, session_machine, this_machine
from specbench.pipeline.records.results import machines_of
from specbench.pipeline.run.runner import Runner
from specbench.pipeline.views.report import display_frame, load_cells
from specbench.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

RECIPE = TWO_CELL_RECIPE.replace("name: two-cells", "name: machines")

OTHER = Machine("Other CPU (family 6, model 1)", ("avx2", "fma"), 2, 2, (), "2.13.0+cpu")


def _recipe(tmp_path: Path, text: str = RECIPE):
    path = tmp_path / "machines.yaml"
    path.write_text(text)
    return load_recipe(path)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]


@pytest.fixture
def measured(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    Runner(_recipe(tmp_path), out).run()
    return out


def _elsewhere(monkeypatch, machine: Machine = OTHER) -> None:
    """Make this process measure as ``machine`` (runs, environment.json and rows ask machine.py)."""
    for module in ("specbench.pipeline.run.measure", "specbench.pipeline.run.environment"):
        monkeypatch.setattr(f"{module}.this_machine", lambda: machine)


def test_this_machine_names_the_cpu_its_units_threads_and_torch():
    import torch

    here = this_machine()
    assert here.threads == torch.get_num_threads() and here.torch == torch.__version__
    assert here.cores >= 1 and here.cpu and len(here.id) == 12
    text = here.describe()
    assert here.cpu in text and f"{here.threads} threads" in text and here.matrix_units in text
    assert Machine.from_json(json.loads(json.dumps(here.to_json()))) == here  # survives environment.json


@pytest.mark.parametrize(
    "flags, units",
    [
        (("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"), "AMX"),
        (("avx2", "avx512f", "avx512_bf16"), "AVX512-BF16, no AMX"),
        (("avx2", "avx512f"), "AVX-512, no bf16"),
        (("avx2", "fma"), "AVX2 only"),
    ],
)
def test_the_matrix_units_follow_the_flags(flags, units):
    assert dataclasses.replace(OTHER, cpu_flags=flags).matrix_units == units


def test_directories_from_before_machines_were_recorded_are_identified_from_collect_env():
    """The committed runs: the quickstart on the Xeon with AMX, the heads run on an EPYC with
    AVX512-BF16 (read off lscpu's lines in PyTorch's environment report)."""
    quickstart = json.loads((ROOT / "results/quickstart/environment.json").read_text())
    heads = json.loads((ROOT / "results/heads/smollm2_heads/environment.json").read_text())
    xeon, epyc = recorded_machine(quickstart), recorded_machine(heads)
    assert xeon.cpu == "Intel(R) Xeon(R) Processor (family 6, model 167)" and xeon.matrix_units == "AMX"
    assert epyc.cpu == "AMD EPYC (family 25, model 17)" and epyc.matrix_units == "AVX512-BF16, no AMX"
    assert xeon.id != epyc.id and (xeon.threads, xeon.cores) == (2, 2)


def test_collect_env_and_the_live_reading_agree_on_the_same_cpu(monkeypatch):
    """A directory written before machines were recorded resumes on its own machine: its
    reconstructed identity equals the live one when lscpu and /proc/cpuinfo say the same."""
    import torch

    cpuinfo = {
        "model name": "AMD EPYC",
        "cpu family": "25",
        "model": "17",
        "flags": "fpu avx2 avx512f avx512_bf16",
    }
    monkeypatch.setattr(machine_module, "_cpuinfo", lambda: cpuinfo)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    live = this_machine()
    collect_env = (
        "CPU:\nModel name:   AMD EPYC\nCPU family:   25\nModel:   17\nCPU(s):   2\n"
        "Flags:   fpu avx2 avx512f avx512_bf16\n"
    )
    session = {"rows": 4, "collect_env": collect_env, "torch": torch.__version__, "cuda": None}
    old = session_machine(session, {"threads": torch.get_num_threads()})
    assert old == live and old.id == live.id


def test_a_run_records_its_machine_and_every_row_names_it(measured: Path):
    env = json.loads((measured / "environment.json").read_text())
    here = this_machine()
    assert env["machine"]["id"] == here.id and env["machine"]["described"] == here.describe()
    assert env["sessions"][0]["machine"]["id"] == here.id
    assert {row["machine"] for row in _rows(measured)} == {here.id}
    assert set(load_cells(measured)["machine"]) == {here.id}


def test_a_resume_on_another_machine_is_refused_naming_both(measured: Path, tmp_path: Path, monkeypatch):
    _elsewhere(monkeypatch)
    before = (measured / "examples.jsonl").read_bytes()
    with pytest.raises(SpecbenchError) as error:
        Runner(_recipe(tmp_path), measured, resume=True).run()
    text = str(error.value)
    assert "Other CPU" in text and "AVX2 only" in text and "was measured on" in text
    assert "--allow-other-machine" in text and "new --output-dir" in text
    assert (measured / "examples.jsonl").read_bytes() == before  # nothing written


def test_allow_other_machine_measures_every_row_again_and_keeps_the_machines_apart(
    measured: Path, tmp_path: Path, monkeypatch
):
    home = this_machine()
    first = _rows(measured)
    _elsewhere(monkeypatch)
    Runner(_recipe(tmp_path), measured, resume=True, allow_other_machine=True).run()
    rows = _rows(measured)
    assert len(rows) == 2 * len(first) and rows[: len(first)] == first  # nothing reused, nothing lost
    added = rows[len(first) :]
    assert {r["machine"] for r in added} == {OTHER.id}
    assert not {r["key"] for r in added} & {r["key"] for r in first}  # keyed apart
    assert [r["output_ids"] for r in added] == [r["output_ids"] for r in first]  # same outputs
    cells = load_cells(measured)
    assert sorted(cells["machine"]) == sorted([home.id, OTHER.id] * 2)
    for _, group in cells.groupby("machine"):  # each machine's speedup over its own AR cell
        ar = group[group["method"] == "autoregressive"]["tokens_per_s"].iloc[0]
        sd = group[group["method"] == "speculative"].iloc[0]
        assert sd["speedup_vs_ar"] == pytest.approx(sd["tokens_per_s"] / ar)
    assert list(machines_of(json.loads((measured / "environment.json").read_text()))) == [home.id, OTHER.id]
    assert set(display_frame(cells)["machine"]) == {home.id, OTHER.id}
    printed = runner.invoke(app, ["report", str(measured)]).output
    assert f"machine {home.id}" in printed and f"machine {OTHER.id}" in printed
    assert "Other CPU" in printed  # the note names both machines
    # resuming again on the other machine finds its rows done: nothing is added
    Runner(_recipe(tmp_path), measured, resume=True, allow_other_machine=True).run()
    assert len(_rows(measured)) == len(rows)


def test_a_model_resolving_to_another_dtype_is_refused(measured: Path, tmp_path: Path):
    changed = _recipe(tmp_path, RECIPE.replace("dtype: float64", "dtype: float32"))
    with pytest.raises(
        SpecbenchError,
        match=r"model target: was measured in float64 on the eager engine; this recipe runs it in float32",
    ):
        Runner(changed, measured, resume=True).run()


def test_report_and_compare_name_the_machine_of_each_run(measured: Path, tmp_path: Path, monkeypatch):
    printed = " ".join(runner.invoke(app, ["report", str(measured)]).output.split())
    assert f"run: measured on {this_machine().describe()}; target float64, eager" in printed
    # measured as another machine, so that its machine differs from the quickstart's on any host (the
    # quickstart's Xeon included)
    _elsewhere(monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    Runner(_recipe(tmp_path), elsewhere).run()
    refused = runner.invoke(app, ["compare", str(elsewhere), str(ROOT / "results/quickstart")])
    assert (
        refused.exit_code == 2
        and "is another experiment than in elsewhere: its models differ" in refused.output
    )
    compared = runner.invoke(
        app, ["compare", str(elsewhere), str(ROOT / "results/quickstart"), "--allow-incomparable"]
    )
    text = " ".join(compared.output.split())
    assert f"elsewhere: measured on {OTHER.describe()}" in text
    assert "quickstart: measured on Intel(R) Xeon(R) Processor (family 6, model 167), AMX" in text
    assert "smollm2 bfloat16 (auto: this CPU has AMX), eager" in text
    assert "The runs differ in machine, models, dtypes and engines, generation settings:" in text
    same = " ".join(runner.invoke(app, ["compare", str(measured), str(measured)]).output.split())
    assert "differ" not in same


def test_the_run_help_keeps_the_ray_extra_in_brackets():
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "250"})
    assert "specbench-llm[ray]" in result.output


def test_cells_that_run_transformers_generate_are_eager_and_never_compiled(tmp_path: Path, monkeypatch):
    """In a recipe with engine: compiled, HF's prompt lookup calls generate on the eager module: its
    cell compiles nothing, is charged no compile time and reports engine eager."""
    from specbench.pipeline.run.measure import CellModels, Measurer

    text = RECIPE.replace("seed: 0\n", "seed: 0\nengine: compiled\n").replace(
        "dtype: float64", "dtype: float32"
    )
    text += "  - {name: hf, method: hf_prompt_lookup, target: target, params: {k: 2}}\n"
    recipe = _recipe(tmp_path, text)
    cells = {cell.method_name: cell for cell in recipe.cells()}
    measurer = Measurer(recipe)
    assert [measurer.engine(cells[name]) for name in ("ar", "sd", "hf")] == ["compiled", "compiled", "eager"]

    class Compiled:
        def prepare(self, *args, **kwargs):
            raise AssertionError("an HF generate cell compiled its target")

    monkeypatch.setattr(CellModels, "compiled", lambda self: [Compiled()])
    measurer._prepare_engines(None, cells["hf"], CellModels(None, None))
    assert cells["hf"].id not in measurer.compile_pending


def test_others_share_is_the_cpu_time_other_processes_took():
    from specbench.models.machine import CpuTimes, others_share

    before = CpuTimes(busy=100.0, own=10.0, at=0.0)
    assert others_share(before, CpuTimes(busy=104.0, own=11.0, at=2.0), cores=2) == 0.75
    assert others_share(before, CpuTimes(busy=101.0, own=11.0, at=2.0), cores=2) == 0.0  # only ours
    assert others_share(before, CpuTimes(busy=120.0, own=10.0, at=1.0), cores=2) == 1.0  # clamped
    assert others_share(None, before) is None and others_share(before, before) is None


def test_a_busy_process_beside_us_is_seen_in_proc_stat():
    import subprocess
    import sys
    import time

    from specbench.models.machine import cpu_times, others_share

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        before = cpu_times()
        time.sleep(1.0)
        share = others_share(before, cpu_times())
    finally:
        spin.kill()
        spin.wait()
    assert share is not None and share >= 0.3  # one spinning core of this machine's


def test_cells_measured_on_a_loaded_machine_are_flagged(tmp_path: Path, monkeypatch):
    """Each row records the share of the CPU other processes took while it was measured; the report
    marks a cell above 10% and says its walltimes are not clean."""
    from specbench.models.machine import CpuTimes

    clock = iter(range(10_000))

    def loaded():  # every row: 1 s, both cores busy, ours 1 core-second, others 1 of 2 -> 50%
        t = next(clock)
        return CpuTimes(busy=2.0 * t, own=1.0 * t, at=float(t))

    monkeypatch.setattr("specbench.pipeline.run.measure.cpu_times", loaded)
    _elsewhere(monkeypatch, dataclasses.replace(OTHER, cores=2, threads=2))
    out = tmp_path / "loaded"
    Runner(_recipe(tmp_path), out).run()
    assert {row["others_cpu"] for row in _rows(out)} == {0.5}
    assert {row["cpu_headroom"] for row in _rows(out)} == {-1.0}  # 2 cores x 50% free - 2 threads
    cells = load_cells(out)
    assert list(cells["others_cpu"]) == [0.5, 0.5]
    printed = " ".join(runner.invoke(app, ["report", str(out)]).output.split())
    assert "50% !" in printed and "our threads competed with them for cores" in printed
    env = json.loads((out / "environment.json").read_text())
    assert set(env["sessions"][0]["load"]) == {"loadavg_at_start", "loadavg_now", "others_cpu"}
    # one thread on the core the others left free: the share is shown, the cell is not flagged
    _elsewhere(monkeypatch, dataclasses.replace(OTHER, cores=2, threads=1))
    clean = tmp_path / "one-thread"
    Runner(_recipe(tmp_path), clean).run()
    printed = " ".join(runner.invoke(app, ["report", str(clean)]).output.split())
    assert "50%" in printed and "50% !" not in printed and "competed" not in printed


def test_threads_are_set_recorded_and_part_of_the_machine(tmp_path: Path, measured: Path):
    import torch

    before = torch.get_num_threads()
    try:
        text = RECIPE.replace("seed: 0\n", "seed: 0\nthreads: 1\n")
        out = tmp_path / "one-thread"
        Runner(_recipe(tmp_path, text), out).run()
        assert torch.get_num_threads() == 1
        env = json.loads((out / "environment.json").read_text())
        assert env["machine"]["threads"] == 1 and "1 threads" in env["machine"]["described"]
        if before != 1:  # the directory measured with `before` threads is another machine now
            with pytest.raises(SpecbenchError, match=r"1 threads / \d+ cores"):
                Runner(_recipe(tmp_path, text), measured, resume=True).run()
    finally:
        torch.set_num_threads(before)
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "250"})
    assert "--threads" in result.output


def test_a_resume_with_a_recipe_that_drops_recorded_rows_is_refused_and_loses_nothing(
    measured: Path, tmp_path: Path
):
    """A run directory belongs to its recipe: another one (here sd with another k, another seed, or
    one more cell) is refused before a file is touched; --extend adds another recipe's cells only
    where it still produces every recorded row, since cells.csv is the recipe's cells."""
    files = {
        name: (measured / name).read_bytes()
        for name in ("examples.jsonl", "cells.csv", "resolved_recipe.yaml", "environment.json")
    }
    other_k = RECIPE.replace("params: {k: 2}", "params: {k: 3}")
    more = RECIPE + "  - {name: sd4, method: speculative, target: target, drafter: lookup, params: {k: 4}}\n"
    for text in (other_k, RECIPE.replace("seed: 0", "seed: 1"), more):
        with pytest.raises(SpecbenchError, match=r"belongs to another recipe than .* pass --extend"):
            Runner(_recipe(tmp_path, text), measured, resume=True).run()
        assert {name: (measured / name).read_bytes() for name in files} == files
    for text in (other_k, RECIPE.replace("seed: 0", "seed: 1")):
        with pytest.raises(
            SpecbenchError, match=r"holds \d+ row\(s\) that .* does not produce \(arithmetic/test "
        ):
            Runner(_recipe(tmp_path, text), measured, resume=True, extend=True).run()
        assert {name: (measured / name).read_bytes() for name in files} == files
    # a new name, description or thread count is the same experiment
    renamed = RECIPE.replace("name: machines", "name: renamed\ndescription: the same cells")
    Runner(_recipe(tmp_path, renamed), measured, resume=True).run()
    Runner(_recipe(tmp_path, more), measured, resume=True, extend=True).run()
    assert set(load_cells(measured)["cell"]) == {"ar", "sd", "sd4"}
    Runner(_recipe(tmp_path, more), measured, resume=True).run()  # the directory is more's now
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "250"})
    assert "--extend" in result.output


def test_a_row_edited_by_hand_is_named_and_a_resume_measures_it_again(measured: Path, tmp_path: Path):
    from specbench.pipeline.records.results import ExampleLog

    path = measured / "examples.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[2])
    row["walltime"] = row["walltime"] / 10  # a faster number, by hand
    lines[2] = json.dumps(row, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecbenchError, match=r"line 3: was edited after it was written"):
        ExampleLog(path)
    Runner(_recipe(tmp_path), measured, resume=True).run()
    assert "was edited after it was written" in (measured / "examples.rejected").read_text()
    rows = _rows(measured)
    assert len(rows) == len(lines) and all(
        r["key"] != row["key"] or r["walltime"] != row["walltime"] for r in rows
    )


def test_cells_csv_edited_by_hand_is_refused_by_readers_and_rewritten_by_a_resume(
    measured: Path, tmp_path: Path
):
    cells = measured / "cells.csv"
    written = cells.read_text()
    cells.write_text(written.replace(",autoregressive,", ",autoregressive,", 1) + "\n")
    result = runner.invoke(app, ["report", str(measured)])
    assert result.exit_code == 2 and "was edited after the run wrote it" in " ".join(result.output.split())
    Runner(_recipe(tmp_path), measured, resume=True).run()
    assert cells.read_text() == written
    assert runner.invoke(app, ["report", str(measured)]).exit_code == 0


def test_measured_on_says_when_a_run_computed_bfloat16_without_bf16_units(tmp_path: Path):
    from specbench.pipeline.records.results import measured_on

    reason = "set in the recipe; this CPU has no bfloat16 matrix units (AMX, AVX512-BF16)"
    models = {
        "target": {"dtype": "torch.bfloat16", "dtype_reason": reason, "engine": "eager"},
        "draft": {"dtype": "torch.bfloat16", "dtype_reason": "set in the recipe", "engine": "eager"},
    }
    (tmp_path / "environment.json").write_text(json.dumps({"models": models}))
    line = measured_on(tmp_path, "run")
    assert f"target bfloat16 ({reason}), eager" in line and "draft bfloat16, eager" in line
