"""Harnesses of results/prediction/: the runs and probes it validates on, and its tables."""
