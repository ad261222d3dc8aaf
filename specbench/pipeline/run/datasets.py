"""The examples a run measures: each recipe dataset loaded, cut to its limit and sample."""

from __future__ import annotations

from dataclasses import dataclass

from specbench.errors import SpecbenchError
from specbench.tasks import Example, get_task


@dataclass
class DatasetRun:
    label: str  # e.g. "gsm8k/test"
    task: object
    examples: list[Example]
    chat_template: bool
    execute_code: bool = False  # the recipe's opt-in to run generated code (code tasks' pass@1)
    max_new_tokens: int | None = None  # the dataset's own output length (else the recipe's)


def load_datasets(recipe, limit: int | None, blame) -> list[DatasetRun]:
    """Every dataset of ``recipe``, at most ``limit`` examples each (with the recipe's own limit);
    ``blame(field)`` is a context manager that names the recipe and field in errors raised inside."""
    runs = []
    for i, spec in enumerate(recipe.datasets):
        task = get_task(spec.task)
        split = spec.split or task.default_split
        limits = [x for x in (spec.limit, limit) if x is not None]
        most = min(limits) if limits else None
        data_files = str(spec.data_files) if spec.data_files else None
        if spec.execute_code and not task.executes_code:
            raise SpecbenchError(
                f"{recipe.path}: datasets[{i}].execute_code",
                f"task {spec.task} does not run generated code",
                "remove execute_code (it applies to code tasks such as humaneval and mbpp)",
            )
        with blame(f"datasets[{i}]"):
            if spec.every == 1:
                examples = task.load(split=split, data_files=data_files, limit=most)
            else:
                examples = task.load(split=split, data_files=data_files)[:: spec.every][:most]
        first: dict[str, int] = {}
        for position, example in enumerate(examples):
            if example.id in first:
                raise SpecbenchError(
                    f"{recipe.path}: datasets[{i}] ({data_files or spec.task})",
                    f"example id {example.id!r} is given twice (examples {first[example.id] + 1} and "
                    f"{position + 1}): rows are keyed by it",
                    "give every example its own id in the data file",
                )
            first[example.id] = position
        label = f"{spec.task}/{split}"
        runs.append(
            DatasetRun(label, task, examples, spec.chat_template, spec.execute_code, spec.max_new_tokens)
        )
    return runs
