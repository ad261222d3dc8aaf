"""llama.cpp as a backend (specbench.engines.llamacpp): the cell mapping and the recipe's engine fields,
the steps llama.cpp's per-token counters give, and whole runs through specbench's real backend driving
a stand-in llama-server (tests/fixtures/stub_llamacpp: the same flags and HTTP answers, over a
deterministic pure-Python model read from a GGUF file, speculation counted as llama.cpp counts it and
every request's steps logged), faults included. The real server runs in tests/test_llamacpp_real.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tiny_recipes
import yaml
from typer.testing import CliRunner

from specbench.cli import app
from specbench.engines import BACKENDS, ENGINE_NAMES, CellView
from specbench.engines.accounting import AccountingError, steps_from_marks
from specbench.engines.llamacpp import _speculation, generation_from_stream
from specbench.engines.llamacpp_client import Chunk, Streamed
from specbench.errors import SpecbenchError
from specbench.recipe import engine_cell_view, load_recipe, parse_recipe

STUB = Path(__file__).parent / "fixtures" / "stub_llamacpp" / "llama_server.py"


def test_the_schema_lists_llama_cpp():
    assert "llama.cpp" in ENGINE_NAMES and set(ENGINE_NAMES) == set(BACKENDS)
    assert BACKENDS["llama.cpp"].own_reference and not BACKENDS["vllm"].own_reference


# -- steps from llama.cpp's running counters ---------------------------------------------------------


def test_counters_reported_with_each_token_locate_every_step():
    # prefill; a step of 4 drafts, 2 accepted (3 tokens); a step that drafted nothing; 4 drafts all
    # accepted (5 tokens); a last step of 4 drafts, 3 accepted, cut at a stop after 2 tokens
    marks = [(0, 0), (4, 2), (4, 2), (4, 2), (4, 2), (8, 6), (8, 6), (8, 6), (8, 6), (8, 6), (12, 9), (12, 9)]
    steps, ends = steps_from_marks(marks)
    assert steps == [(0, 0), (4, 2), (0, 0), (4, 4), (4, 3)]
    assert ends == [1, 4, 5, 10, 12]


def test_a_token_held_back_joins_the_step_it_belongs_to():
    # "é" split over two tokens: held at the end of a step (it completes that step) ...
    marks = [(0, 0), (3, 1), None, (6, 2), (6, 2)]
    assert steps_from_marks(marks) == ([(0, 0), (3, 1), (3, 1)], [1, 3, 5])
    # ... and at the start of one (the step before it is whole, so it opens the next)
    marks = [(0, 0), (3, 0), None, (6, 2), (6, 2)]
    assert steps_from_marks(marks) == ([(0, 0), (3, 0), (3, 2)], [1, 2, 5])
    # the last token held back, in a step the request's final counters give
    assert steps_from_marks([(0, 0), (3, 0), None], (6, 1)) == ([(0, 0), (3, 0), (3, 1)], [1, 2, 3])
    # a held token that was a whole step (3 drafted, none accepted), its counters never seen: the next
    # token's grew by 6 > k = 3, so two steps ended there
    marks = [(0, 0), None, (6, 1), (6, 1)]
    assert steps_from_marks(marks, k=3) == ([(0, 0), (3, 0), (3, 1)], [1, 2, 4])


def test_counters_that_do_not_fit_are_refused():
    with pytest.raises(AccountingError, match="first token"):
        steps_from_marks([(3, 1)])
    with pytest.raises(AccountingError, match="inside a step"):  # a step of 2 accepted cut by new counters
        steps_from_marks([(0, 0), (4, 2), (8, 3)])
    with pytest.raises(AccountingError, match="not one step's draft"):  # more accepted than drafted
        steps_from_marks([(0, 0), (2, 3)])


def _streamed(tokens, marks, final, stop_type="limit") -> Streamed:
    chunks = [Chunk(0.1 * (i + 1), [t], m) for i, (t, m) in enumerate(zip(tokens, marks, strict=True))]
    timings = {"prompt_n": 5, "predicted_n": len(tokens)}
    if final[0]:
        timings |= {"draft_n": final[0], "draft_n_accepted": final[1]}
    return Streamed(chunks, {"stop": True, "stop_type": stop_type, "timings": timings}, 1.0)


def test_a_stream_becomes_a_generation_with_llama_cpps_figures_beside_ours():
    spec = {"spec_type": "draft-simple", "n_max": 4, "n_min": 0, "p_min": 0.0}
    marks = [(0, 0), (4, 3), (4, 3), (4, 3), (4, 3), (8, 4), (8, 4), (8, 4)]
    streamed = _streamed([10, 11, 12, 13, 14, 15, 16, 17], marks, (8, 4))
    generation = generation_from_stream(streamed, None, 5, [99], "t", spec, {"version": "1"}, "d")
    assert generation.steps == [(0, 0), (4, 3), (4, 1), (0, 0)]
    assert generation.accepted_per_step == 8 / 4  # ours: every pass, the prefill included
    record = generation.engine_record
    assert record["llama.cpp_mean_acceptance_length"] == 1 + 4 / 2  # llama.cpp's: drafting passes only
    assert record["llama.cpp_acceptance_rate"] == 4 / 8 and record["llama.cpp_num_drafts"] == 2
    assert record["rejection_sample_method"] == "sample-match" and record["finish_reason"] == "limit"
    forwards = generation.forwards
    assert forwards["t"]["forward_passes"] == 4 and forwards["d"]["forward_passes"] == 8
    # tokens fed -> [passes, context summed]: the 5-token prompt, two verifications of 4 drafts + 1,
    # and a pass of one token
    assert forwards["t"]["shapes"] == {"5": [3, 14], "1": [1, 11]}
    assert generation.ttft == pytest.approx(0.1)
    assert record["itl"] == pytest.approx([0.4, 0.2, 0.1])  # one gap per committing step
    # the request's own EOS ends the output even where llama.cpp went on, the step cut there
    cut = generation_from_stream(streamed, None, 5, [12], "t", spec, {}, "d")
    assert cut.tokens == [10, 11, 12] and cut.steps == [(0, 0), (4, 3)] and cut.stopped_by_eos


def test_a_stream_that_held_tokens_back_is_completed_from_the_whole_output():
    marks = [(0, 0), (3, 1), (6, 2), (6, 2)]  # token 21 held back: it ended inside a character
    streamed = _streamed([20, 22, 23, 24], marks, (6, 2))
    spec = {"spec_type": "ngram-simple", "size_n": 2, "n_max": 3}
    generation = generation_from_stream(streamed, [20, 21, 22, 23, 24], 5, [99], "t", spec, {}, None)
    assert generation.tokens == [20, 21, 22, 23, 24]
    assert generation.steps == [(0, 0), (3, 1), (3, 1)]
    assert generation.engine_record["held_back_tokens"] == 1
    with pytest.raises(AccountingError, match="not the output"):
        generation_from_stream(streamed, [20, 21, 23, 24], 5, [99], "t", spec, {}, None)
    with pytest.raises(AccountingError, match="without timings"):
        generation_from_stream(_streamed([20], [None], (0, 0)), None, 5, [99], "t", spec, {}, None)


# -- the cell mapping and the recipe ------------------------------------------------------------------


def _view(method="speculative", k=4, kind="local", **options) -> CellView:
    return CellView(method, {"k": k}, "d", kind, options, True, "/m")


def test_cells_map_to_llama_cpps_speculative_types():
    assert _speculation(CellView("autoregressive", {}, None, None, {}, True)) == (None, None)
    spec, problem = _speculation(_view(k=3))
    assert problem is None and spec == {
        "spec_type": "draft-simple",
        "draft_source": "/m",
        "n_max": 3,
        "n_min": 0,
        "p_min": 0.0,
    }
    spec, problem = _speculation(_view(kind="statistical", max_ngram=3))
    assert spec == {"spec_type": "ngram-simple", "size_n": 3, "n_max": 4} and problem is None


@pytest.mark.parametrize(
    ("view", "field", "says"),
    [
        (_view(method="eagle"), "drafter", "draft-eagle3 runs EAGLE-3 heads"),
        (_view(method="medusa"), "method", "no method 'medusa'"),
        (_view(kind="statistical"), "drafter", "max_ngram"),
        (_view(kind="statistical", max_ngram=4, k=3), "params.k", "use k >= 4"),
        (_view(kind="statistical", max_ngram=2, bigram="b.json"), "drafter", "bigram"),
        (_view(kind="tiny"), "drafter", "GGUF"),
        (_view(kind="medusa"), "drafter", "GGUF"),
    ],
)
def test_cells_llama_cpp_cannot_run_are_refused_naming_the_field(view, field, says):
    spec, problem = _speculation(view)
    assert spec is None and problem[0] == field and says in problem[1] + problem[2]


def _build(root: Path) -> None:
    """A tiny target and drafter on disk, each with a GGUF the stand-in reads (its own seed)."""
    from specbench.models.tiny import build_tiny

    for name, seed in (("model", 0), ("draft", 1)):
        model, tokenizer = build_tiny("tiny-llama", seed=3 + seed)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        write_gguf(root / name / f"{name}.gguf", seed=seed)


def write_gguf(path: Path, *, seed: int = 0, layers: int = 2, width: int = 32, renamed: int | None = None):
    """A GGUF file of metadata alone: the tiny model's shape and byte vocabulary, and the stand-in's seed."""
    from gguf import GGUFWriter, LlamaFileType

    from specbench.models.tiny import byte_tokenizer

    tokens = byte_tokenizer().convert_ids_to_tokens(list(range(260)))
    if renamed is not None:
        tokens[renamed] = "<renamed>"
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("stand-in")
    writer.add_block_count(layers)
    writer.add_embedding_length(width)
    writer.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_eos_token_id(257)
    writer.add_uint32("stand_in.seed", seed)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("llamacpp-models")
    _build(root)
    return root


@pytest.fixture
def served(models, tmp_path, monkeypatch) -> Path:
    """The stand-in as the llama-server the backend finds, logging its requests and processes."""
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("SPECBENCH_LLAMA_SERVER", str(wrapper))
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(tmp_path / "no-data"))
    monkeypatch.setenv("STUB_LLAMA_LOG", str(tmp_path / "requests.jsonl"))
    monkeypatch.setenv("STUB_LLAMA_PIDS", str(tmp_path / "pids"))
    return tmp_path


def _recipe(models: Path, **changes) -> dict:
    recipe = tiny_recipes.recipe(
        "llamacpp",
        {
            "served": {
                "source": str(models / "model"),
                "dtype": "float32",
                "engine": "llama.cpp",
                "engine_options": {"start_timeout_s": 30, "request_timeout_s": 60},
            },
            "draft": {"source": str(models / "draft"), "dtype": "float32"},
            "lookup": {"source": "prompt-lookup", "options": {"max_ngram": 2}},
        },
        [
            tiny_recipes.ar("ar", "served"),
            tiny_recipes.speculative("draft", 3, name="sd", target="served"),
            tiny_recipes.speculative("lookup", 3, name="ngram", target="served"),
        ],
        max_new_tokens=24,
    )
    for path, value in changes.items():
        node = recipe
        *parents, last = path.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return recipe


@pytest.mark.parametrize(
    ("change", "where", "says"),
    [
        ({"models.served.engine_options": {"thread": 2}}, "engine_options.thread", "takes no option"),
        ({"models.served.engine_options": {"parallel": 0}}, "engine_options.parallel", "below 1"),
        ({"models.served.source": "tiny-llama"}, "models.served.source", "has none"),
        ({"models.served.engine_options": {"max_servers": "2"}}, "engine_options.max_servers", "not int"),
        ({"methods.2.params": {"k": 1}}, "methods[2].params.k", "use k >= 2"),
        ({"methods.1.params": {"k": 3, "lenience": 2.0}}, "methods[1].params.lenience", "no lenience"),
    ],
)
def test_engine_fields_are_checked_when_the_recipe_is_read(models, tmp_path, change, where, says):
    with pytest.raises(SpecbenchError) as error:
        parse_recipe(_recipe(models, **change), tmp_path / "r.yaml")
    assert where in str(error.value) and says in str(error.value)


def test_a_source_without_gguf_serves_through_engine_options_gguf(models, tmp_path):
    recipe = _recipe(models, **{"models.served.source": "tiny-llama"})
    recipe["models"]["served"]["engine_options"]["gguf"] = str(models / "model" / "model.gguf")
    parsed = parse_recipe(recipe, tmp_path / "r.yaml")
    assert parsed.reference_model("served") == "served"  # quantized weights: its own AR audits it


def test_the_shipped_recipe_maps_onto_llama_cpp():
    recipe = load_recipe(Path(__file__).parents[1] / "recipes" / "engines" / "smollm2_llamacpp.yaml")
    specs = {
        cell.method_name: BACKENDS["llama.cpp"].speculation(engine_cell_view(recipe, cell))[0]
        for cell in recipe.cells()
        if recipe.models[cell.target].engine == "llama.cpp"
    }
    assert specs["llamacpp-ar"] is None
    assert specs["llamacpp-ngram"] == {"spec_type": "ngram-simple", "size_n": 3, "n_max": 4}
    small = specs["llamacpp-small"]
    assert small["draft_source"] == "distilled:smollm2-135m-instruct/small" and small["n_max"] == 2


def test_engine_options_enter_fingerprints_only_when_given(models, tmp_path):
    one = parse_recipe(_recipe(models), tmp_path / "r.yaml")
    options = {"start_timeout_s": 30, "request_timeout_s": 60, "threads": 2}
    two = parse_recipe(_recipe(models, **{"models.served.engine_options": options}), tmp_path / "r.yaml")
    first, second = ({c.method_name: c.fingerprint(r) for c in r.cells()} for r in (one, two))
    assert first["ar"] != second["ar"]


# -- whole runs through the backend and the stand-in -----------------------------------------------


def _run(root: Path, recipe: dict, *extra):
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return CliRunner().invoke(app, ["run", str(path), "-o", str(root / "out"), *extra])


def _rows(root: Path) -> list[dict]:
    path = root / "out" / "examples.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie left for an init that does not reap is not running)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _servers_left(root: Path) -> list[int]:
    """The stand-in servers of this test still running."""
    path = root / "pids"
    return [pid for pid in map(int, path.read_text().split()) if _alive(pid)] if path.exists() else []


def test_a_run_counts_llama_cpps_steps_exactly_and_audits_against_its_own_ar(served, models):
    result = _run(served, _recipe(models))
    assert result.exit_code == 0, result.output
    rows = _rows(served)
    assert len(rows) == 6 and {r["engine"] for r in rows} == {"llama.cpp"}
    logged = [json.loads(line) for line in (served / "requests.jsonl").read_text().splitlines()]
    by = {(r["cell"], r["example_id"]): r for r in rows}
    for row in rows:
        steps = [tuple(step) for step in row["steps"]]
        # the stand-in's own steps, found from the counters it streamed
        kind = {"ar": None, "sd": "draft-simple", "ngram": "ngram-simple"}[row["cell"].split("-")[0]]
        assert steps in [[tuple(s) for s in line["steps"]] for line in logged if line["spec_type"] == kind]
        assert row["forwards"]["served"]["forward_passes"] == len(steps)
        record = row["engine_record"]
        assert record["engine"] == "llama.cpp" and record["version"] == "0 (stand-in)"
        assert record["build_info"] == "b0-stand-in"
        assert record["llama.cpp_num_drafts"] == sum(1 for d, _ in steps if d)
        assert record["timings"].get("draft_n", 0) == sum(d for d, _ in steps)
        if row["cell"] != "ar":  # lossless: greedy speculation reproduces llama.cpp's own AR
            ar = by["ar", row["example_id"]]
            assert row["output_ids"] == ar["output_ids"] and row["divergence_class"] == "identical"
    sd = [r for r in rows if r["cell"].startswith("sd")]
    drafted = sum(d for r in sd for d, _ in r["steps"])
    assert 0 < sum(a for r in sd for _, a in r["steps"]) < drafted  # drafts partly accepted
    assert sum(r["forwards"]["draft"]["forward_passes"] for r in sd) == drafted
    assert sd[0]["engine_record"]["speculative_config"]["model_draft"].endswith("draft.gguf")
    environment = json.loads((served / "out" / "environment.json").read_text())
    model = environment["models"]["served"]
    assert model["serving"]["engine"] == "llama.cpp" and model["serving"]["file_type"] == "Q8_0"
    assert model["dtype"] == "float32" and "Q8_0" in model["dtype_reason"]  # the tokenizer's copy
    report = CliRunner().invoke(app, ["report", str(served / "out")])
    assert report.exit_code == 0 and "ngram" in report.output, report.output
    assert _servers_left(served) == []


def test_tokens_held_back_inside_a_character_keep_the_counts(served, models, monkeypatch):
    """Where the stream held a token back ("é" as two byte tokens), the output comes whole from the
    request asked again, and the steps keep the server's totals and its number of target passes."""
    monkeypatch.setenv("STUB_LLAMA_UTF8", "1")
    recipe = _recipe(models)
    del recipe["models"]["lookup"]
    recipe["methods"] = recipe["methods"][:2]
    result = _run(served, recipe)
    assert result.exit_code == 0, result.output
    rows = _rows(served)
    assert sum(r["engine_record"]["held_back_tokens"] for r in rows) > 0
    logged = [json.loads(line) for line in (served / "requests.jsonl").read_text().splitlines()]
    by = {(r["cell"], r["example_id"]): r for r in rows}
    for row in rows:
        kind = None if row["cell"] == "ar" else "draft-simple"
        runs = [line["steps"] for line in logged if line["spec_type"] == kind]
        totals = [(len(s), sum(d for d, _ in s), sum(a for _, a in s)) for s in runs]
        steps = row["steps"]
        assert (len(steps), sum(d for d, _ in steps), sum(a for _, a in steps)) in totals
        assert row["output_ids"] == by["ar", row["example_id"]]["output_ids"]
    assert _servers_left(served) == []


def test_a_missing_server_is_refused_before_the_first_row(served, models, monkeypatch):
    import shutil

    monkeypatch.delenv("SPECBENCH_LLAMA_SERVER")
    if shutil.which("llama-server", path="/usr/bin:/bin"):
        pytest.skip("a llama-server is installed system-wide")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(served)  # no ./.llamacpp/bin/llama-server here
    result = _run(served, _recipe(models))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "models.served.engine" in result.output and "make install-llamacpp" in result.output
    assert _rows(served) == []


def test_a_server_that_exits_at_start_is_one_line_quoting_its_log(served, models, monkeypatch):
    monkeypatch.setenv("STUB_LLAMA_FAIL_START", "tensor 'output.weight' has wrong shape")
    result = _run(served, _recipe(models))
    assert result.exit_code == 2, result.output
    assert "llama-server exited (code 1) before it opened port" in result.output
    assert "error loading model: tensor 'output.weight' has wrong shape" in result.output
    assert _servers_left(served) == []


def test_a_port_taken_at_each_try_is_one_line(served, models, monkeypatch):
    with socket.socket() as holder:  # bound, not listening: the server cannot bind it, probes are refused
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        monkeypatch.setattr("specbench.engines.llamacpp_server.free_port", lambda: port)
        result = _run(served, _recipe(models))
    assert result.exit_code == 2 and f"ports {port}, {port}, {port} of 127.0.0.1 were taken" in result.output
    assert _servers_left(served) == []


def test_a_request_that_hangs_times_out_and_stops_its_server(served, models, monkeypatch):
    monkeypatch.setenv("STUB_LLAMA_HANG_ON_REQUEST", "2")  # the first row, after the warm-up
    options = {"start_timeout_s": 30, "request_timeout_s": 1}
    result = _run(served, _recipe(models, **{"models.served.engine_options": options}))
    assert result.exit_code == 2 and "did not finish a request in 1 s" in result.output, result.output
    assert "request_timeout_s" in result.output
    assert _servers_left(served) == []


def test_a_server_that_dies_keeps_the_finished_rows_and_resume_finishes(served, models, monkeypatch):
    monkeypatch.setenv("STUB_LLAMA_DIE_ON_REQUEST", "3")  # each server's 3rd request: warm-up + 2 rows
    result = _run(served, _recipe(models))
    assert result.exit_code == 2, result.output
    assert "llama-server exited (code 3) during a request" in result.output
    assert "--resume" in result.output and "Traceback" not in result.output
    kept = _rows(served)
    assert kept and _servers_left(served) == []
    monkeypatch.delenv("STUB_LLAMA_DIE_ON_REQUEST")
    result = _run(served, _recipe(models), "--resume")
    assert result.exit_code == 0, result.output
    rows = _rows(served)
    assert len(rows) == 6 and all(r in rows for r in kept)
    assert _servers_left(served) == []


def test_a_drafter_of_another_vocabulary_is_refused(served, models):
    other = served / "other-draft"
    other.mkdir()
    for path in (models / "draft").iterdir():
        if path.suffix != ".gguf":
            (other / path.name).symlink_to(path)
    write_gguf(other / "draft.gguf", seed=1, renamed=65)
    result = _run(served, _recipe(models, **{"models.draft.source": str(other)}))
    assert result.exit_code == 2 and "models.draft.source" in result.output, result.output
    assert "vocabulary is not the target's: token 65 is b'<renamed>'" in result.output
    assert _servers_left(served) == []


def test_a_gguf_of_another_model_is_refused(served, models):
    write_gguf(served / "other.gguf", layers=5)
    options = {"gguf": str(served / "other.gguf")}
    result = _run(served, _recipe(models, **{"models.served.engine_options": options}))
    assert result.exit_code == 2, result.output
    assert "engine_options.gguf" in result.output and "it has 5 layers, the recipe's model 2" in result.output
    assert _servers_left(served) == []


def test_a_server_dies_with_a_killed_driver():
    """SIGKILL, which no handler sees: the kernel stops what specbench started (PR_SET_PDEATHSIG)."""
    code = (
        "from specbench.engines.process import EngineProcess\n"
        "p = EngineProcess(['sleep', '60'], 'w', 'guarded')\n"
        "print(p.process.pid, flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(driver.stdout.readline())
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=10)
    deadline = time.time() + 10
    while time.time() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def test_a_load_level_through_the_stand_in(served, models):
    recipe = _recipe(models, load={"concurrency": [2], "requests": 2, "slo_ttft_s": 5.0})
    recipe["methods"] = recipe["methods"][:2]
    del recipe["models"]["lookup"]
    path = served / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = CliRunner().invoke(app, ["load", str(path), "-o", str(served / "load")])
    assert result.exit_code == 0, result.output
    import pandas as pd

    rows = pd.read_csv(served / "load" / "load.csv")
    assert sorted(rows.cell) == ["ar", "sd"] and (rows.completed == 2).all() and (rows.errors == 0).all()
    assert (rows[rows.cell == "sd"].drafts > 0).all() and (rows[rows.cell == "ar"].drafts == 0).all()
    # its ids come in __verbose on the OpenAI route; drafts the target keeps change no output, and the
    # quantized GGUF is its own reference (no specbench AR to check against)
    assert (rows.token_ids == 2).all() and (rows.eq_engine_checked == 2).all()
    assert (rows.eq_engine_identical == 2).all() and rows.eq_ours_checked.isna().all()
    assert _servers_left(served) == []
