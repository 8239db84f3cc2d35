"""How an episode's turns become tokens (algorithm §13, issue #57): the prompt with the tools'
schemas (:mod:`ftis_flwr.tasks.episode_prompt`), and the tools' results appended as tokens.

Why apart from the episode loop: each piece is a property of the model family (its chat template
and the tool-call format it was trained on), not of the loop. Two rules hold everywhere:

- **appended, never re-rendered**: the tokens of a tool turn are computed once, from the template
  applied to a minimal conversation, and appended after the tokens the model sampled, so the
  tokens trained on are exactly the tokens the model conditioned on (re-rendering a history can
  change earlier turns: thinking tags stripped, whitespace, tool-call JSON re-serialised);
- the model's turn ends with one of the node's stop ids (its end-of-turn token): the tool turn
  starts right after it.

Tool-call formats (how a model writes a call) are read by :mod:`ftis_flwr.tasks.tool_calls`. A
tokenizer without a chat template (the tiny models) gets each tool result as
:data:`PLAIN_TOOL_TURN` (``=<result>`` and a newline) and a prompt of its messages' text.

A node's :class:`~ftis_flwr.wire.tool_turns.ToolTurnLayout` (what its template writes around the
results) travels with its episodes' texts, so a peer of another template can check the tool turns
its model conditioned on (:mod:`ftis_flwr.node.replay_text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ftis_flwr.tasks.environment import ToolResult
from ftis_flwr.wire.tool_turns import ToolTurnLayout
from ftis_flwr.xtok.token_bytes import token_bytes

PLAIN_TOOL_TURN = "={content}\n"
"""A tool result's text for a tokenizer without a chat template."""


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


def tool_turn_layout(tokenizer: Any, stop_ids: Sequence[int]) -> ToolTurnLayout:
    """This tokenizer's :class:`ToolTurnLayout`, read from :func:`tool_turn_ids` of results "0",
    "1" and of both (the bytes its tokens stand for, special tokens as their text). ValueError
    when the template does not wrap each result the same way (it writes the tool's name or the
    results' count) or nothing can be appended at all."""
    def turn(*contents: str, name: str = "tool") -> bytes:
        ids = tool_turn_ids(tokenizer, [ToolResult(name, c) for c in contents], stop_ids)
        return b"".join(token_bytes(tokenizer, ids, specials="content"))

    zero, one, both = turn("0"), turn("1"), turn("0", "1")
    if turn("0", name="fn") != zero:
        raise ValueError("the template writes each result's tool name into the tool turn")
    n = len(zero)
    if len(one) != n:
        raise ValueError("the tool turn's length depends on more than its result's text")
    head = next((i for i in range(n) if zero[i] != one[i]), n)
    tail = n - head - 1
    if tail < 0 or zero[head + 1:] != one[head + 1:]:
        raise ValueError("the tool turn is not its markers around the result's text")
    pre, post, mid = zero[:head], zero[n - tail:], both[head + 1:len(both) - tail]
    try:
        layout = ToolTurnLayout(pre.decode("utf-8"), mid[:-1].decode("utf-8"), post.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("the tool turn's markers are not UTF-8 text") from None
    if layout.text(["0"]) != zero or layout.text(["1"]) != one or layout.text(["0", "1"]) != both:
        raise ValueError("the tool turn does not wrap each result the same way (its markers depend on how "
                         "many results it holds)")
    return layout
