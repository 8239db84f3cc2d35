"""``ftis-flwr check``'s reading of a command line: the app's declared keys, ``--run-config`` parsed
as Flower parses it, every unknown key named with its closest declared one, paths made absolute
for the local SuperLink, and the experiment built as the ServerApp builds it (every error at once)."""

from __future__ import annotations

import difflib
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any


class CheckError(Exception):
    """Everything wrong with a run configuration, one message per line."""


def declared_keys(app: Path) -> dict[str, Any]:
    """The ``[tool.flwr.app.config]`` entries (flattened, as Flower reads them) of ``app``."""
    path = app / "pyproject.toml"
    if not path.is_file():
        raise CheckError(f"{app}: no pyproject.toml (give the Flower app's folder, e.g. `.`)")
    from flwr.common.config import flatten_dict

    data = tomllib.loads(path.read_text())
    return flatten_dict(data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))


def _spellings(key: str) -> str:
    return key.replace("_", "-")


def resolve_keys(given: dict[str, Any], declared: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``given`` with each key spelled as declared (dashes and underscores are equal), and one
    error per key that is not declared, naming the closest declared keys."""
    by_spelling = {_spellings(k): k for k in declared}
    out, errors = {}, []
    for key, value in given.items():
        name = by_spelling.get(_spellings(key))
        if name is None:
            close = difflib.get_close_matches(_spellings(key), list(by_spelling), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(by_spelling[c] for c in close)}?" if close else ""
            errors.append(f"unknown key {key!r}{hint} (per-node keys go in overrides='nodes.0.lr=1e-3'; "
                          f"every key: python -m ftis_flwr.config.keys --list)")
        else:
            out[name] = value
    return out, errors


_PAIR = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")
"""One ``key=value`` pair of a ``--run-config`` string (a quoted value may hold spaces)."""


def parse_run_config(values: list[str]) -> tuple[dict[str, Any], list[str]]:
    """``--run-config`` values as Flower parses them (a TOML file, or ``key=value`` pairs), and
    the pairs Flower refuses, each named: the good pairs are kept, so the rest is still checked."""
    from flwr.common.config import parse_config_args

    try:
        return parse_config_args(values or None), []
    except Exception as exc:  # Flower's own message (a click exception or a ValueError): find the pairs
        good, bad = {}, []
        for value in values:
            for pair in _PAIR.findall(value) if not value.endswith(".toml") else [value]:
                try:
                    good.update(parse_config_args([pair]))
                except Exception:
                    bad.append(pair)
        if not bad:
            return {}, [f"--run-config: {getattr(exc, 'message', None) or exc}"]
        return good, [f"--run-config: {pair}: a string value needs quotes, e.g. preset='cpu-pair' (Flower "
                      "reads key=value pairs of TOML values)" for pair in bad]


PATH_KEYS = ("run-dir", "cache-dir", "config-file", "resume", "task.train-path", "task.data-files.train",
             "task.data-files.test", "task.data-files.validation", "task.data-files.ood")
"""Run-config keys that name a path on the machine the ServerApp runs on."""
CODE_KEYS = ("task.name", "task.reward", "task.rewards", "task.environment")
"""Run-config keys that may name a file of the user's code (``<file.py>:<name>``, comma-separated)."""


def _code_path(value: str) -> str:
    """``"rel/reward.py:f"`` -> ``"/abs/rel/reward.py:f"``; anything else as it is."""
    target, sep, attr = value.strip().rpartition(":")
    if sep and target.endswith(".py") and attr:
        return f"{Path(target).expanduser().resolve()}:{attr}"
    return value.strip()


def localise(given: dict[str, Any], app: Path) -> dict[str, Any]:
    """For a run on the local SuperLink: relative paths (files, data files, a user's code in
    ``<file.py>:<name>``) resolved against the user's working directory, and ``run-dir`` (when not
    given) the app folder's ``runs/``, all absolute, so the outputs land where the user is, not in
    the directory the SuperLink was first started from."""
    out = dict(given)
    for key in PATH_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = str(Path(out[key]).expanduser().resolve())
    for key in CODE_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = ",".join(_code_path(v) for v in out[key].split(",")) if key == "task.rewards" \
                else _code_path(out[key])
    dataset = out.get("task.dataset")
    if isinstance(dataset, str) and dataset and Path(dataset).expanduser().exists():  # a local folder
        out["task.dataset"] = str(Path(dataset).expanduser().resolve())
    out.setdefault("run-dir", str((app / "runs").resolve()))
    return out


def fold_node_keys(parsed: dict[str, Any]) -> dict[str, Any]:
    """``nodes.<index or name>.<field>=value`` pairs, a card's field set for one run, moved into
    ``overrides`` (where the run configuration keeps per-node keys, after any already there), so
    ``--run-config "nodes.large.ranks=2"`` means ``--run-config "overrides='nodes.large.ranks=2'"``."""
    node = {k: v for k, v in parsed.items() if k.startswith("nodes.") and k.count(".") >= 2}
    if not node:
        return parsed
    out = {k: v for k, v in parsed.items() if k not in node}
    pairs = [f"{k}={shlex.quote(v if isinstance(v, str) else _as_toml(v))}" for k, v in node.items()]
    out["overrides"] = " ".join([str(out.get("overrides", "") or ""), *pairs]).strip()
    return out


def check(app: Path | None, run_config: list[str], *, local: bool = False) -> tuple[dict[str, Any], Any]:
    """(the ``--run-config`` pairs spelled as declared, the experiment); CheckError listing every
    problem otherwise. ``local``: the run goes to the local SuperLink (:func:`localise` its paths).
    ``app`` None (a plan made anywhere): no declared keys to check against, the merge names the
    unknown ones.
    A ``resume`` run is checked for its folder only (its configuration is the one saved in it)."""
    from ftis_flwr.config.schema import ConfigError
    from ftis_flwr.experiment import load_run_config

    declared = declared_keys(app) if app is not None else {}
    parsed, errors = parse_run_config(run_config)
    parsed = fold_node_keys(parsed)
    given, unknown = resolve_keys(parsed, declared) if app is not None else (parsed, [])
    errors += unknown  # and the known keys are checked all the same: every problem at once
    if local:
        given = localise(given, app)
    merged = {**declared, **given}
    resume = str(merged.get("resume", "") or "")
    if resume:
        if not Path(resume).expanduser().is_dir():
            errors.append(f"resume={resume!r}: no such run directory")
        if errors:
            raise CheckError("\n".join(errors))
        return given, None
    try:
        exp = load_run_config(merged)
    except (ConfigError, ValueError) as exc:
        errors += _items(str(exc))
    if errors:
        raise CheckError(f"invalid configuration ({len(errors)} error{'s' * (len(errors) > 1)}):\n  - "
                         + "\n  - ".join(errors))
    return given, exp


def _items(message: str) -> list[str]:
    """The problems a ConfigError lists (``invalid configuration (n errors):`` then ``  - `` lines),
    so that they and the command line's own make one list."""
    head, sep, rest = message.partition(":\n  - ")
    return rest.split("\n  - ") if sep and head.startswith("invalid ") else [message]


def missing_packages(exp: Any) -> list[str]:
    """One line per card whose named source's package, and per tracker of ``report.to`` whose
    package, is not installed on this machine."""
    from ftis_flwr.config.named_sources import missing_package
    from ftis_flwr.config.validation import tracker_package_errors

    return [f"node {c.name}: source {c.source!r} needs `{cmd}`" for c in exp.nodes
            if (cmd := missing_package(c.source))] + tracker_package_errors(exp)


def _as_toml(value: Any) -> str:
    return (json.dumps(value) if isinstance(value, str)
            else str(value).lower() if isinstance(value, bool) else repr(value))
