"""The views serving engineers read from a load sweep (``specbench serving DIR``), their figures
(``specbench plot DIR --figure pareto``), the k schedule file and the HTML page's load section; the
numbers are :mod:`specbench.pipeline.analysis.serving`'s."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.table import Table

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.analysis.serving import (
    Sweep,
    acceptance_side_by_side,
    k_schedule,
    pareto_points,
    read_sweep,
    time_split,
    vllm_batch_schedule,
)

PARETO_CSV, PARETO_PNG = "pareto.csv", "pareto.png"
K_SCHEDULE = "k_schedule.json"
VIEWS = {
    "pareto": (
        "tokens/s per user (1 / TPOT p50: the median request's decode speed) against tokens/s per core "
        "(output throughput / the machine card's cores; per GPU on a GPU box), one point per cell and "
        "level with 95% intervals, the points no other beats on both axes marked as the frontier; writes "
        f"{PARETO_CSV} and {PARETO_PNG}"
    ),
    "speedup": (
        "each speculative cell's speedup over the same engine's AR at each level, throughput and "
        "per-request speed, with the 95% interval paired by level and repeat (figure: --figure load)"
    ),
    "k": (
        "the k with the most goodput (ties: throughput, then the smaller k) and the one with the most "
        "throughput at each level, AR counting as k = 0, per family of cells that differ only in k; "
        f"writes {K_SCHEDULE}, with vLLM's num_speculative_tokens_per_batch_size for vLLM families"
    ),
    "acceptance": (
        "tokens per verification step pooled over a level (the server's counters) beside the per-request "
        "mean and p10/p50/p90 where the server sends each request's counts (llama.cpp; vLLM as specbench "
        "starts it, with --per-request-spec-decode-metrics summary, or a remote vLLM run with that flag), "
        "counted in load.csv's request_counts; 'per level only' where it sends none"
    ),
    "split": "the draft / verify / overhead time split where the engine exposes it, else what it exposes",
}
ALL_VIEWS = "all"


def _number(value, fmt: str) -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and math.isfinite(value) else "—"


def _with_interval(value, low, high, fmt: str) -> str:
    text = _number(value, fmt)
    if text != "—" and all(isinstance(v, (int, float)) and math.isfinite(v) for v in (low, high)):
        text += f" [{fmt.format(low)}, {fmt.format(high)}]"
    return text


def pareto_table(points: list[dict], title: str) -> Table:
    unit = points[0]["unit"] if points else "core"
    table = Table(title=title)
    for header in ("cell", "level", "tok/s per user", f"tok/s per {unit}", "frontier"):
        table.add_column(header, justify="right")
    for p in points:
        table.add_row(
            str(p["cell"]),
            str(p["level"]),
            _with_interval(p["per_user_tok_s"], p["per_user_low"], p["per_user_high"], "{:.1f}"),
            _with_interval(p["per_unit_tok_s"], p["per_unit_low"], p["per_unit_high"], "{:.2f}"),
            "*" if p.get("frontier") else "",
        )
    return table


def speedup_table(summary: list[dict], title: str) -> Table:
    table = Table(title=title)
    for header in ("cell", "level", "throughput speedup", "per-request speedup"):
        table.add_column(header, justify="right")
    for row in summary:
        if row.get("method") == BASELINE:
            continue
        table.add_row(
            str(row["cell"]),
            str(row["level"]),
            *(
                _with_interval(row.get(n), row.get(f"{n}_low"), row.get(f"{n}_high"), "{:.2f}x")
                for n in ("speedup_throughput", "speedup_per_request")
            ),
        )
    return table


def family_name(family: dict) -> str:
    """``target engine method`` (the setting in full is in k_schedule.json)."""
    setting = family["setting"]
    method = setting.get("method") or setting.get("spec_type") or "drafting"
    return f"{family['target']} {family['engine']} {method}"


def schedule_table(document: dict, title: str) -> Table:
    table = Table(title=title)
    for header in ("family", "level", "k (goodput)", "goodput/s", "separable", "k (throughput)", "tok/s"):
        table.add_column(header, justify="right")
    for family in document["families"]:
        name = family_name(family)
        for entry in family["levels"]:
            table.add_row(
                name,
                entry["level"],
                str(entry["k_goodput"]),
                _with_interval(entry["goodput"], entry["goodput_low"], entry["goodput_high"], "{:.2f}"),
                {True: "yes", False: "no", None: "—"}[entry["separable_goodput"]],
                str(entry["k_throughput"]),
                _with_interval(
                    entry["throughput"], entry["throughput_low"], entry["throughput_high"], "{:.1f}"
                ),
            )
    return table


def acceptance_table(entries: list[dict], title: str) -> Table:
    table = Table(title=title)
    for header in (
        "cell",
        "level",
        "pooled tok/step",
        "server AL",
        "per request: mean",
        "p10 / p50 / p90",
        "n",
    ):
        table.add_column(header, justify="right")
    for e in entries:
        spread = (
            " / ".join(_number(e[f"per_request_p{q}"], "{:.2f}") for q in (10, 50, 90))
            if e["per_request_n"]
            else "per level only"
        )
        table.add_row(
            str(e["cell"]),
            e["level"],
            _number(e["pooled_tokens_per_step"], "{:.2f}"),
            _number(e["server_mean_acceptance_length"], "{:.2f}"),
            _number(e["per_request_mean"], "{:.2f}") if e["per_request_n"] else "per level only",
            spread,
            str(e["per_request_n"]),
        )
    return table


def split_table(entries: list[dict], title: str) -> Table:
    table = Table(title=title)
    for header in ("cell", "engine", "draft / verify / overhead"):
        table.add_column(header, justify="left")
    for e in entries:
        table.add_row(str(e["cell"]), e["engine"], e["split"])
    return table


# -- the k schedule file -----------------------------------------------------------------------------

VLLM_NOTE = (
    "vLLM 0.32 reads speculative_config.num_speculative_tokens_per_batch_size: inclusive [first batch "
    "size, last batch size, k] ranges, the first from 1, k = 0 turning speculation off, k capped at "
    "num_speculative_tokens and the last range's k carried on to max_num_seqs; pass vllm.speculative_config "
    "as --speculative-config. Each range starts at a measured concurrency level and runs to the one "
    "before the next; AR (k = 0) was measured as its own server, not as k = 0 of this one."
)
OWN_NOTE = (
    "specbench's own schedule (level -> k): {engine} reads no per-batch-size k that specbench knows of, "
    "so set the k of the level you expect by hand"
)
RATE_NOTE = (
    "vLLM's schedule is keyed by batch size, which only concurrency levels fix; the request-rate levels "
    "are in levels only"
)


def schedule_document(sweep: Sweep) -> dict:
    """The k schedule of every family of ``sweep``, as k_schedule.json holds it (NaN written as null)."""
    families = []
    for family in k_schedule(sweep.summary):
        item = dict(family)
        closed = [e for e in family["levels"] if e.get("concurrency") is not None]
        if family["engine"] == "vllm" and closed:
            config = {**family["setting"], "num_speculative_tokens": max(family["ks"])}
            item["vllm"] = {
                "speculative_config": {
                    **config,
                    "num_speculative_tokens_per_batch_size": vllm_batch_schedule(closed, "k_goodput"),
                },
                "speculative_config_by_throughput": {
                    **config,
                    "num_speculative_tokens_per_batch_size": vllm_batch_schedule(closed, "k_throughput"),
                },
            }
            item["note"] = VLLM_NOTE + ("" if len(closed) == len(family["levels"]) else "; " + RATE_NOTE)
        else:
            item["vllm"] = None
            item["note"] = (
                RATE_NOTE if family["engine"] == "vllm" else OWN_NOTE.format(engine=family["engine"])
            )
        families.append(item)
    return _plain(
        {
            "sweep": str(sweep.directory),
            "objective": "goodput_req_s (ties: throughput_tok_s, then the smaller k); k_throughput beside",
            "families": families,
        }
    )


def _plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def write_k_schedule(sweep: Sweep) -> tuple[Path, dict]:
    from specbench.models.cache import write_atomic

    document = schedule_document(sweep)
    if not document["families"]:
        raise SpecbenchError(
            str(sweep.directory),
            "no speculative cell names its k (speculative_config's num_speculative_tokens or n_max)",
            "measure speculative cells with `specbench load`",
        )
    path = sweep.directory / K_SCHEDULE
    write_atomic(path, json.dumps(document, indent=2) + "\n")
    return path, document


# -- figures -----------------------------------------------------------------------------------------


def write_pareto_plot(run_dir: Path, sweep: Sweep | None = None) -> list[Path]:
    """pareto.csv and pareto.png: one curve per cell through its levels (closed-loop and open-loop
    levels each their own curve), 95% intervals on both axes, the frontier ringed and joined
    (``sweep``: the directory's sweep, where it was read already)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from specbench.models.cache import write_atomic

    sweep = sweep or read_sweep(run_dir)
    points = pareto_points(sweep.summary, sweep.units)
    csv_path, png_path = sweep.directory / PARETO_CSV, sweep.directory / PARETO_PNG
    write_atomic(csv_path, pd.DataFrame(points).to_csv(index=False))
    targets = sorted({str(p["target"]) for p in points})
    figure, axes = plt.subplots(1, len(targets), figsize=(6.5 * len(targets), 5), squeeze=False)
    for axis, target in zip(axes[0], targets, strict=True):
        mine = [p for p in points if str(p["target"]) == target]
        for (cell, kind), curve in _curves(mine).items():
            x = [p["per_unit_tok_s"] for p in curve]
            y = [p["per_user_tok_s"] for p in curve]
            axis.errorbar(
                x,
                y,
                xerr=_bars(curve, "per_unit"),
                yerr=_bars(curve, "per_user"),
                marker="o" if kind == "concurrency" else "s",
                capsize=2,
                label=f"{cell}" + (" (req/s)" if kind == "rate" else ""),
            )
            for p in curve:
                axis.annotate(p["level"], (p["per_unit_tok_s"], p["per_user_tok_s"]), fontsize=6)
        best = sorted((p for p in mine if p["frontier"]), key=lambda p: p["per_unit_tok_s"])
        axis.plot(
            [p["per_unit_tok_s"] for p in best],
            [p["per_user_tok_s"] for p in best],
            "k--",
            marker="o",
            markerfacecolor="none",
            markersize=11,
            linewidth=0.8,
            label="frontier",
        )
        unit = sweep.units.name
        axis.set(
            title=target,
            xlabel=f"tokens/s per {unit} (throughput / {sweep.units.count} {unit}s)",
            ylabel="tokens/s per user (1 / TPOT p50)",
        )
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(
        f"per-user speed against machine throughput, 95% intervals ({sweep.units.source})", fontsize=9
    )
    figure.tight_layout()
    figure.savefig(png_path, dpi=120)
    plt.close(figure)
    return [csv_path, png_path]


def _curves(points: list[dict]) -> dict[tuple, list[dict]]:
    curves: dict[tuple, list[dict]] = {}
    for p in points:
        curves.setdefault((p["cell"], p["kind"]), []).append(p)
    return {key: sorted(curve, key=lambda p: p["level_value"]) for key, curve in curves.items()}


def _bars(curve: list[dict], name: str) -> list[list[float]]:
    """matplotlib's [below, above] error-bar lengths; 0 where the interval is unknown."""

    def gap(a, b) -> float:
        d = a - b
        return max(d, 0.0) if math.isfinite(d) else 0.0

    below = [gap(p[f"{name}_tok_s"], p[f"{name}_low"]) for p in curve]
    above = [gap(p[f"{name}_high"], p[f"{name}_tok_s"]) for p in curve]
    return [below, above]


# -- the command -------------------------------------------------------------------------------------


def show_views(directory: Path, view: str, console, err) -> list[Path]:
    """Print ``view`` (or every one) of the sweep in ``directory`` and write its files; the paths
    written."""
    if view != ALL_VIEWS and view not in VIEWS:
        raise SpecbenchError(
            "--view", f"unknown view {view!r}", f"use one of {', '.join([*VIEWS, ALL_VIEWS])}"
        )
    sweep = read_sweep(directory)
    chosen = list(VIEWS) if view == ALL_VIEWS else [view]
    written: list[Path] = []
    name = sweep.directory.name
    for what in chosen:
        if what == "pareto":
            written += write_pareto_plot(sweep.directory, sweep)
            points = pareto_points(sweep.summary, sweep.units)
            console.print(pareto_table(points, f"{name}: per-user speed against throughput (* frontier)"))
        elif what == "speedup":
            console.print(speedup_table(sweep.summary, f"{name}: speedup over the same engine's AR, 95% CI"))
        elif what == "k":
            try:
                path, document = write_k_schedule(sweep)
            except SpecbenchError as error:
                if view != ALL_VIEWS:
                    raise
                err.print(f"skipped k: {error}", highlight=False, soft_wrap=True)
                continue
            written.append(path)
            console.print(schedule_table(document, f"{name}: the k of most goodput and of most throughput"))
            for family in document["families"]:
                line = f"{family_name(family)}: {family['note']}"
                console.print(line, highlight=False, markup=False)
        elif what == "acceptance":
            entries = acceptance_side_by_side(sweep.summary, sweep.rows, sweep.requests)
            console.print(acceptance_table(entries, f"{name}: acceptance pooled and per request"))
        else:
            console.print(split_table(time_split(sweep.summary), f"{name}: draft / verify / overhead"))
    return written
