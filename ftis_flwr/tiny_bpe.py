"""The offline byte-level BPE tokenizer of the tiny models (``ModelCard.tiny_tokenizer: bpe``).

Why: cross-tokenizer F-TIS needs peers whose tokenizers *differ*, and the default tiny models all
share the character-level one (:func:`ftis_flwr.tiny.build_char_tokenizer`). This is a GPT-2-style
byte-level BPE (the kind SmolLM2, Llama 3 and Qwen use) trained on the arithmetic task's own text,
so its tokens span several characters (``"37"``, ``"85"``, ``"105"``) and a tiny model built on it
splits every problem differently from a char-level peer. Training is deterministic; the result is
shipped as ``assets/tiny/bpe-tokenizer.json`` (a few KB, inside Flower's app bundle too), and the
SHA-256 of that file is part of a bpe model's warm-start key. Rebuild it with
``python -m ftis_flwr.tiny_bpe --ship`` (then re-ship the bpe models: their key changes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from .tasks.arithmetic import ArithmeticTask
from .tiny import SPECIAL_TOKENS, TINY_MAX_POSITIONS, TINY_TOKENIZERS, build_char_tokenizer, shipped_dirs

BPE_VOCAB_SIZE = 384
"""3 special tokens + the 256 bytes + 125 merges: every 2-digit number and the commonest 3-digit
answers become one token."""
BPE_TASK_SEED = 1234
"""The arithmetic task's default seed: the text the tokenizer is trained on (not the run's task)."""
ASSET_NAME = "bpe-tokenizer.json"


def training_texts(seed: int = BPE_TASK_SEED) -> list[str]:
    """``question + answer`` (``"37+48=85"``) of the warm-start problems and the task's train
    split, each text once, in order (the two are the same list for the default task)."""
    task = ArithmeticTask(seed=seed)
    problems = task.warmstart_problems("+-") + task.problems("train")
    return list(dict.fromkeys(p.question + p.gold for p in problems))


def train_bpe_tokenizer(vocab_size: int = BPE_VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE trained on :func:`training_texts`; specials ``<pad> <eos> <unk>`` = 0, 1, 2.

    Deterministic: the trainer's counts do not depend on thread order and it breaks ties by the
    pair's ids, so training twice gives the same ``tokenizer.json`` (tests check the asset).
    """
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(training_texts(), trainer=trainer)
    for i, tok in enumerate(SPECIAL_TOKENS):
        if backend.token_to_id(tok) != i:
            raise RuntimeError(f"BPE training put {tok} at id {backend.token_to_id(tok)}, not {i}")
    return backend


def to_json(backend: Tokenizer) -> str:
    """The text of the shipped asset: ``to_str`` (vocab in id order, merges in rank order),
    one entry a line."""
    return json.dumps(json.loads(backend.to_str()), indent=1, ensure_ascii=False) + "\n"


def bpe_asset_path() -> Path:
    """The shipped ``bpe-tokenizer.json`` (the package's own, else an installed copy's)."""
    for d in shipped_dirs():
        if (d / ASSET_NAME).is_file():
            return d / ASSET_NAME
    raise FileNotFoundError(f"{ASSET_NAME} is not shipped with this copy of ftis_flwr; rebuild it "
                            "with `python -m ftis_flwr.tiny_bpe --ship`")


@lru_cache(maxsize=8)
def _asset_bytes(path: str, mtime_ns: int) -> bytes:
    return Path(path).read_bytes()


def _asset() -> bytes:
    path = bpe_asset_path()
    return _asset_bytes(str(path), path.stat().st_mtime_ns)


def bpe_asset_id() -> str:
    """``bpe-<16 hex of the asset file's SHA-256>``: the tokenizer entry of a bpe warm-start key."""
    return "bpe-" + hashlib.sha256(_asset()).hexdigest()[:16]


def build_bpe_tokenizer() -> PreTrainedTokenizerFast:
    """The shipped BPE as a transformers tokenizer, with the char tokenizer's conventions:
    pad/eos/unk set, left padding, no clean-up of spaces, ``model_max_length`` 64."""
    backend = Tokenizer.from_str(_asset().decode("utf-8"))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                  unk_token="<unk>", clean_up_tokenization_spaces=False,
                                  model_max_length=TINY_MAX_POSITIONS)
    tok.padding_side = "left"
    return tok


def build_tiny_tokenizer(kind: str = "char") -> PreTrainedTokenizerFast:
    """The tokenizer of a tiny card (``ModelCard.tiny_tokenizer``): "char" or "bpe"."""
    if kind == "char":
        return build_char_tokenizer()
    if kind == "bpe":
        return build_bpe_tokenizer()
    raise ValueError(f"tiny_tokenizer={kind!r} is not one of {', '.join(TINY_TOKENIZERS)}")


def tokenizer_key(kind: str = "char") -> dict[str, str]:
    """A warm-start key's tokenizer entry: none for "char" (the shipped char models' keys stay
    as they were), ``{"tokenizer": "bpe-<asset hash>"}`` for "bpe"."""
    if kind == "char":
        return {}
    if kind == "bpe":
        return {"tokenizer": bpe_asset_id()}
    raise ValueError(f"tiny_tokenizer={kind!r} is not one of {', '.join(TINY_TOKENIZERS)}")


def ship(out: Path | None = None) -> Path:
    """Train the tokenizer and write it as the shipped asset; returns its path."""
    out = Path(out) if out else Path(__file__).resolve().parent / "assets" / "tiny" / ASSET_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_json(train_bpe_tokenizer()), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train the tiny models' byte-level BPE tokenizer.")
    parser.add_argument("--ship", action="store_true", help=f"write ftis_flwr/assets/tiny/{ASSET_NAME}")
    args = parser.parse_args(argv)
    if not args.ship:
        parser.error("nothing to do: pass --ship")
    path = ship()
    backend = Tokenizer.from_file(str(path))
    print(f"wrote {path} ({path.stat().st_size} bytes, vocab {backend.get_vocab_size()}, "
          f"{bpe_asset_id()})")


if __name__ == "__main__":
    main()
