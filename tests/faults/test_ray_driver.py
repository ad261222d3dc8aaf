"""Issue 30's Ray faults: a driver killed with SIGKILL takes the local cluster it started with it (the
unreachable ``--address`` is in test_refused_runs.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed: pip install 'specbench-llm[ray]'"
)

ROOT = Path(__file__).resolve().parents[2]


def write_recipe(path: Path) -> Path:
    data = yaml.safe_load((ROOT / "recipes" / "quickstart-tiny.yaml").read_text())
    data["datasets"][0]["limit"] = 2
    data["generation"]["max_new_tokens"] = 8
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow  # a Ray cluster of its own: ~30 s
def test_a_killed_driver_takes_its_local_cluster_with_it(tmp_path: Path):
    """kill -9 of a driver that started its own local cluster: the watchdog (ray_watchdog.py) stops the
    cluster's processes (GCS, raylet, agents, workers) within seconds, not minutes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    out = tmp_path / "out"
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specbench.cli",
            "run",
            str(write_recipe(tmp_path / "r.yaml")),
            "-o",
            str(out),
            "--executor",
            "ray",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    examples, deadline = out / "examples.jsonl", time.time() + 240
    while time.time() < deadline and not (examples.exists() and examples.read_text().count("\n") >= 1):
        time.sleep(0.2)
    cluster = psutil.Process(driver.pid).children(recursive=True)
    assert any(p.name() == "raylet" for p in cluster), [p.name() for p in cluster]
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()

    def running():
        return [p for p in cluster if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    deadline = time.time() + 20
    while running() and time.time() < deadline:
        time.sleep(0.5)
    assert not running(), [(p.pid, p.name()) for p in running()]
