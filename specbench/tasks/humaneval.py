"""HumanEval (Chen et al. 2021), one of SpecDec++'s datasets; pass@1 of the generated function.

Prompt: the problem's own ``prompt`` (signature and docstring), zero-shot, as in the Codex paper;
SpecDec++ uses the prompts unchanged. Hub ``openai/openai_humaneval`` (task_id, prompt,
canonical_solution, test, entry_point), split ``test`` (164); offline
``$SPECBENCH_DATA_DIR/humaneval/test.jsonl``.

The program run is the prompt, then the model's code, then the tests and ``check(entry_point)``.
The model's code is the first Markdown code block when the output has one (chat models; defining
the function again replaces the prompt's docstring-only one), else the raw continuation, cut at the
Codex stop sequences (a new top-level ``def``/``class``/``if``/``print``/``#``).

Metric ``pass@1`` (0-1; with one sample per problem, the fraction that passes). Code runs only
when the recipe's dataset sets ``execute_code: true`` (specbench.tasks.sandbox); otherwise rows
carry no ``pass@1`` and say why under ``quality_skipped``.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.sandbox import fenced_code, pass_at_1

TEMPLATE = "{prompt}"
STOP = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#")


def completion(output_text: str) -> str:
    """The code a model's output contributes after the prompt."""
    code = fenced_code(output_text)
    if code is not None:
        return code
    cut = min((i for i in (output_text.find(s) for s in STOP) if i >= 0), default=len(output_text))
    return output_text[:cut]


def program(example: Example, output_text: str) -> str:
    return f"{example.prompt}{completion(output_text)}\n\n{example.reference}"


def _build(row: dict, fallback_id: str) -> Example:
    tests = f"{row['test']}\n\ncheck({row['entry_point']})\n"
    return Example(row.get("task_id") or fallback_id, row["prompt"], tests)


HUMANEVAL = Task(
    name="humaneval",
    hub_id="openai/openai_humaneval",
    hub_config=None,
    default_split="test",
    template=TEMPLATE,
    metric="pass@1",
    fields=("prompt", "test", "entry_point"),
    build=_build,
    grade=lambda example, text: pass_at_1(program(example, text)),
    executes_code=True,
)

TASKS = (HUMANEVAL,)
