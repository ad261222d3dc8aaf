"""A cascade's drafters (CS Drafting's ``drafters:`` list), as its Method declares in ``check_roles``:
neural models largest first, then one statistical drafter at the bottom (Max-Gram or prompt lookup).

The entry and the models are the recipe's, typed loosely as in :mod:`specbench.decoding.roles`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specbench.sources import source_of


def cascade_roles_problem(spec: Any, models: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """drafters: neural models largest first, then exactly one statistical drafter (the bottom);
    ``spec`` is the recipe's method entry, ``models`` the recipe's models."""
    shape = "list neural drafters largest first and one statistical drafter (maxgram) last"
    if spec.drafter is not None:
        return "drafter", f"method {spec.method!r} takes drafters: (a list), not drafter:", shape
    if not spec.drafters:
        return "drafters", f"method {spec.method!r} needs drafters", shape
    statistical = [not source_of(models[name].source).neural for name in spec.drafters]
    for i, name in enumerate(spec.drafters):
        at = f"drafters[{i}]"
        if name == spec.target:
            return at, f"{name!r} is the target", "drafters are models other than the target"
        if name in spec.drafters[:i]:
            j = spec.drafters.index(name)
            return at, f"{name!r} appears twice (also drafters[{j}])", "list each drafter once"
        if statistical[i] and i < len(spec.drafters) - 1:
            return (
                at,
                f"{name!r} is a statistical drafter but not the last one",
                "put the statistical drafter last (it is the bottom of the cascade) and use only one",
            )
    if not statistical[-1]:
        return (
            "drafters",
            f"the last drafter {spec.drafters[-1]!r} is neural: the cascade has no statistical bottom",
            "append a statistical drafter (source: maxgram or prompt-lookup)",
        )
    if len(spec.drafters) == 1:
        return (
            "drafters",
            f"{spec.drafters[0]!r} alone: the cascade needs at least one neural drafter",
            f"add neural drafters before it, or use method speculative with drafter: {spec.drafters[0]}",
        )
    return None
