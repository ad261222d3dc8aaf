"""Harnesses of results/compile/: the compiled engine's compilation and pass cost."""
