"""How an episode's turns become tokens (algorithm §13, issue #57): the prompt with the tools'
schemas, the model's tool calls read from its text, and the tools' results appended as tokens.

Why apart from the episode loop: each piece is a property of the model family (its chat template
and the tool-call format it was trained on), not of the loop. Two rules hold everywhere:

- **appended, never re-rendered**: the tokens of a tool turn are computed once, from the template
  applied to a minimal conversation, and appended after the tokens the model sampled, so the
  tokens trained on are exactly the tokens the model conditioned on (re-rendering a history can
  change earlier turns: thinking tags stripped, whitespace, tool-call JSON re-serialised);
- the model's turn ends with one of the node's stop ids (its end-of-turn token): the tool turn
  starts right after it.

Tool-call formats (:data:`TOOL_FORMATS`, chosen by :func:`tool_format_for`):

- ``hermes`` (Qwen2.5, Qwen3, Hermes): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  one block per call, JSON inside;
- ``tiny`` (the character-level tiny models, whose vocabulary has no brackets or braces):
  ``#name(v1,v2)``, the values in the order of the tool's arguments, read by their type hints.

A tokenizer without a chat template (the tiny models) gets each tool result as
:data:`PLAIN_TOOL_TURN` (``=<result>`` and a newline) and a prompt of its messages' text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PLAIN_TOOL_TURN = "={content}\n"
"""A tool result's text for a tokenizer without a chat template."""
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


TOOL_FORMATS = {f.name: f for f in (HermesFormat(), TinyFormat())}
"""Tool-call format name -> its reader."""


def tool_format_for(tokenizer: Any, name: str = "auto"):
    """The format ``name`` names; ``"auto"``: ``hermes`` when the chat template writes
    ``<tool_call>``, ``tiny`` for a tokenizer without a chat template; ValueError otherwise."""
    if name != "auto":
        if name not in TOOL_FORMATS:
            raise ValueError(f"tool-call format {name!r} is not one of {', '.join(TOOL_FORMATS)}")
        return TOOL_FORMATS[name]
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return TOOL_FORMATS["tiny"]
    if isinstance(template, str) and _MARKER in template:
        return TOOL_FORMATS["hermes"]
    raise ValueError("no known tool-call format for this chat template (it never writes <tool_call>): name one "
                     f"of {', '.join(TOOL_FORMATS)}")


def prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[dict]) -> list[int]:
    """An episode's prompt: the chat template over ``messages`` with the tools' schemas and the
    generation prompt; without a template, the messages' text (with the tokenizer's own special
    tokens, as :meth:`ftis_flwr.tasks.base.Task.prompt_ids` gives a plain prompt)."""
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template([dict(m) for m in messages], tools=list(tools) or None,
                                                  add_generation_prompt=True, tokenize=True, return_dict=False))
    text = "\n".join(str(m["content"]) for m in messages)
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def with_reset_text(messages: Sequence[Mapping[str, Any]], extra: str | None) -> list[dict]:
    """``messages`` with ``reset``'s string appended to the last user message (TRL's contract)."""
    out = [dict(m) for m in messages]
    if extra:
        users = [i for i, m in enumerate(out) if m.get("role") == "user"]
        if not users:
            raise ValueError("the prompt has no user message to append the environment's reset text to")
        out[users[-1]]["content"] = f"{out[users[-1]]['content']}{extra}"
    return out


def tool_turn_ids(tokenizer: Any, results: Sequence[Any], stop_ids: Sequence[int]) -> list[int]:
    """The tokens that follow a model turn (ended by one of ``stop_ids``) when ``results`` (each
    with ``name`` and ``content``) answer its tool calls, up to the next model turn's header.

    With a chat template: the template applied to a minimal conversation (a user message, an
    assistant turn that calls the first result's tool), once without and once with the tool
    messages and the generation prompt; the tokens after the first rendering's last stop id
    are the tool turn. ValueError when the template's assistant turn does not end with a stop
    id or renders it differently once tool messages follow (then nothing can be appended)."""
    if not results:
        raise ValueError("a tool turn needs at least one tool result")
    if not getattr(tokenizer, "chat_template", None):
        text = "".join(PLAIN_TOOL_TURN.format(content=r.content) for r in results)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    call = [{"type": "function", "function": {"name": results[0].name, "arguments": {}}}]
    head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": call}]
    tools = [{"role": "tool", "name": r.name, "content": r.content} for r in results]
    before = list(tokenizer.apply_chat_template(head, add_generation_prompt=False, tokenize=True, return_dict=False))
    after = list(tokenizer.apply_chat_template(head + tools, add_generation_prompt=True, tokenize=True,
                                               return_dict=False))
    stops = {int(t) for t in stop_ids}
    ends = [i for i, t in enumerate(before) if t in stops]
    if not ends:
        raise ValueError("the chat template's assistant turn does not end with one of the stop tokens "
                         f"{list(stop_ids)}: its tool turns cannot be appended after the model's")
    before = before[: ends[-1] + 1]
    if after[: len(before)] != before:
        raise ValueError("the chat template renders the assistant turn differently once a tool message follows: "
                         "its tool turns cannot be appended without re-rendering the history")
    return after[len(before):]
