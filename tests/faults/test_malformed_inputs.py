"""Malformed input, generated from the recipe schema itself: every field of every level gets a value of
the wrong type, every level an unknown key, every bounded field a value past its bound, every
required field goes missing, every method parameter a wrong value; then files that are not recipes,
bad references, bad data files and bad report / plot arguments. A new schema field or method
parameter is covered without a new test.

Every case must end as a user error: exit 2, one line that names the file and field and says how to
fix it, and no traceback. ``python tests/faults/test_malformed_inputs.py`` prints the tally docs/running.md
quotes.
"""

from __future__ import annotations

import copy
import json
import sys
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import tiny_recipes
import yaml
from annotated_types import Ge, Gt, Le, MinLen
from typer.testing import CliRunner

from specbench.cli import app
from specbench.methods import METHODS
from specbench.recipe import CostSpec, DatasetSpec, GenerationSpec, MethodSpec, ModelSpec, Recipe

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

# a small valid recipe: every level of the schema appears once, and it would finish in seconds
BASE = tiny_recipes.recipe(
    "faults",
    {
        "target": tiny_recipes.tiny(seed=1),
        "draft": tiny_recipes.tiny(layers=1) | {"cost": {"pw": 0.5}},
        "lookup": tiny_recipes.lookup(),
    },
    [tiny_recipes.ar(), tiny_recipes.speculative(k=[2]), tiny_recipes.speculative("lookup", None, name="pl")],
    limit=1,
    max_new_tokens=4,
    temperature=0.0,
    seed=0,
    warmup=0,
)
# where each schema level sits in BASE
LEVELS = {
    (): Recipe,
    ("generation",): GenerationSpec,
    ("models", "draft"): ModelSpec,
    ("models", "draft", "cost"): CostSpec,
    ("datasets", 0): DatasetSpec,
    ("methods", 1): MethodSpec,
}
# a value of the wrong type for each annotation
WRONG = {int: "three", float: "fast", str: ["a", "list"], bool: "maybe", dict: 3, list: "x", Path: 12}


@dataclass(frozen=True)
class Case:
    id: str
    recipe: dict | None = None  # a recipe to write as YAML, or
    raw: bytes | None = None  # the recipe file's bytes, or
    argv: tuple[str, ...] | None = None  # a whole command line ({tmp} is the test's folder)
    field: str = ""  # text the message must contain besides the file


def _with(path: tuple, key, value) -> dict:
    data = copy.deepcopy(BASE)
    node = data
    for part in path:
        node = node[part]
    if value is _DELETE:
        del node[key]
    else:
        node[key] = value
    return data


_DELETE = object()


def _base_type(annotation) -> type | None:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (dict, list):
        return origin
    if args and origin is not typing.Literal:
        return _base_type(args[0])
    if origin is typing.Literal:
        return str
    return annotation if isinstance(annotation, type) else None


def _field_path(path: tuple, key: str) -> str:
    parts = [f"[{p}]" if isinstance(p, int) else f".{p}" for p in (*path, key)]
    return "".join(parts).lstrip(".")


def schema_cases() -> list[Case]:
    cases = []
    for path, model in LEVELS.items():
        where = _field_path(path, "colour")
        cases.append(Case(f"unknown key {where}", _with(path, "colour", 1), field="colour"))
        for key, info in model.model_fields.items():
            kind = _base_type(info.annotation)
            if kind in WRONG and not (kind is str and key == "description"):
                value = WRONG[kind]
                cases.append(Case(f"wrong type {_field_path(path, key)}", _with(path, key, value), field=key))
            for bound in info.metadata:
                if isinstance(bound, (Ge, Gt)):
                    low = bound.ge if isinstance(bound, Ge) else bound.gt
                    value = low - 1 if isinstance(bound, Ge) else low
                    if key in ("models", "datasets", "methods"):
                        continue
                    cases.append(
                        Case(f"below bound {_field_path(path, key)}", _with(path, key, value), field=key)
                    )
                if isinstance(bound, Le):
                    value = bound.le * 2 if bound.le > 0 else bound.le + 1
                    cases.append(
                        Case(f"above bound {_field_path(path, key)}", _with(path, key, value), field=key)
                    )
                if isinstance(bound, MinLen):
                    empty = {} if kind is dict else [] if kind is list else ""
                    cases.append(Case(f"empty {_field_path(path, key)}", _with(path, key, empty), field=key))
            if info.is_required():
                cases.append(Case(f"missing {_field_path(path, key)}", _with(path, key, _DELETE), field=key))
    return cases


def method_parameter_cases() -> list[Case]:
    """Per registered method: an unknown parameter, and each parameter's wrong type and bounds."""
    cases = []
    for name, method in sorted(METHODS.items()):

        def recipe_with(name=name, method=method, **changes) -> dict:
            data = copy.deepcopy(BASE)
            entry = {"name": "m", "method": name, "target": "target", **changes}
            if method.drafter_list:
                data["models"]["mag"] = {"source": "maxgram"}
                entry["drafters"] = ["draft", "mag"]
            elif method.takes_heads:  # heads on the target's states (validated, never loaded here)
                heads = f"{method.takes_heads}:tiny-llama/{method.takes_heads}"
                data["models"]["heads"] = {"source": heads, "options": {"of": "target"}}
                entry["drafter"] = "heads"
            elif method.needs_drafter:
                entry["drafter"] = "draft"
            data["methods"].append(entry)
            return data

        cases.append(Case(f"{name}: unknown parameter", recipe_with(params={"colour": 1}), field="colour"))
        for param, spec in sorted(method.params.items()):
            bad = [WRONG[spec.type] if spec.type in WRONG else None]
            if spec.minimum is not None:
                bad.append(spec.minimum - 1)
            if spec.maximum is not None:
                bad.append(spec.maximum + 1)
            for value in (v for v in bad if v is not None):
                data = recipe_with(params={param: value})
                cases.append(Case(f"{name}: {param} = {value!r}", data, field=param))
        grid = recipe_with(grid={next(iter(method.params), "k"): []})
        cases.append(Case(f"{name}: empty grid", grid, field="grid"))
    return cases


def _local_model(name: str) -> dict:
    """BASE with the drafter loaded from a local path of ``write_files``; {tmp} is filled in later."""
    data = copy.deepcopy(BASE)
    data["models"]["draft"] = {"source": "{tmp}/" + name}
    return data


def reference_cases() -> list[Case]:
    def method(**changes) -> dict:
        data = copy.deepcopy(BASE)
        data["methods"][1].update(changes)
        return data

    twice = copy.deepcopy(BASE)
    twice["methods"].append(copy.deepcopy(BASE["methods"][0]))
    unused = _with(("models",), "spare", {"source": "tiny-llama"})
    return [
        Case("undefined target", method(target="nobody"), field="target"),
        Case("undefined drafter", method(drafter="nobody"), field="drafter"),
        Case("unknown method", method(method="speculativ"), field="method"),
        Case("duplicate method name", twice, field="name"),
        Case("unknown model source", _with(("models", "draft"), "source", "no-such-model"), field="source"),
        Case("unknown task", _with(("datasets", 0), "task", "gsm9k"), field="task"),
        Case("bad dtype", _with(("models", "draft"), "dtype", "float8"), field="dtype"),
        Case("bad device", _with(("models", "draft"), "device", "tpu"), field="device"),
        Case("model no method uses", unused, field="spare"),
        Case("revision on a tiny model", _with(("models", "draft"), "revision", "main"), field="revision"),
        Case("negative tiny layers", _with(("models", "draft"), "options", {"layers": -3}), field="layers"),
        Case(
            "absurd tiny width", _with(("models", "draft"), "options", {"hidden_size": 10**7}), field="hidden"
        ),
        Case("unknown model option", _with(("models", "draft"), "options", {"colour": 1}), field="colour"),
        Case("huge max_new_tokens", _with(("generation",), "max_new_tokens", 10**9), field="max_new_tokens"),
        Case("k beyond max_new_tokens", method(grid={"k": [8]}), field="k"),
        Case("negative temperature", _with(("generation",), "temperature", -1.0), field="temperature"),
        Case("denormal temperature", _with(("generation",), "temperature", 5e-324), field="temperature"),
        Case("negative cost", _with(("models", "draft"), "cost", {"pw": -1}), field="pw"),
        Case("a model folder that is empty", _local_model("empty-model"), field="empty-model"),
        Case("a .gguf file that is not GGUF", _local_model("fake.gguf"), field="fake.gguf"),
    ]


def file_cases() -> list[Case]:
    text = yaml.safe_dump(BASE)
    return [
        Case("YAML syntax error", raw=b"name: [unclosed\nmodels: {\n"),
        Case("empty file", raw=b""),
        Case("a list, not a mapping", raw=b"- 1\n- 2\n"),
        Case("binary file", raw=bytes(range(256)) * 4),
        Case("not UTF-8", raw=text.replace("faults", "f\xe4ults").encode("latin-1")),
        Case("duplicate key", raw=(text + "name: again\n").encode()),
        Case("tab indentation", raw=b"name: x\nmodels:\n\ttarget: {source: tiny-llama}\n"),
    ]


DATA_FILES = {
    "missing": None,
    "directory": "dir",
    "empty": b"",
    "binary": bytes(range(256)),
    "not UTF-8": '{"question": "caf\xe9", "answer": "#### 1"}\n'.encode("latin-1"),
    "not JSON": b"question: no\n",
    "a row without the answer field": b'{"question": "1 + 1?"}\n',
    "a row that is a list": b"[1, 2]\n",
    "a GSM8K answer without ####": b'{"question": "1 + 1?", "answer": "It is 2."}\n',
}
BAD_CSV = {
    "not a CSV": b"\x00\x01\x02 binary",
    "no columns": b"",
    "missing columns": b"dataset,cell\narithmetic/test,ar\n",
    "ragged rows": b'dataset,cell,method\na,b\n"unclosed,x,y,z\n',
}


def _data_path(tmp: Path, label: str) -> Path:
    return tmp / f"data-{label.replace(' ', '-')}.jsonl"


def _csv_run(tmp: Path, label: str) -> Path:
    return tmp / f"csv-{label.replace(' ', '-')}"


def write_files(tmp: Path) -> None:
    """The bad files the cases point at."""
    for label, content in DATA_FILES.items():
        path = _data_path(tmp, label)
        if content == "dir":
            path.mkdir()
        elif content is not None:
            path.write_bytes(content)
    for label, content in BAD_CSV.items():
        _csv_run(tmp, label).mkdir()
        (_csv_run(tmp, label) / "cells.csv").write_bytes(content)
    (tmp / "empty-dir").mkdir()
    (tmp / "empty-model").mkdir()
    (tmp / "fake.gguf").write_bytes(b"GGUF? no: " + bytes(range(64)))
    (tmp / "a-file").write_text("x")
    (tmp / "data-same-id.jsonl").write_text(
        "".join(json.dumps({"question_id": 7, "category": "qa", "turns": [t]}) + "\n" for t in ("a?", "b?"))
    )
    (tmp / "data-surrogate.jsonl").write_bytes(b'{"question": "\\ud800", "answer": "#### 1"}\n')
    (tmp / "corpus.txt").write_text("a b c\n")
    _users_folder(tmp).mkdir()
    (_users_folder(tmp) / "notes.txt").write_text("the user's own notes\n")
    (tmp / "no-data").mkdir()
    (tmp / "torn-run").mkdir()
    (tmp / "torn-run" / "examples.jsonl").write_bytes(b'{"key": "a"}\n{"key": "b", "tru')
    _tampered_directories(tmp)


# checksums deleted or rows edited (issue 58): a run stripped of every checksum and of checksums.json
# whose environment.json says a session wrote it after rows had them; sweeps with a load.csv row or a
# request line edited, and one stripped of its checksum column and of environment.json
STRIPPED_RUN, EDITED_SWEEP, EDITED_REQUESTS, STRIPPED_SWEEP = (
    "stripped-run",
    "edited-sweep",
    "edited-requests",
    "stripped-sweep",
)


def _tampered_directories(tmp: Path) -> None:
    from specbench.engines.load import append_requests, write_load

    run = tmp / STRIPPED_RUN
    run.mkdir()
    rows = [
        {"key": f"k{i}", "dataset": "arithmetic/test", "cell": "ar", "example_id": f"e{i}", "walltime": 1.0}
        for i in (1, 2)
    ]
    (run / "examples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run / "cells.csv").write_text("dataset,cell,tokens_per_s\narithmetic/test,ar,4000\n")
    session = {"started": "2026-11-28T12:00:00+00:00", "rows": 2}
    (run / "environment.json").write_text(json.dumps({"results_format": 1, "sessions": [session]}))
    level = {"concurrency": 1, "repeat": 0, "complete": True, "throughput_tok_s": 40.5}
    sweep = [
        {"key": "a1", "cell": "vllm-ar", "method": "autoregressive", **level},
        {"key": "s1", "cell": "vllm-ngram", "method": "speculative", **level},
    ]
    for name in (EDITED_SWEEP, EDITED_REQUESTS, STRIPPED_SWEEP):
        write_load(tmp / name, sweep)
        for row in sweep:
            append_requests(tmp / name, row["key"], [{"index": 0, "e2e_s": 1.0, "output_tokens": 40}])
    edited = tmp / EDITED_SWEEP / "load.csv"
    edited.write_text(edited.read_text().replace("40.5", "4050.5", 1))
    requests = tmp / EDITED_REQUESTS / "load_requests.jsonl"
    requests.write_text(requests.read_text().replace('"e2e_s": 1.0', '"e2e_s": 0.01', 1))
    stripped = tmp / STRIPPED_SWEEP
    stripped_csv = [line.rsplit(",", 1)[0] for line in (stripped / "load.csv").read_text().splitlines()]
    (stripped / "load.csv").write_text("\n".join(stripped_csv) + "\n")
    (stripped / "checksums.json").unlink()


def data_file_cases(tmp: Path) -> list[Case]:
    """``data_files`` that are missing, empty, binary, a directory, not UTF-8, or hold bad rows."""
    cases = []
    for label in DATA_FILES:
        dataset = {"task": "gsm8k", "split": "test", "limit": 1, "data_files": str(_data_path(tmp, label))}
        cases.append(Case(f"data file: {label}", _with(("datasets",), 0, dataset), field="datasets[0]"))
    return cases


def command_cases(tmp: Path) -> list[Case]:
    torn = tmp / "torn-run"
    cases = [
        Case(f"report: cells.csv {label}", argv=("report", str(_csv_run(tmp, label))), field="cells.csv")
        for label in BAD_CSV
    ]
    return cases + [
        Case("report: missing directory", argv=("report", str(tmp / "nowhere")), field="nowhere"),
        Case("report: a file, not a directory", argv=("report", str(tmp / "a-file")), field="a-file"),
        Case("report: empty directory", argv=("report", str(tmp / "empty-dir")), field="empty-dir"),
        Case("report: unknown format", argv=("report", str(tmp), "--format", "pdf"), field="format"),
        Case("report: unknown paper", argv=("report", str(tmp), "--paper", "nope"), field="paper"),
        Case("report: unknown --by", argv=("report", str(tmp), "--by", "colour"), field="--by"),
        Case(
            "report --by category: torn examples.jsonl",
            argv=("report", str(torn), "--by", "category"),
            field="line 2",
        ),
        Case(
            "report --by category: no examples",
            argv=("report", str(tmp / "empty-dir"), "--by", "category"),
            field="empty-dir",
        ),
        Case(
            "compare: missing directory",
            argv=("compare", str(tmp / "nowhere"), str(tmp / "empty-dir")),
            field="nowhere",
        ),
        Case("compare: one run", argv=("compare", str(_csv_run(tmp, next(iter(BAD_CSV))))), field="compare"),
        Case(
            f"compare: cells.csv {next(iter(BAD_CSV))}",
            argv=("compare", str(_csv_run(tmp, next(iter(BAD_CSV)))), str(tmp / "empty-dir")),
            field="cells.csv",
        ),
        Case("plot: missing directory", argv=("plot", str(tmp / "nowhere")), field="nowhere"),
        Case("plot: torn examples.jsonl", argv=("plot", str(torn)), field="line 2"),
        Case("plot: unknown figure", argv=("plot", str(torn), "--figure", "pie"), field="figure"),
        Case("run: missing recipe", argv=("run", str(tmp / "nowhere.yaml")), field="nowhere.yaml"),
        Case("run: recipe is a directory", argv=("run", str(tmp / "empty-dir")), field="empty-dir"),
    ]


def _users_folder(tmp: Path) -> Path:
    return tmp / "mine"  # holds notes.txt (write_files)


def _distill(tmp: Path, *options: str) -> tuple[str, ...]:
    """distill on the tiny target with an empty data folder: a case must fail before any teacher data."""
    size = () if "--size" in options else ("--size", "small")
    return ("distill", "--target", "tiny-llama", *size, "--data-dir", str(tmp / "no-data"), *options)


def _bigram_build(corpus: str, out: str) -> tuple[str, ...]:
    return ("bigram", "build", "--tokenizer", "tiny-llama", "--corpus", corpus, "--out", out)


def tampered_cases(tmp: Path) -> list[Case]:
    """Checksums deleted, every one of them, or rows edited: each reader names the file in one line."""
    run, edited, requests, stripped = (
        str(tmp / name) for name in (STRIPPED_RUN, EDITED_SWEEP, EDITED_REQUESTS, STRIPPED_SWEEP)
    )
    session = "environment.json records a session of 2026-11-28T12:00"
    return [
        Case(
            "report: a run stripped of every checksum, cells.csv edited", argv=("report", run), field=session
        ),
        Case("compare: a run stripped of every checksum", argv=("compare", run, run), field="cells.sha256"),
        Case("plot: a run stripped of every checksum", argv=("plot", run), field="line 1: has no checksum"),
        Case(
            "report --by category: a run stripped of every checksum",
            argv=("report", run, "--by", "category"),
            field=session,
        ),
        Case(
            "plot --figure load: an edited load.csv row",
            argv=("plot", edited, "--figure", "load"),
            field="load.csv: line 2: was edited",
        ),
        Case(
            "plot --figure load: an edited request line",
            argv=("plot", requests, "--figure", "load"),
            field="load_requests.jsonl: line 1: was edited",
        ),
        Case(
            "plot --figure load: a sweep stripped of its checksums and environment.json",
            argv=("plot", stripped, "--figure", "load"),
            field="also wrote environment.json, and it is gone",
        ),
    ]


def hostile_cases(tmp: Path) -> list[Case]:
    """Issue 30's hostile inputs: ambiguous labels, unbounded work, names that are folders, values
    that are not numbers, and commands that once ended in a traceback."""
    twice = copy.deepcopy(BASE)
    twice["datasets"].append({"task": "arithmetic", "max_new_tokens": 9})
    huge_grid = copy.deepcopy(BASE)
    huge_grid["methods"][2]["grid"] = {"k": list(range(1, 20_001))}
    many = copy.deepcopy(BASE)
    many["generation"]["max_new_tokens"] = 64
    many["methods"] += [
        {
            "name": f"m{i}",
            "method": "speculative",
            "target": "target",
            "drafter": "lookup",
            "grid": {"k": list(range(1, 61)), "lenience": [1, 1.5, 2, 3, 4]},
        }
        for i in range(40)
    ]
    ids = {"task": "spec_bench", "data_files": str(tmp / "data-same-id.jsonl")}
    surrogate = {"task": "gsm8k", "split": "test", "data_files": str(tmp / "data-surrogate.jsonl")}
    long_prompt = _with(("generation",), "max_new_tokens", 4090)
    return [
        Case("a dataset listed twice", twice, field="datasets[1]"),
        Case("an example id given twice", _with(("datasets",), 0, ids), field="example id"),
        Case("a lone UTF-16 surrogate in a data file", _with(("datasets",), 0, surrogate), field="line 1"),
        Case("a grid of 20,000 values", huge_grid, field="grid"),
        Case("more than 10,000 cells", many, field="methods"),
        Case("a prompt beyond the model's context", long_prompt, field="context"),
        Case("a name that is the folder above", _with((), "name", ".."), field="name"),
        Case("a 300-character name", _with((), "name", "a" * 300), field="name"),
        Case(
            "an infinite temperature",
            raw=yaml.safe_dump(BASE).replace("temperature: 0.0", "temperature: .inf").encode(),
            field="temperature",
        ),
        Case("YAML nested 3,000 deep", raw=b"x: " + b"[" * 3000 + b"]" * 3000 + b"\n"),
        Case(
            "a data file under ~nosuchuser",
            _with(("datasets",), 0, {"task": "arithmetic", "data_files": "~nosuchuser/x.jsonl"}),
            field="data_files",
        ),
        Case(
            "a model folder under ~nosuchuser",
            _with(("models",), "target", {"source": "~nosuchuser/model"}),
            field="models.target.source",
        ),
        Case(
            "run: -o ''",
            argv=("run", str(ROOT / "recipes/quickstart-tiny.yaml"), "-o", ""),
            field="--output-dir",
        ),
        Case(
            "run: -o into a folder of the user's own files",
            argv=("run", str(ROOT / "recipes/quickstart-tiny.yaml"), "-o", str(_users_folder(tmp))),
            field="holds other files (notes.txt) and no run",
        ),
        Case(
            "bench: a statistical drafter",
            argv=("bench", "--target", "tiny-llama", "--drafter", "prompt-lookup"),
            field="--drafter",
        ),
        Case(
            "bigram build: a binary corpus",
            argv=_bigram_build(str(_data_path(tmp, "binary")), str(tmp / "t.json")),
            field="UTF-8",
        ),
        Case(
            "bigram build: an empty corpus",
            argv=_bigram_build(str(_data_path(tmp, "empty")), str(tmp / "t.json")),
            field="--corpus",
        ),
        Case(
            "distill: --extra-prompts of an unknown task",
            argv=_distill(tmp, "--extra-prompts", "nosuch:split", "--leave-out", "none"),
            field="--extra-prompts nosuch:split",
        ),
        Case(
            "distill: --extra-prompts of a split the data folder lacks",
            argv=_distill(tmp, "--extra-prompts", "gsm8k:nosplit", "--leave-out", "none"),
            field="--extra-prompts gsm8k:nosplit",
        ),
        Case(
            "distill: an exit past the target's layers",
            argv=_distill(tmp, "--size", "exit999"),
            field="exit999",
        ),
        Case(
            "bigram build: an unwritable table",
            argv=_bigram_build(str(tmp / "corpus.txt"), str(tmp / "a-file" / "t.json")),
            field="cannot write",
        ),
    ]


def all_cases(tmp: Path) -> list[Case]:
    return (
        schema_cases()
        + method_parameter_cases()
        + reference_cases()
        + file_cases()
        + data_file_cases(tmp)
        + command_cases(tmp)
        + hostile_cases(tmp)
        + tampered_cases(tmp)
    )


def outcome(case: Case, tmp: Path) -> tuple[int, str]:
    if case.argv is not None:
        argv = list(case.argv)
    else:
        recipe = tmp / "recipe.yaml"
        text = case.raw if case.raw is not None else yaml.safe_dump(case.recipe).encode()
        recipe.write_bytes(text.replace(b"{tmp}", str(tmp).encode()))
        argv = ["run", str(recipe), "--output-dir", str(tmp / "out")]
    result = runner.invoke(app, argv)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    return result.exit_code, result.output + (f"\nTraceback: {result.exception!r}" if crashed else "")


def problem(case: Case, code: int, output: str) -> str | None:
    """Why the outcome is not a clean user error, or None."""
    lines = [line for line in output.splitlines() if line.strip()]
    if code != 2:
        return f"exit {code}"
    if "Traceback" in output or len(lines) != 1:
        return f"{len(lines)} lines"
    if not lines[0].startswith("error:") or "fix:" not in lines[0] and case.argv is None:
        return "not an error with a fix"
    if case.argv is None and "recipe.yaml" not in lines[0]:
        return "does not name the file"
    if case.field and case.field not in lines[0]:
        return f"does not name {case.field!r}"
    return None


CASES = all_cases(Path("/nonexistent"))  # ids only; each test builds its files in its own folder


def test_enough_cases_are_generated():
    assert len(CASES) >= 60
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case.id for case in CASES])
def test_a_malformed_input_is_one_clean_line(index: int, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    write_files(tmp_path)
    case = all_cases(tmp_path)[index]
    code, output = outcome(case, tmp_path)
    assert problem(case, code, output) is None, output


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_is_valid(path: Path):
    from specbench.recipe import load_recipe
    from specbench.tasks import TASKS

    assert load_recipe(path, known_tasks=set(TASKS)).cells()


if __name__ == "__main__":  # the tally for docs/running.md
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        write_files(Path(folder))
        tally: dict[str, int] = {}
        for case in all_cases(Path(folder)):
            bad = problem(case, *outcome(case, Path(folder)))
            tally["clean" if bad is None else "not clean"] = (
                tally.get("clean" if bad is None else "not clean", 0) + 1
            )
            if bad:
                print(f"{case.id}: {bad}", file=sys.stderr)
    print(json.dumps(tally))
