"""Where specbench keeps what it builds or converts (the specbench cache), and whether the Hugging
Face Hub answers. Every layer reads these, so they live at the bottom, next to the model interface."""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

DISTILLED_PREFIX = "distilled:"


def cache_dir() -> Path:
    """``$SPECBENCH_CACHE``, else ``~/.cache/specbench``."""
    root = os.environ.get("SPECBENCH_CACHE") or Path.home() / ".cache" / "specbench"
    return Path(root)


def distilled_dir(name: str) -> Path:
    """Where ``specbench distill`` saves the drafter ``<target>/<size>``."""
    return cache_dir() / "drafters" / name


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False
