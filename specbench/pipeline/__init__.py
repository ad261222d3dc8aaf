"""The run pipeline: recipe cells -> rows (runner, results) -> cells.csv (summary, costs) -> report, plots.

Tuning (successive halving over a grid) and the benchmark against Hugging Face `generate` drive the
same runner and decoding loops; an execution backend other than the local runner belongs here too.
"""
