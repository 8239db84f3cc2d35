"""A YAML layer of the configuration (a preset file, ``config-file``) checked key by key.

OmegaConf merges a YAML file whole and stops at its first problem; :func:`checked_yaml` walks the
file's nodes instead, so every unknown key and bad value is named with its file, line and column,
and the rest of the file (and the layers after it) are still checked. :func:`located` gives a later
validation message the line of the YAML key it names.
"""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any

from omegaconf import OmegaConf

from ftis_flwr.config.fields import card_fields, coerce, experiment_fields, normalise_key, scalar_type
from ftis_flwr.config.schema import ConfigError


def omegaconf_error(where: str, exc: Exception) -> ConfigError:
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
        errors.append(str(omegaconf_error(where, exc)))
        return {}
    if not isinstance(data, dict) or not isinstance(tree, yaml.MappingNode):
        errors.append(f"{where}: the file must be a mapping of sections (loss:, rollout:, nodes:, ...), "
                      f"not a {type(data).__name__}")
        return {}
    walk = _YamlWalk(where, errors, marks)
    return walk.mapping(data, tree, experiment_fields(), "", "")


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
            key, value = normalise_key(str(raw)), data.get(raw)
            full = prefix + key
            if full == "nodes" and fields is experiment_fields() and isinstance(value_node, yaml.SequenceNode):
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
                out.append(self.mapping(item, node, card_fields(), "", f"nodes[{item.get('name', i)}]."))
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


def located(message: str, marks: dict[str, str]) -> str:
    """A validation message with the file and line of the YAML key it names, where there is one."""
    match = _LEADING_KEY.match(message)
    where = marks.get(match.group(1)) if match else None
    return f"{where}: {message}" if where else message


def forget_overridden(marks: dict[str, str], nested: dict[str, Any], nodes: list[Any]) -> None:
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
