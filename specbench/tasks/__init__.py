"""Benchmark tasks: each a dataset, a prompt template and a scorer.

Every module of this package that defines tasks declares them as a module-level ``TASKS = (Task(...),
...)``; :data:`TASKS` collects them by name the first time it is read, so a new task is one new module
here plus its tests. Beside the benchmark tasks are the quality tasks of the speculative cascades and
SpecDec++ papers; ``*_fewshot``: their prompts for decoder-only models (the paper's Gemma cascades use
few-shot prompts).
"""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.registry import Registry
from specbench.tasks.base import Example, Task, render_prompt, render_turn


def _by_name(task: Task) -> str:
    return task.name


TASKS: Registry[Task] = Registry("task", __name__, "TASKS", order=_by_name)


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise SpecbenchError(f"task {name!r}", "unknown task", f"use one of {', '.join(sorted(TASKS))}")
    return TASKS[name]


__all__ = ["Example", "Task", "TASKS", "get_task", "render_prompt", "render_turn"]
