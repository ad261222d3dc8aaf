"""Engine processes that specbench starts and always stops: a JSON-lines worker (an offline engine) and
a server on 127.0.0.1 (for load).

Each runs in its own process group, so stopping it stops the engine's own children too; every one
started is stopped when specbench exits, by an error or Ctrl-C included (``atexit`` and a SIGTERM
handler), and on Linux the kernel sends it SIGTERM when specbench is killed outright (kill -9 runs no
handler: :func:`die_with_parent`). An engine that exits or stops answering is a one-line error naming
its log.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import re
import selectors
import signal
import subprocess
import tempfile
from pathlib import Path

from specbench.errors import SpecbenchError

_RUNNING: set = set()  # processes started and not yet stopped
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int):
    """A ``preexec_fn``: the child asks the kernel for SIGTERM when ``parent`` dies, however it dies (a
    kill -9 runs none of our handlers), so no engine outlives specbench; it exits at once if the parent
    died before it asked. Linux only; elsewhere it does nothing and stop_all's handlers remain."""

    try:  # looked up here, in the parent: a child of a threaded parent must not load libraries
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def guard() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return guard


class EngineProcess:
    """A child process in its own group, its stderr kept in a log file."""

    def __init__(self, command: list[str], where: str, label: str, env: dict | None = None, stdin=None):
        self.where = where
        log = tempfile.NamedTemporaryFile("w", prefix=f"{label}-", suffix=".log", delete=False)
        self.log_path = Path(log.name)
        try:
            self.process = subprocess.Popen(
                command,
                stdin=stdin,
                stdout=subprocess.PIPE if stdin is not None else log,
                stderr=log,
                text=True,
                env={**os.environ, **(env or {})},
                start_new_session=True,  # its own process group: stop() reaches the engine's children
                preexec_fn=die_with_parent(os.getpid()),
            )
        except OSError as error:
            raise SpecbenchError(
                where, f"cannot start {command[0]} ({error.strerror or error})", _fix()
            ) from None
        finally:
            log.close()
        _RUNNING.add(self)

    def alive(self) -> bool:
        return self.process.poll() is None

    def last_error(self) -> str:
        """The log's last line that names an error (else its last line that is not a progress bar)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "no log"
        return last_error_line(text)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the whole group, SIGKILL after ``grace`` seconds."""
        _RUNNING.discard(self)
        if self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


# tqdm's bars ("Loading weights:  40%|####      | 2/5 [00:01<00:02, 1.9it/s]"): what an engine prints
# while it loads, redrawn with carriage returns, never the reason it died
PROGRESS_BAR = re.compile(r"\d+%\||\|\s*\d+/\d+ \[|\d(?:it/s|s/it)\]")


def last_error_line(log: str) -> str:
    """An engine log's last line that names an error, else its last line that is not a progress bar."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and not PROGRESS_BAR.search(line)]
    plain = [line for line in lines if not PROGRESS_BAR.search(line)]
    return (errors or plain or ["no output"])[-1][:300]


class WorkerProcess(EngineProcess):
    """A worker that answers one JSON line per request line (see ``vllm_worker``)."""

    def __init__(self, command: list[str], where: str, label: str, env: dict | None = None):
        super().__init__(command, where, label, env, stdin=subprocess.PIPE)
        self.started: dict = {}

    def start(self, message: dict, timeout: float) -> dict:
        self.started = self.ask(message, timeout)
        return self.started

    def ask(self, message: dict, timeout: float | None = None) -> dict:
        process = self.process
        try:
            process.stdin.write(json.dumps(message) + "\n")
            process.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the read below finds the exit
        line = self._read_line(timeout)
        if not line:
            if line is None:  # the time ran out
                how = f"did not answer in {timeout:.0f} s"
            else:  # end of its output: it exited (closing its pipe comes a moment before it is reaped)
                try:
                    how = f"exited (code {process.wait(timeout=30)})"
                except subprocess.TimeoutExpired:
                    how = "closed its output without exiting"
            error = self.last_error()
            self.stop()
            raise SpecbenchError(
                self.where,
                f"the engine {how} during {message['op']}: {error}",
                f"read {self.log_path}; fix the cause and run again with --resume (finished rows are kept)",
            )
        answer = json.loads(line)
        if not answer.get("ok"):
            self.stop()
            raise SpecbenchError(
                self.where + ("_options" if message["op"] == "start" else ""),
                f"the engine refused to {message['op']}: {answer.get('error')}",
                f"fix the engine options or the method (the engine's log: {self.log_path})",
            )
        return answer

    def _read_line(self, timeout: float | None) -> str | None:
        """The next answer line; '' at the end of the worker's output; None when ``timeout`` passed."""
        if timeout is not None:
            with selectors.DefaultSelector() as selector:
                selector.register(self.process.stdout, selectors.EVENT_READ)
                if not selector.select(timeout):
                    return None
        return self.process.stdout.readline()

    def close(self) -> None:
        """Ask the worker to stop, then stop its group whatever it did."""
        if self.alive():
            try:
                self.process.stdin.write(json.dumps({"op": "stop"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=30)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self.stop()


def _fix() -> str:
    return "check the interpreter path (engine_options.python) and that the engine is installed"


def stop_all() -> None:
    """Stop every engine process still running (at exit, or on SIGTERM)."""
    for process in list(_RUNNING):
        process.stop(grace=5.0)


atexit.register(stop_all)


def _on_sigterm(signum, frame):  # a killed specbench stops its engines, then dies as asked
    stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


if hasattr(signal, "SIGTERM"):
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: atexit still covers a normal exit
        pass
