"""A sweep's grid: read from YAML, checked key by key, expanded into named runs.

A grid file lists setups (a preset plus overrides, and optionally the subsets of the grid's modes
and methods it runs), loss methods, collaboration modes, filter
thresholds g (numbers, or ``{linear: [start, end]}`` for a per-node linear schedule) and run
seeds. The grid's ``rounds`` and ``overrides`` hold for every setup; a setup's own ``overrides``
win over both (an ablation may run longer). Expansion keeps only the points that differ:
``alone`` trains on own samples only, so its loss method and g change nothing (one ``alone`` run
per setup and seed); methods without the filter (nois, vis, tis) ignore g (one run per method).
Every point has a file-safe ``key`` that names its result file, so a finished run is found again
and never redone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("vertical", "horizontal", "alone")
TOP_KEYS = {"name": "str", "rounds": "int", "overrides": "mapping", "setups": "list",
            "methods": "list", "modes": "list", "g": "list", "seeds": "list or 'a-b'",
            "id_split": "str", "ood_split": "str", "seconds_per_round": "number", "nice": "int"}
SETUP_KEYS = ("name", "preset", "overrides", "modes", "methods")


class GridError(ValueError):
    """A grid file that cannot run; the message names the key and what is allowed."""


@dataclass(frozen=True)
class Point:
    """One run of the grid."""

    setup: str
    method: str
    mode: str
    g: str
    seed: int
    preset: str
    overrides: tuple[tuple[str, Any], ...] = field(compare=False)

    @property
    def key(self) -> str:
        return f"{self.setup}__{self.method}__{self.mode}__g-{self.g}__seed-{self.seed}"


@dataclass
class Grid:
    name: str
    points: list[Point]
    setups: list[dict[str, Any]]
    id_split: str = "test"
    ood_split: str = "ood"
    seconds_per_round: float = 3.0
    rounds: int = 0
    nice: int = 15


def _seeds(spec: Any) -> list[int]:
    if isinstance(spec, str):
        from simulations.runs import seed_list

        try:
            return seed_list(spec)
        except ValueError:
            raise GridError(f"seeds={spec!r}: use a list of integers or 'a-b' / 'a,b,c'") from None
    if isinstance(spec, list) and spec and all(isinstance(s, int) and not isinstance(s, bool) for s in spec):
        return list(spec)
    raise GridError(f"seeds={spec!r}: use a non-empty list of integers or 'a-b' / 'a,b,c'")


def _safe(name: str, what: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+_-]*", str(name)):
        raise GridError(f"{what}={name!r}: use letters, digits and . + _ - (it names files)")
    return str(name)


def _g(entry: Any, i: int) -> tuple[str, dict[str, Any] | None]:
    """(tag, None) for a constant g; (tag, {"start", "end"}) for a linear schedule."""
    if isinstance(entry, (int, float)) and not isinstance(entry, bool) and entry > 0:
        return f"{entry:g}", None
    if isinstance(entry, dict) and set(entry) == {"linear"}:
        lin = entry["linear"]
        if (isinstance(lin, list) and len(lin) == 2
                and all(isinstance(v, (int, float)) and v > 0 for v in lin)):
            return f"lin{lin[0]:g}-{lin[1]:g}", {"start": float(lin[0]), "end": float(lin[1])}
    raise GridError(f"g[{i}]={entry!r}: use a number > 0 or {{linear: [start, end]}} (both > 0)")


def _methods() -> tuple[str, ...]:
    from ftis_flwr.maths.loss import LOSS_REGISTRY

    return tuple(LOSS_REGISTRY)


def load_grid(path: str | Path, *, check_configs: bool = True) -> Grid:
    """Read and expand a grid file; GridError (or the config's own error) on anything wrong.

    ``check_configs``: load every setup's experiment config (validated; no model is built or
    downloaded) so a bad preset or override fails before the first run.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise GridError(f"grid file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise GridError(f"{path}: the grid must be a mapping with keys {', '.join(TOP_KEYS)}")
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise GridError(f"{path}: unknown key(s) {', '.join(unknown)}; allowed: "
                        + ", ".join(f"{k} ({t})" for k, t in TOP_KEYS.items()))
    for key in ("setups", "methods", "modes", "g", "seeds"):
        if key not in data:
            raise GridError(f"{path}: missing key {key!r} ({TOP_KEYS[key]})")
    for key in ("setups", "methods", "modes", "g"):
        if not isinstance(data[key], list) or not data[key]:
            raise GridError(f"{path}: {key} must be a non-empty list")
    rounds = data.get("rounds", 0)
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
        raise GridError(f"{path}: rounds={rounds!r} must be an integer >= 1 (0 or absent: the presets')")
    common = data.get("overrides") or {}
    if not isinstance(common, dict):
        raise GridError(f"{path}: overrides must be a mapping of dotted keys to values")
    if rounds and "rounds.num_rounds" in common and common["rounds.num_rounds"] != rounds:
        raise GridError(f"{path}: rounds={rounds} and overrides rounds.num_rounds={common['rounds.num_rounds']!r} "
                        "disagree: set the grid's rounds once (a setup may override it for itself)")
    if rounds:  # the grid's rounds are a grid-wide override; a setup's own overrides win over them
        common = {**common, "rounds.num_rounds": rounds}
    allowed = _methods()
    for m in data["methods"]:
        if m not in allowed:
            raise GridError(f"{path}: methods: {m!r} is not a loss method; allowed: {', '.join(allowed)}")
    for m in data["modes"]:
        if m not in MODES:
            raise GridError(f"{path}: modes: {m!r} is not a collaboration mode; allowed: {', '.join(MODES)}")
    gs = [_g(e, i) for i, e in enumerate(data["g"])]
    seeds = _seeds(data["seeds"])
    setups, names = [], set()
    for i, s in enumerate(data["setups"]):
        if not isinstance(s, dict) or "name" not in s or "preset" not in s:
            raise GridError(f"{path}: setups[{i}] must be a mapping with name and preset "
                            f"(allowed keys: {', '.join(SETUP_KEYS)})")
        bad = sorted(set(s) - set(SETUP_KEYS))
        if bad:
            raise GridError(f"{path}: setups[{i}] ({s['name']}): unknown key(s) {', '.join(bad)}; "
                            f"allowed: {', '.join(SETUP_KEYS)}")
        name = _safe(s["name"], f"setups[{i}].name")
        if name in names:
            raise GridError(f"{path}: setups[{i}].name={name!r} is used twice")
        names.add(name)
        ov = s.get("overrides") or {}
        if not isinstance(ov, dict):
            raise GridError(f"{path}: setups[{i}].overrides must be a mapping of dotted keys to values")
        modes = s.get("modes", data["modes"])
        if not isinstance(modes, list) or not modes or any(m not in data["modes"] for m in modes):
            raise GridError(f"{path}: setups[{i}].modes={modes!r} must be a non-empty list of the grid's "
                            f"modes ({', '.join(data['modes'])})")
        methods = s.get("methods", data["methods"])
        if not isinstance(methods, list) or not methods or any(m not in data["methods"] for m in methods):
            raise GridError(f"{path}: setups[{i}].methods={methods!r} must be a non-empty list of the grid's "
                            f"methods ({', '.join(data['methods'])})")
        merged = {**common, **ov}
        n_nodes, n_rounds = None, merged.get("rounds.num_rounds", 0)
        if check_configs:
            from ftis_flwr.experiment import load_experiment

            try:
                exp = load_experiment(s["preset"], merged, import_registries=False)
            except Exception as exc:
                raise GridError(f"{path}: setups[{i}] ({name}): {exc}") from None
            n_nodes, n_rounds = len(exp.nodes), exp.rounds.num_rounds
        setups.append({"name": name, "preset": str(s["preset"]), "overrides": merged, "nodes": n_nodes,
                       "rounds": n_rounds, "modes": list(modes), "methods": list(methods)})
    points: list[Point] = []
    seen: set[str] = set()
    for s in setups:
        for method in s["methods"]:
            for mode in s["modes"]:
                for gtag, lin in gs:
                    if mode == "alone":  # no foreign samples: method and g change nothing
                        m_label, g_label, lin_used = "alone", "-", None
                    elif not method.startswith("f-"):  # unfiltered: g changes nothing
                        m_label, g_label, lin_used = method, "-", None
                    else:
                        m_label, g_label, lin_used = method, gtag, lin
                    for seed in seeds:
                        ov = dict(s["overrides"])
                        ov["advantage.mode"] = mode
                        ov["loss.method"] = data["methods"][0] if mode == "alone" else method
                        ov["rounds.seed"] = seed
                        if lin_used is not None:
                            for k in range(s["nodes"] or 2):
                                ov.update({f"nodes.{k}.g.kind": "linear", f"nodes.{k}.g.start": lin_used["start"],
                                           f"nodes.{k}.g.end": lin_used["end"]})
                        elif g_label != "-":
                            ov["loss.kl_threshold"] = float(gtag)
                        p = Point(s["name"], m_label, mode, g_label, seed, s["preset"], tuple(sorted(ov.items())))
                        if p.key not in seen:
                            seen.add(p.key)
                            points.append(p)
    spr = data.get("seconds_per_round", 3.0)
    if not isinstance(spr, (int, float)) or spr <= 0:
        raise GridError(f"{path}: seconds_per_round={spr!r} must be a number > 0")
    return Grid(name=_safe(data.get("name", path.stem), "name"), points=points, setups=setups,
                id_split=str(data.get("id_split", "test")), ood_split=str(data.get("ood_split", "ood")),
                seconds_per_round=float(spr), rounds=rounds, nice=int(data.get("nice", 15)))
