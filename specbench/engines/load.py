"""Engine cells under load: each cell's engine served on 127.0.0.1 (``vllm serve``), driven by an async
client at each concurrency level of the recipe's ``load:``, with the speedup of speculation over the same
engine's autoregressive cell at the same level, the curve that shows where speculation stops paying.

Per level, every request streams from ``/v1/completions`` (prompt token ids, greedy, the recipe's output
budget); the client times the first chunk (TTFT) and the end, TPOT being the time after the first token
over the tokens after it (a chunk may carry several tokens when drafts were accepted). The engine's
``/metrics`` counters are differenced around the level for its acceptance. Rows land in ``load.csv`` of
the run directory, one per (cell, level); a level already there is not measured again (``--resume``).
A level where no request completed is a row of 0 tok/s whose speedups are NaN, never a division by 0.
The server is started, waited for and always stopped (an error, Ctrl-C or SIGTERM included):
:mod:`specbench.engines.process`.

Acceptance under load: vLLM's own ``1 + accepted / drafts``, and tokens per verification step estimated
as output tokens / (output tokens - accepted): exact when no request's last step was cut at a stop token.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import statistics
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from specbench.engines.process import EngineProcess
from specbench.errors import SpecbenchError

LOAD_CSV = "load.csv"
LOAD_PNG = "load.png"
SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server(EngineProcess):
    """An engine's HTTP server on 127.0.0.1; ready once ``/health`` answers 200."""

    def __init__(self, command: list[str], port: int, where: str, label: str, env: dict | None = None):
        super().__init__(command, where, label, env)
        self.port = port

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, timeout: float) -> float:
        """Seconds until the server answered; a one-line error if it exits or never opens the port."""
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            if not self.alive():
                error = self.last_error()
                self.stop()
                raise SpecbenchError(
                    self.where,
                    f"the engine's server exited (code {self.process.returncode}) before it opened port "
                    f"{self.port}: {error}",
                    f"read {self.log_path}; fix the cause and run again with --resume",
                )
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=2) as answer:
                    if answer.status == 200:
                        return time.perf_counter() - started
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise SpecbenchError(
            self.where,
            f"the engine's server did not open port {self.port} in {timeout:.0f} s",
            f"read {self.log_path}; raise engine_options.start_timeout_s, or check the port is free",
        )

    def version(self) -> str | None:
        """The engine's version from its ``/version`` endpoint (None when it has none)."""
        try:
            with urllib.request.urlopen(self.url("/version"), timeout=10) as answer:
                return json.loads(answer.read()).get("version")
        except (OSError, ValueError):
            return None

    def counters(self) -> dict[str, float]:
        """The server's Prometheus counters, summed over label sets."""
        with urllib.request.urlopen(self.url("/metrics"), timeout=30) as answer:
            return parse_prometheus(answer.read().decode())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def parse_prometheus(text: str) -> dict[str, float]:
    """name -> value summed over label sets, from Prometheus' text format."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


# -- the client ------------------------------------------------------------------------------------


@dataclass
class Result:
    started: float
    first: float | None = None  # seconds from start to the first chunk
    chunks: int = 0  # counted, not kept: a level of 10^6 requests must not hold every chunk's time
    tokens: int = 0
    ended: float = 0.0
    error: str | None = None

    @property
    def e2e(self) -> float:
        return self.ended - self.started

    @property
    def tpot(self) -> float | None:
        if self.first is None or self.tokens < 2:
            return None
        return (self.e2e - self.first) / (self.tokens - 1)


async def stream_completion(port: int, body: dict, timeout: float) -> Result:
    """POST /v1/completions with stream on; times its first SSE chunk and its end (HTTP/1.1, chunked).
    A failure (refused, timed out, a broken stream) is the result's error, never an exception."""
    result = Result(time.perf_counter())
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        payload = json.dumps(body).encode()
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout)
        if b" 200 " not in status:
            result.error = status.decode(errors="replace").strip()
        while (await asyncio.wait_for(reader.readline(), timeout)) not in (b"\r\n", b""):
            pass  # headers
        buffer = b""
        while True:
            line = await asyncio.wait_for(reader.readline(), timeout)
            if not line:
                break
            buffer += line
            while b"\n\n" in buffer.replace(b"\r\n", b"\n"):
                normal = buffer.replace(b"\r\n", b"\n")
                event, _, rest = normal.partition(b"\n\n")
                buffer = rest
                _event(event, result)
        writer.close()
    except (OSError, asyncio.TimeoutError, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}".rstrip(": ")
    result.ended = time.perf_counter()
    return result


def _event(event: bytes, result: Result) -> None:
    for line in event.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:"):
            continue  # chunk-size lines of the chunked encoding, comments
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        message = json.loads(data)
        now = time.perf_counter() - result.started
        if message.get("choices"):
            if result.first is None:
                result.first = now
            result.chunks += 1
        usage = message.get("usage")
        if usage:
            result.tokens = usage.get("completion_tokens", result.tokens)


async def run_level(
    port: int,
    model: str,
    prompts: list[list[int]],
    concurrency: int,
    requests: int,
    max_tokens: int,
    stop: list[int],
    timeout: float,
) -> tuple[list[Result], float]:
    """``requests`` requests, ``concurrency`` at a time, prompts taken in turn: (results, elapsed)."""
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(prompts[i % len(prompts)])
    results: list[Result] = []

    async def client():
        while not queue.empty():
            ids = queue.get_nowait()
            body = {
                "model": model,
                "prompt": ids,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "stream": True,
                "stream_options": {"include_usage": True},
                "stop_token_ids": stop,
            }
            results.append(await stream_completion(port, body, timeout))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return results, time.perf_counter() - started


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(
    cell: str,
    concurrency: int,
    results: list[Result],
    elapsed: float,
    grown: dict,
    slo_ttft: float,
    slo_tpot: float,
) -> dict:
    """One load.csv row: throughput, latency percentiles, goodput under the SLO, and acceptance."""
    done = [r for r in results if r.error is None and r.first is not None]
    tokens = sum(r.tokens for r in done)
    row = {
        "cell": cell,
        "concurrency": concurrency,
        "requests": len(results),
        "completed": len(done),
        "errors": len(results) - len(done),
        "elapsed_s": elapsed,
        "output_tokens": tokens,
        "throughput_tok_s": tokens / elapsed if elapsed else math.nan,
        "request_throughput": len(done) / elapsed if elapsed else math.nan,
        "per_request_tok_s": statistics.fmean(r.tokens / r.e2e for r in done) if done else math.nan,
    }
    for name, values in (
        ("ttft", [r.first for r in done]),
        ("tpot", [r.tpot for r in done if r.tpot is not None]),
        ("e2e", [r.e2e for r in done]),
    ):
        for q in (50, 90, 99):
            row[f"{name}_p{q}_s"] = _percentile(values, q / 100)
    good = [r for r in done if r.first <= slo_ttft and (r.tpot is None or r.tpot <= slo_tpot)]
    row["goodput_req_s"] = len(good) / elapsed if elapsed else math.nan
    drafts, accepted = grown.get("drafts", 0.0), grown.get("accepted", 0.0)
    row["drafts"], row["draft_tokens"], row["accepted"] = drafts, grown.get("draft_tokens", 0.0), accepted
    row["vllm_mean_acceptance_length"] = 1 + accepted / drafts if drafts else math.nan
    row["tokens_per_step_est"] = tokens / (tokens - accepted) if tokens > accepted else math.nan
    return row


def speedups(rows: list[dict], reference: dict[str, str]) -> list[dict]:
    """Each row with the speedup of its throughput and per-request speed over the same engine's AR cell
    at the same concurrency (``reference``: cell -> its AR cell)."""
    by = {(r["cell"], r["concurrency"]): r for r in rows}
    out = []
    for row in rows:
        base = by.get((reference.get(row["cell"], ""), row["concurrency"])) or {}
        row = dict(row)
        row["speedup_throughput"] = _ratio(row["throughput_tok_s"], base.get("throughput_tok_s"))
        row["speedup_per_request"] = _ratio(row["per_request_tok_s"], base.get("per_request_tok_s"))
        out.append(row)
    return out


def _ratio(value: float, base: float | None) -> float:
    """value / base; NaN without a base, or where the base level delivered nothing (every request
    failed or timed out: summarize's 0 tok/s or NaN), which no speedup can be measured against."""
    if base is None or not base > 0 or math.isnan(value):
        return math.nan
    return value / base


def failed_level(row: dict, results: list[Result]) -> str | None:
    """What to warn of a level (its load.csv row and its requests) where no request completed: a
    server that crashed, requests that all timed out; None where some did."""
    if row["completed"]:
        return None
    error = next((r.error for r in results if r.error), "no answer")
    return (
        f"{row['cell']} x{row['concurrency']}: none of its {row['requests']} requests completed (first: "
        f"{error}); its throughput is 0 and the speedups against it are NaN (—)"
    )


def read_load(directory: Path) -> list[dict]:
    """The rows of ``DIR/load.csv`` ([] where there is none), or a one-line error naming the file."""
    import pandas as pd

    path = Path(directory) / LOAD_CSV
    if not path.is_file():
        return []
    fix = "restore it, or measure the sweep again into a new -o"
    try:
        frame = pd.read_csv(path, dtype={"key": str, "machine": str, "cell": str})  # "1e5..." stays a key
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
        first = " ".join(str(error).split())[:100] or type(error).__name__
        raise SpecbenchError(str(path), f"is not a readable CSV ({first})", fix) from None
    missing = [column for column in ("key", "cell", "concurrency") if column not in frame.columns]
    if missing:
        raise SpecbenchError(str(path), f"has no column {missing[0]!r}: not a specbench {LOAD_CSV}", fix)
    return frame.to_dict("records")


def write_load(directory: Path, rows: list[dict]) -> Path:
    """load.csv, replaced atomically (a killed run never leaves half a file)."""
    import pandas as pd

    from specbench.models.cache import write_atomic

    path = Path(directory) / LOAD_CSV
    write_atomic(path, pd.DataFrame(rows).to_csv(index=False))
    return path
