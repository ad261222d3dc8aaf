"""The recipe's sections: a model, a dataset, the generation settings, a method entry, load settings.

pydantic checks each one's shape, types and ranges (strict: ``"3"`` is not an integer; a misspelt key
is an error); what needs the whole recipe is checked in :mod:`specbench.recipe.checks`.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from specbench.engines import ENGINE_NAMES
from specbench.errors import SpecbenchError, expand_home
from specbench.methods import METHODS
from specbench.models.costs import cost_tables
from specbench.recipe.messages import invalid, one_of, show

MAX_NAME = 100  # a recipe's name is a folder name under results/
NAME_PATTERN = rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_NAME - 1}}}"


def _check_name(value: str) -> str:
    if not re.fullmatch(NAME_PATTERN, value):  # never "." or "..": the folder itself or the one above
        raise invalid(
            f"{value[:60]!r}{'...' if len(value) > 60 else ''} is not a valid name",
            f"use up to {MAX_NAME} letters, digits, '_', '.' and '-', starting with a letter or digit",
        )
    return value


Name = Annotated[str, AfterValidator(_check_name)]

# Below it, logits / temperature overflow (5e-324 made the sampler's multinomial raise): 0 is greedy.
MIN_TEMPERATURE = 1e-6


def _check_temperature(value: float) -> float:
    if 0 < value < MIN_TEMPERATURE:
        raise invalid(
            f"{value} is above 0 but below {MIN_TEMPERATURE} (the scaled logits would overflow)",
            "use 0 for greedy decoding, or a temperature of at least 1e-06",
        )
    return value


class Strict(BaseModel):
    # strict: "3" is not an int and true is not a number; extra="forbid": a misspelt key is an error.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class CostTableEntry(Strict):
    table: str
    entry: str


def _table_entry(value: dict) -> CostTableEntry:
    if set(value) != {"table", "entry"}:
        raise invalid(f"a cost table reference has keys {sorted(value)}", "write {table: NAME, entry: NAME}")
    tables = cost_tables()
    table = tables.get(value["table"])
    if table is None:
        raise invalid(f"unknown cost table {value['table']!r}", one_of(value["table"], tables))
    if value["entry"] not in table["entries"]:
        raise invalid(
            f"cost table {value['table']!r} has no entry {value['entry']!r}",
            one_of(value["entry"], table["entries"]),
        )
    return CostTableEntry(table=value["table"], entry=value["entry"])


class CostSpec(Strict):
    pw: float | CostTableEntry | None = None  # prior-work cost relative to the target (= 1)

    @field_validator("pw", mode="before")
    @classmethod
    def _number_or_table_entry(cls, value):
        # Checked by hand: a plain union would report one error per member type.
        if value is None or isinstance(value, CostTableEntry):
            return value
        if isinstance(value, dict):
            return _table_entry(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                raise invalid(f"{value} is a negative cost", "use a number >= 0 (the target costs 1)")
            return float(value)
        raise invalid(
            f"{show(value)} is neither a number nor a cost table entry",
            "use a number >= 0 or {table: NAME, entry: NAME}",
        )


class ModelSpec(Strict):
    source: str = Field(min_length=1)
    dtype: Literal["float32", "float64", "bfloat16", "float16", "auto"] = "auto"
    device: str = "auto"
    revision: str | None = None
    # eager Hugging Face passes, or specbench.models.compiled (static cache + compiled fixed shapes),
    # or a serving engine (specbench.engines: vllm); unset: the recipe's engine. Statistical drafters
    # have none.
    engine: Literal[("eager", "compiled", *ENGINE_NAMES)] | None = None
    # which library runs the linear layers (specbench.models.linear): on the eager engine aten, onednn or
    # auto (unset: the recipe's linear); on the compiled engine aten or inductor (unset: aten)
    linear: Literal["aten", "onednn", "auto", "inductor"] | None = None
    # a serving engine's own settings (specbench.engines.<engine>.OPTIONS), checked when read
    engine_options: dict[str, Any] = Field(default_factory=dict)
    # passed to the loader; each kind of source in specbench.sources declares the options it takes
    options: dict[str, Any] = Field(default_factory=dict)
    cost: CostSpec | None = None

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
            raise invalid(f"{value!r} is not a device", "use auto, cpu, cuda, cuda:N or mps")
        return value


# the longest output a recipe may ask for (beyond any model's context, so only typos reach it)
MAX_NEW_TOKENS = 1_048_576
# the most cells one recipe may hold: a sweep beyond it is a search (`specbench tune`) or several runs
MAX_CELLS = 10_000


class DatasetSpec(Strict):
    task: str
    split: str | None = None
    limit: int | None = Field(default=None, ge=1)
    every: int = Field(default=1, ge=1)  # every N-th example (a sample across a sorted set), then limit
    data_files: Path | None = Field(default=None, strict=False)
    chat_template: bool = True
    # run the generated code against the task's tests (pass@1 of code tasks), in
    # specbench.tasks.sandbox; off by default, and then those rows carry no pass@1
    execute_code: bool = False
    # this dataset's output length, when it differs from generation.max_new_tokens (papers set one
    # per task: e.g. 5 tokens for QA, 320 for GSM8K)
    max_new_tokens: int | None = Field(default=None, ge=1, le=MAX_NEW_TOKENS)

    @field_validator("data_files")
    @classmethod
    def _readable(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        recipe_dir = (info.context or {}).get("recipe_dir", Path("."))
        try:
            path = expand_home(value, "data_files")
        except SpecbenchError as error:
            raise invalid(error.problem, error.fix) from None
        path = path if path.is_absolute() else recipe_dir / path
        if not path.is_file() or not os.access(path, os.R_OK):
            raise invalid(
                f"cannot read {path}",
                "give a readable .jsonl file (a relative path starts at the recipe's folder)",
            )
        return path


class GenerationSpec(Strict):
    max_new_tokens: int = Field(default=128, ge=1, le=MAX_NEW_TOKENS)
    temperature: Annotated[float, AfterValidator(_check_temperature)] = Field(
        default=0.0, ge=0.0, le=100.0, allow_inf_nan=False
    )  # 0 = greedy
    top_k: int = Field(default=0, ge=0)  # 0 = off
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    # prompt + new tokens at most, as transformers' max_length (SpecDec++'s release: 512); None: no cap
    # beyond max_new_tokens, which still caps every example
    max_length: int | None = Field(default=None, ge=2)

    def budget(self, prompt_tokens: int, max_new_tokens: int | None = None) -> int:
        """New tokens an example may generate: ``max_new_tokens`` (the dataset's, else this one's),
        no more than ``max_length`` leaves after the prompt."""
        budget = max_new_tokens or self.max_new_tokens
        return budget if self.max_length is None else min(budget, self.max_length - prompt_tokens)


# requests per load level and repeat when the recipe names none: enough for a p90 that is not the
# maximum, where 8 made the p99 columns rough
DEFAULT_REQUESTS = 32


class LoadSpec(Strict):
    """``specbench load``: the recipe's engine cells served on 127.0.0.1 and driven at each level
    (specbench.engines.load_client): closed-loop ``concurrency`` levels (that many requests in flight)
    and open-loop ``request_rate`` levels (requests arriving at that mean rate, per second)."""

    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = Field(default_factory=list)
    request_rate: list[float] = Field(default_factory=list)
    # the gamma shape of the gaps between arrivals: 1 a Poisson process, below 1 burstier, .inf even
    burstiness: float = Field(default=1.0, gt=0)
    # requests per level and repeat; None: duration_s's worth, else max(32, 2 x concurrency), or 32
    requests: int | None = Field(default=None, ge=1, le=1_000_000)
    # a level's length in seconds instead of a request count (an open-loop level: rate x duration_s
    # requests; a closed-loop one sends until the time is up)
    duration_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # each level measured this many times, every engine's server started once per repeat, in turn
    repeats: int = Field(default=1, ge=1, le=100)
    # requests sent (warmup_requests at a time) after each server start and before its first level,
    # left out of every figure
    warmup_requests: int = Field(default=1, ge=0, le=4096)
    # the service-level objective goodput counts requests against
    slo_ttft_s: float = Field(default=2.0, gt=0)
    slo_tpot_s: float = Field(default=0.2, gt=0)
    timeout_s: float = Field(default=600.0, gt=0)  # one request's limit, from its send to its end

    def request_count(self, concurrency: int | None = None, rate: float | None = None) -> int | None:
        """Requests per repeat of a level (one of ``concurrency``, ``rate``): ``requests``; else with
        ``duration_s`` an open-loop level's rate x duration_s (rounded), a closed-loop one's None
        (its clients send until the time is up); else max(32, 2 x concurrency), or 32."""
        if self.requests is not None:
            return self.requests
        if self.duration_s is not None:
            return None if rate is None else math.floor(rate * self.duration_s + 0.5)
        return max(DEFAULT_REQUESTS, 2 * concurrency) if concurrency is not None else DEFAULT_REQUESTS

    @field_validator("concurrency")
    @classmethod
    def _once_each(cls, value: list[int]) -> list[int]:
        repeated = sorted({level for level in value if value.count(level) > 1})
        if repeated:  # a level measured twice keeps its last row only
            raise invalid(
                f"lists concurrency {', '.join(map(str, repeated))} more than once",
                f"list each level once, e.g. {sorted(set(value))}",
            )
        return value

    @field_validator("request_rate")
    @classmethod
    def _rates(cls, value: list[float]) -> list[float]:
        for rate in value:
            if not rate > 0 or rate == float("inf"):
                raise invalid(
                    f"{rate:g} is not a request rate (requests arrive at a positive, finite rate)",
                    "give requests per second above 0, e.g. [0.5, 1, 2]; for as many at once as the "
                    "server takes, use a concurrency level",
                )
        repeated = sorted({rate for rate in value if value.count(rate) > 1})
        if repeated:
            raise invalid(
                f"lists request rate {', '.join(f'{r:g}' for r in repeated)} more than once",
                f"list each rate once, e.g. {sorted(set(value))}",
            )
        return value


class MethodSpec(Strict):
    name: Name
    method: str
    target: str
    drafter: str | None = None
    drafters: list[str] | None = None  # a cascade: neural drafters largest first, a statistical one last
    params: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    # greedy lossless methods: count the target's reviews from its AR output instead of running it
    # (specbench.models.replay); the rows' walltime then excludes the target and is reported as NaN
    replay: bool = False

    @field_validator("method")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value not in METHODS:
            raise invalid(f"unknown method {value!r}", one_of(value, METHODS))
        return value
