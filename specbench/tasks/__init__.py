"""Benchmark tasks: each a dataset, a prompt template and a scorer."""

from __future__ import annotations

from specbench.errors import SpecbenchError
from specbench.tasks.alpaca import ALPACA
from specbench.tasks.arithmetic import ARITHMETIC
from specbench.tasks.base import Example, Task, render_prompt, render_turn
from specbench.tasks.cnn_dailymail import CNN_DAILYMAIL, CNN_DAILYMAIL_FEWSHOT
from specbench.tasks.gsm8k import GSM8K, GSM8K_FEWSHOT
from specbench.tasks.humaneval import HUMANEVAL
from specbench.tasks.mbpp import MBPP
from specbench.tasks.mmlu import MMLU
from specbench.tasks.natural_questions import NATURAL_QUESTIONS
from specbench.tasks.passages import PASSAGES
from specbench.tasks.spec_bench import SPEC_BENCH
from specbench.tasks.squad_v2 import SQUAD_V2
from specbench.tasks.trivia_qa import TRIVIA_QA
from specbench.tasks.web_questions import WEB_QUESTIONS
from specbench.tasks.wmt14_en_de import WMT14_EN_DE, WMT14_EN_DE_FEWSHOT
from specbench.tasks.xsum import XSUM

TASKS: dict[str, Task] = {task.name: task for task in (ALPACA, ARITHMETIC, GSM8K, MMLU, PASSAGES, SPEC_BENCH)}
# the quality tasks of the speculative cascades and SpecDec++ papers; *_fewshot: the prompts for
# decoder-only models (the paper's Gemma cascades use few-shot prompts)
QUALITY_TASKS = (
    CNN_DAILYMAIL,
    CNN_DAILYMAIL_FEWSHOT,
    GSM8K_FEWSHOT,
    HUMANEVAL,
    MBPP,
    NATURAL_QUESTIONS,
    SQUAD_V2,
    TRIVIA_QA,
    WEB_QUESTIONS,
    WMT14_EN_DE,
    WMT14_EN_DE_FEWSHOT,
    XSUM,
)
TASKS.update({task.name: task for task in QUALITY_TASKS})


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise SpecbenchError(f"task {name!r}", "unknown task", f"use one of {', '.join(sorted(TASKS))}")
    return TASKS[name]


__all__ = ["Example", "Task", "TASKS", "get_task", "render_prompt", "render_turn"]
