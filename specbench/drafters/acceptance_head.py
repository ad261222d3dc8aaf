"""SpecDec++'s acceptance prediction head (Huang et al., "SpecDec++: Boosting Speculative Decoding via
Adaptive Candidate Lengths", 2024, Sec. 3.3) and where trained heads are stored.

A head is saved as ``head.safetensors`` next to a ``specdecpp.json`` manifest in
``<cache>/specdecpp/<target>/<drafter>/<name>`` and is named in a recipe as
``specdecpp:<target>/<drafter>[/<name>]`` (the slugs :func:`slug` makes) or by its folder's path.
Training lives with the paper (:mod:`specbench.papers.specdecpp.training`); inference in
:mod:`specbench.decoding.specdecpp`.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import torch
from torch import nn

from specbench.errors import SpecbenchError, expand_home
from specbench.models import cache

HEAD_FILE = "head.safetensors"
MANIFEST = "specdecpp.json"
PREFIX = "specdecpp:"


class ResBlock(nn.Module):
    """x + SiLU(W x + b): one residual block of the head."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class AcceptanceHead(nn.Module):
    """A D-layer ResNet with SiLU activations and a linear read-out (D = 0: one linear layer).

    ``forward`` returns the acceptance logit; ``probability`` its sigmoid, the predicted p̂ of Eq. 3.1.
    Unlike the release (which repeats one ``ResBlock`` object D times, sharing its weights), each
    block here has its own weights.
    """

    def __init__(self, hidden_size: int, depth: int = 3):
        super().__init__()
        self.hidden_size, self.depth = hidden_size, depth
        self.blocks = nn.Sequential(*(ResBlock(hidden_size) for _ in range(depth)))
        self.out = nn.Linear(hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(hidden)).squeeze(-1)

    def probability(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.forward(hidden.to(self.out.weight.dtype)))


def slug(source: str) -> str:
    """A model source as one folder name: ``distilled:smollm2-135m-instruct/small`` ->
    ``distilled-smollm2-135m-instruct--small``."""
    return source.replace(":", "-").replace("/", "--")


def head_dir(target: str, drafter: str, name: str = "default") -> Path:
    return cache.cache_dir() / "specdecpp" / slug(target) / slug(drafter) / name


def reference(target: str, drafter: str, name: str = "default") -> str:
    """The recipe's ``head:`` value for a head trained for ``target`` and ``drafter``."""
    tail = "" if name == "default" else f"/{name}"
    return f"{PREFIX}{slug(target)}/{slug(drafter)}{tail}"


def save_head(head: AcceptanceHead, manifest: dict, out: Path) -> Path:
    from safetensors.torch import save_file

    staging = out.with_name(out.name + ".tmp")
    staging.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(staging / HEAD_FILE))
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out


# -- loading -----------------------------------------------------------------------------------


def check_reference(value: str) -> str | None:
    """Recipe-time check of a ``head:`` value's shape (the head itself is looked up when the cell runs,
    by :func:`resolve`): None, or the fix."""
    if value.startswith(PREFIX):
        parts = value.removeprefix(PREFIX).split("/")
        if len(parts) in (2, 3) and all(parts):
            return None
        return "write specdecpp:<target>/<drafter>[/<name>], as `specbench specdecpp train` prints it"
    return None if value.strip() else "name a head: specdecpp:<target>/<drafter>[/<name>] or a folder"


def resolve(value: str) -> Path:
    """The folder of the head a recipe names; a one-line error saying how to train it if missing."""
    if value.startswith(PREFIX):
        parts = value.removeprefix(PREFIX).split("/")
        folder = cache.cache_dir() / "specdecpp" / Path(*parts)
        if len(parts) == 2:
            folder = folder / "default"
    else:
        folder = expand_home(value, f"head {value}")
    if not (folder / HEAD_FILE).is_file():
        raise SpecbenchError(
            f"head {value}",
            f"no trained SpecDec++ head in {folder}",
            "train it with `specbench specdecpp train --target T --drafter D [--name N]` "
            "(it prints the head: value to use)",
        )
    return folder


@functools.lru_cache(maxsize=8)
def _read(folder: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    return load_file(str(folder / HEAD_FILE)), json.loads((folder / MANIFEST).read_text())


def load_head(value: str, device: torch.device, dtype: torch.dtype = torch.float32) -> AcceptanceHead:
    """The head a recipe names, on ``device`` (weights read from disk once per process)."""
    state, manifest = _read(resolve(value))
    head = AcceptanceHead(int(manifest["hidden_size"]), int(manifest["depth"]))
    head.load_state_dict(state)
    return head.to(device=device, dtype=dtype).eval()
