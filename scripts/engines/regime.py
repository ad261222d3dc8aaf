"""Whether a machine puts a pair in the papers' regime: what a pass over n tokens costs against a one-token
pass, from a run's probe (``profile.json``) and from its rows (``cells.csv``).

    python -m scripts.engines.regime RUN [RUN ...] > regime.md

Per probed model: the median pass time at each size probed and its ratio over the one-token pass (at the
smallest context probed). Per speculative cell: its target's mean verification pass (``decode_pass_ms``)
against the one-token pass of the AR cell of the same target and dataset, and its drafter's pass against
that too. Near 1 a verification is almost free (bandwidth-bound passes, the papers' regime); near k + 1
it costs as many one-token passes as it feeds tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def probe_lines(run: Path) -> list[str]:
    path = run / "profile.json"
    if not path.exists():
        return []
    profile = json.loads(path.read_text())
    lines = ["| model | dtype | tokens fed: ms (x one-token pass) |", "|---|---|---|"]
    for name, model in profile["models"].items():
        context = int(min(c for _, c, _ in model["points"]))
        points = sorted((int(n), s) for n, c, s in model["points"] if int(c) == context)
        one = dict(points)[1]
        cells = ", ".join(f"{n}: {s * 1e3:.1f} ({s / one:.2f}x)" for n, s in points)
        lines.append(f"| {name} | {model.get('dtype') or profile.get('dtype')} | {cells} |")
    return [f"Probe (`profile.json`, after {context} cached positions):", "", *lines, ""]


def cell_lines(run: Path) -> list[str]:
    cells = pd.read_csv(run / "cells.csv")
    lines = [
        "| dataset | cell | target one-token pass (AR) ms | verification ms | x | drafter pass ms | x |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, cell in cells.iterrows():
        if cell["method"] != "speculative" or not isinstance(cell.get("drafter"), str):
            continue
        ar = cells[
            (cells["dataset"] == cell["dataset"])
            & (cells["method"] == "autoregressive")
            & (cells["target"] == cell["target"])
        ]
        if ar.empty:
            continue
        one = json.loads(ar.iloc[0]["decode_pass_ms"])[cell["target"]]
        passes = json.loads(cell["decode_pass_ms"])
        verify, draft = passes[cell["target"]], passes.get(cell["drafter"])
        drafted = f"{draft:.1f} | {draft / one:.3f}" if draft is not None else "— | —"
        ratio = f"{verify:.1f} | {verify / one:.2f}"
        lines.append(f"| {cell['dataset']} | {cell['cell']} | {one:.1f} | {ratio} | {drafted} |")
    return ["Rows (`cells.csv`, `decode_pass_ms`):", "", *lines, ""]


def main(runs: list[str]) -> None:
    out = ["# Verification cost against a one-token pass", ""]
    for run in map(Path, runs):
        out += [f"## `{run}`", "", *probe_lines(run), *cell_lines(run)]
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
