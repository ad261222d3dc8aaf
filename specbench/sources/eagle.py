"""``eagle:<target>/<name>``: an EAGLE head trained by ``specbench distill --size eagle`` on the recipe
model ``options.of`` (its target, whose features it reads and whose embedding and LM head it shares),
from ``<cache>/drafters/<target>/<name>`` (:mod:`specbench.drafters.eagle`). ``cuda_graphs`` (default
true): on a GPU, the head's passes run at fixed shapes over a static cache, replayed as CUDA graphs
(:mod:`specbench.drafters.head_graphs`); false runs them eagerly (no effect on a CPU)."""

from __future__ import annotations

from specbench.sources.heads import heads_source

SOURCE = heads_source(
    "eagle",
    "an EAGLE head",
    "eagle",
    parameters=lambda m: m["parameters"],
    order=36,
    for_engine="HeadForEngine",
    options=("cuda_graphs",),
)
