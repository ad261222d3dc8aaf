"""CS Drafting's Tables 2-5 beside a run (``specbench report RUN --paper cs-drafting-table2|3``).

Chen et al., "Cascade Speculative Drafting for Even Faster LLM Inference" (NeurIPS 2024). The
reference numbers are data (this folder's ``reference.yaml``, copied from the paper). For each paper
row, "ours" is the best of our cells of the same dataset, algorithm and drafters: highest SWI for
Table 2, separately under MS and under PW (the paper tuned each column on its own, Table 5), and
highest tokens/s for Tables 3 and 4. The setting of that cell stands beside the paper's. A paper row
with no matching cell shows "—".

Rows are matched by role. A drafter's paper role comes from the model's source in the run's
``resolved_recipe.yaml`` (else ``environment.json``): ``*/flan-t5-base`` is BASE, ``*/flan-t5-small``
SMALL, ``maxgram`` MAG (exact names, never substrings). A source that is none of these (tiny or
distilled stand-ins, a local copy under another name) falls back to the recipe's model name:
``base``, ``small``, ``mag``. Table 3 has one drafter set, so there only the method matters (S
Decoding: a neural drafter). The caption names the models the run really used, so a run
on tiny or SmolLM2 models is never read as the paper's FLAN-T5 numbers.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from importlib import resources

import pandas as pd
import yaml

from specbench.decoding.theory import Expectation
from specbench.methods import BASELINE
from specbench.papers.base import MISSING, Run, View, best, num, num_interval, paired_interval
from specbench.papers.cs_drafting.theory import LEVIATHAN_COSTS, PARAM_COSTS
from specbench.sources import source_of

SOURCE_ROLES = {"flan-t5-small": "SMALL", "flan-t5-base": "BASE", "maxgram": "MAG"}
NAME_ROLES = {"base": "BASE", "small": "SMALL", "mag": "MAG"}
TREE_ATTENTION = "CS Drafting + Tree Attention"  # Table 3's row of cs_drafting cells that verify trees


@functools.lru_cache(maxsize=1)
def cs_drafting_reference() -> dict:
    """The paper's Tables 2-5 as transcribed in this folder's reference.yaml."""
    text = resources.files("specbench.papers.cs_drafting").joinpath("reference.yaml").read_text()
    return yaml.safe_load(text)


def role(run: Run, name: str) -> str | None:
    """The paper's name of a recipe model (module docstring), or None."""
    source = run.source(name)
    return SOURCE_ROLES.get(source.rstrip("/").rsplit("/", 1)[-1]) or NAME_ROLES.get(name)


def statistical(run: Run, name: str) -> bool:
    return not source_of(run.source(name)).neural


# -- matching ------------------------------------------------------------------------------------


def cell_params(row: dict) -> dict:
    """A cell's hyperparameters: the ``params`` JSON column, else the per-parameter columns."""
    if isinstance(row.get("params"), str):
        try:
            return json.loads(row["params"])
        except json.JSONDecodeError:
            pass
    params = {}
    for key in (
        "k",
        "K",
        "lenience",
        "k_convention",
        "mag_tokens",
        "mag_tail",
        "tree_children",
        "tree_nodes",
    ):
        value = row.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        params[key] = json.loads(value) if key == "K" and isinstance(value, str) else value
    return params


def cumulative_K(params: dict) -> list[list[int]] | None:
    """K in the paper's cumulative convention (the reference code's increments are summed along rows)."""
    K = params.get("K")
    if not K:
        return None
    if params.get("k_convention") == "increment":
        return [[sum(row[r : c + 1]) if c >= r else 0 for c in range(len(row))] for r, row in enumerate(K)]
    return K


def setting(method: str, params: dict) -> str:
    """A cell's hyperparameters in Table 5's terms: k11, k12, k22 (cumulative) and lenience l."""
    lenience = float(params.get("lenience", 1.0) or 1.0)
    if method == BASELINE:
        return ""
    if method == "speculative":
        return f"k11={params.get('k')}" + (f" l={lenience:g}" if lenience != 1.0 else "")
    if method == "cs_drafting":
        K = cumulative_K(params)
        if K is None:
            return ""
        if len(K) == 1:
            text = f"k11={K[0][0]}" + (" mag_tail=0" if int(params.get("mag_tail", 10)) == 0 else "")
        elif len(K) == 2:
            text = f"k11={K[0][0]} k12={K[0][1]} k22={K[1][1]}"
        else:
            text = "K=" + json.dumps(K, separators=(",", ":"))
        children = int(params.get("tree_children") or 1)
        text += f" l={lenience:g}" if len(K) >= 2 or lenience != 1.0 else ""
        return text + (f" children={children}" if children > 1 else "")
    return json.dumps(params, sort_keys=True)


def paper_setting(entry: dict) -> str:
    parts = [f"{key}={entry[key]:g}" for key in ("k11", "k12", "k22", "l") if entry.get(key) is not None]
    return " ".join(parts)


def annotate(run: Run) -> pd.DataFrame:
    """The run's cells with the columns matching needs: task, roles (tuple of paper names), params."""
    frame = run.cells.copy()
    frame["task"] = frame["dataset"].astype(str).str.split("/").str[0]
    names = [
        d.split("+") if isinstance(d, str) and d else [] for d in frame.get("drafter", [""] * len(frame))
    ]
    frame["roles"] = [tuple(role(run, n) for n in row) for row in names]
    frame["neural"] = [all(not statistical(run, n) for n in row) for row in names]
    frame["parsed"] = [cell_params(r) for r in frame.to_dict("records")]
    frame["tree"] = [int(params.get("tree_children") or 1) > 1 for params in frame["parsed"]]
    return frame


# -- the views -----------------------------------------------------------------------------------


REFERENCE_AGREEMENT = (
    "Against the authors' code (lfsszd/CS-Drafting): the same outputs and, with Max-Gram variant: "
    "reference, the same drafts and per-round counts, except that specbench never drafts past "
    "max_new_tokens and counts Max-Gram's calls (cost 0, no effect on SWI); docs/methods.md: Agreement "
    "with the reference implementation."
)


def table2(runs: list[Run]) -> tuple[list[View], list[dict]]:
    """CS Drafting Table 2 (SWI, MS and PW) with Table 5's settings beside ours."""
    ref = cs_drafting_reference()
    cells = pd.concat([annotate(run) for run in runs], ignore_index=True)
    settings = {(r["dataset"], r["algorithm"], tuple(r["drafters"])): r for r in ref["table5"]["rows"]}
    wanted = [(paper["dataset"], ref["datasets"][paper["dataset"]], paper) for paper in ref["table2"]["rows"]]
    first = ref["table2"]["rows"][0]["dataset"]
    templates = [paper for paper in ref["table2"]["rows"] if paper["dataset"] == first]
    for task in extra_tasks(cells, ref):  # the run's other datasets: our rows, no paper values
        wanted += [(task, task, {**paper, "ms": None, "pw": None}) for paper in templates]
    rows, chosen, tidy, ranked = [], [], [], []
    for label, task, paper in wanted:
        drafters = tuple(paper["drafters"])
        method = ref["algorithms"][paper["algorithm"]]
        mine = cells[
            (cells["task"] == task)
            & (cells["method"] == method)
            & ~cells["tree"]  # Table 2 verifies chains
            & cells["roles"].apply(lambda roles, want=drafters: roles == want)
        ]
        row = {"Dataset": label, "Algorithm": paper["algorithm"], "{M_di}": ",".join(drafters) or "-"}
        picked = dict(row)
        table5 = settings.get((label, paper["algorithm"], drafters), {})
        for column, metric in (("MS", "swi_ms"), ("PW", "swi_pw")):
            top = best(mine, metric)
            theirs = table5.get(column.lower())
            theory = _number(top.get(f"{metric}_theory")) if top else math.nan
            what_if = 1.0 if method == BASELINE else _best_at(mine, PAPER_COSTS[column], runs)
            if method == BASELINE and top:
                theory = 1.0
            row |= {
                f"{column} ours": num_interval(top, metric),
                f"{column} theory": num(theory),
                f"{column} what-if": num(what_if),
                f"{column} paper": num(paper[column.lower()]),
            }
            picked |= {
                f"{column} setting ours": setting(method, top["parsed"]) if top else MISSING,
                f"{column} setting paper": paper_setting(theirs) if theirs else MISSING,
            }
            ours = _number(top[metric]) if top else math.nan
            named = (label, column, row["Algorithm"], row["{M_di}"], paper[column.lower()])
            ranked.append((*named, ours, theory, what_if, top))
            tidy.append(
                _tidy("2", label, paper["algorithm"], row["{M_di}"], metric, top, paper[column.lower()])
                | {
                    "ours_setting": setting(method, top["parsed"]) if top else "",
                    "paper_setting": paper_setting(theirs) if theirs else "",
                    "theory": theory,
                    "what_if": what_if,
                }
            )
        rows.append(row)
        chosen.append(picked)
    notes = [
        f"Paper: {ref['table2']['source']}.",
        "ours = the best of this run's cells of the same dataset, algorithm and drafters, chosen per column "
        "(highest SWI under MS, and separately under PW), as the paper tuned each column, with its 95% "
        "bootstrap interval over the prompts; — = no such cell; its setting is in the table below.",
        "theory = what the papers' analysis expects of that cell from its measured acceptance by draft "
        "position and the cost table: E[tokens per target step] / E[cost per step] (Leviathan et al. 2023, "
        "Theorem 3.8; Chen et al., Corollary 4.2, and Theorems 4.3/4.5 generalised to the K-matrix rule, "
        "with Max-Gram's draft lengths as measured). what-if = the same theory with the paper's costs "
        "(MS: FLAN-T5 parameter ratios, SMALL 0.0069, BASE 0.022; PW: Leviathan et al.'s Table 4, SMALL "
        "0.02, BASE 0.04; MAG 0) and our acceptance, best over this run's settings of the row.",
        *orderings(ranked, runs),
        REFERENCE_AGREEMENT,
    ]
    settings_notes = [
        f"Paper: {ref['table5']['source']}.",
        "Settings: k11, k12 budgets at the target's review, k22 at M_d1's, l lenience (cumulative, Table 5).",
    ]
    return [
        View("CS Drafting Table 2 (FLAN-T5; SWI): ours | theory | paper", rows, notes),
        View("CS Drafting Table 5 (the settings of Table 2's cells): ours | paper", chosen, settings_notes),
    ], tidy


# the paper's cost coefficients by role, relative to FLAN-T5-XXL (theory.py: PARAM_COSTS, LEVIATHAN_COSTS)
PAPER_COSTS = {
    "MS": {"SMALL": PARAM_COSTS["small"], "BASE": PARAM_COSTS["base"], "MAG": 0.0},
    "PW": {"SMALL": LEVIATHAN_COSTS["small"], "BASE": LEVIATHAN_COSTS["base"], "MAG": 0.0},
}


def _best_at(mine: pd.DataFrame, costs: dict[str, float], runs: list[Run]) -> float:
    """The highest SWI the theory gives this row's cells at the paper's ``costs`` (by role), NaN when
    the cells carry no theory (a method it does not cover, or a cells.csv without rows)."""
    by_run = {run.name: run for run in runs}
    values = []
    for cell in mine.to_dict("records"):
        passes = cell.get("theory_passes")
        if not isinstance(passes, str):
            continue
        run = by_run[cell["run"]]
        priced = {name: costs.get(role(run, name) or "") for name in json.loads(passes)}
        expected = Expectation(float(cell["theory_tokens_per_step"]), json.loads(passes))
        values.append(expected.swi({**priced, "target": 1.0}, "target"))
    values = [v for v in values if v == v]
    return max(values) if values else math.nan


def orderings(ranked: list[tuple], runs: list[Run], theory: str = "theory") -> list[str]:
    """For every pair of rows the paper orders one way and this run the other (per dataset and
    column): the paired bootstrap interval of our ratio (is the reversal more than the prompts'
    noise?), whether the theory from our acceptance predicts our order, and whether the theory at the
    paper's costs gives the paper's order back. ``ranked``: (dataset, column, algorithm, drafters,
    paper, ours, theory, what-if, our cell or None) per row; ``theory`` names the theory's column."""
    lines = []
    groups: dict[tuple, list[tuple]] = {}
    for entry in ranked:
        groups.setdefault(entry[:2], []).append(entry)
    for (label, column), entries in groups.items():
        pairs, kept, unclear = [], 0, 0
        for a, b in itertools.combinations(entries, 2):
            high, low = (a, b) if _number(a[4]) > _number(b[4]) else (b, a)
            if not _number(high[4]) > _number(low[4]) or math.isnan(_number(high[5]) + _number(low[5])):
                continue  # the paper does not order them, or we have no cell
            interval = _interval(runs, high[8], low[8], column)
            if _number(high[5]) >= _number(low[5]):
                kept += 1
                unclear += interval[0] <= 1.0  # our order holds, but not beyond the prompts' noise
                continue
            text = (
                f"{_name(high)} > {_name(low)} in the paper ({high[4]:.2f} > {low[4]:.2f}), "
                f"{_versus(high[5], low[5])} ours"
            )
            if not math.isnan(interval[0]):
                noise = ", within noise" if interval[1] >= 1.0 else ""
                text += f" (ratio 95% CI {interval[0]:.2f}-{interval[1]:.2f}{noise})"
            if not math.isnan(high[6] + low[6]):
                verdict = "predicts it" if high[6] < low[6] else "does not predict it"
                text += f"; {theory} {_versus(high[6], low[6])} {verdict}"
            if not math.isnan(high[7] + low[7]):
                back = "the paper's order" if high[7] > low[7] else "still reversed"
                text += f"; at the paper's costs {_versus(high[7], low[7])}, {back}"
            pairs.append(text)
        if kept or pairs:
            noise = f" ({unclear} of them within noise: the paired 95% CI of the ratio includes 1)"
            lines.append(
                f"{label} {column}: the paper's order holds in {kept} of {kept + len(pairs)} pairs of rows"
                + (noise if unclear else "")
                + (". Reversed: " + "; ".join(pairs) if pairs else "")
                + "."
            )
    return lines


def _interval(runs: list[Run], high: dict | None, low: dict | None, column: str) -> tuple[float, float]:
    """Paired 95% CI of SWI(high) / SWI(low) in ``column`` (MS or PW), or of their tokens/s (column
    "tokens/s"); NaN without both cells."""
    if not high or not low:
        return math.nan, math.nan
    return paired_interval(runs, high, low, "tokens_per_s" if column == "tokens/s" else column.lower())


def _versus(a: float, b: float) -> str:
    """``a < b`` (or >=) with the decimals it takes for the two to differ on the page."""
    digits = 2 if round(a, 2) != round(b, 2) else 3
    return f"{a:.{digits}f} {'<' if a < b else '>' if a > b else '='} {b:.{digits}f}"


def _name(entry: tuple) -> str:
    return entry[2] if entry[3] == "-" else f"{entry[2]} {entry[3]}"


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def extra_tasks(cells: pd.DataFrame, ref: dict) -> list[str]:
    """The run's datasets that the paper does not have (e.g. arithmetic in a tiny CI run), in order."""
    return [task for task in dict.fromkeys(cells["task"]) if task not in ref["datasets"].values()]


def table3(runs: list[Run]) -> tuple[list[View], list[dict]]:
    """CS Drafting Table 3 (walltime on Vicuna-7B) and Table 4 (the K00 ablation)."""
    ref = cs_drafting_reference()
    cells = pd.concat([annotate(run) for run in runs], ignore_index=True)
    ar = next(r for r in ref["table3"]["rows"] if r["algorithm"] == "Autoregressive")
    tasks = {label: ref["datasets"][label] for label in ("GSM8K", "MMLU")}
    tasks |= {task: task for task in extra_tasks(cells, ref)}  # the run's other datasets, no paper values
    hyper = ref["table3"].get("hyperparameters") or {}
    rows, tidy, ranked = [], [], []
    for label, task in tasks.items():
        for paper in ref["table3"]["rows"]:
            method = ref["algorithms"][paper["algorithm"]]
            mine = cells[(cells["task"] == task) & (cells["method"] == method)]
            if method == "cs_drafting":  # the tree attention row takes the tree cells, the other the chains
                mine = mine[mine["tree"] == (paper["algorithm"] == TREE_ATTENTION)]
            if method == "speculative":  # S Decoding with the neural drafter, not a statistical one
                mine = mine[mine["neural"]]
            top = best(mine, "tokens_per_s") if method else None
            theirs = paper.get(label)
            speedup = theirs / ar[label] if theirs is not None else None
            ours_setting = setting(method, top["parsed"]) if top else ""
            predicted = _number(top.get("tokens_per_s_predicted")) if top else math.nan
            ours = _number(top["tokens_per_s"]) if top else math.nan
            ranked.append(
                (label, "tokens/s", paper["algorithm"], "-", theirs, ours, predicted, math.nan, top)
            )
            rows.append(
                {
                    "Dataset": label,
                    "Algorithm": paper["algorithm"],
                    "tok/s ours": num(top["tokens_per_s"]) if top else MISSING,
                    "tok/s predicted": num(predicted),
                    "tok/s paper": num(theirs),
                    "×AR ours": num_interval(top, "speedup_vs_ar"),
                    "×AR paper": num(speedup),
                    "setting ours": ours_setting if top else MISSING,
                    "setting paper": _hyper(hyper, paper) if theirs is not None else MISSING,
                }
            )
            for metric, value in (("tokens_per_s", theirs), ("speedup_vs_ar", speedup)):
                tidy.append(
                    _tidy("3", label, paper["algorithm"], "", metric, top, value)
                    | {"ours_setting": ours_setting, "paper_setting": rows[-1]["setting paper"]}
                )
    notes = [
        f"Paper: {ref['table3']['source']}.",
        "ours = the cell with the highest tokens/s per algorithm and dataset; ×AR: tokens/s over the "
        "autoregressive cell of the same run (the paper's: over its own AR row), which compares across GPUs.",
        "Paper setting: Appendix B, in the reference code's increments over [vicuna-68m, Max-Gram]; "
        "specbench's K has no Max-Gram column, so [[2,10],[0,10]] runs as K = [[2]] with 10 Max-Gram tokens.",
        "Medusa: Medusa-1 heads trained on the run's own target (specbench distill --size medusa), the "
        "fastest tree. CS Drafting + Tree Attention: a cs_drafting cell with tree_children > 1 (each chain "
        "token with siblings from its reviewer's law, verified as one tree); CS Drafting: chain cells only.",
        "predicted = the cell's tokens/s from its forward counts and per-pass times fitted on the other "
        "half of the run's prompts (specbench's held-out prediction): where it gives our order, this "
        "machine's pass costs and the cells' acceptance explain a reversal; the ratio's paired 95% CI "
        "says whether it is more than the prompts' noise.",
        *orderings(ranked, runs, theory="predicted"),
    ]
    views = [View("CS Drafting Table 3 (Vicuna-7B; walltime): ours | paper", rows, notes)]

    table4 = ref["table4"]
    gsm8k = cells[
        (cells["task"] == ref["datasets"][table4["dataset"]])
        & (cells["method"] == "cs_drafting")
        & ~cells["tree"]
    ]
    k11 = pd.Series([(cumulative_K(p) or [[None]])[0][0] for p in gsm8k["parsed"]], index=gsm8k.index)
    horizontal = pd.Series([int(p.get("mag_tail", 10)) > 0 for p in gsm8k["parsed"]], index=gsm8k.index)
    without = table4["without_horizontal_cascade"]
    wanted = [(str(paper["K00"]), paper["K00"], True, paper["walltime"]) for paper in table4["rows"]]
    wanted.append((f"{without['K00']}, no horizontal cascade", without["K00"], False, without["walltime"]))
    rows4 = []
    for label, k00, cascade, walltime in wanted:
        top = best(gsm8k[(k11 == k00) & (horizontal == cascade)], "tokens_per_s")
        rows4.append(
            {
                "K00": label,
                "tok/s ours": num(top["tokens_per_s"]) if top else MISSING,
                "tok/s predicted": num(top.get("tokens_per_s_predicted")) if top else MISSING,
                "tok/s paper": num(walltime),
                "×AR ours": num_interval(top, "speedup_vs_ar"),
                "setting ours": setting("cs_drafting", top["parsed"]) if top else MISSING,
            }
        )
        tidy.append(
            _tidy("4", table4["dataset"], "CS Drafting", "", "tokens_per_s", top, walltime)
            | {
                "ours_setting": setting("cs_drafting", top["parsed"]) if top else "",
                "paper_setting": f"K00={k00}" + ("" if cascade else " mag_tail=0"),
            }
        )
    notes4 = [
        f"Paper: {table4['source']}. K00 = k11, the neural drafter's budget at the target's review.",
        "The horizontal cascade (Max-Gram's tokens ending the target's draft) is on in the K00 rows; "
        "without it (Sec. 5.2's ablation) is a cs_drafting cell with mag_tail: 0. predicted and ×AR as in "
        "Table 3 above.",
    ]
    views.append(View("CS Drafting Table 4 (K00): ours | paper", rows4, notes4))
    return views, tidy


# -- helpers -------------------------------------------------------------------------------------


def _tidy(table: str, dataset: str, algorithm: str, drafters: str, metric: str, top, paper) -> dict:
    return {
        "table": table,
        "dataset": dataset,
        "algorithm": algorithm,
        "drafters": drafters,
        "metric": metric,
        "ours": float(top[metric]) if top else math.nan,
        "paper": paper,
        "run": top["run"] if top else "",
        "cell": top["cell"] if top and "cell" in top else "",
    }


def _hyper(hyper: dict, paper: dict) -> str:
    entry = hyper.get(paper["algorithm"])
    if not entry:
        return ""
    return " ".join(f"{key}={json.dumps(value, separators=(',', ':'))}" for key, value in entry.items())
