"""A published head's identity: the digest of its files.

A head loaded from a folder or a Hub id (``eagle3:``, ``eagle1:``, ``medusa-heads:``) is not part of a
cell's key (the recipe entry names only where it is), so a head replaced in place would leave rows
measured with the old one looking current. Its loader records the digest of its config and weights in
environment.json (``models.<name>.checkpoint``); a resume into the directory and ``specbench check``
compare it with the head that source names now (a Hub id: the local Hugging Face cache's copy).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from specbench import sources
from specbench.errors import SpecbenchError


@dataclass(frozen=True)
class ChangedHead:
    name: str  # the recipe's model
    source: str
    recorded_path: str
    recorded: str  # the digest its rows were measured with
    path: str  # where the source finds the head now
    today: str

    def describe(self) -> str:
        now = "the head there" if self.path == self.recorded_path else f"{self.source} now at {self.path}"
        return (
            f"model {self.name} ({self.source}) was measured with the head at {self.recorded_path} "
            f"(digest {self.recorded}); {now} has digest {self.today}"
        )


def head_changes(models: dict, names: Iterable[str] | None = None) -> tuple[list[ChangedHead], list[str]]:
    """(the published heads among environment.json's ``models`` (those in ``names``; None: all) whose
    files differ from the ones recorded, what could not be compared here: a head not found)."""
    changed, unknown = [], []
    for name, info in models.items():
        if names is not None and name not in names or not isinstance(info, dict):
            continue
        recorded, source = (info.get("checkpoint") or {}).get("digest"), str(info.get("source") or "")
        if not recorded:
            continue
        try:
            found = sources.published_head(source)
        except SpecbenchError as error:
            unknown.append(f"model {name} ({source}): its head is not here to compare with ({error.problem})")
            continue
        if found is not None and found[1] != recorded:
            path = str(info["checkpoint"].get("path") or "")
            changed.append(ChangedHead(name, source, path, recorded, str(found[0]), found[1]))
    return changed, unknown


def check_heads_unchanged(directory, models: dict, names: Iterable[str]) -> None:
    """A resume with a published head other than its rows were measured with is refused, in one line."""
    changed, _ = head_changes(models, set(names))
    if changed:
        raise SpecbenchError(
            str(directory),
            f"{changed[0].describe()}: resuming would mix rows of two heads",
            "restore the head its rows were measured with, or measure this one into a new --output-dir",
        )
