"""Pins: the quoted numbers a changed last digit could leave passing, each bound to the row that holds it.

doc_numbers.py matches a number against the records its sentence may speak of. Where those records hold
values one last digit apart (a sentence quoting three cells' speedups names none of them), a number with
its last digit changed would still be read there; so would an interval with a bound changed, where two
cells share a speedup and its other bound. Each such number is pinned in tests/doc_pins.json: its
document, the words before it, the number as written, and the row that holds it
(``results/.../report.txt:42``, ``results/.../cells.csv:7``, a line of a paper's reference.yaml). The check
(tests/test_readme_numbers.py) then fails when a pinned number is written otherwise (its pin no longer
matches anything quoted, and the new number has none), when a pinned row no longer holds its number (the
results changed under it), and when a number that needs a pin has none.

``python tests/doc_pins.py`` rewrites the pins the documents need: every pin that still holds is kept,
a new one gets the first row that holds its number, and what it added and dropped is printed. Review
that as you review the numbers themselves: a pin says which row a number is.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from doc_numbers import (
    ROOT,
    Paragraph,
    Quoted,
    _named,
    _paperrecords_of,
    holds,
    is_in,
    quoted_numbers,
    records_of,
    shown,
)

PINS = ROOT / "tests" / "doc_pins.json"
BEFORE = 32  # characters of the words before a number that, with it, name it in its document


@dataclass(frozen=True, order=True)
class Key:
    document: str
    before: str  # the words before the number (whitespace collapsed), the last BEFORE characters
    number: str  # as doc_numbers.shown writes it: "1.64", "12.5%", "240"
    occurrence: int = 0  # the same words and number earlier in the document


@dataclass(frozen=True)
class Pin:
    key: Key
    row: str  # Record.where: the row that holds the number


def _before(text: str, start: int) -> str:
    return " ".join(text[max(0, start - 4 * BEFORE) : start].split())[-BEFORE:]


def keyed(paragraphs: list[Paragraph], texts: dict[Paragraph, str] | None = None):
    """Every number the paragraphs quote, by its key: (paragraph, the text read, quoted). ``texts``
    replaces a paragraph's text (a changed copy)."""
    out, seen = {}, {}
    for paragraph in paragraphs:
        text = (texts or {}).get(paragraph, paragraph.text)
        document = paragraph.document.relative_to(ROOT).as_posix()
        for quoted in quoted_numbers(text):
            base = (document, _before(text, quoted.start), shown(quoted))
            occurrence = seen[base] = seen.get(base, -1) + 1
            out[Key(*base, occurrence)] = (paragraph, text, quoted)
    return out


def with_last_digit(text: str, quoted: Quoted, digit: int) -> tuple[str, Quoted | None]:
    """``text`` with the last digit of ``quoted`` as written set to ``digit``, and the number then read
    there (none if no number is read there any more)."""
    at = quoted.start + max(i for i, c in enumerate(quoted.text) if c.isdigit())
    text = text[:at] + str(digit) + text[at + 1 :]
    return text, next((q for q in quoted_numbers(text) if q.start == quoted.start), None)


@functools.cache
def _written_values(cited: tuple[Path, ...]) -> frozenset[str]:
    """Every way a value of the cited files (and the papers') can be written, to 0-4 decimals, a
    fraction also as its hundredfold: a number written otherwise is held by none of them."""
    out = set()
    for record in [r for path in cited for r in records_of(path)] + list(_paperrecords_of()):
        values = {*record.values, *(v for _, vs in record.by_unit for v in vs)}
        values |= {v for triple in record.triples for v in triple}
        values |= {v for pair in record.bounds for v in pair}
        for value in map(abs, values):
            for decimals in range(5):
                out.add(f"{value:.{decimals}f}")
                if value <= 1:
                    out.add(f"{100 * value:.{decimals}f}")
    return frozenset(out)


def number_parts(text: str, quoted: Quoted) -> list[tuple[int, str]]:
    """Where each number ``quoted`` is made of starts in ``text``, and how it is written: the number,
    and for an interval its two bounds."""
    parts = [(quoted.start, quoted.text)]
    if quoted.kind == "interval":
        low, high = quoted.bounds
        at_low = text.find(f"{low},", quoted.start)
        at_high = text.find(f"{high}]", at_low + len(low))
        if at_low > 0 and at_high > 0:
            parts += [(at_low, low), (at_high, high)]
    return parts


@functools.cache
def needs_pin(paragraph: Paragraph, text: str, quoted: Quoted) -> bool:
    """``quoted`` holds as written and would with some other last digit too (of the number, or of either
    bound of an interval: two cells of one file can share a speedup and its lower bound)."""
    if not holds(paragraph, text, quoted):
        return False
    written = _written_values(paragraph.cited)
    for start, part in number_parts(text, quoted):
        last = max(i for i, c in enumerate(part) if c.isdigit())
        for digit in "0123456789":
            number = part[:last] + digit + part[last + 1 :]
            if number == part or number.replace(",", "") not in written:
                continue
            changed_text = text[: start + last] + digit + text[start + last + 1 :]
            changed = next((q for q in quoted_numbers(changed_text) if q.start == quoted.start), None)
            if changed is not None and holds(paragraph, changed_text, changed):
                return True
    return False


def read_pins(path: Path = PINS) -> dict[Key, Pin]:
    if not path.is_file():
        return {}
    pins = [Pin(Key(**entry["key"]), entry["row"]) for entry in json.loads(path.read_text())]
    return {pin.key: pin for pin in pins}


def pin_holds(pin: Pin, found: dict) -> bool:
    paragraph, text, quoted = found[pin.key]
    return holds(paragraph, text, quoted, within=frozenset([pin.row]))


def rows_holding(paragraph: Paragraph, text: str, quoted: Quoted) -> list[str]:
    """The rows each of which alone holds ``quoted``: first those of the runs the paragraph or its
    section's heading names (a results README cites its whole folder, whose other runs can hold the
    same number by chance), then in the order the paragraph cites them."""
    records = [r for path in paragraph.cited for r in records_of(path)] + list(_paperrecords_of())
    rows = dict.fromkeys(r.where for r in records if is_in(quoted, (r,)))
    held = [row for row in rows if holds(paragraph, text, quoted, within=frozenset([row]))]
    named = _named_here(paragraph)
    return sorted(held, key=lambda row: not any((ROOT / row.split(":")[0]).is_relative_to(p) for p in named))


def _named_here(paragraph: Paragraph) -> list[Path]:
    """The results the paragraph names, and those its section's heading names."""
    lines = paragraph.document.read_text().split("\n")[: paragraph.line - 1]
    heading = next((line for line in reversed(lines) if line.startswith("#")), "")
    return _named(paragraph.text, paragraph.document) + _named(heading, paragraph.document)


def failures(paragraphs: list[Paragraph], pins: dict[Key, Pin], excused, texts=None) -> list[str]:
    """What the pins find wrong in the documents (``texts``: changed copies of some paragraphs): a pin
    whose number is quoted no more, a pinned row that no longer holds its number, and a number that needs
    a pin and has none. ``excused(paragraph, number)``: numbers checked elsewhere (by hand, or known)."""
    found = keyed(paragraphs, texts)
    out = [f"{k.document}: {k.number} after '{k.before}' is quoted no more" for k in pins if k not in found]
    out += [
        f"{key.document}: {key.number} after '{key.before}' is not in {pin.row}"
        for key, pin in pins.items()
        if key in found and not pin_holds(pin, found)
    ]
    out += [
        f"{key.document}: {key.number} after '{key.before}' needs a pin (python tests/doc_pins.py)"
        for key, (paragraph, text, quoted) in found.items()
        if key not in pins and not excused(paragraph, key.number) and needs_pin(paragraph, text, quoted)
    ]
    return out


def write_pins() -> None:
    from test_readme_numbers import CHECKED, _excused

    old, found = read_pins(), keyed(CHECKED)
    pins, unheld = [], []
    for key, (paragraph, text, quoted) in found.items():
        if _excused(paragraph, key.number) or not needs_pin(paragraph, text, quoted):
            continue
        if key in old and pin_holds(old[key], found):
            pins.append(old[key])
            continue
        rows = rows_holding(paragraph, text, quoted)
        if not rows:  # the match reads one row at a time, so none should be; the check will name it
            unheld.append(key)
            continue
        pins.append(Pin(key, rows[0]))
        print(f"+ {key.document}: {key.number} after '{key.before}' -> {rows[0]}")
    for key in old.keys() - {pin.key for pin in pins}:
        print(f"- {key.document}: {key.number} after '{key.before}' ({old[key].row})")
    for key in unheld:
        print(f"! {key.document}: {key.number} after '{key.before}' is in no one row", file=sys.stderr)
    lines = [json.dumps({"key": asdict(pin.key), "row": pin.row}, ensure_ascii=False) for pin in pins]
    PINS.write_text("[\n" + ",\n".join(lines) + "\n]\n")
    print(f"{len(pins)} pins in {PINS.relative_to(ROOT)}")


if __name__ == "__main__":
    write_pins()
