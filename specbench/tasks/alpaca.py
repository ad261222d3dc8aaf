"""Alpaca instructions (Taori et al. 2023): instruction, plus its input when there is one.

SpecDec++ measures throughput on Alpaca, so there is no quality metric; the reference output is
kept for reading. Huang et al. (SpecDec++, Sec. 4 and App. C) split Alpaca at random into train / dev /
test (40k / 10k / 2k prompts): heads train on train, are evaluated on dev, and the benchmark runs on
test. The splits ``specdecpp-train``, ``specdecpp-dev`` and ``specdecpp-test`` do the same to whatever
``train`` holds (60% / 20% / 20% of it, a fixed shuffle), so that 175 seed tasks still leave 35 test
prompts that no head has seen. Offline, ``alpaca/train.jsonl`` may hold the 175 self-instruct
seed tasks in the Hub schema (instruction, input, output); ``$SPECBENCH_DATA_DIR/alpaca_seed/
train.jsonl`` is read when there is no ``alpaca/`` folder.
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
    partitions={
        "specdecpp-train": ("train", 0.0, 0.6),
        "specdecpp-dev": ("train", 0.6, 0.8),
        "specdecpp-test": ("train", 0.8, 1.0),
    },
)

TASKS = (ALPACA,)
