"""Benchmark tasks: each a dataset, a prompt template and a scorer."""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.tasks.alpaca import ALPACA
from specbench.tasks.arithmetic import ARITHMETIC
from specbench.tasks.base import Example, Task, render_prompt
from specbench.tasks.gsm8k import GSM8K
from specbench.tasks.mmlu import MMLU
from specbench.tasks.spec_bench import SPEC_BENCH

TASKS: dict[str, Task] = {task.name: task for task in (ALPACA, ARITHMETIC, GSM8K, MMLU, SPEC_BENCH)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise SpecbenchError(f"task {name!r}", "unknown task", f"use one of {', '.join(sorted(TASKS))}")
    return TASKS[name]


__all__ = ["Example", "Task", "TASKS", "get_task", "render_prompt"]
