"""Row keys and references: what makes a row the same row, and which AR row a cell's rows read.

Rows are keyed by a content hash of (cell fingerprint, dataset, example id, prompt), so a re-run with
``resume`` skips what is done, and a changed setting produces new rows instead of silently reusing old
ones. A cell's reference is the first AR cell on its target's reference model (the same weights in
specbench's own loop when the target runs on an engine): replay, the oracles and the lossless check
read that cell's row for the same example.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from specbench.methods import BASELINE, METHODS
from specbench.pipeline.run.datasets import DatasetRun
from specbench.recipe import Cell, Recipe
from specbench.tasks import Example


def content_hash(*parts: str) -> str:
    """16 hex digits of the parts' SHA-256, the parts kept apart (row keys, example seeds)."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ResolvedCell:
    """What a cell's rows need of the recipe's structure, resolved once per cell instead of once per
    row: its reference (the first AR cell on its target's reference model, whose rows replay and the
    lossless check read; None without one), and whether its rows are checked token for token against
    that AR output. (Its fingerprint is not among them: it holds what this machine resolves at the
    run's start, the linear library and an ``auto`` dtype, so keys compute it each time.)"""

    reference: Cell | None
    checked: bool


class RowKeys:
    """Keys and references of a recipe's rows, for a Measurer: it holds ``recipe``, ``repeats``,
    ``key_scope`` (another machine's id in keys, or None), ``_resolved`` and ``recorded(key)``."""

    recipe: Recipe
    repeats: int
    key_scope: str | None
    _resolved: dict[str, ResolvedCell]

    def recorded(self, key: str) -> dict | None:
        raise NotImplementedError

    def resolved(self, cell: Cell) -> ResolvedCell:
        if cell.id not in self._resolved:
            target = self.recipe.reference_model(cell.target)
            reference = next(
                (c for c in self.recipe.cells() if c.method == BASELINE and c.target == target), None
            )
            self._resolved[cell.id] = ResolvedCell(reference, self._is_checked(cell))
        return self._resolved[cell.id]

    def row_key(self, cell: Cell, dataset: DatasetRun, example: Example) -> str:
        parts = [cell.fingerprint(self.recipe), dataset.label, example.id, example.prompt, *example.turns]
        if dataset.execute_code:  # rows graded by running code differ from ungraded ones
            parts.append("execute_code")
        if dataset.max_new_tokens is not None:
            parts.append(f"max_new_tokens={dataset.max_new_tokens}")
        if self.repeats > 1 and not cell.replay:  # rows measured once stay valid for repeats: 1
            parts.append(f"repeats={self.repeats}")
        if self.key_scope is not None:
            parts.append(f"machine={self.key_scope}")
        return content_hash(*parts)

    def reference_key(self, dataset: DatasetRun, cell: Cell, example: Example) -> str | None:
        """The key of the row of the (first) AR cell of ``cell``'s target on this example; None when
        the recipe has no AR cell on that target."""
        reference = self.resolved(cell).reference
        return None if reference is None else self.row_key(reference, dataset, example)

    def _reference(self, dataset, cell, example) -> dict | None:
        """The row of the (first) AR cell of ``cell``'s target on this example, if recorded."""
        key = self.reference_key(dataset, cell, example)
        return None if key is None else self.recorded(key)

    def _checked(self, cell: Cell) -> bool:
        """Whether the cell's rows are checked token for token against the AR output."""
        return self.resolved(cell).checked

    def _is_checked(self, cell: Cell) -> bool:
        if not (self.recipe.lossless_check and self.recipe.generation.temperature == 0):
            return False
        if METHODS[cell.method].lossless(cell.params):
            return True
        # an engine's own AR output is checked against specbench's AR of the same weights
        return cell.method == BASELINE and self.recipe.reference_model(cell.target) != cell.target

    def needs_reference(self, cell: Cell) -> bool:
        """Whether the cell's rows read its target's AR row: replay, an oracle, the lossless check."""
        return bool(cell.replay or METHODS[cell.method].needs_reference or self._checked(cell))
