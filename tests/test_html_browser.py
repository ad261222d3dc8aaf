"""The pages open in a real browser: headless Chromium (Debian's ``chromium``; ``make install-chromium``)
loads a site built from committed runs, and every page renders its figures, fetches nothing but its own
file, logs no script error, shows the numbers of cells.csv, and sorts a table by the column clicked."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from headless_chromium import Browser, find
from typer.testing import CliRunner

from specbench.cli import app

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "results" / "quickstart"
CASCADES = ROOT / "results" / "spec_cascades" / "smollm2_offline"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = find()
    if binary is None:
        if os.environ.get("SPECBENCH_CHROMIUM_REQUIRED") == "1":
            pytest.fail("no chromium on PATH: run `make install-chromium`")
        pytest.skip("no chromium on PATH (make install-chromium installs Debian's)")
    return binary


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    results = tmp_path_factory.mktemp("results")
    shutil.copytree(QUICKSTART, results / "quickstart")
    shutil.copytree(CASCADES, results / "spec_cascades" / "smollm2_offline")
    (results / "CLAIMS.md").write_text("# Claims\n\nSee `results/quickstart`.\n")
    out = results.parent / "site"
    done = CliRunner().invoke(app, ["site", str(results), "-o", str(out)])
    assert done.exit_code == 0, done.output
    return out


def test_every_page_renders_its_figures_with_no_request_and_no_script_error(chromium, site: Path):
    pages = sorted(site.rglob("*.html"))
    names = {page.relative_to(site).as_posix() for page in pages}
    runs = {"runs/quickstart.html", "runs/spec_cascades__smollm2_offline.html"}
    assert names == {"index.html", "claims.html", "papers.html", *runs}
    with Browser(chromium) as browser:
        for page in pages:
            browser.open(page)
            assert browser.errors() == [], page
            requested = browser.requested()
            assert requested == [page.resolve().as_uri()], (page, requested)
            svgs = browser.evaluate("document.querySelectorAll('svg').length")
            drawn = browser.evaluate(
                "Array.from(document.querySelectorAll('svg')).filter(s => s.getBBox().width > 0 && "
                "s.querySelector('circle,rect[data-series]')).length"
            )
            assert drawn == svgs, (page, drawn, svgs)
            assert browser.evaluate("document.querySelectorAll('.nofigure').length") == 0


def test_run_page_shows_cells_csv_and_sorts_by_a_click(chromium, site: Path):
    page = site / "runs" / "quickstart.html"
    cells = pd.read_csv(QUICKSTART / "cells.csv")
    with Browser(chromium) as browser:
        browser.open(page)
        shown = browser.evaluate(
            "Array.from(document.querySelectorAll('td[data-column=tokens_per_s]')).map(td => "
            "[td.closest('tr').dataset.dataset, td.closest('tr').dataset.cell, td.dataset.value])"
        )
        assert sorted((d, c, float(v)) for d, c, v in shown) == sorted(
            zip(cells["dataset"], cells["cell"], cells["tokens_per_s"], strict=True)
        )
        order = (
            "Array.from(document.querySelector('#cells table').tBodies[0].rows).map(r => "
            "+r.querySelector('td[data-column=tokens_per_s]').dataset.value)"
        )
        header = (
            "Array.from(document.querySelectorAll('#cells table')[0].tHead.rows[0].cells)"
            ".find(th => th.textContent === 'tok/s')"
        )
        browser.evaluate(f"{header}.click()")
        ascending = browser.evaluate(order)
        assert ascending == sorted(ascending)
        browser.evaluate(f"{header}.click()")
        assert browser.evaluate(order) == sorted(ascending, reverse=True)
        shot = browser.screenshot(site / "run.png")
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_the_whole_committed_evidence_opens_as_a_site(chromium, tmp_path_factory):
    """`make site` over every committed run: each page opens with no request beyond itself, no script
    error, and no figure left undrawn."""
    out = tmp_path_factory.mktemp("evidence") / "site"
    done = CliRunner().invoke(app, ["site", str(ROOT / "results"), "-o", str(out)])
    assert done.exit_code == 0, done.output
    pages = sorted(out.rglob("*.html"))
    runs = {p.parent for p in (ROOT / "results").rglob("cells.csv")} | {
        p.parent for p in (ROOT / "results").rglob("load.csv")
    }
    assert len(pages) == len(runs) + 3  # a page per run, the index, the claims, the papers' tables
    with Browser(chromium) as browser:
        for page in pages:
            browser.open(page)
            assert browser.errors() == [], page
            assert browser.requested() == [page.resolve().as_uri()], page
            undrawn = browser.evaluate(
                "Array.from(document.querySelectorAll('svg')).filter(s => s.getBBox().width == 0).length"
            )
            assert undrawn == 0, page
