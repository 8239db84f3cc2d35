"""The ``[tool.flwr.app.config]`` block of pyproject.toml, generated from the config dataclasses.

Flower rejects a ``flwr run --run-config`` key that pyproject.toml does not declare, before the app
runs. So every scalar field of every section of :class:`~ftis_flwr.config.schema.ExperimentConfig` (and
its top-level scalars) gets a key here, dotted and dashed (``loss.method``,
``train.micro-batch-size``), default ``""`` = "the preset decides"; plus the app's own keys
``preset``, ``config-file`` and ``overrides``. Per-node card fields cannot all be declared (a
federation has any number of nodes): set them in a YAML file (``config-file``) or with
``overrides='nodes.0.lr=1e-3 nodes.small.seed=3'``.

    python -m ftis_flwr.config.keys --write   # rewrite the block in place (rest of file untouched)
    python -m ftis_flwr.config.keys --check   # exit 1 if pyproject.toml disagrees (a test does too)
    python -m ftis_flwr.config.keys --list    # every key with its type, default and meaning
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
import typing
from pathlib import Path

from ftis_flwr.config.fields import dotted_fields, scalar_type
from ftis_flwr.config.schema import ExperimentConfig, ModelCard

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
HEADER = "[tool.flwr.app.config]"
APP_ENTRIES = (
    ("preset", '"cpu-pair"', "YAML preset: a name under ftis_flwr/config/presets, or a path"),
    ("config-file", '""', "YAML file merged on top of the preset (absolute, or relative to where "
     "`ftis-flwr run` is run: it resolves the path; plain `flwr run` resolves it where the SuperLink runs)"),
    ("resume", '""', "a run directory to continue after its last completed round, with the "
     "configuration saved in it (the other keys are then not used)"),
    ("overrides", '""', "space-separated key=value pairs applied last, for keys not listed here, "
                        "e.g. 'nodes.0.lr=1e-3 nodes.small.seed=3'"),
)
INTRO = """\
# Generated from the dataclasses in ftis_flwr/config/schema.py by `python -m ftis_flwr.config.keys --write`;
# tests/test_config_keys.py fails when they disagree. Edit the dataclasses, then regenerate.
# The experiment: the YAML `preset`, then the YAML `config-file` on top, then every key below that
# is not "" ("" = the preset decides), then `overrides`. Dashes and underscores are equal.
# `python -m ftis_flwr.config.keys --list` prints every key with its type, default and meaning."""


FLAT_DICT_KEYS = {"task.data_files": ("train", "test", "validation", "ood")}
"""Dict fields with flat keys for their common entries (``task.data-files.test``); any other entry
is set in YAML or ``overrides``."""


def run_config_keys() -> dict[str, str]:
    """Flat run-config key (dashed) -> dotted field name, for every scalar field but ``nodes``, the
    lists of strings or numbers (comma-separated) and the entries of :data:`FLAT_DICT_KEYS`."""
    keys: dict[str, str] = {}
    for dotted, hint in dotted_fields(ExperimentConfig).items():
        if dotted in FLAT_DICT_KEYS:
            for entry in FLAT_DICT_KEYS[dotted]:
                keys[f"{dotted}.{entry}".replace("_", "-")] = f"{dotted}.{entry}"
            continue
        flat_list = typing.get_origin(hint) is list and typing.get_args(hint)[:1] in ((str,), (float,))
        if dotted == "preset" or (scalar_type(hint) is None and not flat_list):
            continue  # preset is an app key; other dicts are YAML-only
        keys[dotted.replace("_", "-")] = dotted
    return keys


def render_block() -> str:
    """The whole ``[tool.flwr.app.config]`` block, header included, ending with a newline."""
    lines = [HEADER, INTRO]
    lines += [f"{name} = {default}" for name, default, _ in APP_ENTRIES]
    lines += [f'"{key}" = ""' if "." in key else f'{key} = ""' for key in run_config_keys()]
    return "\n".join(lines) + "\n"


def _span(text: str) -> tuple[int, int]:
    """Start and end offsets of the block in pyproject text (end: next table header or EOF)."""
    start = text.find("\n" + HEADER + "\n")
    if start < 0:
        if text.startswith(HEADER + "\n"):
            start = -1
        else:
            raise ValueError(f"{HEADER} not found in pyproject.toml")
    start += 1
    nxt = text.find("\n[", start)
    return start, (len(text) if nxt < 0 else nxt + 1)


def current_block(text: str) -> str:
    start, end = _span(text)
    return text[start:end].rstrip("\n") + "\n"


def replace_block(text: str, block: str | None = None) -> str:
    """``text`` with the block replaced; everything before and after it is kept byte for byte."""
    block = render_block() if block is None else block
    start, end = _span(text)
    separator = "\n" if end < len(text) else ""
    return text[:start] + block + separator + text[end:]


def describe() -> str:
    """Every run-config key with type, default and meaning; then the per-node fields."""
    defaults = ExperimentConfig()
    docs = _docs_of(ExperimentConfig)
    out = [f"{name} (app) default {default}: {doc}" for name, default, doc in APP_ENTRIES]
    fields = dotted_fields(ExperimentConfig)
    for key, dotted in run_config_keys().items():
        field = dotted if dotted in fields else dotted.rsplit(".", 1)[0]  # a dict field's entry
        value = defaults
        for part in field.split("."):
            value = getattr(value, part)
        hint = fields[field] if field == dotted else typing.get_args(fields[field])[1]
        if field != dotted:
            value = value.get(dotted.rsplit(".", 1)[1], "")
        kind = getattr(scalar_type(hint), "__name__", None) or str(hint).replace("typing.", "")
        out.append(f"{key} ({kind}) default {value!r}: {docs.get(field, '')}")
    out.append("")
    out.append("Per-node fields (YAML `nodes:` list, or overrides='nodes.<index or name>.<field>=...'):")
    card_docs = _docs_of(ModelCard)
    for dotted, hint in dotted_fields(ModelCard).items():
        out.append(f"nodes.N.{dotted.replace('_', '-')} ({getattr(hint, '__name__', str(hint))}): "
                   f"{card_docs.get(dotted, '')}")
    return "\n".join(out)


def _docs_of(cls: type) -> dict[str, str]:
    """Dotted field -> its attribute docstring on one line (read from the source)."""
    docs: dict[str, str] = {}
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    for f in dataclasses.fields(cls):
        default = (f.default_factory() if f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
                   else f.default)
        if dataclasses.is_dataclass(default):
            docs.update({f"{f.name}.{k}": v for k, v in _docs_of(type(default)).items()})
    return docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", action="store_true", help="rewrite the block of pyproject.toml")
    group.add_argument("--check", action="store_true", help="exit 1 if pyproject.toml disagrees")
    group.add_argument("--list", action="store_true", help="print every key")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    args = parser.parse_args(argv)
    if args.list:
        print(describe())
        return 0
    text = args.pyproject.read_text()
    new = replace_block(text)
    if args.check:
        if new != text:
            print(f"{args.pyproject}: {HEADER} disagrees with ftis_flwr/config/schema.py; run "
                  "`python -m ftis_flwr.config.keys --write`", file=sys.stderr)
            return 1
        return 0
    if new != text:
        args.pyproject.write_text(new)
        print(f"rewrote {HEADER} in {args.pyproject} ({len(run_config_keys())} experiment keys)")
    else:
        print(f"{args.pyproject} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
