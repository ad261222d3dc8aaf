"""The README and the claims ledger (results/CLAIMS.md) quote committed results: every number they quote
is in the file it names, and every such paragraph names the machine that measured it (a number from one
CPU kind is not the demo's on another)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specbench.models.machine import recorded_machine

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", ROOT / "results" / "CLAIMS.md"]
CPU_WORDS = ("Xeon", "EPYC", "H100", "H200", "A100")


def _paragraphs() -> list[str]:
    texts = [path.read_text() for path in DOCUMENTS if path.is_file()]
    return [p for text in texts for p in re.split(r"\n\s*\n", text) if "results/" in p]


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


def _named(paragraph: str) -> list[Path]:
    """The committed files and run directories a paragraph names."""
    found = []
    for match in re.finditer(r"results/[A-Za-z0-9_./{},\-]+", paragraph):
        for path in _expand(match.group(0).rstrip(".,)`")):
            if (ROOT / path).exists() and (ROOT / path) not in found:
                found.append(ROOT / path)
    return found


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in (".csv", ".json", ".txt"))


def _written(path: Path) -> set[str]:
    """Every decimal number in the files, as written and rounded to fewer decimals, and as a percentage."""
    out = set()
    for file in _files(path):
        # a minus sign after a digit joins a range ("0.92-1.06"), it does not negate the number
        for token in re.findall(r"(?<![\d.])-?\d+\.\d+(?:e-?\d+)?", file.read_text(errors="replace")):
            value = float(token)
            out.add(token)
            for digits in range(4):
                out.update((f"{value:.{digits}f}", f"{100 * value:.{digits}f}"))
    return out


def _recorded(path: Path):
    run = path if path.is_dir() else path.parent
    if not (run / "environment.json").is_file():
        return None
    return recorded_machine(json.loads((run / "environment.json").read_text()))


def _machine_word(path: Path) -> str | None:
    """The CPU or GPU name of the machine that measured a committed file or run, where it says."""
    machine = _recorded(path)
    if machine is not None:
        text = machine.describe()
    else:
        text = path.read_text(errors="replace")[:400] if path.is_file() else ""
    return next((word for word in CPU_WORDS if word in text), None)


PARAGRAPHS = _paragraphs()


def test_the_readme_quotes_committed_results():
    assert len([p for p in PARAGRAPHS if _named(p)]) >= 8


@pytest.mark.parametrize("paragraph", PARAGRAPHS, ids=lambda p: " ".join(p.split())[:60])
def test_every_number_quoted_from_results_is_in_the_file_it_names(paragraph: str):
    named = _named(paragraph)
    if not named:
        return
    written = set().union(*(_written(path) for path in named))
    quoted = re.findall(r"(?<![\w.])\d+\.\d+", paragraph)
    missing = [number for number in quoted if number not in written]
    assert not missing, f"{missing} are in no file of {[str(p.relative_to(ROOT)) for p in named]}"


@pytest.mark.parametrize("paragraph", PARAGRAPHS, ids=lambda p: " ".join(p.split())[:60])
def test_a_paragraph_quoting_results_names_the_machine_that_measured_them(paragraph: str):
    if not re.search(r"(?<![\w.])\d+\.\d+", paragraph):
        return
    for path in _named(paragraph):
        word = _machine_word(path)
        assert word is None or word in paragraph, f"{path.relative_to(ROOT)} was measured on a {word}"


@pytest.mark.parametrize("paragraph", PARAGRAPHS, ids=lambda p: " ".join(p.split())[:60])
def test_a_paragraph_states_the_matrix_units_its_runs_had(paragraph: str):
    """ "AVX2 only" about a run measured with AVX512-BF16 (or AMX) is a wrong claim about the machine."""
    machines = [m for m in map(_recorded, _named(paragraph)) if m is not None]
    flat = " ".join(paragraph.split())
    for machine in machines:
        if "AVX2 only" in flat:
            assert machine.matrix_units == "AVX2 only", machine.describe()
        if "with AMX" in flat:
            assert any(m.matrix_units == "AMX" for m in machines), machine.describe()
