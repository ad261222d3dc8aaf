"""The server a load level is sent to: one specbench starts on a free port of 127.0.0.1 with a cell's
speculative settings (``vllm serve``, ``llama-server``; waited for and always stopped), or one it did not
start (``engine: openai``), attached to at the recipe's ``base_url`` and never stopped; and the
spec-decode counters read from its ``/metrics`` around a level."""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass

from rich.console import Console

from specbench.engines import BACKENDS
from specbench.engines.load import SPEC_COUNTERS, Server, free_port
from specbench.errors import SpecbenchError

EXIT_GRACE_S = 10.0
STARTED_FIGURES = "the engine's /metrics counters (drafts, draft tokens, accepted tokens)"


@dataclass(frozen=True)
class Served:
    server: object  # a Server specbench started, or an engine's Attached one
    started: float  # seconds until it answered (0 for one specbench did not start)
    speculative_config: str  # the cell's settings as the engine took them (JSON)
    counters: dict  # spec-decode counter -> the server's metric name
    figures: str  # which figures come from the server's counters, and which could not be had
    body: dict  # the fields each request adds to the OpenAI body (the token ids asked for)


@contextlib.contextmanager
def serve(where: str, label: str, target, spec: dict | None, drafter, console: Console):
    """The server of ``target`` with speculative settings ``spec``: started, waited for, and always
    stopped; or, for an engine specbench does not start, attached to (its counters found)."""
    backend = BACKENDS[target.engine]
    body = dict(backend.load_body)
    if backend.attach is not None:
        from specbench.engines.openai_compat import counter_names

        server = backend.attach(target)
        names, figures = counter_names(server.metrics_text())
        console.print(f"{label}: measuring the server at {target.options['base_url']} as it runs ({figures})")
        yield Served(server, 0.0, json.dumps(None), names, figures, body | target.body_fields())
        return
    if backend.serve is None:
        raise SpecbenchError(where, "has no server", "drop load:")
    port = free_port()
    command, env = backend.serve(target, spec, drafter, port)
    with Server(command, port, where, f"serve-{target.name}", env) as server:
        with console.status(f"starting {target.engine} serve for {label} on port {port}"):
            started = server.wait_ready(target.options.get("start_timeout_s", 1800.0))
        config = json.dumps(target.speculative_config(spec, drafter))
        counters = dict(backend.load_counters or SPEC_COUNTERS)
        yield Served(server, started, config, counters, STARTED_FIGURES, body)


def counters(server, names: dict) -> dict[str, float] | None:
    """The server's spec-decode counters (``names``: counter -> metric), None where it no longer
    answers."""
    try:
        scraped = server.counters()
    except (OSError, ValueError):
        return None
    return {metric: scraped.get(metric, 0.0) for metric in names.values()}


def grown(served: Served, before: dict | None, after: dict | None) -> tuple[dict[str, float], list[str]]:
    """What each counter of load's (drafts, draft tokens, accepted tokens) grew by over a level: NaN
    where the server does not expose it or stopped answering; and the metrics that went down (a
    restarted server, or another replica answering), whose growth is NaN too."""
    out = {name: math.nan for name in ("drafts", "draft_tokens", "accepted")}
    out |= {name: math.nan for name in served.counters}
    down: list[str] = []
    if before is None or after is None:
        return out, down
    for name, metric in served.counters.items():
        if after[metric] >= before[metric]:
            out[name] = after[metric] - before[metric]
        else:
            down.append(metric)
    return out, down


def died(server, after: dict | None) -> bool:
    """Whether the server died during a level: it is not alive, or it stopped answering its /metrics
    and does not come back within the grace (a process a moment from being reaped)."""
    return not server.alive() or (after is None and server.gone_within(EXIT_GRACE_S))
