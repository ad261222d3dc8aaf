"""Where drafters come from: statistical drafters (Max-Gram with its bigram fill), and trained ones
(distillation into small students, early-exit self-drafts with exit heads, FR-Spec draft vocabularies).
"""
