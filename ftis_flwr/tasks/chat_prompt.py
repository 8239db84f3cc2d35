"""The chat prompt of the tasks for real chat models (the paper's system prompt, worked examples as
earlier turns, the question): one function the built-in tasks and a user's data set share."""

from __future__ import annotations

from typing import Any


def chat_prompt(question: str, tokenizer: Any, demos: tuple[tuple[str, str], ...] = ()) -> str:
    """SYSTEM_PROMPT, worked ``demos`` as earlier turns, then the question, through the
    tokenizer's chat template (plain text if it has none)."""
    from ftis_flwr.tasks.rewards import SYSTEM_PROMPT

    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        for q, a in demos:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": question})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    shown = "".join(f"User: {q}\nAssistant: {a}\n\n" for q, a in demos)
    return f"{SYSTEM_PROMPT}\n\n{shown}User: {question}\nAssistant:"


def check_shots(shots: int, demos: tuple, task: str) -> int:
    """``shots`` as an int; ValueError unless 0 <= shots <= the worked examples there are."""
    if not 0 <= int(shots) <= len(demos):
        raise ValueError(f"task {task!r}: shots={shots} must be in 0..{len(demos)}")
    return int(shots)
