"""Take a local Ray cluster down with the driver that started it.

``ray.init()`` without an address starts the cluster's processes (GCS, raylet, agents) as children of
the driver; ``ray.shutdown()`` stops them, but a driver killed with SIGKILL never runs it, and the
orphans kept running. :func:`guard` starts this module as a process of its own session that polls the
driver and, once it is gone, terminates the processes it was given (each checked by its start time,
so a reused pid is never hit), then exits. ``python -m specbench.pipeline.run.ray_watchdog PID FILE``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLL_S = 0.5
GRACE_S = 3.0


def guard() -> subprocess.Popen | None:
    """Watch this process and take its current child processes (the local cluster) down with it."""
    try:
        import psutil
    except ImportError:  # ray depends on psutil; without it there is nothing to watch with
        return None
    children = psutil.Process().children(recursive=True)
    if not children:
        return None
    listing = Path(tempfile.gettempdir()) / f"specbench-ray-cluster-{os.getpid()}.json"
    listing.write_text(json.dumps([[p.pid, p.create_time()] for p in children]))
    return subprocess.Popen(
        [sys.executable, "-m", "specbench.pipeline.run.ray_watchdog", str(os.getpid()), str(listing)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the driver's group must not take the watchdog first
    )


def watch(driver: int, listing: Path) -> None:
    import psutil

    processes = []
    for pid, started in json.loads(listing.read_text()):
        try:
            process = psutil.Process(pid)
            if abs(process.create_time() - started) < 1e-3:
                processes.append(process)
        except psutil.NoSuchProcess:
            continue
    while _alive(psutil, driver):
        if not any(p.is_running() for p in processes):  # ray.shutdown() stopped them: done
            listing.unlink(missing_ok=True)
            return
        time.sleep(POLL_S)
    alive = [p for p in processes if p.is_running()]
    for process in alive:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=GRACE_S)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    listing.unlink(missing_ok=True)


def _alive(psutil, pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    watch(int(sys.argv[1]), Path(sys.argv[2]))
