"""SpecDec++'s ``--paper`` view (``PAPERS``) and ``--figure specdecpp`` (``FIGURES``), read by
:mod:`specbench.papers.registry`."""

from specbench.papers.base import Paper
from specbench.papers.specdecpp.efficiency import write_efficiency
from specbench.papers.specdecpp.tables import specdecpp_reference, table1
from specbench.pipeline.views.plots import Figure

PAPERS = (
    Paper(
        "specdecpp",
        table1,
        specdecpp_reference,
        "llama-2-chat 70B (7B drafts)",
        ("llama-2-70b-chat", "llama-2-7b-chat"),
        help="Table 1 throughput and speedup, discard and verification rates, fitted t_draft/t_target",
    ),
)

FIGURES = (
    Figure(
        "specdecpp",
        "discard/verification rates, the t_draft/t_target regression CSVs and the Figure 4 PNG (SpecDec++)",
        write_efficiency,
    ),
)
