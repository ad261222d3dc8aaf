"""llama.cpp's ``llama-server`` as specbench starts it: where the binary is, the command line of a
speculative setting, and a start on a free port of 127.0.0.1 that waits for ``/health`` and stops the
server on every way out (:mod:`specbench.engines.process`; the kernel kills it when specbench is
killed outright).

The binary is ``engine_options.server``, else ``$SPECBENCH_LLAMA_SERVER``, else ``llama-server`` on PATH,
else ``.llamacpp/bin/llama-server``, which ``make install-llamacpp`` builds from the llama.cpp tree inside
the ``llama-cpp-python`` source distribution.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from functools import lru_cache
from pathlib import Path

from specbench.engines.load import Server, free_port
from specbench.errors import SpecbenchError

LOCAL_SERVER = Path(".llamacpp/bin/llama-server")
INSTALL_FIX = (
    "build it: make install-llamacpp (llama.cpp from the llama-cpp-python 0.3.36 source distribution, into "
    ".llamacpp/), or name a llama-server in engine_options.server or SPECBENCH_LLAMA_SERVER, or put one on "
    "PATH"
)
PORT_TRIES = 3  # a free port can be taken by another process between the probe and the server's bind
FLAGS = {  # engine_options that llama-server takes as they are
    "threads": "--threads",
    "ctx_size": "--ctx-size",
    "batch_size": "--batch-size",
}


def find_server(options: dict) -> tuple[str | None, str]:
    """(the llama-server to run, or None; where it was looked for, for the message when none is)."""
    named = options.get("server") or os.environ.get("SPECBENCH_LLAMA_SERVER")
    if named:
        how = "engine_options.server" if options.get("server") else "SPECBENCH_LLAMA_SERVER"
        path = Path(named).expanduser()
        usable = path.is_file() and os.access(path, os.X_OK)
        return (str(path) if usable else None), f"{how} names {named}, which is not an executable file"
    on_path = shutil.which("llama-server")
    if on_path:
        return on_path, "PATH"
    if LOCAL_SERVER.is_file() and os.access(LOCAL_SERVER, os.X_OK):
        # absolute, not resolved: the build's link keeps its libraries beside the real binary
        return str(LOCAL_SERVER.absolute()), str(LOCAL_SERVER)
    return None, f"no llama-server on PATH or in {LOCAL_SERVER}"


def available(options: dict) -> tuple[str, str] | None:
    """None when a llama-server is found, else (problem, fix): checked before the first row."""
    server, looked = find_server(options)
    return None if server else (f"llama.cpp's server is not found here ({looked})", INSTALL_FIX)


def server_or_error(options: dict, where: str) -> str:
    server, looked = find_server(options)
    if server is None:
        raise SpecbenchError(where, f"llama.cpp's server is not found here ({looked})", INSTALL_FIX)
    return server


@lru_cache(maxsize=8)
def version(server: str) -> str | None:
    """The build the server's ``--version`` names (``6590 (abcdef0)``), or None when it names none."""
    try:
        done = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines()]
    found = next((line for line in lines if line.startswith("version:")), None)
    return found.removeprefix("version:").strip() if found else None


def command(server: str, gguf: str, spec: dict | None, options: dict, port: int, parallel: int) -> list[str]:
    """llama-server on 127.0.0.1:``port`` serving ``gguf`` with the speculative settings ``spec`` (as
    :meth:`LlamaCppTarget.speculative_config` resolved them), ``parallel`` slots and the options given."""
    line = [server, "--model", gguf, "--host", "127.0.0.1", "--port", str(port)]
    line += ["--parallel", str(parallel), "--metrics"]
    for name, flag in FLAGS.items():
        if options.get(name) is not None:
            line += [flag, str(options[name])]
    if spec:
        line += ["--spec-type", spec["spec_type"]]
        if spec["spec_type"] in ("draft-simple", "draft-eagle3"):  # a draft model's or a head's GGUF
            line += ["-md", spec["model_draft"]]
            line += ["--spec-draft-n-min", str(spec["n_min"]), "--spec-draft-p-min", str(spec["p_min"])]
        else:  # ngram-simple: the n-gram looked up and the tokens copied after it
            line += ["--spec-ngram-simple-size-n", str(spec["size_n"])]
            line += ["--spec-ngram-simple-size-m", str(spec["n_max"])]
        line += ["--spec-draft-n-max", str(spec["n_max"])]
    return line


def start(command_at, where: str, label: str, timeout: float) -> tuple[Server, float]:
    """A server from ``command_at(port)`` on a free port, ready (``/health`` answered), and the seconds
    it took; another port when the one chosen was taken meanwhile, a one-line error otherwise."""
    taken = []
    for _ in range(PORT_TRIES):
        port = free_port()
        server = Server(command_at(port), port, where, label)
        seconds = _ready(server, timeout)
        if seconds is not None and server.alive():
            return server, seconds
        server.stop()
        if _bind_failed(server) or seconds is not None:  # ours could not bind; another answered there
            taken.append(port)
            continue
        raise SpecbenchError(
            where,
            f"llama-server exited (code {server.process.returncode}) before it opened port {port}: "
            f"{last_error(server)!r}",
            f"read {server.log_path}; fix the cause (the GGUF file, memory, the flags) and run again with "
            "--resume (finished rows are kept)",
        )
    raise SpecbenchError(
        where,
        f"ports {', '.join(map(str, taken))} of 127.0.0.1 were taken by other processes as llama-server "
        "started on them",
        "stop what keeps taking ports (ss -ltnp shows it), then run again with --resume",
    )


def _ready(server: Server, timeout: float) -> float | None:
    """Seconds until the server's ``/health`` answered 200 (it answers 503 while the model loads); None
    when it exited first; a one-line error, the server stopped, when ``timeout`` passed."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if not server.alive():
            return None
        try:
            with urllib.request.urlopen(server.url("/health"), timeout=2) as answer:
                if answer.status == 200:
                    return time.perf_counter() - started
        except OSError:
            pass
        time.sleep(0.1)
    server.stop()
    raise SpecbenchError(
        server.where,
        f"llama-server did not answer /health on port {server.port} in {timeout:.0f} s",
        f"read {server.log_path}; raise engine_options.start_timeout_s (a large GGUF loads for minutes)",
    )


def _log(server: Server) -> list[str]:
    try:
        text = server.log_path.read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]


def _bind_failed(server: Server) -> bool:
    return any("bind" in line.lower() and str(server.port) in line for line in _log(server))


def last_error(server: Server) -> str:
    """The log's last line that names an error, past llama.cpp's closing ``exiting due to ...`` line
    (else its last line)."""
    lines = _log(server)
    errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    telling = [line for line in errors if "exiting due to" not in line] or errors or lines or ["no output"]
    return telling[-1][:300]
