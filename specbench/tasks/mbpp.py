"""MBPP (Austin et al. 2021), the speculative cascades paper's code task; pass@1 on its tests.

Hub ``google-research-datasets/mbpp``, configuration ``full`` (task_id, text, code, test_list,
test_setup_code), split ``test`` (500 problems, task ids 11-510): the paper samples prompts from
MBPP without naming a configuration, and ``full`` is the original benchmark (``sanitized`` is a
427-problem subset whose rows call the description ``prompt``). No offline copy in ../shared/data.

Prompt: the MBPP paper's three-shot format, as lm-evaluation-harness writes it: ``You are an expert
Python programmer, and here is your task: {text} Your code should pass these tests:\\n\\n{tests}\\n``
then ``[BEGIN]\\n{code}\\n[DONE]``; the exemplars are problems 2, 3 and 4 of the prompt split,
written out here (solutions re-typed so that they pass their tests). The model's code is the text
before ``[DONE]``, or its first Markdown code block.

Metric ``pass@1`` (0-1), run only with the dataset's ``execute_code: true``
(specbench.tasks.sandbox); the program is the code, the setup code, then the asserts.
"""

from __future__ import annotations

from specbench.tasks.base import Example, Task
from specbench.tasks.sandbox import fenced_code, pass_at_1

SHOTS = (
    (
        "Write a function to find the similar elements from the given two tuple lists.",
        (
            "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
            "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
            "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)",
        ),
        "def similar_elements(test_tup1, test_tup2):\n"
        "  res = tuple(sorted(set(test_tup1) & set(test_tup2)))\n"
        "  return (res) ",
    ),
    (
        "Write a python function to identify non-prime numbers.",
        (
            "assert is_not_prime(2) == False",
            "assert is_not_prime(10) == True",
            "assert is_not_prime(35) == True",
        ),
        "import math\n"
        "def is_not_prime(n):\n"
        "    result = False\n"
        "    for i in range(2,int(math.sqrt(n)) + 1):\n"
        "        if n % i == 0:\n"
        "            result = True\n"
        "    return result",
    ),
    (
        "Write a function to find the largest integers from a given list of numbers using heap queue "
        "algorithm.",
        (
            "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65] ",
            "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75] ",
            "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, 65, 58, 35]",
        ),
        "import heapq as hq\n"
        "def heap_queue_largest(nums,n):\n"
        "  largest_nums = hq.nlargest(n, nums)\n"
        "  return largest_nums",
    ),
)


def _problem(text: str, tests) -> str:
    listed = "\n".join(tests)
    return (
        f"You are an expert Python programmer, and here is your task: {text} "
        f"Your code should pass these tests:\n\n{listed}\n"
    )


def _prompt(text: str, tests) -> str:
    shots = "".join(f"{_problem(t, ts)}[BEGIN]\n{code}\n[DONE]\n" for t, ts, code in SHOTS)
    return f"{shots}{_problem(text, tests)}[BEGIN]\n"


TEMPLATE = _prompt("{text}", ["{test_list[0]}", "{test_list[1]}", "{test_list[2]}"])


def solution(output_text: str) -> str:
    """The model's code: its first Markdown code block, else the text before ``[DONE]``."""
    code = fenced_code(output_text)
    return code if code is not None else output_text.split("[DONE]")[0].removeprefix("[BEGIN]")


def program(example: Example, output_text: str) -> str:
    return f"{solution(output_text)}\n\n{example.reference}"


def _build(row: dict, fallback_id: str) -> Example:
    if not isinstance(row["test_list"], list) or not all(isinstance(t, str) for t in row["test_list"]):
        raise ValueError("field 'test_list' must be a list of assert statements (strings)")
    tests = "\n".join([row.get("test_setup_code") or "", *row["test_list"]]).strip() + "\n"
    example_id = f"mbpp/{row['task_id']}" if row.get("task_id") is not None else fallback_id
    return Example(example_id, _prompt(row["text"], row["test_list"]), tests)


MBPP = Task(
    name="mbpp",
    hub_id="google-research-datasets/mbpp",
    hub_config="full",
    default_split="test",
    template=TEMPLATE,
    metric="pass@1",
    fields=("text", "test_list"),
    build=_build,
    grade=lambda example, text: pass_at_1(program(example, text)),
    executes_code=True,
)

TASKS = (MBPP,)
