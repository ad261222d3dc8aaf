"""Narasimhan et al., "Faster Cascades via Speculative Decoding" (ICLR 2025).

* ``curves``: quality against latency relative to the large model per cascade and α, the Pareto
  frontier and Table 2's two numbers read off it, the Figures 2-3 PNGs (``specbench plot --figure curves``);
* ``tables``: Table 2 beside a run (``--paper spec-cascades-table2``);
* ``views``: the ``--paper`` view and the ``--figure curves`` figure, declared as the registries read them;
* ``reference.yaml``: the paper's numbers, transcribed.
"""

from specbench.papers.commands import views_on_demand

__getattr__ = views_on_demand(__name__)  # PAPERS and FIGURES, from .views
