"""A tool's JSON schema from its signature and Google-style docstring (issue #57).

Why our own: an environment written for TRL exposes its public methods as tools, and the schema a
chat template renders for each is built from the method's type hints and its docstring's
description and ``Args:`` section. This module builds the same shape as ``transformers``'
``get_json_schema`` (``{"type": "function", "function": {"name", "description", "parameters",
"return"?}}``; a test compares the two), with this project's errors: a tool without a docstring,
with an argument that has no type hint or no description, or with ``*args`` / ``**kwargs`` is
refused with a :class:`ToolSchemaError` naming the tool and what is missing, when the environment
is loaded rather than in a node's first round.

Types: ``str``, ``int``, ``float``, ``bool``, ``list[...]`` / ``tuple[...]``, ``dict[...]``,
``Literal[...]`` (an ``enum``), ``X | None`` / ``Optional[X]`` (``nullable``), ``Any`` (no type).
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARG = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_BASIC = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


class ToolSchemaError(ValueError):
    """A tool that cannot be described to a model; the message names the tool and why."""


def parse_docstring(doc: str) -> tuple[str, dict[str, str], str]:
    """(description, argument name -> description, returns description) of a Google-style
    docstring. The description is the text before the first section; an argument's description
    may continue on more indented lines (joined with a space)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    description, args, returns = [], {}, []
    section, current, indent = None, None, None
    for line in lines:
        head = _SECTION.match(line)
        if head:
            section, current, indent = head.group(1).lower(), None, None
            continue
        if section is None:
            description.append(line)
        elif section in ("args", "arguments", "parameters"):
            if not line.strip():
                continue
            depth = len(line) - len(line.lstrip())
            item = _ARG.match(line.strip())
            if item and (indent is None or depth <= indent):
                indent, current = depth, item.group(1).lstrip("*")
                args[current] = item.group(3).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
        elif section in ("returns", "return") and line.strip():
            returns.append(line.strip())
    return "\n".join(description).strip(), args, " ".join(returns)


def type_schema(hint: Any, where: str) -> dict[str, Any]:
    """The JSON schema of one type hint; ToolSchemaError naming ``where`` for one it cannot say."""
    if hint is Any:
        return {}
    if hint in _BASIC:
        return {"type": _BASIC[hint]}
    origin, params = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [p for p in params if p is not type(None)]
        out = type_schema(rest[0], where) if len(rest) == 1 else {"type": [type_schema(p, where).get("type")
                                                                            for p in rest]}
        if len(rest) < len(params):
            out["nullable"] = True
        return out
    if origin is typing.Literal:
        kinds = {_BASIC.get(type(v)) for v in params}
        return {"type": kinds.pop() if len(kinds) == 1 else sorted(k for k in kinds if k), "enum": list(params)}
    if hint in (list, tuple) or origin in (list, tuple):
        out: dict[str, Any] = {"type": "array"}
        if params and params[-1] is not Ellipsis and (origin is list or len(params) == 1):
            out["items"] = type_schema(params[0], where)
        elif params and origin is tuple:
            out["items"] = type_schema(params[0], where) if params[-1] is Ellipsis else \
                {"type": [type_schema(p, where).get("type") for p in params]}
        return out
    if hint is dict or origin is dict:
        out = {"type": "object"}
        if len(params) == 2:
            out["additionalProperties"] = type_schema(params[1], where)
        return out
    raise ToolSchemaError(f"{where}: type {hint!r} cannot be described as JSON (use str, int, float, bool, "
                          "list, dict, Literal or X | None)")


def tool_schema(fn: Callable, owner: str = "") -> dict[str, Any]:
    """The tool schema of ``fn`` (a function or bound method: ``self`` is left out), named after it.
    ``owner`` (the environment class) prefixes the errors."""
    name = getattr(fn, "__name__", repr(fn))
    where = f"{owner + '.' if owner else ''}{name}"
    doc = inspect.getdoc(fn)
    if not doc or not doc.strip():
        raise ToolSchemaError(f"tool {where} has no docstring: a tool needs a Google-style docstring (a "
                              "description, and an 'Args:' line per argument) for the model to know it")
    description, arg_docs, returns = parse_docstring(doc)
    if not description:
        raise ToolSchemaError(f"tool {where}: its docstring has no description before its sections")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # a hint that does not resolve (a name the module does not define)
        raise ToolSchemaError(f"tool {where}: its type hints do not resolve ({type(exc).__name__}: {exc})") from None
    properties: dict[str, Any] = {}
    required = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolSchemaError(f"tool {where}: *{param.name} / **{param.name} cannot be described to a model; "
                                  "name every argument")
        if param.name not in hints:
            raise ToolSchemaError(f"tool {where}: argument {param.name!r} has no type hint")
        if not arg_docs.get(param.name):
            raise ToolSchemaError(f"tool {where}: argument {param.name!r} is not described in the docstring's "
                                  f"'Args:' section ('{param.name}: what it is')")
        prop = type_schema(hints[param.name], f"tool {where}, argument {param.name!r}")
        prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is param.empty:
            required.append(param.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    function: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    if "return" in hints and hints["return"] is not type(None):
        ret = type_schema(hints["return"], f"tool {where}, return value")
        if returns:
            ret["description"] = returns
        function["return"] = ret
    return {"type": "function", "function": function}
