"""Where specbench keeps what it builds or converts (the specbench cache), how it writes a file there
(atomically), and whether the Hugging Face Hub answers. Every layer uses these, so they live at the
bottom, next to the model interface."""

from __future__ import annotations

import functools
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
