"""The load client: streaming requests against an engine's HTTP server, closed-loop or open-loop.

A **level** is how the requests arrive. Closed-loop (``concurrency: c``): c clients, each sending its
next request when its last one ended, so c requests are always in flight. Open-loop (``request_rate:
r``): requests arrive at a mean rate of r per second whether or not earlier ones ended, as vLLM's
``bench serve --request-rate`` sends them: the gaps between arrivals are gamma-distributed with shape
``burstiness`` and mean 1/r (shape 1: exponential gaps, a Poisson process; below 1 burstier; ``inf``
evenly spaced), and the arrival times are rescaled so that the last one falls at n / r, which keeps a
level's offered rate its nominal rate whatever the draw (vLLM does the same). The draws come from a
generator seeded by the recipe's seed, the rate and the repeat, so a level's schedule is the same for
every cell (their requests pair) and can be drawn again from the seed; each request's scheduled
arrival is recorded beside its timings.

Request i of a level sends prompt i (taken in turn), in both kinds of level. Each streams from the
server's ``/v1/completions`` (an :class:`Endpoint`: 127.0.0.1 for a server specbench started, the
recipe's ``base_url`` for one it did not; prompt token ids, greedy, the output budget); the client times
the first chunk (TTFT) and the end, and keeps the output's token ids where the server sends them (vLLM's
``return_token_ids``: ``choices[0].token_ids`` per chunk; llama.cpp's ``return_tokens``: ``tokens``, in
``__verbose`` on its OpenAI route), which the output-equivalence check under load reads. A request that
fails (refused, a broken stream, an HTTP error, or no end within the level's ``timeout_s``) is a result
with its error, never an exception and never dropped.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from specbench.engines.request_counts import request_counts

CLOSED_LOOP, OPEN_LOOP = "concurrency", "rate"


@dataclass(frozen=True)
class Level:
    """One load level: ``kind`` closed-loop (``value`` requests in flight) or open-loop (``value``
    requests per second)."""

    kind: str
    value: float

    @property
    def concurrency(self) -> int | None:
        return int(self.value) if self.kind == CLOSED_LOOP else None

    @property
    def rate(self) -> float | None:
        return float(self.value) if self.kind == OPEN_LOOP else None

    def label(self) -> str:
        """How messages and tables name it: ``x4`` (4 in flight) or ``@2 req/s``."""
        return f"x{self.concurrency}" if self.kind == CLOSED_LOOP else f"@{self.value:g} req/s"

    def describe(self) -> str:
        if self.kind == CLOSED_LOOP:
            return f"concurrency {self.concurrency}"
        return f"request rate {self.value:g}/s"

    def token(self) -> str:
        """Its part of a row's key."""
        return str(self.concurrency) if self.kind == CLOSED_LOOP else f"rate={self.value!r}"


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: host, port, TLS, the path before ``/completions`` and ``/models`` (``/v1``),
    and headers every request carries (an API key's; never written to a result)."""

    host: str
    port: int
    tls: bool = False
    prefix: str = "/v1"
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def local(cls, port: int) -> Endpoint:
        """A server specbench started on 127.0.0.1."""
        return cls("127.0.0.1", port)

    @classmethod
    def of(cls, base_url: str, headers: tuple[tuple[str, str], ...] = ()) -> Endpoint:
        """``http(s)://host[:port]/path`` (what an OpenAI client takes as its base URL)."""
        parts = urlsplit(base_url)
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return cls(parts.hostname or "", port, tls, parts.path.rstrip("/"), headers)

    def root(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        """The address of ``path`` under the prefix (``/completions``) or, with a leading ``~``, at the
        server's root (``~/metrics``)."""
        return self.root() + (path[1:] if path.startswith("~") else self.prefix + path)


@dataclass
class Result:
    started: float  # perf_counter at the send
    first: float | None = None  # seconds from the send to the first chunk
    chunks: int = 0  # counted, not kept: a level of 10^6 requests must not hold every chunk's time
    tokens: int = 0
    counted: bool = False  # the server sent its usage (completion_tokens)
    ended: float = 0.0
    error: str | None = None
    timed_out: bool = False
    index: int = 0  # the request's place in its level (it sent prompt ``index`` taken in turn)
    arrival: float | None = None  # its scheduled arrival, seconds from the level's start (open-loop)
    ids: list[int] | None = None  # the output's token ids; None where the server sent none
    finish: str | None = None  # the server's finish_reason
    # (seconds from the send, token ids) of each chunk, kept only where asked (a run row's steps)
    trace: list[tuple[float, int]] | None = None
    spec: dict | None = None  # its own speculative counts, where the server sends them (request_counts)

    @property
    def e2e(self) -> float:
        return self.ended - self.started

    @property
    def tpot(self) -> float | None:
        if self.first is None or self.tokens < 2:
            return None
        return (self.e2e - self.first) / (self.tokens - 1)


def arrival_seed(seed: int, rate: float, repeat: int) -> list[int]:
    """The arrival generator's seed: the recipe's seed, the rate (in µ-requests/s, so a level keeps its
    draws when others are added) and the repeat."""
    return [int(seed), int(round(rate * 1_000_000)), int(repeat)]


def arrival_times(rate: float, n: int, burstiness: float, seed: list[int]) -> list[float]:
    """n arrival times (seconds from the level's start): cumulative gamma gaps of shape ``burstiness``
    and mean 1 / ``rate``, rescaled so that the last is n / rate (vLLM's ``get_request``)."""
    if burstiness == math.inf:
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    times = np.cumsum(gaps)
    if n and times[-1] > 0:
        times *= (n / rate) / times[-1]
    return times.tolist()


# what asks a server for the output's token ids: vLLM's field, and llama.cpp's (which its OpenAI route
# sends inside ``__verbose`` only); servers that know neither ignore them
TOKEN_ID_FIELDS = {"return_token_ids": True, "return_tokens": True, "verbose": True}


def completion_body(
    model: str, prompt: list[int], max_tokens: int, stop: list[int], extra: dict | None = None
) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "stop_token_ids": stop,
        **(extra or {}),
    }


async def stream_completion(
    endpoint: Endpoint, body: dict, timeout: float, result: Result | None = None
) -> Result:
    """POST ``/completions`` with stream on; times its first SSE chunk and its end (HTTP/1.1, chunked).
    ``timeout`` bounds the whole request: one that has not ended by then is a timed-out failure."""
    result = result or Result(time.perf_counter())
    result.started = time.perf_counter()
    connection: list = []
    try:
        await asyncio.wait_for(_exchange(endpoint, body, result, connection), timeout)
    except asyncio.TimeoutError:
        result.error, result.timed_out = f"TimeoutError: no end within {timeout:g} s", True
    except (OSError, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}".rstrip(": ")
    finally:
        for writer in connection:
            writer.close()
    result.ended = time.perf_counter()
    return result


async def _exchange(endpoint: Endpoint, body: dict, result: Result, connection: list) -> None:
    secure = ssl.create_default_context() if endpoint.tls else None
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port, ssl=secure)
    connection.append(writer)
    payload = json.dumps(body).encode()
    headers = "".join(f"{name}: {value}\r\n" for name, value in endpoint.headers)
    writer.write(
        f"POST {endpoint.prefix}/completions HTTP/1.1\r\nHost: {endpoint.host}\r\n".encode()
        + f"Content-Type: application/json\r\n{headers}".encode()
        + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        result.error = status.decode(errors="replace").strip() or "the server closed the connection"
    while (await reader.readline()) not in (b"\r\n", b""):
        pass  # headers
    buffer = b""
    while True:
        line = await reader.readline()
        if not line:
            break
        buffer += line
        while b"\n\n" in buffer.replace(b"\r\n", b"\n"):
            event, _, rest = buffer.replace(b"\r\n", b"\n").partition(b"\n\n")
            buffer = rest
            _event(event, result)


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
        ids = chunk_ids(message)
        if ids is not None:
            result.ids = (result.ids or []) + ids
        result.spec = request_counts(message) or result.spec
        if message.get("choices"):
            result.finish = message["choices"][0].get("finish_reason") or result.finish
            if result.first is None:
                result.first = now
            result.chunks += 1
            if result.trace is not None:
                result.trace.append((now, len(ids or [])))
        usage = message.get("usage")
        if usage and "completion_tokens" in usage:
            result.tokens, result.counted = int(usage["completion_tokens"]), True


def chunk_ids(message: dict) -> list[int] | None:
    """The output token ids a streamed message carries: vLLM's ``choices[0].token_ids``, llama.cpp's
    ``tokens`` (its own route) or ``__verbose.tokens`` (its OpenAI route); None where it has none."""
    choice = (message.get("choices") or [{}])[0]
    verbose = message.get("__verbose")
    for ids in (
        choice.get("token_ids") if isinstance(choice, dict) else None,
        message.get("tokens"),
        verbose.get("tokens") if isinstance(verbose, dict) else None,
    ):
        if isinstance(ids, list):
            return [int(token) for token in ids]
    return None


@dataclass(frozen=True)
class Requests:
    """What a level sends: the server's endpoint and model name, the prompts (taken in turn), the output
    budget, the stop ids, one request's time limit and the body's extra fields (the token ids' asks)."""

    endpoint: Endpoint
    model: str
    prompts: list[list[int]]
    max_tokens: int
    stop: list[int]
    timeout: float
    extra: dict = field(default_factory=dict)

    def body(self, index: int) -> dict:
        prompt = self.prompts[index % len(self.prompts)]
        return completion_body(self.model, prompt, self.max_tokens, self.stop, self.extra)


@dataclass
class LevelRun:
    """A level's requests in the order they were sent, its start (perf_counter) and its elapsed seconds
    (from the start until the last request ended)."""

    results: list[Result]
    started: float
    elapsed: float

    def records(self) -> list[dict]:
        return [request_record(result, self.started) for result in self.results]


async def closed_loop(
    send: Requests, concurrency: int, count: int | None, duration: float | None
) -> LevelRun:
    """``concurrency`` clients, each sending the next request when its last ended, until ``count``
    requests were sent or, with ``duration``, until that many seconds passed."""
    results: list[Result] = []
    started = time.perf_counter()

    def next_index() -> int | None:
        if count is not None and len(results) >= count:
            return None
        if duration is not None and time.perf_counter() - started >= duration:
            return None
        results.append(Result(time.perf_counter(), index=len(results)))
        return len(results) - 1

    async def client():
        while (index := next_index()) is not None:
            await stream_completion(send.endpoint, send.body(index), send.timeout, results[index])

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return LevelRun(results, started, time.perf_counter() - started)


async def open_loop(send: Requests, arrivals: list[float]) -> LevelRun:
    """Request i sent at ``arrivals[i]`` seconds from the start, whatever is still in flight."""
    results = [Result(0.0, index=i, arrival=t) for i, t in enumerate(arrivals)]
    started = time.perf_counter()
    tasks = []
    for result in results:
        wait = started + result.arrival - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        request = stream_completion(send.endpoint, send.body(result.index), send.timeout, result)
        tasks.append(asyncio.create_task(request))
    await asyncio.gather(*tasks)
    return LevelRun(results, started, time.perf_counter() - started)


def request_record(result: Result, level_start: float) -> dict:
    """One request as load_requests.jsonl keeps it, failed or not: its place in the level (its prompt,
    taken in turn), its scheduled arrival and its send (seconds from the level's start), its first
    chunk and end (seconds from its send), the tokens the server counted, its error, its own
    speculative counts (None where the server sends none), and the output's token ids (None where the
    server sent none, or fewer than it counted: a stream that held some back)."""
    tokens = result.tokens if result.counted else len(result.ids or [])  # a server without usage: ids
    ids = result.ids if result.ids is not None and len(result.ids) == tokens else None
    return {
        "index": result.index,
        "arrival_s": result.arrival,
        "sent_s": result.started - level_start,
        "ttft_s": result.first,
        "e2e_s": result.e2e,
        "tokens": tokens,
        "error": result.error if result.first is not None or result.error else "no answer",
        "timed_out": result.timed_out,
        "output_ids": ids,
        "ids_sent": result.ids is not None,
        "spec": result.spec,
    }
