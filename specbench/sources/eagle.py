"""``eagle:<target>/<name>``: an EAGLE head trained by ``specbench distill --size eagle`` (or ``eagle3``,
which fuses the target's low, middle and high layers) on the recipe
model ``options.of`` (its target, whose features it reads and whose embedding and LM head it shares),
from ``<cache>/drafters/<target>/<name>`` (:mod:`specbench.drafters.eagle`). ``cuda_graphs`` (default
true): on a GPU, the head's passes run at fixed shapes over a static cache, replayed as CUDA graphs
(:mod:`specbench.drafters.head_graphs`); false runs them eagerly (no effect on a CPU).
``attn_implementation`` (default sdpa): the head's layer's attention, sdpa or eager (transformers'
matmul-softmax-matmul, faster for a head's few rows on an H100). ``step_graph`` (default false): with
``cuda_graphs`` on a GPU, a greedy tree's levels run as one graph a step, every level drafted and the
tree read once (:meth:`~specbench.drafters.eagle.EagleDrafter.greedy_tree`; the same trees); on a CPU
the same fixed shapes run uncaptured (a check of the GPU's path, slower than the default)."""

from __future__ import annotations

from specbench.sources.heads import heads_source


def head_options_problem(source: str, options: dict):
    """The EAGLE drafter's options that cannot go together (shared with published heads, ``eagle3:``)."""
    from specbench.drafters.eagle import HEAD_ATTENTION

    attention = options.get("attn_implementation", "sdpa")
    if attention not in HEAD_ATTENTION:
        return (
            "attn_implementation",
            f"an EAGLE head's attention is sdpa or eager, not {attention!r} (its tree mask is arbitrary)",
            "write attn_implementation: sdpa or eager",
        )
    if options.get("step_graph") and options.get("cuda_graphs") is False:
        return (
            "step_graph",
            "a step graph replays the head's fixed-shape passes, which cuda_graphs: false turns off",
            "drop one of step_graph: true and cuda_graphs: false",
        )
    return None


SOURCE = heads_source(
    "eagle",
    "an EAGLE head",
    "eagle",
    parameters=lambda m: m["parameters"],
    order=36,
    for_engine="HeadForEngine",
    options=("cuda_graphs", "attn_implementation", "step_graph"),
    check=head_options_problem,
)
