"""User-facing errors: one line that names the file, the field and the fix.

The CLI prints ``str(error)`` and exits with status 2; no traceback is shown for these.
"""

from __future__ import annotations

from pathlib import Path


class SpecbenchError(Exception):
    """An error caused by the user's input (recipe, data file, model source, flag)."""

    def __init__(self, where: str, problem: str, fix: str | None = None):
        self.where, self.problem, self.fix = where, problem, fix
        message = f"{where}: {problem}" if where else problem
        if fix:
            message += f" — fix: {fix}"
        super().__init__(message)


def expand_home(path: str | Path, where: str) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded, or a one-line error where it cannot be
    (``HOME`` unset, or no such user) instead of pathlib's RuntimeError."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        head = str(path).split("/", 1)[0]
        raise SpecbenchError(
            where,
            f"cannot expand {head} in {path}: "
            + ("HOME is not set" if head == "~" else f"there is no user {head[1:]!r}"),
            "write the path out in full (or set HOME)",
        ) from None
