"""An episode's prompt (algorithm §13, issue #57): the row's question as messages, ``reset``'s text
appended, rendered with the tools' schemas. Apart from the episode loop because every party
renders it the same way: the node that samples, a receiver replaying the episode
(:mod:`ftis_flwr.node.replay`), and ``ftis-flwr check`` measuring it against each model's
positions (:mod:`ftis_flwr.tasks.environment_checks`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ftis_flwr.tasks.base import Problem


def prompt_messages(problem: Problem, chat: bool) -> list[dict]:
    """The prompt of an episode before ``reset``'s text: the question as the user's message, after
    the paper's system prompt when the task renders through the chat template (``task.chat``)."""
    messages = [{"role": "user", "content": problem.question}]
    if chat:
        from ftis_flwr.tasks.rewards import SYSTEM_PROMPT

        messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
    return messages


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
