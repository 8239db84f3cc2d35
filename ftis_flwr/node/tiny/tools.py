"""The tiny models' tool warm start (issue #57): a short supervised stage, after the arithmetic warm
start, on episodes of the shipped calculator (:mod:`ftis_flwr.tasks.calculator`) over the
``arithmetic-chain`` task's own ``warmstart`` rows (never an RL prompt or a test problem).

Why: the arithmetic warm start never shows a tool call, so a tiny model never writes one and an
environment's reward stays 0 (docs/your-own-environment.md). This stage shows both paths on the
same kind of row, as the episode loop would tokenize them (:func:`ftis_flwr.tasks.episode_prompt.prompt_ids`,
the ``tiny`` call format, :func:`ftis_flwr.node.turns.tool_turn_ids`):

- a share ``card.warmstart_tools`` of the rows **call the calculator** and copy its result:
  ``12+34-56=`` ``#calc(12+34-56)<eos>`` ``=-10\\n`` ``-10<eos>`` (two model turns);
- the rest **answer directly** (``12+34-56=`` ``-10<eos>``), which a tiny model gets right only by
  chance on three terms.

Only the model's tokens are labelled (the prompt and the tool turn are context, as in the loss). Both
paths stay open, and reinforcement learning has a choice to learn: the calculator's path earns the
reward far more often. The result is cached next to its base model (and shipped for preset
``cpu-pair-calc`` by :mod:`ftis_flwr.node.tiny.assets`), keyed by everything that determines it.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from ftis_flwr.config.schema import ModelCard
from ftis_flwr.node.tiny.models import digest, pad_rows, round_to_bf16, shipped_or_trained
from ftis_flwr.node.turns import tool_turn_ids
from ftis_flwr.tasks.arithmetic_chain import ArithmeticChainTask
from ftis_flwr.tasks.environment import ToolResult, load_environment
from ftis_flwr.tasks.episode_prompt import prompt_ids
from ftis_flwr.tasks.tool_calls import TOOL_FORMATS

log = logging.getLogger(__name__)

TOOLS_VERSION = "2"
"""Bump when this stage's code changes its result: old cache entries are then ignored."""
ENVIRONMENT = "ftis_flwr.tasks.calculator:Calculator"
TOOL_STEPS = 400
TOOL_LR = 1e-3
TOOL_BATCH = 64
TOOL_WARMUP = 20


def tool_key(card: ModelCard, base: Path, task_seed: int) -> dict[str, Any]:
    """Everything that determines the stage's result (hashed into its cache folder's name)."""
    return {"version": TOOLS_VERSION, "base": base.name, "environment": ENVIRONMENT, "format": "tiny",
            "share": float(card.warmstart_tools), "steps": TOOL_STEPS, "lr": TOOL_LR, "batch": TOOL_BATCH,
            "warmup": TOOL_WARMUP, "seed": int(card.seed), "task_seed": int(task_seed)}


def tool_dir(card: ModelCard, base: Path, task_seed: int) -> Path:
    """Where :func:`tool_warm_start` puts (or finds) the model: beside its base, named after it."""
    key = tool_key(card, base, task_seed)
    stem = base.name.rsplit("-", 1)[0]  # the base's digest gives way to this stage's
    return base.parent / f"{stem}-calc{round(100 * key['share'])}-{digest(key)}"


def tool_examples(tokenizer: Any, eos_id: int, share: float, seed: int,
                  task_seed: int) -> list[tuple[list[int], list[int]]]:
    """(ids, labels) of the stage's episodes: labels are -100 on the prompt and the tool turn."""
    spec = load_environment(ENVIRONMENT)
    fmt, schemas = TOOL_FORMATS["tiny"], spec.schemas
    problems = ArithmeticChainTask(seed=task_seed).problems("warmstart")
    calls = set(random.Random(f"{seed}:tools").sample(range(len(problems)), round(share * len(problems))))

    def enc(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    out = []
    for i, p in enumerate(problems):
        prompt = prompt_ids(tokenizer, [{"role": "user", "content": p.question}], schemas)
        answer = enc(p.gold) + [eos_id]
        if i in calls:
            call = enc(fmt.render("calc", {"expression": p.question.rstrip("=")}, spec.tools)) + [eos_id]
            tool = tool_turn_ids(tokenizer, [ToolResult("calc", p.gold)], [eos_id])
            ids = prompt + call + tool + answer
            labels = [-100] * len(prompt) + call + [-100] * len(tool) + answer
        else:
            ids, labels = prompt + answer, [-100] * len(prompt) + answer
        out.append((ids, labels))
    return out


def train_tools(card: ModelCard, base: Path, task_seed: int) -> tuple[Any, Any, dict[str, Any]]:
    """The stage itself, from ``base`` (no caching): model, tokenizer and a report."""
    from ftis_flwr.node.tiny.bpe import build_tiny_tokenizer

    # The tokenizer the nodes use (as a shipped model installs it): AutoTokenizer on the folder
    # builds a Qwen2Tokenizer, whose normalisation drops the tool turn's newline.
    tok = build_tiny_tokenizer(card.tiny_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    rows = tool_examples(tok, tok.eos_token_id, float(card.warmstart_tools), int(card.seed), task_seed)
    prev = torch.get_num_threads()
    torch.set_num_threads(card.torch_threads)
    try:
        torch.manual_seed(card.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=TOOL_LR, betas=(0.9, 0.98))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / TOOL_WARMUP))
        order, rng, losses, t0 = [], random.Random(card.seed), [], time.perf_counter()
        model.train()
        for _ in range(TOOL_STEPS):
            if len(order) < TOOL_BATCH:
                order = list(range(len(rows)))
                rng.shuffle(order)
            ids, mask, labels = pad_rows([rows[order.pop()] for _ in range(TOOL_BATCH)], tok.pad_token_id)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
        elapsed = time.perf_counter() - t0
    finally:
        torch.set_num_threads(prev)
    model.eval()
    round_to_bf16(model)
    report = {"key": tool_key(card, base, task_seed), "steps_run": TOOL_STEPS, "examples": len(rows),
              "final_loss": sum(losses[-20:]) / len(losses[-20:]), "seconds": elapsed, "losses": losses}
    return model, tok, report


def tool_warm_start(card: ModelCard, base: Path, task_seed: int) -> Path:
    """The tool-warm-started model of ``card`` on ``base``: shipped, or trained here once."""
    return shipped_or_trained(card, tool_dir(card, base, task_seed), "tool warm start",
                              lambda: train_tools(card, base, task_seed),
                              lambda r: f"{r['steps_run']} steps in {r['seconds']:.1f}s, loss {r['final_loss']:.3f}")


def warm_started(card: ModelCard, task: Any, cache_dir: Path | None = None, *, build: bool = True) -> Path:
    """The folder of a tiny card's model: its arithmetic warm start (:func:`ftis_flwr.node.tiny.models.warm_start`),
    then this stage when ``card.warmstart_tools`` > 0; shipped or trained once, then cached. ``task``
    is the run's task (a task other than arithmetic warm-starts on arithmetic with its seed). With
    ``build=False`` only the folder's path, nothing built (what the shipped assets are named)."""
    from ftis_flwr.node.tiny.models import warm_start, warmstart_dir
    from ftis_flwr.tasks.arithmetic import ArithmeticTask

    if task is not None and not isinstance(task, ArithmeticTask):  # a user's task: the arithmetic warm start
        task = ArithmeticTask(seed=getattr(task, "seed", ArithmeticTask().seed))
    base = warm_start(card, task, cache_dir) if build else warmstart_dir(card, task, cache_dir)
    if card.warmstart_tools <= 0:
        return base
    return tool_warm_start(card, base, task.seed) if build else tool_dir(card, base, task.seed)
