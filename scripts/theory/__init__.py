"""Harnesses of results/theory/: the papers' theory beside every committed cell."""
