"""Quality against latency for cascades, from result files only (Speculative Cascades, Sec. 6).

Narasimhan et al., "Faster Cascades via Speculative Decoding" (ICLR 2025) sweep each method's
lenience α and plot quality against latency *relative to the large model* (Figure 2: wall-clock;
Figure 3: rejection rate per token), then read two numbers off each curve (Table 2):

* **latency reduction when matching the large model's quality**: large-model latency over the
  method's latency at the point where its curve first reaches the large model's quality (×; above
  1 is faster, below 1 means the method needs more time than the large model to match it);
* **best quality without exceeding the large model's latency**: the curve's quality at relative
  latency 1 (or its best point below 1 when the curve stops earlier).

The paper does not say how these are read off a discrete α grid. specbench reads them off the
curve as plotted: the method's Pareto frontier over α (points no other α beats on both latency and
quality), joined by straight lines. Between two α values the line is attainable (run α₁ on a
fraction of the inputs and α₂ on the rest), so a crossing is interpolated linearly on the frontier,
never extrapolated: a curve that never reaches the large model's quality has no latency reduction,
and one whose every point is slower than the large model has no best quality. A curve whose
fastest point already beats the large model's quality is read at that point.

Latency relative to the large model (the autoregressive cell of the same target and dataset), as
the paper measures it: decoding time of a whole output ("relative to that of calling T5-large on all
inputs", App. E), not time per token, so a method that stops earlier or rambles on is charged for
the tokens it really generates:

* ``relative_latency_walltime`` = the cell's mean wall-clock time per example ÷ the AR cell's;
* ``relative_latency_swi`` = the cell's model-size (MS) cost per example ÷ the AR cell's
  (hardware-independent; per example: generated tokens per example ÷ SWI);
* ``relative_time_per_token`` = AR tokens/s ÷ the cell's tokens/s, for reference (equal to the
  walltime measure when both cells generate as many tokens per example);
* ``deferral_rate`` (cells.csv: deferrals or rejections per generated token) and
  ``rejection_rate`` (target verifications that rejected a draft, per generated token, from
  examples.jsonl), the x-axis of Figure 3, where the small model sits at 0 and the large at 1.

The small model's point is an autoregressive cell whose target is the cascade's drafter, when the
run has one. Like the report, this reads only cells.csv, examples.jsonl and environment.json.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.records.results import CELLS, read_examples, write_atomic
from specbench.pipeline.views.plots import dataset_panels, save_panels
from specbench.pipeline.views.report import load_cells

CURVES_CSV = "curves.csv"
TABLE2_CSV = "cascades_table2.csv"
SWEEP = ("alpha", "lenience")  # the α of a curve; every other parameter starts a curve of its own
AXES = {
    "walltime": ("relative_latency_walltime", "latency relative to the large model (wall-clock per example)"),
    "swi": ("relative_latency_swi", "latency relative to the large model (MS cost per example)"),
    "deferral": ("deferral_rate", "deferral / rejection rate per token"),
}


# -- the points ----------------------------------------------------------------------------------


def quality_metric(cells: pd.DataFrame, dataset: str) -> str | None:
    """The task's metric on ``dataset``: its first ``quality_*`` column with a value, or None."""
    rows = cells[cells["dataset"] == dataset]
    for column in cells.columns:
        if column.startswith("quality_") and pd.to_numeric(rows[column], errors="coerce").notna().any():
            return column
    return None


def curve_points(
    cells: pd.DataFrame, environment: dict | None = None, examples: list[dict] | None = None
) -> pd.DataFrame:
    """One row per (dataset, cell): its curve, α, quality and the latency and rate measures above.

    AR cells appear as the ``large`` point of their own target's curves and as the ``small`` point
    of the curves whose drafter they ran; every other cell with an AR cell of its target is a
    ``method`` point. ``environment`` (environment.json "models") gives the small model's SWI
    latency (its parameter count over the large model's, the MS cost); ``examples`` the rejections.
    """
    rejections = _rejection_rates(examples or [])
    rows = []
    for dataset in dict.fromkeys(cells["dataset"]):
        frame = cells[cells["dataset"] == dataset]
        metric = quality_metric(cells, dataset)
        ar = frame[frame["method"] == BASELINE]
        ar_by_target = {r["target"]: r for r in ar.to_dict("records")}
        methods = frame[frame["method"] != BASELINE].to_dict("records")
        labels = _curve_labels(methods)
        for cell in methods:
            large = ar_by_target.get(cell["target"])
            if large is None:
                continue
            params = _params(cell)
            rows.append(
                _point(cell, large, metric, "method", labels[cell["cell"]], params)
                | {"rejection_rate": rejections.get((dataset, cell["cell"]), math.nan)}
            )
        # the large and small models, once per target / drafter of a curve
        for target in dict.fromkeys(c["target"] for c in methods):
            large = ar_by_target.get(target)
            if large is None:
                continue
            rows.append(_point(large, large, metric, "large", "large model", {}) | {"deferral_rate": 1.0})
            for drafter in dict.fromkeys(c["drafter"] for c in methods if c["target"] == target):
                small = ar_by_target.get(drafter) if isinstance(drafter, str) else None
                if small is None:
                    continue
                point = _point(small, large, metric, "small", "small model", {}) | {"deferral_rate": 0.0}
                # the small model's own SWI is against itself: its cost is its passes at the MS cost
                # of one of its passes relative to one of the large model's
                ms_cost = _ms_cost(environment or {}, examples or [], drafter, target)
                point["relative_latency_swi"] = ms_cost * _ratio(
                    _per_example(small, "generated_tokens"), _per_example(large, "generated_tokens")
                )
                rows.append(point)
    points = pd.DataFrame(rows, columns=_COLUMNS)
    for axis in ("walltime", "swi"):
        points[f"frontier_{axis}"] = False
        column = AXES[axis][0]
        for _, curve in points[points["role"] == "method"].groupby(["dataset", "curve"], sort=False):
            points.loc[curve.index[pareto_frontier(curve[column], curve["quality"])], f"frontier_{axis}"] = (
                True
            )
    return points


_COLUMNS = [
    "dataset",
    "role",
    "curve",
    "method_name",
    "method",
    "params",
    "alpha",
    "target",
    "drafter",
    "cell",
    "metric",
    "quality",
    "relative_latency_walltime",
    "relative_latency_swi",
    "relative_time_per_token",
    "walltime_ratio",
    "deferral_rate",
    "rejection_rate",
    "tokens_per_s",
    "swi_ms",
    "n",
]


def _point(cell: dict, large: dict, metric: str | None, role: str, curve: str, params: dict) -> dict:
    sweep = next((params[key] for key in SWEEP if key in params), math.nan)
    return {
        "dataset": cell["dataset"],
        "role": role,
        "curve": curve,
        "method_name": cell["method_name"],
        "method": cell["method"],
        "params": json.dumps(params, sort_keys=True),
        "alpha": _float(sweep),
        "target": cell["target"],
        "drafter": cell.get("drafter") if isinstance(cell.get("drafter"), str) else "",
        "cell": cell["cell"],
        "metric": (metric or "").removeprefix("quality_"),
        "quality": _float(cell.get(metric)) if metric else math.nan,
        "relative_latency_walltime": _ratio(
            _per_example(cell, "walltime_s"), _per_example(large, "walltime_s")
        ),
        "relative_latency_swi": _ratio(_ms_cost_per_example(cell), _ms_cost_per_example(large)),
        "relative_time_per_token": _ratio(large.get("tokens_per_s"), cell.get("tokens_per_s")),
        "walltime_ratio": _ratio(cell.get("walltime_s"), large.get("walltime_s")),
        "deferral_rate": _float(cell.get("deferral_rate")),
        "rejection_rate": math.nan,
        "tokens_per_s": _float(cell.get("tokens_per_s")),
        "swi_ms": _float(cell.get("swi_ms")),
        "n": cell.get("n"),
    }


def _per_example(cell: dict, column: str) -> float:
    """A cell's total ``column`` (walltime_s, generated_tokens) per example it ran."""
    return _ratio(cell.get(column), cell.get("n"))


def _ms_cost_per_example(cell: dict) -> float:
    """MS cost of a cell's output per example, in passes of its target: tokens per example / SWI."""
    return _ratio(_per_example(cell, "generated_tokens"), cell.get("swi_ms"))


def _params(cell: dict) -> dict:
    try:
        return json.loads(cell["params"]) if isinstance(cell.get("params"), str) else {}
    except json.JSONDecodeError:
        return {}


def _curve_labels(cells: list[dict]) -> dict[str, str]:
    """Cell id -> curve name: the method entry, plus its non-α parameters when they vary within it."""
    others: dict[str, dict[str, str]] = {}
    for cell in cells:
        rest = {k: v for k, v in _params(cell).items() if k not in SWEEP}
        others.setdefault(cell["method_name"], {})[cell["cell"]] = json.dumps(rest, sort_keys=True)
    labels = {}
    for name, by_cell in others.items():
        rests = {cell_id: json.loads(rest) for cell_id, rest in by_cell.items()}
        keys = sorted({k for rest in rests.values() for k in rest})
        # only the parameters that differ between the entry's cells name its curves (rule=chow)
        varying = [k for k in keys if len({json.dumps(rest.get(k)) for rest in rests.values()}) > 1]
        for cell_id, rest in rests.items():
            text = ",".join(f"{k}={rest.get(k)}" for k in varying)
            labels[cell_id] = f"{name} [{text}]" if varying else name
    return labels


def _rejection_rates(examples: list[dict]) -> dict[tuple[str, str], float]:
    """(dataset, cell) -> target verifications that rejected a drafted token, per generated token."""
    counts: dict[tuple[str, str], list[int]] = {}
    for row in examples:
        entry = counts.setdefault((row["dataset"], row["cell"]), [0, 0])
        entry[0] += sum(1 for drafted, accepted in row.get("steps", []) if accepted < drafted)
        entry[1] += row.get("n_tokens", 0)
    return {key: rejected / tokens for key, (rejected, tokens) in counts.items() if tokens}


def _ms_cost(environment: dict, examples: list[dict], small: str, large: str) -> float:
    """The small model's MS cost relative to the large one: a row's cost table, else parameter counts."""
    for row in examples:
        cost = (row.get("costs") or {}).get("ms", {})
        if row.get("target") == large and cost.get(small) is not None and cost.get(large):
            return cost[small] / cost[large]
    small_n = (environment.get(small) or {}).get("parameters")
    large_n = (environment.get(large) or {}).get("parameters")
    return small_n / large_n if small_n and large_n else math.nan


# -- the frontier and the Table 2 metrics -----------------------------------------------------------


def pareto_frontier(latency, quality) -> list[int]:
    """Positions (into the inputs) of the points no other point beats: lower latency, higher quality.

    A point is dropped when another has latency <= and quality >= (one strictly); NaN points are
    never on the frontier. The positions come back sorted by latency (quality then rises along it).
    """
    pairs = [
        (float(x), -float(y), i)
        for i, (x, y) in enumerate(zip(latency, quality, strict=True))
        if not (math.isnan(float(x)) or math.isnan(float(y)))
    ]
    frontier, best = [], -math.inf
    for _x, negative_y, i in sorted(pairs):
        if -negative_y > best:
            frontier.append(i)
            best = -negative_y
    return frontier


def latency_to_match(latency: list[float], quality: list[float], target_quality: float) -> float:
    """Lowest relative latency at which the frontier (joined linearly) reaches ``target_quality``.

    NaN when it never does. ``latency``/``quality`` are frontier points sorted by latency.
    """
    for i, (x, y) in enumerate(zip(latency, quality, strict=True)):
        if y >= target_quality:
            if i == 0:
                return x
            x0, y0 = latency[i - 1], quality[i - 1]
            return x0 + (target_quality - y0) * (x - x0) / (y - y0)
    return math.nan


def quality_at_latency(latency: list[float], quality: list[float], budget: float = 1.0) -> float:
    """Best quality of the frontier (joined linearly) at relative latency <= ``budget``; NaN if none."""
    inside = [i for i, x in enumerate(latency) if x <= budget]
    if not inside:
        return math.nan
    last = inside[-1]
    if last + 1 == len(latency) or latency[last] == budget:
        return quality[last]
    x0, y0, x1, y1 = latency[last], quality[last], latency[last + 1], quality[last + 1]
    return y0 + (budget - x0) * (y1 - y0) / (x1 - x0)


def table2_metrics(points: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and curve, Table 2's two numbers under each latency measure (module docstring)."""
    rows = []
    for (dataset, curve), group in points[points["role"] == "method"].groupby(
        ["dataset", "curve"], sort=False
    ):
        first = group.iloc[0]
        large = points[
            (points["dataset"] == dataset)
            & (points["role"] == "large")
            & (points["target"] == first["target"])
        ]
        large_quality = float(large["quality"].iloc[0]) if len(large) else math.nan
        row = {
            "dataset": dataset,
            "curve": curve,
            "method_name": first["method_name"],
            "method": first["method"],
            "rule": json.loads(first["params"]).get("rule", ""),
            # the curve's parameters besides α (equal on all its points: they name the curve)
            "params": json.dumps(
                {k: v for k, v in json.loads(first["params"]).items() if k not in SWEEP}, sort_keys=True
            ),
            "target": first["target"],
            "drafter": first["drafter"],
            "metric": first["metric"],
            "large_quality": large_quality,
            "points": len(group),
        }
        for axis in ("walltime", "swi"):
            column = AXES[axis][0]
            front = group.iloc[pareto_frontier(group[column], group["quality"])]
            x, y = list(front[column]), list(front["quality"])
            matched = latency_to_match(x, y, large_quality) if not math.isnan(large_quality) else math.nan
            row |= {
                f"latency_reduction_{axis}": 1.0 / matched
                if matched and not math.isnan(matched)
                else math.nan,
                f"best_quality_{axis}": quality_at_latency(x, y, 1.0),
                f"frontier_alphas_{axis}": " ".join(f"{a:g}" for a in front["alpha"]),
            }
        rows.append(row)
    return pd.DataFrame(rows)


# -- a run directory -------------------------------------------------------------------------------


def run_points(run_dir: Path) -> pd.DataFrame:
    """curve_points of one run directory; a one-line error when nothing can be drawn from it."""
    run_dir = Path(run_dir)
    if not (run_dir / CELLS).is_file():
        raise SpecbenchError(
            str(run_dir), f"no {CELLS} here", "point at one run directory (from `specbench run`)"
        )
    cells = load_cells(run_dir)
    environment = {}
    if (run_dir / "environment.json").is_file():
        try:
            environment = json.loads((run_dir / "environment.json").read_text()).get("models") or {}
        except (ValueError, AttributeError):
            raise SpecbenchError(
                str(run_dir / "environment.json"),
                "not a JSON object with a models field",
                "restore it from the run, or delete it (the small model's SWI point is then left out)",
            ) from None
    points = curve_points(cells, environment, read_examples(run_dir))
    check_points(points, str(run_dir))
    return points


def check_points(points: pd.DataFrame, where: str) -> None:
    """Raise unless some method point has both a quality and a latency relative to its large model."""
    methods = points[points["role"] == "method"]
    if methods.empty:
        raise SpecbenchError(
            where,
            "no cell here has an autoregressive cell of its target on the same dataset",
            "add `method: autoregressive` on the cascade's target (and on its drafter, for the small "
            "model's point) to the recipe and run it",
        )
    if methods["quality"].isna().all():
        raise SpecbenchError(
            where,
            "no quality metric in these cells (speed-only tasks such as alpaca or spec_bench)",
            "run the cascades on a task with a metric (wmt14_en_de, xsum, cnn_dailymail, gsm8k, "
            "squad_v2, trivia_qa, arithmetic, ...)",
        )


def write_curves(run_dir: Path) -> list[Path]:
    """curves.csv, cascades_table2.csv and the Pareto PNGs (Figures 2-3) into ``run_dir``."""
    run_dir = Path(run_dir)
    points = run_points(run_dir)
    paths = [run_dir / CURVES_CSV, run_dir / TABLE2_CSV]
    write_atomic(paths[0], points.to_csv(index=False))
    write_atomic(paths[1], table2_metrics(points).to_csv(index=False))
    methods = points[points["role"] == "method"]
    for axis in AXES:
        column = AXES[axis][0]
        if methods[column].notna().any() or (axis == "deferral" and methods["rejection_rate"].notna().any()):
            paths.append(write_pareto_plot(points, axis, run_dir / f"pareto_{axis}.png"))
    return paths


def write_pareto_plot(points: pd.DataFrame, axis: str, path: Path) -> Path:
    """One panel per dataset: every curve's points, its frontier joined, the large and small models."""
    column, label = AXES[axis]
    if axis == "deferral":  # Figure 3: cascades count deferrals, speculative methods rejections
        points = points.assign(deferral_rate=points["deferral_rate"].fillna(points["rejection_rate"]))
    datasets = list(dict.fromkeys(points["dataset"])) or ["(none)"]
    plt, figure, axes = dataset_panels(datasets)
    for ax, dataset in zip(axes, datasets, strict=False):
        frame = points[points["dataset"] == dataset]
        for curve, group in frame[frame["role"] == "method"].groupby("curve", sort=False):
            front = group.iloc[pareto_frontier(group[column], group["quality"])]
            (line,) = ax.plot(front[column], front["quality"], marker="o", label=curve)
            ax.scatter(group[column], group["quality"], s=12, alpha=0.4, color=line.get_color())
        for role, marker in (("large", "*"), ("small", "^")):
            for record in frame[frame["role"] == role].to_dict("records"):
                ax.scatter(record[column], record["quality"], marker=marker, s=120, color="black", zorder=3)
                ax.annotate(f"{role}: {record['target']}", (record[column], record["quality"]), fontsize=7)
                if role == "large":
                    ax.axhline(record["quality"], linestyle=":", color="gray")
        metric = next((m for m in frame["metric"] if m), "quality")
        ax.set(title=dataset, xlabel=label, ylabel=metric)
    return save_panels(plt, figure, axes, path)


# -- helpers -------------------------------------------------------------------------------------


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _ratio(numerator, denominator) -> float:
    a, b = _float(numerator), _float(denominator)
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan
