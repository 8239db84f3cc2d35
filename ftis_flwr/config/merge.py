"""Merging an experiment: defaults <- YAML preset <- YAML file <- flat dotted keys, typed, validated.

Flat keys come from ``flwr run --run-config`` (see ``[tool.flwr.app.config]`` in pyproject.toml,
generated from the dataclasses by :mod:`ftis_flwr.config.keys`) or from Python callers. A key is
dotted, ``section.field`` or ``nodes.<index or name>.field``; dashes and underscores are equal.
Each value is converted to its field's type (Flower's run config is typed by TOML: ``8.0`` for an
int field, ``"1e-4"`` for a float field, ``"true"`` for a bool field all work); a value that does
not convert is a :class:`~ftis_flwr.config.schema.ConfigError` naming the key. A YAML layer (a preset
file, ``config-file``) is walked key by key the same way
(:func:`~ftis_flwr.config.yaml_layers.checked_yaml`), so its unknown keys and bad values are named
with their file and line instead of stopping at OmegaConf's first. Every
problem (of every layer: unknown keys, bad values, impossible combinations) is reported in one error.

Re-exported by :mod:`ftis_flwr.config.schema`; import it from there.
"""

from __future__ import annotations

import shlex
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ftis_flwr.config.fields import card_fields, coerce, experiment_fields, normalise_key
from ftis_flwr.config.preset_files import PRESET_DIR, resolve_preset  # noqa: F401 (merge's names too)
from ftis_flwr.config.schema import ConfigError, ExperimentConfig, ModelCard
from ftis_flwr.config.validation import Checks, card_errors, experiment_errors, raise_errors
from ftis_flwr.config.yaml_layers import checked_yaml, forget_overridden, located, omegaconf_error

APP_KEYS = {"preset", "config_file", "overrides", "resume"}
"""Run-config keys read by the apps themselves, not experiment fields."""
def _lookup(parts: list[str], fields: dict[str, Any]) -> tuple[list[str], Any] | None:
    """Match normalised ``parts`` against dotted ``fields``; the key of a dict field stays raw."""
    norm = [normalise_key(p) for p in parts]
    key = ".".join(norm)
    if key in fields:
        return norm, fields[key]
    for i in range(len(parts) - 1, 0, -1):  # "task.eval_paths.<split name>"
        hint = fields.get(".".join(norm[:i]))
        if hint is not None and typing.get_origin(hint) is dict:
            return norm[:i] + [".".join(parts[i:])], typing.get_args(hint)[1]
    return None


def _resolve(raw_key: str) -> tuple[list[str], Any]:
    """``raw_key`` -> (path into the nested config, field type); ``KeyError`` with a hint if unknown."""
    experiment, card = experiment_fields(), card_fields()
    parts = [p.strip() for p in raw_key.strip().split(".")]
    if normalise_key(parts[0]) == "nodes":
        if len(parts) < 3 or not parts[1]:
            raise KeyError(f"{raw_key} (per-node keys look like nodes.<index or name>.<field>)")
        found = _lookup(parts[2:], card)
        if found is None:
            raise KeyError(f"{raw_key} (a model card has no field {'.'.join(parts[2:])!r})")
        return ["nodes", parts[1], *found[0]], found[1]
    found = _lookup(parts, experiment)
    if found is None:
        sections = {k.split(".")[0] for k in experiment if "." in k}
        if normalise_key(raw_key) in sections:
            raise KeyError(f"{raw_key} (a section: set {raw_key}.<field>)")
        raise KeyError(raw_key)
    return found


def _flat_to_nested(flat: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    nested: dict[str, Any] = {}
    errors: list[str] = []
    unknown: list[str] = []
    for raw_key, value in flat.items():
        if normalise_key(raw_key) in APP_KEYS:
            continue
        try:
            path, hint = _resolve(raw_key)
        except KeyError as exc:
            unknown.append(exc.args[0])
            continue
        try:
            value = coerce(value, hint)
        except ValueError as exc:
            errors.append(f"{'.'.join(path)}={value!r} {exc}")
            continue
        node = nested
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    if unknown:
        errors.insert(0, "unknown configuration keys: " + ", ".join(sorted(unknown)) + ". Keys look like "
                      "loss.method, rollout.group-size, nodes.0.lr (`python -m ftis_flwr.config.keys "
                      "--list` prints them all)")
    return nested, errors


def flat_to_nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"loss.method": "tis"}`` -> ``{"loss": {"method": "tis"}}``, typed; rejects unknown keys."""
    nested, errors = _flat_to_nested(flat)
    raise_errors(errors)
    return nested


def parse_overrides(text: str) -> dict[str, str]:
    """``"nodes.0.lr=1e-3 nodes.small.seed=3"`` -> ``{"nodes.0.lr": "1e-3", ...}`` (shell quoting)."""
    out: dict[str, str] = {}
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"overrides={text!r}: {exc}") from None
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"overrides: {token!r} is not key=value "
                              "(e.g. overrides='nodes.0.lr=1e-3 nodes.1.seed=3')")
        out[key.strip()] = value
    return out


def _nodes_overrides(nested: dict[str, Any], base_nodes: list[Any]) -> list[str]:
    """``nodes.0.lr`` / ``nodes.small.lr`` keys patch one card; OmegaConf would replace the list."""
    node_patch = nested.pop("nodes", None)
    if not node_patch:
        return []
    errors = []
    names = [str(n.name) for n in base_nodes]
    for idx, patch in node_patch.items():
        if idx.isdigit() and int(idx) < len(base_nodes):
            i = int(idx)
        elif idx in names:
            i = names.index(idx)
        else:
            errors.append(f"nodes.{idx}: no model card with that index or name "
                          f"(the experiment has {len(base_nodes)}: {', '.join(names)})")
            continue
        base_nodes[i] = OmegaConf.merge(base_nodes[i], patch)
    return errors


def load_experiment(preset: str | None = None, overrides: Mapping[str, Any] | None = None,
                    yaml_text: str | None = None, *, import_registries: bool = True,
                    yaml_name: str = "the YAML config", errors: list[str] | None = None,
                    checks: Checks = ()) -> ExperimentConfig:
    """defaults <- YAML preset (name or path) <- YAML text (``yaml_name``: what errors call it, e.g.
    its file) <- flat dotted overrides; validated, every problem of every layer in one error.

    ``import_registries``: see :func:`ftis_flwr.config.validation.validate`. ``errors``: problems
    the caller found already (a missing file), reported with the rest. ``checks``: what a layer
    above adds (:func:`ftis_flwr.experiment.load_experiment` adds the task's own checks).
    """
    merged = OmegaConf.structured(ExperimentConfig)
    errors = list(errors or [])
    marks: dict[str, str] = {}  # a dotted key set in a YAML layer -> "<file>, line <n>"
    layers = []
    if preset:
        try:
            path = resolve_preset(preset)
            layers.append((f"preset {str(path)!r}", path.read_text()))
        except ConfigError as exc:  # the other layers are still checked, on the defaults
            errors.append(str(exc))
    if yaml_text:
        layers.append((yaml_name, yaml_text))
    for where, text in layers:
        data = checked_yaml(text, where, errors, marks)
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(data)) if data else merged
        except Exception as exc:  # what the walk did not catch (OmegaConf's own type and key errors)
            errors.append(str(omegaconf_error(where, exc)))
    if overrides:
        nested, flat_errors = _flat_to_nested(overrides)
        errors += flat_errors
        nodes = list(merged.nodes)
        forget_overridden(marks, nested, nodes)
        errors += _nodes_overrides(nested, nodes)
        try:
            merged.nodes = nodes
            merged = OmegaConf.merge(merged, OmegaConf.create(nested))
        except Exception as exc:
            errors.append(str(omegaconf_error("the flat keys", exc)))
    if preset:
        merged.preset = preset
    try:
        cfg: ExperimentConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except Exception as exc:
        raise_errors(errors + [str(omegaconf_error("the merged configuration", exc))])
    errors += [located(e, marks) for e in experiment_errors(cfg, import_registries=import_registries, checks=checks)]
    raise_errors(errors)
    return cfg


def load_run_config(run_config: Mapping[str, Any], *, import_registries: bool = True,
                    checks: Checks = ()) -> ExperimentConfig:
    """Flower's flat run config -> experiment (what the ServerApp does with ``context.run_config``).

    ``preset`` names the YAML preset, ``config-file`` a YAML file merged on top, then every other
    key that is not ``""`` ("the preset decides"), then ``overrides``: space-separated
    ``key=value`` pairs for keys with no entry in pyproject.toml (per-node card fields).
    """
    app = {normalise_key(k): v for k, v in run_config.items() if normalise_key(k) in APP_KEYS}
    preset = str(app.get("preset", "") or "")
    config_file = str(app.get("config_file", "") or "")
    yaml_text, errors = None, []
    if config_file:
        path = Path(config_file).expanduser()
        if path.is_file():
            yaml_text = path.read_text()
        else:
            errors.append(f"config-file={config_file!r}: no such file here (under plain `flwr run` a relative "
                          f"path resolves where the SuperLink runs: give an absolute one, or run "
                          f"`ftis-flwr run`, which resolves it where you are)")
    flat = {k: v for k, v in run_config.items() if normalise_key(k) not in APP_KEYS and v != ""}
    try:
        flat.update(parse_overrides(str(app.get("overrides", "") or "")))
    except ConfigError as exc:
        errors.append(str(exc))
    return load_experiment(preset or None, flat, yaml_text=yaml_text, import_registries=import_registries,
                           yaml_name=f"config-file {config_file!r}", errors=errors, checks=checks)


def from_dict(data: Mapping[str, Any], *, import_registries: bool = False, checks: Checks = ()) -> ExperimentConfig:
    """Inverse of :func:`ftis_flwr.config.schema.to_dict`, validated.

    By default only against the registries this process already imported (cheap: the ClientApp
    calls it per message); ``import_registries=True`` imports them, and imports a ``loss.method``
    given as an import path (what a node worker does before it builds its Node).
    """
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ExperimentConfig), OmegaConf.create(dict(data)))
        cfg: ExperimentConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except Exception as exc:
        raise omegaconf_error("the experiment", exc) from None
    raise_errors(experiment_errors(cfg, import_registries=import_registries, checks=checks))
    return cfg


def card_from_dict(data: Mapping[str, Any], *, import_registries: bool = False) -> ModelCard:
    """A model card from a plain dict (a YAML file), validated like :func:`from_dict`."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ModelCard), OmegaConf.create(dict(data)))
        card: ModelCard = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except Exception as exc:
        raise omegaconf_error("the model card", exc) from None
    raise_errors(card_errors(card, import_registries=import_registries), what="model card")
    return card
