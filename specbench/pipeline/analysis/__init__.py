"""Numbers from rows, no model loaded: a cell's summary, its statistics, the papers' theory, cost
models, profiles and predictions."""
