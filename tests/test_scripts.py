"""The experiment harnesses under scripts/ stay importable and honest: importing one runs nothing (its
work waits under ``if __name__ == "__main__"``), it reaches specbench through public names only (a
private one may change under it without a test noticing), and a shell script at least parses."""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
MODULES = sorted(SCRIPTS.rglob("*.py"))
SHELL_SCRIPTS = sorted(SCRIPTS.rglob("*.sh"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_specbench_names(tree: ast.Module) -> list[str]:
    """``specbench`` names starting with an underscore that the module imports or reads off an imported
    specbench module (``teacher._slug``); dunders such as ``specbench.__file__`` are public."""

    def private(name: str) -> bool:
        return name.startswith("_") and not name.endswith("__")

    found, bound = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "specbench":
                continue
            found += [node.module for part in node.module.split(".") if private(part)]
            found += [f"{node.module}.{alias.name}" for alias in node.names if private(alias.name)]
            bound |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "specbench":
                    found += [alias.name for part in alias.name.split(".") if private(part)]
                    bound.add(alias.asname or "specbench")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            if private(node.attr):
                found.append(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SCRIPTS)))
def test_script_imports_without_running(path: Path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setattr(sys, "argv", [str(path)])  # a script that read its arguments at import would fail
    with mock.patch.dict(os.environ):  # whatever a script sets for itself at import stays with it
        importlib.import_module(module_name(path))
    printed = capsys.readouterr().out
    assert not printed, f"{path.relative_to(ROOT)} printed at import: put its work in main()"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SCRIPTS)))
def test_script_uses_public_specbench_names(path: Path):
    private = private_specbench_names(ast.parse(path.read_text(), str(path)))
    assert not private, f"{path.relative_to(ROOT)} uses private specbench names {private}: expose them"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
@pytest.mark.parametrize("path", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(SCRIPTS)))
def test_shell_script_parses(path: Path):
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_private_names_are_found():
    tree = ast.parse(
        "from specbench.training.teacher import _slug, teacher_data\n"
        "from specbench.training import teacher as t\n"
        "import specbench.models._private\n"
        "print(t._slug, t.teacher_data, t.__file__)\n"
    )
    assert private_specbench_names(tree) == [
        "specbench.training.teacher._slug",
        "specbench.models._private",
        "t._slug",
    ]
