"""Runs side by side (``specbench compare RUN_A RUN_B ...``): the same cells, matched on dataset and
cell id, with each run's tokens/s, speedup over its own AR cell, SWI MS, acceptance length, and its
tokens/s over the first run's.

Everything comes from the runs' cells.csv, read and formatted as ``specbench report`` does: a
speedup or SWI with its bootstrap interval where the file has one (``<column>_low`` / ``_high``,
written since the intervals exist), the value alone in older files. A cell that a run lacks, and a
value a run did not measure (a replayed cell's tokens/s), shows "—".

A matched cell is the same *experiment* in every run only where its method and parameters, its models'
sources, its generation settings (budget, temperature, top-k/p, seed) and its examples (ids and gold
answers) agree; the machine, dtype, engine and threads may differ, since comparing those is what
``compare`` is for. A cell matched by name across different experiments is refused, naming what
differs, unless ``--allow-incomparable`` shows it marked ``≠``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from rich.console import Console

from specbench.errors import SpecbenchError
from specbench.pipeline.records.results import (
    CELLS,
    RESOLVED_RECIPE,
    machines_of,
    measured_on,
    read_environment,
    read_examples,
)
from specbench.pipeline.views.notes import loaded_note
from specbench.pipeline.views.report import display_frame, emit, load_cells

MISSING = "—"
DIFFERENT = "≠"
# (column of the report's display frame, its name here)
SHOWN = (("tok/s", "tok/s"), ("speedup", "speedup"), ("SWI MS", "SWI MS"), ("acc. len", "acc. len"))


def load_run(path: Path) -> pd.DataFrame:
    """cells.csv of one run directory (not a folder of runs), or a one-line error."""
    path = Path(path)
    if not path.is_dir():
        raise SpecbenchError(
            str(path),
            "no such run directory",
            f"pass run directories written by `specbench run` (each holds {CELLS})",
        )
    cells = load_cells(path)
    runs = sorted(set(cells["run"]))
    if len(runs) > 1:
        raise SpecbenchError(
            str(path),
            f"holds {len(runs)} run directories ({', '.join(runs)}), not one run",
            f"name the run directories themselves, e.g. specbench compare {path / runs[0]} {path / runs[1]}",
        )
    return cells


def labels(paths: list[Path]) -> list[str]:
    """Each run's name in the table: its folder's name, or the path as given where names repeat."""
    names = [Path(p).name or str(p) for p in paths]
    return [name if names.count(name) == 1 else str(p) for name, p in zip(names, paths, strict=True)]


def compare_frame(
    runs: list[tuple[str, pd.DataFrame]], different: set | frozenset = frozenset()
) -> pd.DataFrame:
    """One row per (dataset, cell) of any run, in the first run's order then the others': dataset,
    cell id, method, k, then per run its tok/s, speedup, SWI MS and acc. len, and for every run after
    the first ``tok/s <run>/<first>``. ``runs``: (label, cells.csv frame as :func:`load_run` gives it);
    ``different``: the (run label, dataset, cell) that are not the first run's experiment, whose ratio
    is marked ``≠``."""
    _check_count(runs)
    shown, rates = [], []
    for _, cells in runs:
        frame = display_frame(cells).replace("", MISSING)
        keys = list(zip(cells["dataset"], cells["cell"], strict=True))
        shown.append(dict(zip(keys, frame.to_dict("records"), strict=True)))
        rates.append(dict(zip(keys, pd.to_numeric(cells["tokens_per_s"], errors="coerce"), strict=True)))
    first_label = runs[0][0]
    for (label, _), cells in zip(runs[1:], shown[1:], strict=True):
        if not set(cells) & set(shown[0]):
            raise SpecbenchError(
                label,
                f"has no cell in common with {first_label} (cells are matched on dataset and cell id)",
                "compare runs of the same recipe, or of recipes that share datasets and method entries",
            )
    keys = list(dict.fromkeys(key for cells in shown for key in cells))
    rows = []
    for key in keys:
        some = next(cells[key] for cells in shown if key in cells)
        row = {"dataset": key[0], "cell": key[1], "method": some["method"], "k": some["k"] or MISSING}
        for (label, _), cells in zip(runs, shown, strict=True):
            for column, name in SHOWN:
                row[f"{label} {name}"] = cells[key][column] if key in cells else MISSING
        for (label, _), rate in zip(runs[1:], rates[1:], strict=True):
            ratio = _ratio(rate.get(key), rates[0].get(key))
            row[f"tok/s {label}/{first_label}"] = (
                f"{ratio} {DIFFERENT}" if (label, *key) in different else ratio
            )
        rows.append(row)
    return pd.DataFrame(rows)


def experiments(path: Path, cells: pd.DataFrame) -> dict[tuple[str, str], dict]:
    """(dataset, cell) -> what makes the cell's numbers the experiment they are, as far as the run
    directory records it: method and parameters, the sources of its models, the generation settings
    with the dataset's own budget, and a digest of its examples' ids and gold answers. Unrecorded
    parts (a bare cells.csv) are None and agree with anything unrecorded."""
    recipe = _resolved_recipe(path)
    sources = _model_sources(recipe, read_environment(path))
    generation = _generation(recipe)
    budgets = _dataset_budgets(recipe)
    examples: dict[tuple[str, str], list] = {}
    prompts: dict[tuple[str, str], list] = {}
    for row in read_examples(path):
        key = (row.get("dataset"), row.get("cell"))
        examples.setdefault(key, []).append((str(row.get("example_id")), row.get("gold_sha")))
        prompts.setdefault(key, []).append(
            (str(row.get("example_id")), row.get("prompt_tokens"), row.get("prompt_sha"))
        )
    templates = _chat_templates(recipe)
    found = {}
    for record in cells.to_dict("records"):
        key = (record["dataset"], record["cell"])
        settings = None
        if generation is not None:
            settings = {**generation, "seed": recipe.get("seed")}
            if budgets.get(record["dataset"]) is not None:
                settings["max_new_tokens"] = budgets[record["dataset"]]
        names = [record.get("target"), *str(record.get("drafter") or "").split("+")]
        listed = sorted(set(examples.get(key, [])), key=str)
        found[key] = {
            "method and parameters": [record.get("method"), _parsed(record.get("params"))],
            "models": [sources.get(name) if sources else None for name in names if name and name == name],
            "generation settings": settings,
            "examples": _digest(listed),
            # the prompts as the target saw them: each example's length in tokens (a template or a chat
            # template changed moves it) and whether the dataset used the chat template
            "prompts": _prompts(prompts.get(key, []), templates.get(record["dataset"])),
            # their token ids (rows from before prompt_sha: unknown, agreeing with anything)
            "prompt texts": _prompt_texts(prompts.get(key, [])),
        }
    return found


def _digest(listed: list) -> str | None:
    return (
        hashlib.sha256(json.dumps(listed).encode()).hexdigest()[:12] + f" ({len(listed)})" if listed else None
    )


def _prompts(listed: list, chat_template: bool | None) -> str | None:
    """A digest of (example id, prompt tokens) and the chat template flag; None (agrees with anything)
    where rows from before ``prompt_tokens`` leave some length unknown."""
    if not listed or any(tokens is None for _, tokens, _ in listed):
        return None
    counts = sorted({(example, tokens) for example, tokens, _ in listed}, key=str)
    return _digest(counts + [["chat_template", chat_template]])


def _prompt_texts(listed: list) -> str | None:
    """A digest of (example id, prompt token ids' hash); None where a row predates the hash."""
    if not listed or any(sha is None for _, _, sha in listed):
        return None
    return _digest(sorted({(example, sha) for example, _, sha in listed}, key=str))


def _model_sources(recipe: dict, environment: dict) -> dict[str, object]:
    """model name -> where its weights come from: the recipe entry's source, revision and options
    (which build a tiny model or pick a checkpoint), else environment.json's source; the dtype,
    device and engine are left out (they change the timing, not the experiment)."""
    found = {
        name: model.get("source")
        for name, model in (environment.get("models") or {}).items()
        if isinstance(model, dict)
    }
    for name, model in (recipe.get("models") or {}).items():
        if isinstance(model, dict):
            found[name] = {key: model.get(key) for key in ("source", "revision", "options") if model.get(key)}
    return found


def _parsed(params):
    if isinstance(params, str):
        try:
            return json.loads(params)
        except ValueError:
            return params
    return params


def _resolved_recipe(path: Path) -> dict:
    try:
        recipe = yaml.safe_load((path / RESOLVED_RECIPE).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return recipe if isinstance(recipe, dict) else {}


def _dataset_budgets(recipe: dict) -> dict[str, int]:
    """dataset label (task/split) -> the dataset's own max_new_tokens, where it sets one."""
    return {
        label: spec["max_new_tokens"]
        for spec in recipe.get("datasets") or []
        if isinstance(spec, dict) and spec.get("max_new_tokens") is not None
        and (label := _dataset_label(spec)) is not None
    }  # fmt: skip


def _chat_templates(recipe: dict) -> dict[str, bool]:
    """dataset label (task/split) -> whether its prompts went through the chat template."""
    return {
        label: spec.get("chat_template", True)
        for spec in recipe.get("datasets") or []
        if isinstance(spec, dict) and (label := _dataset_label(spec)) is not None
    }


def _dataset_label(spec: dict) -> str | None:
    """A recipe dataset's label as rows name it (task/split, the task's default split when unset)."""
    split = spec.get("split")
    if split is None:
        try:
            from specbench.tasks import get_task

            split = get_task(spec.get("task")).default_split
        except Exception:  # an unknown task: its label cannot match a known one anyway
            return None
    return f"{spec.get('task')}/{split}"


def incomparable(runs: list[tuple[str, dict]]) -> list[tuple[str, str, str, str, str]]:
    """(run label, dataset, cell, aspect, "first's vs this run's") for every cell a later run shares
    with the first but whose experiment differs; ``runs``: (label, :func:`experiments`)."""
    first_label, first = runs[0]
    found = []
    for label, cells in runs[1:]:
        for key, identity in cells.items():
            if key not in first:
                continue
            for aspect, value in identity.items():
                theirs = first[key][aspect]
                if value is not None and theirs is not None and _canonical(value) != _canonical(theirs):
                    found.append(
                        (label, *key, aspect, f"{_shown(theirs)} in {first_label}, {_shown(value)} here")
                    )
                    break
    return found


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _shown(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "/".join(_shown(v) for v in value)
    return str(value)


def _generation(recipe: dict) -> dict | None:
    """A resolved recipe's generation settings without those left unset (None), so that a run
    written before a setting existed compares equal to one that leaves it unset."""
    generation = recipe.get("generation")
    if not isinstance(generation, dict):
        return None
    return {key: value for key, value in generation.items() if value is not None}


def _setup(path: Path) -> dict:
    """What a run's numbers depend on besides its cells: the machines that measured it, each model's
    source, dtype and engine, and the generation settings (budget, temperature), where recorded."""
    environment = read_environment(path)
    models = {n: m for n, m in (environment.get("models") or {}).items() if isinstance(m, dict)}
    generation = _generation(_resolved_recipe(path))
    return {
        "machine": sorted(machines_of(environment)),
        "models": sorted((n, str(m.get("source"))) for n, m in models.items()),
        "dtypes and engines": sorted(
            (n, str(m.get("dtype")), m.get("engine") or "eager") for n, m in models.items()
        ),
        "generation settings": generation,
    }


def _check_count(runs: list) -> None:
    if len(runs) < 2:
        raise SpecbenchError("specbench compare", "needs two runs or more", "pass RUN_A RUN_B [RUN_C ...]")


def _ratio(value: float | None, reference: float | None) -> str:
    if (
        value is None
        or reference is None
        or not value == value
        or not reference == reference
        or not reference
    ):
        return MISSING
    return f"{value / reference:.2f}x"


@dataclass
class Comparison:
    """What ``compare`` shows: the runs (label, path, cells), the side-by-side frame (with each row's
    cell id in ``cell``), one table per dataset, and the lines under them."""

    runs: list[tuple[str, Path, pd.DataFrame]]
    frame: pd.DataFrame
    lines: list[str]

    def tables(self) -> list[tuple[str, pd.DataFrame]]:
        shown = self.frame.drop(columns=["cell"])
        return [
            (dataset, group.drop(columns=["dataset"]))
            for dataset, group in shown.groupby("dataset", sort=False)
        ]


SHORT_LABEL = 10  # longer run names are lettered A, B, ... in a terminal table, with a legend


def short_labels(names: list[str]) -> list[str]:
    """Letters for runs whose names would make a terminal table too wide; the names where all are short."""
    if max(len(name) for name in names) <= SHORT_LABEL:
        return names
    return [chr(ord("A") + i) if i < 26 else f"R{i + 1}" for i in range(len(names))]


def prepare(paths: list[Path], allow_incomparable: bool = False, short: bool = False) -> Comparison:
    """The comparison of ``paths``: a cell that is another experiment in a later run than in the
    first is refused, or with ``allow_incomparable`` kept marked ``≠`` and named under the tables;
    ``short``: runs with long names are lettered (a legend line names them)."""
    _check_count(paths)  # before reading any of them
    names = labels(paths)
    runs = [(label, load_run(path)) for label, path in zip(names, paths, strict=True)]
    differences = incomparable(
        [(label, experiments(Path(path), cells)) for (label, cells), path in zip(runs, paths, strict=True)]
    )
    if differences and not allow_incomparable:
        label, dataset, cell, aspect, detail = differences[0]
        more = f" (and {len(differences) - 1} more cells)" if len(differences) > 1 else ""
        raise SpecbenchError(
            label,
            f"cell {cell} on {dataset} is another experiment than in {runs[0][0]}: its {aspect} differ "
            f"({detail}){more}",
            "compare runs of the same recipe and data, or pass --allow-incomparable to show such cells "
            f"marked {DIFFERENT}",
        )
    shown = short_labels(names) if short else names
    rename = dict(zip(names, shown, strict=True))
    runs = [(rename[label], cells) for label, cells in runs]
    marked = {(rename[label], dataset, cell) for label, dataset, cell, *_ in differences}
    frame = compare_frame(runs, marked)
    first = shown[0]
    lines = []
    if shown != names:
        lines.append(
            "runs: " + "; ".join(f"{s} = {n} ({p})" for s, n, p in zip(shown, names, paths, strict=True))
        )
    lines += [measured_on(Path(path), label) for label, path in zip(shown, paths, strict=True)]
    # a run measured beside other work says so here too, not only in its own report
    lines += [f"{label}: {note}" for label, cells in runs if (note := loaded_note(cells))]
    setups = [_setup(Path(path)) for path in paths]
    differ = [
        aspect for aspect in setups[0] if len({json.dumps(s[aspect], sort_keys=True) for s in setups}) > 1
    ]
    if differ:
        lines.append(
            f"The runs differ in {', '.join(differ)}: tok/s X/first compares those too, not only the "
            "methods; each speedup is over its own run's AR cell."
        )
    lines += [
        f"{DIFFERENT} {cell} on {dataset} in {rename[label]} is another experiment: its {aspect} differ "
        f"({detail})."
        for label, dataset, cell, aspect, detail in differences
    ]
    lines.append(
        f"Cells matched on dataset and cell id. speedup: tokens/s over the AR cell of the same run; "
        f"[low, high]: its 95% bootstrap interval where the run's {CELLS} has one. tok/s X/{first}: run "
        f"X's tokens/s over {first}'s on the same cell (> 1: X is faster). —: the run has no such cell, "
        "or did not measure the value (replayed cells have no time)."
    )
    return Comparison([(label, Path(p), c) for (label, c), p in zip(runs, paths, strict=True)], frame, lines)


def render_compare(
    paths: list[Path], fmt: str = "table", console: Console | None = None, allow_incomparable: bool = False
) -> str | None:
    """``specbench compare``: the side-by-side table of ``paths`` (one per dataset), in ``fmt``; in a
    terminal table, runs with long names are lettered and each table split to fit the terminal."""
    comparison = prepare(paths, allow_incomparable, short=fmt == "table")
    flat = comparison.frame.drop(columns=["cell"])
    return emit(flat, comparison.tables(), fmt, "\n".join(comparison.lines), console)
