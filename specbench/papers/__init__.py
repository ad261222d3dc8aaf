"""One folder per paper whose tables and figures specbench reproduces from result files.

A paper folder (``cs_drafting``, ``spec_cascades``, ``specdecpp``) holds the paper's transcribed
numbers (``reference.yaml``), the analysis of a run that the paper's tables and figures need, and
its ``--paper`` views: ``PAPERS`` in its ``views``, :class:`~specbench.papers.base.Paper` objects
(a name, the reference loader, a function from runs to views and tidy rows, the paper's models for
the caption, what ``--paper``'s help says of it). :mod:`specbench.papers.registry` collects them, so
``specbench report RUN --paper NAME`` finds a view by its name; :mod:`specbench.papers.base` holds
what the views share and never imports a paper. Its commands (``specbench theory table1``, ``specbench
specdecpp train``) are declared in its ``commands`` and collected by :mod:`specbench.papers.commands`.
"""
