"""Huang, Guo and Wang, "SpecDec++: Boosting Speculative Decoding via Adaptive Candidate Lengths" (2024).

* ``training``: the acceptance prediction head's training (``specbench specdecpp train``; the head
  itself and its storage are :mod:`specbench.drafters.acceptance_head`);
* ``efficiency``: discard and verification rates, the forward-time fit of Equation 2.1, the
  Equation 2.3 throughput and the Figure 4 PNG (``specbench plot --figure specdecpp``);
* ``tables``: Table 1 and the forward times beside a run (``--paper specdecpp``);
* ``commands``: ``specbench theory threshold`` and ``specbench specdecpp train``;
* ``views``: the ``--paper`` view and the ``--figure specdecpp`` figure, declared as the registries read them;
* ``reference.yaml``: the paper's numbers, transcribed.
"""

from specbench.papers.commands import views_on_demand
from specbench.papers.specdecpp.commands import COMMANDS, GROUPS

__all__ = ["COMMANDS", "GROUPS"]
__getattr__ = views_on_demand(__name__)  # PAPERS and FIGURES, from .views
