"""Reading a published head's folder (EAGLE-1/2's, Medusa's): its JSON config, its one weights file
among the names its layout uses (shards refused: specbench reads one file), the tensors in it, and a
digest of both that environment.json records."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import torch

from specbench.errors import SpecbenchError


def read_config(folder: Path, where: str, what: str) -> dict:
    """``folder``/config.json as a dict; a missing or unreadable one is one line."""
    path = folder / "config.json"
    if not path.is_file():
        raise SpecbenchError(where, f"{folder} holds no config.json", f"point at the folder of {what}")
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise SpecbenchError(
            where, f"{path} is not JSON ({str(error)[:80]})", "restore the head's config.json"
        ) from None
    if not isinstance(config, dict):
        raise SpecbenchError(where, f"{path} is not a JSON object", "restore the head's config.json")
    return config


def weights_file(folder: Path, names: tuple[str, ...], where: str, what: str) -> Path:
    """The first of ``names`` in ``folder``; a sharded checkpoint (an ``.index.json``) is refused."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    for name in names:
        index = folder / f"{name}.index.json"
        if index.is_file():
            raise SpecbenchError(
                where,
                f"{index} shards the head's weights, which specbench does not read",
                f"merge the shards into one {names[0]} (safetensors.torch.save_file of their union)",
            )
    raise SpecbenchError(where, f"{folder} holds no {' or '.join(names)}", f"point at the folder of {what}")


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file or a torch checkpoint (read without unpickling code)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return dict(load_file(str(path)))
    return dict(torch.load(path, map_location="cpu", weights_only=True))


def shapes(path: Path) -> dict[str, list[int]]:
    """Name -> shape of the tensors in ``path``: a safetensors file's header alone, else a memory map."""
    if path.suffix == ".safetensors":
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        return {name: entry["shape"] for name, entry in header.items() if name != "__metadata__"}
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {name: list(tensor.shape) for name, tensor in state.items()}


def digest(*paths: Path) -> str:
    """16 hex digits of the files' bytes, in order."""
    hashed = hashlib.sha256()
    for path in paths:
        with path.open("rb") as handle:
            for chunk in iter(lambda handle=handle: handle.read(1 << 24), b""):
                hashed.update(chunk)
    return hashed.hexdigest()[:16]


def check_fields(config: dict, fields: tuple[str, ...], path: Path, where: str) -> None:
    """Each of ``fields`` a positive integer in ``config``, else one line naming it."""
    for field in fields:
        value = config.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecbenchError(
                where, f"{path}: {field} is {value!r}; expected a positive integer", "fix the config"
            )


def check_names(tensors: dict, expected: dict[str, tuple[int, ...]], path: Path, where: str, fix: str):
    """Every tensor ``expected`` names is there with its shape, and nothing else: one line otherwise."""
    missing = [name for name in expected if name not in tensors]
    unexpected = sorted(name for name in tensors if name not in expected)
    if missing or unexpected:
        problem = f"has no {', '.join(missing[:3])}" if missing else f"holds {', '.join(unexpected[:3])}"
        raise SpecbenchError(where, f"{path} {problem} (its config expects other tensors)", fix)
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != tuple(shape):
            raise SpecbenchError(
                where, f"{path}: {name} is {list(tensors[name].shape)}; expected {list(shape)}", fix
            )
