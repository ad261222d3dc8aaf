"""Huang, Guo and Wang, "SpecDec++: Boosting Speculative Decoding via Adaptive Candidate Lengths" (2024).

* ``training``: the acceptance prediction head's training (``specbench specdecpp train``; the head
  itself and its storage are :mod:`specbench.drafters.acceptance_head`);
* ``efficiency``: discard and verification rates, the forward-time fit of Equation 2.1, the
  Equation 2.3 throughput and the Figure 4 PNG (``specbench plot --figure specdecpp``);
* ``tables``: Table 1 and the forward times beside a run (``--paper specdecpp``);
* ``reference.yaml``: the paper's numbers, transcribed.
"""

from specbench.papers.base import Paper
from specbench.papers.specdecpp.tables import specdecpp_reference, table1

PAPERS = (
    Paper(
        "specdecpp",
        table1,
        specdecpp_reference,
        "llama-2-chat 70B (7B drafts)",
        ("llama-2-70b-chat", "llama-2-7b-chat"),
    ),
)
