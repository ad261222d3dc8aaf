"""Chen et al., "Cascade Speculative Drafting for Even Faster LLM Inference" (NeurIPS 2024).

* ``tables``: Tables 2-5 beside a run (``--paper cs-drafting-table2``: SWI on FLAN-T5 with Table 5's
  settings; ``--paper cs-drafting-table3``: walltime on Vicuna-7B with the Table 4 ablation);
* ``theory``: Section 4's EWIF closed forms and a Monte-Carlo simulator (``specbench theory table1``);
* ``reference.yaml``: the paper's numbers, transcribed.
"""

from specbench.papers.base import Paper
from specbench.papers.cs_drafting.tables import cs_drafting_reference, table2, table3

PAPERS = (
    Paper("cs-drafting-table2", table2, cs_drafting_reference, "google/flan-t5-xxl", ("flan-t5-xxl",)),
    Paper("cs-drafting-table3", table3, cs_drafting_reference, "Vicuna-7B", ("vicuna-7b",)),
)
