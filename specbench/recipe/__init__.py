"""Recipes: a YAML file names models, datasets and methods with hyperparameter grids.

``load_recipe`` validates it (unknown keys and wrong types are errors, never silent defaults)
and ``Recipe.cells`` expands every method's grid into cells. Every problem becomes one
:class:`SpecbenchError` line naming the file, the field and the fix, e.g.
``recipes/x.yaml: methods[1].grid.k[0]: 0 is out of range (k: draft length, ...) — fix: use 1 <= k <= 64``.

Validation has two layers: pydantic checks the shape, types and ranges of the schema; plain
Python then checks what needs the whole recipe (model references, task names, and each method's
parameters and cross-field rule, which the method declares next to its algorithm and the registry
:data:`specbench.methods.METHODS` hands over). Nothing here knows a particular method, engine or
kind of heads: each feature checks its own settings and answers through its declaration.

The package, one concern a module:

- :mod:`~specbench.recipe.schema`: the sections (model, dataset, generation, method entry, load)
- :mod:`~specbench.recipe.experiment`: :class:`Recipe` (the whole, how each model resolves here) and
  its :class:`Cell` s
- :mod:`~specbench.recipe.grid`: a method entry's parameters and the points its grid spans
- :mod:`~specbench.recipe.keys`: what enters a row key, and the one table of keys older rows lack
- :mod:`~specbench.recipe.loading`: YAML, ``extends:``, :func:`load_recipe` and :func:`parse_recipe`
- :mod:`~specbench.recipe.checks`: the checks across the recipe, asking each feature's owner
- :mod:`~specbench.recipe.messages`: the wording of every problem
"""

from __future__ import annotations

from specbench.methods import METHODS
from specbench.recipe.checks import replay_problem
from specbench.recipe.experiment import Cell, Recipe, engine_cell_view
from specbench.recipe.loading import load_recipe, parse_recipe
from specbench.recipe.schema import (
    MAX_CELLS,
    MAX_NAME,
    MAX_NEW_TOKENS,
    NAME_PATTERN,
    CostSpec,
    CostTableEntry,
    DatasetSpec,
    GenerationSpec,
    LoadSpec,
    MethodSpec,
    ModelSpec,
)

__all__ = [
    "MAX_CELLS",
    "MAX_NAME",
    "MAX_NEW_TOKENS",
    "METHODS",
    "NAME_PATTERN",
    "Cell",
    "CostSpec",
    "CostTableEntry",
    "DatasetSpec",
    "GenerationSpec",
    "LoadSpec",
    "MethodSpec",
    "ModelSpec",
    "Recipe",
    "engine_cell_view",
    "load_recipe",
    "parse_recipe",
    "replay_problem",
]
