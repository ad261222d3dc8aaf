"""What a sweep's load requests send, and the reference outputs their equivalence is checked against
(:mod:`specbench.pipeline.analysis.load_equivalence`).

The **engine's batch-1 AR** reference is measured, not assumed: before any level, each engine target's
plain server (speculation off; for ``engine: openai`` the server as it runs) gets every prompt alone,
one after another, with the load's own body and budget, and the outputs' token ids go to
``DIR/load_reference.jsonl`` keyed by target, prompt and a digest of what was sent, so a resume reuses
them and a changed prompt is measured again. A demanding user checks a speculative server against the
same engine without speculation first: that isolates what batching and speculation do under load from
what the engine's kernels do anyway (which the batch-1 lossless audit of ``specbench run`` covers).

**specbench's AR** reference is read, not recomputed: the rows of the recipe's AR cell on the same
weights (the target's reference model) in a ``specbench run`` directory of the recipe, matched by row
key (the same cell, generation settings, dataset and example): ``--reference RUN_DIR``, else the
sweep's own directory when a run shares it. Decoding every prompt in specbench's own loop again would
cost as much as that run; a sweep without one says so in a line and counts those outputs as not
checked.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from specbench.engines import audit_model
from specbench.engines.load import REFERENCE_FILE, read_references
from specbench.engines.load_client import Requests, closed_loop
from specbench.errors import SpecbenchError
from specbench.models.checksums import CHECKSUM, row_checksum
from specbench.pipeline.analysis.load_equivalence import Auditor, Reference
from specbench.pipeline.experiments.load_servers import serve
from specbench.pipeline.records.results import EXAMPLES, read_examples
from specbench.recipe import Recipe

NO_COPY = "specbench decodes no model of the engine's weights itself, so a divergence cannot be told a tie"


@dataclass(frozen=True)
class Prompts:
    """A target's load prompts (every dataset's, rendered as ``specbench run`` renders them): their
    token ids, the output budget (the largest), the stop ids, and the (dataset, example) of each."""

    ids: list[list[int]]
    budget: int
    stop: list[int]
    examples: list[tuple]

    def digest(self, index: int, body: dict) -> str:
        sent = [self.ids[index], self.budget, self.stop, sorted(body.items())]
        return hashlib.sha256(json.dumps(sent).encode()).hexdigest()[:16]


def prompts_of(measurer, recipe: Recipe, target) -> Prompts:
    from specbench.pipeline.run.datasets import load_datasets

    ids, budget, examples = [], 0, []
    for dataset in load_datasets(recipe, None, measurer._blame):
        for example in dataset.examples:
            request = measurer.request(target, dataset, example)
            ids.append(request.prompt_ids.tolist())
            budget = max(budget, request.max_new_tokens)
            examples.append((dataset, example))
    return Prompts(ids, budget, target.eos_token_ids(), examples)


def why_unchecked(recipe: Recipe) -> str | None:
    """Why no output of the sweep is checked (None: they are)."""
    if recipe.generation.temperature != 0:
        return "not checked: temperature > 0 (outputs are samples)"
    if not recipe.lossless_check:
        return "not checked: lossless_check is off"
    return None


def auditors(recipe, measurer, out: Path, cells, prompts: dict, run_dir: Path | None, console: Console):
    """target -> its :class:`Auditor` (both references where they can be had) for ``cells``' targets;
    {} where nothing is checked."""
    if why_unchecked(recipe):
        return {}
    found = {}
    for cell in cells:
        if cell.target in found:
            continue
        target = measurer.model(cell.target)
        engine = engine_reference(recipe, measurer, out, cell, target, prompts[cell.target], console)
        ours = ours_reference(recipe, measurer, cell, prompts[cell.target], run_dir, console)
        scorer = audit_model(measurer.model(recipe.reference_model(cell.target)))
        why = None if scorer is not None else getattr(target, "unclassified_why", None) or NO_COPY
        references = {"engine": engine} | ({"ours": ours} if ours else {})
        found[cell.target] = Auditor(prompts[cell.target].ids, references, scorer, why)
    return found


def engine_reference(recipe, measurer, out: Path, cell, target, prompts: Prompts, console: Console) -> dict:
    """prompt index -> the engine's batch-1 AR output (measured where load_reference.jsonl lacks it)."""
    from specbench.engines import BACKENDS

    body = dict(BACKENDS[target.engine].load_body)
    if hasattr(target, "body_fields"):
        body |= target.body_fields()
    digests = [prompts.digest(i, body) for i in range(len(prompts.ids))]
    held = read_references(out).get(cell.target, {})
    missing = [i for i, digest in enumerate(digests) if held.get(i, {}).get("digest") != digest]
    if missing:
        where = f"{recipe.path}: models.{cell.target}.engine"
        label = f"{cell.target}'s reference"
        with serve(where, label, target, None, None, console) as served:
            send = Requests(
                served.server.endpoint,
                target.directory,
                [prompts.ids[i] for i in missing],
                prompts.budget,
                prompts.stop,
                recipe.load.timeout_s,
                served.body,
            )
            with console.status(f"{label}: {len(missing)} prompt(s) alone (batch 1), speculation off"):
                run = asyncio.run(closed_loop(send, 1, len(missing), None))
        lines = []
        for i, record in zip(missing, run.records(), strict=True):
            line = {
                "target": cell.target,
                "prompt": i,
                "digest": digests[i],
                "output_ids": record["output_ids"],
            }
            held[i] = line | {"error": record["error"], "ids_sent": record["ids_sent"]}
            lines.append(json.dumps({**held[i], CHECKSUM: row_checksum(held[i])}) + "\n")
        _append(Path(out) / REFERENCE_FILE, lines)
    have = {
        i: Reference(list(r["output_ids"]), True) for i, r in held.items() if r.get("output_ids") is not None
    }
    if len(have) < len(prompts.ids):
        failed = sorted(set(range(len(prompts.ids))) - set(have))
        first = held.get(failed[0], {})
        why = first.get("error") or (
            "the server sent no token ids" if not first.get("ids_sent") else "ids cut short"
        )
        console.print(
            f"[yellow]warning: {escape(cell.target)}: no batch-1 reference for {len(failed)} of "
            f"{len(prompts.ids)} prompt(s) ({escape(str(why))}): their outputs under load are not checked "
            "against the engine[/yellow]"
        )
    return have


def ours_reference(recipe, measurer, cell, prompts: Prompts, run_dir: Path | None, console: Console) -> dict:
    """prompt index -> specbench's own AR output of the same weights, from ``run_dir``'s rows."""
    twin = recipe.reference_model(cell.target)
    if twin == cell.target:
        return {}  # no model of the same weights that specbench decodes itself (or the engine's own)
    if run_dir is None or not (Path(run_dir) / EXAMPLES).is_file():
        console.print(
            f"{cell.target}: outputs under load are not checked against specbench's AR ({twin}): give "
            "--reference RUN_DIR, a specbench run of this recipe"
        )
        return {}
    rows = {row["key"]: row for row in read_examples(Path(run_dir))}
    found = {}
    for i, (dataset, example) in enumerate(prompts.examples):
        row = rows.get(measurer.reference_key(dataset, cell, example) or "")
        if row is not None and row.get("output_ids") is not None:
            found[i] = Reference(list(row["output_ids"]), bool(row.get("stopped_by_eos")))
    if len(found) < len(prompts.ids):
        console.print(
            f"[yellow]warning: {escape(str(run_dir))} holds specbench's AR ({twin}) for {len(found)} of "
            f"{len(prompts.ids)} prompt(s) of {escape(cell.target)} (the same cell, generation and example): "
            "the others are not checked against it[/yellow]"
        )
    return found


def _append(path: Path, lines: list[str]) -> None:
    try:
        with path.open("a") as handle:
            handle.writelines(lines)
    except OSError as error:
        raise SpecbenchError(
            str(path), f"cannot be written ({error.strerror or error})", "free space or choose another -o"
        ) from None
