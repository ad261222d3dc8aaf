"""Measurements beside the run: the benchmark against generate, cost probes, load, grid tuning."""
