"""Import paths a user writes in a configuration: ``"<module>:<name>"`` or ``"<file.py>:<name>"``.

Why one place: tasks (``task.name``), rewards (``task.reward``) and losses name user code the same
way (TRL takes callables, verl ``custom_reward_function.path`` + ``.name``); each reads it here, so
the forms accepted and the errors given are the same everywhere. A file is loaded once per process
under a name derived from its absolute path, so every caller gets the same function object.
The built-in names those paths complement live in one registry per kind (tasks, engines, selection
rules, trackers), each filled through :func:`register_unique`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ImportPathError(ValueError):
    """An import path that does not resolve; the message says which part and why."""


def is_import_path(text: str) -> bool:
    """``"<module>:<name>"`` or ``"<file.py>:<name>"`` (a built-in name has no colon)."""
    target, sep, attr = str(text).rpartition(":")
    return bool(sep and target and attr)


def import_object(path: str) -> Any:
    """The object ``path`` names; ImportPathError naming the module or file and the attribute."""
    target, sep, attr = str(path).rpartition(":")
    if not sep or not target or not attr:
        raise ImportPathError(f"{path!r} is not an import path '<module>:<name>' or '<file.py>:<name>'")
    if target.endswith(".py"):
        file = Path(target).expanduser()
        if not file.is_file():
            raise ImportPathError(f"file {target!r} does not exist (relative to {Path.cwd()})")
        module = _load_file(file.resolve())
        where = f"file {target!r}"
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:  # the user's module: named with its own error, never a traceback
            raise ImportPathError(f"cannot import module {target!r} ({type(exc).__name__}: {exc}); it must "
                                  "be importable on the server and on every node") from None
        where = f"module {target!r}"
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
            raise ImportPathError(f"{where} has no {attr!r}; it defines: {', '.join(names) or 'nothing callable'}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ImportPathError(f"{where}: {attr!r} is a {type(obj).__name__}, not a callable")
    return obj


def source_of(path: str) -> Path | None:
    """The file an import path's code lives in (for fingerprints), or None (a built-in module)."""
    target = str(path).rpartition(":")[0]
    if target.endswith(".py"):
        return Path(target).expanduser().resolve()
    spec = importlib.util.find_spec(target) if target else None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def _load_file(file: Path):
    name = "ftis_user_" + hashlib.sha256(str(file).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ImportPathError(f"file {str(file)!r} fails to load ({type(exc).__name__}: {exc})") from None
    return module


def registered_or_imported(registry: Mapping[str, T], name: str, *, label: str, unknown: str) -> T:
    """What a registry takes for ``name``: the object registered under it, else the object an import
    path (``"<module>:<name>"`` / ``"<file.py>:<name>"``) names; ValueError prefixed with ``label``
    when the path does not import, or saying ``unknown`` when ``name`` is neither."""
    if name in registry:
        return registry[name]
    if is_import_path(name):
        try:
            return import_object(name)
        except ImportPathError as exc:
            raise ValueError(f"{label}: {exc}") from None
    raise ValueError(unknown)


def register_unique(registry: dict[str, T], name: str, obj: T, kind: str,
                    error: type[Exception] = ValueError) -> T:
    """``registry[name] = obj``; a second, different object under the same name is refused with
    ``error`` naming the module that registered the first (registering the same one again is a no-op)."""
    if registry.get(name, obj) is not obj:
        raise error(f"{kind} {name!r} is already registered (by {registry[name].__module__})")
    registry[name] = obj
    return obj
