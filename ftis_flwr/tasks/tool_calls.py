"""How a model writes a tool call, and how its calls are read back (issue #57): one reader per
model family's format, chosen by :func:`tool_format_for`. Apart from the episode loop
(:mod:`ftis_flwr.node.turns`) because ``ftis-flwr check`` asks each node's tokenizer for its
format before anything starts (:mod:`ftis_flwr.tasks.environment_checks`).

Tool-call formats (:data:`TOOL_FORMATS`, chosen by :func:`tool_format_for`):

- ``hermes`` (Qwen2.5, Qwen3, Hermes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  one block per call, JSON inside;
- ``llama3-json`` (Llama 3.1 / 3.2 / 3.3): the whole turn is one JSON object
  ``{"name": ..., "parameters": {...}}`` (after an optional ``<|python_tag|>``), one call per
  turn as those templates allow; a turn that is not such an object is an answer;
- ``tiny`` (the character-level tiny models, whose vocabulary has no brackets or braces):
  ``#name(v1,v2)``, the values in the order of the tool's arguments, read by their type hints.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_MARKER = "<tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: a tool's name and its arguments, or why it could not be read."""

    name: str
    arguments: dict = field(default_factory=dict)
    error: str = ""
    """"" when the call was read; else why not (the model then reads it as an error observation)."""


class HermesFormat:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5 / Qwen3 / Hermes)."""

    name = "hermes"
    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str, tools: Mapping[str, dict]) -> list[ToolCall]:
        """The calls in ``text`` in order; a block that is not a JSON object with a string ``name``
        and an object ``arguments`` (or a JSON string of one) is a call with its error; a block
        opened and never closed is one too."""
        calls = []
        for block in self._BLOCK.finditer(text):
            calls.append(self._read(block.group(1).strip()))
        if text.count(_MARKER) > len(calls):
            calls.append(ToolCall("?", error="a <tool_call> block is never closed with </tool_call>"))
        return calls

    @staticmethod
    def _read(body: str) -> ToolCall:
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            return ToolCall("?", error=f"the tool call is not JSON ({exc.msg} at character {exc.pos})")
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return ToolCall("?", error='a tool call is a JSON object {"name": ..., "arguments": {...}}')
        args = data.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            return ToolCall(data["name"], error="the call's arguments are not a JSON object")
        return ToolCall(data["name"], args)

    def render(self, name: str, arguments: Mapping[str, Any], tools: Mapping[str, dict]) -> str:
        """A call's text as the model writes it (tests, and a receiver's replay)."""
        return f'<tool_call>\n{json.dumps({"name": name, "arguments": dict(arguments)})}\n</tool_call>'


class Llama3JsonFormat:
    """``{"name": ..., "parameters": {...}}`` as the whole turn (Llama 3.1 / 3.2 / 3.3's JSON tool calls)."""

    name = "llama3-json"
    _TAG = "<|python_tag|>"

    def parse(self, text: str, tools: Mapping[str, dict]) -> list[ToolCall]:
        """The turn's one call, or none when the turn is not a call (an answer); a turn that opens
        a call object (``{"name"``) but is not a valid one is a call with its error."""
        body = text.strip()
        if body.startswith(self._TAG):
            body = body[len(self._TAG):].strip()
        if not body.startswith("{"):
            return []
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            if re.match(r'\{\s*"name"\s*:', body):
                return [ToolCall("?", error=f"the tool call is not JSON ({exc.msg} at character {exc.pos})")]
            return []
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return []
        args = data.get("parameters", data.get("arguments", {}))
        if not isinstance(args, dict):
            return [ToolCall(data["name"], error="the call's parameters are not a JSON object")]
        return [ToolCall(data["name"], args)]

    def render(self, name: str, arguments: Mapping[str, Any], tools: Mapping[str, dict]) -> str:
        return json.dumps({"name": name, "parameters": dict(arguments)})


class TinyFormat:
    """``#name(v1,v2)``: the values in the order of the tool's arguments, read by their types."""

    name = "tiny"
    _CALL = re.compile(r"#([a-z_][a-z0-9_]*)\(([^()]*)\)")
    _READ = {"integer": int, "number": float, "string": str,
             "boolean": lambda v: {"true": True, "1": True, "false": False, "0": False}[v.lower()]}

    def parse(self, text: str, tools: Mapping[str, dict]) -> list[ToolCall]:
        calls = []
        for m in self._CALL.finditer(text):
            name, raw = m.group(1), m.group(2)
            if name not in tools:
                calls.append(ToolCall(name, error=f"Tool {name} not found. Tools: {', '.join(tools) or 'none'}"))
                continue
            props = tools[name]["function"]["parameters"]["properties"]
            values = raw.split(",") if raw else []
            if len(values) > len(props):
                calls.append(ToolCall(name, error=f"{name} takes {len(props)} values, got {len(values)}"))
                continue
            args, error = {}, ""
            for (arg, schema), value in zip(props.items(), values):
                kind = schema.get("type", "string")
                try:
                    args[arg] = self._READ.get(kind if isinstance(kind, str) else "string", str)(value.strip())
                except (ValueError, KeyError):
                    error = f"{name}: {arg} must be a {kind}, got {value.strip()!r}"
                    break
            calls.append(ToolCall(name, error=error) if error else ToolCall(name, args))
        return calls

    def render(self, name: str, arguments: Mapping[str, Any], tools: Mapping[str, dict]) -> str:
        props = tools[name]["function"]["parameters"]["properties"]
        return f"#{name}({','.join(str(arguments[a]) for a in props if a in arguments)})"


TOOL_FORMATS = {f.name: f for f in (HermesFormat(), Llama3JsonFormat(), TinyFormat())}
"""Tool-call format name -> its reader."""


def tool_format_for(tokenizer: Any, name: str = "auto"):
    """The format ``name`` names; ``"auto"``: ``hermes`` when the chat template writes
    ``<tool_call>``, ``llama3-json`` when it writes ``"parameters"`` and an ``ipython`` turn,
    ``tiny`` for a tokenizer without a chat template; ValueError otherwise."""
    if name != "auto":
        if name not in TOOL_FORMATS:
            raise ValueError(f"tool-call format {name!r} is not one of {', '.join(TOOL_FORMATS)}")
        return TOOL_FORMATS[name]
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return TOOL_FORMATS["tiny"]
    if isinstance(template, str) and _MARKER in template:
        return TOOL_FORMATS["hermes"]
    if isinstance(template, str) and '"parameters": ' in template and "ipython" in template:
        return TOOL_FORMATS["llama3-json"]
    raise ValueError("no known tool-call format for this chat template (it writes neither <tool_call> nor Llama "
                     f"3's JSON calls): name one of {', '.join(TOOL_FORMATS)}")
