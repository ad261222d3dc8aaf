"""One request to llama-server's ``/completion``, as the llama.cpp backend sends it: the prompt as token
ids, the output streamed with ``timings_per_token``, so that every output token arrives with the ids it
carries and the request's running speculative counters at that moment (``timings.draft_n``,
``timings.draft_n_accepted``), timed on arrival; the stream's last message (``stop: true``) carries the
request's final timings and why it stopped.

Failures are exceptions of their own kind (the server's error message, a timeout, a server gone) that
the backend turns into one-line errors naming the model and the server's log.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass


class RequestFailed(Exception):
    """The server answered with an error (its message)."""


class RequestTimedOut(Exception):
    """No answer before the request's deadline."""


class ServerGone(Exception):
    """The connection was refused, reset or closed before the request finished."""


@dataclass
class Chunk:
    at: float  # seconds from sending the request to this message's arrival
    tokens: list[int]
    marks: tuple[int, int] | None  # (draft_n, draft_n_accepted) when sent; None: no timings came with it


@dataclass
class Streamed:
    chunks: list[Chunk]
    final: dict  # the last message: timings, stop_type, tokens_predicted
    walltime: float


def request_body(request) -> dict:
    """The ``/completion`` body of a request: the prompt as ids, the output's ids streamed with the
    counters, no prompt cache (every row prefills its whole prompt, as our loops do), and the sampling
    set in full (llama.cpp's defaults, top-k 40 and min-p 0.05, are not ours)."""
    sampling = request.sampling
    greedy = sampling.greedy
    return {
        "prompt": request.prompt_ids.tolist(),
        "n_predict": request.max_new_tokens,
        "cache_prompt": False,
        "return_tokens": True,
        "timings_per_token": True,
        "temperature": 0.0 if greedy else sampling.temperature,
        "top_k": 1 if greedy else (sampling.top_k or 0),
        "top_p": 1.0 if greedy else sampling.top_p,
        "min_p": 0.0,
        "seed": int(request.generator.initial_seed()) % (2**31),
    }


def marks(timings) -> tuple[int, int] | None:
    """(draft tokens, accepted tokens) so far from a message's ``timings`` (absent until one drafted)."""
    if not isinstance(timings, dict):
        return None
    return int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))


def stream(port: int, body: dict, timeout: float) -> Streamed:
    """POST ``body`` (``stream`` set) to ``/completion`` and read its events to the last one."""
    deadline = time.monotonic() + timeout
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    chunks: list[Chunk] = []
    started = time.perf_counter()
    try:
        response, sock = _post(connection, "/completion", {**body, "stream": True})
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            line = response.readline()
            if not line:
                raise ServerGone("the stream ended before its last message")
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, comments
            data = line[5:].strip()
            if data == b"[DONE]":
                raise ServerGone("the stream ended before its last message")
            message = json.loads(data)
            if "error" in message:
                raise RequestFailed(_message(message))
            at = time.perf_counter() - started
            tokens = [int(token) for token in message.get("tokens") or []]
            if tokens:
                chunks.append(Chunk(at, tokens, marks(message.get("timings"))))
            if message.get("stop"):
                return Streamed(chunks, message, time.perf_counter() - started)
    except TimeoutError:
        raise RequestTimedOut() from None
    except (ConnectionError, http.client.HTTPException, OSError) as error:
        raise ServerGone(f"{type(error).__name__}: {error}".rstrip(": ")) from None
    except ValueError as error:  # a message that is not JSON
        raise ServerGone(f"the server sent a broken message ({error})") from None
    finally:
        connection.close()


def complete(port: int, body: dict, timeout: float) -> dict:
    """POST ``body`` to ``/completion`` without streaming: the whole answer (``tokens`` included)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        response, _ = _post(connection, "/completion", {**body, "stream": False})
        return json.loads(response.read())
    except TimeoutError:
        raise RequestTimedOut() from None
    except (ConnectionError, http.client.HTTPException, OSError, ValueError) as error:
        raise ServerGone(f"{type(error).__name__}: {error}".rstrip(": ")) from None
    finally:
        connection.close()


def properties(port: int) -> dict:
    """The server's ``/props`` (its build, settings and slots), or {} where it answers none."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/props")
        response = connection.getresponse()
        return json.loads(response.read()) if response.status == 200 else {}
    except (OSError, http.client.HTTPException, ValueError):
        return {}
    finally:
        connection.close()


def _post(connection: http.client.HTTPConnection, path: str, body: dict):
    """(the 200 response, its socket: the connection lets go of it when the server closes after it)."""
    connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    sock = connection.sock
    response = connection.getresponse()
    if response.status != 200:
        text = response.read()
        try:
            detail = _message(json.loads(text))
        except ValueError:
            detail = text.decode(errors="replace").strip()[:300]
        raise RequestFailed(f"HTTP {response.status}: {detail}")
    return response, sock


def _message(answer) -> str:
    """The error message of an error answer (``{"error": {"message": ...}}``)."""
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict):
        return " ".join(str(error.get("message", error)).split())[:300]
    return " ".join(str(error if error is not None else answer).split())[:300]
