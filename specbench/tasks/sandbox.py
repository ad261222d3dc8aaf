"""Run generated Python code against its tests, in a limited child process (pass@1 of code tasks).

Only called when a recipe's dataset sets ``execute_code: true``. What it does, and what it does not:

* a fresh ``python -I`` process (isolated mode: no user site, no PYTHON* variables) with a minimal
  environment, in a new temporary directory that is removed afterwards, stdin closed, its own session;
* limits set before exec: CPU time (RLIMIT_CPU, the child dies of SIGXCPU), address space
  (RLIMIT_AS, allocations fail with MemoryError), file size (RLIMIT_FSIZE), processes of its user
  (RLIMIT_NPROC, so a fork bomb stops at ``Limits.processes``), no core files; plus a wall-clock
  timeout for code that sleeps or blocks;
* when run as root with ``unshare`` and ``setpriv`` (the full sandbox): the code runs as user
  ``nobody`` in its own network namespace (no interface up), its own PID namespace (when the
  program ends or is stopped, every process it started dies with it, ``setsid()`` or not) and its own
  mount namespace, where ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are fresh small tmpfs and the
  specbench checkout and the working directory are hidden under empty ones;
* otherwise, with unprivileged user namespaces (``unshare -rn``): its own network and PID namespaces;
* in every case a guard replaces ``socket.socket`` and its constructors with a function that raises
  before the code runs. The guard alone is not a sandbox: code using ctypes, or a subprocess such as
  ``curl``, gets past it.

Not done: no seccomp filter, no read-only root file system (``nobody`` can read what the world can);
without namespaces the code runs as the calling user and can read and write what that user can, and
a process that leaves the session survives. Run untrusted model output on a machine you can afford
to lose. ``tests/faults/test_sandbox_escapes.py`` tries each escape and says what held.
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
    processes: int = 64  # RLIMIT_NPROC of the user the code runs as
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
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))

    return apply


# The full sandbox's set-up, run as root inside fresh namespaces (argv: the work folder, the python,
# then the folders to hide; one inside /tmp, gone with the fresh tmpfs, reappears empty). The program
# files are opened before /tmp is covered and copied into a folder of the same name in the new /tmp.
PRIVATE_MOUNTS = r"""
set -e
work=$1; python=$2; shift 2
exec 3<"$work/program.py" 4<"$work/guard.py"
mount --make-rprivate /
for folder in /tmp /var/tmp /dev/shm; do
  if [ -d "$folder" ]; then mount -t tmpfs -o size=64m,mode=1777 tmpfs "$folder"; fi
done
for folder in "$@"; do mkdir -p "$folder"; mount -t tmpfs -o size=64k,mode=0755 tmpfs "$folder"; done
mkdir -p "$work"
cat <&3 >"$work/program.py"; cat <&4 >"$work/guard.py"; exec 3<&- 4<&-
chown -R 65534:65534 "$work"
cd "$work"
setpriv --reuid=65534 --regid=65534 --clear-groups -- "$python" -I guard.py
"""
# As the namespace's first process, this shell outlives the program and reports how it ended (128 +
# the signal, e.g. SIGXCPU) instead of leaving that to unshare; its exit ends the namespace.
REPORT_EXIT = 'exit_code=0; "$@" || exit_code=$?; exit "$exit_code"'


@lru_cache(maxsize=1)
def isolation() -> str:
    """Which sandbox this machine gives: ``full`` (root), ``user-namespaces`` or ``none``."""
    if not shutil.which("unshare"):
        return "none"
    with tempfile.TemporaryDirectory(prefix="specbench-probe-") as folder:
        Path(folder, "program.py").write_text("pass\n")
        Path(folder, "guard.py").write_text("pass\n")
        os.chmod(folder, 0o755)
        for kind in ("full", "user-namespaces"):
            if kind == "full" and not (os.geteuid() == 0 and shutil.which("setpriv")):
                continue
            probe = subprocess.run(
                _command(kind, Path(folder)),
                cwd=folder,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=20,
                check=False,
            )
            if probe.returncode == 0:
                return kind
    return "none"


def _interpreter() -> str:
    """The base interpreter (a virtual environment may live in the checkout that is hidden)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _hidden(python: str) -> list[str]:
    """The checkout and the working directory, unless the interpreter lives below one of them."""
    folders = {str(Path(__file__).resolve().parents[2]), os.getcwd()}
    real = os.path.realpath(python)
    return sorted(f for f in folders if f != "/" and not real.startswith(f + os.sep) and os.path.isdir(f))


def _command(kind: str, workdir: Path) -> list[str]:
    namespaces = ["unshare", "--net", "--pid", "--fork", "--kill-child"]
    if kind == "full":
        python = _interpreter()
        setup = ["sh", "-c", PRIVATE_MOUNTS, "sh", str(workdir), python, *_hidden(python)]
        return [*namespaces, "--mount", "--", *setup]
    if kind == "user-namespaces":
        return [
            *namespaces,
            "--map-root-user",
            "--",
            "sh",
            "-c",
            REPORT_EXIT,
            "sh",
            sys.executable,
            "-I",
            "guard.py",
        ]
    return [sys.executable, "-I", "guard.py"]


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Run ``source`` (a program with its tests, e.g. asserts) as ``__main__``; passed = exit 0."""
    kind = isolation()
    with tempfile.TemporaryDirectory(prefix="specbench-exec-") as folder:
        workdir = Path(folder)
        (workdir / "program.py").write_text(source, encoding="utf-8")
        (workdir / "guard.py").write_text(GUARD, encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8"}
        process = subprocess.Popen(
            _command(kind, workdir),
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
            # the group, and with it unshare, whose death kills the PID namespace and all in it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        if timed_out:
            output, _ = process.communicate()
    text = output.decode("utf-8", errors="replace")[-limits.output_chars :]
    code = process.returncode
    if timed_out:
        status = "timeout"
    elif code in (-signal.SIGXCPU, -signal.SIGKILL) or code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL):
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
