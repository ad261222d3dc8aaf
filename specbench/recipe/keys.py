"""Row keys: what enters a cell's fingerprint, and the keys rows from before them lack.

A cell's fingerprint hashes everything that determines its outputs (method, parameters, models as they
run here, generation settings, seed) and nothing else, so a resumed run recomputes exactly the rows
whose inputs changed. Each setting added after rows were committed would change every key, so it
enters only where it differs from the value those rows were measured at: :data:`LEGACY_KEYS` lists
them, with why and since when, and :func:`without_legacy_keys` applies the list. A new setting that
changes no existing row gets one entry there; ``tests/test_provenance.py`` re-keys every committed run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from specbench.methods import ParamSpec

# cell: the cell's own payload; generation: its generation settings; model: each model's entry;
# params: the method's parameters (each declared ``added_later`` on its ParamSpec, at its default)
Scope = Literal["cell", "generation", "model", "params"]


@dataclass(frozen=True)
class LegacyKey:
    """A key left out of a fingerprint while it holds one of the values rows from before it were
    measured at (those rows have no such key)."""

    scope: Scope
    key: str  # "*" in scope params: every parameter declared added_later, absent at its default
    absent_at: tuple[Any, ...]  # the values older rows were measured at ("*": each one's default)
    reason: str
    since: str  # the commit (and issue) that added the key


LEGACY_KEYS: tuple[LegacyKey, ...] = (
    LegacyKey(
        "params",
        "*",
        (),
        "rows from before a parameter existed ran at its default (ParamSpec.added_later)",
        "97e0c66 (speculative cascades, SpecDec++: tree_children and later parameters)",
    ),
    LegacyKey(
        "cell",
        "drafters",
        ([],),
        "only cascades take a drafters list; every other cell's key predates it",
        "7898bac (CS Drafting's cascade loop)",
    ),
    LegacyKey(
        "cell",
        "replay",
        (False,),
        "rows from before target replay ran the target live",
        "d10c2b7 (target replay, specbench tune)",
    ),
    LegacyKey(
        "cell",
        "revision",
        (1,),
        "rows from before a method's outputs changed are its first revision (Method.revision)",
        "33f546b (CS Drafting's Max-Gram budget rule, revision 2)",
    ),
    LegacyKey(
        "generation",
        "max_length",
        (None,),
        "rows from before max_length had no cap beyond max_new_tokens",
        "053609f (recipes extend another; SpecDec++'s max_length)",
    ),
    LegacyKey(
        "model",
        "resolved_dtype",
        (None, "float32"),
        "rows from before dtype: auto was resolved per machine ran in float32 (the old CPU resolution); "
        "None: an explicit dtype, or a source without a dtype rule",
        "f08a5f4 (issue 17: the lossless check knows numerics)",
    ),
    LegacyKey(
        "model",
        "engine",
        ("eager",),
        "rows from before engines ran eagerly",
        "232cb6f (issue 17: the compiled engine)",
    ),
    LegacyKey(
        "model",
        "engine_options",
        ({},),
        "rows from before serving engines had no engine options",
        "1ca01a2 (engines as backends: engine: vllm)",
    ),
    LegacyKey(
        "model",
        "linear",
        ("aten",),
        "rows from before the linear setting ran torch's own linear layers",
        "e9a702d (linear layers on oneDNN's reordered weights)",
    ),
)


def without_legacy_keys(payload: dict, scope: Scope, declared: Mapping[str, ParamSpec] | None = None) -> dict:
    """``payload`` less every key of ``scope`` that :data:`LEGACY_KEYS` leaves out at its value;
    ``declared``: the method's parameters, for scope params."""
    declared = declared or {}
    kept = dict(payload)
    for rule in LEGACY_KEYS:
        if rule.scope != scope:
            continue
        if rule.key == "*":
            kept = {
                name: value
                for name, value in kept.items()
                if not (name in declared and declared[name].added_later and value == declared[name].default)
            }
        elif rule.key in kept and kept[rule.key] in rule.absent_at:
            del kept[rule.key]
    return kept


def model_key(entry: dict, engine: str, linear: str, resolved_dtype: str | None) -> dict:
    """A model as it enters fingerprints: its recipe entry (``entry``, as dumped to JSON) with the
    engine and linear library it runs with and, for ``dtype: auto``, the dtype that resolves to on the
    machine that ran it, so that rows measured in bfloat16 never resume as float32 ones. Engines enter
    because outputs may differ in low precision; times do."""
    payload = entry | {"engine": engine, "linear": linear, "resolved_dtype": resolved_dtype}
    return without_legacy_keys(payload, "model")


def cell_key(
    method: str,
    params: dict,
    declared: Mapping[str, ParamSpec],
    models: dict[str, Any],
    generation: dict,
    seed: int,
    revision: int,
    replay: bool,
) -> str:
    """The fingerprint of a cell: ``models`` holds target, drafter (None without one) and drafters (a
    list) as :func:`model_key` gives them; ``generation`` the settings as dumped to JSON."""
    payload = {
        "method": method,
        "params": without_legacy_keys(params, "params", declared),
        **models,
        "generation": without_legacy_keys(generation, "generation"),
        "seed": seed,
        "revision": revision,
        "replay": replay,
    }
    return digest(without_legacy_keys(payload, "cell"))


def digest(data: Any) -> str:
    """16 hex digits of the SHA-256 of ``data`` as canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
