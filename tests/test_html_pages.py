"""HTML pages of runs and comparisons (report --html, compare --html, specbench site) read from committed
runs, their JSON twins, the inline SVG charts, and terminal tables that fit 80 and 120 columns."""

from __future__ import annotations

import json
import math
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from specbench.cli import app
from specbench.pipeline.views import svg
from specbench.pipeline.views.compare_page import render_comparison
from specbench.pipeline.views.run_page import render_run

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "results" / "quickstart"
DEMOS = sorted((ROOT / "results" / "demo").iterdir())
CASCADES = ROOT / "results" / "spec_cascades" / "smollm2_offline"
LOAD = ROOT / "results" / "engines" / "smollm2_vllm_load" / "amd-epyc-family26-avx512-bf16"
runner = CliRunner()


class Page(HTMLParser):
    """What a test reads off a page: table cells with their row's attributes, SVG marks, links, scripts,
    and every attribute that could fetch something."""

    def __init__(self, text: str):
        super().__init__()
        self.cells: list[dict] = []  # td attributes + the enclosing tr's
        self.marks: list[dict] = []  # circles and rects with data-series
        self.links: list[str] = []
        self.fetching: list[str] = []
        self.tags: dict[str, int] = {}
        self._row: dict = {}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag == "tr":
            self._row = attrs
        elif tag == "td" and "data-column" in attrs:
            self.cells.append({**{f"row-{k}": v for k, v in self._row.items()}, **attrs})
        elif tag in ("circle", "rect") and "data-series" in attrs:
            self.marks.append({"tag": tag, **attrs})
        if tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])
        for name in ("src", "srcset", "data", "poster"):
            if name in attrs:
                self.fetching.append(f"{tag} {name}={attrs[name]}")
        if tag == "link" or (tag == "a" and re.match(r"\w+://", attrs.get("href", ""))):
            self.fetching.append(f"{tag} {attrs}")


def assert_self_contained(text: str) -> None:
    page = Page(text)
    assert not page.fetching, page.fetching
    urls = set(re.findall(r"\w+://[^\s\"'<>]+", text)) - {"http://www.w3.org/2000/svg"}
    assert not urls, urls
    assert "Content-Security-Policy" in text and "@import" not in text


def test_run_page_shows_cells_csv_numbers_unrounded_and_fetches_nothing():
    text, twin = render_run(QUICKSTART)
    assert_self_contained(text)
    page = Page(text)
    cells = pd.read_csv(QUICKSTART / "cells.csv")
    shown = {
        (c["row-data-dataset"], c["row-data-cell"], c["data-column"]): c["data-value"]
        for c in page.cells
        if "row-data-cell" in c and c["data-column"] in cells.columns
    }
    compared = 0
    for record in cells.to_dict("records"):
        for column in ("tokens_per_s", "speedup_vs_ar", "swi_ms", "acceptance_length", "n"):
            value = shown[(record["dataset"], record["cell"], column)]
            expected = record[column]
            if isinstance(expected, float) and math.isnan(expected):
                assert value == ""
            else:
                assert float(value) == float(expected)  # repr round-trips: the very number of cells.csv
                compared += 1
    assert compared >= 30
    # the report's text is on the page too, intervals and why-lines included
    assert "why: " in text and re.search(r"\d\.\d\dx \[\d\.\d\d, \d\.\d\d\]", text)
    data = json.loads(twin)
    assert [r["cell"] for r in data["sections"]["Cells"]] == list(cells["cell"])
    assert data["sections"]["Machine"]["entries"]["threads / cores"]


def test_run_page_figures_carry_the_acceptance_and_step_numbers():
    from specbench.decoding.steps import accepted_histogram
    from specbench.pipeline.records.results import read_examples
    from specbench.pipeline.views.plots import acceptance_by_position

    text, twin = render_run(QUICKSTART)
    page = Page(text)
    table = acceptance_by_position(QUICKSTART)
    drafting = table[table["proposed"] > 0]
    points = [m for m in page.marks if m["tag"] == "circle"]
    assert page.tags["svg"] >= 2 * drafting["dataset"].nunique() + 2
    first = drafting.iloc[0]
    assert any(
        m["data-series"] == first["cell"]
        and float(m["data-x"]) == first["position"]
        and math.isclose(float(m["data-y"]), first["acceptance_rate"])
        for m in points
    )
    rows = [
        r
        for r in read_examples(QUICKSTART)
        if r["cell"] == "sd-lookup[k=2]" and r["dataset"] == first["dataset"]
    ]
    counts = accepted_histogram([s for r in rows for s in r["steps"]])
    steps = json.loads(twin)["sections"]["Tokens per step"]
    mine = [s for s in steps if s["cell"] == "sd-lookup[k=2]" and s["dataset"] == first["dataset"]]
    assert [s["steps"] for s in mine] == counts
    assert sum(s["share"] for s in mine) == pytest.approx(1.0)


def test_lossless_section_lists_each_divergence_with_both_texts(tmp_path: Path):
    run = tmp_path / "run"
    shutil.copytree(QUICKSTART, run)
    text, twin = render_run(run)
    lossless = json.loads(twin)["sections"]["Lossless"]
    cells = pd.read_csv(run / "cells.csv")
    checked = cells[cells["lossless_checked"].fillna(0) > 0]
    assert {(c["dataset"], c["cell"]) for c in lossless["cells"]} == set(
        zip(checked["dataset"], checked["cell"], strict=True)
    )
    diverged = sum(int(r["checked"] - r["identical"]) for r in lossless["cells"])
    assert len(lossless["divergences"]) == min(diverged, 30)
    assert text.count("parts from AR at token") == len(lossless["divergences"])


def test_cascades_page_adds_the_quality_latency_frontier_and_a_plain_run_does_not():
    from specbench.papers.registry import paper_sections

    sections = paper_sections(CASCADES)
    assert [s.title for s in sections] == ["Quality against latency"]
    text, twin = render_run(CASCADES, sections)
    assert_self_contained(text)
    table2 = pd.read_csv(CASCADES / "cascades_table2.csv")
    data = json.loads(twin)["sections"]["Quality against latency"]
    assert len(data["table2"]) == len(table2)
    shown = {
        c["row-data-curve"]: c for c in Page(text).cells if c.get("data-column") == "best_quality_walltime"
    }
    for record in table2.to_dict("records"):
        value = shown[record["curve"]]["data-value"]
        assert (
            (value == "")
            if math.isnan(record["best_quality_walltime"])
            else math.isclose(float(value), record["best_quality_walltime"])
        )
    assert paper_sections(QUICKSTART) == []


def test_a_load_sweep_alone_gets_its_curves():
    text, twin = render_run(LOAD)
    load = pd.read_csv(LOAD / "load.csv", dtype={"key": str, "machine": str, "cell": str})
    drafting = load[load["method"] != "autoregressive"]
    marks = [m for m in Page(text).marks if m["data-series"] in set(drafting["cell"])]
    # throughput and per-request speed, one point per level, and the level's point on the Pareto chart
    assert len(marks) == 3 * len(drafting)
    assert "Cells" not in json.loads(twin)["sections"]


def test_compare_page_letters_long_run_names_and_carries_ratios():
    text, twin = render_comparison(DEMOS)
    assert_self_contained(text)
    page = Page(text)
    first, second = (pd.read_csv(d / "cells.csv").set_index(["dataset", "cell"]) for d in DEMOS)
    ratios = [c for c in page.cells if c["data-column"] == "B:tokens_per_s/A"]
    assert ratios
    for cell in ratios:
        key = (cell["row-data-dataset"], cell["row-data-cell"])
        expected = second.loc[key, "tokens_per_s"] / first.loc[key, "tokens_per_s"]
        assert math.isclose(float(cell["data-value"]), expected)
    assert f"A = {DEMOS[0].name}" in text and f"B = {DEMOS[1].name}" in text
    assert len(json.loads(twin)["sections"]["Cells"]) == 2 * len(set(first.index) | set(second.index))


def test_report_and_compare_commands_write_pages_and_refuse_bad_outputs(tmp_path: Path):
    html_file, json_file = tmp_path / "out" / "run.html", tmp_path / "run.json"
    done = runner.invoke(app, ["report", str(QUICKSTART), "--html", str(html_file), "--json", str(json_file)])
    assert done.exit_code == 0, done.output
    assert html_file.read_text().startswith("<!DOCTYPE html>") and json.loads(json_file.read_text())["about"]
    cases = [
        (["report", str(QUICKSTART), "--html", str(tmp_path)], "is a directory"),
        (["report", str(ROOT / "results" / "demo"), "--html", str(html_file)], "not one run directory"),
        (["report", str(QUICKSTART), "--html", str(html_file), "--by", "step"], "drop --by"),
        (["compare", *map(str, DEMOS), "--json", str(tmp_path)], "is a directory"),
    ]
    for argv, message in cases:
        result = runner.invoke(app, argv)
        assert result.exit_code == 2 and message in result.output, (argv, result.output)
        assert "Traceback" not in result.output
    done = runner.invoke(app, ["compare", *map(str, DEMOS), "--html", str(tmp_path / "c.html")])
    assert done.exit_code == 0 and (tmp_path / "c.html").is_file(), done.output


def test_site_links_every_run_page_and_the_runs_the_claims_cite(tmp_path: Path):
    results = tmp_path / "results"
    shutil.copytree(QUICKSTART, results / "quickstart")
    shutil.copytree(CASCADES, results / "spec_cascades" / "smollm2_offline")
    (results / "broken").mkdir()
    (results / "broken" / "cells.csv").write_text("not,a\ncells,file\n")
    (results / "CLAIMS.md").write_text(
        "# Claims\n\n| claim | run |\n|---|---|\n| faster | `results/spec_cascades/smollm2_offline` |\n"
    )
    out = tmp_path / "site"
    done = runner.invoke(app, ["site", str(results), "-o", str(out)])
    assert done.exit_code == 0, done.output
    index = (out / "index.html").read_text()
    assert_self_contained(index)
    links = Page(index).links
    pages = [link for link in links if link.startswith("runs/")]
    assert len(pages) == 2 and all((out / link).is_file() for link in pages)  # the broken run: no page
    assert "broken" in index and "not a specbench cells.csv" in index
    claims = (out / "claims.html").read_text()
    cited = [link for link in Page(claims).links if link.startswith("runs/")]
    assert cited == ["runs/spec_cascades__smollm2_offline.html"] and (out / cited[0]).is_file()
    for page in pages:
        assert_self_contained((out / page).read_text())
        assert json.loads((out / page.replace(".html", ".json")).read_text())["sections"]
    again = runner.invoke(app, ["site", str(results), "-o", str(out)])  # a site is rewritten in place
    assert again.exit_code == 0, again.output
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    for folder, message in (
        (tmp_path / "mine", "holds other files and no site"),
        (results / "CLAIMS.md", "is a file"),
    ):
        refused = runner.invoke(app, ["site", str(results), "-o", str(folder)])
        assert refused.exit_code == 2 and message in refused.output, refused.output


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_tables_fit_the_width_without_cutting_a_name(width: int):
    from specbench.pipeline.views.compare import render_compare
    from specbench.pipeline.views.report import render

    for draw in (lambda c: render(QUICKSTART, console=c), lambda c: render_compare(DEMOS, console=c)):
        console = Console(width=width, record=True, color_system=None)
        draw(console)
        out = console.export_text()
        tables = [line for line in out.splitlines() if line[:1] in "┏┃│┡└┗"]
        assert tables and max(len(line) for line in tables) <= width
        assert "…" not in out
    console = Console(width=width, record=True, color_system=None)
    render(QUICKSTART, console=console)
    out = console.export_text()
    for name in pd.read_csv(QUICKSTART / "cells.csv")["method_name"].unique():
        assert re.search(rf"│ {re.escape(name)}\s", out), name


def test_svg_charts_skip_nan_ticks_round_and_an_empty_chart_is_one_line():
    assert svg.nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svg.nice_ticks(1.3, 4.1) == [1.0, 2.0, 3.0, 4.0, 5.0]
    equal = svg.nice_ticks(2.0, 2.0000000000000004)  # one value up to rounding: a unit around it
    assert equal[0] <= 1.5 and equal[-1] >= 2.5 and len(equal) <= 8
    chart = svg.line_chart("t", [svg.Series("a", [(1, 0.5), (2, math.nan), (3, 0.7)])], "x", "y")
    marks = Page(chart).marks
    assert [(m["data-x"], m["data-y"]) for m in marks] == [("1", "0.5"), ("3", "0.7")]
    assert chart.count("<polyline") == 1
    assert svg.line_chart("t", [svg.Series("a", [(1, math.nan)])], "x", "y").startswith(
        '<p class="nofigure">'
    )
    bars = svg.bar_chart("h", ["1", "2"], [svg.Series("a", [(0, 0.25), (1, 0.75)])], "x", "y")
    assert [m["data-y"] for m in Page(bars).marks] == ["0.25", "0.75"]


def test_a_run_from_before_the_interval_columns_with_no_rows_still_gets_its_page(tmp_path: Path):
    from test_compare import _run

    run = _run(tmp_path / "old", {"ar": 10.0, "sd[k=2]": 20.0})
    cells = pd.read_csv(run / "cells.csv")
    cells.drop(columns=[c for c in cells.columns if c.endswith(("_low", "_high"))]).to_csv(
        run / "cells.csv", index=False
    )
    for name in ("cells.sha256", "checksums.json"):  # files from before the intervals had neither
        (run / name).unlink()
    text, twin = render_run(run)
    assert_self_contained(text)
    assert text.count("no examples.jsonl here") == 2  # the two figures drawn from rows
    assert "2.00x" in text and "[2.00, 2.00]" not in text  # the value alone, no interval
    assert json.loads(twin)["sections"]["Machine"] == {}
