"""The offline tiny models: a character tokenizer, toy Qwen2 configs and their warm-start.

A ``source: tiny`` model card names a ~0.5M (``small``) or ~1.6M (``large``) parameter Qwen2 on
one character-level tokenizer (or the byte-level BPE of :mod:`ftis_flwr.node.tiny.bpe`), trained from
scratch by a short supervised run on generated arithmetic (:func:`train_tiny`) up to a target
accuracy, its weights rounded to bfloat16 values, and cached under ``<cache>/tiny/<name>`` outside
the repository (the Flower app bundle is capped at 10 MB).

**Shipped warm-starts.** Warm-starting takes 1-6 minutes per model on a 2-core CPU, and its
result differs between CPU models. The default preset's models are therefore shipped with the
package (``ftis_flwr/assets/tiny/<name>.safetensors``, bfloat16, 1-3 MB each, with a manifest
holding their SHA-256): :func:`warm_start` copies a shipped model into the cache when its
warm-start key matches exactly and its hash verifies, and trains otherwise. Rebuild them with
``python -m ftis_flwr.node.tiny.assets --ship`` (:mod:`ftis_flwr.node.tiny.assets`). ``.safetensors`` files are outside
Flower's app bundle (FAB) patterns, so they never count against its 10 MB cap.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from ftis_flwr.config.choices import TINY_TOKENIZERS  # noqa: F401 (implemented here)
from ftis_flwr.config.schema import ModelCard, default_cache_dir
from ftis_flwr.config.tiny_models import (  # noqa: F401 (TINY_MAX_POSITIONS, TINY_SIZES: the node's names)
    TINY_CHARS,
    TINY_MAX_POSITIONS,
    TINY_SIZES,
    TINY_SPECIAL_TOKENS,
    char_tokenizer_backend,
)
from ftis_flwr.node.tiny.chars import as_tiny_tokenizer, build_char_tokenizer  # noqa: F401 (the node's names)
from ftis_flwr.node.tiny.shipped import find_shipped, sha256_file, shipped_dirs  # noqa: F401 (the node's names)
from ftis_flwr.tasks.arithmetic import ArithmeticTask, op_weights, parse_ops

log = logging.getLogger(__name__)

WARMSTART_VERSION = "2"
"""Bump when warm-start code changes its result: old cache entries are then ignored."""
SPECIAL_TOKENS = TINY_SPECIAL_TOKENS
CHARS = TINY_CHARS
"""The character vocabulary, in id order after the special tokens (:mod:`ftis_flwr.config.tiny_models`)."""
# Warm-start recipe (measured in benchmarks/warmstart.py): 3e-3 at batch 256 learned far slower.
WARMSTART_LR = 2e-3
WARMSTART_BETAS = (0.9, 0.98)
WARMSTART_BATCH = 128
WARMSTART_WARMUP = 20
WARMSTART_FLOOR = 0.1
WARMSTART_CHECK = 25
WARMSTART_CHECK_SIZE = 512
MARKER = "warmstart.json"


# ------------------------------------------------------------------------------ tokenizer

def tiny_config(size: str, vocab_size: int, pad_token_id: int, eos_token_id: int) -> Qwen2Config:
    """Qwen2 architecture at toy scale: small ~0.5M params, large ~1.6M (tied embeddings)."""
    if size not in TINY_SIZES:
        raise ValueError(f"tiny size {size!r} is not one of {', '.join(TINY_SIZES)}")
    return Qwen2Config(vocab_size=vocab_size, max_position_embeddings=TINY_MAX_POSITIONS,
                       tie_word_embeddings=True, pad_token_id=pad_token_id,
                       eos_token_id=eos_token_id, bos_token_id=None, use_cache=True,
                       **TINY_SIZES[size])


# ------------------------------------------------------------------------------ warm start

def check_cache_root(root: Path) -> Path:
    """``root`` resolved; ValueError if it lies in the app directory (weights would be bundled)."""
    root = root.expanduser().resolve()
    app_dir = Path(__file__).resolve().parents[3]
    if (app_dir / "pyproject.toml").is_file() and root.is_relative_to(app_dir):
        raise ValueError(f"cache dir {root} is inside the app directory {app_dir}: weights there "
                         "would be bundled into the Flower app (10 MB cap). Set FTIS_CACHE elsewhere.")
    return root


def warmstart_key(card: ModelCard, task: ArithmeticTask) -> dict[str, Any]:
    """Everything that determines a warm-started model (hashed into its cache directory)."""
    weights = op_weights(card.warmstart_ops)  # a plain mix keeps its old key (shipped models)
    ops = "".join(parse_ops(card.warmstart_ops)) if weights is None else \
        "".join(f"{op}{w}" for op, w in weights.items())
    from ftis_flwr.node.tiny.bpe import tokenizer_key  # char cards: no entry, their (shipped) keys unchanged
    return {**tokenizer_key(card.tiny_tokenizer), "version": WARMSTART_VERSION, "size": card.tiny_size,
            "ops": ops, "steps": int(card.warmstart_steps),
            "seed": int(card.seed), "task_seed": int(task.seed), "lr": WARMSTART_LR,
            "batch": WARMSTART_BATCH, "betas": list(WARMSTART_BETAS), "warmup": WARMSTART_WARMUP,
            "floor": WARMSTART_FLOOR, "target": warmstart_target(card), "check": WARMSTART_CHECK,
            "check_size": WARMSTART_CHECK_SIZE, "chars": CHARS, "special": list(SPECIAL_TOKENS)}


def digest(obj: Any) -> str:
    """16 hex characters of the SHA-256 of ``obj`` as sorted JSON (cache keys, model ids)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def warmstart_dir(card: ModelCard, task: ArithmeticTask, cache_dir: Path | None = None) -> Path:
    """Where :func:`warm_start` puts (or finds) this card's model."""
    key = warmstart_key(card, task)
    ops = {"+": "add", "-": "sub", "+-": "addsub"}.get(key["ops"]) or \
        key["ops"].replace("+", "add").replace("-", "sub")  # weighted: "+3-1" -> "add3sub1"
    tok = key["tokenizer"].split("-")[0] + "-" if "tokenizer" in key else ""  # "bpe-"
    name = f"{key['size']}-{tok}{ops}-{key['steps']}steps-seed{key['seed']}-{digest(key)}"
    return check_cache_root(Path(cache_dir) if cache_dir else default_cache_dir()) / "tiny" / name


def _encode_examples(tok: PreTrainedTokenizerFast, problems: list) -> tuple[torch.Tensor, ...]:
    """Right-padded ``question answer <eos>`` rows; labels only on answer tokens and EOS."""
    rows = []
    for p in problems:
        q = tok(p.question, add_special_tokens=False)["input_ids"]
        a = tok(p.gold, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((q + a, [-100] * len(q) + a))
    return pad_rows(rows, tok.pad_token_id)


def pad_rows(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """(ids, attention mask, labels) of ``(ids, labels)`` rows, right-padded to the longest (a
    supervised batch of the warm starts; labels -100 where nothing is trained)."""
    width = max(len(r) for r, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lb) in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        lab[i, :len(r)] = torch.tensor(lb)
        mask[i, :len(r)] = 1
    return ids, mask, lab


def _lr_factor(step: int, steps: int) -> float:
    """Linear warm-up, then cosine decay to WARMSTART_FLOOR x peak at the last step."""
    warm = min(1.0, (step + 1) / WARMSTART_WARMUP)
    frac = min(1.0, step / max(1, steps))
    return warm * (WARMSTART_FLOOR + (1 - WARMSTART_FLOOR) * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def exact_match(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> float:
    """Teacher-forced argmax exact match over answer+EOS: equals greedy-decoding exact match
    (greedy emits ``answer<eos>`` iff every one of those argmaxes is right) at one forward pass."""
    was_training = model.training
    model.eval()
    logits = model(input_ids=ids, attention_mask=mask).logits
    model.train(was_training)
    gold = labels[:, 1:]
    ok = (logits[:, :-1].argmax(-1) == gold) | (gold == -100)
    return ok.all(-1).float().mean().item()


def warmstart_target(card: ModelCard) -> float | None:
    """Stop accuracy of a card (``ModelCard.warmstart_target``); None = run every step."""
    target = card.warmstart_target
    return None if target is None or target <= 0 else float(target)


def train_tiny(card: ModelCard, task: ArithmeticTask, log_every: int | None = None,
               callback: Callable[[int, Any], None] | None = None
               ) -> tuple[Any, PreTrainedTokenizerFast, dict[str, Any]]:
    """Supervised training from scratch (no caching): returns model, tokenizer and a report.

    Trains for at most ``card.warmstart_steps`` steps and stops early once the exact match on a
    fixed slice of the warm-start data reaches :func:`warmstart_target` (checked every
    ``WARMSTART_CHECK`` steps): when the carry "clicks" varies a lot between seeds, and a fixed
    step count gave 35%..93% test accuracy for seeds 0..2, while a target gives every seed about
    the same starting skill. ``callback(step, model)`` runs after every step (benchmarks
    evaluate along the way; its time is not counted). The returned weights are rounded to
    bfloat16 values (:func:`round_to_bf16`), as cached and shipped models are.
    """
    from ftis_flwr.node.tiny.bpe import build_tiny_tokenizer
    tok = build_tiny_tokenizer(card.tiny_tokenizer)
    problems = task.warmstart_problems(card.warmstart_ops)
    ids, mask, labels = _encode_examples(tok, problems)
    steps = int(card.warmstart_steps)
    if steps < 0:
        raise ValueError(f"warmstart_steps={steps} must be >= 0")
    target = warmstart_target(card)
    check = slice(0, WARMSTART_CHECK_SIZE)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(card.torch_threads)
    try:
        torch.manual_seed(card.seed)
        config = tiny_config(card.tiny_size, len(tok), tok.pad_token_id, tok.eos_token_id)
        model = AutoModelForCausalLM.from_config(config)
        model.generation_config.pad_token_id = tok.pad_token_id
        model.generation_config.eos_token_id = tok.eos_token_id
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=WARMSTART_LR, betas=WARMSTART_BETAS)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps))
        gen = torch.Generator().manual_seed(card.seed)
        order, pos = torch.randperm(len(ids), generator=gen), 0
        losses: list[float] = []
        every = log_every or max(WARMSTART_CHECK, steps // 10)
        acc, step = 0.0, 0
        t0 = time.perf_counter()
        while step < steps:
            step += 1
            if pos + WARMSTART_BATCH > len(order):
                order, pos = torch.randperm(len(ids), generator=gen), 0
            idx = order[pos:pos + WARMSTART_BATCH]
            pos += WARMSTART_BATCH
            out = model(input_ids=ids[idx], attention_mask=mask[idx], labels=labels[idx])
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(out.loss.item())
            if callback is not None:
                t_cb = time.perf_counter()
                callback(step, model)
                model.train()
                t0 += time.perf_counter() - t_cb
            if step % WARMSTART_CHECK == 0 or step == steps:
                acc = exact_match(model, ids[check], mask[check], labels[check])
            done = target is not None and acc >= target
            if step % every == 0 or step == steps or done:
                log.info("warm-start %s/%s step %d/%d loss %.4f train-exact %.3f (%.1fs)",
                         card.tiny_size, card.warmstart_ops, step, steps, losses[-1], acc,
                         time.perf_counter() - t0)
            if done:
                break
        elapsed = time.perf_counter() - t0
    finally:
        torch.set_num_threads(prev_threads)
    model.eval()
    round_to_bf16(model)
    report = {"key": warmstart_key(card, task), "steps_run": step, "target": target,
              "train_exact_match": acc, "reached_target": target is not None and acc >= target,
              "train_exact_match_bf16": exact_match(model, ids[check], mask[check], labels[check]),
              "seconds": elapsed, "steps_per_second": step / elapsed if elapsed > 0 else 0.0,
              "params": sum(p.numel() for p in model.parameters()), "examples": len(problems),
              "losses": losses}
    return model, tok, report


def round_to_bf16(model: Any) -> None:
    """Round every weight to the nearest bfloat16 value (kept as float32), in place.

    Warm-started weights are stored this way whether trained here or shipped, so a rebuilt model
    and the shipped one are the same kind of object (and a shipped file is half the size).
    """
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))


def _install_shipped(card: ModelCard, weights: Path, manifest: dict[str, Any], out: Path) -> None:
    """Verify a shipped warm-start's hash and key, then write it as a full model folder."""
    from safetensors.torch import load_file

    from ftis_flwr.node.tiny.bpe import build_tiny_tokenizer
    digest = sha256_file(weights)
    if digest != manifest.get("sha256"):
        raise ValueError(f"shipped warm-start {weights} has SHA-256 {digest}, its manifest says "
                         f"{manifest.get('sha256')}: the file is damaged; reinstall the package or "
                         f"delete it to train the model here")
    tok = build_tiny_tokenizer(card.tiny_tokenizer)
    config = tiny_config(card.tiny_size, len(tok), tok.pad_token_id, tok.eos_token_id)
    model = AutoModelForCausalLM.from_config(config)
    state = {k: v.to(torch.float32) for k, v in load_file(str(weights)).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"}  # tied to the input embedding, not stored
    if set(missing) - tied or unexpected:
        raise ValueError(f"shipped warm-start {weights} does not fit a {card.tiny_size} tiny model "
                         f"(missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)})")
    model.tie_weights()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    report = dict(manifest.get("report", {}), shipped=str(weights), sha256=digest)
    (out / MARKER).write_text(json.dumps(report, indent=1))


def build_once(final: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """``final``, built by ``build(tmp_dir)`` unless ``final/marker`` exists already.

    Concurrent callers serialise on a file lock and the second one finds the result; a crash
    leaves only a temporary folder, because ``build`` writes elsewhere (it must write ``marker``
    last) and the folder is renamed into place when complete.
    """
    if (final / marker).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / marker).is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            build(tmp)
            if final.exists():  # a leftover without marker: never complete, safe to replace
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def warm_start(card: ModelCard, task: ArithmeticTask, cache_dir: Path | None = None) -> Path:
    """The cached tiny model of ``card``: shipped, or trained here once; returns its folder."""
    if not isinstance(task, ArithmeticTask):
        raise ValueError(f"tiny models are warm-started on the arithmetic task, got {task!r}")
    final = warmstart_dir(card, task, cache_dir)

    def done(report: dict[str, Any]) -> str:
        return (f"{report['steps_run']} steps in {report['seconds']:.1f}s, check exact match "
                f"{report['train_exact_match']:.3f}" + ("" if report["reached_target"] else " (target not reached)"))

    return shipped_or_trained(card, final, "warm-start", lambda: train_tiny(card, task), done)


def shipped_or_trained(card: ModelCard, final: Path, what: str, train: Callable[[], tuple[Any, Any, dict]],
                       done: Callable[[dict[str, Any]], str]) -> Path:
    """``final``: the shipped model of its name installed, else ``train()``'s (model, tokenizer,
    report) saved there with its report; built once (:func:`build_once`). ``what`` and ``done(report)``
    name the stage in the log."""
    def build(tmp: Path) -> None:
        shipped = find_shipped(final.name)
        if shipped is not None:
            log.info("%s: using the shipped %s %s", card.name, what, shipped[0])
            _install_shipped(card, *shipped, tmp)
            return
        log.info("%s of %s into %s (no shipped model for this key: trained once, then cached)", what, card.name,
                 final)
        model, tok, report = train()
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(report, indent=1))
        log.info("%s %s: %s", what, final.name, done(report))

    return build_once(final, MARKER, build)
