"""Run a recipe's rows on a Ray cluster: ``specbench run RECIPE --executor ray``.

The driver (the ``specbench run`` process) keeps everything a local run does: the directory's lock,
examples.jsonl (it alone appends, through the runner's ExampleLog, so ``--resume``, content keys and
atomic appends are unchanged), cells.csv and environment.json. Workers are Ray actors
(``--gpus-per-worker`` GPUs and one CPU each): each holds a :class:`~specbench.pipeline.run.measure.Measurer`
over the recipe, keeps every model it loads (as a local run does), starts a cell (its models, their
tokenizer check, the warm-up) the first time it gets one of the cell's examples, and sends rows back,
never writing a file.

Work goes out in two waves: the autoregressive cells, then the rest, each example of a replayed cell,
an oracle or a lossless-checked cell carrying the AR row it reads (an example whose AR row is missing,
its AR cell having failed, is skipped and its cell reported). A wave is cut into units, a cell's pending
examples on one dataset, split into chunks when there are fewer units than workers; an idle worker gets
the unit whose models it already holds, else the next one. Within a unit a worker measures by cell, so
the ``schedule:`` interleaving is a local run's.

Faults: a worker process that dies is restarted by Ray and its unfinished calls are retried on it
(``RETRIES`` times each), wherever Ray places it (another node when its node died). The driver appends
a row only when its key is new, so nothing is written twice. A cell that raises (a SpecbenchError or
any exception) stops on that worker and is reported at once, the other cells go on, and the run ends
with an error naming the failed cells.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from specbench.errors import SpecbenchError
from specbench.methods import BASELINE
from specbench.pipeline.records.results import ENVIRONMENT, write_atomic
from specbench.pipeline.run.datasets import DatasetRun
from specbench.pipeline.run.environment import now, write_environment
from specbench.pipeline.run.measure import Measurer
from specbench.pipeline.run.ray_watchdog import guard
from specbench.recipe import Cell
from specbench.tasks import Example

RETRIES = 2  # a call whose worker died is retried this often, on the restarted worker
INSTALL = "pip install 'specbench-llm[ray]'"
# what workers need to see as the driver does: data and model caches, offline switches
FORWARDED_ENV = ("SPECBENCH_", "HF_", "TRANSFORMERS_")


def _check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """A HOST:PORT that does not answer fails in seconds (Ray itself retries for minutes)."""
    if not address or address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as error:
        raise SpecbenchError(
            "--address",
            f"no Ray cluster answers at {address} ({_one_line(error)})",
            "start one with `ray start --head` and pass --address auto (or the head's HOST:PORT)",
        ) from None


def require_ray():
    """The ``ray`` module, imported only here (never when specbench is imported)."""
    try:
        import ray
    except ImportError:
        raise SpecbenchError("--executor ray", "Ray is not installed", INSTALL) from None
    return ray


class Worker:
    """A Ray actor's state: the recipe, the run's datasets, a Measurer and the cells it started."""

    def __init__(self, recipe, datasets: list[DatasetRun], threads: int):
        import torch

        torch.set_num_threads(threads)
        self.measurer = Measurer(recipe, Console(stderr=True, quiet=True))
        self.datasets = datasets
        self.cells = {cell.id: cell for cell in recipe.cells()}
        self.started = {}
        self.failed: dict[tuple[int, str], str] = {}
        self.described: set[str] = set()

    def measure(self, dataset: int, cell_id: str, example: int, references: dict, last: bool) -> dict:
        """One example's reply: ``row``, or ``error`` (one line; the cell stops here) or ``skipped``
        (the cell failed before), with this worker's ``gpu`` samples and, when it loaded models,
        its ``environment``."""
        where = (dataset, cell_id)
        if where in self.failed:
            return {"skipped": self.failed[where]}
        data, cell = self.datasets[dataset], self.cells[cell_id]
        self.measurer.references = references
        try:
            models = self.started.get(where)
            if models is None:
                self.measurer.check_cell(cell)
                models = self.started[where] = self.measurer.start_cell(data, cell)
            reply = {"row": self.measurer.measure(data, cell, data.examples[example], models)}
            if last:
                self.measurer.sample_gpu(data, cell, "end")
        except Exception as error:
            if not isinstance(error, SpecbenchError):  # the traceback reaches the driver's console
                traceback.print_exc(file=sys.stderr)
            reply = {"error": self.failed.setdefault(where, _one_line(error))}
        reply["gpu"], self.measurer.gpu_samples = self.measurer.gpu_samples, []
        if set(self.measurer.models) != self.described:
            reply["environment"] = self._environment()
        return reply

    def _environment(self) -> dict:
        """This worker's models and machine, in environment.json's own words."""
        self.described = set(self.measurer.models)
        with tempfile.TemporaryDirectory() as folder:
            write_environment(Path(folder), self.measurer.recipe, self.measurer.models, now(), 0, True)
            env = json.loads((Path(folder) / ENVIRONMENT).read_text())
        machine = {key: env.get(key) for key in ("specbench", "git", "platform", "torch", "cuda", "threads")}
        where = {"host": socket.gethostname(), "pid": os.getpid()}
        return {"models": env["models"], "worker": {**where, **machine}}


@dataclass
class _Unit:
    """A cell's pending examples on one dataset (or a chunk of them), sent to one worker."""

    dataset: DatasetRun
    cell: Cell
    examples: list[Example]

    @property
    def models(self) -> set[str]:
        return {self.cell.target, *self.cell.drafter_names}


class RayExecutor:
    """Measures a runner's pending rows on Ray workers; the runner appends them (module docstring)."""

    def __init__(self, address: str | None = None, gpus_per_worker: float | None = None):
        require_ray()
        self.address = address
        self.gpus_per_worker = gpus_per_worker
        self.models: dict[str, dict] = {}  # environment.json's entries, as the workers reported them
        self.workers: dict[tuple[str, int], dict] = {}

    def run(self, runner, order: list[tuple[DatasetRun, Cell, Example]]) -> list[str]:
        """Measure ``order`` (the runner's pending rows) and hand each row to ``runner.record``;
        the failed cells, one line each."""
        ray = require_ray()
        ours = not ray.is_initialized()
        if ours:
            self._connect(ray)
            if not self.address:  # a cluster of our own: it must not outlive a killed driver
                guard()
        try:
            return self._sweep(ray, runner, order)
        finally:
            if ours:
                ray.shutdown()

    def amend_environment(self, directory: Path, started: str) -> None:
        """Add what the workers loaded to environment.json's models, and the workers to this session."""
        path = Path(directory) / ENVIRONMENT
        env = json.loads(path.read_text())
        env["models"].update(self.models)
        for session in env["sessions"]:
            if session.get("started") == started:
                session["executor"] = {"name": "ray", "workers": list(self.workers.values())}
        write_atomic(path, json.dumps(env, indent=2) + "\n")

    # -- the driver's loop ---------------------------------------------------------------------

    def _connect(self, ray) -> None:
        options = {} if self.address else {"include_dashboard": False}  # a new local cluster
        _check_reachable(self.address)
        try:
            ray.init(address=self.address, logging_level=logging.WARNING, **options)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise SpecbenchError(
                "--address",
                f"cannot connect to a Ray cluster at {self.address!r} ({_one_line(error)})",
                "start one with `ray start --head` and pass --address auto (or the head's HOST:PORT)",
            ) from None

    def _sweep(self, ray, runner, order) -> list[str]:
        units: dict[tuple[str, str], _Unit] = {}
        for dataset, cell, example in order:
            units.setdefault((dataset.label, cell.id), _Unit(dataset, cell, [])).examples.append(example)
        waves = [
            [u for u in units.values() if u.cell.method == BASELINE],
            [u for u in units.values() if u.cell.method != BASELINE],
        ]
        datasets = list({unit.dataset.label: unit.dataset for unit in units.values()}.values())
        if not datasets:
            return []
        gpus, slots = self._slots(ray)
        most = max(sum(len(unit.examples) for unit in wave) for wave in waves)
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
        actor = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=-1, max_task_retries=RETRIES)(Worker)
        pool = [  # the datasets travel inside each actor's spec, so a restarted actor finds them
            actor.options(runtime_env={"env_vars": env}).remote(runner.recipe, datasets, 1)
            for _ in range(min(slots, most))
        ]
        sweep = _Sweep(ray, runner, pool, [d.label for d in datasets], self)
        try:
            for wave in waves:
                sweep.wave(_chunks(wave, len(pool)))
        finally:
            for worker in pool:
                ray.kill(worker)
        return [f"{cell} on {label}: {why}" for (label, cell), why in sweep.failed.items()]

    def _slots(self, ray) -> tuple[float, int]:
        """(GPUs per worker, how many workers the cluster holds at once)."""
        resources = ray.cluster_resources()
        have = resources.get("GPU", 0)
        gpus = self.gpus_per_worker if self.gpus_per_worker is not None else (1 if have >= 1 else 0)
        slots = int(have // gpus) if gpus else int(resources.get("CPU", 1))
        if slots < 1:
            raise SpecbenchError(
                "--gpus-per-worker",
                f"the Ray cluster has {have:g} GPUs, fewer than the {gpus:g} each worker needs",
                "lower --gpus-per-worker (0 runs on CPUs), or add GPU nodes to the cluster",
            )
        return gpus, slots


class _Sweep:
    """One run's dispatch: which worker holds which models, what is in flight, which cells failed."""

    def __init__(self, ray, runner, pool: list, labels: list[str], executor: RayExecutor):
        self.ray, self.runner, self.pool, self.executor = ray, runner, pool, executor
        self.index = {label: i for i, label in enumerate(labels)}
        self.holds: list[set[str]] = [set() for _ in pool]
        self.busy = [0] * len(pool)
        self.inflight: dict = {}  # call -> (worker, unit, example)
        self.failed: dict[tuple[str, str], str] = {}

    def wave(self, queue: list[_Unit]) -> None:
        """Every unit of ``queue`` measured and recorded; idle workers take the next unit."""
        while queue or self.inflight:
            for worker in range(len(self.pool)):
                if not self.busy[worker] and queue:
                    self._submit(worker, _pick(queue, self.holds[worker]))
            if self.inflight:
                [call], _ = self.ray.wait(list(self.inflight), num_returns=1)
                self._receive(call)

    def _submit(self, worker: int, unit: _Unit) -> None:
        dataset, cell, runner = unit.dataset, unit.cell, self.runner
        if (dataset.label, cell.id) in self.failed:
            return
        position = {example.id: i for i, example in enumerate(dataset.examples)}
        orphans = []
        for n, example in enumerate(unit.examples):
            references = {}
            key = runner.reference_key(dataset, cell, example) if runner.needs_reference(cell) else None
            if key is not None:
                if runner.recorded(key) is None:  # its AR cell failed on this example
                    orphans.append(example.id)
                    continue
                references[key] = runner.recorded(key)
            last = n == len(unit.examples) - 1
            call = self.pool[worker].measure.remote(
                self.index[dataset.label], cell.id, position[example.id], references, last
            )
            self.inflight[call] = (worker, unit, example)
            self.busy[worker] += 1
        self.holds[worker] |= unit.models
        if orphans:
            self._fail(
                unit, f"no autoregressive row of {cell.target!r} to read for examples {', '.join(orphans)}"
            )

    def _receive(self, call) -> None:
        ray, runner = self.ray, self.runner
        worker, unit, example = self.inflight.pop(call)
        self.busy[worker] -= 1
        try:
            reply = ray.get(call)
        except ray.exceptions.RayActorError as error:
            died = f"its worker died {RETRIES + 1} times on example {example.id}"
            reply = {"error": f"{died} ({_one_line(error)})"}
        except ray.exceptions.RayError as error:
            reply = {"error": _one_line(error)}
        if "environment" in reply:
            models, machine = reply["environment"]["models"], reply["environment"]["worker"]
            self.executor.models.update(models)
            self.executor.workers[machine["host"], machine["pid"]] = machine
        runner.gpu_samples += reply.get("gpu", [])
        if "row" in reply:
            row, key = reply["row"], runner.row_key(unit.cell, unit.dataset, example)
            if row["key"] != key:
                reply["error"] = (
                    f"a worker keyed example {example.id} {row['key']}, the driver {key}: "
                    "install the same specbench on every node"
                )
            elif runner.recorded(key) is None:  # a retried call may bring a row twice
                runner.record(unit.dataset, unit.cell, row)
        if "error" in reply:
            self._fail(unit, reply["error"])

    def _fail(self, unit: _Unit, why: str) -> None:
        where = (unit.dataset.label, unit.cell.id)
        if where not in self.failed:
            self.failed[where] = why
            self.runner.console.print(
                f"[red]cell {escape(unit.cell.id)} on {escape(unit.dataset.label)} failed:[/red] "
                f"{escape(why)} (the other cells go on)"
            )


def _chunks(units: list[_Unit], workers: int) -> list[_Unit]:
    """``units``, each cut into equal chunks when there are fewer units than workers, so none idles."""
    if not units or len(units) >= workers:
        return list(units)
    parts = -(-workers // len(units))
    chunks = []
    for unit in units:
        size = -(-len(unit.examples) // parts)
        chunks += [
            _Unit(unit.dataset, unit.cell, unit.examples[i : i + size])
            for i in range(0, len(unit.examples), size)
        ]
    return chunks


def _pick(queue: list[_Unit], holds: set[str]) -> _Unit:
    """The first unit whose models the worker already holds, else the first unit."""
    for i, unit in enumerate(queue):
        if unit.models <= holds:
            return queue.pop(i)
    return queue.pop(0)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return line if isinstance(error, SpecbenchError) else f"{type(error).__name__}: {line}"
