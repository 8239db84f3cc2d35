"""The configuration's fields as dotted keys, and a value converted to a field's type.

Shared by every reader of configuration: the flat ``--run-config`` keys (:mod:`.merge`), the YAML
layers (:mod:`.yaml_layers`), the generated key list (:mod:`.keys`) and reference (:mod:`.reference`).
A value is converted the way Flower's TOML-typed run config needs (``8.0`` for an int field,
``"1e-4"`` for a float field, ``"true"`` for a bool field); one that does not convert raises
``ValueError`` saying what was expected, for the caller to name its key.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any

from ftis_flwr.config.schema import ExperimentConfig, ModelCard

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def normalise_key(key: str) -> str:
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


@functools.cache
def experiment_fields() -> dict[str, Any]:
    """Every dotted field of :class:`ExperimentConfig` -> its type hint (computed once)."""
    return dotted_fields(ExperimentConfig)


@functools.cache
def card_fields() -> dict[str, Any]:
    """Every dotted field of :class:`ModelCard` -> its type hint (computed once)."""
    return dotted_fields(ModelCard)
