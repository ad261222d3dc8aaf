"""Alpaca instructions (Taori et al. 2023): instruction, plus its input when there is one.

SpecDec++ measures throughput on Alpaca, so there is no quality metric; the reference output is
kept for reading. Offline, ``alpaca/train.jsonl`` may hold the 175 self-instruct seed tasks in the
Hub schema (instruction, input, output); ``$SPECBENCH_DATA_DIR/alpaca_seed/train.jsonl`` is read
when there is no ``alpaca/`` folder.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task

TEMPLATE = "{instruction}\n\n{input}"


def _build(row: dict, fallback_id: str) -> Example:
    extra = (row.get("input") or "").strip()
    prompt = TEMPLATE.format(instruction=row["instruction"], input=extra) if extra else row["instruction"]
    return Example(fallback_id, prompt, row.get("output") or "")


ALPACA = Task(
    name="alpaca",
    hub_id="tatsu-lab/alpaca",
    hub_config=None,
    default_split="train",
    template=TEMPLATE,
    metric=None,
    fields=("instruction",),
    build=_build,
    grade=lambda example, text: float("nan"),
    local_dirs=("alpaca", "alpaca_seed"),
)
