"""The linter: ``ruff check`` over the whole repository finds nothing.

The rules are ``[tool.ruff]`` in pyproject.toml (pycodestyle, pyflakes, import order, bugbear,
pyupgrade; 120 columns); ruff comes with the ``test`` extra. A finding is fixed in the code, or,
where the code is right as it is, silenced on its line with ``# noqa: <rule>`` and the reason.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str] | None:
    """The command that runs ruff: this interpreter's package, else a ``ruff`` on PATH."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    exe = shutil.which("ruff")
    return [exe] if exe else None


def test_ruff_check_finds_nothing():
    cmd = _ruff()
    if cmd is None:
        pytest.skip("ruff is not installed: pip install -e '.[test]' (or pip install 'ruff>=0.17')")
    proc = subprocess.run([*cmd, "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"`ruff check .` failed (exit {proc.returncode}); fix these, or run `ruff check --fix .` for the "
        f"safe fixes:\n{proc.stdout}{proc.stderr}")
