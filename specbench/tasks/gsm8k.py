"""GSM8K (Cobbe et al. 2021); accuracy on the final number.

Two prompts over the same data (hub ``openai/gsm8k`` main, offline ``$SPECBENCH_DATA_DIR/gsm8k``):

* ``gsm8k``: CS Drafting's zero-shot chain-of-thought prompt; the output's last number is graded.
* ``gsm8k_fewshot``: the speculative cascades paper's Gemma runs use few-shot prompts (App. E.1)
  without printing them; this is the standard 8-shot chain-of-thought prompt of Wei et al. (2022),
  ``Q: ...\nA: ... The answer is N.`` blocks separated by blank lines. A few-shot model goes on to
  write the next ``Q:`` itself, so the output is cut there; its answer is the number after the last
  "The answer is", else its last number.
"""

from __future__ import annotations

import re

from specbench.tasks.base import Example, Task

TEMPLATE = "Reason the math question below step by step. Question: {question}.\n Answer: "
# "1,234" only with proper thousands groups, so a list such as "1,2,3" reads as three numbers;
# the lookbehind keeps the "-" of a range like "10-20" from making -20.
_NUMBER = re.compile(r"(?<![\d.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<!\d)-?\.\d+")


def parse_number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").rstrip("."))
    except ValueError:
        return None


def last_number(text: str) -> float | None:
    """The last number in a model's output (thousands commas, signs and decimals handled), or None."""
    matches = _NUMBER.findall(text)
    return parse_number(matches[-1]) if matches else None


def reference_answer(answer_field: str) -> str:
    """GSM8K's gold answer: the number after '####', commas removed."""
    return answer_field.split("####")[-1].strip().replace(",", "")


def grade_number(example: Example, output_text: str) -> float:
    """1.0 when the output's last number equals the reference numerically (3.50 == 3.5), else 0.0."""
    predicted, gold = last_number(output_text), parse_number(example.reference)
    return float(predicted is not None and gold is not None and abs(predicted - gold) < 1e-6)


def _build(row: dict, fallback_id: str) -> Example:
    if "####" not in row["answer"]:  # else the whole worked answer would become the gold number
        raise ValueError("its answer has no '#### <number>' (GSM8K's gold-answer line)")
    return Example(fallback_id, TEMPLATE.format(question=row["question"]), reference_answer(row["answer"]))


GSM8K = Task(
    name="gsm8k",
    hub_id="openai/gsm8k",
    hub_config="main",
    default_split="test",
    template=TEMPLATE,
    metric="accuracy",
    fields=("question", "answer"),
    build=_build,
    grade=grade_number,
)


# The eight GSM8K chain-of-thought exemplars of Wei et al. (2022), "Chain-of-thought prompting elicits
# reasoning in large language models", as the common 8-shot GSM8K CoT prompts write them.
FEWSHOT_EXEMPLARS = (
    (
        "There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they "
        "are done, there will be 21 trees. How many trees did the grove workers plant today?",
        "There are 15 trees originally. Then there were 21 trees after some more were planted. So there "
        "must have been 21 - 15 = 6. The answer is 6.",
    ),
    (
        "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking "
        "lot?",
        "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.",
    ),
    (
        "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in "
        "total?",
        "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After "
        "eating 35, they had 74 - 35 = 39. The answer is 39.",
    ),
    (
        "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many "
        "lollipops did Jason give to Denny?",
        "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny "
        "20 - 12 = 8. The answer is 8.",
    ),
    (
        "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does "
        "he have now?",
        "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. "
        "5 + 4 = 9. The answer is 9.",
    ),
    (
        "There were nine computers in the server room. Five more computers were installed each day, from "
        "monday to thursday. How many computers are now in the server room?",
        "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 "
        "computers were added. 9 + 20 is 29. The answer is 29.",
    ),
    (
        "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How "
        "many golf balls did he have at the end of wednesday?",
        "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing "
        "2 more, he had 35 - 2 = 33 golf balls. The answer is 33.",
    ),
    (
        "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
        "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 "
        "dollars left. 23 - 15 is 8. The answer is 8.",
    ),
)


def fewshot_prompt(question: str) -> str:
    blocks = [f"Q: {q}\nA: {a}" for q, a in FEWSHOT_EXEMPLARS]
    return "\n\n".join([*blocks, f"Q: {question}\nA:"])


FEWSHOT_TEMPLATE = fewshot_prompt("{question}")
_NEXT_QUESTION = re.compile(r"(?:^|\n)\s*Q:")
_THE_ANSWER = re.compile(r"answer is\s*:?\s*\$?\s*(" + _NUMBER.pattern + ")", re.IGNORECASE)


def fewshot_answer(output_text: str) -> float | None:
    """The answer of a few-shot output: cut before the next ``Q:`` the model writes, then the number
    after the last "The answer is", else the last number."""
    text = _NEXT_QUESTION.split(output_text, maxsplit=1)[0]
    stated = _THE_ANSWER.findall(text)
    return parse_number(stated[-1]) if stated else last_number(text)


def grade_fewshot(example: Example, output_text: str) -> float:
    predicted, gold = fewshot_answer(output_text), parse_number(example.reference)
    return float(predicted is not None and gold is not None and abs(predicted - gold) < 1e-6)


def _build_fewshot(row: dict, fallback_id: str) -> Example:
    return Example(fallback_id, fewshot_prompt(row["question"]), reference_answer(row["answer"]))


GSM8K_FEWSHOT = Task(
    name="gsm8k_fewshot",
    hub_id="openai/gsm8k",
    hub_config="main",
    default_split="test",
    template=FEWSHOT_TEMPLATE,
    metric="accuracy",
    fields=("question", "answer"),
    build=_build_fewshot,
    grade=grade_fewshot,
    local_dirs=("gsm8k_fewshot", "gsm8k"),
)

TASKS = (GSM8K, GSM8K_FEWSHOT)
