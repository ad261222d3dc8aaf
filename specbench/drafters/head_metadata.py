"""What a published head's files say about how it was trained, as a run records it in
environment.json (``checkpoint``): the target layers it reads and which field named them, the target
a speculators config names as its verifier, its layout and digest. The report reads these back to name
a head run with other states or another target than it was trained for
(:mod:`specbench.pipeline.views.head_alarms`)."""

from __future__ import annotations

from pathlib import Path

from specbench.errors import SpecbenchError

AUX_FIELD = "eagle_aux_hidden_state_layer_ids"
# SpecForge writes the ids inside an eagle_config object; vLLM reads the top-level field first
NESTED_AUX_FIELD = f"eagle_config.{AUX_FIELD}"
DEFAULT_AUX = "default"  # no field names them: EAGLE's 2, L // 2, L - 3


def aux_ids(config: dict, path: Path, where: str) -> tuple[list[int] | None, str, tuple[int, ...] | None]:
    """(the aux ids the head reads or None for EAGLE's default, the field that named them, the other
    ids ``eagle_config`` names where both fields are given and differ). vLLM's order: the top-level
    field, then ``eagle_config``'s."""
    nested = config.get("eagle_config")
    nested = nested.get(AUX_FIELD) if isinstance(nested, dict) else None
    found = [(f, ids) for f, ids in ((AUX_FIELD, config.get(AUX_FIELD)), (NESTED_AUX_FIELD, nested)) if ids]
    for field, ids in found:
        if not (isinstance(ids, list) and all(type(i) is int for i in ids)):
            raise SpecbenchError(
                where,
                f"{path}: {field} is {ids!r}; expected a list of layer ids",
                "write the target layers the head reads, e.g. [2, 16, 29]",
            )
    if config.get(AUX_FIELD) is not None and not found:  # [] or another empty value
        raise SpecbenchError(
            where,
            f"{path}: {AUX_FIELD} is {config.get(AUX_FIELD)!r}; expected a list of layer ids",
            "write the target layers the head reads, e.g. [2, 16, 29]",
        )
    if not found:
        return None, DEFAULT_AUX, None
    (field, ids), *rest = found
    others = [other for _, other in rest if sorted(other) != sorted(ids)]
    return ids, field, tuple(others[0]) if others else None


def verifier(speculators_config: dict | None) -> str | None:
    """The target a speculators config names (``verifier.name_or_path``), if any."""
    named = (speculators_config or {}).get("verifier")
    name = named.get("name_or_path") if isinstance(named, dict) else None
    return name if isinstance(name, str) and name else None


def record(checkpoint, aux: tuple[int, ...]) -> dict:
    """environment.json's ``checkpoint`` of a published EAGLE-3 head (a ``HeadCheckpoint``) that reads
    the target layers ``aux``."""
    named = verifier(checkpoint.speculators_config)
    return {
        "layout": checkpoint.layout,
        "path": str(checkpoint.folder),
        "digest": checkpoint.digest,
        "aux_layer_ids": list(aux),
        "aux_layer_ids_from": checkpoint.aux_layer_ids_from,
        **(
            {"aux_layer_ids_elsewhere": list(checkpoint.aux_layer_ids_elsewhere)}
            if checkpoint.aux_layer_ids_elsewhere
            else {}
        ),
        "draft_vocab_size": checkpoint.draft_vocab_size,
        "norm_before_residual": checkpoint.norm_before_residual,
        **({"verifier": named} if named else {}),
    }
