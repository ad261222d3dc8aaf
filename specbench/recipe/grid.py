"""A method entry's grid: its parameters as the method declares them, and the points its grid spans.

``params`` holds one value per parameter and ``grid`` a list per parameter; a cell is the method's
defaults, then ``params``, then one point of the cartesian product of ``grid`` in sorted-key order.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from specbench.methods import Method, ParamSpec


def defaults(info: Method) -> dict:
    """Every parameter ``info`` declares, at its default."""
    return {name: spec.default for name, spec in info.params.items()}


def normalized(info: Method, params: dict) -> dict:
    """``params`` with each value as its declared type holds it."""
    return {name: as_declared(info.params[name], value) for name, value in params.items()}


def as_declared(spec: ParamSpec, value: Any) -> Any:
    # 1 and 1.0 for a float parameter must give the same cell id and fingerprint.
    return float(value) if spec.type is float else value


def points(grid: dict[str, list[Any]]) -> Iterator[dict]:
    """Every point of ``grid``, as {parameter: value}, its keys sorted, the last one varying fastest."""
    keys = sorted(grid)
    for values in itertools.product(*(grid[key] for key in keys)):
        yield dict(zip(keys, values, strict=True))


def compact(value: Any) -> Any:
    """Grid values in cell ids: lists as compact JSON ([[2,4],[0,3]]), the rest as Python prints them."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list) else value
