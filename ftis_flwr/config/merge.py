"""Merging an experiment: defaults <- YAML preset <- YAML file <- flat dotted keys, typed, validated.

Flat keys come from ``flwr run --run-config`` (see ``[tool.flwr.app.config]`` in pyproject.toml,
generated from the dataclasses by :mod:`ftis_flwr.config.keys`) or from Python callers. A key is
dotted, ``section.field`` or ``nodes.<index or name>.field``; dashes and underscores are equal.
Each value is converted to its field's type (Flower's run config is typed by TOML: ``8.0`` for an
int field, ``"1e-4"`` for a float field, ``"true"`` for a bool field all work); a value that does
not convert is a :class:`~ftis_flwr.config.schema.ConfigError` naming the key. A YAML layer (a preset
file, ``config-file``) is walked key by key the same way (:func:`checked_yaml`), so its unknown keys
and bad values are named with their file and line instead of stopping at OmegaConf's first. Every
problem (of every layer: unknown keys, bad values, impossible combinations) is reported in one error.

Re-exported by :mod:`ftis_flwr.config.schema`; import it from there.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import shlex
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ftis_flwr.config.schema import ConfigError, ExperimentConfig, ModelCard
from ftis_flwr.config.validation import card_errors, experiment_errors, raise_errors

APP_KEYS = {"preset", "config_file", "overrides", "resume"}
"""Run-config keys read by the apps themselves, not experiment fields."""
PRESET_DIR = Path(__file__).resolve().parent / "presets"
"""The named presets, shipped inside the package (source checkout and wheel alike)."""


def _preset_dirs() -> list[Path]:
    return [d for d in (PRESET_DIR,) if d.is_dir()]
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _normalise_key(key: str) -> str:
    return key.strip().replace("-", "_")


def dotted_fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """Dotted field name -> type hint for a dataclass tree (nested dataclasses flattened)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out.update(dotted_fields(hint, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = hint
    return out


def scalar_type(hint: Any) -> type | None:
    """str/int/float/bool for a scalar field (``float | None`` -> float), else None."""
    if hint in (str, int, float, bool):
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if _is_optional(hint) and len(args) == 1 and args[0] in (str, int, float, bool):
        return args[0]
    return None


def _is_optional(hint: Any) -> bool:
    return (typing.get_origin(hint) in (typing.Union, types.UnionType)
            and type(None) in typing.get_args(hint))


class _BadValue(ValueError):
    pass


def coerce(value: Any, hint: Any) -> Any:
    """``value`` converted to the field type ``hint``; raises ``ValueError`` saying what was expected."""
    if _is_optional(hint):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~")):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise _BadValue("is not a boolean (true/false)")
    if hint is int:
        if isinstance(value, bool):
            raise _BadValue("is not an integer")
        if isinstance(value, int):
            return value
        number = value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                try:
                    number = float(value.strip())
                except ValueError:
                    raise _BadValue("is not an integer") from None
        if isinstance(number, float) and math.isfinite(number) and number.is_integer():
            return int(number)
        raise _BadValue("is not an integer")
    if hint is float:
        if isinstance(value, bool):
            raise _BadValue("is not a number")
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise _BadValue("is not a number") from None
        if math.isnan(number):
            raise _BadValue("is not a number")
        return number
    if hint is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _BadValue("is not a string")
        return value if isinstance(value, str) else str(value)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and args and args[0] is str:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, (list, tuple)):
            return [str(v) for v in value]
        raise _BadValue("is not a list of strings (comma-separated)")
    if origin is list and args and args[0] is float:
        parts = [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else value
        if not isinstance(parts, (list, tuple)):
            raise _BadValue("is not a list of numbers (comma-separated)")
        try:
            return [coerce(p, float) for p in parts]
        except ValueError:
            raise _BadValue("is not a list of numbers (comma-separated)") from None
    raise _BadValue(f"cannot be set from a flat key (type {hint}); set it in a YAML file")


_EXPERIMENT_FIELDS = None
_CARD_FIELDS = None


def _fields() -> tuple[dict[str, Any], dict[str, Any]]:
    global _EXPERIMENT_FIELDS, _CARD_FIELDS
    if _EXPERIMENT_FIELDS is None:
        _EXPERIMENT_FIELDS = dotted_fields(ExperimentConfig)
        _CARD_FIELDS = dotted_fields(ModelCard)
    return _EXPERIMENT_FIELDS, _CARD_FIELDS  # type: ignore[return-value]


def _lookup(parts: list[str], fields: dict[str, Any]) -> tuple[list[str], Any] | None:
    """Match normalised ``parts`` against dotted ``fields``; the key of a dict field stays raw."""
    norm = [_normalise_key(p) for p in parts]
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
    experiment, card = _fields()
    parts = [p.strip() for p in raw_key.strip().split(".")]
    if _normalise_key(parts[0]) == "nodes":
        if len(parts) < 3 or not parts[1]:
            raise KeyError(f"{raw_key} (per-node keys look like nodes.<index or name>.<field>)")
        found = _lookup(parts[2:], card)
        if found is None:
            raise KeyError(f"{raw_key} (a model card has no field {'.'.join(parts[2:])!r})")
        return ["nodes", parts[1], *found[0]], found[1]
    found = _lookup(parts, experiment)
    if found is None:
        sections = {k.split(".")[0] for k in experiment if "." in k}
        if _normalise_key(raw_key) in sections:
            raise KeyError(f"{raw_key} (a section: set {raw_key}.<field>)")
        raise KeyError(raw_key)
    return found


def _flat_to_nested(flat: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    nested: dict[str, Any] = {}
    errors: list[str] = []
    unknown: list[str] = []
    for raw_key, value in flat.items():
        if _normalise_key(raw_key) in APP_KEYS:
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


def resolve_preset(preset: str) -> Path:
    """A preset name (file stem under ftis_flwr/config/presets) or a path to a YAML file."""
    path = Path(preset).expanduser()
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidate = next((d / f"{preset}.yaml" for d in _preset_dirs() if (d / f"{preset}.yaml").is_file()),
                     PRESET_DIR / f"{preset}.yaml")
    if candidate.is_file():
        return candidate
    available = sorted({p.stem for d in _preset_dirs() for p in d.glob("*.yaml")})
    raise ConfigError(f"preset {preset!r} is neither a YAML file nor one of: "
                      f"{', '.join(available) or '(none found)'}")


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


def _omegaconf_error(where: str, exc: Exception) -> ConfigError:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), "")
    head = lines[0] if lines else type(exc).__name__
    mark = getattr(exc, "problem_mark", None)  # a YAML syntax error: where in the file, and what
    if mark is not None:
        problem = getattr(exc, "problem", None) or ""
        start = getattr(exc, "context_mark", None)
        head = f"YAML syntax error at line {mark.line + 1}, column {mark.column + 1}: {head}" + \
            (f" (opened at line {start.line + 1}, column {start.column + 1})" if start is not None else "") + \
            (f", {problem}" if problem and problem not in head else "")
    return ConfigError(f"invalid configuration in {where}: {head}" + (f" (key {key})" if key else ""))


_LEADING_KEY = re.compile(r"([A-Za-z_][\w.\[\]-]*)=")
"""The key a validation message starts with (``rounds.num_rounds=-3 must be >= 1``)."""


def checked_yaml(text: str, where: str, errors: list[str], marks: dict[str, str]) -> dict[str, Any]:
    """A YAML layer as a plain dict with every key checked against the schema and every value
    converted to its field's type. Each problem is appended to ``errors`` with ``where`` and its
    line, and left out, so the layers after it and the rest of this one are still checked; each
    key kept is recorded in ``marks`` (for the line of a later validation message)."""
    import yaml

    try:
        tree = yaml.compose(text, Loader=yaml.SafeLoader)
        data = OmegaConf.to_container(OmegaConf.create(text), resolve=False) if tree is not None else {}
    except Exception as exc:  # YAML syntax: file, line and column
        errors.append(str(_omegaconf_error(where, exc)))
        return {}
    if not isinstance(data, dict) or not isinstance(tree, yaml.MappingNode):
        errors.append(f"{where}: the file must be a mapping of sections (loss:, rollout:, nodes:, ...), "
                      f"not a {type(data).__name__}")
        return {}
    walk = _YamlWalk(where, errors, marks)
    return walk.mapping(data, tree, _fields()[0], "", "")


class _YamlWalk:
    """One YAML layer's walk: the layer's name, the errors found, the lines of the keys kept."""

    def __init__(self, where: str, errors: list[str], marks: dict[str, str]):
        self.where, self.errors, self.marks = where, errors, marks

    def at(self, node: Any) -> str:
        return f"{self.where}, line {node.start_mark.line + 1}, column {node.start_mark.column + 1}"

    def mapping(self, data: dict, tree: Any, fields: dict[str, Any], prefix: str, label: str) -> dict[str, Any]:
        """``data`` (the mapping at ``prefix`` of ``fields``; ``label``: how messages name it) checked."""
        import yaml

        clean: dict[str, Any] = {}
        for key_node, value_node in tree.value:
            raw = key_node.value
            key, value = _normalise_key(str(raw)), data.get(raw)
            full = prefix + key
            if full == "nodes" and fields is _EXPERIMENT_FIELDS and isinstance(value_node, yaml.SequenceNode):
                clean[key] = self.cards(value, value_node)
            elif full in fields:
                ok, converted = self.leaf(value, fields[full], label + key, key_node)
                if ok:
                    clean[key] = converted
            elif isinstance(value, dict) and isinstance(value_node, yaml.MappingNode) and \
                    any(f.startswith(full + ".") for f in fields):
                clean[key] = self.mapping(value, value_node, fields, full + ".", label + key + ".")
            else:
                self.errors.append(f"{self.at(key_node)}: unknown key {label + str(raw)!r}; "
                                   f"{_allowed(key, fields, prefix, label)}")
        return clean

    def cards(self, items: list, tree: Any) -> list[Any]:
        """The ``nodes:`` list: each model card checked against the card's fields."""
        import yaml

        out = []
        for i, (item, node) in enumerate(zip(items, tree.value)):
            if isinstance(item, dict) and isinstance(node, yaml.MappingNode):
                out.append(self.mapping(item, node, _fields()[1], "", f"nodes[{item.get('name', i)}]."))
            else:
                self.errors.append(f"{self.at(node)}: nodes[{i}]={item!r} is not a model card (a mapping "
                                   "such as {name: small, source: tiny})")
        return out

    def leaf(self, value: Any, hint: Any, key: str, key_node: Any) -> tuple[bool, Any]:
        """(kept, value converted to ``hint``); a value it cannot convert is named and dropped."""
        if isinstance(value, str) and "${" in value:  # an interpolation: OmegaConf resolves it
            return True, value
        if scalar_type(hint) is not None and isinstance(value, (dict, list)):
            return self.bad(key, value, "is not a single value", key_node)
        if _coercible(hint):
            try:
                value = coerce(value, hint)
            except ValueError as exc:
                return self.bad(key, value, str(exc), key_node)
        self.marks[key] = self.at(key_node)
        return True, value

    def bad(self, key: str, value: Any, why: str, key_node: Any) -> tuple[bool, Any]:
        self.errors.append(f"{self.at(key_node)}: {key}={value!r} {why}")
        return False, None


def _coercible(hint: Any) -> bool:
    """Whether :func:`coerce` converts to ``hint`` (a dict field is left to OmegaConf)."""
    args = typing.get_args(hint)
    return scalar_type(hint) is not None or (typing.get_origin(hint) is list and args[:1] in ((str,), (float,)))


def _allowed(key: str, fields: dict[str, Any], prefix: str, label: str) -> str:
    """What may stand where ``key`` does: the closest names, else every name at that level."""
    here = sorted({f[len(prefix):].split(".")[0] for f in fields if f.startswith(prefix)})
    close = difflib.get_close_matches(key, here, n=3, cutoff=0.6)
    if close:
        return f"did you mean {' or '.join(close)}?"
    return (f"the keys of {label.rstrip('.')}: " if label else "the top-level keys: ") + ", ".join(here)


def _located(message: str, marks: dict[str, str]) -> str:
    """A validation message with the file and line of the YAML key it names, where there is one."""
    match = _LEADING_KEY.match(message)
    where = marks.get(match.group(1)) if match else None
    return f"{where}: {message}" if where else message


def _forget_overridden(marks: dict[str, str], nested: dict[str, Any], nodes: list[Any]) -> None:
    """Drop the YAML lines of keys a flat key sets after them: a message about one is the flat key's."""
    names = [str(n.name) for n in nodes]

    def paths(tree: dict, prefix: str):
        for k, v in tree.items():
            yield from paths(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]

    for idx, patch in (nested.get("nodes") or {}).items():
        name = names[int(idx)] if idx.isdigit() and int(idx) < len(names) else idx
        for p in paths(patch, f"nodes[{name}]."):
            marks.pop(p, None)
    for p in paths({k: v for k, v in nested.items() if k != "nodes"}, ""):
        marks.pop(p, None)


def load_experiment(preset: str | None = None, overrides: Mapping[str, Any] | None = None,
                    yaml_text: str | None = None, *, import_registries: bool = True,
                    yaml_name: str = "the YAML config", errors: list[str] | None = None) -> ExperimentConfig:
    """defaults <- YAML preset (name or path) <- YAML text (``yaml_name``: what errors call it, e.g.
    its file) <- flat dotted overrides; validated, every problem of every layer in one error.

    ``import_registries``: see :func:`ftis_flwr.config.validation.validate`. ``errors``: problems
    the caller found already (a missing file), reported with the rest.
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
            errors.append(str(_omegaconf_error(where, exc)))
    if overrides:
        nested, flat_errors = _flat_to_nested(overrides)
        errors += flat_errors
        nodes = list(merged.nodes)
        _forget_overridden(marks, nested, nodes)
        errors += _nodes_overrides(nested, nodes)
        try:
            merged.nodes = nodes
            merged = OmegaConf.merge(merged, OmegaConf.create(nested))
        except Exception as exc:
            errors.append(str(_omegaconf_error("the flat keys", exc)))
    if preset:
        merged.preset = preset
    try:
        cfg: ExperimentConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except Exception as exc:
        raise_errors(errors + [str(_omegaconf_error("the merged configuration", exc))])
    errors += [_located(e, marks) for e in experiment_errors(cfg, import_registries=import_registries)]
    raise_errors(errors)
    return cfg


def load_run_config(run_config: Mapping[str, Any], *, import_registries: bool = True) -> ExperimentConfig:
    """Flower's flat run config -> experiment (what the ServerApp does with ``context.run_config``).

    ``preset`` names the YAML preset, ``config-file`` a YAML file merged on top, then every other
    key that is not ``""`` ("the preset decides"), then ``overrides``: space-separated
    ``key=value`` pairs for keys with no entry in pyproject.toml (per-node card fields).
    """
    app = {_normalise_key(k): v for k, v in run_config.items() if _normalise_key(k) in APP_KEYS}
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
    flat = {k: v for k, v in run_config.items() if _normalise_key(k) not in APP_KEYS and v != ""}
    try:
        flat.update(parse_overrides(str(app.get("overrides", "") or "")))
    except ConfigError as exc:
        errors.append(str(exc))
    return load_experiment(preset or None, flat, yaml_text=yaml_text, import_registries=import_registries,
                           yaml_name=f"config-file {config_file!r}", errors=errors)


def from_dict(data: Mapping[str, Any], *, import_registries: bool = False) -> ExperimentConfig:
    """Inverse of :func:`ftis_flwr.config.schema.to_dict`, validated.

    By default only against the registries this process already imported (cheap: the ClientApp
    calls it per message); ``import_registries=True`` imports them, and imports a ``loss.method``
    given as an import path (what a node worker does before it builds its Node).
    """
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ExperimentConfig), OmegaConf.create(dict(data)))
        cfg: ExperimentConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except Exception as exc:
        raise _omegaconf_error("the experiment", exc) from None
    raise_errors(experiment_errors(cfg, import_registries=import_registries))
    return cfg


def card_from_dict(data: Mapping[str, Any], *, import_registries: bool = False) -> ModelCard:
    """A model card from a plain dict (a YAML file), validated like :func:`from_dict`."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ModelCard), OmegaConf.create(dict(data)))
        card: ModelCard = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except Exception as exc:
        raise _omegaconf_error("the model card", exc) from None
    raise_errors(card_errors(card, import_registries=import_registries), what="model card")
    return card
