"""An experiment loaded and checked whole: the configuration's own rules (:mod:`ftis_flwr.config`)
and what only its task can check (:mod:`ftis_flwr.tasks`), every problem in one error.

Why a module of its own: the configuration sits below the tasks (it needs no task to be read, a
node's worker re-reads a checked experiment with it), so it cannot reach the task's checks
itself; this module composes the two and is what a run starts from (``ftis-flwr check`` and
``run``, the ServerApp, the benchmarks and studies, the tests). The task's checks build the task
(its data files read, its reward functions imported and their signatures checked against the
rows), then fit its prompts to each node's model and an environment to the rows and each node's
tool-call format; they stay torch-free, so a check takes about a second.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ftis_flwr.config import merge
from ftis_flwr.config.schema import ExperimentConfig


def task_checks(cfg: ExperimentConfig) -> list[str]:
    """The task's own problems, each naming its key: its files, columns and rewards, then (when
    those hold) its prompts against each node's model and an environment."""
    from ftis_flwr.tasks.checks import task_errors
    from ftis_flwr.tasks.environment_checks import episode_errors
    from ftis_flwr.tasks.prompt_fit import prompt_errors

    return task_errors(cfg.task) or prompt_errors(cfg) + episode_errors(cfg)


CHECKS = (task_checks,)
"""What this module adds to the configuration's rules."""


def load_experiment(preset: str | None = None, overrides: Mapping[str, Any] | None = None,
                    yaml_text: str | None = None, **kwargs: Any) -> ExperimentConfig:
    """:func:`ftis_flwr.config.merge.load_experiment` with the task's checks (with
    ``import_registries``, the default)."""
    return merge.load_experiment(preset, overrides, yaml_text, checks=CHECKS, **kwargs)


def load_run_config(run_config: Mapping[str, Any], *, import_registries: bool = True) -> ExperimentConfig:
    """:func:`ftis_flwr.config.merge.load_run_config` (Flower's flat run config) with the task's checks."""
    return merge.load_run_config(run_config, import_registries=import_registries, checks=CHECKS)


def from_dict(data: Mapping[str, Any], *, import_registries: bool = False) -> ExperimentConfig:
    """:func:`ftis_flwr.config.merge.from_dict` with the task's checks (with ``import_registries``)."""
    return merge.from_dict(data, import_registries=import_registries, checks=CHECKS)
