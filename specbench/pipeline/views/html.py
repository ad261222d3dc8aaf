"""Self-contained HTML pages: the scaffolding every page shares (styles, sortable tables, sections) and
the writing of a page and its JSON twin.

A page opens from disk with nothing fetched: styles are inline, figures are inline SVG
(:mod:`specbench.pipeline.views.svg`), and the one script (sorting a table by the column clicked) is a
few inline lines; with scripts off the tables read the same, unsorted. Each numeric table cell carries
the unrounded value it shows (``data-value``), which the sort uses and a test compares with cells.csv.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.models.cache import write_atomic

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1400px;
padding:0 24px 48px;color:#1b1b1b}
h1{font-size:22px;margin:22px 0 4px}h2{font-size:18px;margin:30px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0 4px;font-variant-numeric:tabular-nums}
th,td{padding:3px 9px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#f4f4f4;position:sticky;top:0}
table.sortable th{cursor:pointer}th[data-order=asc]::after{content:" \\25B2"}
th[data-order=desc]::after{content:" \\25BC"}
td.text,th.text{text-align:left}
.scroll{overflow-x:auto}
.caption{color:#333;font-style:italic;margin:2px 0 12px}
.note{color:#555;font-size:13px}
.card{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;background:#fafafa;
border:1px solid #e3e3e3;padding:10px 14px;border-radius:6px}
.card dt{color:#555}.card dd{margin:0}
.figures{display:flex;flex-wrap:wrap;gap:18px}
figure{margin:0}ul.legend{list-style:none;padding:0;margin:2px 0 0;max-width:560px;font-size:12px}
ul.legend li{display:inline-block;margin-right:12px}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.nofigure{color:#8a4b00}
details{margin:4px 0}pre{white-space:pre-wrap;background:#f7f7f7;padding:6px;margin:4px 0}
nav a{margin-right:12px}
"""

# sorts a table by the clicked column: by data-value where every cell has a number, else by the text
SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, column) {
    th.addEventListener("click", function () {
      var ascending = th.dataset.order !== "asc";
      table.querySelectorAll("th").forEach(function (h) { delete h.dataset.order; });
      th.dataset.order = ascending ? "asc" : "desc";
      var body = table.tBodies[0];
      var key = function (row) {
        var cell = row.cells[column], value = cell.dataset.value;
        return value !== undefined && value !== "" && !isNaN(+value) ? +value : cell.textContent;
      };
      Array.from(body.rows).sort(function (a, b) {
        var x = key(a), y = key(b);
        var numbers = typeof x === "number" && typeof y === "number";
        var order = numbers ? x - y : String(x).localeCompare(String(y));
        return ascending ? order : -order;
      }).forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""


@dataclass(frozen=True)
class Cell:
    text: str
    value: float | None = None  # the number shown, unrounded (sorting, tests)
    column: str | None = None  # the cells.csv column it comes from
    markup: bool = False  # text is HTML already (a link), not to be escaped


@dataclass
class Row:
    cells: list[Cell]
    attributes: dict[str, str] = field(default_factory=dict)


def number(value) -> float | None:
    """A finite float, or None (NaN, missing, text)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def table(
    header: list[str],
    rows: list[Row],
    left: tuple[str, ...] = (),
    sortable: bool = True,
    wrap: tuple[str, ...] = (),
) -> str:
    """A table; the columns named in ``left`` are text, aligned left, and those in ``wrap`` long text
    that wraps (every other cell stays on one line)."""
    kind = ' class="sortable"' if sortable else ""
    head = "".join(f"<th{' class=text' if h in left else ''}>{escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        attributes = "".join(f' data-{k}="{escape(str(v))}"' for k, v in row.attributes.items())
        tds = []
        for name, cell in zip(header, row.cells, strict=True):
            extra = ' class="text"' if name in left else ""
            if cell.column is not None:
                extra += f' data-column="{escape(cell.column)}"'
                extra += f' data-value="{"" if cell.value is None else repr(cell.value)}"'
            tds.append(f"<td{extra}>{cell.text if cell.markup else escape(cell.text)}</td>")
        body.append(f"<tr{attributes}>{''.join(tds)}</tr>")
    return (
        f'<div class="scroll"><table{kind}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def card(entries: list[tuple[str, str]]) -> str:
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in entries if v not in (None, ""))
    return f'<dl class="card">{items}</dl>'


def paragraph(text: str, kind: str = "note") -> str:
    return f'<p class="{kind}">{escape(text)}</p>'


@dataclass
class Section:
    """A part of a page: its title, its HTML, and the numbers behind it for the JSON twin."""

    title: str
    html: str
    data: object = None
    anchor: str = ""

    def render(self) -> str:
        anchor = self.anchor or self.title.lower().replace(" ", "-")
        return f'<section id="{escape(anchor)}"><h2>{escape(self.title)}</h2>\n{self.html}\n</section>'


@dataclass(frozen=True)
class PageSection:
    """A section a paper adds to a run's page: ``build(run directory)`` gives it, or None where the run
    holds nothing it shows (papers declare these in their ``SECTIONS``)."""

    name: str
    build: Callable[[Path], Section | None]


def page(title: str, subtitle: str, sections: list[Section]) -> str:
    nav = "".join(
        f'<a href="#{escape(s.anchor or s.title.lower().replace(" ", "-"))}">{escape(s.title)}</a>'
        for s in sections
    )
    body = "\n".join(section.render() for section in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # nothing may be fetched: no images, fonts, scripts or frames from anywhere
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
        f"<h1>{escape(title)}</h1>{paragraph(subtitle)}<nav>{nav}</nav>\n{body}\n"
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def plain(value):
    """``value`` made JSON-safe: NaN and infinities become null, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):  # numpy / pandas scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def twin(sections: list[Section], about: dict) -> str:
    """The page's JSON twin: what the page is about, then each section's numbers by its title."""
    content = {"about": about, "sections": {s.title: s.data for s in sections if s.data is not None}}
    return json.dumps(plain(content), indent=1, allow_nan=False) + "\n"


def check_output_file(path: Path, flag: str) -> None:
    """Before any work: ``path`` names a file in a folder we can write (an existing directory, or one
    under a file or a read-only folder, is a one-line error)."""
    path = Path(path)
    if path.is_dir():
        raise SpecbenchError(
            flag, f"{path} is a directory", f"name the file to write, e.g. {path / 'report.html'}"
        )
    folder = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise SpecbenchError(
            flag, f"cannot write under {folder} (not a writable folder)", "name another file"
        )


def write(path: Path, text: str) -> None:
    write_atomic(Path(path), text)
