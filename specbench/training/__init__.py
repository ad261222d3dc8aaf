"""Making drafters: distillation of small students and exit heads from a target's own outputs
(``specbench distill``), on offline text, cached like every other source. Trained drafters load back
through :mod:`specbench.sources` (``distilled:<target>/<size>``)."""
