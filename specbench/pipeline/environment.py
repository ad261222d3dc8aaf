"""environment.json: what a run ran on, so that its numbers can be traced and compared.

Top level: this session's versions and machine; ``models``: every model ever loaded for the directory
(earlier sessions' too); ``sessions``: one entry per session that wrote rows, with its start and end
times, row count and versions, so a run resumed on another machine or version says so.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from specbench import __version__
from specbench.models.hf import HFModel
from specbench.pipeline.results import ENVIRONMENT, RESULTS_FORMAT, write_atomic


def write_environment(directory: Path, recipe, models: dict, started: str, rows: int, ended: bool) -> None:
    path = Path(directory) / ENVIRONMENT
    try:
        earlier = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        earlier = {}
    env = {
        "results_format": RESULTS_FORMAT,
        "specbench": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "datasets": _version("datasets"),
        "git": _git_hash(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "recipe": str(recipe.path),
        "seed": recipe.seed,
        "models": {
            **earlier.get("models", {}),
            **{
                name: {
                    "source": recipe.models[name].source,
                    "origin": getattr(m, "origin", "statistical"),
                    "parameters": m.num_parameters,
                    "dtype": str(next(m.model.parameters()).dtype) if isinstance(m, HFModel) else None,
                    "device": str(m.device) if isinstance(m, HFModel) else "cpu",
                }
                for name, m in models.items()
            },
        },
    }
    session = {
        "started": started,
        "ended": now() if ended else None,
        "rows": rows,
        **{key: env[key] for key in ("specbench", "git", "platform", "torch", "transformers", "cuda")},
    }
    sessions = [s for s in earlier.get("sessions", []) if s.get("started") != started]
    env["sessions"] = [*sessions, session]
    write_atomic(path, json.dumps(env, indent=2) + "\n")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:
        return None


def _git_hash() -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
        if out.returncode:
            return None
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except Exception:
        return None
