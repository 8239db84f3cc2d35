"""Model cards -> policies: tiny offline Qwen2 models (:mod:`ftis_flwr.node.tiny.models`) or real LLMs.

``source == "tiny"``: a ~0.5M/1.6M-parameter Qwen2 with a character-level (or byte-level BPE,
or unigram) tokenizer, shipped with the package or warm-started here (:func:`ftis_flwr.node.tiny.models.warm_start`).
Otherwise the source is a local directory, a ``.gguf`` file or a hub id, loaded with transformers.

Tokenizers are returned with a pad token and ``padding_side = "left"``, so batched
``generate`` continues every prompt right after its last token; training code builds its own
tensors and does not depend on the padding side.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from ftis_flwr.config.dtypes import BF16_CPU_FLAGS, cpu_has_native_bf16, resolve_dtypes, warn_slow_bf16  # noqa: F401 (re-exported)
from ftis_flwr.config.schema import ModelCard, default_cache_dir
from ftis_flwr.node import sources
from ftis_flwr.node.tiny.models import MARKER as TINY_MARKER
from ftis_flwr.node.tiny.models import digest

log = logging.getLogger(__name__)

POLICY_INFO = "ftis_policy.json"
PROBE = "ftis_probe.json"
"""Logits of the saved model on a fixed input, computed in memory when it was saved: a reload
must give the same numbers (tests/test_real_model.py checks it)."""
PROBE_TEXT = "What is 2 plus 3?"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_GENERIC_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(path: str | Path, **kwargs: Any) -> Any:
    """A saved tokenizer; generic fast tokenizers (the tiny models' char and BPE ones) bypass
    AutoTokenizer.

    transformers 5's AutoTokenizer swaps in Qwen2Tokenizer next to a qwen2 config and ignores a
    custom tokenizer.json (FACTS.md), which would silently drop characters (char) or split text
    into other ids (the tiny BPE: Qwen2's rule splits numbers into single digits).
    """
    cfg_file = Path(path) / "tokenizer_config.json"
    if cfg_file.is_file():
        cls = json.loads(cfg_file.read_text()).get("tokenizer_class")
        if cls in _GENERIC_TOKENIZERS:
            return PreTrainedTokenizerFast.from_pretrained(str(path), **kwargs)
    return AutoTokenizer.from_pretrained(str(path), **kwargs)


# ------------------------------------------------------------------------------ policies

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")
"""Chat templates' end-of-turn markers: one that the template writes stops generation."""


def stop_token_ids(tokenizer: Any, model: Any, extra: list[str] | tuple[str, ...] = ()) -> list[int]:
    """Ids that end a completion: the tokenizer's EOS, the generation config's EOS ids, the
    end-of-turn token the chat template writes (a base model's config often lists only
    ``<|endoftext|>``, and a chat-formatted completion would run on past ``<|im_end|>``) and
    ``extra`` (ModelCard.stop_tokens, which must be single tokens)."""
    ids: list[int] = []

    def add(i: Any) -> None:
        for v in (i if isinstance(i, (list, tuple)) else [i]):
            if v is not None and int(v) not in ids:
                ids.append(int(v))

    add(getattr(tokenizer, "eos_token_id", None))
    add(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    template = getattr(tokenizer, "chat_template", None) or ""
    vocab = tokenizer.get_vocab()
    for tok in END_OF_TURN_TOKENS:
        if isinstance(template, str) and tok in template and tok in vocab:
            add(vocab[tok])
    for tok in extra:
        if tok not in vocab:
            raise ValueError(f"stop token {tok!r} is not a single token of this tokenizer")
        add(vocab[tok])
    return ids


def compute_context(card: ModelCard) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the context that generation and the learner's forward run in: autocast to
    ``card.compute_dtype`` when it differs from the weights' dtype, else nothing."""
    dtype = card.compute_dtype or card.dtype
    if dtype == card.dtype:
        return contextlib.nullcontext
    device_type = "cuda" if card.device.startswith("cuda") else "cpu"
    return lambda: torch.autocast(device_type=device_type, dtype=_DTYPES[dtype])


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
    dtype: str = "float32"
    """The weights' dtype as loaded ("auto" resolved)."""
    tokenizer_kind: str = ""
    """What the tokenizer is, for the saved model's metadata: one of :data:`TINY_TOKENIZER_NAMES`,
    else the source's own (its class and vocabulary size)."""


def _model_id(card: ModelCard, desc: str, base: str) -> str:
    """``name:source-description:hash`` over everything that makes this card's starting model."""
    ident = {"source": card.source, "base": base if card.source == "tiny" else "", "dtype": card.dtype,
             "lora": asdict(card.lora_config) if card.lora else None}
    return f"{card.name}:{desc}:{digest(ident)[:10]}"


def _load_base(source: str, dtype: torch.dtype, cache_dir: Path) -> tuple[Any, Any, str]:
    """(model, tokenizer, folder or hub id the weights were loaded from)."""
    source = sources.resolve(source, cache_dir)
    path = Path(source).expanduser()
    if source.endswith(".gguf"):  # converted once to a safetensors folder (sources.gguf_folder)
        path = sources.gguf_folder(path, cache_dir)
    if path.is_dir():
        return (AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype), load_tokenizer(path),
                str(path))
    if source.startswith(("/", ".", "~")):
        raise FileNotFoundError(f"model source {source!r} is not an existing directory")
    return (AutoModelForCausalLM.from_pretrained(source, dtype=dtype),
            AutoTokenizer.from_pretrained(source), source)


TINY_TOKENIZER_NAMES = {"char": "the tiny models' character-level tokenizer",
                        "bpe": "the tiny models' byte-level BPE tokenizer",
                        "unigram": "the tiny models' unigram (SentencePiece-style) tokenizer"}


def load_policy(card: ModelCard, *, task: Any = None, cache_dir: Path | None = None) -> Policy:
    """Build the policy of a model card (warm-starting tiny models on first use)."""
    card, note = resolve_dtypes(card)
    if note:
        log.info(note)
    if card.dtype not in _DTYPES:
        raise ValueError(f"dtype {card.dtype!r} is not one of {', '.join(_DTYPES)}")
    cache_dir = default_cache_dir(str(cache_dir or ""))
    slow = warn_slow_bf16(card)
    if slow:
        log.warning(slow)
    if card.source == "tiny":
        from ftis_flwr.node.tiny.tools import warm_started  # arithmetic, then the calculator stage if asked

        base = warm_started(card, task, cache_dir)
        desc = "tiny-" + base.name.rsplit("-", 1)[0]  # e.g. tiny-small-addsub-2500steps-seed0
    else:
        base, desc = card.source, card.source
    model, tok, base = _load_base(str(base), _DTYPES[card.dtype], cache_dir)
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
    kind = TINY_TOKENIZER_NAMES.get(card.tiny_tokenizer, card.tiny_tokenizer) if card.source == "tiny" else \
        f"{card.source}'s own ({type(tok).__name__}, {len(tok)} tokens)"
    return Policy(model=model, tokenizer=tok, trainable_params=trainable, total_params=total,
                  model_id=_model_id(card, desc, Path(base).name), base=str(base), dtype=card.dtype,
                  tokenizer_kind=kind)


_README = """Saved by ftis-flwr ({kind}); model id {model_id}.

{how}
The tokenizer is saved next to the weights. {tok_note}
"""


@torch.no_grad()
def probe_logits(model: Any, tokenizer: Any, text: str = PROBE_TEXT) -> dict[str, Any]:
    """The 256 largest float32 last-position logits of ``text`` (their ids and values) and the
    sum of all of them (eval mode, weights' own dtype)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].float().cpu()
    model.train(was_training)
    top = torch.topk(logits, min(256, logits.numel()))
    return {"text": text, "input_ids": ids, "top_ids": top.indices.tolist(),
            "top_logits": top.values.tolist(), "sum": float(logits.double().sum())}


_CACHE_BUILT = (sources.CONVERTED_MARKER, TINY_MARKER)
"""Markers of folders the model cache builds (``tiny.build_once``): replaced only by renaming a
new folder over the old one, never rewritten in place, so a checkpoint may hard-link their files."""


def _copy_base(src: Path, dst: Path) -> Path:
    """The base model's files (weights, configs, tokenizer), not any other folder inside it.

    A base the model cache built (a converted GGUF, a tiny model: see ``_CACHE_BUILT``) is
    hard-linked where ``src`` and ``dst`` share a filesystem: a converted Gemma base is 1.1 GB,
    written again by every LoRA checkpoint otherwise. Any other folder (a user's own model, which
    a later ``save_pretrained`` may overwrite in place) is copied, as is a base on another
    filesystem. A checkpoint's ``base/`` is not to be edited in place."""
    dst.mkdir(parents=True, exist_ok=True)
    link = any((src / marker).is_file() for marker in _CACHE_BUILT)
    for f in src.iterdir():
        if not f.is_file():
            continue
        target = dst / f.name
        target.unlink(missing_ok=True)
        if link:
            try:
                os.link(f, target)
                continue
            except OSError:  # another filesystem, or one without hard links
                pass
        shutil.copy2(f, target)
    return dst


def save_policy(policy: Policy, out_dir: Path) -> Path:
    """Save weights (full) or the adapter (LoRA) plus tokenizer, a README.txt and ftis_policy.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    is_lora = hasattr(policy.model, "peft_config")
    policy.model.save_pretrained(out_dir)
    policy.tokenizer.save_pretrained(out_dir)
    base = policy.base
    if is_lora and Path(base).is_dir():  # a local base (warm-started, converted): a copy travels
        base = str(_copy_base(Path(base), out_dir / "base"))  # with the adapter, so the folder
        config_path = out_dir / "adapter_config.json"     # loads on its own, cache or not
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base
        config_path.write_text(json.dumps(config, indent=2))
    char_tok = type(policy.tokenizer).__name__ in _GENERIC_TOKENIZERS
    if is_lora:
        how = ("LoRA adapter only. Load it on its base model:\n"
               "  from transformers import AutoModelForCausalLM\n  from peft import PeftModel\n"
               f"  base = AutoModelForCausalLM.from_pretrained({base!r})\n"
               f"  model = PeftModel.from_pretrained(base, {str(out_dir)!r})")
    else:
        how = ("Full model:\n  from transformers import AutoModelForCausalLM\n"
               f"  model = AutoModelForCausalLM.from_pretrained({str(out_dir)!r})")
    kind = policy.tokenizer_kind or type(policy.tokenizer).__name__
    tok_note = (f"It is {kind}, saved as its exact tokenizer.json: load it with\n"
                f"  PreTrainedTokenizerFast.from_pretrained({str(out_dir)!r})\n"
                "(AutoTokenizer may substitute the architecture's own tokenizer class, with other ids)."
                if char_tok else f"It is {kind}: load it with AutoTokenizer.from_pretrained({str(out_dir)!r}).")
    (out_dir / "README.txt").write_text(_README.format(kind="LoRA" if is_lora else "full",
                                                       model_id=policy.model_id, how=how,
                                                       tok_note=tok_note))
    (out_dir / PROBE).write_text(json.dumps(probe_logits(policy.model, policy.tokenizer)))
    info = {"kind": "lora" if is_lora else "full", "model_id": policy.model_id, "base": base, "dtype": policy.dtype,
            "tokenizer": {"kind": kind, "class": type(policy.tokenizer).__name__, "size": len(policy.tokenizer),
                          "load_with": "PreTrainedTokenizerFast" if char_tok else "AutoTokenizer"}}
    (out_dir / POLICY_INFO).write_text(json.dumps(info, indent=1))
    return out_dir
