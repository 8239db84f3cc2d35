"""What a finished run's models answer (``ftis-flwr answers RUN``): greedy, on the run's own
held-out problems, as the run evaluated them.

Why: an accuracy that repeats to the digit across seeds (two cross-family runs ended with Gemma at
exactly 5.46% test and 3.98% OOD) suggests a model that answers every problem alike. For each
node's final checkpoint (``start``: the model it started from) and each held-out split, the report
gives:

- the accuracy, beside what the run reported at its last evaluation (the same code path, the
  run's own settings and torch threads: the two must agree, and a difference is said);
- how many answers get full credit (a task with partial credit, such as reasoning-gym's
  ``spell_backward``, pays for part of a wrong answer);
- how many ``<answer>`` texts stand word for word in the prompt (the question or a worked
  example's answer, copied instead of worked out; case aside, unless the task's reward reads
  case, as ``uppercase``'s does);
- how many answers are distinct, and the most common ones with their counts;
- examples: the question, the reference answer, the model's answer and its score.

With an environment (``task.environment``), each problem is one greedy episode, replayed from its
row and seed as the run's evaluation ran it; its answer is the episode's last model turn, its score
the environment's or the task's, and the JSON keeps each episode's messages.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class AnswersError(ValueError):
    """A folder, node or split the report cannot answer for; the message says what it lacks."""


def load_checkpoint(ckpt: Path):
    """(model, tokenizer) of a saved checkpoint: a full model, or a LoRA adapter on its base."""
    import torch
    from transformers import AutoModelForCausalLM

    from ftis_flwr.node.models import load_tokenizer

    if (ckpt / "adapter_config.json").exists():
        from peft import PeftModel

        base = json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"]
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), ckpt)
    else:
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    tok = load_tokenizer(ckpt)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return model.eval(), tok


def start_of(ckpt: Path) -> Path:
    """The folder of the model a checkpoint started from: a LoRA adapter's base (the adapter
    starts as the identity), else the base ``ftis_policy.json`` names."""
    if (ckpt / "adapter_config.json").exists():
        return Path(json.loads((ckpt / "adapter_config.json").read_text())["base_model_name_or_path"])
    return Path(json.loads((ckpt / "ftis_policy.json").read_text())["base"])


def run_task(cfg: dict):
    """The task of a run's ``config.json`` (read into ``cfg``), built as the run built it."""
    from ftis_flwr.config.schema import TaskConfig
    from ftis_flwr.tasks import make_task

    return make_task(TaskConfig(**cfg["task"]))


def greedy_answers(run_dir: Path, node: dict, task: Any, threads: int | None = None, start: bool = False,
                   splits: list[str] | None = None) -> dict[str, tuple[list, list[str], list[str], list[float], list]]:
    """split -> (problems, prompt texts, greedy answer texts, their scores, their episodes) of one
    node's final checkpoint (``start``: the model it started from) on the run's ``task``
    (:func:`run_task`), with the run's settings (``config.json``: ``eval_size``,
    ``max_new_tokens``, ``batch_size``, stop tokens) and the node's torch threads unless
    ``threads`` is given (a second thread can change an answer). With ``task.environment``: one
    greedy episode per problem as the run evaluated it
    (:func:`ftis_flwr.node.env_rollout.greedy_episodes`), its final answer, its score and its
    messages; otherwise one completion, the task's reward, and no episode (None)."""
    import torch

    from ftis_flwr.node.engines.hf import HFEngine
    from ftis_flwr.node.models import stop_token_ids

    cfg = json.loads((run_dir / "config.json").read_text())
    torch.set_num_threads(threads or int(node.get("torch_threads") or 1))
    ckpt = run_dir / "checkpoints" / node["name"]
    model, tok = load_checkpoint(start_of(ckpt) if start else ckpt)
    stops = stop_token_ids(tok, model, node.get("stop_tokens") or [])
    engine = HFEngine(model, tok, eos_token_ids=stops, vocab_size=len(tok),
                      share_prompts=bool(cfg["rollout"].get("share_prompts", True)))
    env = None
    if (cfg.get("task") or {}).get("environment"):
        from ftis_flwr.config.merge import from_dict
        from ftis_flwr.node.env_rollout import EnvironmentRollout

        env = EnvironmentRollout(from_dict(cfg), tok, stops, node["name"])
    out = {}
    size = cfg["rounds"]["eval_size"]
    for split in splits or task.eval_splits:
        problems = task.problems(split)
        problems = problems[:size] if size else problems
        prompts = [list(task.prompt_ids(p, tok)) for p in problems]
        shown = tok.batch_decode(prompts, skip_special_tokens=True)
        if env is not None:
            from ftis_flwr.node.env_rollout import greedy_episodes
            from ftis_flwr.tasks.reward_funcs import answer_text

            episodes = greedy_episodes(env, engine, tok, stops, task, problems)
            out[split] = (problems, shown, [answer_text(e.messages) for e in episodes],
                          [float(e.score) for e in episodes], [e.messages for e in episodes])
            continue
        ids = engine.greedy(prompts, max_new_tokens=cfg["rollout"]["max_new_tokens"],
                            batch_size=cfg["rollout"]["batch_size"])
        texts = tok.batch_decode([c.tolist() for c in ids], skip_special_tokens=True)
        out[split] = (problems, shown, texts, [float(x) for x in task.rewards(list(texts), problems)],
                      [None] * len(texts))
    return out


def reported(rows: list[dict], node: str, split: str) -> tuple[int, float] | None:
    """(round, accuracy) of the run's last evaluation of ``node`` on ``split``, from the rows of
    its metrics.jsonl."""
    key = f"eval/{split}/accuracy"
    found = [(r["round"], r["nodes"][node][key]) for r in rows
             if isinstance(r.get("nodes", {}).get(node, {}).get(key), (int, float))]
    return found[-1] if found else None


def copied(text: str, prompt: str, ignore_case: bool = True) -> bool:
    """Whether the completion's ``<answer>`` text (strict format) stands word for word in the
    prompt: a model that copies the question (its operands, the word to spell backward) or a
    worked example's answer instead of answering. Case aside unless ``ignore_case`` is False,
    as for a task whose reward reads case (``Task.answer_case_matters``: on ``uppercase`` the
    right answer is the question's word in capitals, not a copy)."""
    from ftis_flwr.tasks.rewards import parse_strict_answer

    answer = parse_strict_answer(text)
    flags = re.I if ignore_case else 0
    return answer is not None and re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", prompt, flags) is not None


def describe(problems: list, texts: list[str], scores: list[float], prompts: list[str] | None = None,
             common: int = 3, ignore_case: bool = True) -> dict:
    """Accuracy, full-credit answers, answers copied from the prompt (``prompts``; the question
    alone without them; :func:`copied`'s ``ignore_case``), the distinct answers and the most
    common ones (stripped of surrounding space)."""
    prompts = prompts or [p.question for p in problems]
    counts = Counter(t.strip() for t in texts)
    return {"problems": len(texts), "accuracy": sum(scores) / len(scores) if scores else math.nan,
            "full_credit": sum(1 for s in scores if s >= 1.0),
            "copied": sum(copied(t, q, ignore_case) for q, t in zip(prompts, texts)), "distinct": len(counts),
            "most_common": counts.most_common(common),
            "answers": [{"id": p.id, "question": p.question, "gold": p.gold, "answer": t, "score": s}
                        for p, t, s in zip(problems, texts, scores)]}


def _short(text: str, width: int = 70) -> str:
    """One line of at most ``width`` characters: its start and its end (where a final answer
    stands) with "…" between."""
    one = " ".join(text.split())
    if len(one) > width:
        head = (width - 1) // 3
        one = one[:head] + "…" + one[len(one) - (width - 1 - head):]
    return json.dumps(one, ensure_ascii=False)


def report(rows: list[dict], node: str, split: str, d: dict, show: int, start: bool) -> list[str]:
    """Printed lines for one node and split; ``rows``: the run's metrics.jsonl, for the score it
    reported (not read with ``start``)."""
    what = "its starting model" if start else "final checkpoint"
    lines = [f"{node}, {split} ({what}, {d['problems']} problems, greedy): accuracy {100 * d['accuracy']:.2f}%"]
    if not start:
        was = reported(rows, node, split)
        if was is None:
            lines[-1] += " (the run reported no evaluation of this split)"
        else:
            rnd, acc = was
            same = abs(acc - d["accuracy"]) < 1e-9
            lines[-1] += f"; the run reported {100 * acc:.2f}% at round {rnd}" + \
                ("" if same else " - NOT the same: the checkpoint or this code differs from the run's")
    lines.append(f"  full credit (score 1): {d['full_credit']} of {d['problems']}; answer copied from the "
                 f"prompt: {d['copied']}; distinct answers: {d['distinct']}; most common: "
                 + ", ".join(f"{n}x {_short(t, 50)}" for t, n in d["most_common"]))
    for a in d["answers"][:max(show, 0)]:
        lines.append(f"  {a['id']}: {_short(a['question'], 60)} | gold {_short(a['gold'], 30)} | "
                     f"answer {_short(a['answer'])} | score {a['score']:.2f}")
    return lines


def answer_report(run_dir: Path, rows: list[dict], *, nodes: Sequence[str] = (), splits: Sequence[str] = (),
                  show: int = 5, start: bool = False, threads: int | None = None, json_path: Path | None = None,
                  say: Callable[[str], None] = print) -> dict:
    """Each chosen node's answers on each chosen split (all by default), said line by line with
    ``say``, beside what the run reported (``rows``: its metrics.jsonl records; not read with
    ``start``); the whole of it returned (and written to ``json_path``), every answer included.
    AnswersError naming what the folder, node or split lacks."""
    run_dir = Path(run_dir)
    missing = [n for n in ("config.json", "checkpoints") if not (run_dir / n).exists()]
    if missing:
        raise AnswersError(f"{run_dir} is not a finished run's folder: no {' and no '.join(missing)}")
    cfg = json.loads((run_dir / "config.json").read_text())
    cards = cfg["nodes"]
    names = [n["name"] for n in cards]
    unknown = [n for n in nodes if n not in names]
    if unknown:
        raise AnswersError(f"no node {', '.join(unknown)} in this run (its nodes: {', '.join(names)})")
    chosen = [n for n in cards if not nodes or n["name"] in nodes]
    no_ckpt = [n["name"] for n in chosen if not (run_dir / "checkpoints" / n["name"]).is_dir()]
    if no_ckpt:
        raise AnswersError(f"no checkpoint of {', '.join(no_ckpt)} under {run_dir / 'checkpoints'}")
    task = run_task(cfg)
    bad = [s for s in splits if s not in task.eval_splits]
    if bad:
        raise AnswersError(f"no held-out split {', '.join(bad)} in task {task.name} "
                           f"(its splits: {', '.join(task.eval_splits)})")
    everything: dict = {}
    for node in chosen:
        got = greedy_answers(run_dir, node, task, threads, start, list(splits) or None)
        for split, (problems, prompts, texts, scores, episodes) in got.items():
            d = describe(problems, texts, scores, prompts, ignore_case=not task.answer_case_matters)
            for a, episode in zip(d["answers"], episodes):
                if episode is not None:  # an environment's episode: the whole transcript, in the JSON
                    a["episode"] = episode
                    a["tool_calls"] = sum(1 for m in episode if m.get("role") == "tool")
            everything.setdefault(node["name"], {})[split] = d
            say("\n".join(report(rows, node["name"], split, d, show, start)))
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(everything, indent=1, ensure_ascii=False))
    return everything
