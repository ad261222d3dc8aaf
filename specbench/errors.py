"""User-facing errors: one line that names the file, the field and the fix.

The CLI prints ``str(error)`` and exits with status 2; no traceback is shown for these.
"""

from __future__ import annotations


class SpecbenchError(Exception):
    """An error caused by the user's input (recipe, data file, model source, flag)."""

    def __init__(self, where: str, problem: str, fix: str | None = None):
        self.where, self.problem, self.fix = where, problem, fix
        message = f"{where}: {problem}" if where else problem
        if fix:
            message += f" — fix: {fix}"
        super().__init__(message)
