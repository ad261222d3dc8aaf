"""How ``specbench plan`` shows a plan: Rich tables (models, placement per GPU, cells) with the
assumptions below them, or JSON with the same data (:func:`specbench.pipeline.planning.plan.build_plan`)."""

from __future__ import annotations

from specbench.models.machine import NO_BF16_UNITS
from specbench.pipeline.planning.placement import show_bytes, show_gpu


def plan_json(plan: dict) -> str:
    import json

    return json.dumps(plan, indent=2, default=str) + "\n"


def print_plan(plan: dict, console) -> None:
    """The plan as Rich tables: models, placement per GPU, cells; assumptions and totals below."""
    from rich.table import Table

    def table(title: str, columns: tuple[str, ...], left: int) -> Table:
        made = Table(title=title, title_justify="left")
        for i, column in enumerate(columns):
            made.add_column(column, justify="left" if i < left else "right")
        return made

    a = plan["assumptions"]
    columns = ("model", "source", "facts from", "dtype", "params", "weights", "KV cache", "needs", "ms/pass")
    models = table(f"{plan['recipe']}: models (batch 1, {a['sequence_tokens']} positions)", columns, 4)
    for m in plan["models"]:
        _add_row(
            models,
            m["name"],
            m["source"],
            m["origin"],
            m["dtype"],
            "—" if m["params"] is None else _count(m["params"]),
            show_bytes(m["weight_bytes"]),
            show_bytes(m["kv_bytes"]),
            show_bytes(m["footprint_bytes"]),
            f"{m['pass_ms']:.3g} ({m['pass_ms_source']})",
        )
    console.print(models)
    placed = plan["placement"]
    if placed is not None:
        gpu = show_gpu(a["gpu_memory_bytes"])
        title = f"placement on {a['gpus']} x {gpu} (fewest that fit: {placed['gpus_needed']})"
        gpus = table(title, ("GPU", "models", "used", "free"), 2)
        for g in placed["gpus"]:
            held = ", ".join(_held(entry) for entry in g["models"]) or "—"
            _add_row(gpus, str(g["gpu"]), held, show_bytes(g["used_bytes"]), show_bytes(g["free_bytes"]))
        for entry in placed["off_gpu"]:
            _add_row(gpus, "cpu", _held(entry), show_bytes(entry["bytes"]), "")
        console.print(gpus)
        for note in placed["notes"]:
            console.print(f"note: {note}", style="yellow", markup=False)
    cells = table("cells", ("dataset", "cell", "rows", "α", "forward passes", "time"), 2)
    for c in plan["cells"]:
        rows = "?" if c["rows"] is None else str(c["rows"])
        rows += f" (+{c['rows_done']} done)" if c["rows_done"] else ""
        alpha = "" if c["alpha"] is None else f"{c['alpha']:.2f}"
        alpha += " run" if alpha and c["alpha_source"] == "previous run" else ""
        passes = "?" if c["passes"] is None else ", ".join(f"{n} {_count(p)}" for n, p in c["passes"].items())
        _add_row(cells, c["dataset"], c["cell"], rows, alpha, passes, _duration(c["seconds"]))
    console.print(cells)
    for line in notes(plan):
        console.print(line, style="dim", markup=False, highlight=False)


def _add_row(table, *values: str) -> None:
    from rich.text import Text

    table.add_row(*(Text(value) for value in values))  # plain text: "sd[k=4]" is no markup


def _held(entry: dict) -> str:
    part = f" (part {entry['part']})" if entry.get("part") else ""
    return f"{entry['name']}{part} {show_bytes(entry['bytes'])}"


def notes(plan: dict) -> list[str]:
    """The assumptions behind the numbers, one line each."""
    a, totals = plan["assumptions"], plan["totals"]
    lines = [f"sequence: {a['sequence_tokens']} positions, the longest prompt + its output budget:"]
    for d in a["datasets"]:
        examples = "?" if d["examples"] is None else d["examples"]
        lines.append(
            f"  {d['dataset']}: {examples} examples ({d['examples_source']}), prompt {d['prompt_tokens']} "
            f"tokens ({d['prompt_source']}), {d['tokens_per_row']} new tokens per row"
        )
    lines += [
        f"memory: (weights + KV cache) x {1 + a['margin']:.2f}, and {show_bytes(a['reserve_bytes_per_gpu'])} "
        "reserved per GPU (CUDA context, activations)",
        f"α: 'run' = draft_acceptance_rate of the previous run, else assumed {a['acceptance_default']}",
        "time: (rows x repeats + warm-up) x passes x ms/pass; prefill and encoder passes not counted, and "
        "weights / bandwidth is a lower bound (no kernel launch or Python cost)",
        *sorted({f"passes, {c['method']}: {c['rule']}" for c in plan["cells"]}),
    ]
    lines += _host_memory(plan.get("host_memory"))
    if plan.get("bf16_without_units"):
        lines.append(
            f"! bfloat16 on this CPU: {', '.join(plan['bf16_without_units'])} compute in bfloat16, but "
            f"{NO_BF16_UNITS}, so a pass of k + 1 tokens may cost several one-token passes and speculative "
            "cells leave the papers' regime; `specbench probe` the recipe to see what verification costs here"
        )
    total = f"total: {totals['rows']} rows, {_duration(totals['hours'] * 3600)}"
    if totals["gpu_hours"] is not None:
        total += f", {totals['gpu_hours']:.1f} GPU-hours on {totals['gpus_used']} GPU(s)"
    if totals["rows_unknown"]:
        total += f" (+ {totals['rows_unknown']} cells of unknown size)"
    return [*lines, total]


def _host_memory(bill: dict | None) -> list[str]:
    """The host-memory line of a CPU plan, a warning where the models and engines do not fit."""
    if not bill:
        return []
    parts = [
        f"{e['kept']} kept-alive {e['engine']} engine(s) of {e['model']} ({e['settings']} speculative "
        f"settings) {show_bytes(e['bytes'])}"
        for e in bill["engines"]
        if not e.get("remote")
    ]
    remote = "".join(
        f" + {e['model']} ({e['engine']}) remote: not billed" for e in bill["engines"] if e.get("remote")
    )
    if bill.get("one_engine_at_a_time") and parts:  # by-cell: each engine stopped when its cells are done
        engines = f" + the largest, one at a time, of: {'; '.join(parts)}"
    else:
        engines = "".join(f" + {part}" for part in parts)
    engines += remote
    frozen = (
        f" (of which frozen graphs' packed weights {show_bytes(bill['frozen_bytes'])})"
        if bill.get("frozen_bytes")
        else ""
    )
    needed = (
        f"{show_bytes(bill['needed_bytes'])}: specbench's models {show_bytes(bill['own_bytes'])}{frozen}"
        f"{engines}"
    )
    if bill["available_bytes"] is None:
        return [f"host memory: needs about {needed} (this machine's available memory is unreadable)"]
    there = show_bytes(bill["available_bytes"])
    if bill["fits"]:
        return [f"host memory: needs about {needed}, of {there} available"]
    return [
        f"! host memory: needs about {needed}, but this machine has {there} available: weights will be "
        "evicted and re-read from disk during rows, and their walltimes will not be clean; lower "
        "engine_options.max_engines, or split the recipe"
    ]


def _count(value: float) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"
