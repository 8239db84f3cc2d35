"""Where the shipped tiny models are (``ftis_flwr/assets/tiny``: bfloat16 safetensors, each with a
manifest holding its SHA-256), found by name. Apart from :mod:`ftis_flwr.node.tiny.models`, which installs
them, because the tiny tokenizers' files ship there too (:mod:`ftis_flwr.node.tiny.bpe`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def shipped_dirs() -> list[Path]:
    """Folders that may hold shipped warm-starts, most specific first.

    The package's own ``assets/tiny``; and, when this module was imported from a copy without
    them (Flower runs apps from an unpacked bundle that holds only .py/.toml/.yaml/.json/.md
    files), the installed distribution's copy: its files, or the source folder of an editable
    install.
    """
    dirs = [Path(__file__).resolve().parents[2] / "assets" / "tiny"]
    try:
        from importlib import metadata

        dist = metadata.distribution("ftis-flwr")
        dirs.append(Path(str(dist.locate_file("ftis_flwr/assets/tiny"))))
        direct = dist.read_text("direct_url.json")
        if direct:
            url = json.loads(direct).get("url", "")
            if url.startswith("file://"):
                dirs.append(Path(url[len("file://"):]) / "ftis_flwr" / "assets" / "tiny")
    except Exception:  # not installed as a distribution: the package folder is all there is
        pass
    seen, out = set(), []
    for d in dirs:
        if d not in seen and d.is_dir():
            seen.add(d)
            out.append(d)
    return out


def find_shipped(name: str) -> tuple[Path, dict[str, Any]] | None:
    """(weights file, manifest) of the shipped warm-start called ``name``, or None."""
    for d in shipped_dirs():
        weights, manifest = d / f"{name}.safetensors", d / f"{name}.json"
        if weights.is_file() and manifest.is_file():
            return weights, json.loads(manifest.read_text())
    return None
