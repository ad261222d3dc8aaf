"""Which machine measured a run: the identity that decides whether two walltimes may share a table.

A walltime belongs to the CPU (its model and the instruction sets the kernels use: AVX2, AVX-512,
AVX512-BF16, AMX), the GPUs, the number of threads torch ran with, the cores it had and the torch
build. Two rows measured where any of these differ are different measurements: a run directory keeps
one machine's rows unless told otherwise (``run --allow-other-machine``), and every table that shows
times names the machine. Counts and outputs do not depend on the machine; walltime does.

Directories written before machines were recorded are identified from the first session's
``collect_env`` text (PyTorch's environment report, which holds lscpu's model name and flags).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass

# the CPU flags that choose kernels (oneDNN, inductor's C++ templates, ATen's dispatch)
KERNEL_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)

# without these units torch computes bfloat16 matmuls without vector bf16 instructions: a pass of k + 1
# tokens then costs several one-token passes, which takes speculative decoding out of the papers' regime
NO_BF16_UNITS = "this CPU has no bfloat16 matrix units (AMX, AVX512-BF16)"


@dataclass(frozen=True)
class Machine:
    cpu: str  # "AMD EPYC (family 25, model 17)"
    cpu_flags: tuple[str, ...]  # the KERNEL_FLAGS it has
    cores: int
    threads: int  # torch's intra-op threads
    gpus: tuple[str, ...]
    torch: str  # version and build: "2.13.0+cpu"

    @property
    def id(self) -> str:
        payload = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    @property
    def matrix_units(self) -> str:
        """What makes low-precision matmuls fast here, in the words of the dtype rule."""
        flags = set(self.cpu_flags)
        if "amx_bf16" in flags:
            return "AMX"
        if "avx512_bf16" in flags:
            return "AVX512-BF16, no AMX"
        if "avx512f" in flags:
            return "AVX-512, no bf16"
        if "avx2" in flags:
            return "AVX2 only"
        if "bf16" in flags or "sve" in flags:
            return "Arm " + "+".join(f for f in ("sve", "bf16", "i8mm") if f in flags)
        return "no vector bf16"

    def describe(self) -> str:
        """One line: ``AMD EPYC (family 25, model 17), AVX512-BF16, no AMX · 2 threads / 2 cores ·
        torch 2.13.0+cpu``, GPUs first where there are any."""
        where = f"{', '.join(self.gpus)} · " if self.gpus else ""
        return (
            f"{where}{self.cpu}, {self.matrix_units} · {self.threads} threads / {self.cores} cores · "
            f"torch {self.torch}"
        )

    def to_json(self) -> dict:
        return {**asdict(self), "cpu_flags": list(self.cpu_flags), "gpus": list(self.gpus)}

    @classmethod
    def from_json(cls, data: dict) -> Machine:
        return cls(
            cpu=str(data["cpu"]),
            cpu_flags=tuple(data.get("cpu_flags") or ()),
            cores=int(data["cores"]),
            threads=int(data["threads"]),
            gpus=tuple(data.get("gpus") or ()),
            torch=str(data["torch"]),
        )


def this_machine() -> Machine:
    """The machine this process measures on, now (threads as torch is set at the moment of asking)."""
    import torch

    fields = _cpuinfo()
    gpus = ()
    if torch.cuda.is_available():
        gpus = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return Machine(
        cpu=_cpu_name(fields.get("model name") or fields.get("Model name"), fields),
        cpu_flags=_kernel_flags(fields.get("flags") or fields.get("Features") or ""),
        cores=os.cpu_count() or 1,
        threads=torch.get_num_threads(),
        gpus=gpus,
        torch=torch.__version__,
    )


def recorded_machine(environment: dict) -> Machine | None:
    """The machine that measured a directory's first rows: environment.json's ``machine``, else (a
    directory from before machines were recorded) its first session's; None when nothing says."""
    if isinstance(environment.get("machine"), dict):
        return _from_record(environment["machine"])
    sessions = [s for s in environment.get("sessions") or [] if isinstance(s, dict) and s.get("rows")]
    return session_machine(sessions[0], environment) if sessions else None


def session_machine(session: dict, environment: dict) -> Machine | None:
    """The machine of one session of environment.json: its ``machine``, else read off its
    ``collect_env`` text (lscpu's lines), with the directory's thread count."""
    if isinstance(session.get("machine"), dict):
        return _from_record(session["machine"])
    text = session.get("collect_env")
    if not isinstance(text, str):
        return None
    fields = {}
    for line in text.splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            fields.setdefault(key.strip(), value.strip())
    if "Model name" not in fields or "Flags" not in fields:
        return None
    cuda = session.get("cuda")
    try:
        return Machine(
            cpu=_cpu_name(
                fields["Model name"], {"cpu family": fields.get("CPU family"), "model": fields.get("Model")}
            ),
            cpu_flags=_kernel_flags(fields["Flags"]),
            cores=int(fields.get("CPU(s)") or environment.get("cpu_count") or 1),
            threads=int(environment.get("threads") or 1),
            gpus=(cuda,) if cuda else (),
            torch=str(session.get("torch") or environment.get("torch")),
        )
    except ValueError:
        return None


def _from_record(record: dict) -> Machine | None:
    try:
        return Machine.from_json(record)
    except (KeyError, TypeError, ValueError):
        return None


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as handle:
            text = handle.read()
    except OSError:
        import platform

        return {"model name": platform.processor() or platform.machine()}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        if ":" in line:
            key, value = line.split(":", 1)
            fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_name(name: str | None, fields: dict) -> str:
    name = re.sub(r"\s+", " ", name or "unknown CPU").strip()
    family, model = fields.get("cpu family"), fields.get("model")
    return f"{name} (family {family}, model {model})" if family and model else name


def _kernel_flags(flags: str) -> tuple[str, ...]:
    present = set(flags.split())
    return tuple(flag for flag in KERNEL_FLAGS if flag in present)


# the share of the machine's CPU time that other processes took, above which a walltime is not clean
LOADED = 0.10


@dataclass(frozen=True)
class CpuTimes:
    """A snapshot for :func:`others_share`: every CPU's busy seconds since boot, this process's own CPU
    seconds (its threads and waited-for children), and the monotonic clock."""

    busy: float
    own: float
    at: float


def group_stats(groups) -> list[list[str]]:
    """/proc/PID/stat's fields after the process name (state, ppid, pgrp, ...) of every live process
    of the given process groups (Linux; [] elsewhere)."""
    groups, found = set(groups), []
    if not groups:
        return found
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in groups:
            found.append(fields)
    return found


def group_cpu_seconds(groups) -> float:
    """CPU seconds used so far by the live processes of the given process groups (Linux; 0 elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK")
    return sum((int(f[11]) + int(f[12])) / tick for f in group_stats(groups))  # utime (11), stime (12)


def cpu_times() -> CpuTimes | None:
    """Now, from /proc/stat (Linux); None elsewhere."""
    import resource
    import time

    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    tick = os.sysconf("SC_CLK_TCK")
    own = sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )
    return CpuTimes((user + nice + system + irq + softirq + steal) / tick, own, time.monotonic())


def others_share(
    before: CpuTimes | None, after: CpuTimes | None, cores: int | None = None, also_own: float = 0.0
) -> float | None:
    """The share of all cores' time between two snapshots that other processes (and the hypervisor's
    steal) used: 0 on a quiet machine; 0.5 on 2 cores means one core's worth went elsewhere.
    ``also_own``: CPU seconds of processes that worked for us meanwhile (a serving engine's)."""
    if before is None or after is None or after.at <= before.at:
        return None
    others = (after.busy - before.busy) - (after.own - before.own) - also_own
    capacity = (after.at - before.at) * (cores or os.cpu_count() or 1)
    return round(min(max(others / capacity, 0.0), 1.0), 3)
