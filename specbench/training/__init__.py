"""Making drafters: distillation of small students and exit heads from a target's own outputs
(``specbench distill``), on offline text, cached like every other source. Trained drafters load back
through :mod:`specbench.sources` (``distilled:<target>/<size>``).

Each kind of drafter that ``distill --size`` names is a :class:`Trainer` declared in a module-level
``TRAINERS`` of a module here; :data:`TRAINERS` collects them the first time it is read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.errors import SpecbenchError
from specbench.registry import Registry


@dataclass(frozen=True)
class Trainer:
    name: str
    help: str
    # the StudentConfig (specbench.training.distill) a --size of this kind starts from; the options
    # given on the command line override it
    defaults: Any
    # train(target, teacher, train, held_out, config, progress) -> the folder the drafter is saved in
    train: Callable[..., Path]
    numbered: bool = False  # named by the kind and a number: exit<N>
    full_vocabulary: bool = False  # shares the target's whole head, so --draft-vocab does not apply
    heads: bool = False  # trained on the frozen target's states: takes --max-sequence
    unrolls: bool = False  # takes --unroll (EAGLE-3's training-time test)


TRAINERS: Registry[Trainer] = Registry("drafter trainer", __name__, "TRAINERS")


def either(names: list[str]) -> str:
    """``a, b or c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def trainer_of(size: str) -> Trainer:
    """The trainer of a ``--size`` (``exit4``: the numbered ``exit``); a one-line error naming the
    sizes when there is none."""
    if size in TRAINERS and not TRAINERS[size].numbered:
        return TRAINERS[size]
    kind = size.rstrip("0123456789")
    if kind != size and kind in TRAINERS and TRAINERS[kind].numbered:
        return TRAINERS[kind]
    sizes = [f"{t.name}<N> (e.g. {t.name}4)" if t.numbered else t.name for t in TRAINERS.values()]
    raise SpecbenchError("--size", f"unknown drafter size {size!r}", f"use {either(sizes)}")


def size_help() -> str:
    """The ``distill --size`` option's help: each kind and what it trains."""
    kinds = [f"{t.name}<N>" if t.numbered else t.name for t in TRAINERS.values()]
    described = "; ".join(f"{kind}: {t.help}" for kind, t in zip(kinds, TRAINERS.values(), strict=True))
    return f"Drafters to train ({described}). Repeat the option for several."
