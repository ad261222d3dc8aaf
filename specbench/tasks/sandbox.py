"""Run generated Python code against its tests, in a limited child process (pass@1 of code tasks).

Only called when a recipe's dataset sets ``execute_code: true``. What it does, and what it does not:

* a fresh ``python -I`` process (isolated mode: no user site, no PYTHON* variables) with a minimal
  environment, in a new temporary directory that is removed afterwards, stdin closed, its own session
  (the whole process group is killed at the end);
* limits set before exec: CPU time (RLIMIT_CPU, the child dies of SIGXCPU), address space
  (RLIMIT_AS, allocations fail with MemoryError), file size (RLIMIT_FSIZE), no core files; plus a
  wall-clock timeout for code that sleeps or blocks;
* network: when ``unshare -n`` can be used (root, then the code runs as user ``nobody`` through
  ``setpriv``) or ``unshare -rn`` (unprivileged user namespaces), the child has its own network
  namespace with no interfaces up; in every case a guard replaces ``socket.socket`` and its
  constructors with a function that raises before the code runs. The guard alone is not a
  sandbox: code using ctypes, or a subprocess such as ``curl``, gets past it.

Not done: no seccomp filter, no read-only file system, no limit on processes; without ``setpriv``
the code runs as the calling user and can read and write what that user can. Run untrusted model
output on a machine you can afford to lose.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

NOBODY = 65534

# Runs first in the child: no socket can be created from Python, then the program runs as __main__.
GUARD = """\
import _socket, socket, runpy, sys

def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the specbench sandbox")

for _module in (socket, _socket):
    for _name in ("socket", "socketpair", "fromfd", "create_connection", "create_server"):
        if hasattr(_module, _name):
            setattr(_module, _name, _no_network)
sys.argv = ["program.py"]
runpy.run_path("program.py", run_name="__main__")
"""


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 10
    memory_bytes: int = 2 * 1024**3
    wall_seconds: float = 20.0
    file_bytes: int = 16 * 1024**2
    output_chars: int = 2000  # of stdout and stderr kept in the outcome


@dataclass(frozen=True)
class Outcome:
    status: str  # passed | failed | cpu_limit | memory_limit | timeout
    returncode: int | None
    output: str  # the tail of stdout and stderr

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _set_limits(limits: Limits):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


@lru_cache(maxsize=1)
def isolation() -> tuple[str, ...]:
    """The command prefix that gives the child its own network namespace, or () when none works."""
    candidates = []
    if shutil.which("unshare"):
        if os.geteuid() == 0 and shutil.which("setpriv"):
            drop = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--")
            candidates.append(("unshare", "-n", *drop))
        candidates.append(("unshare", "-rn"))
    for prefix in candidates:
        probe = subprocess.run(
            [*prefix, sys.executable, "-I", "-c", "pass"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=20,
            check=False,
        )
        if probe.returncode == 0:
            return prefix
    return ()


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Run ``source`` (a program with its tests, e.g. asserts) as ``__main__``; passed = exit 0."""
    prefix = isolation()
    with tempfile.TemporaryDirectory(prefix="specbench-exec-") as folder:
        workdir = Path(folder)
        (workdir / "program.py").write_text(source, encoding="utf-8")
        (workdir / "guard.py").write_text(GUARD, encoding="utf-8")
        if "setpriv" in prefix:  # the code runs as nobody: give it its folder
            for path in (workdir, workdir / "program.py", workdir / "guard.py"):
                os.chown(path, NOBODY, NOBODY)
        env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8"}
        process = subprocess.Popen(
            [*prefix, sys.executable, "-I", "guard.py"],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_set_limits(limits),
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=limits.wall_seconds)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # the group may be gone
                os.killpg(process.pid, signal.SIGKILL)  # and anything the program started
        if timed_out:
            output, _ = process.communicate()
    text = output.decode("utf-8", errors="replace")[-limits.output_chars :]
    code = process.returncode
    if timed_out:
        status = "timeout"
    elif code in (-signal.SIGXCPU, -signal.SIGKILL) or code == 128 + signal.SIGXCPU:
        status = "cpu_limit"
    elif code != 0 and "MemoryError" in text:
        status = "memory_limit"
    else:
        status = "passed" if code == 0 else "failed"
    return Outcome(status, None if timed_out else code, text)


_FENCE = re.compile(r"```[ \t]*(?:[A-Za-z0-9_+-]+)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def fenced_code(text: str) -> str | None:
    """The first Markdown code block of a chat model's answer (an unclosed one runs to the end)."""
    found = _FENCE.search(text)
    return found.group(1) if found else None


def pass_at_1(program: str, limits: Limits = Limits()) -> float:
    """1.0 when the program (solution plus tests) exits 0 within the limits, else 0.0."""
    return float(run_program(program, limits).passed)
