"""The validation tables of results/prediction/README.md, from committed runs and profiles only.

    python -m scripts.prediction.validate held-out   # every committed run, on the machine that measured it
    python -m scripts.prediction.validate carried    # runs predicted with another configuration's profile
    python -m scripts.prediction.validate failures   # why it fails where it does

Each prints a markdown table; the README quotes them (results/prediction/held_out.md, carried.md).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from specbench.models.machine import recorded_machine
from specbench.pipeline.analysis import cost_model, prediction, profiles
from specbench.pipeline.records.results import read_examples
from specbench.pipeline.views.prediction_view import model_setups

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "prediction"
LABEL = "amd-epyc-family26-avx512-bf16"  # this directory's machine: AMD EPYC family 26 model 2


def _machine(run: Path) -> tuple[str, str]:
    environment = json.loads((run / "environment.json").read_text())
    machine = recorded_machine(environment)
    return (machine.describe() if machine else "unrecorded"), model_setups(environment)


def held_out() -> str:
    lines = [
        "| run | machine | dtype, engine | cells (not AR) | median \\|speedup error\\| | largest "
        "| median \\|tokens/s error\\| |",
        "|---|---|---|---|---|---|---|",
    ]
    every = []
    for examples in sorted(ROOT.glob("results/**/examples.jsonl")):
        run = examples.parent
        rows = read_examples(run)
        machine_id = json.loads((run / "environment.json").read_text()).get("machine", {}).get("id", "")
        machine_of = lambda r, m=machine_id: r.get("machine") or m  # noqa: E731
        table = prediction.cell_predictions(rows, prediction.cross_validated(rows, machine_of), machine_of)
        speculative = table[table["method"] != "autoregressive"]
        every.append(speculative["speedup_error"].abs())
        described, setup = _machine(run)
        lines.append(
            f"| `{run.relative_to(ROOT)}` | {described.split(' · ')[0]} | {setup} | {len(speculative)} | "
            f"{100 * prediction.median_abs_error(table):.1f}% | "
            f"{100 * speculative['speedup_error'].abs().max():.1f}% | "
            f"{100 * prediction.median_abs_error(table.assign(method='x'), 'walltime_error'):.1f}% |"
        )
    errors = pd.concat(every)
    lines.append(
        f"| **all** | | | {len(errors)} | **{100 * errors.median():.1f}%** | {100 * errors.max():.1f}% | |"
    )
    return "\n".join(lines)


def failures() -> str:
    """Why the held-out prediction fails where it does: for each committed run's worst speculative cell,
    its target's seconds per pass beside what a fit to the run's other cells prices the same passes at,
    and the rows whose walltime is furthest from their prediction (a disturbed machine shows there)."""
    lines = [
        "| run | worst cell | speedup error | target ms per pass, measured | priced by the other cells | "
        "rows > 1.5x their prediction |",
        "|---|---|---|---|---|---|",
    ]
    for examples in sorted(ROOT.glob("results/**/examples.jsonl")):
        run = examples.parent
        rows = [r for r in read_examples(run) if prediction.timed(r)]
        table = prediction.cell_predictions(rows, prediction.cross_validated(rows, _any), _any)
        speculative = table[table["method"] != "autoregressive"].dropna(subset=["speedup_error"])
        if speculative.empty or speculative["speedup_error"].abs().max() < 0.15:
            continue
        worst = speculative.loc[speculative["speedup_error"].abs().idxmax()]
        others = [r for r in rows if r["dataset"] == worst["dataset"] and r["cell"] != worst["cell"]]
        mine = [r for r in rows if r["dataset"] == worst["dataset"] and r["cell"] == worst["cell"]]
        target = mine[0]["target"]
        ar = [
            r
            for r in rows
            if r["dataset"] == worst["dataset"] and r["method"] == "autoregressive" and r["target"] == target
        ]
        cell_ms = _ms_per_pass(mine, others, worst["dataset"], target)
        ar_ms = _ms_per_pass(ar, [r for r in rows if r not in ar], worst["dataset"], target)
        predicted = prediction.cross_validated(rows, _any)
        slow = [r for r in mine if r["walltime"] > 1.5 * predicted[r["key"]]]
        slow_text = ", ".join(
            f"{r['example_id']} {r['walltime']:.1f} s vs {predicted[r['key']]:.1f} s" for r in slow
        )
        lines.append(
            f"| `{run.relative_to(ROOT)}` | {worst['dataset']} `{worst['cell']}` | "
            f"{100 * worst['speedup_error']:+.1f}% | {cell_ms[0]:.1f} (AR {ar_ms[0]:.1f}) | "
            f"{cell_ms[1]:.1f} (AR {ar_ms[1]:.1f}) | {slow_text or 'none'} |"
        )
    return "\n".join(lines)


def _ms_per_pass(group: list[dict], rest: list[dict], dataset: str, target: str) -> tuple[float, float]:
    """``target``'s ms per pass in ``group``: measured, and priced by a fit to ``rest`` (same dataset)."""
    cost = prediction.fitted_costs([r for r in rest if r["dataset"] == dataset]).get(
        (target, prediction.engine_of(group[0]))
    )
    passes = sum(r["forwards"][target]["forward_passes"] for r in group)
    measured = sum(r["forwards"][target]["seconds"] for r in group)
    priced = sum(cost.seconds(cost_model.row_shapes(r, target)[0]) for r in group) if cost else math.nan
    return 1000 * measured / passes, 1000 * priced / passes


def _any(row: dict) -> str:
    return ""


# (run measured somewhere, the profile of the other configuration, the run measured there)
CARRIED = [
    (
        "eager bf16 -> eager float32",
        f"{LABEL}/demo",
        f"{LABEL}/profile_float32_eager.json",
        f"{LABEL}/demo_float32",
    ),
    (
        "eager float32 -> eager bf16",
        f"{LABEL}/demo_float32",
        f"{LABEL}/profile_bfloat16_eager.json",
        f"{LABEL}/demo",
    ),
    (
        "eager bf16 -> compiled bf16",
        f"{LABEL}/demo",
        f"{LABEL}/profile_bfloat16_compiled.json",
        f"{LABEL}/demo_compiled",
    ),
    (
        "compiled bf16 -> eager bf16",
        f"{LABEL}/demo_compiled",
        f"{LABEL}/profile_bfloat16_eager.json",
        f"{LABEL}/demo",
    ),
    ("probe vs run, bf16 eager", f"{LABEL}/demo", f"{LABEL}/profile_bfloat16_eager.json", f"{LABEL}/demo"),
    (
        "probe vs run, float32 eager",
        f"{LABEL}/demo_float32",
        f"{LABEL}/profile_float32_eager.json",
        f"{LABEL}/demo_float32",
    ),
    (
        "probe vs run, bf16 compiled",
        f"{LABEL}/demo_compiled",
        f"{LABEL}/profile_bfloat16_compiled.json",
        f"{LABEL}/demo_compiled",
    ),
    (
        "EPYC family 25 (Zen 4) -> family 26 (Zen 5), bf16 eager",
        "../demo/amd-epyc-avx512-bf16",
        f"{LABEL}/profile_bfloat16_eager.json",
        f"{LABEL}/demo",
    ),
    (
        "Xeon with AMX -> EPYC family 26, bf16 eager",
        "../quickstart",
        f"{LABEL}/profile_bfloat16_eager.json",
        f"{LABEL}/quickstart",
    ),
    (
        "Xeon with AMX -> EPYC family 26, float32 eager, distilled drafters",
        "../drafters/smollm2_offline_repeats",
        f"{LABEL}/profile_float32_drafters.json",
        f"{LABEL}/drafters_repeats",
    ),
    # the roofline of this CPU's measured bandwidth and peak (probe --roofline), passes only
    (
        "roofline of this EPYC vs run, bf16 eager",
        f"{LABEL}/demo",
        f"{LABEL}/profile_bfloat16_eager.json#roofline",
        f"{LABEL}/demo",
    ),
    (
        "Xeon with AMX -> roofline of this EPYC, bf16 eager",
        "../quickstart",
        f"{LABEL}/profile_bfloat16_eager.json#roofline",
        f"{LABEL}/quickstart",
    ),
]


def carried() -> str:
    """Each run predicted with the other configuration's profile, beside the run measured there. The
    error splits in two: the counts (the run there committed other tokens: its greedy outputs part
    from the source's at numerical near-ties, so its acceptance differs) and the cost model (the
    profile applied to the counts of the run there)."""
    lines = [
        "| carried | dataset | cell | speedup at the source | predicted | measured there | error | "
        "predicted from the counts there | error of the cost model |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    summary = []
    for what, source, profile_file, there in CARRIED:
        profile_file, _, roofline = profile_file.partition("#")
        profile = profiles.read_profile(str(RESULTS / profile_file))
        table = prediction.predict_run(RESULTS / source, profile, roofline=bool(roofline))
        own = prediction.predict_run(RESULTS / there, profile, roofline=bool(roofline))
        table, own = table.set_index(["dataset", "cell"]), own.set_index(["dataset", "cell"])
        errors, model_errors, ar_errors = [], [], []
        for (dataset, cell), row in table.iterrows():
            if (dataset, cell) not in own.index:
                continue
            truth = own.loc[(dataset, cell)]
            if row["method"] == "autoregressive":
                ar_errors.append(abs(row["tokens_per_s_predicted"] / truth["tokens_per_s"] - 1))
                continue
            if math.isnan(row["speedup_predicted"]):
                continue  # a cell the profile's engine does not run (HF generate under a compiled profile)
            error = row["speedup_predicted"] / truth["speedup"] - 1
            model_error = truth["speedup_predicted"] / truth["speedup"] - 1
            errors.append(abs(error))
            model_errors.append(abs(model_error))
            lines.append(
                f"| {what} | {dataset} | `{cell}` | {row['speedup']:.2f} | {row['speedup_predicted']:.2f} | "
                f"{truth['speedup']:.2f} | {100 * error:+.1f}% | {truth['speedup_predicted']:.2f} | "
                f"{100 * model_error:+.1f}% |"
            )
        summary.append(
            f"| {what} | {len(errors)} | {100 * pd.Series(errors).median():.1f}% | "
            f"{100 * max(errors):.1f}% | "
            f"{100 * pd.Series(model_errors).median():.1f}% | {100 * pd.Series(ar_errors).median():.1f}% |"
        )
    head = [
        "| carried | cells | median \\|speedup error\\| | largest | median \\|error of the cost model\\| "
        "| median \\|AR tokens/s error\\| |",
        "|---|---|---|---|---|---|",
    ]
    return "\n".join(head + summary) + "\n\n" + "\n".join(lines)


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "held-out"
    text = {"held-out": held_out, "carried": carried, "failures": failures}[which]()
    (RESULTS / f"{which.replace('-', '_')}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
