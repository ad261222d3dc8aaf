"""The run pipeline: recipe cells -> rows (run/) -> examples.jsonl and cells.csv (records/, analysis/)
-> tables, comparisons and figures (views/).

One folder per concern, each importing only those before it: ``records`` (what a run directory holds),
``analysis`` (numbers from rows, no model loaded), ``run`` (measuring), ``planning`` (a recipe's bill
before anything loads), ``experiments`` (measurements beside the run: the benchmark against Hugging
Face ``generate``, cost probes, load, tuning) and ``views``. tests/test_architecture.py keeps the order.
"""
