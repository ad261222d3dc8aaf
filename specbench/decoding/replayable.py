"""Which cells may replay their target from its autoregressive output (:mod:`specbench.models.replay`).

A replayed target answers every review with the argmax of its recorded greedy output, so only a
method whose review of the target is strict, over chains, reproduces a live run: it must declare its
cells ``lossless``, verify no token trees, and run the target through the review (``no_replay`` says
why one cannot). The recipe adds what only it knows: greedy decoding, and an autoregressive cell on
the same target to replay.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from specbench.methods import BASELINE, Method


def replay_problem(
    info: Method, spec: Any, temperature: float, cells: Iterable[dict], has_reference: bool
) -> tuple[str, str] | None:
    """Why the target of ``spec`` (a recipe's method entry) cannot be replayed in cells with the
    parameters ``cells``, as (problem, fix); None when it can. ``temperature``: the recipe's;
    ``has_reference``: whether the recipe runs the autoregressive method on the same target."""
    if info.no_replay:
        return (
            f"method {spec.method!r} cannot replay the target: {info.no_replay}",
            "remove replay: (it works with speculative and cs_drafting)",
        )
    if spec.method == BASELINE:
        return "the autoregressive output is what other cells replay", "remove replay: here"
    if temperature > 0:
        return (
            f"replay needs greedy decoding, but generation.temperature is {temperature}",
            "set generation.temperature: 0, or remove replay:",
        )
    for point in cells:
        if info.tree_sizes(point):
            return (
                f"{spec.method} cells that verify token trees cannot replay the target: a replay of "
                "its output scores chains only",
                "remove replay:, or verify chains (tree_children: 1)",
            )
        if not info.lossless(point):
            given = ", ".join(
                f"{name}={point[name]}" for name in sorted(spec.params.keys() | spec.grid.keys())
            )
            return (
                f"{spec.method} with {given} is not lossless, so its output is not the target's to replay",
                "use lenience: 1 (in params and grid), or remove replay:",
            )
    if not has_reference:
        return (
            f"replay reuses the autoregressive output of {spec.target!r}, but no method produces it",
            f"add {{name: ar, method: autoregressive, target: {spec.target}}} to methods",
        )
    return None
