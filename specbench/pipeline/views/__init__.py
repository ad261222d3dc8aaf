"""How results are shown: report tables, plans, predictions, comparisons, categories, figures."""
