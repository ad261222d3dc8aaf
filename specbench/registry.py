"""One registry for every kind of thing a recipe or a command names: methods, sources, engines, tasks,
paper views, trainers and figures.

A kind's entries declare themselves in the modules of its package, as a module-level attribute (one
entry, or a tuple of them): ``METHODS = (Method(...), ...)`` in ``specbench/decoding/``, ``SOURCE =
Source(...)`` in ``specbench/sources/``. A :class:`Registry` imports those modules the first time it
is read (as lm-evaluation-harness collects its tasks), so a new entry is one new module and nothing
else changes; a name declared twice is refused, naming both modules. It is a read-only mapping from
name to entry, in the order the kind asks for (recognition order for sources), and :meth:`Registry.
registered` adds or replaces an entry for the length of a ``with`` block, for tests.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _name(entry: Any) -> str:
    return entry.name


def _every_module(info: pkgutil.ModuleInfo) -> bool:
    return True


class Registry(Mapping[str, T], Generic[T]):
    """Name -> entry, collected on first read from the ``attribute`` of the modules of ``package``.

    ``kind`` names an entry in messages ("method", "source kind"); ``name`` gives an entry's name;
    ``order`` (a sort key on entries, stable) sets the iteration order, which is otherwise the modules'
    alphabetical order and each module's own declaration order; ``modules`` chooses which of the
    package's modules declare entries (they alone are imported); ``also``: further modules read first.
    """

    def __init__(
        self,
        kind: str,
        package: str,
        attribute: str,
        *,
        name: Callable[[T], str] = _name,
        order: Callable[[T], Any] | None = None,
        modules: Callable[[pkgutil.ModuleInfo], bool] = _every_module,
        also: tuple[str, ...] = (),
    ):
        self.kind, self.package, self.attribute = kind, package, attribute
        self._name, self._order, self._modules, self._also = name, order, modules, also
        self._entries: dict[str, T] | None = None

    def over(self, package: str) -> Registry[T]:
        """The same kind of registry over the modules of another package alone (to test discovery)."""
        return Registry(
            self.kind, package, self.attribute, name=self._name, order=self._order, modules=self._modules
        )

    def _declaring_modules(self) -> list[str]:
        package = importlib.import_module(self.package)
        found = [info for info in pkgutil.iter_modules(package.__path__) if self._modules(info)]
        return [*self._also, *(f"{self.package}.{info.name}" for info in sorted(found, key=lambda i: i.name))]

    def _discover(self) -> dict[str, T]:
        where: dict[str, str] = {}
        found: dict[str, T] = {}
        for module in self._declaring_modules():
            declared = getattr(importlib.import_module(module), self.attribute, None)
            if declared is None or declared is self:  # a module that reads the registry declares nothing
                continue
            for entry in declared if isinstance(declared, tuple | list) else (declared,):
                name = self._name(entry)
                if name in found:
                    raise RuntimeError(
                        f"{self.kind} {name!r} is declared twice: in {where[name]} and in {module}"
                    )
                where[name], found[name] = module, entry
        if self._order is None:
            return found
        return {self._name(entry): entry for entry in sorted(found.values(), key=self._order)}

    def _loaded(self) -> dict[str, T]:
        if self._entries is None:
            self._entries = self._discover()
        return self._entries

    def __getitem__(self, name: str) -> T:
        return self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self)})"

    @contextmanager
    def registered(self, entry: T, replace: bool = False) -> Iterator[T]:
        """``entry`` registered for the ``with`` block (in its place in the order), then the registry
        as it was. A name already registered is refused unless ``replace`` is given."""
        entries = self._loaded()
        name = self._name(entry)
        if name in entries and not replace:
            raise RuntimeError(f"{self.kind} {name!r} is already registered; pass replace=True to replace it")
        if replace and name not in entries:
            raise RuntimeError(f"{self.kind} {name!r} is not registered, so there is nothing to replace")
        before = dict(entries)
        entries[name] = entry
        if self._order is not None:
            self._entries = {self._name(e): e for e in sorted(entries.values(), key=self._order)}
        try:
            yield entry
        finally:
            self._entries = before
