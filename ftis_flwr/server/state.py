"""The strategy's state after a round, on disk, so that a stopped ServerApp can be resumed.

Why: the strategy holds what the next round needs and nothing else has: the round reached, the
prompt cursor, the groups each node made last round (forwarded to the others next round, with
the train indices each source was given) and the rejection streaks. ``<run dir>/server_state/``
holds ``groups-NNNNNN.npz`` (the payloads' arrays, exactly as received) and ``state.json``,
written last with an atomic rename: it names its groups file, so a crash mid-save leaves the
previous state whole. Metrics and events live in the run folder already (ftis_flwr.server.reporting.reporter).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

VERSION = 1
FOLDER = "server_state"
_GROUPS = re.compile(r"groups-(\d{6})\.npz")


class ServerStateError(RuntimeError):
    """No usable saved state in a run folder; the message says what is missing."""


@dataclass
class ServerState:
    round: int
    """The last round whose replies were aggregated and logged."""
    next_prompt: int
    groups: dict[str, tuple[ArrayRecord, ConfigRecord, list[int]]] = field(default_factory=dict)
    streaks: dict[str, int] = field(default_factory=dict)
    schedule: dict | None = None
    """The asynchronous schedule's own state (``ftis_flwr.server.async_rounds``; JSON), None for
    synchronous rounds. ``round`` is then the last logged *step*, and ``groups`` holds the
    forwarding store keyed ``<source>@<source's round>``."""


def save_server_state(run_dir: Path, state: ServerState) -> Path:
    folder = Path(run_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    name = f"groups-{state.round:06d}.npz"
    arrays, sources = {}, {}
    for i, (src, (rec, meta, indices)) in enumerate(state.groups.items()):
        for key, arr in rec.items():
            arrays[f"{i}/{key}"] = arr.numpy()
        sources[src] = {"slot": i, "keys": list(rec.keys()), "meta": dict(meta), "indices": indices}
    tmp = folder / f".{name}.tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    os.replace(tmp, folder / name)
    doc = {"version": VERSION, "round": state.round, "next_prompt": state.next_prompt,
           "groups_file": name, "sources": sources, "streaks": state.streaks}
    if state.schedule is not None:
        doc["async"] = state.schedule
    tmp = folder / ".state.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, folder / "state.json")
    for old in folder.glob("groups-*.npz"):
        if old.name != name and _GROUPS.fullmatch(old.name):
            old.unlink(missing_ok=True)
    return folder


def load_server_state(run_dir: Path) -> ServerState:
    folder = Path(run_dir) / FOLDER
    path = folder / "state.json"
    if not path.is_file():
        raise ServerStateError(f"{run_dir} has no {FOLDER}/state.json: the run ended before its first "
                               "round was complete (start it again), or it is not a run folder")
    doc = json.loads(path.read_text())
    if doc.get("version") != VERSION:
        raise ServerStateError(f"{path} has version {doc.get('version')!r}; this code reads {VERSION}")
    groups = {}
    with np.load(folder / doc["groups_file"], allow_pickle=False) as z:
        for src, s in doc["sources"].items():
            rec = ArrayRecord({k: Array.from_numpy_ndarray(z[f"{s['slot']}/{k}"]) for k in s["keys"]})
            groups[src] = (rec, ConfigRecord(s["meta"]), [int(i) for i in s["indices"]])
    return ServerState(round=int(doc["round"]), next_prompt=int(doc["next_prompt"]), groups=groups,
                       streaks={str(k): int(v) for k, v in doc["streaks"].items()}, schedule=doc.get("async"))
