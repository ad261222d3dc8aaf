"""Drafters that are more than a plain model run autoregressively: statistical drafters (Max-Gram with
its bigram fill, the CS Drafting authors' variant), early-exit self-drafts with exit heads, FR-Spec draft
vocabularies, and SpecDec++'s acceptance head. Training them lives in :mod:`specbench.training`.
"""
