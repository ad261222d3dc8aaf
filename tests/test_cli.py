"""The command line end to end on the tiny recipe: run, report in every format, errors, help."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "quickstart-tiny.yaml"
runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "tiny"
    result = runner.invoke(app, ["run", str(TINY), "--output-dir", str(out), "--limit", "3"])
    assert result.exit_code == 0, result.output
    return out


def test_run_writes_every_record(tiny_run: Path):
    for name in ("examples.jsonl", "cells.csv", "resolved_recipe.yaml", "environment.json"):
        assert (tiny_run / name).is_file(), name
    rows = [json.loads(line) for line in (tiny_run / "examples.jsonl").read_text().splitlines()]
    cells = pd.read_csv(tiny_run / "cells.csv")
    # 1 AR + 2 sd-lookup + 2 sd-draft + 1 hf-assisted + 1 hf-lookup cells, 3 examples each
    assert len(cells) == 7 and len(rows) == 21
    assert len({r["key"] for r in rows}) == 21
    env = json.loads((tiny_run / "environment.json").read_text())
    assert env["models"]["target"]["dtype"] == "torch.float64" and env["torch"]


def test_greedy_cells_are_lossless_and_counted(tiny_run: Path):
    cells = pd.read_csv(tiny_run / "cells.csv").set_index("cell")
    lossless = cells[cells["method"] != "autoregressive"]
    assert (lossless["lossless_checked"] == 3).all()
    assert (lossless["lossless_identical"] == 3).all()
    ar = cells.loc["ar"]
    assert ar["target_forwards"] == ar["generated_tokens"]  # one pass per token
    assert ar["swi_ms"] == pytest.approx(1.0) and ar["swi_pw"] == pytest.approx(1.0)
    sd = cells.loc["sd-lookup[k=4]"]
    assert sd["drafter_forwards"] > 0 and sd["swi_ms"] == pytest.approx(
        sd["generated_tokens"] / sd["target_forwards"]
    )  # prompt lookup costs 0, so SWI is tokens per target pass
    assert (
        cells.loc["sd-draft[k=4]"]["swi_pw"]
        < cells.loc["sd-draft[k=4]"]["generated_tokens"] / cells.loc["sd-draft[k=4]"]["target_forwards"]
    )  # the neural drafter's passes cost something
    assert ar["speedup_vs_ar"] == pytest.approx(1.0)


@pytest.mark.parametrize("fmt", ["table", "csv", "markdown", "latex"])
def test_report_formats(tiny_run: Path, fmt: str):
    result = runner.invoke(app, ["report", str(tiny_run), "--format", fmt])
    assert result.exit_code == 0, result.output
    assert "sd-lookup" in result.output
    if fmt == "markdown":
        assert "| method |" in result.output
    if fmt == "latex":
        assert r"\begin{tabular}" in result.output
    if fmt == "csv":
        assert result.output.splitlines()[0].startswith("run,dataset,method")


def test_rerun_without_resume_is_refused_and_resume_is_a_no_op(tiny_run: Path):
    before = (tiny_run / "examples.jsonl").read_text()
    refused = runner.invoke(app, ["run", str(TINY), "--output-dir", str(tiny_run), "--limit", "3"])
    assert refused.exit_code == 2 and "--resume" in refused.output
    resumed = runner.invoke(
        app, ["run", str(TINY), "--output-dir", str(tiny_run), "--limit", "3", "--resume"]
    )
    assert resumed.exit_code == 0, resumed.output
    assert (tiny_run / "examples.jsonl").read_text() == before


def test_bad_recipe_is_one_line_exit_2(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.read_text().replace("max_new_tokens: 24", "max_new_tokens: 24\n  beams: 3"))
    result = runner.invoke(app, ["run", str(bad), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    message = " ".join(result.output.split())
    assert "bad.yaml" in message and "beams" in message and "fix:" in message


def test_error_text_is_printed_verbatim_not_as_markup(tmp_path: Path):
    missing = tmp_path / "[bold]" / "[/x]" / "nope.yaml"  # Rich read these as tags (a MarkupError)
    result = runner.invoke(app, ["run", str(missing)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "[bold]/[/x]/nope.yaml" in result.output


def test_list_hint_keeps_its_brackets(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.read_text().replace("datasets:", "datasets: {task: arithmetic}\nunused:"))
    result = runner.invoke(app, ["run", str(bad), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "write [a, b] or one '- item' per line" in " ".join(result.output.split())


def test_missing_recipe_file(tmp_path: Path):
    result = runner.invoke(app, ["run", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "nope.yaml" in result.output and "Traceback" not in result.output


def test_report_on_empty_dir(tmp_path: Path):
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "cells.csv" in result.output


@pytest.mark.parametrize("command", [[], ["run"], ["report"], ["bench"], ["theory", "table1"]])
def test_help(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def test_report_over_a_folder_of_runs(tiny_run: Path, tmp_path: Path):
    shutil.copytree(tiny_run, tmp_path / "a")
    shutil.copytree(tiny_run, tmp_path / "b")
    result = runner.invoke(app, ["report", str(tmp_path), "--format", "csv"])
    assert result.exit_code == 0
    runs = {line.split(",")[0] for line in result.output.splitlines()[1:]}
    assert runs == {"a", "b"}


def test_seed_override_changes_keys_not_greedy_outputs(tiny_run: Path, tmp_path: Path):
    out = tmp_path / "seeded"
    result = runner.invoke(app, ["run", str(TINY), "--output-dir", str(out), "--limit", "1", "--seed", "7"])
    assert result.exit_code == 0, result.output
    seeded = {(r["cell"], r["example_id"]): r for r in map(json.loads, (out / "examples.jsonl").open())}
    base = {(r["cell"], r["example_id"]): r for r in map(json.loads, (tiny_run / "examples.jsonl").open())}
    for key, row in seeded.items():
        assert row["key"] != base[key]["key"]  # the seed is part of every row's identity
        assert row["output_ids"] == base[key]["output_ids"]  # greedy decoding does not depend on it
    assert "seed: 7" in (out / "resolved_recipe.yaml").read_text()


def test_dataset_max_new_tokens_overrides_the_recipe_length(tiny_run: Path, tmp_path: Path):
    """A dataset's own output length (papers set one per task) caps every method on it, and is part
    of the rows' identity; greedy outputs are the 24-token run's prefixes."""
    import yaml

    data = yaml.safe_load(TINY.read_text())
    data["datasets"][0]["max_new_tokens"] = 5
    data["methods"] = [m for m in data["methods"] if m["method"] in ("autoregressive", "speculative")]
    recipe = tmp_path / "short.yaml"
    recipe.write_text(yaml.safe_dump(data))
    out = tmp_path / "short"
    result = runner.invoke(app, ["run", str(recipe), "--output-dir", str(out), "--limit", "2"])
    assert result.exit_code == 0, result.output
    short = {(r["cell"], r["example_id"]): r for r in map(json.loads, (out / "examples.jsonl").open())}
    base = {(r["cell"], r["example_id"]): r for r in map(json.loads, (tiny_run / "examples.jsonl").open())}
    assert len(short) == 2 * 5  # ar + 2 sd-lookup + 2 sd-draft cells
    for key, row in short.items():
        assert 1 <= row["n_tokens"] <= 5
        assert row["output_ids"] == base[key]["output_ids"][: row["n_tokens"]]
        assert row["key"] != base[key]["key"]


def test_generation_max_length_caps_prompt_plus_output(tiny_run: Path, tmp_path: Path):
    """generation.max_length (transformers' max_length; SpecDec++'s release generates to 512 in
    total) leaves an example max_length - prompt new tokens, and enters the rows' keys; a prompt
    that leaves no room is a one-line error before the first row."""
    import yaml

    base = {(r["cell"], r["example_id"]): r for r in map(json.loads, (tiny_run / "examples.jsonl").open())}
    first = min(base.values(), key=lambda r: r["example_id"])
    data = yaml.safe_load(TINY.read_text())
    data["methods"] = [m for m in data["methods"] if m["method"] in ("autoregressive", "speculative")]
    data["generation"]["max_length"] = first["prompt_tokens"] + 4
    recipe = tmp_path / "total.yaml"
    recipe.write_text(yaml.safe_dump(data))
    out = tmp_path / "total"
    result = runner.invoke(app, ["run", str(recipe), "--output-dir", str(out), "--limit", "1"])
    assert result.exit_code == 0, result.output
    rows = list(map(json.loads, (out / "examples.jsonl").open()))
    assert len(rows) == 5 and {r["example_id"] for r in rows} == {first["example_id"]}
    for row in rows:
        before = base[(row["cell"], row["example_id"])]
        assert row["n_tokens"] == 4 < before["n_tokens"]
        assert row["output_ids"] == before["output_ids"][:4] and row["key"] != before["key"]
    data["generation"]["max_length"] = first["prompt_tokens"]
    recipe.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["run", str(recipe), "--output-dir", str(tmp_path / "none"), "--limit", "1"])
    assert result.exit_code != 0 and "generation.max_length" in result.output
    assert "leaves no new token" in result.output and "Traceback" not in result.output


def test_unreachable_hub_model_names_recipe_and_field(tmp_path: Path, monkeypatch):
    from specbench.models import cache

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(cache, "hub_reachable", lambda: False)
    recipe = tmp_path / "hub.yaml"
    recipe.write_text(
        TINY.read_text().replace(
            "source: tiny-llama\n    dtype: float64\n    options: {seed: 1, init_std: 0.3}\n",
            "source: some-org/not-cached\n",
            1,
        )
    )
    result = runner.invoke(app, ["run", str(recipe), "--output-dir", str(tmp_path / "out")])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        "hub.yaml: models.target.source" in message and "some-org/not-cached" in message and "fix:" in message
    )


def test_hub_dataset_offline_names_recipe_and_field(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SPECBENCH_DATA_DIR", raising=False)
    recipe = tmp_path / "data.yaml"
    recipe.write_text(TINY.read_text().replace("task: arithmetic", "task: gsm8k"))
    result = runner.invoke(app, ["run", str(recipe), "--output-dir", str(tmp_path / "out")])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "data.yaml: datasets[0]" in message and "SPECBENCH_DATA_DIR" in message


def test_a_missing_bigram_table_fails_before_the_first_cell(tmp_path: Path, monkeypatch):
    """Statistical drafters load before any cell runs: a bad table path costs seconds, not a run."""
    monkeypatch.delenv("SPECBENCH_NO_SUCH_DIR", raising=False)
    recipe = tmp_path / "mag.yaml"
    recipe.write_text(
        TINY.read_text().replace(
            "  lookup:\n    source: prompt-lookup\n",
            "  lookup:\n    source: maxgram\n    options: {bigram: $SPECBENCH_NO_SUCH_DIR/t.json}\n",
        )
    )
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(recipe), "--output-dir", str(out)])
    message = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "mag.yaml: models.lookup.options.bigram" in message and "$SPECBENCH_NO_SUCH_DIR" in message
    assert not (out / "examples.jsonl").exists()  # not one cell ran


def test_theory_table1_prints_ours_beside_the_paper():
    result = runner.invoke(app, ["theory", "table1", "--steps", "2000"])
    assert result.exit_code == 0, result.output
    assert "paper EWIF" in result.output and "3.93" in result.output and "3.919" in result.output
    bad = runner.invoke(app, ["theory", "table1", "--costs", "foo"])
    assert bad.exit_code == 2 and "fix:" in bad.output


def test_plot_acceptance_by_position(tiny_run: Path, tmp_path: Path):
    run = tmp_path / "copy"
    shutil.copytree(tiny_run, run)
    result = runner.invoke(app, ["plot", str(run)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(run / "acceptance_by_position.csv")
    assert (run / "acceptance_by_position.png").read_bytes()[:4] == b"\x89PNG"
    rows = [json.loads(line) for line in (run / "examples.jsonl").read_text().splitlines()]
    k4 = [r for r in rows if r["cell"] == "sd-lookup[k=4]"]
    first = table[(table["cell"] == "sd-lookup[k=4]") & (table["position"] == 1)].iloc[0]
    assert first["proposed"] == sum(1 for r in k4 for d, _ in r["steps"] if d >= 1)
    assert first["accepted"] == sum(1 for r in k4 for _, a in r["steps"] if a >= 1)
    assert ((table["accepted"] <= table["proposed"]) & (table["acceptance_rate"] <= 1)).all()
    assert set(table["cell"]) <= {r["cell"] for r in rows if r["method"] != "autoregressive"}


def test_drafter_cost_is_time_per_drafter_pass_over_an_ar_target_pass(tiny_run: Path):
    cells = pd.read_csv(tiny_run / "cells.csv").set_index("cell")
    ar_pass = json.loads(cells.loc["ar", "pass_ms"])["target"]
    sd = cells.loc["sd-draft[k=4]"]
    assert sd["drafter_cost"] == pytest.approx(json.loads(sd["pass_ms"])["draft"] / ar_pass)
    assert 0 < sd["drafter_cost"] < 10
    assert pd.isna(cells.loc["ar", "drafter_cost"])


def test_ray_executor_without_ray_says_how_to_install_it(tmp_path: Path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where it is not installed
    result = runner.invoke(app, ["run", str(TINY), "-o", str(tmp_path / "out"), "--executor", "ray"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "pip install 'specbench-llm[ray]'" in " ".join(result.output.split())
    result = runner.invoke(app, ["run", str(TINY), "-o", str(tmp_path / "out"), "--address", "auto"])
    assert result.exit_code == 2 and "--executor ray" in result.output


def test_importing_specbench_never_imports_ray():
    import subprocess
    import sys

    code = (
        "import sys, specbench.cli, specbench.pipeline.run.runner, specbench.pipeline.run.ray_executor; "
        "sys.exit('ray' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_the_command_line_starts_without_torch_or_the_papers_views():
    import subprocess
    import sys

    code = (
        "import sys, specbench.cli; "
        "sys.exit(any(m in sys.modules for m in ('torch', 'pandas', 'specbench.papers.registry')))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_a_paper_command_registers_itself_and_joins_the_theory_help():
    import typer

    from specbench.cli import papers
    from specbench.papers.commands import COMMANDS, THEORY, Command

    def bound(x: int = typer.Option(1)):
        """A toy bound."""
        print(f"bound {x}")

    app = typer.Typer()
    with COMMANDS.registered(Command(THEORY, "bound", bound, "a toy bound (Section 9, bound)")):
        papers.add_theory(app)
    result = runner.invoke(app, ["theory", "bound", "--x", "3"])
    assert result.exit_code == 0 and "bound 3" in result.output
    assert "a toy bound (Section 9, bound)." in _words(runner.invoke(app, ["theory", "--help"]).output)


def test_paper_and_figure_help_list_their_registries():
    from specbench.papers.registry import FIGURES, PAPERS

    paper_help = _words(runner.invoke(app, ["report", "--help"]).output)
    figure_help = _words(runner.invoke(app, ["plot", "--help"]).output)
    assert all(f"{name} (" in paper_help for name in PAPERS)
    assert all(f"{name}: " in figure_help for name in [*FIGURES, "all"])


def _words(help_text: str) -> str:
    """A help screen's text with its boxes and line breaks gone."""
    return " ".join(help_text.replace("│", " ").split())
