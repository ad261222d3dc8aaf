"""Chen et al., "Cascade Speculative Drafting for Even Faster LLM Inference" (NeurIPS 2024).

* ``tables``: Tables 2-5 beside a run (``--paper cs-drafting-table2``: SWI on FLAN-T5 with Table 5's
  settings; ``--paper cs-drafting-table3``: walltime on Vicuna-7B with the Table 4 ablation);
* ``theory``: Section 4's EWIF closed forms and a Monte-Carlo simulator (``specbench theory table1``);
* ``commands``: ``specbench theory table1``;
* ``views``: the ``--paper`` views, declared as the registries read them;
* ``reference.yaml``: the paper's numbers, transcribed.
"""

from specbench.papers.commands import views_on_demand
from specbench.papers.cs_drafting.commands import COMMANDS

__all__ = ["COMMANDS"]
__getattr__ = views_on_demand(__name__)  # PAPERS and FIGURES, from .views
