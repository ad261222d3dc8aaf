"""Recipe validation: every bad input is one line naming the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specbench.errors import SpecbenchError
from specbench.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
BASE = {
    "name": "t",
    "generation": {"max_new_tokens": 16},
    "models": {
        "target": {"source": "tiny-llama"},
        "draft": {"source": "tiny-llama"},
        "lookup": {"source": "prompt-lookup"},
    },
    "datasets": [{"task": "arithmetic", "limit": 2}],
    "methods": [
        {"name": "ar", "method": "autoregressive", "target": "target"},
        {
            "name": "sd",
            "method": "speculative",
            "target": "target",
            "drafter": "lookup",
            "grid": {"k": [1, 4]},
        },
    ],
}


def write(tmp_path: Path, data: dict, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def mutate(**changes) -> dict:
    data = yaml.safe_load(yaml.safe_dump(BASE))
    for dotted, value in changes.items():
        node, keys = data, dotted.split("__")
        for key in keys[:-1]:
            node = node[int(key)] if key.isdigit() else node[key]
        last = keys[-1]
        if value is DELETE:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value
    return data


DELETE = object()


def test_valid_recipe_expands_to_cells(tmp_path):
    recipe = load_recipe(write(tmp_path, BASE), known_tasks={"arithmetic"})
    cells = recipe.cells()
    assert [c.id for c in cells] == ["ar", "sd[k=1]", "sd[k=4]"]
    assert cells[1].params == {"k": 1, "lenience": 1.0, "lenience_convention": "cs"}
    resolved = recipe.resolved()
    assert resolved["methods"][0]["params"] == {} and resolved["warmup"] == 1
    assert resolved["generation"]["temperature"] == 0.0


def test_fingerprint_depends_on_what_determines_outputs(tmp_path):
    base = load_recipe(write(tmp_path, BASE)).cells()[1]
    more = mutate()
    more["methods"].append({"name": "ar2", "method": "autoregressive", "target": "draft"})
    same = load_recipe(write(tmp_path, more, "more.yaml"))
    assert same.cells()[1].fingerprint(same) == base.fingerprint(load_recipe(write(tmp_path, BASE)))
    hotter = load_recipe(write(tmp_path, mutate(generation__temperature=0.5), "hot.yaml"))
    assert hotter.cells()[1].fingerprint(hotter) != base.fingerprint(load_recipe(write(tmp_path, BASE)))
    reseeded = load_recipe(write(tmp_path, mutate(seed=3), "seed.yaml"))
    assert reseeded.cells()[1].fingerprint(reseeded) != base.fingerprint(load_recipe(write(tmp_path, BASE)))
    fp = {c.id: c.fingerprint(same) for c in same.cells()}
    assert fp["sd[k=1]"] != fp["sd[k=4]"]


BAD = {
    "unknown top-level key": (mutate(beams=3), "beams", "unknown key"),
    "unknown model key": (mutate(models__target__quant="q4"), "models.target.quant", "unknown key"),
    "k is a string": (mutate(methods__1__grid={"k": ["four"]}), "methods[1].grid.k[0]", "not an int"),
    "k is a bool": (mutate(methods__1__grid={"k": [True]}), "methods[1].grid.k[0]", "not an int"),
    "k is zero": (mutate(methods__1__grid={"k": [0]}), "methods[1].grid.k[0]", "out of range"),
    "k above max_new_tokens": (mutate(methods__1__grid={"k": [17]}), "methods[1].grid.k[0]", "impossible"),
    "missing model": (mutate(methods__1__drafter="nope"), "methods[1].drafter", "no model named 'nope'"),
    "speculative without drafter": (
        mutate(methods__1__drafter=DELETE),
        "methods[1].drafter",
        "needs a drafter",
    ),
    "drafter on autoregressive": (
        mutate(methods__0__drafter="lookup"),
        "methods[0].drafter",
        "takes no drafter",
    ),
    "cs lenience below 1": (mutate(methods__1__params={"lenience": 0.5}), "methods[1]", "cs convention"),
    "empty grid": (mutate(methods__1__grid={"k": []}), "methods[1].grid.k", "empty list"),
    "unknown parameter": (
        mutate(methods__1__params={"gamma": 3}),
        "methods[1].params.gamma",
        "unknown parameter",
    ),
    "param in params and grid": (mutate(methods__1__params={"k": 2}), "methods[1].grid.k", "both"),
    "duplicate method names": (mutate(methods__1__name="ar"), "methods[1].name", "duplicate"),
    "unknown method": (mutate(methods__1__method="medusa"), "methods[1].method", "unknown method"),
    "statistical target": (mutate(methods__0__target="lookup"), "methods[0].target", "statistical"),
    "unreadable data file": (
        mutate(datasets__0__data_files="missing.jsonl"),
        "datasets[0].data_files",
        "cannot read",
    ),
    "unknown task": (mutate(datasets__0__task="squad"), "datasets[0].task", "unknown task"),
    "bad dtype": (mutate(models__target__dtype="int8"), "models.target.dtype", "invalid"),
    "missing models": (mutate(models=DELETE), "models", "missing"),
    "negative limit": (mutate(datasets__0__limit=-1), "datasets[0].limit", "invalid"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_clear_line(tmp_path, case):
    data, field, problem = BAD[case]
    path = write(tmp_path, data, "bad.yaml")
    with pytest.raises(SpecbenchError) as caught:
        load_recipe(path, known_tasks={"arithmetic"})
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message and f"{field}" in message and problem in message and "fix:" in message


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: t\nmodels:\n  target: {source: tiny-llama\n")
    with pytest.raises(SpecbenchError, match=r"broken.yaml: line \d+"):
        load_recipe(path)


def test_missing_file(tmp_path):
    with pytest.raises(SpecbenchError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.yaml")


def test_relative_data_files_resolve_against_the_recipe(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    recipe = load_recipe(write(tmp_path, mutate(datasets__0__data_files="rows.jsonl")))
    assert recipe.datasets[0].data_files == tmp_path / "rows.jsonl"


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("**/*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_are_valid(path):
    from specbench.tasks import TASKS

    recipe = load_recipe(path, known_tasks=set(TASKS))
    assert recipe.cells()
