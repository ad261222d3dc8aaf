"""environment.json: what a run ran on, so that its numbers can be traced and compared.

Top level: this session's versions and machine; ``models``: every model ever loaded for the directory
(earlier sessions' too); ``sessions``: one entry per session that wrote rows, with its start and end
times, row count and versions, so a run resumed on another machine or version says so.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from specbench import __version__
from specbench.models.hf import HFModel
from specbench.models.machine import recorded_machine, this_machine
from specbench.pipeline.records.results import ENVIRONMENT, RESULTS_FORMAT, write_atomic


def write_environment(
    directory: Path,
    recipe,
    models: dict,
    started: str,
    rows: int,
    ended: bool,
    gpu: list | None = None,
    load: dict | None = None,
    recipe_identity: str | None = None,
    extra: dict | None = None,
    command: str | None = None,
) -> None:
    """Write DIR/environment.json: versions, the machine of the first rows, the models, and this
    session appended to the earlier ones. ``recipe_identity``: the digest of the recipe the directory
    now belongs to (None: keep the recorded one, as a tune's partial rounds do); ``extra``: fields of a
    command's own (``load``'s settings), given at every write; ``command``: recorded in the session
    where it is not `run` (``load``: specbench.models.checksums tells the two apart)."""
    path = Path(directory) / ENVIRONMENT
    try:
        earlier = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        earlier = {}
    here = this_machine()
    home = recorded_machine(earlier) or here
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
        # the experiment the directory belongs to (Recipe.identity): a resume with another is refused
        "recipe_identity": recipe_identity or earlier.get("recipe_identity"),
        "seed": recipe.seed,
        # the machine of the directory's first rows (machine.py); sessions name their own
        "machine": {"id": home.id, "described": home.describe(), **home.to_json()},
        "models": {
            **earlier.get("models", {}),
            **{
                name: {
                    "source": recipe.models[name].source,
                    "origin": getattr(m, "origin", "statistical"),
                    **_identity(recipe.models[name].source),
                    # a published head: its layout, digest and the target layers it reads
                    **({"checkpoint": m.checkpoint} if getattr(m, "checkpoint", None) else {}),
                    "parameters": m.num_parameters,
                    # an engine model's is the one it asked its engine for (specbench.engines)
                    "dtype": _dtype_of(m),
                    # trained heads sit on their target's device; statistical drafters on the host
                    "device": str(getattr(m, "device", "cpu")),
                    # accelerate's placement (module -> device) of a model loaded with device_map
                    "device_map": _device_map(m),
                    "dtype_reason": getattr(m, "dtype_reason", None),  # why dtype: auto chose it
                    "engine": recipe.engine_of(name),
                    **_linear(m),
                    **({"serving": m.describe()} if hasattr(m, "describe") else {}),
                }
                for name, m in models.items()
            },
        },
    }
    session = {
        "started": started,
        "ended": now() if ended else None,
        "rows": rows,
        "machine": {"id": here.id, "described": here.describe(), **here.to_json()},
        **{key: env[key] for key in ("specbench", "git", "platform", "torch", "transformers", "cuda")},
        "gpu_samples": gpu or [],
        # the load average (1, 5, 15 min) at the session's start and now, and the share of the CPU
        # that other processes took over the session (machine.others_share)
        "load": load or {},
        "collect_env": collect_env(),
        **({"command": command} if command else {}),
    }
    sessions = [s for s in earlier.get("sessions", []) if s.get("started") != started]
    env.update(extra or {})
    env["sessions"] = [*sessions, session]
    write_atomic(path, json.dumps(env, indent=2) + "\n")


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: the most memory allocated on the target's device during this row. CPU: the process's peak
    resident set so far (the kernel keeps no per-interval peak), so it only ever grows."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _linear(model) -> dict:
    """The eager engine's linear layers' library, and what ``linear: auto`` timed to choose it."""
    if not hasattr(model, "linear"):
        return {}
    return {"linear": model.linear, "linear_probe_ms": model.linear_probe}


def _dtype_of(model) -> str | None:
    """The dtype a model computes in: an HFModel's weights', a trained head's (its target's), the one an
    engine model asked its engine for; None for a statistical drafter."""
    if isinstance(model, HFModel):
        return str(next(model.model.parameters()).dtype)
    dtype = getattr(model, "dtype", None) or getattr(model, "serving_dtype", None)
    return None if dtype is None else str(dtype)


def _device_map(model) -> dict | None:
    placement = getattr(getattr(model, "model", None), "hf_device_map", None)
    return {module: str(device) for module, device in placement.items()} if placement else None


# what nvidia-smi reports at the start and end of each cell: a throttled or hot GPU explains a number
GPU_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")


def gpu_sample() -> list[dict] | None:
    """SM and memory clocks (MHz), power (W) and temperature (C) of every GPU, now; None without
    ``nvidia-smi``."""
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        gpus.append({f: _number(v) for f, v in zip(GPU_FIELDS, values, strict=False)})
    return gpus


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text  # "[N/A]" and the like, as reported


@functools.cache
def collect_env() -> str:
    """PyTorch's environment report (``python -m torch.utils.collect_env``), once per process."""
    try:
        from torch.utils.collect_env import get_pretty_env_info

        return get_pretty_env_info()
    except Exception as error:  # it shells out to pip, conda and nvidia-smi; never fail a run on it
        return f"unavailable ({type(error).__name__})"


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


def _identity(source: str) -> dict:
    """``{"identity": digest}`` for weights trained in specbench's cache (sources.identity), else {}."""
    from specbench import sources

    digest = sources.identity(source)
    return {"identity": digest} if digest else {}
