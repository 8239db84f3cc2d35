"""Prompt sources and their rewards: offline generated arithmetic and basic math, GSM8K and
MATH-500, words in capitals (:mod:`.uppercase`), a user's data set (:mod:`.dataset`),
reasoning-gym's generators (:mod:`.reasoning_gym`) or a user's factory, all found through one
registry (:mod:`.registry`); :mod:`.rewards` and :mod:`.reward_funcs` score completions. May import
only :mod:`ftis_flwr.config`."""

from __future__ import annotations

from ftis_flwr.config.choices import TASK_NAMES
from ftis_flwr.tasks.arithmetic import ArithmeticTask, carry_add, op_of, op_weights, parse_ops
from ftis_flwr.tasks.arithmetic_chain import ArithmeticChainTask
from ftis_flwr.tasks.base import Problem, Task
from ftis_flwr.tasks.basic_math import BasicMathTask
from ftis_flwr.tasks.dataset import DatasetTask
from ftis_flwr.tasks.gsm8k import MathTask, gsm8k_task, load_jsonl, math500_task
from ftis_flwr.tasks.reasoning_gym import ReasoningGymTask, reasoning_gym_task  # imports reasoning_gym lazily
from ftis_flwr.tasks.registry import TaskError, make_task, register_task, register_task_prefix, task_names
from ftis_flwr.tasks.uppercase import UppercaseTask

register_task("arithmetic", lambda cfg: ArithmeticTask(seed=cfg.seed))
register_task("arithmetic-heldout", lambda cfg: ArithmeticTask(seed=cfg.seed, heldout=True))
register_task("arithmetic-chain", lambda cfg: ArithmeticChainTask(seed=cfg.seed))
register_task("basic-math", lambda cfg: BasicMathTask(seed=cfg.seed, shots=cfg.shots))
register_task("basic-math-20", lambda cfg: BasicMathTask(seed=cfg.seed, shots=cfg.shots, max_operand=20,
                                                         test_size=256))
register_task("gsm8k", lambda cfg: gsm8k_task(cfg.train_path, dict(cfg.eval_paths), cfg.seed, cfg.shots))
register_task("math500", lambda cfg: math500_task(cfg.train_path, dict(cfg.eval_paths), cfg.seed, cfg.shots))
register_task("uppercase", lambda cfg: UppercaseTask(seed=cfg.seed, shots=cfg.shots))
register_task("dataset", DatasetTask)
register_task_prefix("reasoning-gym", reasoning_gym_task)


__all__ = ["ArithmeticTask", "ArithmeticChainTask",
           "BasicMathTask", "MathTask", "Problem", "ReasoningGymTask", "reasoning_gym_task", "Task",
           "TASK_NAMES", "gsm8k_task", "load_jsonl", "make_task", "register_task", "register_task_prefix", "task_names",
           "TaskError", "UppercaseTask", "math500_task", "op_of", "op_weights", "parse_ops", "carry_add"]
