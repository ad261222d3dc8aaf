"""A task is data: where its examples live, the paper's prompt template, and a scorer.

The same loader reads the Hugging Face Hub or a local JSONL file in the Hub's schema, in this
order: the recipe's ``data_files``, then ``$SPECBENCH_DATA_DIR/<task>/<split>.jsonl``, then the
embedded file (tasks that ship one), then the Hub.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from specbench.errors import SpecbenchError


@dataclass(frozen=True)
class Example:
    id: str  # stable: the row's own id field, else "<task>/<split>/<row index>"
    prompt: str  # the paper's template filled in, before any chat template
    reference: str  # the gold answer the scorer compares against (code tasks: the test program)
    answers: tuple[str, ...] = ()  # every gold answer, when there are several (QA); () for none
    category: str | None = None  # the row's own category label, as the data file spells it
    # the user's messages after the first (multi-turn prompt sets); each follows the model's own
    # answer to the turn before it, see render_turn
    turns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task:
    name: str
    hub_id: str | None
    hub_config: str | None
    default_split: str
    template: str
    metric: str | None  # None: no quality metric (prompt sets used for speed only)
    fields: tuple[str, ...]  # the Hub-schema fields every row must have
    build: Callable[[dict, str], Example]  # (row, fallback id) -> Example
    # (example, output text) -> the metric's value, or {metric: value} for tasks with several metrics
    grade: Callable[[Example, str], float | dict[str, float]]
    embedded: str | None = None  # a JSONL file shipped in specbench/data
    # folders under $SPECBENCH_DATA_DIR to look in, in order (default: the task's name)
    local_dirs: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()  # every metric a dict-returning grade reports (default: (metric,))
    # corpus metrics (specbench.tasks.metrics.CORPUS_METRICS): per-row sufficient statistics, summed
    # over a cell's rows by specbench.pipeline.analysis.summary, e.g. {"bleu": [lengths, n-gram counts]}
    statistics: Callable[[Example, str], dict[str, list[float]]] | None = None
    executes_code: bool = False  # grade runs generated code: only when the dataset sets execute_code
    # splits carved out of another: name -> (source split, first, last) fractions of the source's
    # rows in a fixed shuffled order, for a dataset published as one split that a paper divides
    partitions: dict[str, tuple[str, float, float]] = field(default_factory=dict)

    def load(
        self, split: str | None = None, data_files: str | None = None, limit: int | None = None
    ) -> list[Example]:
        """The first ``limit`` examples (all when None) of ``split`` (default: ``default_split``)."""
        split = split or self.default_split
        rows, origin = self._rows(split, data_files)
        if limit is not None:
            keep = range(min(max(limit, 0), len(rows)))
            rows = _take(rows, keep)
        examples = []
        for index, row in enumerate(rows):
            missing = [field for field in self.fields if row.get(field) is None]
            if missing:
                raise SpecbenchError(
                    origin,
                    f"row {index} has no field {missing[0]!r} (task {self.name} expects {list(self.fields)})",
                    f"use a JSONL file in the schema of {self.schema()}",
                )
            try:
                examples.append(self.build(row, f"{self.name}/{split}/{index}"))
            except (KeyError, TypeError, IndexError, AttributeError, ValueError) as error:
                # a field of the wrong shape (translation without "de", answers not a list, no answer)
                raise SpecbenchError(
                    origin,
                    f"row {index} does not fit task {self.name} ({_shape_problem(error)})",
                    f"use a JSONL file in the schema of {self.schema()} (fields {list(self.fields)})",
                ) from None
        return examples

    def score(self, example: Example, output_text: str, execute_code: bool = False) -> dict[str, float]:
        """Every metric's value on one output; {} for speed-only tasks and for unrun code (see
        :meth:`skipped`)."""
        if not self.metric or (self.executes_code and not execute_code):
            return {}
        value = self.grade(example, output_text)
        return dict(value) if isinstance(value, dict) else {self.metric: value}

    def skipped(self, execute_code: bool = False) -> dict[str, str]:
        """{metric: why} for metrics :meth:`score` leaves out on purpose, so a report can say why."""
        if self.executes_code and not execute_code:
            why = "not computed: generated code runs only when the recipe's dataset sets execute_code: true"
            return {metric: why for metric in self.metrics or (self.metric,)}
        return {}

    def corpus_statistics(self, example: Example, output_text: str) -> dict[str, list[float]]:
        return self.statistics(example, output_text) if self.statistics else {}

    def schema(self) -> str:
        """Where the task's rows are defined: its Hub dataset, its embedded file, else its fields."""
        if self.hub_id:
            return self.hub_id
        if self.embedded:
            return f"specbench/data/{self.embedded}"
        return f"task {self.name} (one JSON object a line)"

    def _rows(self, split: str, data_files: str | None):
        if split in self.partitions:
            source, first, last = self.partitions[split]
            rows, origin = self._rows(source, data_files)
            chosen = partition(len(rows), first, last, seed=f"{self.name}/{source}")
            rows = _take(rows, chosen)
            return rows, f"{origin}, partition {split} ({first:.0%}-{last:.0%} of it, shuffled)"
        if data_files:
            return _read_jsonl(Path(data_files)), str(data_files)
        data_dir = os.environ.get("SPECBENCH_DATA_DIR")
        for folder in self.local_dirs or (self.name,):
            path = Path(data_dir or ".") / folder / f"{split}.jsonl"
            if data_dir and path.is_file():
                return _read_jsonl(path), str(path)
        if self.embedded:
            with resources.as_file(resources.files("specbench") / "data" / self.embedded) as path:
                return _read_jsonl(path), f"specbench/data/{self.embedded}"
        return _from_hub(self, split), f"{self.hub_id} ({split})"


def _take(rows, indices):
    """The rows at ``indices`` of a ``datasets.Dataset`` (kept one) or a list."""
    return rows.select(indices) if hasattr(rows, "select") else [rows[i] for i in indices]


def partition(n: int, first: float, last: float, seed: str) -> list[int]:
    """Row indices ``[first, last)`` (fractions) of a permutation of ``range(n)`` fixed by ``seed``
    (a string, hashed stably, so every machine and Python process draws the same permutation)."""
    generator = random.Random(int(hashlib.sha256(seed.encode()).hexdigest()[:16], 16))
    order = list(range(n))
    generator.shuffle(order)
    return sorted(order[round(first * n) : round(last * n)])


def _shape_problem(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"no key {error.args[0]!r} inside a field"
    if isinstance(error, IndexError):
        return "an empty list where an answer is needed"
    return " ".join(str(error).split()) or type(error).__name__


def _read_jsonl(path: Path):
    """A local JSONL file in the Hub's schema, read by ``datasets`` as the Hub dataset would be."""
    fix = "point data_files (or SPECBENCH_DATA_DIR/<task>/<split>.jsonl) at a JSONL file, one object a line"
    if not path.is_file():
        raise SpecbenchError(str(path), "data file not found", fix)
    rows = _plain_jsonl(path, fix)  # line-numbered errors, before datasets would give its own
    try:
        import datasets
    except ImportError:  # a minimal install (e.g. a GPU box image without datasets) still reads JSONL
        return rows
    datasets.disable_progress_bars()  # the run shows its own progress
    datasets.logging.set_verbosity_error()
    try:
        return datasets.load_dataset("json", data_files=str(path), split="train")
    except Exception as error:  # datasets wraps JSON and schema errors in several types
        raise SpecbenchError(str(path), f"not readable as JSON lines ({type(error).__name__})", fix) from None


# the longest data line read: far above any prompt a model's context holds, far below what parsing one
# line may cost (a 20 MB line once grew the process past 20 GB)
MAX_LINE_BYTES = 4 * 2**20


def _plain_jsonl(path: Path, fix: str) -> list[dict]:
    """Every line a JSON object, or an error naming the first line that is not."""
    import json

    with open(path, "rb") as handle:  # line lengths first, streaming: one huge line must not be read whole
        for number, line in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                raise SpecbenchError(
                    f"{path}: line {number}",
                    f"is longer than {MAX_LINE_BYTES // 2**20} MiB, longer than any prompt a model reads",
                    "remove or shorten that row",
                )
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark some editors write is not part of row 1
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise SpecbenchError(f"{path}: line {line}", "is not UTF-8 text", fix) from None
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 is inside rows
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise SpecbenchError(f"{path}: line {number}", "is not a JSON object", fix) from None
        if not isinstance(row, dict):
            raise SpecbenchError(
                f"{path}: line {number}", f"is JSON {type(row).__name__}, not an object", fix
            )
        try:  # "\ud800" parses, but is no character: no tokenizer or arrow table can take it
            json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise SpecbenchError(
                f"{path}: line {number}", "holds a lone UTF-16 surrogate (an escaped \\ud800-\\udfff)", fix
            ) from None
        rows.append(row)
    if not rows:
        raise SpecbenchError(str(path), "holds no rows", fix)
    return rows


def _offline() -> bool:
    flags = (os.environ.get(name, "0").strip().lower() for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))
    return any(flag not in ("0", "", "false", "no", "off") for flag in flags)


def _from_hub(task: Task, split: str):
    if task.hub_id is None:
        raise SpecbenchError(
            f"task {task.name}",
            f"no local copy of split {split!r} and the task has no Hugging Face Hub dataset",
            f"set data_files: in the recipe, or SPECBENCH_DATA_DIR so that "
            f"<dir>/{task.name}/{split}.jsonl exists",
        )
    fix = (
        f"set data_files: in the recipe, or SPECBENCH_DATA_DIR so that <dir>/{task.name}/{split}.jsonl "
        f"exists (a JSONL copy of {task.hub_id} in its schema)"
    )
    if _offline():
        raise SpecbenchError(f"task {task.name}", f"hub dataset {task.hub_id} is unavailable offline", fix)
    # Unreachable, datasets retries for ~25 s before failing; a 3 s socket probe fails fast instead.
    from specbench.models import cache

    if not cache.hub_reachable():
        raise SpecbenchError(
            f"task {task.name}", f"could not reach the Hugging Face Hub ({task.hub_id})", fix
        )
    import datasets

    try:
        return datasets.load_dataset(task.hub_id, task.hub_config, split=split)
    except Exception as error:  # network and dataset-script errors come in many types
        raise SpecbenchError(
            f"task {task.name}", f"could not load hub dataset {task.hub_id} ({type(error).__name__})", fix
        ) from None


def render_prompt(example: Example, tokenizer, chat_template: bool) -> str:
    """The text the model sees: the task prompt, wrapped in the tokenizer's chat template if asked."""
    if not chat_template:
        return example.prompt
    _check_chat_template(tokenizer)
    messages = [{"role": "user", "content": example.prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# between an answer and the next user message in the plain-text rendering of a conversation
PLAIN_TURN_SEPARATOR = "\n\n"


def render_turn(example: Example, answers: list[str], tokenizer, chat_template: bool) -> str:
    """The text the model sees for turn i = len(answers) of a multi-turn example (0-based).

    The conversation is user(prompt), assistant(answers[0]), user(turns[0]), ..., user(turns[i-1]):
    each later turn follows the model's own answers to the turns before it, as Spec-Bench (Xia et al.
    2024) runs MT-Bench's second turns. Turn 0 is exactly :func:`render_prompt`.

    With ``chat_template`` the messages go through the tokenizer's chat template with the generation
    prompt; each answer is stripped of surrounding whitespace first, as Spec-Bench's evaluation loop
    (FastChat's) stores it before the next turn. Without one, the text is plain continuation: turn i
    is turn i-1's text, then the answer exactly as generated, then a blank line
    (:data:`PLAIN_TURN_SEPARATOR`) and the next user message; so turn 1 reads
    ``prompt + answers[0] + "\\n\\n" + turns[0]``, and the model's context up to its own answer is
    what it saw while writing it.
    """
    i = len(answers)
    if i == 0:
        return render_prompt(example, tokenizer, chat_template)
    if i > len(example.turns):
        raise SpecbenchError(
            f"example {example.id}",
            f"has {len(example.turns) + 1} turn(s), so there is no turn {i} (0-based) to render",
            "pass at most one answer per turn before the last",
        )
    users = [example.prompt, *example.turns[:i]]
    if not chat_template:
        text = users[0]
        for answer, user in zip(answers, users[1:], strict=True):
            text += answer + PLAIN_TURN_SEPARATOR + user
        return text
    _check_chat_template(tokenizer)
    messages = [{"role": "user", "content": users[0]}]
    for answer, user in zip(answers, users[1:], strict=True):
        messages += [{"role": "assistant", "content": answer.strip()}, {"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _check_chat_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise SpecbenchError(
            "datasets[].chat_template",
            "the model's tokenizer has no chat template",
            "set chat_template: false for this dataset",
        )
