"""The numbers a document quotes and the values the files it cites hold (tests/test_readme_numbers.py).

A paragraph cites the committed files and run directories it names (from the root, or in backticks from
the document's folder); a run's README also cites its own folder. A quoted number is matched only
against what such a number can be, never against examples.jsonl: a run directory offers its cells (the
result columns of cells.csv, not the cell's parameters, seeds or latency percentiles) and its text files
(report tables, curves, bench output), a text file its numbers line by line (a table row column by
column). Of those, only the records its sentence may speak of (doc_cells.py: the dataset, cost model or
setting it names). The unit after a number, the measure named before it, its table column's header or
the number it is compared with or listed after narrows the columns: ``1.8x`` is a speedup,
``31.2 tokens/s`` a tokens/s, ``38.7 ms`` a pass time, ``2.00 tokens per target pass`` an acceptance
length, ``SWI 1.79`` an SWI, ``ROUGE-2 4.26`` a quality. A number may be the file's value rounded to
the decimals it shows (correct rounding, never truncation; a report's number, already rounded, is never
quoted with more decimals than it shows), a percentage a fraction's hundredfold or a percentage the file
writes. An interval ``x [a, b]`` must be one column's value and bounds in one cell (in a text file:
three consecutive numbers of one line); an interval written as its bounds (``paired 95% interval
0.853-0.937``) a cell's bounds or bounds a report writes as such; and two numbers compared before their
paired interval (``1.79 against 1.62 (0.853-0.937)``) must be in one row with it. Checked are decimals,
percentages, intervals, counts of rows and passes, and counts of tokens the sentence says were
generated, committed or accepted.

Not results, so not checked: numbers in code (backticks, code blocks), dates, versions, names and sizes
written into a word (SmolLM2-135M, Qwen2.5, 0.5B), section, table, figure and theorem numbers, settings
(``k = 4``, ``T = 1``, ``α 0.5``, ``top-p 0.9``), equation numbers, a confidence level (95% interval),
a goal an issue set (and its restatements), bare integers without a counted unit (2 cores, 8 prompts),
and token counts that are budgets or sizes. A number in a sentence that speaks of a paper may be the
paper's own, from specbench/papers/*/reference.yaml.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from doc_cells import cell_names, may_be, method_names, named_around, names, unit_said_nearby

from specbench.pipeline.records.results import read_cells_csv

ROOT = Path(__file__).resolve().parents[1]
README, CLAIMS = ROOT / "README.md", ROOT / "results" / "CLAIMS.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# the README and the ledger first (in this order), then the reference in docs/ the README points to
MAIN_DOCUMENTS = [README, CLAIMS, *DOCS]
RUN_READMES = sorted((ROOT / "results").rglob("README.md"))
PAPERS = sorted((ROOT / "specbench" / "papers").glob("*/reference.yaml"))

# A number and the few characters around it that say what it is.
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
# a paired difference's bounds carry signs (+0.046 [-0.150, +0.248]); a file's numbers are read unsigned
INTERVAL_TAIL = re.compile(r"x?\s*\[\s*[+\-−]?(\d+(?:\.\d+)?),\s*[+\-−]?(\d+(?:\.\d+)?)\s*\]")
# an interval written as its bounds (0.853-0.937, 0.101 to 0.264), where the words before say it is one
RANGE_TAIL = re.compile(r"(?:-| to )(\d+\.\d+)(?![\d.]|x\b|\s*(?:ms|tok|%))")
RANGE_HEAD = re.compile(r"(?:\binterval\b|\bCI\b|\bratio\b)[^().;]*$|against \d+(?:\.\d+)?,?\s*\(?$")
# rows and passes counted; tokens only where the sentence says they were generated, committed or
# accepted (elsewhere "N tokens" is a budget, a prompt's or a pass's size: settings, not results)
COUNTED = re.compile(r"\s+(?:[a-z]+\s+)?(?:rows?|passes)\b")
TOKENS = re.compile(r"\s+(?:[a-z]+\s+)?tokens?\b")
GOAL = re.compile(r"\bgoal\b[^.;]*$")  # a goal an issue set, here and wherever restated
PRODUCED = re.compile(r"(?:generat|commit|accept|produc|emit)\w*\s+(?:[\w-]+\s+){0,2}$")
REFERENCE = re.compile(
    r"(?:§|\b(?:Sec|Secs|Section|App|Appendix|Table|Tables|Fig|Figs|Figure|Figures|Theorem|Theorems|Lemma|Lemmas|Eq|"
    r"Eqs|Equation|Alg|Algorithm|Corollary|Proposition|Definition|issue|part|Part))\.?\s*(?:\d+\S*\s*(?:and|,|-)\s*)*$"
)
# a setting: "k = 4", "α 0.5", sampling's "T 0.6", "top-p 0.9", "top-k 50"
SETTING = re.compile(
    r"(?:\b[A-Za-z_][\w-]*|[α-ωΑ-Ω])\s*(?:=|≤|≥|<|>)\s*$|(?<!\w)[α-ωΑ-Ω]\s+$|\b(?:T|top-[pk])\s+$"
)
# What a number is, by the unit after it or the measure named just before it in its clause, and the
# cells.csv columns such a number can be. A number none of these name can be any result column.
UNITS = {
    "x": (r"x\b", None),
    "tokens/s": (r"\s*(?:tokens|tok)/s\b", None),
    "ms": (r"\s*ms\b", None),
    "s": (None, r"\b(?:time to first token|TTFT)\b[^.;:()\d]{0,40}$"),
    "tokens a pass": (r"\s*tokens (?:a|per) (?:target |verification )?(?:pass|step|round)", None),
    "quality": (None, r"\b(?:ROUGE-?\w*|BLEU|accuracy)\b[^.;:()]*$"),
    "swi": (None, r"\bSWI(?:-MS|-PW| \(MS\)| \(PW\))?\b[^.;:()\d]*$"),
    "rejection": (None, r"\b(?:rejects?|rejection(?: rate)?|defers?|deferral(?: rate)?)\b[^.;:()\d]{0,20}$"),
    "acceptance": (None, r"\b(?:draft acceptance|acceptance rate|accepted at)\b[^.;:()\d]{0,20}$"),
}
COLUMNS = {
    "x": r"speedup|ratio",
    "tokens/s": r"tokens_per_s|tok_s",
    "ms": r"_ms$|^pass_ms$",
    "s": r"^ttft_mean",
    "tokens a pass": r"acceptance_length|accepted_per_step|tokens_per_step",
    "quality": r"^quality_",
    "swi": r"^swi_",
    "rejection": r"^rejection|^deferral",
    "acceptance": r"acceptance_rate|acceptance_marginal|acceptance_conditional|engine_acceptance",
    # a number with neither: the report's own columns
    "": r"^(?:swi_|speedup|tokens_per_s|acceptance_length|draft_acceptance|accepted_per_step|quality_|"
    r"deferral|rejection|drafter_cost|model_time|loop_overhead|theory_tokens|engine_acceptance|lossless_|n$|"
    r"pass_ms|drafter_pass_ms|decode_pass_ms|others_cpu|generated_tokens|target_forwards|drafter_forwards|"
    r"reviewed_drafts)",
}
# the cells.csv columns that hold results a document quotes (not latency percentiles, memory, seeds)
RESULT_COLUMNS = re.compile(
    r"^(?:swi_|speedup|tokens_per_s|acceptance_length|draft_acceptance|accepted_per_step|quality_|deferral|"
    r"rejection|drafter_cost|pass_ms|drafter_pass_ms|decode_pass_ms|model_time|loop_overhead|others_cpu|cpu_headroom|theory_|"
    r"engine_acceptance|engine_drafting|generated_tokens|target_forwards|drafter_forwards|forwards|n$|"
    r"lossless_|reviewed_drafts|ttft_mean|tpot_mean|walltime_s|compile_s|acceptance_|peak_memory)"
)
PAPER_WORDS = re.compile(r"paper|authors|\bet al\b|reports?\b|reported", re.IGNORECASE)


@dataclass(frozen=True)
class Quoted:
    """One number a paragraph quotes: as written, its kind and (for an interval) its bounds."""

    text: str
    start: int
    kind: str  # "decimal", "percent", "interval" (x [a, b]), "range" (a-b: an interval's bounds), "count"
    bounds: tuple[str, str] | None = None
    unit: str = ""  # "x", "tokens/s", "ms", ...: which of a cell's columns it can be (UNITS)


@dataclass(frozen=True)
class Paragraph:
    document: Path
    line: int
    text: str
    cited: tuple[Path, ...]

    @property
    def name(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


# -- the documents ---------------------------------------------------------------------------------


def _expand(path: str) -> list[str]:
    """``a_{bf16,fp32}.txt`` -> both files."""
    brace = re.search(r"\{([^{}]+)\}", path)
    if not brace:
        return [path]
    return [
        expanded
        for alternative in brace.group(1).split(",")
        for expanded in _expand(path[: brace.start()] + alternative + path[brace.end() :])
    ]


def _named(text: str, document: Path) -> list[Path]:
    """The committed files and run directories a paragraph names: from the root, or (in backticks)
    from the document's directory."""
    found = []
    named = [(ROOT, m.group(0)) for m in re.finditer(r"results/[A-Za-z0-9_./{},\-]+", text)]
    named += [(document.parent, m.group(1)) for m in re.finditer(r"`(\.{0,2}/?[\w./{},\-]+)`", text)]
    for base, name in named:
        for path in _expand(name.rstrip(".,)`")):
            resolved = (base / path).resolve()
            if resolved.is_relative_to(ROOT / "results") and resolved.exists() and resolved not in found:
                found.append(resolved)
    return found


def _without_code(text: str) -> str:
    """The text with code spans and fenced or indented code blocks blanked (offsets kept)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append(" " * len(line))
        elif fenced or line.startswith("    ") and not line.lstrip().startswith(("-", "|")):
            out.append(" " * len(line))
        else:
            out.append(re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line))
    return "\n".join(out)


def paragraphs_of(document: Path) -> list[Paragraph]:
    raw = document.read_text()
    text = _without_code(raw)
    own = [document.parent] if document.parent != ROOT and document not in MAIN_DOCUMENTS else []
    out, begin = [], 0
    for gap in [*re.finditer(r"\n\s*\n", raw), None]:
        end = gap.start() if gap else len(raw)
        block, original = text[begin:end], raw[begin:end]
        cited = tuple(dict.fromkeys([*own, *_named(original, document)]))  # its own run first, for pins
        if cited and block.strip():
            line = raw.count("\n", 0, begin) + len(original) - len(original.lstrip("\n")) + 1
            out.append(Paragraph(document, line, block, cited))
        begin = gap.end() if gap else end
    return out


@functools.lru_cache(maxsize=8192)
def quoted_numbers(text: str) -> tuple[Quoted, ...]:
    """The results a paragraph quotes (see the module's docstring for what is left out, and why)."""
    out, inside, goals = [], -1, set()
    for match in NUMBER.finditer(text):
        start, end, number = match.start(), match.end(), match.group(0)
        before, after = text[max(0, start - 40) : start], text[end : end + 60]
        if GOAL.search(text[max(0, start - 100) : start]):
            goals.add(number)
        if start < inside or number in goals or _not_a_result(text, start, end, before, after):
            continue
        interval, bounds = INTERVAL_TAIL.match(after), RANGE_TAIL.match(after)
        unit = next((name for name, (tail, head) in UNITS.items() if _says(tail, after, head, before)), "")
        if interval and "." in number:
            out.append(Quoted(number, start, "interval", (interval.group(1), interval.group(2)), unit))
            inside = end + interval.end()
        elif bounds and "." in number and RANGE_HEAD.search(before):
            out.append(Quoted(number, start, "range", (number, bounds.group(1))))
            inside = end + bounds.end()
        elif re.match(r"\s?%", after):
            out.append(Quoted(number, start, "percent"))
        elif "." in number:
            out.append(Quoted(number, start, "decimal", unit=unit))
        elif COUNTED.match(after) or TOKENS.match(after) and PRODUCED.search(before):
            out.append(Quoted(number, start, "count"))
    return tuple(_with_units_said_nearby(text, out))


def _with_units_said_nearby(text: str, numbers: list[Quoted]) -> list[Quoted]:
    """The numbers, each without a unit of its own given the one its column or a neighbour says."""
    out = []
    for quoted in numbers:
        if quoted.kind == "decimal" and not quoted.unit:
            previous = out[-1] if out and out[-1].kind in ("decimal", "interval") and out[-1].unit else None
            after = previous and previous.start + len(previous.text)
            if previous and previous.kind == "interval":
                after = text.find("]", after) + 1
            unit = unit_said_nearby(text, quoted.start, previous and (after, previous.unit))
            quoted = Quoted(quoted.text, quoted.start, quoted.kind, quoted.bounds, unit)
        out.append(quoted)
    return out


def _says(tail: str | None, after: str, head: str | None, before: str) -> bool:
    return bool(tail and re.match(tail, after) or head and re.search(head, before))


def _not_a_result(text: str, start: int, end: int, before: str, after: str) -> bool:
    glued_before = start > 0 and (text[start - 1].isalnum() or text[start - 1] in "._/#v")
    hyphen_name = before.endswith("-") and len(before) > 1 and before[-2].isalpha()
    glued_after = re.match(r"[A-Za-wyz_]|x\w|\.\d|-\d{2}-|-[A-Za-z]", after)
    return bool(
        glued_before
        or hyphen_name
        or glued_after
        or re.match(r"\d{4}$", text[start:end])
        and re.match(r"-\d{2}", after)  # a date
        or REFERENCE.search(before)
        or SETTING.search(before)
        or re.match(r"\s?% (?:\w+ ){0,2}(?:interval|bootstrap|confidence)", after)  # a confidence level
    )


# -- what the cited files hold ---------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """The numbers of one cell (cells.csv) or one line of a text file, and its intervals."""

    values: tuple[float, ...]
    triples: tuple[tuple[float, float, float], ...]
    by_unit: tuple[tuple[str, tuple[float, ...]], ...] = ()  # a cell's values of each unit's columns
    label: frozenset[str] = frozenset()  # the names that identify it (doc_cells.py)
    # a report's values as rounded when written: the decimals each shows (none: machine precision)
    decimals: tuple[int, ...] = ()
    row: tuple[str, int] = ("", 0)  # the file and line a table row's columns share
    # the intervals a report writes as bounds ("0.853-0.937", "0.101 to 0.264", "[1.57, 1.70]")
    bounds: tuple[tuple[float, float], ...] = ()

    @functools.cached_property
    def where(self) -> str:
        """The row as a reader finds it: ``results/.../report.txt:42`` (a line), or a cell of a run as
        ``results/.../cells.csv:7`` (its line in the file)."""
        path, row = Path(self.row[0]), self.row[1]
        if path.is_dir():
            return f"{(path / 'cells.csv').relative_to(ROOT).as_posix()}:{row + 2}"
        return f"{path.relative_to(ROOT).as_posix()}:{row + 1}"

    def of_unit(self, unit: str, decimals: int = 0) -> tuple[float, ...]:
        """Its values a number of ``unit`` written with ``decimals`` decimals can be: a value a report
        wrote with fewer decimals cannot be quoted with more."""
        if self.decimals:
            return tuple(v for v, shown in zip(self.values, self.decimals, strict=True) if shown >= decimals)
        return dict(self.by_unit).get(unit, self.values)


def _value(token: str) -> float:
    return float(token.replace(",", ""))


@functools.cache
def records_of(path: Path) -> tuple[Record, ...]:
    if path.is_dir():
        out = list(_cellrecords_of(path)) if (path / "cells.csv").is_file() else []
        for child in sorted(path.iterdir()):
            if child.is_dir() or _is_text_result(child):
                out.extend(records_of(child))
        return tuple(out)
    return _textrecords_of(path)


def _is_text_result(path: Path) -> bool:
    """A run's files that hold results: not its rows, recipe, machine record or prose."""
    return path.suffix in (".csv", ".json", ".txt", ".md") and path.name not in (
        "cells.csv",
        "environment.json",
        "README.md",
        "PROVENANCE.md",
    )


@functools.cache
def _textrecords_of(path: Path) -> tuple[Record, ...]:
    # a comma separates thousands in prose, fields in a CSV or JSON file
    number = r"\d+(?:\.\d+)?(?:e-?\d+)?"
    machine_written = path.suffix in (".csv", ".json")
    number = number if machine_written else r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|" + number
    out, header = [], None
    for row, line in enumerate(path.read_text(errors="replace").splitlines()):
        if re.match(r"\s*\|[\s:|-]+\|\s*$", line):
            continue
        parts = line.split("|") if line.lstrip().startswith("|") else None
        if parts is None:
            header = None
        elif header is None:
            header = parts
        pieces = [line] if parts is None else parts[1:-1]
        # a table row: one record per column, named by the row's words and the column's header
        label = names(line) | method_names(line)
        for at, piece in enumerate(pieces):
            tokens = re.findall(number, piece)
            values = [_value(t) for t in tokens]
            if not values:
                continue
            # a CSV or JSON writer keeps a float's precision (0.5 is 0.50); a report rounds what it writes
            rounded = () if machine_written else tuple(_decimals(t) for t in tokens)
            percents = tuple(_value(t) for t in re.findall(rf"({number})\s?%", piece))
            heading = names(header[at + 1]) if parts is not None and at + 1 < len(header) else frozenset()
            triples = tuple(zip(values, values[1:], values[2:], strict=False))
            bounds = tuple(
                (_value(low), _value(high))
                for low, high in re.findall(rf"\[?[+\-−]?({number})(?:-| to |, )[+\-−]?({number})\]?", piece)
            )
            record = Record(
                tuple(values),
                triples,
                (("%", percents),),
                label | heading,
                rounded,
                (str(path), row),
                bounds,
            )
            out.append(record)
    return tuple(out)


def _cellrecords_of(run: Path) -> tuple[Record, ...]:
    out = []
    for cell in read_cells_csv(run / "cells.csv").to_dict("records"):
        params = json.loads(cell.get("params") or "{}")
        settings = set(params) | {"bootstrap_seed", "bootstrap_resamples"}
        numbers = {
            column: float(value)
            for column, value in cell.items()
            if column not in settings and RESULT_COLUMNS.match(column) and _is_number(value)
        }
        # the per-model columns (pass_ms, forwards) and acceptance by position are JSON in a cell
        nested = {
            column: [float(v) for v in _leaves(json.loads(value)) if _is_number(v)]
            for column, value in cell.items()
            if isinstance(value, str) and value[:1] in "{[" and RESULT_COLUMNS.match(column)
        }
        by_unit = tuple(
            (
                unit,
                tuple(v for c, v in numbers.items() if re.search(pattern, c))
                + tuple(v for c, vs in nested.items() if re.search(pattern, c) for v in vs)
                + (tuple(1000 * v for c, v in numbers.items() if c.endswith("_s")) if unit == "ms" else ()),
            )
            for unit, pattern in COLUMNS.items()
        )
        triples = tuple(
            (numbers[c], numbers[f"{c}_low"], numbers[f"{c}_high"])
            for c in numbers
            if f"{c}_low" in numbers and f"{c}_high" in numbers
        )
        everything = (*numbers.values(), *(v for vs in nested.values() for v in vs))
        out.append(Record(everything, triples, by_unit, cell_names(cell, params), row=(str(run), len(out))))
    return tuple(out)


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _leaves(value) -> list:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


@functools.cache
def _paperrecords_of() -> tuple[Record, ...]:
    return tuple(record for path in PAPERS for record in _textrecords_of(path))


def _decimals(written: str) -> int:
    return len(written.split(".")[1].split("e")[0]) if "." in written else 0


@functools.lru_cache(maxsize=65536)
def _written(written: str) -> tuple[str, int, float]:
    plain = written.replace(",", "")
    decimals = _decimals(plain)
    return plain, decimals, float(plain)


def shows(value: float, written: str) -> bool:
    """``written`` is ``value`` rounded to the decimals it shows."""
    plain, decimals, near = _written(written)
    # most values are far from it: rule them out before formatting
    return abs(abs(value) - near) <= 0.6 * 10**-decimals and f"{abs(value):.{decimals}f}" == plain


def is_in(quoted: Quoted, records: tuple[Record, ...]) -> bool:
    if quoted.kind == "range":  # a cell's bounds, or two numbers side by side in a line of a report
        low, high = quoted.bounds
        pairs = [pair for record in records for pair in record.bounds]
        pairs += [(a, b) for record in records if not record.decimals for _, a, b in record.triples]
        return any(shows(a, low) and shows(b, high) for a, b in pairs)
    if quoted.kind == "interval":
        low, high = quoted.bounds
        return any(
            shows(x, quoted.text) and shows(a, low) and shows(b, high)
            for record in records
            for x, a, b in record.triples
        )
    decimals = _decimals(quoted.text)
    if quoted.kind == "percent":  # a fraction's hundredfold, or a percentage the file writes
        fractions = (v for record in records for v in record.of_unit("", decimals + 2) if v <= 1)
        return any(shows(100 * v, quoted.text) for v in fractions) or any(
            shows(v, quoted.text) for record in records for v in dict(record.by_unit).get("%", ())
        )
    return any(shows(v, quoted.text) for record in records for v in record.of_unit(quoted.unit, decimals))


def _sentence(text: str, start: int) -> str:
    begin = max(text.rfind(". ", 0, start), text.rfind("\n-", 0, start), 0)
    end = text.find(". ", start)
    return text[begin : end if end > 0 else len(text)]


def unmatched(paragraph: Paragraph, text: str | None = None) -> list[str]:
    """The numbers ``text`` (the paragraph's own, or a changed copy) quotes that its files do not hold."""
    text = paragraph.text if text is None else text
    return [shown(quoted) for quoted in quoted_numbers(text) if not holds(paragraph, text, quoted)]


def holds(paragraph: Paragraph, text: str, quoted: Quoted, within: frozenset[str] | None = None) -> bool:
    """A file the paragraph cites holds ``quoted`` (of ``text``), in a record its sentence may speak of
    (doc_cells.py), and in one row with the numbers it is compared with (``A against B, a-b``: two
    cells and their paired interval); or the sentence speaks of a paper and quotes its number. ``within``:
    only the rows of those :attr:`Record.where` (a pin's, doc_pins.py)."""
    named = {} if quoted.kind == "interval" else named_around(text, quoted.start)
    records = _records_named(paragraph.cited, tuple(sorted(named.items())))
    papers = _paperrecords_of()
    if within is not None:
        records = tuple(r for r in records if r.where in within)
        papers = tuple(r for r in papers if r.where in within)
    compared = _compared_with(text, quoted)
    if compared and _in_one_row([quoted, *compared], records) or not compared and is_in(quoted, records):
        return True
    return bool(PAPER_WORDS.search(_sentence(text, quoted.start))) and is_in(quoted, papers)


@functools.lru_cache(maxsize=4096)
def _records_named(cited: tuple[Path, ...], named: tuple[tuple[str, str], ...]) -> tuple[Record, ...]:
    """The records of the cited files that a sentence giving the ``named`` names may speak of."""
    return tuple(r for path in cited for r in records_of(path) if may_be(r.label, dict(named)))


# a comparison and its paired interval: "1.79 against 1.62 (0.853-0.937)", "1.27 against 1.22, 0.926-0.986"
COMPARED = re.compile(r"^[^()\d;]{0,40}against\s+[^()\d;]{0,30}$")
BETWEEN_PAIR_AND_INTERVAL = re.compile(r"^(?:[^\d;]|\b95%){0,100}$")


def _compared_with(text: str, quoted: Quoted) -> list[Quoted]:
    """The other numbers of the comparison ``quoted`` is one of: a pair of cells written "A against B"
    followed by their paired interval as bounds; none where it is not such a pair's."""
    numbers = quoted_numbers(text)
    for i in range(len(numbers) - 2):
        first, second, interval = numbers[i : i + 3]
        if quoted not in (first, second, interval) or interval.kind != "range":
            continue
        if first.kind != "decimal" or second.kind != "decimal":
            continue
        if COMPARED.match(
            text[first.start + len(first.text) : second.start]
        ) and BETWEEN_PAIR_AND_INTERVAL.match(text[second.start + len(second.text) : interval.start]):
            return [q for q in (first, second, interval) if q != quoted]
    return []


def _in_one_row(numbers: list[Quoted], records: tuple[Record, ...]) -> bool:
    rows: dict = {}
    for record in records:
        rows.setdefault(record.row, []).append(record)
    return any(all(is_in(q, tuple(row)) for q in numbers) for row in rows.values())


def shown(quoted: Quoted) -> str:
    if quoted.kind == "range":
        return f"{quoted.bounds[0]}-{quoted.bounds[1]}"
    if quoted.kind == "interval":
        return f"{quoted.text} [{quoted.bounds[0]}, {quoted.bounds[1]}]"
    return quoted.text + ("%" if quoted.kind == "percent" else "")
