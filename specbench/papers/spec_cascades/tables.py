"""Speculative Cascades' Table 2 beside a run (``specbench report RUN --paper spec-cascades-table2``).

Narasimhan et al., "Faster Cascades via Speculative Decoding" (ICLR 2025). Each of the run's
cascade curves (:mod:`specbench.papers.spec_cascades.curves`) gives its two Table 2 numbers
(latency reduction at the large model's quality, best quality within its latency), shown beside
the paper's row for the same algorithm (``paper_label``) from this folder's ``reference.yaml``.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources

import yaml

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.papers.base import MISSING, Run, View, decode_pass_ms, num, num_interval, pass_ms
from specbench.papers.spec_cascades.curves import check_points, curve_points, table2_metrics
from specbench.pipeline.records.results import read_examples


@lru_cache(maxsize=1)
def spec_cascades_reference() -> dict:
    """The paper's Tables 2 and 3 as transcribed in this folder's reference.yaml."""
    text = resources.files("specbench.papers.spec_cascades").joinpath("reference.yaml").read_text()
    return yaml.safe_load(text)


def table2(runs: list[Run]) -> tuple[list[View], list[dict]]:
    """Our Table 2 metrics per dataset and curve, with the paper's row for the same algorithm beside."""
    ref = spec_cascades_reference()
    table = ref["table2"]
    columns = [f"{pair} {dataset}" for pair, dataset in table["columns"]]
    paper_rows = [
        {"Method": r["method"]}
        | {f"lat↓ {c}": f"{v:.2f}×" for c, v in zip(columns, r["latency_reduction"], strict=True)}
        | {f"quality {c}": f"{v:.2f}" for c, v in zip(columns, r["best_quality"], strict=True)}
        for r in table["rows"]
    ]
    by_label = {r["method"]: r for r in table["rows"]}
    rows, tidy, errors = [], [], []
    for run in runs:
        examples = read_examples(run.directory) if run.directory else []
        points = curve_points(run.cells, run.environment, examples)
        try:
            check_points(points, str(run.directory))
        except SpecbenchError as error:  # in a folder of runs, the runs without curves are left out
            errors.append(error)
            continue
        for m in table2_metrics(points).to_dict("records"):
            label = paper_label(m["method"], json.loads(m["params"]), ref)
            theirs = by_label.get(label)
            rows.append(
                {
                    "Run": run.name,
                    "Dataset": m["dataset"],
                    "Method": m["curve"],
                    "paper row": label or MISSING,
                    "metric": m["metric"],
                    "large": num(m["large_quality"]),
                    "lat↓ wall ours": num(m["latency_reduction_walltime"], unit="×"),
                    "lat↓ SWI ours": num(m["latency_reduction_swi"], unit="×"),
                    "lat↓ paper": _paper(theirs, "latency_reduction", m["dataset"], ref),
                    "quality wall ours": num(m["best_quality_walltime"]),
                    "quality SWI ours": num(m["best_quality_swi"]),
                    "quality paper": _paper(theirs, "best_quality", m["dataset"], ref),
                    "α points": str(m["points"]),
                }
            )
            for metric in ("latency_reduction_walltime", "latency_reduction_swi", "best_quality_walltime"):
                tidy.append(
                    {
                        "table": "2",
                        "run": run.name,
                        "dataset": m["dataset"],
                        "method": m["curve"],
                        "paper_method": label or "",
                        "metric": metric,
                        "ours": m[metric],
                        "paper": _paper(theirs, metric.rsplit("_", 1)[0], m["dataset"], ref),
                    }
                )
    if not rows:
        raise errors[0]
    notes = [
        f"Paper: {table['source']}. {table['note']}",
        "lat↓: large-model latency over the method's where its Pareto frontier over α (joined linearly) "
        "first reaches the large model's quality; quality: the frontier's quality at the large model's "
        "latency. wall: decoding time per example relative to the target's AR cell (as the paper); "
        "SWI: model-size cost per example relative to it (tokens per example / SWI). "
        "— = the curve never matches / never is as fast (specbench/papers/spec_cascades/curves.py).",
        "The paper's metrics are BLEU (WMT) and ROUGE-2 (XSum, CNNDM) on fine-tuned T5 models; ours are "
        "the run's task metric, so compare the ranking of methods, not the numbers.",
    ]
    views = [
        View("Speculative Cascades Table 2 (paper, T5, T=1, γ=5)", paper_rows, [f"Paper: {ref['paper']}."]),
        View("Speculative Cascades Table 2 metrics: ours | paper", rows, notes),
        lemma5(runs),
    ]
    return views, tidy


def lemma5(runs: list[Run]) -> View:
    """Every speculative-cascade cell's rejection rate beside Lemma 5's, from the same drafts, and its
    SWI beside what speculative decoding's theory expects of its acceptance."""
    rows, explained = [], []
    for run in runs:
        cells = run.cells
        if "rejection_rate_lemma5" not in cells:
            continue
        gaps = _lemma5_gaps(run)
        for cell in cells[cells["method"] == "spec_cascade"].to_dict("records"):
            n = float(cell.get("reviewed_drafts", math.nan))
            rate = float(cell.get("rejection_rate", math.nan))
            half = 1.96 * (rate * (1 - rate) / n) ** 0.5 if n else math.nan
            wall, predicted = float(cell.get("speedup_vs_ar", math.nan)), walltime_theory(cell, cells)
            rows.append(
                {
                    "Run": run.name,
                    "Dataset": cell["dataset"],
                    "Method": cell["cell"],
                    "drafts reviewed": num(n, 0),
                    "rejected ours": f"{num(rate, 3)} ± {num(half, 3)}",
                    "Lemma 5": num(cell["rejection_rate_lemma5"], 3),
                    "ours - Lemma 5 [95%]": gaps.get((cell["dataset"], cell["cell"]), MISSING),
                    "SWI MS ours": num(cell.get("swi_ms")),
                    "SWI MS theory": num(cell.get("swi_ms_theory")),
                    "wall× ours": num_interval(cell, "speedup_vs_ar"),
                    "wall× theory": num(predicted),
                }
            )
            theory = float(cell.get("swi_ms_theory", math.nan))
            plain = json.loads(cell.get("params") or "{}").get("rule") == "sd"
            if plain and theory >= 1 > wall:
                ar, target = _ar_cell(cell, cells), cell["target"]
                verify, one = decode_pass_ms(cell, target), decode_pass_ms(ar, target)
                averaged = "the prompts' prefill apart"
                if math.isnan(verify) or math.isnan(one):  # rows from before the prefill was timed apart
                    verify, one = pass_ms(cell, target), pass_ms(ar, target)
                    averaged = "the prompts' prefill included, which weighs more in a cell of fewer passes"
                explained.append(
                    f"{run.name} {cell['dataset']}: the theory gives plain speculative decoding SWI "
                    f"{num(theory)} (ours {num(cell.get('swi_ms'))}) at the model-size costs, a gain, yet "
                    f"it runs {num(wall, unit='×')} the large model's walltime: its target passes average "
                    f"{num(verify, 1)} ms against {num(one, 1)} ms for the large model's alone "
                    f"({num(verify / one, unit='×')}; each model's time over its passes, {averaged}), "
                    "where the cost table prices them alike. At the passes' "
                    f"measured times the same acceptance gives {num(predicted, unit='×')} (wall× theory): "
                    + (
                        "priced at this machine's passes, the theory predicts no gain either."
                        if predicted < 1.05
                        else "the theory expects a gain there: the loop's overhead, not the passes, loses it."
                    )
                )
            if plain and theory < 1:
                explained.append(
                    f"{run.name} {cell['dataset']}: plain speculative decoding against the large model "
                    f"rejects {num(rate, 3)} of the small model's drafts, so the theory gives it SWI "
                    f"{num(theory)} (ours {num(cell.get('swi_ms'))}), below the large model alone: a rule "
                    "that keeps the large model's quality rejects about as often, so the theory predicts "
                    "that no speculative rule matches that quality faster than the large model (Table 2's "
                    "lat↓ above says whether one did); only rules that accept the small model's text "
                    "(low rejection) can be faster."
                )
    notes = [
        "Lemma 5 (Narasimhan et al., ICLR 2025): a draft x ~ q_t is rejected with probability "
        "r(x_<t) · D_TV(p_t, q_t) under π = (1 - r) q_t + r p_t, and D_TV(π, q_t) for any π (token "
        "rules, lossy SD); 'Lemma 5' sums that over the drafts the target reviewed (each step's up to its "
        "first rejection) from the rows both models gave, 'rejected ours' counts the rejections "
        "(± 1.96 binomial standard errors; at T = 0 both are 0/1 per draft and agree exactly). "
        "'ours - Lemma 5 [95%]' is the difference of the two rates and the interval Lemma 5 itself gives "
        "it: were each draft rejected with its D_TV chance c_i, the sum of (rejected_i - c_i) would be a "
        "martingale, uncorrelated terms however a sequence's drafts depend on each other, whose variance "
        "Σ c_i (1 - c_i) over the drafts estimates (recorded per example since 2026-11-29; where a run "
        "predates that record, marked *, the bound n m (1 - m) for the mean chance m, wider); no "
        "assumption about the examples either way. Lemma 5 holds where the interval contains 0.",
        "SWI MS theory: E[tokens per step] / (1 + passes c) from the cell's acceptance by draft position "
        "(Leviathan et al. 2023, Theorem 3.8), the drafter's passes including the one at the bonus "
        "position that π needs.",
        "wall× ours: walltime speedup over the large model's AR cell, with its paired 95% bootstrap "
        "interval over the examples; wall× theory: the same expected "
        "tokens per step priced at the passes' measured times, the large model's one-token pass over "
        "(this cell's target pass + the drafter passes a step needs x the drafter's pass): where the two "
        "agree, the walltime is what the acceptance and this machine's pass costs make it.",
        *explained,
    ]
    if not rows:
        notes.append(
            "No cell here records Lemma 5's expectation (rows written before it, or no spec_cascade "
            "cells): re-run the recipe to fill this table."
        )
    title = "Speculative Cascades Lemma 5: rejection rate per reviewed draft, ours | Lemma 5"
    return View(title, rows, notes)


def walltime_theory(cell: dict, cells) -> float:
    """The speedup over the large model's AR cell that the cell's expected tokens per step give at the
    measured pass times: t_AR / (t_verify + Σ_m passes_m · t_m) per expected token (NaN without the
    AR cell or the times)."""
    try:
        ar = _ar_cell(cell, cells)
        passes = json.loads(cell["theory_passes"])
        step = pass_ms(cell, cell["target"]) + sum(n * pass_ms(cell, m) for m, n in passes.items())
        return float(cell["theory_tokens_per_step"]) * pass_ms(ar, cell["target"]) / step
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return math.nan


def _ar_cell(cell: dict, cells) -> dict | None:
    """The autoregressive cell of ``cell``'s target on its dataset (the large model alone), if any."""
    if not {"method", "target", "dataset"} <= set(cells.columns):
        return None
    same = cells[
        (cells["method"] == BASELINE)
        & (cells["target"] == cell["target"])
        & (cells["dataset"] == cell["dataset"])
    ]
    return same.iloc[0].to_dict() if len(same) else None


def _lemma5_gaps(run: Run) -> dict[tuple[str, str], str]:
    """(dataset, cell) -> "gap [low, high]": counted minus expected rejections per reviewed draft, and
    its 95% interval were Lemma 5 true (:func:`lemma5_interval`; "gap [low, high]*" where the rows
    predate ``rejection_variance`` and the interval is the bound)."""
    from specbench.decoding.steps import reviewed_and_rejected

    totals: dict[tuple[str, str], list] = {}
    for row in read_examples(run.directory):
        if row.get("method") != "spec_cascade" or "expected_rejections" not in row:
            continue
        reviewed, rejected = reviewed_and_rejected(row["steps"])
        total = totals.setdefault((row["dataset"], row["cell"]), [0.0, 0.0, 0, 0.0])
        total[0] += rejected
        total[1] += row["expected_rejections"]
        total[2] += reviewed
        variance = row.get("rejection_variance")
        total[3] = None if variance is None or total[3] is None else total[3] + variance
    gaps = {}
    for key, (rejected, expected, reviewed, variance) in totals.items():
        if reviewed:
            gap, half = lemma5_interval(rejected, expected, reviewed, variance)
            mark = "*" if variance is None else ""
            gaps[key] = f"{num(gap, 3)} [{num(gap - half, 3)}, {num(gap + half, 3)}]{mark}"
    return gaps


def lemma5_interval(
    rejected: float, expected: float, reviewed: int, variance: float | None = None
) -> tuple[float, float]:
    """(counted - expected rejections per reviewed draft, its 95% half-width were Lemma 5 true).

    If draft i is rejected with probability c_i given everything before it (Lemma 5's claim, c_i the
    D_TV summed into ``expected``), the sum of 1(rejected_i) - c_i is a martingale: its terms are
    uncorrelated whatever ties a sequence's drafts together, and its variance is E Σ c_i (1 - c_i),
    which ``variance`` (the rows' ``rejection_variance``) estimates without bias. Without it, n m (1 - m)
    for m = Σ c_i / n bounds it (Jensen): wider, as safe. Either way no assumption about the examples
    (a percentile bootstrap over a dozen examples undercovers)."""
    rate = expected / reviewed
    spread = variance if variance is not None else reviewed * rate * (1 - rate)
    return (rejected - expected) / reviewed, 1.96 * math.sqrt(max(spread, 0.0)) / reviewed


def paper_label(method: str, params: dict | str | None = None, ref: dict | None = None) -> str | None:
    """The paper's name of a specbench method with these parameters (a spec_cascade's rule), or None.

    ``params`` is the cell's parameter dict, or just a rule name. An entry of the reference's
    ``methods`` (one mapping, or a list of them) matches when the method is the same and every other
    key it lists equals the cell's parameter; a missing parameter counts as false / empty.
    """
    ref = ref or spec_cascades_reference()
    if not isinstance(params, dict):
        params = {"rule": params} if params else {}
    for label, entries in ref["methods"].items():
        for entry in entries if isinstance(entries, list) else [entries]:
            if entry["method"] != method:
                continue
            if all(
                (params.get(key) if key in params else _absent(value)) == value
                for key, value in entry.items()
                if key != "method"
            ):
                return label
    return None


def _absent(value):
    """What a parameter the cell does not record stands for: false, or the empty string."""
    return False if isinstance(value, bool) else ""


def _paper(row: dict | None, key: str, dataset: str, ref: dict) -> str:
    """The paper's values of a row: on one of the paper's datasets its Small→Large and Small→XL
    values there, else the three Small→Large values (WMT/XSum/CNNDM)."""
    if not row:
        return MISSING
    labels = {task: label for label, task in ref["datasets"].items()}
    label = labels.get(str(dataset).split("/")[0])
    values = zip(ref["table2"]["columns"], row[key], strict=True)
    if label:
        return " / ".join(f"{pair} {v:.2f}" for (pair, d), v in values if d == label)
    return "S→L WMT/XSum/CNNDM " + "/".join(f"{v:.2f}" for v in row[key][:3])
