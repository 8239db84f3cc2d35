"""What a sender says about its tool turns on the wire (issue #57): the layout its chat template
writes around tool results, so a receiver of another template can check the observations its
model conditioned on without rendering the sender's template (:mod:`ftis_flwr.node.replay_text`).

Why in the wire layer: a group carries the layout as one string, and the wire's rules (three
strings, a size cap) are checked with the rest of the group before anything reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_LAYOUT_BYTES = 4096
"""The most bytes a tool-turn layout may hold on the wire (a template's markers are a few dozen)."""

FORMAT_NAME = re.compile(r"[a-z0-9_.-]{1,64}")
"""What a tool-call format's name on the wire may be (the receiver compares it with its own)."""


@dataclass(frozen=True)
class ToolTurnLayout:
    """How a node's template writes a tool turn: ``head``, each result's content joined by
    ``between``, then ``tail`` (up to the next model turn's header). A peer whose template
    writes tool turns differently checks a sent tool turn against the sender's layout of its own
    replayed results (the observations are compared, the markers are the sender's)."""

    head: str
    between: str
    tail: str

    def text(self, contents: Sequence[str]) -> bytes:
        """The tool turn's bytes for results with these contents."""
        return (self.head + self.between.join(contents) + self.tail).encode("utf-8")

    def wire(self) -> str:
        """The layout as one wire string (a JSON list of the three parts)."""
        return json.dumps([self.head, self.between, self.tail])

    @classmethod
    def from_wire(cls, text: str) -> ToolTurnLayout:
        """The layout a peer sent; ValueError when it is not three strings within
        :data:`MAX_LAYOUT_BYTES`."""
        if len(text.encode("utf-8")) > MAX_LAYOUT_BYTES:
            raise ValueError(f"a tool-turn layout of {len(text.encode('utf-8'))} bytes, more than {MAX_LAYOUT_BYTES}")
        try:
            parts = json.loads(text)
        except json.JSONDecodeError:
            parts = None
        if not isinstance(parts, list) or len(parts) != 3 or not all(isinstance(p, str) for p in parts):
            raise ValueError("a tool-turn layout is a JSON list of three strings (head, between, tail)")
        return cls(*parts)


NO_LAYOUT = "null"
"""The wire string of a sender that has no layout (its template writes each result's tool name)."""


def tools_fault(tool_format: object, tool_layout: object) -> str:
    """Why a group's ``tool_format`` / ``tool_layout`` (wire strings) break the wire rules, or "":
    a format name of :data:`FORMAT_NAME`'s characters, and a layout that
    :meth:`ToolTurnLayout.from_wire` reads (or :data:`NO_LAYOUT`)."""
    if not isinstance(tool_format, str) or not FORMAT_NAME.fullmatch(tool_format):
        return f"tool_format {str(tool_format)[:80]!r} is not a format name ([a-z0-9_.-], at most 64 characters)"
    if not isinstance(tool_layout, str):
        return f"tool_layout must be a string, got {type(tool_layout).__name__}"
    if tool_layout != NO_LAYOUT:
        try:
            ToolTurnLayout.from_wire(tool_layout)
        except ValueError as exc:
            return f"tool_layout: {exc}"
    return ""
