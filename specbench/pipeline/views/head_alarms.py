"""The report's alarms for a drafter that is wired wrong rather than weak.

The field's most common failure with a published head is one that silently accepts nothing: tokens
per target pass of exactly 1.0 because the fused-state width or aux layer ids are wrong, the draft
vocabulary maps to other tokens, the prompts are in another chat template than it was trained on, or
``norm_before_residual`` was read with the other default. A weak drafter still commits a little; one
within :data:`NEAR_ONE` of 1.0 on prompts where prompt lookup, which only copies, commits
:data:`LOOKUP_COMMITS` or more, is almost surely misconfigured (``misconfigured_note``). Apart from
acceptance, a head run on another target than the one its files name, with prompts outside the chat
template it was trained on, or with aux ids its config names twice over is named
(``head_mismatch_note``), from what environment.json recorded of it (``checkpoint``) against the run's
resolved recipe.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import yaml

from specbench.pipeline.records.results import RESOLVED_RECIPE, read_environment

NEAR_ONE = 0.05  # tokens per target pass within this of 1.0: nothing accepted
LOOKUP_COMMITS = 1.3  # prompt lookup's tokens per target pass on the same prompts: there was text to copy
COPYING_SOURCES = ("prompt-lookup", "maxgram")  # statistical drafters that copy from the context


def acceptance(record: dict) -> float:
    """Tokens per target pass, else the mean accepted per step + 1 (cells.csv from before the first)."""
    for value, offset in (
        (record.get("acceptance_length"), 0.0),
        (record.get("accepted_per_step_mean"), 1.0),
    ):
        try:
            number = float(value) + offset
        except (TypeError, ValueError):
            continue
        if not math.isnan(number):
            return number
    return math.nan


def _recorded(run_dir: Path) -> tuple[dict, dict]:
    """(environment.json's models, the resolved recipe) of a run; {} for what it lacks."""
    models = read_environment(run_dir).get("models") or {}
    try:
        recipe = yaml.safe_load((run_dir / RESOLVED_RECIPE).read_text()) or {}
    except (OSError, yaml.YAMLError):
        recipe = {}
    return (models if isinstance(models, dict) else {}), (recipe if isinstance(recipe, dict) else {})


def likely_causes(model: dict | None) -> str:
    """What to check of a drafter that accepts nothing, from what the run recorded of it."""
    model = model or {}
    checkpoint = model.get("checkpoint") or {}
    layout = checkpoint.get("layout")
    template = "the chat template (the head was trained on prompts in its target's; see chat_template)"
    if "norm_before_residual" in checkpoint:  # an EAGLE-3 head (specbench.drafters.head_metadata.record)
        aux = checkpoint.get("aux_layer_ids")
        named = checkpoint.get("aux_layer_ids_from")
        how = (
            "EAGLE's default 2, L // 2, L - 3, since its config names none: a head trained on other "
            "layers (checkpoints differ by one) reads the wrong states"
            if named in (None, "default")
            else f"from its {named}"
        )
        nbr = checkpoint.get("norm_before_residual")
        return (
            f"the fused-state width and aux layer ids (it read the inputs of layers {aux}, {how}); the "
            f"draft vocabulary mapping (d2t/t2d, {checkpoint.get('draft_vocab_size')} draft tokens); "
            f"{template}; norm_before_residual (read {str(nbr).lower()}; speculators defaults it to "
            "false, vLLM to true)"
        )
    if layout == "eagle1":
        return (
            "the feature it reads (the target's final state after its final norm: a head trained on "
            f"another target's states accepts nothing); its embedding; {template}"
        )
    if checkpoint:  # Medusa's published heads, the heads specbench trains
        trained = checkpoint.get("verifier") or checkpoint.get("trained_on")
        on = f" ({trained})" if trained else ""
        return f"the target it was trained on{on} against this run's; the states it reads; {template}"
    return (
        "its tokenizer and chat template against the target's (a drafter that tokenizes or formats "
        "the prompt otherwise proposes tokens the target never emits), and which weights were loaded"
    )


def misconfigured_note(cells: pd.DataFrame, run_dirs: list[Path]) -> str:
    """``!`` line naming each drafting cell that commits within NEAR_ONE of 1.0 tokens per target pass
    where a prompt-lookup cell of the same run and dataset commits LOOKUP_COMMITS or more, with the
    likely causes; empty when there is none."""
    if "drafter" not in cells.columns:
        return ""
    found = []
    for run_dir in run_dirs:
        models, _ = _recorded(run_dir)
        copying = {
            name for name, m in models.items() if isinstance(m, dict) and m.get("source") in COPYING_SOURCES
        }
        if not copying:
            continue
        mine = cells[cells["run"] == run_dir.name] if "run" in cells.columns else cells
        for dataset, group in mine.groupby("dataset", sort=False):
            records = group.to_dict("records")
            lookups = [r for r in records if set(_drafters(r)) & copying and not math.isnan(acceptance(r))]
            if not lookups:
                continue
            best = max(lookups, key=acceptance)
            if acceptance(best) < LOOKUP_COMMITS:
                continue
            for r in records:
                drafters = _drafters(r)
                if not drafters or set(drafters) & copying or abs(acceptance(r) - 1.0) > NEAR_ONE:
                    continue
                causes = "; ".join(f"{d}: {likely_causes(models.get(d))}" for d in drafters)
                found.append(
                    f"{dataset} {r['cell']} commits {acceptance(r):.2f} tokens per target pass while "
                    f"{best['cell']} (prompt lookup) commits {acceptance(best):.2f} on the same prompts, "
                    f"so its drafter is likely misconfigured, not weak; check {causes}"
                )
    if not found:
        return ""
    return "! misconfigured drafter? " + " | ".join(found) + "."


def _drafters(record: dict) -> list[str]:
    drafter = record.get("drafter")
    return [d for d in drafter.split("+") if d] if isinstance(drafter, str) else []


def head_mismatch_note(run_dirs: list[Path]) -> str:
    """``!`` line naming each head run otherwise than its recorded metadata says it was trained: on
    another target than its files name, on prompts without the chat template it was trained with, or
    with aux ids its config names twice, differently; empty when there is none."""
    found = []
    for run_dir in run_dirs:
        models, recipe = _recorded(run_dir)
        entries = recipe.get("models") or {}
        plain = [
            f"{d.get('task')}" + (f"/{d['split']}" if d.get("split") else "")
            for d in recipe.get("datasets") or []
            if isinstance(d, dict) and d.get("chat_template") is False
        ]
        for name, model in models.items():
            checkpoint = model.get("checkpoint") if isinstance(model, dict) else None
            if not isinstance(checkpoint, dict):
                continue
            parts = []
            trained = checkpoint.get("verifier") or checkpoint.get("trained_on")
            of = ((entries.get(name) or {}).get("options") or {}).get("of")
            target = (models.get(of) or {}).get("source") if of else None
            if isinstance(trained, str) and isinstance(target, str) and not same_model(trained, target):
                parts.append(
                    f"its files name {trained} as the target it was trained for; this run's is {target}"
                )
            if plain:
                parts.append(
                    "it was trained on prompts in its target's chat template, and this run renders "
                    f"{', '.join(plain)} without it (chat_template: false)"
                )
            elsewhere = checkpoint.get("aux_layer_ids_elsewhere")
            if elsewhere:
                parts.append(
                    f"its config names aux layers {checkpoint.get('aux_layer_ids')} and, in eagle_config, "
                    f"{elsewhere}; this run read the first, as vLLM does"
                )
            if parts:
                found.append(f"{run_dir.name} {name}: " + "; ".join(parts))
    if not found:
        return ""
    return "! heads run otherwise than they were trained: " + " | ".join(found) + "."


def same_model(a: str, b: str) -> bool:
    """Whether two model names (Hub ids, folders, aliases) name the same model: their last path
    components, case aside."""
    return a.rstrip("/").rsplit("/", 1)[-1].lower() == b.rstrip("/").rsplit("/", 1)[-1].lower()
