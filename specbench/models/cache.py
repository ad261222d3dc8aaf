"""Where specbench keeps what it builds or converts (the specbench cache), how it writes a file there
(atomically), and whether the Hugging Face Hub answers. Every layer uses these, so they live at the
bottom, next to the model interface."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import tempfile
from pathlib import Path

DISTILLED_PREFIX = "distilled:"


def cache_dir() -> Path:
    """``$SPECBENCH_CACHE``, else ``~/.cache/specbench``."""
    root = os.environ.get("SPECBENCH_CACHE") or Path.home() / ".cache" / "specbench"
    return Path(root)


def distilled_dir(name: str) -> Path:
    """Where ``specbench distill`` saves the drafter ``<target>/<size>``."""
    return cache_dir() / "drafters" / name


def trained_record(folder: Path) -> dict | None:
    """The ``distill.json`` of the drafter trained in ``folder`` (how it was trained), or None where
    there is none or it cannot be read."""
    record = folder / "distill.json"
    if not record.is_file():
        return None
    try:
        manifest = json.loads(record.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    return manifest if isinstance(manifest, dict) else None


def trained_identity(folder: Path) -> str | None:
    """A digest of how the drafter in ``folder`` was trained (its ``distill.json``: the teacher data's
    key and settings, the student's configuration and, where its trainer records one, the trainer's
    revision), or None where there is none. Deterministic training makes it stand for the weights;
    the machine-specific data path is left out."""
    manifest = trained_record(folder)
    if manifest is None:
        return None
    teacher = {k: v for k, v in (manifest.get("teacher") or {}).items() if k != "data_dir"}
    how = {"teacher": teacher, "student": manifest.get("student")}
    if "trainer_revision" in manifest:  # absent: the first revision, digested as before revisions
        how["trainer_revision"] = manifest["trainer_revision"]
    payload = json.dumps(how, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write ``path`` so that a reader meanwhile sees the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False
