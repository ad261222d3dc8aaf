"""What memory does to a timed row (issue 58, part 3): pages read back from disk recorded per row and
counted per cell, rows their held-out prediction does not explain counted, both named under the report,
and the plan's bill of models and kept-alive engines against the machine's memory."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from specbench.models import memory_pressure
from specbench.models.memory_pressure import MemorySnapshot
from specbench.pipeline.analysis import prediction
from specbench.pipeline.planning.host_memory import ENGINE_RUNTIME, frozen_passes, host_memory
from specbench.pipeline.views.notes import disturbed_note
from specbench.recipe import load_recipe
from specbench.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]
PAGES_64_MIB = int(64 / memory_pressure.PAGE_MB)


def test_a_row_counts_its_own_and_its_engines_faults_and_the_machines_swap_ins():
    before = MemorySnapshot(major_faults=100, swapped_in=1000, available_mb=8000.0)
    after = MemorySnapshot(major_faults=130, swapped_in=1256, available_mb=7000.4)
    fields = memory_pressure.row_fields(before, after, engine_faults=20)
    assert fields == {
        "major_faults": 50,
        "swap_in_mb": round(256 * memory_pressure.PAGE_MB, 1),
        "available_memory_mb": 7000,
    }
    blind = memory_pressure.row_fields(MemorySnapshot(5, None, None), MemorySnapshot(7, None, None))
    assert blind == {"major_faults": 2}  # no /proc: only what getrusage tells


def test_a_row_is_disturbed_from_64_mib_read_back_by_faults_or_swap():
    assert not memory_pressure.disturbed({"major_faults": PAGES_64_MIB - 1})
    assert memory_pressure.disturbed({"major_faults": PAGES_64_MIB})
    assert memory_pressure.disturbed({"major_faults": 0, "swap_in_mb": 64.0})
    assert not memory_pressure.disturbed({"walltime": 1.0})  # a row from before the fields
    assert memory_pressure.read_back_mb({"walltime": 1.0}) is None


def test_a_live_snapshot_reads_this_process():
    now = memory_pressure.snapshot()
    assert now.major_faults >= 0
    if Path("/proc/meminfo").is_file():
        assert now.available_mb > 0 and memory_pressure.available_bytes() > 0


def _row(key: str, walltime: float, cell: str = "sd", dataset: str = "d") -> dict:
    return {"key": key, "dataset": dataset, "cell": cell, "walltime": walltime, "n_tokens": 10, "steps": [],
            "forwards": {}}  # fmt: skip


def test_rows_missing_their_prediction_by_more_than_twofold_either_way_are_counted():
    rows = [_row("a", 1.0), _row("b", 2.5), _row("c", 0.45), _row("d", 2.0), _row("e", 1.0, cell="ar")]
    predicted = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 0.0}  # e: no usable prediction
    missed = prediction.missed_rows(rows, predicted, lambda row: "m")
    assert missed == {("d", "sd", "m"): 2}  # b (2.5x) and c (0.45x); d at exactly 2x is not a miss


def test_a_row_whose_prompt_the_other_half_never_approached_is_not_counted_as_disturbed():
    # the committed SmolLM2 three-engine run: two Spec-Bench prompts of 660 and 769 tokens fell in one
    # half, the other half's longest prompt is 98 tokens, and the fit overpredicted both by 2-5x
    by_fold = {0: [], 1: []}
    for n in range(40):
        by_fold[prediction._fold({"example_id": f"x{n}"})].append(f"x{n}")
    short, other = by_fold[0][:3], by_fold[1][:3]
    rows = []
    for example, prompt in [(short[0], 60), (short[1], 98), (other[0], 40), (other[1], 769), (other[2], 196)]:
        row = _row(example, 1.0)
        row.update(example_id=example, prompt_tokens=prompt)
        rows.append(row)
    outside = prediction.extrapolated(rows, lambda row: "m")
    # 769 > 2 x 98; 196 = 2 x 98 is inside; fold 0 (60, 98) is inside the other half's 40 / 2 .. 769 x 2
    assert outside == {other[1]}
    # every row takes a quarter of its prediction
    predicted = {example: 4.0 for example in by_fold[0][:2] + by_fold[1][:3]}
    assert prediction.missed_rows(rows, predicted, lambda row: "m") == {("d", "sd", "m"): 5}
    assert prediction.missed_rows(rows, predicted, lambda row: "m", skip=outside) == {("d", "sd", "m"): 4}
    rows[0].pop("prompt_tokens")  # a row from before prompts were recorded is never called extrapolated
    assert short[0] not in prediction.extrapolated(rows, lambda row: "m")


def test_the_report_names_the_cells_whose_rows_memory_or_something_else_disturbed():
    cells = pd.DataFrame(
        [
            {"dataset": "gsm8k/test", "cell": "ar", "disturbed_rows": 0, "prediction_missed_rows": 0},
            {"dataset": "gsm8k/test", "cell": "sd[k=4]", "disturbed_rows": 2, "prediction_missed_rows": 1},
        ]
    )
    note = disturbed_note(cells)
    assert note.startswith("! rows of gsm8k/test sd[k=4] (2) read back from disk 64 MiB or more")
    assert "rows of gsm8k/test sd[k=4] (1) took more than twice" in note and "gsm8k/test ar" not in note
    assert disturbed_note(cells.drop(columns=["disturbed_rows", "prediction_missed_rows"])) == ""


def test_summary_counts_disturbed_rows_per_cell():
    from test_compare import _rows

    from specbench.pipeline.analysis.summary import summarise

    rows = _rows("ar", 10.0) + _rows("sd[k=2]", 20.0)
    for row in rows:
        row["major_faults"] = PAGES_64_MIB if row["cell"] == "sd[k=2]" and row["example_id"] == "ex0" else 3
        row["available_memory_mb"] = 900 if row["example_id"] == "ex1" else 1200
    table = summarise(rows).set_index("cell")
    assert table.loc["sd[k=2]", "disturbed_rows"] == 1 and table.loc["ar", "disturbed_rows"] == 0
    assert table.loc["sd[k=2]", "read_back_mb_max"] == pytest.approx(PAGES_64_MIB * memory_pressure.PAGE_MB)
    assert table.loc["ar", "available_memory_mb_min"] == 900


def test_the_plan_bills_each_kept_alive_engine_beside_specbenchs_own_models():
    recipe = load_recipe(ROOT / "recipes" / "engines" / "smollm2_vllm.yaml", known_tasks=set(TASKS))
    GiB = 2**30
    models = [
        {"name": "smollm2", "weight_bytes": GiB, "footprint_bytes": 2 * GiB},
        {"name": "smollm2_compiled", "weight_bytes": GiB, "footprint_bytes": 2 * GiB},
        {"name": "smollm2_vllm", "weight_bytes": GiB, "footprint_bytes": 3 * GiB},
        {"name": "small", "weight_bytes": GiB // 4, "footprint_bytes": GiB // 2},
        {"name": "lookup", "weight_bytes": 0, "footprint_bytes": 0},
    ]
    bill = host_memory(recipe, models, available=40 * GiB)
    # the vLLM target's cells: AR, n-gram (k=4), the small drafter (k=2): three engines, all kept
    (engine,) = bill["engines"]
    assert (engine["settings"], engine["kept"]) == (3, 3)
    assert engine["bytes"] == 3 * (3 * GiB + ENGINE_RUNTIME) + GiB // 4  # one setting drafts with small
    assert bill["own_bytes"] == 2 * GiB + 2 * GiB + GiB // 2
    assert bill["needed_bytes"] == bill["own_bytes"] + engine["bytes"] and bill["fits"]
    assert host_memory(recipe, models, available=bill["needed_bytes"] - 1)["fits"] is False


def test_the_plan_bills_a_frozen_model_one_copy_of_its_weights_per_pass_shape():
    recipe = load_recipe(ROOT / "recipes" / "engines" / "qwen_ar_inductor.yaml", known_tasks=set(TASKS))
    GiB = 2**30
    models = [
        {"name": "target_inductor", "weight_bytes": 3 * GiB, "footprint_bytes": 4 * GiB},
        {"name": "small_inductor", "weight_bytes": GiB, "footprint_bytes": 2 * GiB},
        {"name": "target_llamacpp_bf16", "weight_bytes": 3 * GiB, "footprint_bytes": 4 * GiB},
        {"name": "small", "weight_bytes": GiB, "footprint_bytes": 2 * GiB},
    ]
    # target and drafter each compile one token and k + 1 = 5 tokens (AR and SD k = 4 cells)
    shapes = {("chain", 1), ("chain", 5)}
    assert frozen_passes(recipe, "target_inductor") == frozen_passes(recipe, "small_inductor") == shapes
    assert frozen_passes(recipe, "small") == set()  # eager: its weights are its parameters alone
    bill = host_memory(recipe, models, available=40 * GiB)
    assert bill["frozen_bytes"] == 2 * 3 * GiB + 2 * GiB
    assert bill["own_bytes"] == 4 * GiB + 2 * GiB + 2 * GiB + bill["frozen_bytes"]


def test_an_engine_that_dies_is_named_by_its_error_not_its_last_progress_bar():
    from specbench.engines.process import last_error_line

    log = (
        "INFO starting\n"
        "RuntimeError: not enough memory for the KV cache\n"
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.2it/s]\r"
        "Loading weights:  40%|####      | 2/5 [00:01<00:02, 1.9it/s]\n"
    )
    assert last_error_line(log) == "RuntimeError: not enough memory for the KV cache"
    quiet = "INFO starting\nINFO engine exited\nProcessing:  99%|#########9| 99/100 [00:09<00:00, 10.1it/s]\n"
    assert last_error_line(quiet) == "INFO engine exited"
    assert last_error_line("") == "no output"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the parent-death signal is Linux's")
def test_an_engine_process_dies_with_a_driver_killed_outright(tmp_path: Path):
    """kill -9 of the driver (no atexit, no SIGTERM handler runs) still ends the engine it started."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "engine.pid"
    driver = (
        "import sys, time\n"
        "from specbench.engines.process import EngineProcess\n"
        "engine = EngineProcess([sys.executable, '-c', 'import time; time.sleep(600)'], 'test', 'engine')\n"
        f"open({str(pid_file)!r}, 'w').write(str(engine.process.pid))\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", driver])
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    engine = int(pid_file.read_text())
    os.kill(engine, 0)  # running
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    for _ in range(100):
        try:
            os.kill(engine, 0)
        except ProcessLookupError:
            break
        try:  # reaped by init once it exits; a zombie still answers kill(0)
            with open(f"/proc/{engine}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.05)
    else:
        os.kill(engine, signal.SIGKILL)
        pytest.fail("the engine outlived its killed driver")
