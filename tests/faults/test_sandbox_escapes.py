"""Model-written code tries to get out of the pass@1 sandbox; each attempt must be contained.

The full sandbox needs root with ``unshare`` and ``setpriv`` (CI has them); elsewhere the tests that
depend on it are skipped with the reason, and the module docstring of specbench.tasks.sandbox says
what the weaker modes do not stop.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from specbench.tasks.sandbox import Limits, isolation, run_program

ROOT = Path(__file__).resolve().parents[2]
full = pytest.mark.skipif(isolation() != "full", reason=f"sandbox here: {isolation()}, not full (root)")


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.skipif(isolation() == "none", reason="no PID namespace on this machine")
def test_a_setsid_grandchild_dies_with_the_program():
    marker = f"specbench-escape-{uuid.uuid4().hex}"
    program = f"""
import os, sys
if os.fork() == 0:
    os.setsid()  # leave the sandbox's session and process group
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
    os._exit(0)
os.wait()
print("parent done")
"""
    start = time.monotonic()
    outcome = run_program(program, Limits(wall_seconds=20))
    assert outcome.passed and time.monotonic() - start < 10  # graded on the program, not the orphan
    time.sleep(0.5)
    assert _processes_with(marker) == []


@full
def test_a_fork_bomb_stops_at_the_process_limit():
    program = """
import os, time
children = 0
for _ in range(400):
    try:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        children += 1
    except BlockingIOError:
        break
print("children", children)
assert children < 400
"""
    outcome = run_program(program, Limits(processes=32, wall_seconds=20))
    assert outcome.passed, outcome.output
    assert int(outcome.output.split()[-1]) < 32


@full
def test_writes_outside_the_work_folder_do_not_reach_the_machine():
    name = f"specbench-escape-{uuid.uuid4().hex}"
    program = f"""
import os
for folder in ("/tmp", "/var/tmp", "/dev/shm"):
    if os.path.isdir(folder):
        open(os.path.join(folder, "{name}"), "w").write("x")
try:
    open("{ROOT}/{name}", "w").write("x")
except OSError as error:
    print("repository:", type(error).__name__)
"""
    outcome = run_program(program)
    assert outcome.passed, outcome.output
    for folder in ("/tmp", "/var/tmp", "/dev/shm", str(ROOT)):
        assert not os.path.exists(os.path.join(folder, name)), folder


@full
def test_the_checkout_is_not_readable():
    program = f"""
import os
print(sorted(os.listdir("{ROOT}")))
assert not os.path.exists("{ROOT}/specbench/tasks/sandbox.py")
"""
    outcome = run_program(program)
    assert outcome.passed and outcome.output.strip() == "[]", outcome.output


@pytest.mark.skipif(isolation() == "none", reason="no network namespace on this machine")
def test_a_subprocess_without_the_socket_guard_has_no_network():
    program = """
import subprocess, sys
code = "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)"
result = subprocess.run(["python3", "-c", code], capture_output=True, text=True)  # no guard in it
assert result.returncode != 0 and "unreachable" in result.stderr, result.stderr
print("no network")
"""
    outcome = run_program(program)
    assert outcome.passed and "no network" in outcome.output, outcome.output


def test_a_long_sleep_is_stopped_at_the_wall_clock_limit():
    start = time.monotonic()
    outcome = run_program("import time\ntime.sleep(600)", Limits(wall_seconds=1))
    assert outcome.status == "timeout" and time.monotonic() - start < 10
