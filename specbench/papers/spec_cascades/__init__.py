"""Narasimhan et al., "Faster Cascades via Speculative Decoding" (ICLR 2025).

* ``curves``: quality against latency relative to the large model per cascade and α, the Pareto
  frontier and Table 2's two numbers read off it, the Figures 2-3 PNGs (``specbench plot --figure curves``);
* ``tables``: Table 2 beside a run (``--paper spec-cascades-table2``);
* ``reference.yaml``: the paper's numbers, transcribed.
"""

from specbench.papers.base import Paper
from specbench.papers.spec_cascades.tables import spec_cascades_reference, table2

PAPERS = (
    # the small model's own AR cell (its point on the curves) is part of the paper's setup too; the
    # original T5 (t5-large, without v1_1) is another model family, so it is not the paper's
    Paper(
        "spec-cascades-table2",
        table2,
        spec_cascades_reference,
        "T5 v1.1 large / XL (fine-tuned; T5 v1.1 small drafts)",
        ("t5-v1_1-large", "t5-v1_1-xl", "t5-v1_1-small"),
    ),
)
