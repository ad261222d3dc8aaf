"""Any OpenAI-compatible server as a backend: a recipe model with ``engine: openai`` is a server that
specbench does not start (SGLang, TGI, a vLLM or llama-server someone else runs, here or remote), named
by ``engine_options.base_url`` (``http://HOST:PORT/v1``). Only that address is contacted: its
``/completions`` and ``/models`` under the base URL, ``/metrics`` and ``/version`` at its root. An API
key, where the server wants one, is read from the environment variable ``engine_options.api_key_env``
names and sent as a bearer token; the key itself is never in the recipe or in any result file (the
records name the variable).

specbench cannot set such a server's speculation, so its only cell is ``autoregressive``: the server as
it runs, named after its own setting; whether it speculated is read from its counters. Requests are the
load client's (:mod:`specbench.engines.load_client`): prompt token ids, streamed, asking for the
output's token ids (vLLM's ``return_token_ids``, llama.cpp's ``return_tokens``; ``token_ids: false``
leaves those fields out for a server that refuses unknown ones). Where the server sends none, tokens are
counted from its usage and the record says the ids could not be had (so no output is checked).

Spec-decode counters come from the server's ``/metrics`` where it exposes vLLM's names
(``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total``)
or SGLang's (``sglang:spec_verify_calls_total``, a counter of verification passes; its acceptance is a
gauge over a recent window, which no difference can span, so drafts and accepted tokens could not be had
there); every record says which figures came from the server and which could not be had. A counter that
goes down between two scrapes (a restarted server, or another replica behind a balancer) leaves that
level's figure unknown, in one warning line.

specbench loads the ``source``'s tokenizer alone (:mod:`specbench.sources.tokenizers`), never the
weights, which the server holds: a remote 70B costs this machine a tokenizer. ``audit_weights: true``
loads specbench's copy too (the target's ``audit`` model), to tell a numerical tie from a mismatch;
without it a divergence stays unclassified, and the records say why. ``baseline`` names another
``engine: openai`` model, the AR server this one's speedups are measured against
(:meth:`specbench.recipe.Recipe.speedup_over`; checked by :func:`specbench.engines.checks.baseline_problem`).

Under ``specbench run`` a request runs alone and its steps are the server's streamed chunks, checked
against vLLM's counters (:func:`specbench.engines.vllm.generation_from_answer`, the vLLM backend's own
accounting); a server that sends no token ids, or several tokens a chunk without vLLM's counters, cannot
make a run row and is refused in one line (``specbench load`` measures it).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import replace
from urllib.parse import urlsplit

from specbench.engines import Backend, CellView, EngineModel, Problem
from specbench.engines.load import SPEC_COUNTERS, parse_prometheus, scrape
from specbench.engines.load_client import (
    TOKEN_ID_FIELDS,
    Endpoint,
    Result,
    completion_body,
    stream_completion,
)
from specbench.engines.vllm import generation_from_answer
from specbench.errors import SpecbenchError
from specbench.methods import BASELINE, ParamSpec

ENGINE = "openai"
OPTIONS = {
    "base_url": ParamSpec(str, None, "the server's OpenAI base URL, http(s)://HOST:PORT/v1 (required)"),
    "api_key_env": ParamSpec(str, None, "the environment variable holding the server's API key (never kept)"),
    "model": ParamSpec(str, None, "the model name the server serves (default: the first its /models lists)"),
    "token_ids": ParamSpec(
        bool, True, "ask for output token ids (vLLM's return_token_ids, llama.cpp's return_tokens)"
    ),
    "connect_timeout_s": ParamSpec(float, 5.0, "seconds the server may take to answer a probe", 0.1, 600),
    "request_timeout_s": ParamSpec(float, 3600.0, "seconds one request of a run may take", 1),
    "audit_weights": ParamSpec(
        bool, False, "load specbench's copy of the weights too, to tell numerical ties from mismatches"
    ),
    "baseline": ParamSpec(
        str, None, "the recipe model (another engine: openai server, autoregressive) speedups are over"
    ),
}
UNCLASSIFIED = (
    "specbench holds no copy of the server's weights (engine: openai loads its tokenizer alone), so a "
    "divergence cannot be told a tie; engine_options.audit_weights: true loads one"
)
SGLANG_COUNTERS = {"verify_steps": "sglang:spec_verify_calls_total"}
VLLM_PREFIX = "vllm:spec_decode_"
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
URL_FIX = "write it as http://HOST:PORT/v1 (the address the server's OpenAI clients use)"


def _speculation(cell: CellView) -> tuple[dict | None, Problem]:
    if cell.method == BASELINE:
        return None, None
    return None, (
        "method",
        f"engine: openai measures a server specbench does not start, as it runs; specbench cannot set its "
        f"speculation ({cell.method})",
        "use method autoregressive on it, named after the server's own setting (its counters say whether "
        "it speculated); to compare settings, run one server per setting, each a model of its own",
    )


def _source_problem(source: str, options: dict) -> Problem:
    """The server's address and key variable, checked when the recipe is read."""
    url = options.get("base_url")
    if not url:
        return "engine_options.base_url", "engine: openai needs the server's address", URL_FIX
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018  (a port that is not a number raises)
    except ValueError:
        return "engine_options.base_url", f"{url!r} has no valid port", URL_FIX
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "engine_options.base_url", f"{url!r} is not an http(s) URL with a host", URL_FIX
    if parts.username or parts.password:
        return (
            "engine_options.base_url",
            f"the URL of {parts.hostname} holds credentials, which would be written to the results",
            "remove them and name the environment variable holding the key in api_key_env",
        )
    name = options.get("api_key_env")
    if name is not None and not VARIABLE.fullmatch(name):
        return (
            "engine_options.api_key_env",
            "is not an environment variable's name (it never holds the key itself)",
            "name the variable that holds the key, e.g. OPENAI_API_KEY",
        )
    return None


def endpoint_of(options: dict, where: str) -> Endpoint:
    """The server's endpoint with the API key's header, read from its variable now (never stored)."""
    name = options.get("api_key_env")
    headers: tuple[tuple[str, str], ...] = ()
    if name:
        key = os.environ.get(name, "")
        if not key:
            raise SpecbenchError(
                f"{where}.engine_options.api_key_env",
                f"the environment variable {name} is not set or is empty",
                f"export {name}=<the server's API key>, or remove api_key_env for a server without one",
            )
        headers = (("Authorization", f"Bearer {key}"),)
    return Endpoint.of(options["base_url"], headers)


def get(endpoint: Endpoint, path: str, timeout: float) -> tuple[int, bytes]:
    """(status, body) of a GET of ``path`` (:meth:`Endpoint.url`); an OSError where nothing answers."""
    request = urllib.request.Request(endpoint.url(path), headers=dict(endpoint.headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _reason(error: Exception) -> str:
    reason = getattr(error, "reason", error)
    return " ".join(f"{type(reason).__name__}: {reason}".split())[:200]


def _available(options: dict) -> tuple[str, str] | None:
    """None when something answers at the base URL within ``connect_timeout_s``, else (problem, fix)."""
    url = options.get("base_url", "")
    try:
        get(Endpoint.of(url), "/models", options.get("connect_timeout_s", 5.0))
    except (OSError, ValueError) as error:
        return (
            f"nothing answers at {url} ({_reason(error)})",
            "start the server, or correct engine_options.base_url (specbench contacts no other address)",
        )
    return None


def counter_names(text: str | None) -> tuple[dict[str, str], str]:
    """The spec-decode counters a ``/metrics`` text has (load's name -> the server's), and the record's
    line saying where they came from and what could not be had."""
    if text is None:
        return {}, "none: the server answers no /metrics, so drafts and accepted tokens could not be had"
    names = parse_prometheus(text)
    if all(metric in names for metric in SPEC_COUNTERS.values()):
        return dict(SPEC_COUNTERS), "vLLM's /metrics counters (drafts, draft tokens, accepted tokens)"
    if all(metric in names for metric in SGLANG_COUNTERS.values()):
        return dict(SGLANG_COUNTERS), (
            "SGLang's /metrics (verification passes only; drafts and accepted tokens could not be had: "
            "SGLang's acceptance is a gauge)"
        )
    return {}, "none: /metrics has no vLLM or SGLang spec-decode counter, so acceptance could not be had"


class Attached:
    """A server specbench did not start, as ``specbench load`` drives it: the same questions as a
    started :class:`~specbench.engines.load.Server` (its endpoint, alive, its counters and version, what
    happened when it stopped answering), answered over HTTP only."""

    log_path = None

    def __init__(self, endpoint: Endpoint, probe_timeout: float):
        self.endpoint, self.probe_timeout = endpoint, probe_timeout

    def alive(self) -> bool:
        try:
            get(self.endpoint, "/models", self.probe_timeout)
        except (OSError, ValueError):
            return False
        return True

    def gone_within(self, grace: float) -> bool:
        """Whether it stays unreachable for ``grace`` seconds."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self.alive():
                return False
            time.sleep(0.5)
        return True

    def death(self) -> tuple[str, str, str]:
        return "stopped answering", f"at {self.endpoint.root()}{self.endpoint.prefix}", "check the server"

    def metrics_text(self) -> str | None:
        try:
            return scrape(self.endpoint.url("~/metrics"), self.endpoint.headers, self.probe_timeout)
        except (OSError, ValueError):
            return None

    def counters(self) -> dict[str, float]:
        text = self.metrics_text()
        if text is None:
            raise OSError("the server answered no /metrics")
        return parse_prometheus(text)

    def version(self) -> str | None:
        try:
            status, body = get(self.endpoint, "~/version", self.probe_timeout)
            return json.loads(body).get("version") if status == 200 else None
        except (OSError, ValueError, AttributeError):
            return None

    def snapshot(self) -> list[dict]:
        """vLLM's spec-decode counters in its offline engine's form (the per-position vector kept by
        position), for :func:`specbench.engines.accounting.difference`; [] where it exposes none."""
        text = self.metrics_text() or ""
        scalars: dict[str, float] = {}
        vectors: dict[str, dict[int, float]] = {}
        for line in text.splitlines():
            if not line.startswith(VLLM_PREFIX):
                continue
            head, _, value = line.rpartition(" ")
            name = head.split("{", 1)[0].removesuffix("_total")
            position = re.search(r'position="(\d+)"', head)
            try:
                number = float(value)
            except ValueError:
                continue
            if position:
                slot = vectors.setdefault(name, {})
                slot[int(position.group(1))] = slot.get(int(position.group(1)), 0.0) + number
            else:
                scalars[name] = scalars.get(name, 0.0) + number
        out = [{"name": name, "value": value} for name, value in scalars.items()]
        for name, by in vectors.items():
            out.append({"name": name, "values": [int(by.get(i, 0)) for i in range(max(by) + 1)]})
        return out


class OpenAITarget(EngineModel):
    """A recipe model served by an OpenAI-compatible server specbench did not start: a cell's target."""

    engine = ENGINE
    audit = None  # specbench's copy of the weights (audit_weights), which tells a tie from a mismatch
    unclassified_why: str | None = None  # why a divergence stays unclassified (no copy of the weights)
    origin_of_tokenizer: str | None = None

    def __init__(
        self, name: str, tokenizer, device, options: dict, params: int, dtype: str, endpoint, model: str
    ):
        self.name, self.tokenizer, self.device = name, tokenizer, device
        self.options, self.num_parameters, self.serving_dtype = dict(options), params, dtype
        self.endpoint, self.directory = endpoint, model  # directory: the model's name in requests
        self.origin = f"openai:{options['base_url']}"
        self.where = f"models.{name}.engine"
        self._version: str | None = None

    def attach(self) -> Attached:
        return Attached(self.endpoint, self.options.get("connect_timeout_s", 5.0))

    def body_fields(self) -> dict:
        """The fields every request adds to the OpenAI body: the token ids' asks, unless turned off."""
        return dict(TOKEN_ID_FIELDS) if self.options.get("token_ids", True) else {}

    def prepare(self, spec: dict | None, drafter=None) -> float:
        return 0.0

    def generate(self, request, spec: dict | None, drafter=None):
        """One request alone on the server; its steps are its streamed chunks, checked against vLLM's
        counters where the server exposes them."""
        server = self.attach()
        sampling = request.sampling
        body = completion_body(
            self.directory,
            request.prompt_ids.tolist(),
            request.max_new_tokens,
            list(request.eos_token_id),
            {
                **self.body_fields(),
                "temperature": 0.0 if sampling.greedy else sampling.temperature,
                "top_p": 1.0 if sampling.greedy else sampling.top_p,
                "top_k": -1 if sampling.greedy or not sampling.top_k else sampling.top_k,
                "seed": int(request.generator.initial_seed()) % (2**31),
            },
        )
        before = server.snapshot()
        result = Result(time.perf_counter(), trace=[])
        timeout = self.options.get("request_timeout_s", 3600.0)
        asyncio.run(stream_completion(self.endpoint, body, timeout, result))
        after = server.snapshot()
        if result.error is not None:
            raise SpecbenchError(
                self.where,
                f"the server at {self.options['base_url']} failed a request: {result.error}",
                "check the server and its log; finished rows are kept: run again with --resume",
            )
        tokens = result.tokens if result.counted else len(result.ids or [])
        if result.ids is None or len(result.ids) != tokens:
            raise SpecbenchError(
                self.where,
                f"the server at {self.options['base_url']} returned no token ids (or fewer than it "
                "generated), which a run row needs",
                "measure it with specbench load (tokens counted from its usage), or serve the model with "
                "vLLM (return_token_ids) or llama-server (return_tokens)",
            )
        steps = [(at, n) for at, n in result.trace if n]
        if not before and any(n > 1 for _, n in steps):
            raise SpecbenchError(
                self.where,
                "the server streams several tokens a chunk and exposes no vLLM spec-decode counters, so "
                "its verification steps cannot be counted",
                "measure it with specbench load, or expose vLLM's /metrics",
            )
        lengths, total = [], 0
        for _, n in steps:
            total += n
            lengths.append(total)
        if self._version is None:
            self._version = server.version()
        answer = {
            "token_ids": result.ids,
            "before": before,
            "after": after,
            "step_lengths": lengths,
            "step_times": [at for at, _ in steps],
            "walltime": result.e2e,
            "finish_reason": result.finish,
        }
        started = {"version": self._version, "settings": self.settings()}
        prompt = int(request.prompt_ids.shape[0])
        generation = generation_from_answer(answer, self.name, None, started, prompt, None, ENGINE)
        generation.engine_record["server_figures"] = counter_names(server.metrics_text())[1]
        return generation

    def settings(self) -> dict:
        """What the records say of the server (the key's variable, never the key)."""
        return {
            "base_url": self.options["base_url"],
            "model": self.directory,
            "api_key_env": self.options.get("api_key_env"),
            "token_ids": self.options.get("token_ids", True),
            "audit_weights": self.options.get("audit_weights", False),
            "baseline": self.options.get("baseline"),
            "tokenizer": self.origin_of_tokenizer,
        }

    def describe(self) -> dict:
        return {"engine": ENGINE, "version": self._version, "settings": self.settings()}


def served_model(endpoint: Endpoint, options: dict, where: str) -> str:
    """The model name requests carry: ``engine_options.model``, else the first the server lists."""
    if options.get("model"):
        return options["model"]
    try:
        status, body = get(endpoint, "/models", options.get("connect_timeout_s", 5.0))
        listed = json.loads(body).get("data") if status == 200 else None
        name = listed[0]["id"] if isinstance(listed, list) and listed else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        name = None
    if not isinstance(name, str):
        raise SpecbenchError(
            f"{where}.engine_options.model",
            f"the server at {options['base_url']} lists no model at /models",
            "name the model it serves in engine_options.model",
        )
    return name


def _open(request, loaded) -> OpenAITarget:
    """The target from the source's tokenizer alone (sources.tokenizers.Tokenized), or with
    ``audit_weights`` from specbench's copy of the weights (sources.Served), kept as its audit model."""
    where = f"models.{request.name}"
    options = dict(request.engine_options)
    endpoint = endpoint_of(options, where)
    name = served_model(endpoint, options, where)
    weights = getattr(loaded, "weights", None)
    if weights is None:
        from specbench.sources.tokenizers import parameters_of

        tokenizer, params = loaded.tokenizer, parameters_of(loaded.config)
    else:
        tokenizer, params = weights.tokenizer, sum(p.numel() for p in weights.module.parameters())
    device, dtype = loaded.device, loaded.dtype if weights is not None else None  # none: the server's
    target = OpenAITarget(request.name, tokenizer, device, options, params, dtype, endpoint, name)
    if weights is None:
        target.origin_of_tokenizer = loaded.origin
        target.dtype_reason = "the server computes in its own dtype; specbench loaded its tokenizer alone"
        target.unclassified_why = UNCLASSIFIED
        return target
    from specbench.sources import wrap

    audit = wrap(replace(request, engine="eager", linear="aten"), weights.module.to(loaded.device), tokenizer)
    audit.origin, audit.dtype_reason = weights.origin, loaded.dtype_reason
    target.audit, target.origin_of_tokenizer = audit, weights.origin
    target.dtype_reason = (
        f"the server computes in its own dtype; {loaded.dtype} is specbench's copy, loaded to tell ties "
        f"(audit_weights; {loaded.dtype_reason})"
    )
    return target


def _attach(target: OpenAITarget) -> Attached:
    return target.attach()


BACKEND = Backend(
    ENGINE,
    "an OpenAI-compatible server specbench does not start (engine_options.base_url), measured as it runs",
    OPTIONS,
    _speculation,
    _open,
    _available,
    source_problem=_source_problem,
    attach=_attach,
    tokenizer_only=lambda options: not options.get("audit_weights", False),
)
