"""What memory did to a timed row: pages read back from disk while it ran.

Others' CPU (:func:`specbench.models.machine.others_share`) does not see the other way a machine spoils a
walltime: when the models and engines on it do not fit in memory together, the kernel evicts pages of
weights (file-backed: a memory-mapped checkpoint; anonymous: swapped out) and every pass that touches
them waits for the disk. A row then takes many times its usual time with no CPU used by anyone else
(seen here: a Qwen2.5-Coder-1.5B row took 88.7 s where the same cell took 5.9 s on the prompt before,
beside two kept-alive vLLM engines on a 23 GiB machine without swap). Each row records its process's
major page faults (pages read from disk on touch, this process and its finished children), the
machine's swap-ins, and the memory available when it ended (Linux; absent elsewhere), and a row whose
faults and swap-ins amount to :data:`DISTURBING_MB` or more is counted as disturbed.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from specbench.models.machine import group_stats

# pages read back during one row, in MiB, from which its walltime is not clean: far above the few
# pages a first touch of a file or a library faults in, far below a model's weights
DISTURBING_MB = 64.0
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 4096 / 2**20


@dataclass(frozen=True)
class MemorySnapshot:
    major_faults: int  # this process and its waited-for children, since they started
    swapped_in: int | None  # pages, machine-wide (/proc/vmstat pswpin); None where unreadable
    available_mb: float | None  # /proc/meminfo MemAvailable


def snapshot() -> MemorySnapshot:
    faults = sum(
        usage.ru_majflt
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )
    return MemorySnapshot(faults, _vmstat("pswpin"), _meminfo_mb("MemAvailable"))


def row_fields(before: MemorySnapshot, after: MemorySnapshot, engine_faults: int = 0) -> dict:
    """The row's ``major_faults`` (``engine_faults``: a serving engine's, which work for the row),
    ``swap_in_mb`` (machine-wide, where readable) and ``available_memory_mb`` at its end."""
    fields = {"major_faults": after.major_faults - before.major_faults + engine_faults}
    if before.swapped_in is not None and after.swapped_in is not None:
        fields["swap_in_mb"] = round((after.swapped_in - before.swapped_in) * PAGE_MB, 1)
    if after.available_mb is not None:
        fields["available_memory_mb"] = round(after.available_mb)
    return fields


def read_back_mb(row: dict) -> float | None:
    """MiB read back from disk while the row ran (its major faults and the machine's swap-ins); None
    for rows from before the fields."""
    if row.get("major_faults") is None:
        return None
    return row["major_faults"] * PAGE_MB + (row.get("swap_in_mb") or 0.0)


def disturbed(row: dict) -> bool:
    read = read_back_mb(row)
    return read is not None and read >= DISTURBING_MB


def group_major_faults(groups) -> int:
    """Major faults so far of the live processes of the given process groups (a serving engine's;
    Linux; 0 elsewhere)."""
    return sum(int(fields[9]) for fields in group_stats(groups))  # majflt (9)


def _vmstat(name: str) -> int | None:
    try:
        with open("/proc/vmstat") as handle:
            for line in handle:
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _meminfo_mb(name: str) -> float | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_bytes() -> int | None:
    """Memory available to new work now (MemAvailable), or None where unreadable."""
    value = _meminfo_mb("MemAvailable")
    return None if value is None else int(value * 2**20)
