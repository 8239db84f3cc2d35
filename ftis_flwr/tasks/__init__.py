"""Prompt sources and their rewards: offline generated arithmetic and basic math, GSM8K and
MATH-500 (see each module); :mod:`.rewards` scores completions. May import only :mod:`ftis_flwr.config`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftis_flwr.config.choices import TASK_NAMES
from ftis_flwr.tasks.arithmetic import ArithmeticTask, carry_add, op_of, op_weights, parse_ops
from ftis_flwr.tasks.base import Problem, Task
from ftis_flwr.tasks.basic_math import BasicMathTask
from ftis_flwr.tasks.gsm8k import MathTask, gsm8k_task, load_jsonl, math500_task

if TYPE_CHECKING:
    from ftis_flwr.config.schema import TaskConfig



def make_task(cfg: "TaskConfig") -> Task:
    """Build the task named by ``cfg.name``; nothing is read until problems are first asked for."""
    if cfg.name == "arithmetic":
        return ArithmeticTask(seed=cfg.seed)
    if cfg.name == "arithmetic-heldout":
        return ArithmeticTask(seed=cfg.seed, heldout=True)
    if cfg.name == "basic-math":
        return BasicMathTask(seed=cfg.seed, shots=cfg.shots)
    if cfg.name == "basic-math-20":
        return BasicMathTask(seed=cfg.seed, shots=cfg.shots, max_operand=20, test_size=256)
    if cfg.name == "gsm8k":
        return gsm8k_task(cfg.train_path, dict(cfg.eval_paths), cfg.seed, cfg.shots)
    if cfg.name == "math500":
        return math500_task(cfg.train_path, dict(cfg.eval_paths), cfg.seed, cfg.shots)
    raise ValueError(f"unknown task {cfg.name!r}; valid tasks: {', '.join(TASK_NAMES)}")


__all__ = ["ArithmeticTask", "BasicMathTask", "MathTask", "Problem", "Task", "TASK_NAMES", "gsm8k_task",
           "load_jsonl", "make_task", "math500_task", "op_of", "op_weights", "parse_ops", "carry_add"]
