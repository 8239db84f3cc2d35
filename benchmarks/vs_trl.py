"""One node's GRPO step beside TRL's ``GRPOTrainer`` on the same work, one process, interleaved (#27).

    scripts/trl_env.sh                                    # once: .venv/trl with trl==1.16.0
    .venv/trl/bin/python -m benchmarks.vs_trl --model tiny --repeats 3
    .venv/trl/bin/python -m benchmarks.vs_trl --model smollm2 --repeats 3

Same model (``tiny``: cpu-pair's small model, char-level; ``smollm2``: cpu-smollm2's full card),
float32 weights and compute on both sides (the card's ``auto`` is pinned), same prompts (the
task's own rendering, given to TRL as plain-text prompts), G, max_new_tokens, temperature,
learning rate, micro-batch and optimiser steps; HF ``generate`` on both sides; each side warmed
up by one step first. TRL's gradient checkpointing (its default) is off, as the node does not
checkpoint; ``--trl-checkpointing`` measures TRL with it. Per step:
wall time split into generate / score / update; the process's peak RSS during it (VmHWM reset
before each side; both sides' models and optimiser states stay resident, so it includes the
other side's) and the step's own peak above the RSS it started from; generated tokens per second.

This project's side is :class:`ftis_flwr.node.node.Node` as its worker drives it: ``generate`` (the
engine records pi_gen's log-probs while sampling: no separate scoring pass) then ``train`` (one
optimiser step over micro-batches), alone; then the same node with as many groups again
relabelled as a partner's (its step in a 2-node federation). TRL's side: ``_generate`` is
generate, the rest of ``_generate_and_score_completions`` (rewards, advantages, any old
log-probs) is score, the rest of the optimiser step (forward, backward, step) is update.
Medians over ``--repeats``; the last line is ``ftis/trl step time ratio = X`` (alone).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import statistics
import time
from pathlib import Path

from benchmarks.real_memory import _reset_peak  # VmHWM reset, as that benchmark does
from benchmarks.real_memory import _status as _gib

REPO = Path(__file__).resolve().parent.parent

PRESETS = {"tiny": ("cpu-pair", "small"), "smollm2": ("cpu-smollm2", "full")}


def setting(model: str, prompts: int | None):
    from ftis_flwr.experiment import load_experiment

    preset, card_name = PRESETS[model]
    overrides = {"advantage.mode": "alone"}
    if prompts:
        overrides["rounds.prompts_per_node"] = prompts
    exp = load_experiment(preset, overrides=overrides)
    card = next(c for c in exp.nodes if c.name == card_name)
    # like for like: TRL's side runs float32 on the CPU (bf16=False); the card's "auto" would pick
    # bfloat16 compute where the CPU has it natively (AVX512-BF16), so the node is pinned too
    card.dtype, card.compute_dtype = "float32", "float32"
    return exp, card


class Ours:
    """The node, driven as its worker drives it."""

    def __init__(self, exp, card):
        import torch

        from ftis_flwr.node.node import Node

        torch.set_num_threads(card.torch_threads)
        self.exp, self.node, self.rnd = exp, Node(card, exp), 0

    def step(self, partner: bool) -> dict:
        exp, node = self.exp, self.node
        b, g = exp.rounds.prompts_per_node, exp.rollout.group_size
        t0 = time.perf_counter()
        groups = node.generate(list(range(self.rnd * b, (self.rnd + 1) * b)), g, self.rnd)
        t1 = time.perf_counter()
        batch = list(groups) + ([dataclasses.replace(x, node="partner") for x in groups] if partner else [])
        node.train(batch, self.rnd, 1000)
        t2 = time.perf_counter()
        self.rnd += 1
        return {"generate": t1 - t0, "score": 0.0, "update": t2 - t1,
                "tokens": sum(x.num_tokens for x in groups)}


class Theirs:
    """TRL's GRPOTrainer on the node's model (a copy of the same starting weights), tokenizer
    and prompts, one optimiser step per ``step``."""

    def __init__(self, exp, card, node, checkpointing: bool = False):
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        task, tok = node.task, node.tokenizer
        b, g, mb = exp.rounds.prompts_per_node, exp.rollout.group_size, exp.train.micro_batch_size
        rows = [{"prompt": task.prompt_text(task.train_problem(i), tok), "index": i} for i in range(b * 50)]

        def reward(completions, index, **_):
            return [task.reward(c, task.train_problem(i)) for c, i in zip(completions, index)]

        per_step = b * g
        args = GRPOConfig(
            output_dir=str(Path("/tmp") / "ftis-vs-trl"), use_cpu=True, bf16=False, fp16=False,
            per_device_train_batch_size=min(mb, per_step), gradient_accumulation_steps=max(1, per_step // mb),
            num_generations=g, max_completion_length=exp.rollout.max_new_tokens,
            temperature=exp.rollout.temperature, top_p=1.0, top_k=0, learning_rate=card.lr or exp.train.lr,
            lr_scheduler_type="constant", warmup_steps=0, beta=0.0, max_grad_norm=exp.train.grad_clip,
            max_steps=10_000, logging_steps=10_000, save_strategy="no", report_to=[], seed=card.seed,
            shuffle_dataset=False, disable_dropout=True, dataloader_num_workers=0,
            gradient_checkpointing=checkpointing)
        self.tok = tok
        model = copy.deepcopy(node.model)
        self.times: dict = {}
        self.trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args,
                                   train_dataset=Dataset.from_list(rows), processing_class=tok)
        t = self.trainer
        gen, gas = t._generate, t._generate_and_score_completions

        def timed_generate(*a, **k):
            t0 = time.perf_counter()
            out = gen(*a, **k)
            self.times["generate"] = self.times.get("generate", 0.0) + time.perf_counter() - t0
            self.times["tokens"] = self.times.get("tokens", 0) + int(sum(len(c) for c in out[1]))
            return out

        def timed_gas(*a, **k):
            t0 = time.perf_counter()
            out = gas(*a, **k)
            self.times["generate_and_score"] = self.times.get("generate_and_score", 0.0) + time.perf_counter() - t0
            return out

        t._generate, t._generate_and_score_completions = timed_generate, timed_gas
        outer = self

        class StepTimes(TrainerCallback):
            def on_step_begin(self, *_a, **_k):
                outer.times = {"t0": time.perf_counter()}

            def on_step_end(self, args, state, control, **_k):
                outer.times["total"] = time.perf_counter() - outer.times["t0"]
                control.should_training_stop = True  # one optimiser step per call to step()
                return control

        t.add_callback(StepTimes())
        self._batches = None

    def step(self) -> dict:
        """One optimiser step: the first through ``trainer.train()`` (it builds the optimiser; a
        callback stops it after one step), the next ones through the same trainer's own
        ``training_step`` per micro-batch and its optimiser and scheduler."""
        t = self.trainer
        if self._batches is None:
            t.train()
            self._batches = iter(t.get_train_dataloader())
        else:
            self.times = {"t0": time.perf_counter()}
            t.model.train()
            for _ in range(t.args.gradient_accumulation_steps):
                t.training_step(t.model, next(self._batches), None)
            if t.args.max_grad_norm:
                import torch

                torch.nn.utils.clip_grad_norm_(t.model.parameters(), t.args.max_grad_norm)
            t.optimizer.step()
            t.lr_scheduler.step()
            t.model.zero_grad(set_to_none=True)
            self.times["total"] = time.perf_counter() - self.times["t0"]
        d = self.times
        gen, gas = d.get("generate", 0.0), d.get("generate_and_score", 0.0)
        return {"generate": gen, "score": gas - gen, "update": d["total"] - gas, "tokens": d.get("tokens", 0)}


def median_row(rows: list[dict]) -> dict:
    keys = ("generate", "score", "update", "step", "peak_gib", "extra_gib", "tok_s")
    return {k: statistics.median(r[k] for r in rows) for k in keys}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", type=int, default=0, help="prompts per step (default: the preset's)")
    p.add_argument("--trl-checkpointing", action="store_true",
                   help="TRL's default gradient checkpointing (off by default here: the node does not checkpoint)")
    args = p.parse_args(argv)
    try:
        import trl
    except ImportError:
        raise SystemExit("TRL is not installed here: run scripts/trl_env.sh, then .venv/trl/bin/python "
                         "benchmarks/vs_trl.py (TRL is not a dependency of this project)") from None
    exp, card = setting(args.model, args.prompts or None)
    ours = Ours(exp, card)
    theirs = Theirs(exp, card, ours.node, args.trl_checkpointing)
    print(f"# {args.model}: {card.name} of {Path(exp.preset).stem}; {exp.rounds.prompts_per_node} prompts x G "
          f"{exp.rollout.group_size}, {exp.rollout.max_new_tokens} new tokens, micro-batch "
          f"{exp.train.micro_batch_size}, lr {card.lr or exp.train.lr}; float32 weights and compute on "
          f"both sides; trl {trl.__version__}, gradient "
          f"checkpointing {'on' if args.trl_checkpointing else 'off'}", flush=True)
    sides = {"ftis alone": lambda: ours.step(False), "ftis + partner": lambda: ours.step(True),
             "trl": theirs.step}
    for fn in sides.values():  # warm-up: one step each, not counted
        fn()
    rows: dict[str, list[dict]] = {k: [] for k in sides}
    for rep in range(args.repeats):
        for name, fn in sides.items():
            gc.collect()
            _reset_peak()
            before = _gib("VmRSS")
            t0 = time.perf_counter()
            r = fn()
            r["step"] = time.perf_counter() - t0
            r["peak_gib"] = _gib("VmHWM")
            r["extra_gib"] = r["peak_gib"] - before
            r["tok_s"] = r["tokens"] / r["generate"] if r["generate"] > 0 else float("nan")
            rows[name].append(r)
            print(json.dumps({"repeat": rep, "side": name, **{k: round(v, 3) for k, v in r.items()}}), flush=True)
    print("\n| side | step s | generate s | score s | update s | process peak GiB | step's own peak GiB | "
          "generated tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    med = {k: median_row(v) for k, v in rows.items()}
    for name, m in med.items():
        print(f"| {name} | {m['step']:.2f} | {m['generate']:.2f} | {m['score']:.2f} | {m['update']:.2f} | "
              f"{m['peak_gib']:.2f} | {m['extra_gib']:.2f} | {m['tok_s']:.0f} |")
    print(f"\nftis/trl step time ratio = {med['ftis alone']['step'] / med['trl']['step']:.2f}")


if __name__ == "__main__":
    main()
