"""Which of the cited cells or lines a quoted number can be, and what it measures (tests/doc_numbers.py).

A number is read against the records of the files its paragraph cites (a cell of cells.csv, a line of
a text file, a column of a text file's table row), and a lone ``1.62`` would match one of hundreds of
values there by chance. So a record carries the names that identify it, of a few kinds: the dataset
(``gsm8k``, ``mmlu``, ...), Spec-Bench's category, CS Drafting's cost model (SWI-MS or SWI-PW) and the
settings (``k=4``, ``k00=2``, ``nodes=24``, ...): a cell from its dataset and parameters, a line from
its words, a table row's column from the row's words and the column's header. A sentence (or a table
row of the document, with its column's header) that names exactly one of a kind speaks of it: its
numbers are read only against records that name that one or none of that kind. A sentence naming two
datasets ties nothing by dataset, so a sentence that quotes one dataset's numbers names that one alone.
What a number measures, where no unit follows it, its table column's header says, or the number before
it that it is compared with or listed after.
"""

from __future__ import annotations

import re

# the kinds of names that identify a record; a setting (``k=4``) is a kind of its own by its name
KINDS = {
    "dataset": "gsm8k mmlu alpaca humaneval passages arithmetic spec_bench wmt cnn xsum",
    "category": "translation summarization qa math rag mt_bench",
    "costs": "ms_costs pw_costs",
}
KIND_OF = {word: kind for kind, names in KINDS.items() for word in names.split()}
# how prose, reports and cell names write those names
SPELLINGS = [
    (r"\b(MS|PW)\b", lambda m: f" {m.group(1).lower()}_costs "),  # capitals: CS Drafting's costs, not ms
    # a dataset's file name joins its words with "_" (wmt14_en_de/test, cnn_dailymail/test)
    (r"(?<![a-z0-9])spec[-_ ]bench(?![a-z0-9])", " spec_bench "),
    (r"(?<![a-z0-9])wmt(?:14)?(?![a-z0-9])", " wmt "),
    (r"(?<![a-z0-9])(?:cnn|dailymail)(?![a-z0-9])", " cnn "),
    (r"(?<![a-z0-9])mt[-_ ]bench(?![a-z0-9])", " mt_bench "),
    (r"(?<![a-z0-9])(gsm8k|mmlu|alpaca|humaneval|passages|arithmetic|xsum)(?![a-z0-9])", r" \1 "),
    (r"\b(k|k00|depth|nodes|threshold|rule|lenience|mag_tail)\s*=\s*(\d+(?:\.\d+)?|[a-z_]\w*)", r" \1=\2 "),
]
WORD = re.compile(r"[a-z][a-z0-9_]*(?:=[\w.]+)?")
SENTENCE_END = re.compile(r"[.;](?=\s)|\n\s*- ")
TABLE_RULE = re.compile(r"\s*\|[\s:|-]+\|\s*$")


def names(text: str) -> frozenset[str]:
    """The identifying names a piece of text gives: a line of a file, a sentence, a cell's name."""
    for pattern, spelling in SPELLINGS:
        text = re.sub(pattern, spelling, text, flags=re.IGNORECASE if isinstance(spelling, str) else 0)
    return frozenset(w for w in WORD.findall(text.lower()) if w in KIND_OF or "=" in w)


# how a table row's label, a report's line or a cell's name writes a method (a kind read only from a
# document's table row: prose names the methods a number is compared with as often as its own)
METHODS = {
    "ar": r"\bar\b|\bautoregressive\b",
    "sd": r"\bs\.? ?decoding\b|\bspeculative decoding\b|\bsd\b|\bspecdec\b(?!\+)",
    "cs": r"\bcs[- ]drafting\b|\bcs\b",
    "medusa": r"\bmedusa\b",
    "eagle": r"\beagle\b(?!-3)",
    "eagle3": r"\beagle-?3\b",
    "specdecpp": r"\bspecdec(?:\+\+|pp)",
    "vllm": r"\bvllm\b",
}


def method_names(text: str) -> frozenset[str]:
    return frozenset(f"method={m}" for m, said in METHODS.items() if re.search(said, text, re.IGNORECASE))


def cell_names(cell: dict, settings: dict) -> frozenset[str]:
    """A cell's names: its dataset, method and settings (a one-level cascade's K=[[2]] is the papers' K00 =
    2)."""
    found = set(names(str(cell.get("dataset")).replace("/", " ")))
    found |= method_names(re.split(r"[\[-]", str(cell.get("cell")))[0])
    for name, value in settings.items():
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            found.add(f"{name.lower()}={value:g}" if isinstance(value, float) else f"{name.lower()}={value}")
    k = settings.get("K")
    if isinstance(k, list) and len(k) == 1 and isinstance(k[0], list) and len(k[0]) == 1:
        found.add(f"k00={k[0][0]}")
    return frozenset(found)


def _kind(name: str) -> str:
    return name.split("=")[0] + "=" if "=" in name else KIND_OF[name]


def _settings_equal(a: str, b: str) -> bool:
    """``k=4`` and ``k=4``; ``lenience=3`` and ``lenience=3.0``."""
    if a == b:
        return True
    (name_a, value_a), (name_b, value_b) = a.split("=", 1), b.split("=", 1)
    try:
        return name_a == name_b and float(value_a) == float(value_b)
    except ValueError:
        return False


def named_around(text: str, start: int) -> dict[str, str]:
    """The one name of each kind that the sentence (or table row) holding ``text[start]`` gives, for the
    kinds it names once."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    line = text[line_start : line_end if line_end >= 0 else len(text)]
    if line.lstrip().startswith("|"):
        cells = line.split("|")
        label = " ".join(cell for i, cell in enumerate(cells) if i == 1 or not re.search(r"\d", cell))
        found = names(label + " " + column_header(text, start)) | method_names(cells[1])
    else:
        begin = max([m.end() for m in SENTENCE_END.finditer(text, 0, start)] + [0])
        after = SENTENCE_END.search(text, start)
        found = names(text[begin : after.start() if after else len(text)])
    by_kind: dict[str, set[str]] = {}
    for name in found:
        by_kind.setdefault(_kind(name), set()).add(name)
    return {kind: next(iter(found)) for kind, found in by_kind.items() if len(found) == 1}


def column_header(text: str, start: int) -> str:
    """The header of the markdown table column holding ``text[start]`` ("" outside a table)."""
    line_start = text.rfind("\n", 0, start) + 1
    line = text[line_start:].split("\n", 1)[0]
    if not line.lstrip().startswith("|"):
        return ""
    lines = text[:line_start].split("\n")[:-1]
    for i in range(len(lines) - 1, 0, -1):
        if TABLE_RULE.match(lines[i]):
            cells = lines[i - 1].split("|")
            column = line[: start - line_start].count("|")
            return cells[column] if column < len(cells) else ""
        if not lines[i].lstrip().startswith("|"):
            break
    return ""


# what a table's column header says its numbers are
HEADER_UNITS = {
    "tokens a pass": r"tokens (?:a|per) (?:target |verification )?(?:pass|step)|acc\. len",
    "tokens/s": r"\b(?:tok|tokens)/s\b",
    "ms": r"\bms\b",
    "x": r"speedup|×|\bvs\.? ",
}
# a number compared with or listed after one whose unit is written: "1.61x, 1.70x and 1.70x", "1.58
# tokens per target pass for the tree and 1.29 for the chain"
JOINED = re.compile(r"^[^\d;:()\[\].]{0,40}$")
JOINER = re.compile(r"\b(?:against|and|or|to|than)\b|,|/")


def unit_said_nearby(text: str, start: int, previous: tuple[int, str] | None) -> str:
    """The unit of a number written without one at ``text[start]``: its table column's, or that of the
    number before it (``previous``: where that one's written form ends, and its unit) where the words
    between join the two."""
    header = column_header(text, start)
    unit = next((unit for unit, said in HEADER_UNITS.items() if re.search(said, header)), "")
    if not unit and previous:
        between = text[previous[0] : start]
        if JOINED.match(between) and JOINER.search(between):
            unit = previous[1]
    return unit


def may_be(label: frozenset[str], named: dict[str, str]) -> bool:
    """A record may hold a number whose sentence names ``named`` unless it names another of a kind."""
    for kind, name in named.items():
        own = [n for n in label if _kind(n) == kind]
        if own and not any(_settings_equal(n, name) if "=" in name else n == name for n in own):
            return False
    return True
