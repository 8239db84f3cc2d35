"""Two runs side by side (``ftis-flwr compare RUN_A RUN_B``): the settings that differ, then per
node and held-out split the first and last evaluated accuracy of each and the change between their
last ones, and each node's training reward, first and last, read from their ``config.json`` and
``metrics.jsonl`` (a run still going is compared as far as it got).

What a reader needs before trusting a difference: the settings that differ are listed first (a
seed, a method, a rounds count), and a node or split one run lacks is marked, never dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftis_flwr.server.reporting.plots import ACC_PREFIX, ACC_SUFFIX
from ftis_flwr.server.reporting.summary import Change, load_metrics
from ftis_flwr.server.reporting.summary import _change as change_of

SKIP = ("run_dir", "cache_dir")
"""Settings that name where a run wrote, not what it ran."""


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(data, list) and data and all(isinstance(x, dict) and "name" in x for x in data):
        out = {}
        for x in data:  # model cards by name, not position
            out.update(_flat({k: v for k, v in x.items() if k != "name"}, f"{prefix}{x['name']}."))
        return out
    return {prefix[:-1]: data}


def settings_diff(a: dict, b: dict) -> list[str]:
    """``key: A -> B`` for each setting that differs (a key one run lacks shows as ``-``)."""
    fa, fb = _flat(a), _flat(b)
    keys = sorted(k for k in set(fa) | set(fb) if k not in SKIP and fa.get(k, "-") != fb.get(k, "-"))
    return [f"{k}: {json.dumps(fa.get(k, '-'))} -> {json.dumps(fb.get(k, '-'))}" for k in keys]


def _change(rows: list[dict], node: str, key: str) -> Change:
    """First and last finite value of ``node``'s ``key`` over the rows (the summary's rule)."""
    return change_of([(r["round"], r["nodes"][node].get(key)) for r in rows if node in r.get("nodes", {})])


def _at(value: float | None, rnd: int | None) -> str:
    return "-" if value is None else f"{value:.3f} (r{rnd})"


def _run(path: str | Path) -> tuple[dict, list[dict]]:
    run = Path(path)
    config = run / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{run}: no config.json: give a run's folder (runs/<run name>)")
    rows = load_metrics(run)
    if not rows:
        raise ValueError(f"{run}: no round logged yet")
    return json.loads(config.read_text()), rows


def compare(a_dir: str | Path, b_dir: str | Path) -> str:
    """The comparison (module docstring); FileNotFoundError / ValueError naming what a folder lacks."""
    (a_cfg, a_rows), (b_cfg, b_rows) = _run(a_dir), _run(b_dir)
    out = [f"A: {a_dir} ({len(a_rows)} rounds logged)", f"B: {b_dir} ({len(b_rows)} rounds logged)", ""]
    diff = settings_diff(a_cfg, b_cfg)
    out += ["Settings that differ (A -> B):" if diff else "The two runs have the same settings."]
    out += [f"  {line}" for line in diff] + [""]
    cards = [c.get("name") for cfg in (a_cfg, b_cfg) for c in cfg.get("nodes", []) if isinstance(c, dict)]
    nodes = list(dict.fromkeys([*cards, *(n for rows in (a_rows, b_rows) for r in rows for n in r.get("nodes", {}))]))
    splits = list(dict.fromkeys(k[len(ACC_PREFIX):-len(ACC_SUFFIX)] for rows in (a_rows, b_rows) for r in rows
                                for m in r.get("nodes", {}).values() for k in m
                                if k.startswith(ACC_PREFIX) and k.endswith(ACC_SUFFIX)))
    out += ["| node | split | A first | A last | B first | B last | B - A, last (points) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for node in nodes:
        for split in splits:
            a, b = (_change(rows, node, f"{ACC_PREFIX}{split}{ACC_SUFFIX}") for rows in (a_rows, b_rows))
            change = f"{100 * (b.last - a.last):+.1f}" if a.last is not None and b.last is not None else "-"
            out.append(f"| {node} | {split} | {_at(a.first, a.first_round)} | {_at(a.last, a.last_round)} | "
                       f"{_at(b.first, b.first_round)} | {_at(b.last, b.last_round)} | {change} |")
    out += ["", "| node | A train reward, first -> last | B train reward, first -> last |", "| --- | --- | --- |"]
    for node in nodes:
        cells = []
        for rows in (a_rows, b_rows):
            c = _change(rows, node, "reward_mean")
            cells.append("-" if c.first is None else f"{_at(c.first, c.first_round)} -> {_at(c.last, c.last_round)}")
        out.append(f"| {node} | {cells[0]} | {cells[1]} |")
    return "\n".join(out)
