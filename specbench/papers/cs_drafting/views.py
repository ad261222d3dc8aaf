"""CS Drafting's ``--paper`` views (``PAPERS``), read by :mod:`specbench.papers.registry`."""

from specbench.papers.base import Paper
from specbench.papers.cs_drafting.tables import cs_drafting_reference, table2, table3

PAPERS = (
    Paper(
        "cs-drafting-table2",
        table2,
        cs_drafting_reference,
        "google/flan-t5-xxl",
        ("flan-t5-xxl",),
        help="SWI, FLAN-T5",
    ),
    Paper(
        "cs-drafting-table3",
        table3,
        cs_drafting_reference,
        "Vicuna-7B",
        ("vicuna-7b",),
        help="walltime, Vicuna-7B, with Table 4",
    ),
)
