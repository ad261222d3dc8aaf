"""``eagle:<target>/<name>``: an EAGLE head trained by ``specbench distill --size eagle`` on the recipe
model ``options.of`` (its target, whose features it reads and whose embedding and LM head it shares),
from ``<cache>/drafters/<target>/<name>`` (:mod:`specbench.drafters.eagle`). ``cuda_graphs`` (default
true): on a GPU, the head's passes run at fixed shapes over a static cache, replayed as CUDA graphs
(:mod:`specbench.drafters.head_graphs`); false runs them eagerly (no effect on a CPU).
``attn_implementation`` (default sdpa): the head's layer's attention, sdpa or eager (transformers'
matmul-softmax-matmul, faster for a head's few rows on an H100)."""

from __future__ import annotations

from specbench.sources.heads import heads_source


def _attention_problem(source: str, options: dict):
    from specbench.drafters.eagle import HEAD_ATTENTION

    attention = options.get("attn_implementation", "sdpa")
    if attention not in HEAD_ATTENTION:
        return (
            "attn_implementation",
            f"an EAGLE head's attention is sdpa or eager, not {attention!r} (its tree mask is arbitrary)",
            "write attn_implementation: sdpa or eager",
        )
    return None


SOURCE = heads_source(
    "eagle",
    "an EAGLE head",
    "eagle",
    parameters=lambda m: m["parameters"],
    order=36,
    for_engine="HeadForEngine",
    options=("cuda_graphs", "attn_implementation"),
    check=_attention_problem,
)
