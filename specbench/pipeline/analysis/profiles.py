"""Cost profiles as files: what ``specbench probe`` writes (format ``specbench-cost-profile/2``: per
model of the probed recipe, by its recipe name, the model's identity (source, revision, options), the
dtype and engine it was probed in, the probed points, the fitted
:class:`~specbench.pipeline.analysis.cost_model.SizeTable` and its fit quality; the machine and
versions), the devices with public figures (``specbench/data/devices.yaml``, a roofline each), and a
model's pass cost under either. Profiles of format ``specbench-cost-profile/1`` (keyed by model source)
still read: a source stands for one model only where the run or recipe names it in one configuration.
Reading a profile needs no torch; measuring one is :mod:`specbench.pipeline.experiments.probe`."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from specbench.errors import SpecbenchError
from specbench.pipeline.analysis import cost_model
from specbench.pipeline.records.results import write_atomic

FORMAT = "specbench-cost-profile/2"
FORMAT_BY_SOURCE = "specbench-cost-profile/1"  # keyed by model source: read, never written
FORMATS = (FORMAT, FORMAT_BY_SOURCE)
PROBE_AGAIN = "probe again with this specbench: specbench probe RECIPE --out FILE"


@functools.lru_cache(maxsize=1)
def device_figures() -> dict:
    return yaml.safe_load(resources.files("specbench.data").joinpath("devices.yaml").read_text())


def write_profile(profile: dict, path: Path) -> None:
    try:
        write_atomic(path, json.dumps(profile, indent=1) + "\n")
    except OSError as error:
        raise SpecbenchError(
            str(path), f"cannot write the profile ({error.strerror or error})", "name a writable file"
        ) from None


def read_profile(value: str) -> dict:
    """A profile file written by ``specbench probe``, or a device named in devices.yaml (a roofline);
    its costs checked (:func:`check_profile`). A file's profile names it under ``file``."""
    figures = device_figures()
    if value in figures:
        return {"format": FORMAT, "kind": "roofline", "device": value, **figures[value]}
    path = Path(value).expanduser()
    if not path.is_file():
        raise SpecbenchError(
            "--profile",
            f"{value!r} is neither a profile file nor a known device",
            f"write one with specbench probe RECIPE --out FILE, or name one of {', '.join(sorted(figures))}",
        )
    try:
        profile = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SpecbenchError(
            str(path), f"not a cost profile ({error})", "write it with specbench probe"
        ) from None
    if not isinstance(profile, dict) or profile.get("format") not in FORMATS:
        raise SpecbenchError(
            str(path), f"format is not {' or '.join(FORMATS)}", "write the profile again with specbench probe"
        )
    profile["file"] = str(path)
    check_profile(profile)
    return profile


def named(profile: dict) -> str:
    """Where a profile's errors point: its file, or the device it names."""
    return profile.get("file") or f"--profile {profile.get('device', '')}".strip()


def check_profile(profile: dict) -> None:
    """Every cost a profile holds is a number a pass can take: the probed tables (sizes ascending and
    positive, alpha and gamma finite and not negative) and the roofline's figures (bandwidth and peak
    FLOP/s finite and positive, the floor not negative); a one-line error naming the field otherwise."""
    where = named(profile)
    if profile.get("kind") not in ("probe", "roofline"):
        raise SpecbenchError(
            f"{where}: kind", f"{profile.get('kind')!r} is not probe or roofline", PROBE_AGAIN
        )
    if profile["kind"] == "roofline" or profile.get("roofline") is not None:
        _check_figures(profile if profile["kind"] == "roofline" else profile["roofline"], where)
    if profile["kind"] != "probe":
        return
    models = profile.get("models")
    if not isinstance(models, dict):
        raise SpecbenchError(f"{where}: models", "is not a mapping of probed models", PROBE_AGAIN)
    for key, entry in models.items():
        table = entry.get("table") if isinstance(entry, dict) else None
        columns = [table.get(c) if isinstance(table, dict) else None for c in ("sizes", "alpha", "gamma")]
        field = f"{where}: models.{key}.table"
        if not all(isinstance(c, list) and c for c in columns) or len({len(c) for c in columns}) != 1:
            raise SpecbenchError(field, "is not sizes, alpha and gamma of one length", PROBE_AGAIN)
        sizes, alpha, gamma = columns
        if (
            not all(_cost(n) and n > 0 for n in sizes)
            or sorted(sizes) != sizes
            or len(set(sizes)) < len(sizes)
        ):
            raise SpecbenchError(f"{field}.sizes", f"{sizes!r} are not ascending token counts", PROBE_AGAIN)
        for name, values in (("alpha", alpha), ("gamma", gamma)):
            for n, value in zip(sizes, values, strict=True):
                if not _cost(value):
                    raise SpecbenchError(
                        f"{field}.{name}",
                        f"holds {value!r} at size {n}: a negative, NaN or infinite cost, which no pass takes",
                        f"{PROBE_AGAIN} (a probe's fit is never negative)",
                    )


def _cost(value) -> bool:
    """A finite number >= 0."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _figure(value) -> float | None:
    """A roofline figure as a number (devices.yaml is YAML 1.1, where 3.35e12 reads as a string)."""
    try:
        number = (
            float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
        )
    except ValueError:
        return None
    return number if number is not None and _cost(number) else None


def _check_figures(figures: dict, where: str) -> None:
    peaks = figures.get("peak_flops")
    values = {"bandwidth": figures.get("bandwidth"), "floor_s": figures.get("floor_s", 0.0)}
    values |= {
        f"peak_flops.{dtype}": peak for dtype, peak in (peaks if isinstance(peaks, dict) else {}).items()
    }
    for key, value in values.items():
        if _figure(value) is None or (key != "floor_s" and _figure(value) == 0):
            raise SpecbenchError(
                f"{where}: roofline.{key}",
                f"{value!r} is not a positive number",
                "measure it again with specbench probe RECIPE --out FILE --roofline",
            )
    if not isinstance(peaks, dict) or not peaks:
        raise SpecbenchError(f"{where}: roofline.peak_flops", "names no dtype's peak", PROBE_AGAIN)


# -- which entry prices which model -----------------------------------------------------------------


def weights(spec: Mapping) -> dict:
    """What makes two recipe models the same weights to a pass's price: source, revision and options
    (a recipe's ModelSpec as data, or resolved_recipe.yaml's entry). The dtype and engine are not in it:
    they are the configuration a profile prices, recorded beside it, and carrying a run to another
    dtype or engine is what ``predict --profile`` is for."""
    return {
        "source": spec.get("source"),
        "revision": spec.get("revision"),
        "options": spec.get("options") or {},
    }


def weights_identity(spec: Mapping) -> str:
    """:func:`weights` as one comparable string."""
    return json.dumps(weights(spec), sort_keys=True, default=str)


@dataclass(frozen=True)
class ModelConfig:
    """A run's or a recipe's model as a profile entry must match it."""

    name: str
    source: str
    identity: str | None  # weights_identity; None: the run left no resolved recipe to tell
    dtype: str | None  # "bfloat16"; None: not known before loading (dtype: auto)
    engine: str

    def setup(self) -> str:
        return f"{self.dtype or 'auto'} {self.engine}"


def entries_for(profile: dict, models: Sequence[ModelConfig]) -> dict[str, dict]:
    """Each model's entry in a probe's ``profile`` (models it has none for are left out): by recipe
    name with the same weights (format 2), or by source where the models name that source in one
    configuration only (format 1, which kept one entry per source). A one-line error for an entry of
    other weights under the model's name, and for a source a format-1 profile cannot tell apart."""
    where, found = named(profile), {}
    entries = profile.get("models") or {}
    for model in models:
        if profile.get("format") == FORMAT_BY_SOURCE:
            entry = entries.get(model.source)
            twins = [m for m in models if m.source == model.source]
            configurations = {(m.identity, m.dtype, m.engine) for m in twins}
            if entry is not None and len(configurations) > 1:
                raise SpecbenchError(
                    f"{where}: models.{model.source}",
                    f"is keyed by source ({FORMAT_BY_SOURCE}), and {model.source!r} is loaded in "
                    f"{len(configurations)} configurations ({'; '.join(_config(m) for m in twins)}): it "
                    "cannot tell which one it priced",
                    f"{PROBE_AGAIN} (profiles now key each model by its recipe name)",
                )
        else:
            entry = entries.get(model.name)
            recorded = weights_identity(entry.get("identity") or {}) if entry is not None else None
            if entry is not None and model.identity is not None and recorded != model.identity:
                raise SpecbenchError(
                    f"{where}: models.{model.name}.identity",
                    f"the profile's {model.name!r} is other weights ({_weights(recorded)}) "
                    f"than this {model.name!r} ({_weights(model.identity)})",
                    "probe the recipe of these models: specbench probe RECIPE --out FILE",
                )
        if entry is not None:
            found[model.name] = entry
    return found


def _config(model: ModelConfig) -> str:
    return f"{model.name}: {model.setup()}, {_weights(model.identity)}"


def _weights(identity: str | None) -> str:
    if identity is None:
        return "unrecorded"
    data = json.loads(identity)
    extra = [f"revision {data['revision']}"] if data.get("revision") else []
    extra += [f"options {json.dumps(data['options'], sort_keys=True)}"] if data.get("options") else []
    return " ".join([str(data.get("source")), *extra])


def probed_cost(entry: dict) -> cost_model.SizeTable:
    table = entry["table"]
    return cost_model.SizeTable(tuple(table["sizes"]), tuple(table["alpha"]), tuple(table["gamma"]))


def roofline_cost(
    figures: dict, weight_bytes: float, parameters: float, kv_bytes_per_token: float, dtype: str
):
    peak = figures["peak_flops"].get(dtype)
    if peak is None:
        raise SpecbenchError(
            "--profile",
            f"no peak FLOP/s for {dtype} in the {figures.get('device', 'roofline')} figures",
            f"use a dtype it lists: {', '.join(sorted(figures['peak_flops']))}",
        )
    return cost_model.Roofline(
        weight_bytes=weight_bytes,
        flops_per_token=2.0 * parameters,
        kv_bytes_per_token=kv_bytes_per_token,
        bandwidth=float(figures["bandwidth"]),
        peak_flops=float(peak),
        floor=float(figures.get("floor_s", 0.0)),
    )
