"""Harnesses of results/heads/: analyses of the head runs and GPU measurements of their steps."""
