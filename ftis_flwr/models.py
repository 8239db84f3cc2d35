"""Model cards -> policies: tiny offline Qwen2 models (built and warm-started here) or real LLMs.

``source == "tiny"``: a ~0.5M/1.6M-parameter Qwen2 with a shared character-level tokenizer,
trained from scratch by a short supervised run on generated arithmetic (:func:`warm_start`),
cached on disk outside the repository (the Flower app bundle is capped at 10 MB). Otherwise the
source is a local directory, a ``.gguf`` file or a hub id, loaded with transformers.

Tokenizers are returned with a pad token and ``padding_side = "left"``, so batched
``generate`` continues every prompt right after its last token; training code builds its own
tensors and does not depend on the padding side.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import string
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tokenizers import Regex, Tokenizer, decoders, models as tok_models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config

from .config import ModelCard, default_cache_dir
from .tasks.arithmetic import ArithmeticTask, parse_ops

log = logging.getLogger(__name__)

WARMSTART_VERSION = "1"
"""Bump when warm-start code changes its result: old cache entries are then ignored."""
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
CHARS = string.digits + "+-=*" + " " + string.ascii_lowercase + ".,:;!?()'\"#_%$\n" + "<>/"
"""The character vocabulary, in id order after the special tokens. Append only: ids must never move."""
TINY_MAX_POSITIONS = 64
TINY_SIZES: dict[str, dict[str, int]] = {
    "small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=512),
    "large": dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=2, intermediate_size=768),
}
# Warm-start recipe (measured in benchmarks/warmstart.py): 3e-3 at batch 256 learned far slower.
WARMSTART_LR = 2e-3
WARMSTART_BETAS = (0.9, 0.98)
WARMSTART_BATCH = 128
WARMSTART_WARMUP = 20
WARMSTART_FLOOR = 0.1
WARMSTART_CHECK = 25
WARMSTART_CHECK_SIZE = 512
MARKER = "warmstart.json"
POLICY_INFO = "ftis_policy.json"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_GENERIC_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")


# ------------------------------------------------------------------------------ tokenizer

def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The shared character-level tokenizer: one token per character, ids fixed by :data:`CHARS`.

    Characters outside the vocabulary (e.g. upper case) become ``<unk>`` (id 2), never dropped.
    ``decode`` joins tokens without separators (``decoders.Fuse``), so text round-trips exactly.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    backend = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                  unk_token="<unk>", clean_up_tokenization_spaces=False,
                                  model_max_length=TINY_MAX_POSITIONS)
    tok.padding_side = "left"
    return tok


def load_tokenizer(path: str | Path, **kwargs: Any) -> Any:
    """A saved tokenizer; generic fast tokenizers (like the char one) bypass AutoTokenizer.

    transformers 5's AutoTokenizer swaps in Qwen2Tokenizer next to a qwen2 config and ignores a
    custom tokenizer.json (FACTS.md), which would silently drop characters.
    """
    cfg_file = Path(path) / "tokenizer_config.json"
    if cfg_file.is_file():
        cls = json.loads(cfg_file.read_text()).get("tokenizer_class")
        if cls in _GENERIC_TOKENIZERS:
            return PreTrainedTokenizerFast.from_pretrained(str(path), **kwargs)
    return AutoTokenizer.from_pretrained(str(path), **kwargs)


def tiny_config(size: str, vocab_size: int, pad_token_id: int, eos_token_id: int) -> Qwen2Config:
    """Qwen2 architecture at toy scale: small ~0.5M params, large ~1.6M (tied embeddings)."""
    if size not in TINY_SIZES:
        raise ValueError(f"tiny size {size!r} is not one of {', '.join(TINY_SIZES)}")
    return Qwen2Config(vocab_size=vocab_size, max_position_embeddings=TINY_MAX_POSITIONS,
                       tie_word_embeddings=True, pad_token_id=pad_token_id,
                       eos_token_id=eos_token_id, bos_token_id=None, use_cache=True,
                       **TINY_SIZES[size])


# ------------------------------------------------------------------------------ warm start

def _check_cache_root(root: Path) -> Path:
    root = root.expanduser().resolve()
    app_dir = Path(__file__).resolve().parent.parent
    if (app_dir / "pyproject.toml").is_file() and root.is_relative_to(app_dir):
        raise ValueError(f"cache dir {root} is inside the app directory {app_dir}: weights there "
                         "would be bundled into the Flower app (10 MB cap). Set FTIS_CACHE elsewhere.")
    return root


def warmstart_key(card: ModelCard, task: ArithmeticTask) -> dict[str, Any]:
    """Everything that determines a warm-started model (hashed into its cache directory)."""
    return {"version": WARMSTART_VERSION, "size": card.tiny_size,
            "ops": "".join(parse_ops(card.warmstart_ops)), "steps": int(card.warmstart_steps),
            "seed": int(card.seed), "task_seed": int(task.seed), "lr": WARMSTART_LR,
            "batch": WARMSTART_BATCH, "betas": list(WARMSTART_BETAS), "warmup": WARMSTART_WARMUP,
            "floor": WARMSTART_FLOOR, "target": warmstart_target(card), "check": WARMSTART_CHECK,
            "check_size": WARMSTART_CHECK_SIZE, "chars": CHARS, "special": list(SPECIAL_TOKENS)}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def warmstart_dir(card: ModelCard, task: ArithmeticTask, cache_dir: Path | None = None) -> Path:
    """Where :func:`warm_start` puts (or finds) this card's model."""
    key = warmstart_key(card, task)
    ops = {"+": "add", "-": "sub", "+-": "addsub"}[key["ops"]]
    name = f"{key['size']}-{ops}-{key['steps']}steps-seed{key['seed']}-{_digest(key)}"
    return _check_cache_root(Path(cache_dir) if cache_dir else default_cache_dir()) / "tiny" / name


def _encode_examples(tok: PreTrainedTokenizerFast, problems: list) -> tuple[torch.Tensor, ...]:
    """Right-padded ``question answer <eos>`` rows; labels only on answer tokens and EOS."""
    rows, labels = [], []
    for p in problems:
        q = tok(p.question, add_special_tokens=False)["input_ids"]
        a = tok(p.gold, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append(q + a)
        labels.append([-100] * len(q) + a)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels)):
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
    evaluate along the way; its time is not counted).
    """
    tok = build_char_tokenizer()
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
    report = {"key": warmstart_key(card, task), "steps_run": step, "target": target,
              "train_exact_match": acc, "reached_target": target is not None and acc >= target,
              "seconds": elapsed, "steps_per_second": step / elapsed if elapsed > 0 else 0.0,
              "params": sum(p.numel() for p in model.parameters()), "examples": len(problems),
              "losses": losses}
    return model, tok, report


def warm_start(card: ModelCard, task: ArithmeticTask, cache_dir: Path | None = None) -> Path:
    """Train (once) and cache the tiny model of ``card``; returns its directory.

    Concurrent callers with the same key serialise on a file lock and the second one finds the
    result; a crash leaves only a temporary directory, because the finished model is written
    elsewhere and renamed into place with its marker file inside.
    """
    if not isinstance(task, ArithmeticTask):
        raise ValueError(f"tiny models are warm-started on the arithmetic task, got {task!r}")
    final = warmstart_dir(card, task, cache_dir)
    if (final / MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / MARKER).is_file():
            return final
        log.info("warm-starting %s into %s", card.name, final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            model, tok, report = train_tiny(card, task)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            (tmp / MARKER).write_text(json.dumps(report, indent=1))
            log.info("warm-started %s: %d steps in %.1fs, check exact match %.3f%s", final.name,
                     report["steps_run"], report["seconds"], report["train_exact_match"],
                     "" if report["reached_target"] else " (target not reached)")
            if final.exists():  # a leftover without marker: never complete, safe to replace
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


# ------------------------------------------------------------------------------ policies

@dataclass
class Policy:
    """A node's model and tokenizer, ready to generate and train."""

    model: Any
    tokenizer: Any
    trainable_params: int
    total_params: int
    model_id: str
    base: str = ""
    """Where the base weights came from (warm-start dir, local dir or hub id): for save/reload."""


def _model_id(card: ModelCard, desc: str, base: str) -> str:
    """``name:source-description:hash`` over everything that makes this card's starting model."""
    ident = {"source": card.source, "base": base if card.source == "tiny" else "", "dtype": card.dtype,
             "lora": asdict(card.lora_config) if card.lora else None}
    return f"{card.name}:{desc}:{_digest(ident)[:10]}"


def _load_base(source: str, dtype: torch.dtype) -> tuple[Any, Any]:
    path = Path(source).expanduser()
    if source.endswith(".gguf"):  # de-quantised by transformers; see FACTS.md
        kwargs = {"gguf_file": path.name}
        return (AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=dtype, **kwargs),
                AutoTokenizer.from_pretrained(str(path.parent), **kwargs))
    if path.is_dir():
        return (AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype), load_tokenizer(path))
    if source.startswith(("/", ".", "~")):
        raise FileNotFoundError(f"model source {source!r} is not an existing directory")
    return AutoModelForCausalLM.from_pretrained(source, dtype=dtype), AutoTokenizer.from_pretrained(source)


def load_policy(card: ModelCard, *, task: Any = None, cache_dir: Path | None = None) -> Policy:
    """Build the policy of a model card (warm-starting tiny models on first use)."""
    if card.dtype not in _DTYPES:
        raise ValueError(f"dtype {card.dtype!r} is not one of {', '.join(_DTYPES)}")
    if card.source == "tiny":
        base = warm_start(card, task, cache_dir)
        desc = "tiny-" + base.name.rsplit("-", 1)[0]  # e.g. tiny-small-addsub-2500steps-seed0
    else:
        local = Path(card.source).expanduser()
        base, desc = (local if local.is_dir() else card.source), card.source
    model, tok = _load_base(str(base), _DTYPES[card.dtype])
    if tok.pad_token is None:  # hub causal LMs often have none; masks keep EOS as a real token
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.generation_config.pad_token_id = tok.pad_token_id
    model.to(card.device)
    if card.lora:
        from peft import LoraConfig, get_peft_model

        lc = card.lora_config
        model = get_peft_model(model, LoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
                                                 target_modules=list(lc.target_modules),
                                                 task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    if card.lora and trainable > total // 2:
        log.warning("node %s: LoRA r=%d trains %d of %d params; lower lora_config.r for this model",
                    card.name, card.lora_config.r, trainable, total)
    return Policy(model=model, tokenizer=tok, trainable_params=trainable, total_params=total,
                  model_id=_model_id(card, desc, Path(base).name), base=str(base))


_README = """Saved by ftis-flwr ({kind}); model id {model_id}.

{how}
The tokenizer is saved next to the weights. {tok_note}
"""


def save_policy(policy: Policy, out_dir: Path) -> Path:
    """Save weights (full) or the adapter (LoRA) plus tokenizer, a README.txt and ftis_policy.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    is_lora = hasattr(policy.model, "peft_config")
    policy.model.save_pretrained(out_dir)
    policy.tokenizer.save_pretrained(out_dir)
    char_tok = type(policy.tokenizer).__name__ in _GENERIC_TOKENIZERS
    if is_lora:
        how = ("LoRA adapter only. Load it on its base model:\n"
               "  from transformers import AutoModelForCausalLM\n  from peft import PeftModel\n"
               f"  base = AutoModelForCausalLM.from_pretrained({policy.base!r})\n"
               f"  model = PeftModel.from_pretrained(base, {str(out_dir)!r})")
    else:
        how = ("Full model:\n  from transformers import AutoModelForCausalLM\n"
               f"  model = AutoModelForCausalLM.from_pretrained({str(out_dir)!r})")
    tok_note = ("It is the character-level tokenizer: load it with\n"
                f"  PreTrainedTokenizerFast.from_pretrained({str(out_dir)!r})\n"
                "(AutoTokenizer would substitute Qwen2Tokenizer and drop characters)."
                if char_tok else "Load it with AutoTokenizer.from_pretrained(out_dir).")
    (out_dir / "README.txt").write_text(_README.format(kind="LoRA" if is_lora else "full",
                                                       model_id=policy.model_id, how=how,
                                                       tok_note=tok_note))
    info = {"kind": "lora" if is_lora else "full", "model_id": policy.model_id, "base": policy.base,
            "tokenizer": "char" if char_tok else "auto"}
    (out_dir / POLICY_INFO).write_text(json.dumps(info, indent=1))
    return out_dir
