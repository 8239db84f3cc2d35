"""A data set's faults told in a second, by key: a ``task.dataset`` that is neither a builder, a
local folder nor reachable, and the line of a JSON file that does not parse.

Why: ``task.dataset='jsonl'`` (natural for ``.jsonl`` files) is not one of ``datasets``' builders,
so ``load_dataset`` took it for a hub id and, offline, retried the hub for 26-48 s before the same
error twice, with no hint of ``json``. A malformed JSON Lines row came back as a generic
``DatasetGenerationError``, the parser's own position (``in row 41``, counted from 0) only on a
log line printed above it.

- :func:`hub_fault`: a name that is not a builder nor an existing path is a hub id; when the hub
  cannot be reached (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set, or no connection to its
  host within :data:`PROBE_S`) and the id is in no local cache, the error is immediate, with the
  builder it most resembles (``did you mean 'json'``);
- :func:`json_fault`: the first line of a JSON Lines file (or the place in a JSON document) that
  does not parse, 1-based, with Python's parser's message, read only after ``load_dataset`` failed.
"""

from __future__ import annotations

import difflib
import json
import os
import socket
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

ALIASES = {"jsonl": "json", "jsonlines": "json", "ndjson": "json", "tsv": "csv", "txt": "text", "pq": "parquet",
           "feather": "arrow", "ipc": "arrow"}
"""File kinds that are not builder names -> the builder that reads them."""
PROBE_S = 2.0
"""Seconds the hub's host has to accept a connection before it counts as unreachable."""
_TRUE = ("1", "true", "yes", "on")


def did_you_mean(source: str, builders: tuple[str, ...]) -> str:
    """``"; did you mean 'json' (it reads .jsonl files)?"`` for a name near a builder, else ""."""
    name = source.strip().lower().lstrip(".")
    if name in ALIASES:
        return f"; did you mean {ALIASES[name]!r} (it reads .{name} files)?"
    near = difflib.get_close_matches(name, builders, n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(map(repr, near))}?" if near else ""


@lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """Whether the model hub's host accepts a connection (once per process; offline settings say no)."""
    if any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((endpoint.hostname or "huggingface.co", endpoint.port or 443), PROBE_S).close()
    except OSError:
        return False
    return True


def hub_cached(source: str) -> bool:
    """Whether a hub data set ``source`` was read here before (the hub's or ``datasets``' cache)."""
    try:
        import datasets.config
        from huggingface_hub import constants
    except ImportError:
        return False
    return (Path(constants.HF_HUB_CACHE) / f"datasets--{source.replace('/', '--')}").is_dir() or \
        (Path(datasets.config.HF_DATASETS_CACHE) / source.replace("/", "___")).is_dir()


def hub_fault(source: str, builders: tuple[str, ...]) -> str:
    """Why ``task.dataset=source`` (not a builder, not an existing path) cannot be read from here,
    without waiting on the hub; "" when it may be (the hub answers, or a cache has it)."""
    if hub_reachable() or hub_cached(source):
        return ""
    return (f"task.dataset={source!r} is not a builder that reads files ({', '.join(builders)}) nor a local "
            f"folder, and the hub cannot be reached from here to look it up as a data set's id"
            f"{did_you_mean(source, builders) or ': give a builder with task.data_files, or a local folder'}")


def json_fault(path: Path) -> str:
    """Where a JSON Lines file (or a JSON document) stops parsing: ``line 42, column 38: Expecting
    ',' delimiter`` (1-based, Python's parser's words), or "" when every row parses."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("[") or (path.suffix == ".json" and not _first_line_parses(text)):
        try:  # one document: an array of rows, or an object whose field holds them
            json.loads(text)
            return ""
        except json.JSONDecodeError as exc:
            return f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            return f"line {number}, column {exc.colno}: {exc.msg}"
        if not isinstance(row, dict):
            return f"line {number}: a row must be a JSON object {{...}}, got {type(row).__name__}"
    return ""


def _first_line_parses(text: str) -> bool:
    line = next((x for x in text.splitlines() if x.strip()), "")
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def innermost(exc: BaseException) -> BaseException:
    """The exception at the bottom of ``exc``'s causes (``datasets`` wraps the parser's own)."""
    seen = {id(exc)}
    while (nxt := exc.__cause__ or exc.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        exc = nxt
    return exc
