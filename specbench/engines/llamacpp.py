"""llama.cpp as a backend (llama.cpp, Georgi Gerganov and contributors, github.com/ggml-org/llama.cpp): a
recipe model with ``engine: llama.cpp`` runs its cells in ``llama-server`` on the model's GGUF file, the
engine most people who speculate on a CPU run.

The server reads the GGUF file of the model's source itself (a ``.gguf`` path, the one ``.gguf`` in a
local directory or a distilled drafter's folder, SmolLM2's Q4_1 file, the Qwen2.5-Coder Q4_K_M files) or
the file named in ``engine_options.gguf`` (``bf16``: the BF16 conversion of the weights specbench loads,
:mod:`specbench.engines.llamacpp_convert`; ``draft_gguf`` likewise for a model drafter), checked to hold the
recipe's model (layers, width, vocabulary). specbench still loads its own copy of the source for the
tokenizer that builds each request. One server per speculative setting runs on a free port of
127.0.0.1, kept while the run interleaves cells, and is always stopped
(:mod:`specbench.engines.llamacpp_server`).

Cells map to llama.cpp's speculative types: ``autoregressive`` to none; an ``eagle`` chain with an EAGLE-3
head to ``draft-eagle3`` (:mod:`specbench.engines.llamacpp_eagle3`); ``speculative`` with a model
drafter to ``draft-simple`` (``-md`` the drafter's GGUF, ``--spec-draft-n-max`` = k, ``--spec-draft-n-min``
= 0 and ``--spec-draft-p-min`` = 0, the exact algorithm's: every step drafts k tokens, none is dropped
for a low drafter probability); ``speculative`` with a ``prompt-lookup`` drafter to ``ngram-simple``
(``--spec-ngram-simple-size-n`` = ``max_ngram``, ``--spec-ngram-simple-size-m`` = k). ngram-simple is
llama.cpp's type closest to our prompt lookup; its rule differs: it looks up the last ``max_ngram`` tokens
only (ours falls back to shorter suffixes), takes their most recent earlier occurrence (ours the
leftmost), never matches at the context's first position, drafts nothing when fewer than ``max_ngram``
tokens follow the match, and needs a context longer than ``max_ngram + k + 1`` tokens. Anything else is
refused when the recipe is read, naming the field.

Each request sends the prompt as token ids and streams its output with ``timings_per_token``
(:mod:`specbench.engines.llamacpp_client`): every token arrives with the request's running counters
``draft_n`` and ``draft_n_accepted``, from which :func:`specbench.engines.accounting.steps_from_marks`
locates every target pass exactly. Rules that differ from ours: llama.cpp's target samples each position
and keeps a draft token while it equals that sample (at temperature 0, greedy match, as ours; above it,
not Leviathan et al.'s p/q test), and its drafts are the draft model's greedy tokens. Its weights are
quantized, so its cells are audited against its own AR on the same file, never against ours.
"""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from specbench.decoding.generation import Generation
from specbench.engines import Backend, CellView, EngineModel, Problem
from specbench.engines import llamacpp_client as client
from specbench.engines import llamacpp_convert as convert
from specbench.engines import llamacpp_eagle3 as eagle3
from specbench.engines import llamacpp_server as servers
from specbench.engines.accounting import (
    AccountingError,
    SpecCounters,
    engine_figures,
    inter_token_latencies,
    steps_from_marks,
    target_forwards,
)
from specbench.engines.llamacpp_gguf import GGUFFacts, model_problem, read_facts, vocabulary_problem
from specbench.engines.load import Server
from specbench.errors import SpecbenchError, expand_home
from specbench.methods import BASELINE, ParamSpec
from specbench.sources import SOURCES, source_of

ENGINE = "llama.cpp"
LOAD_SLOTS = 4  # the server's slots under load when engine_options.parallel is not given
GGUF_FIX = (
    "use a .gguf file, a local directory holding one, smollm2-135m-instruct or a qwen2.5-coder alias, "
    "or name the model's GGUF in engine_options.gguf"
)

OPTIONS = {
    "server": ParamSpec(str, None, "the llama-server binary (default: see the module's help)"),
    "gguf": ParamSpec(
        str,
        None,
        "the GGUF to serve instead of the source's own: a path, or bf16 for the BF16 conversion of the "
        "weights specbench loads (llama.cpp's converter, once, into the specbench cache)",
    ),
    "draft_gguf": ParamSpec(
        str, None, "a model drafter's GGUF instead of its source's own: a path, or bf16 (its conversion)"
    ),
    "threads": ParamSpec(int, None, "llama.cpp's threads (--threads; default: the physical cores)", 1),
    "ctx_size": ParamSpec(int, None, "the context in tokens (--ctx-size; default: the model's)", 16),
    "batch_size": ParamSpec(int, None, "the logical batch in tokens (--batch-size)", 1),
    "parallel": ParamSpec(int, None, f"server slots (--parallel): 1 for run, {LOAD_SLOTS} under load", 1),
    "start_timeout_s": ParamSpec(float, 600.0, "seconds a server may take to load its GGUF and answer", 1),
    "request_timeout_s": ParamSpec(float, 3600.0, "seconds one request may take before it is abandoned", 1),
    "audit_sampling": ParamSpec(
        bool, False, "at T > 0, re-score each output with specbench's copy of the target (a PIT test)"
    ),
    "max_servers": ParamSpec(
        int, 4, "servers kept running at once, one per speculative setting (least recently used stopped)", 1
    ),
}
# what the target's sampler does with a draft (the record's rejection_sample_method)
VERIFICATION = "sample-match"


def _speculation(cell: CellView) -> tuple[dict | None, Problem]:
    if cell.method == BASELINE:
        return None, None
    if cell.method != "speculative":
        return eagle3.speculation(cell)
    if cell.params.get("lenience", 1.0) != 1.0:
        return None, ("params.lenience", "llama.cpp's verification has no lenience", "use lenience: 1")
    k = cell.params["k"]
    if cell.drafter_kind == "statistical":
        return _ngram(cell, k)
    kind = SOURCES.get(cell.drafter_kind) if cell.drafter_kind else None
    if kind is None or kind.gguf is None:
        return None, (
            "drafter",
            f"llama.cpp loads a draft model from a GGUF file, and {cell.drafter!r} ({cell.drafter_kind}) "
            "has none",
            "use a .gguf drafter, a local directory holding one, smollm2-135m-instruct or a qwen2.5-coder "
            "alias",
        )
    # n-min 0 and p-min 0: the exact algorithm drafts k tokens at every step, whatever their probability
    return {
        "spec_type": "draft-simple",
        "draft_source": cell.drafter_source,
        "n_max": k,
        "n_min": 0,
        "p_min": 0.0,
    }, None


def _ngram(cell: CellView, k: int) -> tuple[dict | None, Problem]:
    """A prompt-lookup drafter as llama.cpp's ngram-simple, or the field it cannot map."""
    options = cell.drafter_options
    if options.get("bigram") or options.get("variant", "specbench") != "specbench":
        return None, (
            "drafter",
            "llama.cpp's n-gram drafters have no bigram fill or reference variant",
            "use a plain prompt-lookup drafter (options: max_ngram only)",
        )
    n = options.get("max_ngram")
    if n is None:
        return None, (
            "drafter",
            f"{cell.drafter!r} matches n-grams of any length; llama.cpp's ngram-simple looks up one length",
            f"set models.{cell.drafter}.options.max_ngram (llama.cpp's default is 12; HF uses 2-4)",
        )
    copied = min(k, options.get("max_copy") or k)
    if copied < n:
        return None, (
            "params.k",
            f"llama.cpp's ngram-simple drafts no fewer tokens than the {n} it looks up, so a draft of "
            f"{copied} would never be made",
            f"use k >= {n}, or max_ngram <= {copied}",
        )
    return {"spec_type": "ngram-simple", "size_n": n, "n_max": copied}, None


def _source_problem(source: str, options: dict) -> Problem:
    kind = source_of(source)
    if options.get("gguf") or kind.gguf is not None:
        return None
    return "source", f"llama.cpp serves a GGUF file, and {source!r} ({kind.kind}) has none", GGUF_FIX


def chosen_gguf(source: str, option: str | None, where: str) -> Path | None:
    """The GGUF an ``engine_options`` entry names for ``source``'s weights: a path, or ``bf16`` for their
    BF16 conversion (made once, :mod:`specbench.engines.llamacpp_convert`); None when it names none."""
    if not option:
        return None
    if option.lower() == convert.BF16:
        return convert.bf16_gguf(source, where)
    return expand_home(option, where)


def gguf_of(source: str, where: str) -> Path:
    """The GGUF file of a recipe source's weights (downloaded first where its kind ships one)."""
    kind = source_of(source)
    if kind.gguf is None:
        raise SpecbenchError(
            where, f"llama.cpp reads GGUF files, and {source!r} ({kind.kind}) has none", GGUF_FIX
        )
    return Path(kind.gguf(source, where))


@dataclass
class Running:
    """A started server and what it started as (the rows' engine record)."""

    server: Server
    started: dict = field(default_factory=dict)


class LlamaCppTarget(EngineModel):
    """A recipe model served by llama-server: a cell's target. One server per speculative setting the
    cells ask for, kept running (an interleaved run alternates cells row by row, and a server's
    speculative type is fixed when it starts), at most ``max_servers`` at once."""

    engine = ENGINE

    def __init__(self, name: str, gguf: GGUFFacts, tokenizer, device, options: dict, params: int, dtype: str):
        self.name, self.gguf, self.tokenizer, self.device = name, gguf, tokenizer, device
        self.options, self.num_parameters = dict(options), params
        self.directory = str(gguf.path)  # the model's name in load's requests
        # the recipe's dtype, which a resume checks; the server computes in the GGUF's (describe())
        self.serving_dtype = dtype
        self.origin = f"llama.cpp:{gguf.path}"
        self.where = f"models.{name}.engine"
        self._servers: dict[str, Running] = {}  # speculative config (JSON) -> its server
        self._configs: dict[str, dict | None] = {}  # a cell's settings -> as resolved
        self._last: Running | None = None

    def speculative_config(self, spec: dict | None, drafter) -> dict | None:
        """The cell's settings as the server takes them: the drafter's GGUF file found and its vocabulary
        checked against the target's (llama.cpp verifies a draft id by id)."""
        key = json.dumps(spec, sort_keys=True)
        if key not in self._configs:
            config = dict(spec) if spec else None
            if config and config["spec_type"] == "draft-simple":
                name = getattr(drafter, "name", "drafter")
                source = config.pop("draft_source")
                path = chosen_gguf(source, self.options.get("draft_gguf"), f"{self.where}_options.draft_gguf")
                if path is None:
                    path = gguf_of(source, f"models.{name}.source")
                draft = read_facts(path, f"models.{name}.source")
                problem = vocabulary_problem(self.gguf, draft)
                if problem:
                    raise SpecbenchError(
                        f"models.{name}.source",
                        f"the drafter's GGUF vocabulary is not the target's: {problem}",
                        "use a drafter of the target's family (the same tokenizer)",
                    )
                config |= {"model_draft": str(path), "draft_file_type": draft.file_type}
            elif config and config["spec_type"] == eagle3.SPEC_TYPE:
                config.pop("draft_source")  # the head's digest names it in the config instead
                config |= eagle3.head_config(self, drafter, f"models.{drafter.name}")
            self._configs[key] = config
        return self._configs[key]

    def check_head(self, checkpoint, aux, where: str) -> None:
        """Refuse, as it loads, an EAGLE-3 head for this target that draft-eagle3 cannot run."""
        eagle3.check_head(checkpoint, aux, self.weights_folder, where)

    def prepare(self, spec: dict | None, drafter=None) -> float:
        """Start the server for ``spec`` unless it runs; the seconds starting took (the GGUF's load)."""
        return self._running(self.speculative_config(spec, drafter))[1]

    def _running(self, config: dict | None) -> tuple[Running, float]:
        key = json.dumps(config, sort_keys=True)
        running = self._servers.pop(key, None)
        if running is not None and running.server.alive():
            self._servers[key] = running  # most recently used last
            return running, 0.0
        if running is not None:
            running.server.stop()
        while len(self._servers) >= self.options.get("max_servers", 4):
            self._servers.pop(next(iter(self._servers))).server.stop()
        binary = servers.server_or_error(self.options, self.where)
        parallel = self.options.get("parallel") or 1

        def command_at(port: int) -> list[str]:
            return servers.command(binary, str(self.gguf.path), config, self.options, port, parallel)

        timeout = self.options.get("start_timeout_s", 600.0)
        server, seconds = servers.start(command_at, self.where, f"llama-server-{self.name}", timeout)
        settings = {"server": binary, "parallel": parallel, "command": list(server.process.args)}
        settings |= {name: self.options[name] for name in servers.FLAGS if self.options.get(name) is not None}
        started = {
            "version": servers.version(binary),
            "build_info": client.properties(server.port).get("build_info"),
            "start_s": seconds,
            "settings": settings | (config or {}),
        }
        self._servers[key] = running = Running(server, started)
        return running, seconds

    def process_groups(self) -> list[int]:
        return [r.server.process.pid for r in self._servers.values() if r.server.alive()]

    def close(self) -> None:
        for running in self._servers.values():
            running.server.stop()
        self._servers.clear()

    def generate(self, request, spec: dict | None, drafter=None) -> Generation:
        """One request, alone on the server of its cell's speculative setting."""
        config = self.speculative_config(spec, drafter)
        running, restarted = self._running(config)  # restarted: 0 unless the server had stopped
        self._last = running
        body = client.request_body(request)
        streamed, full = self._ask(running, body)
        prompt = int(request.prompt_ids.shape[0])
        try:
            generation = generation_from_stream(
                streamed,
                full,
                prompt,
                list(request.eos_token_id),
                self.name,
                config,
                running.started,
                getattr(drafter, "name", None),
            )
        except AccountingError as error:
            raise SpecbenchError(
                self.where,
                f"llama.cpp's counters do not fit its output ({error})",
                "run engine cells one request at a time (no other client on the server), on a llama-server "
                "that streams timings_per_token",
            ) from None
        if restarted:
            generation.engine_record["restart_s"] = restarted
        return generation

    def _ask(self, running: Running, body: dict) -> tuple[client.Streamed, list[int] | None]:
        """The streamed answer, and the whole output asked again (untimed, greedy: the same tokens) when
        the stream held some token back (one ending inside a UTF-8 character); None when it held none."""
        server, timeout = running.server, self.options.get("request_timeout_s", 3600.0)
        try:
            streamed = client.stream(server.port, body, timeout)
            sent = sum(len(chunk.tokens) for chunk in streamed.chunks)
            if sent >= int(streamed.final.get("tokens_predicted", sent)):
                return streamed, None
            return streamed, [int(t) for t in client.complete(server.port, body, timeout).get("tokens", [])]
        except client.RequestTimedOut:
            self._drop(running)
            raise SpecbenchError(
                self.where,
                f"llama-server did not finish a request in {timeout:.0f} s",
                f"raise engine_options.request_timeout_s, or read {server.log_path}; finished rows are "
                "kept: run again with --resume",
            ) from None
        except client.ServerGone as error:
            try:  # a server that died closed the connection a moment before it is reaped
                how = f"exited (code {server.process.wait(timeout=5)})"
            except subprocess.TimeoutExpired:
                how = "stopped answering"
            self._drop(running)
            raise SpecbenchError(
                self.where,
                f"llama-server {how} during a request ({error}): {servers.last_error(server)!r}",
                f"read {server.log_path}; fix the cause and run again with --resume (finished rows are kept)",
            ) from None
        except client.RequestFailed as error:
            raise SpecbenchError(
                self.where,
                f"llama-server refused the request: {error}",
                "give engine_options.ctx_size room for the prompt and max_new_tokens, or read "
                f"{server.log_path}",
            ) from None

    def _drop(self, running: Running) -> None:
        running.server.stop()
        self._servers = {k: r for k, r in self._servers.items() if r is not running}

    def describe(self) -> dict:
        last = self._last.started if self._last is not None else {}
        return {
            "engine": ENGINE,
            "version": last.get("version"),
            "build_info": last.get("build_info"),
            "settings": last.get("settings"),
            **self.gguf.describe(),
        }


def generation_from_stream(
    streamed: client.Streamed,
    full: list[int] | None,
    prompt: int,
    eos: list[int],
    name: str,
    spec: dict | None,
    started: dict,
    drafter: str | None = None,
) -> Generation:
    """A streamed answer (and the whole output, where the stream held tokens back) as a
    :class:`Generation` with its engine record."""
    sent = [token for chunk in streamed.chunks for token in chunk.tokens]
    sent_marks = [chunk.marks for chunk in streamed.chunks for _ in chunk.tokens]
    sent_at = [chunk.at for chunk in streamed.chunks for _ in chunk.tokens]
    if spec and None in sent_marks:
        raise AccountingError("tokens came without timings, so no step can be told apart")
    sent_marks = [mark or (0, 0) for mark in sent_marks]
    tokens, marks, arrivals = sent, list(sent_marks), sent_at
    if full is not None:
        where = _positions(sent, full)
        tokens = list(full)
        marks = [sent_marks[j] if j is not None else None for j in where]
        arrivals = []
        for i, j in enumerate(where):  # a token held back arrived with the next one sent, or the end
            j = j if j is not None else next((k for k in where[i:] if k is not None), None)
            arrivals.append(sent_at[j] if j is not None else streamed.walltime)
    timings = streamed.final.get("timings") or {}
    final = client.marks(timings) or (0, 0)
    if marks and marks[-1] is not None and marks[-1] != final:
        raise AccountingError(f"the last token came with counters {marks[-1]}, the request's give {final}")
    # llama.cpp stops at its vocabulary's end-of-generation tokens; the request's own EOS ids end it too
    cut = next((i + 1 for i, token in enumerate(tokens) if token in eos), len(tokens))
    tokens, marks, arrivals = tokens[:cut], marks[:cut], arrivals[:cut]
    steps, ends = steps_from_marks(marks, final, spec["n_max"] if spec else None)
    ttft, itl = inter_token_latencies([arrivals[end - 1] for end in ends], ends)
    forwards = {
        name: target_forwards(steps, prompt, streamed.walltime)
    }  # the server's whole time (drafting included)
    if spec and spec["spec_type"] in ("draft-simple", eagle3.SPEC_TYPE):
        drafted = sum(d for d, _ in steps)  # a draft-model (or head) pass per proposed token
        forwards[drafter or "drafter"] = {
            "forward_passes": drafted,
            "tokens_scored": drafted,
            "encoder_passes": 0,
            "seconds": 0.0,  # inside the server's time
        }
    counters = SpecCounters.from_llamacpp(timings, steps)
    finish = streamed.final.get("stop_type") or ("eos" if streamed.final.get("stopped_eos") else "limit")
    record = {
        "engine": ENGINE,
        "version": started.get("version"),
        "build_info": started.get("build_info"),
        "settings": started.get("settings"),
        "speculative_config": spec,
        "rejection_sample_method": VERIFICATION,
        "finish_reason": finish,
        "tpot": (streamed.walltime - ttft) / max(len(tokens) - 1, 1) if tokens else math.nan,
        "itl": itl,
        "timings": {key: timings[key] for key in sorted(timings) if isinstance(timings[key], int | float)},
        "held_back_tokens": sum(1 for mark in marks if mark is None),
        **engine_figures(counters, ENGINE),
    }
    if counters.draft_tokens:  # llama.cpp's own figure: the share of drafted tokens it accepted
        record[f"{ENGINE}_acceptance_rate"] = counters.accepted / counters.draft_tokens
    stopped = bool(tokens) and (tokens[-1] in eos or finish == "eos")
    return Generation(tokens, streamed.walltime, ttft, steps, forwards, stopped, engine_record=record)


def _positions(sent: list[int], full: list[int]) -> list[int | None]:
    """For each token of the whole output, its index among the tokens the stream sent (None: held
    back); the sent tokens must be the output less the held ones, in order."""
    where, j = [], 0
    for token in full:
        if j < len(sent) and sent[j] == token:
            where.append(j)
            j += 1
        else:
            where.append(None)
    if j != len(sent):
        raise AccountingError("the streamed tokens are not the output the server gave when asked again")
    return where


def _open(request, served) -> LlamaCppTarget:
    where = f"models.{request.name}"
    options = dict(request.engine_options)
    module, tokenizer = served.weights.module, served.weights.tokenizer
    if options.get("gguf"):
        field_name = f"{where}.engine_options.gguf"
        path = chosen_gguf(request.source, options["gguf"], field_name)
    else:
        field_name = f"{where}.source"
        path = gguf_of(request.source, field_name)
    facts = read_facts(path, field_name)
    problem = model_problem(facts, module.config, len(tokenizer))
    if problem:
        raise SpecbenchError(
            field_name,
            f"{path} is not the recipe's model {request.source}: {problem}",
            "name the GGUF file of these weights (the same layers, width and vocabulary)",
        )
    params = sum(p.numel() for p in module.parameters())
    target = LlamaCppTarget(request.name, facts, tokenizer, served.device, options, params, served.dtype)
    target.dtype_reason = (
        f"llama.cpp computes in the GGUF's types ({facts.file_type}); {served.dtype} is specbench's copy, "
        f"loaded for the tokenizer ({served.dtype_reason})"
    )
    target.reference = module if options.get("audit_sampling") else None
    target.weights_folder = eagle3.target_folder(request.source)  # what an EAGLE-3 head converts with
    return target


def _serve(target: LlamaCppTarget, spec: dict | None, drafter, port: int) -> tuple[list[str], dict]:
    """llama-server for load: the cell's speculative setting, ``parallel`` slots (default 4) and its
    ``/metrics``, whose speculative counters load differences around each level."""
    config = target.speculative_config(spec, drafter)
    binary = servers.server_or_error(target.options, target.where)
    parallel = target.options.get("parallel") or LOAD_SLOTS
    return servers.command(binary, str(target.gguf.path), config, target.options, port, parallel), {}


BACKEND = Backend(
    ENGINE,
    "llama.cpp's llama-server on the model's GGUF file, one request at a time; the same server for load",
    OPTIONS,
    _speculation,
    _open,
    servers.available,
    _serve,
    source_problem=_source_problem,
    own_reference=True,
    load_counters={
        "drafts": "llamacpp:spec_decode_num_drafts_total",
        "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
        "accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
    },
    load_body={"return_tokens": True, "verbose": True},  # its OpenAI route sends ids in __verbose only
)
