"""The wording of a recipe's problems: one line naming the file, the field and the fix.

Checks written by hand raise :class:`~specbench.errors.SpecbenchError` directly; pydantic's own errors
(shape, type, range) are translated here by :func:`from_validation_error`, and a field validator that
wants its own words raises :func:`invalid`, which carries them through pydantic unchanged.
"""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Collection
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from specbench.errors import SpecbenchError


def invalid(problem: str, fix: str) -> PydanticCustomError:
    """A pydantic error that carries our own problem and fix through to the SpecbenchError."""
    return PydanticCustomError("specbench", "{problem}", {"problem": problem, "fix": fix})


def show(value: Any) -> str:
    """A value as a message quotes it: mappings and lists by their kind, the rest as JSON."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return json.dumps(value, default=str)


def one_of(given: Any, options: Collection) -> str:
    """The fix for a name that is not one of ``options``: the closest one, then all of them."""
    names = sorted(str(option) for option in options)
    close = difflib.get_close_matches(str(given), names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}use one of: {', '.join(names)}"


# pydantic error type -> (problem, fix), formatted with the input as {value} and the error's ctx.
_EXPLANATIONS = {
    "missing": ("a required key is missing", "add it"),
    "int_type": ("{value} is not an integer", "write a whole number, unquoted (true/false are not numbers)"),
    "float_type": ("{value} is not a number", "write a number without quotes"),
    "bool_type": ("{value} is not a boolean", "write true or false"),
    "string_type": (
        "{value} is not a string",
        "write a string (quote it if YAML reads it as a number, date, ...)",
    ),
    "path_type": ("{value} is not a path", "write a file path as a string"),
    "dict_type": ("{value} is not a mapping", "write key: value pairs"),
    "model_type": ("{value} is not a mapping", "write key: value pairs"),
    "list_type": ("{value} is not a list", "write [a, b] or one '- item' per line"),
    "literal_error": ("{value} is not allowed", "use one of: {expected}"),
    "greater_than_equal": ("{value} is too small", "use a value >= {ge}"),
    "greater_than": ("{value} is too small", "use a value > {gt}"),
    "less_than_equal": ("{value} is too large", "use a value <= {le}"),
    "too_short": ("is empty", "give at least one entry"),
    "string_too_short": ("is empty", "give a non-empty string"),
}


def from_validation_error(path: Path, error: ValidationError, root: type[BaseModel]) -> SpecbenchError:
    """pydantic's first error as one line (with how many more there are); ``root`` is the model the
    whole document was validated as, for the keys allowed where an unknown key stands."""
    errors = error.errors(include_url=False)
    first, more = errors[0], f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    loc = [part for part in first["loc"] if part != "[key]"]  # "[key]": the error is in a mapping key
    where = f"{path}: {_field_path(loc)}" if loc else str(path)
    kind, ctx = first["type"], first.get("ctx") or {}
    if kind == "specbench":
        problem, fix = ctx["problem"], ctx["fix"]
    elif kind == "extra_forbidden":
        problem = f"unknown key {loc[-1]!r}"
        fix = f"remove it, or {one_of(loc[-1], _keys_allowed_at(root, loc[:-1]))}"
    elif kind in _EXPLANATIONS:
        problem, fix = (text.format(value=show(first.get("input")), **ctx) for text in _EXPLANATIONS[kind])
    else:
        problem = f"{show(first.get('input'))}: {first['msg']}"
        fix = "see the recipe reference in docs/recipes.md"
    return SpecbenchError(where, problem + more, fix)


def _field_path(loc: list) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _keys_allowed_at(root: type[BaseModel], loc: list) -> list[str]:
    """The field names of the model that the mapping at ``loc`` is validated as."""
    node: Any = root
    for part in loc:
        if isinstance(node, type) and issubclass(node, BaseModel):
            node = node.model_fields[part].annotation
        else:  # dict[str, X] or list[X]: one step into X
            node = get_args(node)[-1]
        if get_origin(node) in (Union, types.UnionType):  # X | None
            node = next(arg for arg in get_args(node) if arg is not type(None))
    return list(node.model_fields) if isinstance(node, type) and issubclass(node, BaseModel) else []
