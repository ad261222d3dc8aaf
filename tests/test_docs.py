"""The README and docs/ name only what exists, so a renamed file or symbol fails here, not a reader.

Checked in README.md and every docs/*.md: each path under specbench/, scripts/, recipes/, tests/ or
results/ they name, in prose or code (a ``<placeholder>`` or ``*`` stands for any name, ``{a,b}`` for
each alternative, and the pattern must match a file or folder); each ``make TARGET`` in their code is a
target of the Makefile; each ``python -m MODULE`` is a module of the repository; each link to a document
reaches it, and its section where it names one; each dotted ``specbench.`` name in backticks (the
symbols docs/extending.md's checklists name) resolves by import. And the README stays a README: at most
MAX_README_LINES lines, the rest in docs/.
"""

from __future__ import annotations

import importlib
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *DOCS]
MAX_README_LINES = 320

# a path from the repository root: not inside another path (~/.cache/specbench/...) or a word
PATH = re.compile(r"(?<![\w./~$-])((?:specbench|scripts|recipes|tests|results)/[\w.*<>{},/-]*)")
MAKE = re.compile(r"\bmake\s+([a-z][\w-]*)")
MODULE = re.compile(r"\bpython -m ((?:specbench|scripts)(?:\.\w+)+)")
LINK = re.compile(r"\]\(([^()\s]+)\)")
SYMBOL = re.compile(r"`(specbench(?:\.\w+)+)`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`[^`]+`")


def _alternatives(pattern: str) -> list[str]:
    """``a_{x,y}.txt`` -> ``a_x.txt``, ``a_y.txt``; a ``<placeholder>`` -> ``*``."""
    pattern = re.sub(r"<[^<>/]*>", "*", pattern)
    parts = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[part] if i % 2 == 0 else part.split(",") for i, part in enumerate(parts)]
    return ["".join(chosen) for chosen in itertools.product(*choices)]


def _exists(pattern: str) -> bool:
    pattern = pattern.rstrip("/") or "."
    if any(c in pattern for c in "*?["):
        return next(ROOT.glob(pattern), None) is not None
    return (ROOT / pattern).exists()


def _code(text: str) -> str:
    """The text's fenced code blocks and code spans."""
    fences = FENCE.findall(text)
    rest = FENCE.sub("", text)
    return "\n".join([*fences, *SPAN.findall(rest)])


def _anchors(document: Path) -> set[str]:
    """GitHub's anchors of a document's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", FENCE.sub("", document.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            value = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is not None and module_name.startswith(error.name):
                continue
            raise
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def problems(text: str, document: Path, symbols: bool = True) -> list[str]:
    """What ``text`` (a document's, or a test's as if in ``document``) names that does not exist."""
    out = []
    for match in PATH.finditer(text):
        named = match.group(1).rstrip(".,:;")
        if not all(map(_exists, _alternatives(named))):
            out.append(f"no file {named}")
    makefile = (ROOT / "Makefile").read_text()
    code = _code(text)
    for target in dict.fromkeys(MAKE.findall(code)):
        if not re.search(rf"^{re.escape(target)}\s*:", makefile, re.MULTILINE):
            out.append(f"no make target {target}")
    for module in dict.fromkeys(MODULE.findall(text)):
        path = ROOT / module.replace(".", "/")
        if not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()):
            out.append(f"no module {module}")
    for link in LINK.findall(text):
        if re.match(r"[a-z]+:", link):
            continue
        file, _, anchor = link.partition("#")
        target = (document.parent / file).resolve() if file else document
        if not target.exists():
            out.append(f"no document {link}")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            out.append(f"no section {link}")
    if symbols:
        out += [f"no symbol {name}" for name in dict.fromkeys(SYMBOL.findall(text)) if not _resolves(name)]
    return out


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d.relative_to(ROOT).as_posix())
def test_every_file_target_module_and_link_named_exists(document: Path):
    assert problems(document.read_text(), document, symbols=False) == []


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d.relative_to(ROOT).as_posix())
def test_every_dotted_symbol_named_resolves(document: Path):
    names = SYMBOL.findall(document.read_text())
    assert [name for name in dict.fromkeys(names) if not _resolves(name)] == []


def test_extending_names_a_file_and_a_symbol_for_every_kind():
    text = (ROOT / "docs" / "extending.md").read_text()
    kinds = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert len(kinds) >= 10
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        assert PATH.search(section) and SYMBOL.search(section), section.splitlines()[0]
    assert len(set(SYMBOL.findall(text))) >= 30 and len(set(PATH.findall(text))) >= 30


def test_a_typo_is_caught():
    text = (
        "See `specbench/decodng/speculative.py`, results/heads/nothing_here/ and "
        "`recipes/{demo,demoo}.yaml`; run `make demoo` and `python -m scripts.heads.no_such_script`; "
        "read [this](nowhere.md) and [that](extending.md#no-such-section); "
        "declare `specbench.methods.Methd`."
    )
    found = problems(text, ROOT / "docs" / "extending.md")
    assert found == [
        "no file specbench/decodng/speculative.py",
        "no file results/heads/nothing_here/",
        "no file recipes/{demo,demoo}.yaml",
        "no make target demoo",
        "no module scripts.heads.no_such_script",
        "no document nowhere.md",
        "no section extending.md#no-such-section",
        "no symbol specbench.methods.Methd",
    ]
    good = (
        "See `specbench/decoding/speculative.py`, `specbench/papers/<paper>/reference.yaml`, "
        "`recipes/{demo,quickstart}.yaml` and `tests/fixtures/vllm/*.json`; run `make demo` and "
        "`python -m scripts.heads.loop_ops`; read [this](extending.md#a-method); "
        "declare `specbench.methods.Method`."
    )
    assert problems(good, ROOT / "docs" / "extending.md") == []


def test_the_readme_stays_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move the detail to docs/"
