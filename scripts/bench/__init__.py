"""Harnesses of results/bench/: CPU kernels and passes timed outside a recipe."""
