"""Recipes: expansion into cells, fingerprints, and every bad input as one line naming file, field and fix."""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

import pytest
import tiny_recipes
import yaml

from specbench.errors import SpecbenchError
from specbench.methods import METHODS, Method, ParamSpec
from specbench.recipe import load_recipe, parse_recipe

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"arithmetic", "gsm8k"}
BASE = tiny_recipes.recipe(
    "t",
    {
        "target": tiny_recipes.tiny(),
        "draft": tiny_recipes.tiny(dtype=None, layers=1) | {"cost": {"pw": 0.5}},
        "lookup": tiny_recipes.lookup(),
    },
    [
        tiny_recipes.ar(),
        tiny_recipes.speculative("lookup", [1, 4]),
        {
            "name": "sd-draft",
            "method": "speculative",
            "target": "target",
            "drafter": "draft",
            "params": {"lenience_convention": "leviathan"},
            "grid": {"lenience": [1, 0.5], "k": [2]},
        },
    ],
)


def write(tmp_path: Path, data: dict, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


DELETE = object()


def changed(**edits) -> dict:
    """A copy of BASE with edits at keys like ``methods__1__grid`` (``__`` separates levels)."""
    data = copy.deepcopy(BASE)
    for dotted, value in edits.items():
        *parents, last = [int(key) if key.isdigit() else key for key in dotted.split("__")]
        node = data
        for key in parents:
            node = node[key]
        if value is DELETE:
            del node[last]
        elif isinstance(node, list) and last == len(node):
            node.append(value)
        else:
            node[last] = value
    return data


def load(tmp_path: Path, data: dict, name: str = "recipe.yaml", **kwargs):
    return load_recipe(write(tmp_path, data, name), **kwargs)


# -- valid recipes -----------------------------------------------------------------------------


def test_valid_recipe_expands_to_cells_in_order(tmp_path):
    recipe = load(tmp_path, BASE, known_tasks=TASKS)
    cells = recipe.cells()
    assert [cell.id for cell in cells] == [
        "ar",
        "sd[k=1]",
        "sd[k=4]",
        "sd-draft[k=2,lenience=1.0]",  # grid keys sorted, float parameters normalized
        "sd-draft[k=2,lenience=0.5]",
    ]
    ar, sd1 = cells[0], cells[1]
    assert (ar.method, ar.target, ar.drafter, ar.params) == ("autoregressive", "target", None, {})
    assert (sd1.method_name, sd1.method, sd1.drafter) == ("sd", "speculative", "lookup")
    assert sd1.params == {"k": 1, "lenience": 1.0, "lenience_convention": "cs"}
    assert cells[4].params == {"k": 2, "lenience": 0.5, "lenience_convention": "leviathan"}
    assert len(set(cells)) == len(cells)  # hashable, and distinct


def test_defaults_are_filled_in(tmp_path):
    recipe = load(tmp_path, BASE)
    assert (recipe.seed, recipe.warmup, recipe.lossless_check, recipe.description) == (0, 1, True, "")
    generation = recipe.generation
    assert (generation.max_new_tokens, generation.temperature, generation.top_k, generation.top_p) == (
        16,
        0.0,
        0,
        1.0,
    )
    assert (recipe.models["draft"].dtype, recipe.models["draft"].device) == ("auto", "auto")
    assert recipe.models["draft"].cost.pw == 0.5 and recipe.models["target"].cost is None
    dataset = recipe.datasets[0]
    assert (dataset.split, dataset.data_files, dataset.chat_template) == (None, None, True)
    assert recipe.path == tmp_path / "recipe.yaml"


def test_resolved_recipe_reloads_to_the_same_cells(tmp_path):
    recipe = load(tmp_path, BASE)
    resolved = recipe.resolved()
    assert "path" not in resolved and resolved["warmup"] == 1
    assert resolved["methods"][0]["params"] == {}
    # grid parameters stay in the grid, so the resolved recipe is itself valid
    assert resolved["methods"][1]["params"] == {"lenience": 1.0, "lenience_convention": "cs"}
    again = load(tmp_path, resolved, "resolved.yaml")
    assert [c.id for c in again.cells()] == [c.id for c in recipe.cells()]
    assert [c.fingerprint(again) for c in again.cells()] == [c.fingerprint(recipe) for c in recipe.cells()]


def test_extends_lays_the_recipe_over_its_base(tmp_path):
    write(tmp_path, BASE, "base.yaml")
    over = {
        "extends": "base.yaml",
        "name": "t-bigger",
        "models": {"target": {"source": "tiny-llama-2"}},  # merges: dtype float64 stays
        "datasets": [{"task": "gsm8k", "limit": 1}],  # lists replace
    }
    recipe = load(tmp_path, over)
    assert recipe.name == "t-bigger" and recipe.generation.max_new_tokens == 16
    assert (recipe.models["target"].source, recipe.models["target"].dtype) == ("tiny-llama-2", "float64")
    assert recipe.models["draft"].options == {"layers": 1}
    assert [(d.task, d.limit) for d in recipe.datasets] == [("gsm8k", 1)]
    assert [m.name for m in recipe.methods] == ["ar", "sd", "sd-draft"]
    assert load(tmp_path, recipe.resolved(), "resolved.yaml").models == recipe.models  # stands alone


@pytest.mark.parametrize(
    "extends, message",
    [
        ("missing.yaml", "missing.yaml not found"),
        ("recipe.yaml", "leads back to this recipe"),
        ("loop.yaml", "leads back to this recipe"),
        (3, "must name one recipe file"),
    ],
)
def test_a_bad_extends_is_one_line_naming_the_field(tmp_path, extends, message):
    write(tmp_path, {"extends": "recipe.yaml"}, "loop.yaml")
    with pytest.raises(SpecbenchError) as error:
        load(tmp_path, {"extends": extends, "name": "t"})
    assert message in str(error.value) and ".yaml: extends: " in str(error.value)


def test_the_extending_shipped_recipes_change_only_the_large_model():
    from specbench.tasks import TASKS as KNOWN

    folder = ROOT / "recipes" / "spec_cascades"
    for child, base, large in [
        ("gemma_2b_9b.yaml", "gemma_2b_27b.yaml", "google/gemma-2-9b-it"),
        ("t5_small_xl.yaml", "t5_small_large.yaml", "google/t5-v1_1-xl"),
    ]:
        extended, original = (load_recipe(folder / f, known_tasks=set(KNOWN)) for f in (child, base))
        assert extended.models["large"].source == large
        assert extended.models["small"] == original.models["small"]
        assert extended.datasets == original.datasets and extended.methods == original.methods
        assert extended.generation == original.generation


def test_cost_from_a_published_table(tmp_path):
    data = changed(models__draft__cost={"pw": {"table": "leviathan2023-t5", "entry": "t5-small"}})
    assert load(tmp_path, data).models["draft"].cost.pw.entry == "t5-small"


def test_relative_data_files_resolve_against_the_recipe_folder(tmp_path, monkeypatch):
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    monkeypatch.chdir(ROOT)
    recipe = load(tmp_path, changed(datasets__0__data_files="rows.jsonl"))
    assert recipe.datasets[0].data_files == tmp_path / "rows.jsonl"


def test_tasks_are_checked_only_when_known_tasks_are_given(tmp_path):
    data = changed(datasets__0__task="squad")
    assert load(tmp_path, data).datasets[0].task == "squad"


def test_a_registered_method_is_accepted(tmp_path):
    params = {"depth": ParamSpec(int, 2, "levels", 1, 4)}
    method = {
        "name": "cs",
        "method": "cascade",
        "target": "target",
        "drafter": "draft",
        "grid": {"depth": [3]},
    }
    with METHODS.registered(Method("cascade", "", None, params, needs_drafter=True)):
        recipe = load(tmp_path, changed(methods__3=method))
        assert recipe.cells()[-1].id == "cs[depth=3]" and recipe.cells()[-1].params == {"depth": 3}


# -- fingerprints ------------------------------------------------------------------------------


def fingerprints(tmp_path: Path, data: dict) -> dict[str, str]:
    recipe = load(tmp_path, data, f"r{len(list(tmp_path.iterdir()))}.yaml")
    return {cell.id: cell.fingerprint(recipe) for cell in recipe.cells()}


def test_fingerprint_ignores_what_does_not_change_a_cells_outputs(tmp_path):
    base = fingerprints(tmp_path, BASE)
    assert len(set(base.values())) == len(base) and all(len(fp) == 16 for fp in base.values())
    unrelated = [
        changed(methods__3={"name": "ar-draft", "method": "autoregressive", "target": "draft"}),
        changed(
            models__other={"source": "tiny-t5"},
            methods__3={"name": "ar-other", "method": "autoregressive", "target": "other"},
        ),
        changed(warmup=3, lossless_check=False, description="renamed", name="other"),
        changed(datasets__1={"task": "gsm8k"}),
    ]
    for data in unrelated:
        after = fingerprints(tmp_path, data)
        assert {cell: after[cell] for cell in base} == base


def test_fingerprint_changes_with_what_changes_a_cells_outputs(tmp_path):
    base = fingerprints(tmp_path, BASE)
    assert fingerprints(tmp_path, changed(methods__1__grid={"k": [1, 3]}))["sd[k=1]"] == base["sd[k=1]"]
    relevant = [
        changed(generation__temperature=0.5),
        changed(generation__max_new_tokens=15),
        changed(seed=1),
        changed(models__target__dtype="float32"),
        changed(models__lookup__options={"max_ngram": 3}),
        changed(methods__1__params={"lenience": 2}),
    ]
    for data in relevant:
        assert fingerprints(tmp_path, data)["sd[k=1]"] != base["sd[k=1]"]
    assert base["sd[k=1]"] != base["sd[k=4]"]


def test_a_methods_revision_renews_only_its_own_cells_fingerprints(tmp_path):
    base = fingerprints(tmp_path, BASE)
    with METHODS.registered(dataclasses.replace(METHODS["speculative"], revision=2), replace=True):
        revised = fingerprints(tmp_path, BASE)
    assert revised["ar"] == base["ar"]
    assert all(revised[cell] != base[cell] for cell in base if cell != "ar")


# -- bad input ---------------------------------------------------------------------------------


def speculative(**fields) -> dict:
    return {"name": "sd", "method": "speculative", "target": "target", "drafter": "lookup", **fields}


BAD = {
    "unknown top-level key": (changed(beams=3), "beams", "unknown key 'beams'"),
    "unknown model key": (changed(models__target__quant="q4"), "models.target.quant", "unknown key"),
    "bad dtype": (changed(models__target__dtype="int8"), "models.target.dtype", '"int8" is not allowed'),
    "bad device": (changed(models__target__device="gpu"), "models.target.device", "not a device"),
    "bad cost table entry": (
        changed(models__draft__cost={"pw": {"table": "leviathan2023-t5", "entry": "t5-tiny"}}),
        "models.draft.cost.pw",
        "has no entry 't5-tiny'",
    ),
    "negative cost": (changed(models__draft__cost={"pw": -1}), "models.draft.cost.pw", "negative cost"),
    "no models": (changed(models={}), "models", "is empty"),
    "missing datasets": (changed(datasets=DELETE), "datasets", "required key is missing"),
    "seed is a bool": (changed(seed=True), "seed", "true is not an integer"),
    "seed is a string": (changed(seed="3"), "seed", '"3" is not an integer'),
    "negative warmup": (changed(warmup=-1), "warmup", "too small"),
    "top_p zero": (changed(generation__top_p=0), "generation.top_p", "too small"),
    "bad recipe name": (changed(name="my recipe"), "name", "not a valid name"),
    "zero limit": (changed(datasets__0__limit=0), "datasets[0].limit", "too small"),
    "k is a string": (changed(methods__1__grid={"k": ["four"]}), "methods[1].grid.k[0]", "not an integer"),
    "k is a bool": (
        changed(methods__1__grid={"k": [True]}),
        "methods[1].grid.k[0]",
        "true is not an integer",
    ),
    "k param is a bool": (
        changed(methods__1=speculative(params={"k": True})),
        "methods[1].params.k",
        "not an",
    ),
    "k is zero": (changed(methods__1__grid={"k": [0]}), "methods[1].grid.k[0]", "out of range"),
    "k above max_new_tokens": (
        changed(methods__1__grid={"k": [1, 17]}),
        "methods[1].grid.k[1]",
        "impossible",
    ),
    "grid is not a list": (changed(methods__1__grid={"k": 4}), "methods[1].grid.k", "not a list"),
    "empty grid": (changed(methods__1__grid={"k": []}), "methods[1].grid.k", "empty"),
    "repeated grid value": (changed(methods__1__grid={"k": [2, 2]}), "methods[1].grid.k", "appears twice"),
    "unknown parameter": (
        changed(methods__1__params={"gamma": 3}),
        "methods[1].params.gamma",
        "no parameter 'gamma'",
    ),
    "unknown parameter of a later method on an engine target": (
        changed(
            models__target__engine="vllm",
            models__lookup__options={"max_ngram": 3},
            methods__2__params={"lenience_convention": "leviathan", "gamma": 3},
        ),
        "methods[2].params.gamma",
        "no parameter 'gamma'",
    ),
    "parameter of a method without any": (
        changed(methods__0__grid={"k": [2]}),
        "methods[0].grid.k",
        "no parameter 'k'",
    ),
    "param in params and grid": (changed(methods__1__params={"k": 2}), "methods[1].grid.k", "both"),
    "cs lenience below 1": (
        changed(methods__1__params={"lenience": 0.5}),
        "methods[1].params.lenience",
        "cs convention",
    ),
    "leviathan lenience above 1": (
        changed(methods__2__grid={"lenience": [0.5, 2]}),
        "methods[2].grid.lenience",
        "leviathan convention",
    ),
    "lenience zero": (
        changed(methods__1__params={"lenience": 0}),
        "methods[1].params.lenience",
        "out of range",
    ),
    "unknown convention": (
        changed(methods__1__params={"lenience_convention": "paper"}),
        "methods[1].params.lenience_convention",
        "not allowed",
    ),
    "duplicate method names": (
        changed(methods__2__name="sd"),
        "methods[2].name",
        "duplicate method name 'sd'",
    ),
    "bad method name": (changed(methods__1__name="s d"), "methods[1].name", "not a valid name"),
    "unknown method": (changed(methods__1__method="hydra"), "methods[1].method", "unknown method 'hydra'"),
    "missing target model": (changed(methods__0__target="big"), "methods[0].target", "no model named 'big'"),
    "missing drafter model": (
        changed(methods__1__drafter="nope"),
        "methods[1].drafter",
        "no model named 'nope'",
    ),
    "speculative without drafter": (
        changed(methods__1__drafter=DELETE),
        "methods[1].drafter",
        "needs a drafter",
    ),
    "drafter on autoregressive": (
        changed(methods__0__drafter="lookup"),
        "methods[0].drafter",
        "takes no drafter",
    ),
    "statistical target": (changed(methods__0__target="lookup"), "methods[0].target", "statistical drafter"),
    "statistical drafter for hf_assisted": (
        changed(methods__3={"name": "hf", "method": "hf_assisted", "target": "target", "drafter": "lookup"}),
        "methods[3].drafter",
        "statistical drafter",
    ),
    "unreadable data file": (
        changed(datasets__0__data_files="missing.jsonl"),
        "datasets[0].data_files",
        "cannot read",
    ),
    "unknown task": (changed(datasets__0__task="squad"), "datasets[0].task", "unknown task 'squad'"),
    "path is not a recipe key": (changed(path="elsewhere.yaml"), "path", "unknown key 'path'"),
    "option a hub model's loader does not take": (
        changed(models__big={"source": "org/model", "options": {"torch_dtype": "bfloat16"}}),
        "models.big.options.torch_dtype",
        "takes no option 'torch_dtype'",
    ),
    "option on a local directory": (
        changed(models__local={"source": "./weights", "options": {"revison": "main"}}),
        "models.local.options.revison",
        "takes no option 'revison'",
    ),
    "bad device_map on a gguf file": (
        changed(models__q={"source": "m.gguf", "options": {"device_map": "everywhere"}}),
        "models.q.options.device_map",
        "'everywhere' is not a device map",
    ),
    "misspelt tiny-model option": (
        changed(models__draft__options={"layer": 1}),
        "models.draft.options.layer",
        "takes no option 'layer'",
    ),
    "unknown smollm2 origin": (
        changed(models__s={"source": "smollm2-135m-instruct", "options": {"prefer": "cloud"}}),
        "models.s.options.prefer",
        "not a SmolLM2 origin",
    ),
    "statistical drafter option": (
        changed(models__lookup__options={"max_gram": 3}),
        "models.lookup.options.max_gram",
        "takes no option 'max_gram'",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_naming_file_field_and_fix(tmp_path, case):
    data, field, problem = BAD[case]
    path = write(tmp_path, data, "bad.yaml")
    with pytest.raises(SpecbenchError) as caught:
        load_recipe(path, known_tasks=TASKS)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {field}: "), message
    assert problem in message and " — fix: " in message, message


def test_several_problems_are_counted(tmp_path):
    with pytest.raises(SpecbenchError, match=r"\(\+2 more\) — fix:"):
        load(tmp_path, changed(beams=3, seed="x", warmup=-1))


def test_unknown_key_suggests_the_close_one(tmp_path):
    with pytest.raises(SpecbenchError, match="did you mean 'max_new_tokens'"):
        load(tmp_path, changed(generation={"max_new_token": 8}))


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: t\nseed: 0\nmodels:\n  target: {source: tiny-llama\ndatasets: []\n")
    with pytest.raises(SpecbenchError, match=r"broken\.yaml: line 5, column \d+: .* — fix: "):
        load_recipe(path)


def test_yaml_duplicate_key_is_an_error(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False) + "seed: 1\nseed: 2\n")
    with pytest.raises(
        SpecbenchError, match=r"twice\.yaml: line \d+, column 1: duplicate key 'seed' — fix: "
    ):
        load_recipe(path)


@pytest.mark.parametrize("text", ["", "- just\n- a list\n", "just a string\n"])
def test_recipe_that_is_not_a_mapping(tmp_path, text):
    path = tmp_path / "flat.yaml"
    path.write_text(text)
    with pytest.raises(SpecbenchError, match=r"flat\.yaml: a recipe must be a YAML mapping — fix: "):
        load_recipe(path)


def test_missing_file(tmp_path):
    with pytest.raises(SpecbenchError, match=r"nope\.yaml: recipe file not found — fix: "):
        load_recipe(tmp_path / "nope.yaml")


def test_directory_instead_of_file(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(SpecbenchError, match=r"dir\.yaml: cannot read the recipe .* — fix: "):
        load_recipe(tmp_path / "dir.yaml")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_unreadable_data_file(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    rows.chmod(0)
    with pytest.raises(SpecbenchError, match=r"datasets\[0\]\.data_files: cannot read"):
        load(tmp_path, changed(datasets__0__data_files=str(rows)))


def test_parse_recipe_names_the_given_path():
    with pytest.raises(SpecbenchError, match=r"^recipes/x\.yaml: methods\[1\]\.grid\.k\[0\]: "):
        parse_recipe(changed(methods__1__grid={"k": [-1]}), "recipes/x.yaml")


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("**/*.yaml")), ids=lambda p: p.name)
def test_shipped_recipes_are_valid_and_their_resolved_form_loads_to_the_same_cells(path):
    from specbench.tasks import TASKS as KNOWN

    recipe = load_recipe(path, known_tasks=set(KNOWN))
    assert recipe.cells()
    # a run writes resolved_recipe.yaml (every default filled in): it must load again, to the same
    # cells and fingerprints, or the run cannot be resumed or checked (specbench check)
    again = parse_recipe(recipe.resolved(), path, known_tasks=set(KNOWN))
    assert [c.fingerprint(again) for c in again.cells()] == [c.fingerprint(recipe) for c in recipe.cells()]


def test_every_samples_across_a_sorted_set_before_the_limit(tmp_path):
    from specbench.pipeline.run.runner import Runner

    data = copy.deepcopy(BASE)
    data["datasets"] = [{"task": "arithmetic", "every": 5, "limit": 3}]
    (strided,) = Runner(parse_recipe(data, tmp_path / "r.yaml"), tmp_path / "out").datasets()
    data["datasets"] = [{"task": "arithmetic"}]
    (everything,) = Runner(parse_recipe(data, tmp_path / "r.yaml"), tmp_path / "out").datasets()
    assert [e.id for e in strided.examples] == [everything.examples[i].id for i in (0, 5, 10)]
    data["datasets"] = [{"task": "arithmetic", "every": 0}]
    with pytest.raises(SpecbenchError, match="every"):
        parse_recipe(data, tmp_path / "r.yaml")
