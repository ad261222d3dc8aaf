"""Measuring a recipe: the runner, one row's measurement, the order of rows, the datasets, the
environment, the check of committed results, and the Ray executor."""
