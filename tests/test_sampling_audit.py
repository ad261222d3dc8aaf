"""The statistical check of sampled engine output (engines.sampling_audit): randomized PIT values are
uniform when tokens are drawn from the target's distribution at the request's temperature, and the KS
test flags a sampler at the wrong temperature, on exact rows and through a real tiny model re-scored
in one teacher-forced forward."""

from __future__ import annotations

import math

import pandas as pd
import torch
from test_llamacpp_backend import _recipe, _rows, _run, _servers_left, models, served  # noqa: F401 (fixtures)
from typer.testing import CliRunner

from specbench.cli import app
from specbench.decoding import autoregressive, speculative
from specbench.decoding.generation import Generation
from specbench.engines.sampling_audit import (
    LEVEL,
    attach,
    cell_check,
    randomized_pit,
    rescored_pit,
    uniformity,
)
from specbench.methods import Request
from specbench.models.sampling import SamplingParams
from specbench.pipeline.views.notes import sampling_note

# a 6-token vocabulary whose next-token distributions a temperature change visibly reshapes
TINY_OPTIONS = dict(vocab_size=6, init_std=0.5, hidden_size=16, layers=1, heads=2)


def test_pit_is_uniform_for_exact_draws_and_not_for_a_wrong_temperature():
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(3000, 8, generator=generator, dtype=torch.float64) * 2
    at_07 = torch.softmax(logits / 0.7, dim=-1)
    right = torch.multinomial(at_07, 1, generator=generator).squeeze(-1)
    wrong = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)
    u_right = randomized_pit(at_07, right, generator)
    assert u_right.shape == (3000,) and bool(((u_right >= 0) & (u_right <= 1)).all())
    assert uniformity(u_right.tolist())[1] > 0.01
    assert uniformity(randomized_pit(at_07, wrong, generator).tolist())[1] < LEVEL


def test_pit_of_a_point_mass_is_uniform_on_its_cell():
    probs = torch.tensor([[0.0, 1.0, 0.0]] * 4, dtype=torch.float64)
    u = randomized_pit(probs, torch.tensor([1, 1, 1, 1]), torch.Generator().manual_seed(0))
    assert torch.all((u >= 0) & (u <= 1))  # F(x-) = 0, p(x) = 1: u is the uniform noise itself


def sampled_outputs(model_factory, prompt, sampling, requests, seed):
    generator = torch.Generator().manual_seed(seed)
    return [model_factory(prompt, sampling, generator) for _ in range(requests)]


def test_rescoring_passes_exact_speculative_sampling_and_flags_the_wrong_temperature(tiny_pair):
    """specbench's own sampled SD at T = 0.7 re-scored by the target at 0.7 passes; plain sampling at
    T = 1 re-scored at 0.7 (a sampler that ignores the temperature) is flagged, with fixed seeds."""
    target, drafter = tiny_pair("tiny-llama", 1, 2, "eager", (3,), **TINY_OPTIONS)
    module = target.model
    prompt = torch.tensor([3, 4, 5, 2])
    at_07 = SamplingParams(temperature=0.7)

    def speculate(prompt, sampling, generator):
        return speculative.generate(
            target, drafter, prompt, k=3, max_new_tokens=40, sampling=sampling, generator=generator
        ).tokens

    def plain(prompt, sampling, generator):
        return autoregressive.generate(
            target, prompt, max_new_tokens=40, sampling=sampling, generator=generator
        ).tokens

    records = {}
    for name, run, sampling in (
        ("exact", speculate, at_07),
        ("wrong", plain, SamplingParams(temperature=1.0)),
    ):
        outputs = sampled_outputs(run, prompt, sampling, 40, seed=102)
        records[name] = [
            {"pit_u": rescored_pit(module, prompt, out, at_07, seed=i)} for i, out in enumerate(outputs)
        ]
    exact, wrong = cell_check(records["exact"]), cell_check(records["wrong"])
    assert exact["sampling_pit_tokens"] == 1600 and exact["sampling_flagged"] == 0, exact
    assert exact["sampling_pit_p"] > 0.01
    assert wrong["sampling_flagged"] == 1 and wrong["sampling_pit_p"] < LEVEL, wrong

    frame = pd.DataFrame(
        [
            {"dataset": "d", "cell": "vllm_sd", **exact},
            {"dataset": "d", "cell": "bad_sd", **wrong},
            {"dataset": "d", "cell": "ar"},
        ]
    )
    note = sampling_note(frame)
    assert note.startswith("! ") and "FLAGGED d bad_sd" in note and "FLAGGED d vllm_sd" not in note


def test_rescored_pit_matches_the_models_own_rows(tiny_model):
    """The teacher-forced forward gives the same u as PIT against each prefix's own forward."""
    module = tiny_model("tiny-llama", 1, **TINY_OPTIONS)
    prompt, output = torch.tensor([3, 4, 5]), [1, 4, 2, 2]
    sampling = SamplingParams(temperature=0.9, top_k=4)
    got = rescored_pit(module, prompt, output, sampling, seed=3)
    rows = []
    with torch.no_grad():
        for i in range(len(output)):
            ids = torch.cat([prompt, torch.tensor(output[:i], dtype=torch.long)])[None]
            rows.append(sampling.probs(module(ids).logits[0, -1].double()))
    expected = randomized_pit(torch.stack(rows), torch.tensor(output), torch.Generator().manual_seed(3))
    assert torch.allclose(torch.tensor(got, dtype=torch.float64), expected, atol=1e-6)


def test_attach_audits_sampled_engine_output_only(tiny_model):
    module = tiny_model("tiny-llama", 1, **TINY_OPTIONS)

    def request(temperature):
        return Request(
            torch.tensor([3, 4, 5]),
            4,
            SamplingParams(temperature=temperature),
            [],
            torch.Generator().manual_seed(9),
        )

    sampled = Generation([1, 2, 3], 0.1, 0.01, engine_record={"engine": "vllm"})
    attach(sampled, module, request(0.7))
    assert len(sampled.engine_record["pit_u"]) == 3
    greedy = Generation([1, 2, 3], 0.1, 0.01, engine_record={"engine": "vllm"})
    attach(greedy, module, request(0.0))
    unaudited = Generation([1], 0.1, 0.01, engine_record={})
    attach(unaudited, None, request(0.7))  # the engine kept no copy of the target
    assert "pit_u" not in greedy.engine_record and "pit_u" not in unaudited.engine_record


def test_cell_check_needs_audited_rows_and_enough_tokens():
    assert cell_check([{"engine": "vllm"}]) == {}
    few = cell_check([{"pit_u": [0.5] * 5}])
    assert (
        few["sampling_pit_tokens"] == 5 and math.isnan(few["sampling_pit_p"]) and few["sampling_flagged"] == 0
    )


# -- a whole sampled run through the llama.cpp backend and its stand-in server ----------------------


def test_a_sampled_engine_run_is_re_scored_and_tested(served, models):  # noqa: F811 (fixtures)
    """With audit_sampling, every sampled row of an engine cell carries its PIT values and the cell its
    KS test; the stand-in's tokens follow its own copy rule, not the tiny target's distribution."""
    options = {"start_timeout_s": 30, "request_timeout_s": 60, "audit_sampling": True}
    recipe = _recipe(models, **{"generation.temperature": 0.8, "models.served.engine_options": options})
    result = _run(served, recipe)
    assert result.exit_code == 0, result.output
    rows = _rows(served)
    assert rows and all(len(r["engine_record"]["pit_u"]) == r["n_tokens"] for r in rows)
    assert all(0 <= u <= 1 for r in rows for u in r["engine_record"]["pit_u"])
    cells = pd.read_csv(served / "out" / "cells.csv")
    for cell in cells.to_dict("records"):
        tokens = sum(r["n_tokens"] for r in rows if r["cell"] == cell["cell"])
        assert cell["sampling_pit_tokens"] == tokens and cell["sampling_pit_level"] == LEVEL
    report = CliRunner().invoke(app, ["report", str(served / "out")])
    assert report.exit_code == 0, report.output
    assert "sampled outputs against the target's distribution" in " ".join(report.output.split())
    assert _servers_left(served) == []
