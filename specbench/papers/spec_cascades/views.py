"""Speculative Cascades' ``--paper`` view (``PAPERS``), ``--figure curves`` (``FIGURES``) and the
quality-latency section of a run's HTML page (``SECTIONS``), read by :mod:`specbench.papers.registry`."""

from specbench.papers.base import Paper
from specbench.papers.spec_cascades.curves import write_curves
from specbench.papers.spec_cascades.page import frontier_section
from specbench.papers.spec_cascades.tables import spec_cascades_reference, table2
from specbench.pipeline.views.html import PageSection
from specbench.pipeline.views.plots import Figure

PAPERS = (
    # the small model's own AR cell (its point on the curves) is part of the paper's setup too; the
    # original T5 (t5-large, without v1_1) is another model family, so it is not the paper's
    Paper(
        "spec-cascades-table2",
        table2,
        spec_cascades_reference,
        "T5 v1.1 large / XL (fine-tuned; T5 v1.1 small drafts)",
        ("t5-v1_1-large", "t5-v1_1-xl", "t5-v1_1-small"),
        help="latency reduction at the large model's quality and best quality within its latency, from "
        "each method's Pareto frontier over α",
    ),
)

FIGURES = (
    Figure(
        "curves",
        "quality vs relative latency per cascade and α, curves.csv, cascades_table2.csv and Pareto PNGs "
        "(Speculative Cascades Figs. 2-3, Table 2)",
        write_curves,
    ),
)

SECTIONS = (PageSection("quality-latency", frontier_section),)
