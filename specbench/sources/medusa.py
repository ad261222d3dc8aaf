"""``medusa:<target>/<name>``: Medusa heads trained by ``specbench distill --size medusa`` on the
recipe model ``options.of`` (their target, whose last hidden state they read and whose LM head they
share), from ``<cache>/drafters/<target>/<name>`` (:mod:`specbench.drafters.medusa`)."""

from __future__ import annotations

from specbench.sources.heads import heads_source

SOURCE = heads_source(
    "medusa",
    "Medusa heads",
    "medusa",
    parameters=lambda m: m["heads"] * (m["hidden_size"] ** 2 + m["hidden_size"]),
    order=35,
    for_engine="HeadsForEngine",
)
