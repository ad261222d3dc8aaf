"""How a load sweep is shown: the table ``specbench load`` prints (every figure with its 95% interval,
and the outputs under load against the engine's batch-1 AR and specbench's AR, as the lossless column of
a run counts them), the ``!`` lines under it where outputs differ beyond a numerical tie, and
``load.png`` (speculation's speedup over the same engine's AR by level, with intervals)."""

from __future__ import annotations

import math
from pathlib import Path

from rich.table import Table

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.analysis.load_equivalence import REFERENCES, column, flag
from specbench.pipeline.views.report import format_lossless


def _interval(row: dict, name: str, fmt: str) -> str:
    value, low, high = (row.get(f"{name}{end}") for end in ("", "_low", "_high"))
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    text = fmt.format(value)
    if isinstance(low, float) and isinstance(high, float) and math.isfinite(low) and math.isfinite(high):
        text += f" [{fmt.format(low)}, {fmt.format(high)}]"
    return text


def load_table(summary: list[dict], title: str) -> Table:
    """The sweep's levels (load_summary.csv's rows), each figure with its 95% interval."""
    table = Table(title=title)
    columns = [
        ("throughput_tok_s", "tok/s", "{:.1f}"),
        ("speedup_throughput", "speedup", "{:.2f}x"),
        ("per_request_tok_s", "tok/s/req", "{:.1f}"),
        ("speedup_per_request", "req. speedup", "{:.2f}x"),
        ("ttft_p50_s", "TTFT p50", "{:.3f}"),
        ("ttft_p99_s", "TTFT p99", "{:.3f}"),
        ("tpot_p50_s", "TPOT p50", "{:.4f}"),
        ("tpot_p99_s", "TPOT p99", "{:.4f}"),
        ("e2e_p99_s", "e2e p99", "{:.2f}"),
        ("goodput_req_s", "goodput/s", "{:.2f}"),
    ]
    headers = ("tok/step", "vLLM AL", "= engine AR", "= ours", "err")
    for header in ("cell", "level", "reps", *(h for _, h, _ in columns), *headers):
        table.add_column(header, justify="right")
    for row in sorted(summary, key=_order):
        errors = f"{row['errors']}" + (f" ({row['timeouts']} timed out)" if row.get("timeouts") else "")
        if row.get("incomplete"):
            errors += f", {row['incomplete']} incomplete: --resume"
        table.add_row(
            str(row["cell"]),
            str(row["level"]),
            str(row["repeats"]),
            *(_interval(row, name, fmt) for name, _, fmt in columns),
            _interval(row, "tokens_per_step_est", "{:.2f}"),
            _interval(row, "vllm_mean_acceptance_length", "{:.2f}"),
            *(equivalence(row, kind) for kind in REFERENCES),
            errors,
        )
    return table


def equivalence(row: dict, kind: str) -> str:
    """``30/32 (2 ties)``: outputs under load identical to the ``kind`` reference of those checked, and
    the divergences by class; ``not checked`` where none was (temperature > 0, no reference, no ids)."""
    checked = row.get(column(kind, "checked"))
    if not isinstance(checked, int | float) or math.isnan(checked) or not checked:
        return "not checked"
    text = format_lossless(
        {
            "lossless_checked": checked,
            "lossless_identical": row.get(column(kind, "identical")),
            "lossless_ties": row.get(column(kind, "ties")),
            "lossless_mismatches": row.get(column(kind, "mismatches")),
        }
    )
    unclassified = row.get(column(kind, "unclassified"))
    if isinstance(unclassified, int | float) and unclassified > 0:
        text += f" ({int(unclassified)} unclassified)"
    return text


def equivalence_flags(summary: list[dict]) -> list[str]:
    """The ``!`` line of every level whose outputs under load differ from a reference beyond a tie."""
    lines = [flag(row, f"{row['cell']} {row['level']}") for row in sorted(summary, key=_order)]
    return [line for line in lines if line]


def _order(row: dict) -> tuple:
    """Cells in turn, closed-loop levels before open-loop ones, each by its value."""
    rate = row.get("request_rate")
    if isinstance(rate, (int, float)) and math.isfinite(rate):
        return str(row["cell"]), 1, float(rate)
    return str(row["cell"]), 0, float(row["concurrency"])


def write_load_plot(run_dir: Path) -> list[Path]:
    """load.png from a sweep directory: each speculative engine cell's speedup over its engine's AR cell
    by level (throughput and per request; one row of panels per kind of level), its 95% paired interval
    as error bars; where the curve crosses 1 speculation stops paying."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specbench.engines.load import LOAD_CSV, LOAD_PNG
    from specbench.pipeline.analysis.load_figures import sweep_summary

    rows = [r for r in sweep_summary(run_dir) if r.get("method") != BASELINE]
    if not rows:
        raise SpecbenchError(str(run_dir), f"no speculative rows in {LOAD_CSV}", "run `specbench load` first")
    kinds = [k for k in ("concurrency", "rate") if any((_order(r)[1] == 1) == (k == "rate") for r in rows)]
    figure, axes = plt.subplots(len(kinds), 2, figsize=(10, 4 * len(kinds)), squeeze=False)
    for panels, kind in zip(axes, kinds, strict=True):
        mine = [r for r in rows if (_order(r)[1] == 1) == (kind == "rate")]
        for cell in sorted({r["cell"] for r in mine}):
            points = sorted((r for r in mine if r["cell"] == cell), key=_order)
            x = [_order(r)[2] for r in points]
            for axis, name in zip(panels, ("speedup_throughput", "speedup_per_request"), strict=True):
                y = [r[name] for r in points]
                below = [_gap(r[name], r.get(f"{name}_low")) for r in points]
                above = [_gap(r.get(f"{name}_high"), r[name]) for r in points]
                axis.errorbar(x, y, yerr=[below, above], marker="o", capsize=3, label=cell)
        for axis, what in zip(panels, ("throughput", "per-request speed"), strict=True):
            axis.axhline(1.0, color="grey", linewidth=0.8)
            axis.set_xscale("log", base=2)
            axis.set_xlabel(
                "concurrent requests" if kind == "concurrency" else "requests per second (open loop)"
            )
            axis.set_ylabel(f"{what} / same engine's AR")
            axis.legend(fontsize=7)
    machines = sorted({str(r.get("machine_described") or r.get("machine")) for r in rows})
    figure.suptitle(f"speculation under load, 95% intervals ({', '.join(machines)})", fontsize=9)
    figure.tight_layout()
    path = Path(run_dir) / LOAD_PNG
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return [path]


def _gap(high, low) -> float:
    """An error bar's length; 0 where the interval is unknown (or, as a percentile interval may, leaves
    the point out on that side)."""
    try:
        gap = float(high) - float(low)
    except (TypeError, ValueError):
        return 0.0
    return max(gap, 0.0) if math.isfinite(gap) else 0.0
