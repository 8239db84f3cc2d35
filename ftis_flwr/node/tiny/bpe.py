"""The offline tokenizers of the tiny models besides the char one (``ModelCard.tiny_tokenizer``):
a byte-level BPE ("bpe") and a SentencePiece-style unigram ("unigram").

Why: cross-tokenizer F-TIS needs peers whose tokenizers *differ*, and the default tiny models all
share the character-level one (:func:`ftis_flwr.node.tiny.models.build_char_tokenizer`). The BPE is GPT-2
style (the kind SmolLM2, Llama 3 and Qwen use) trained on the arithmetic task's own text, so its
tokens span several characters (``"37"``, ``"85"``, ``"105"``) and a tiny model built on it splits
every problem differently from a char-level peer. The unigram is the other family (T5, ALBERT,
XLNet, Llama 2's SentencePiece): a unigram language model over pieces, ``"▁"`` marking a space and
no byte fallback, trained on the same problems; it splits them a third way (``"97+"``, ``"79"``,
``"="``). Training is deterministic; each result is shipped as ``assets/tiny/<kind>-tokenizer.json``
(a few KB, inside Flower's app bundle too), and the SHA-256 of that file is part of the model's
warm-start key. Rebuild them with ``python -m ftis_flwr.node.tiny.bpe --ship`` (then re-ship the bpe
models: their key changes; no unigram model is shipped).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ftis_flwr.config.choices import TINY_TOKENIZERS, TinyTokenizer
from ftis_flwr.config.tiny_models import TINY_CHARS as CHARS
from ftis_flwr.config.tiny_models import TINY_SPECIAL_TOKENS as SPECIAL_TOKENS
from ftis_flwr.node.tiny.chars import as_tiny_tokenizer, build_char_tokenizer
from ftis_flwr.node.tiny.shipped import shipped_dirs
from ftis_flwr.tasks.arithmetic import ArithmeticTask

BPE_VOCAB_SIZE = 384
"""3 special tokens + the 256 bytes + 125 merges: every 2-digit number and the commonest 3-digit
answers become one token."""
BPE_TASK_SEED = 1234
"""The arithmetic task's default seed: the text the tokenizer is trained on (not the run's task)."""
ASSET_NAME = "bpe-tokenizer.json"
UNIGRAM_VOCAB_SIZE = 240
"""Pieces the unigram trainer keeps: 3 special tokens, the task's 13 characters and 224 pieces of
2-3 characters (``"97+"``, ``"66"``, ``"18"``); the char tokenizer's other characters come on top
(286 in all). Longer pieces (up to 4-6) gave worse splits (``"99-9"``, ``"7"``, ``"="``)."""
UNIGRAM_MAX_PIECE = 3
UNIGRAM_ASSET_NAME = "unigram-tokenizer.json"
ASSETS = {"bpe": ASSET_NAME, "unigram": UNIGRAM_ASSET_NAME}
"""The shipped tokenizer of each ``tiny_tokenizer`` but "char" (which is built in code)."""


def _problems(seed: int) -> list:
    """The warm-start problems and the task's train split (the same list for the default task):
    what both tokenizers are trained on."""
    task = ArithmeticTask(seed=seed)
    return task.warmstart_problems("+-") + task.problems("train")


def training_texts(seed: int = BPE_TASK_SEED) -> list[str]:
    """``question + answer`` (``"37+48=85"``) of :func:`_problems`, each text once, in order."""
    return list(dict.fromkeys(p.question + p.gold for p in _problems(seed)))


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


def unigram_training_texts(seed: int = BPE_TASK_SEED) -> list[str]:
    """The problems of :func:`training_texts`, question and answer apart (``"37+48="``, ``"85"``):
    the texts a tiny model encodes. Metaspace splits only at spaces, so on the joined text the
    unigram learns pieces across the prompt's end (``"+93=1"``) that never occur in use."""
    return [t for pair in dict.fromkeys((p.question, p.gold) for p in _problems(seed)) for t in pair]


def train_unigram_tokenizer(vocab_size: int = UNIGRAM_VOCAB_SIZE) -> Tokenizer:
    """A unigram LM tokenizer (Metaspace, no byte fallback) trained on :func:`unigram_training_texts`,
    plus the char tokenizer's characters (:data:`ftis_flwr.node.tiny.models.CHARS`, ``"▁"`` for the space);
    specials ``<pad> <eos> <unk>`` = 0, 1, 2. ``prepend_scheme="never"``: no ``"▁"`` is put before
    a text, so ``"85"`` is the same tokens after a prompt as alone and decodes to itself.

    Deterministic: the trainer sums in hash-map order (scores vary in the 15th digit) and scores
    the characters its pruning dropped and it adds back (here ``"+"``) in random order, so its
    pieces are rebuilt into a fixed form: scores rounded to 6 decimals, sorted by score then text;
    characters scored below every learnt multi-character piece, and those of CHARS training never
    saw, come last in :data:`~ftis_flwr.node.tiny.models.CHARS` order, one below that lowest piece.
    """
    trained = Tokenizer(models.Unigram())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                      unk_token="<unk>", max_piece_length=UNIGRAM_MAX_PIECE,
                                      show_progress=False)
    trained.train_from_iterator(unigram_training_texts(), trainer=trainer)
    learnt = {p: round(s, 6) for p, s in json.loads(trained.to_str())["model"]["vocab"]
              if p not in SPECIAL_TOKENS}
    low = min(s for p, s in learnt.items() if len(p) > 1)
    pieces = sorted(((p, s) for p, s in learnt.items() if s >= low), key=lambda kv: (-kv[1], kv[0]))
    kept = {p for p, _ in pieces}
    pieces += [(c, round(low - 1.0, 6)) for c in dict.fromkeys(ch.replace(" ", "▁") for ch in CHARS)
               if c not in kept]
    backend = Tokenizer(models.Unigram([(t, 0.0) for t in SPECIAL_TOKENS] + pieces, unk_id=2,
                                       byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    backend.decoder = decoders.Metaspace(prepend_scheme="never")
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return backend


def to_json(backend: Tokenizer) -> str:
    """The text of a shipped asset: ``to_str`` (vocab in id order, BPE merges in rank order),
    one entry a line."""
    return json.dumps(json.loads(backend.to_str()), indent=1, ensure_ascii=False) + "\n"


def asset_path(kind: str = "bpe") -> Path:
    """The shipped ``<kind>-tokenizer.json`` (the package's own, else an installed copy's)."""
    for d in shipped_dirs():
        if (d / ASSETS[kind]).is_file():
            return d / ASSETS[kind]
    raise FileNotFoundError(f"{ASSETS[kind]} is not shipped with this copy of ftis_flwr; rebuild it "
                            "with `python -m ftis_flwr.node.tiny.bpe --ship`")


def bpe_asset_path() -> Path:
    return asset_path("bpe")


@lru_cache(maxsize=8)
def _asset_bytes(path: str, mtime_ns: int) -> bytes:
    return Path(path).read_bytes()


def _asset(kind: str = "bpe") -> bytes:
    path = asset_path(kind)
    return _asset_bytes(str(path), path.stat().st_mtime_ns)


def asset_id(kind: str = "bpe") -> str:
    """``<kind>-<16 hex of the asset file's SHA-256>``: the tokenizer entry of a warm-start key."""
    return f"{kind}-" + hashlib.sha256(_asset(kind)).hexdigest()[:16]


def bpe_asset_id() -> str:
    return asset_id("bpe")


def build_shipped_tokenizer(kind: str = "bpe") -> PreTrainedTokenizerFast:
    """A shipped tokenizer as a transformers one, with the char tokenizer's conventions
    (:func:`ftis_flwr.node.tiny.models.as_tiny_tokenizer`)."""
    return as_tiny_tokenizer(Tokenizer.from_str(_asset(kind).decode("utf-8")))


def build_bpe_tokenizer() -> PreTrainedTokenizerFast:
    return build_shipped_tokenizer("bpe")


def build_tiny_tokenizer(kind: str = "char") -> PreTrainedTokenizerFast:
    """The tokenizer of a tiny card (``ModelCard.tiny_tokenizer``): "char", "bpe" or "unigram"."""
    if kind == TinyTokenizer.CHAR:
        return build_char_tokenizer()
    if kind in ASSETS:
        return build_shipped_tokenizer(kind)
    raise ValueError(f"tiny_tokenizer={kind!r} is not one of {', '.join(TINY_TOKENIZERS)}")


def tokenizer_key(kind: str = "char") -> dict[str, str]:
    """A warm-start key's tokenizer entry: none for "char" (the shipped char models' keys stay
    as they were), ``{"tokenizer": "<kind>-<asset hash>"}`` for "bpe" and "unigram"."""
    if kind == TinyTokenizer.CHAR:
        return {}
    if kind in ASSETS:
        return {"tokenizer": asset_id(kind)}
    raise ValueError(f"tiny_tokenizer={kind!r} is not one of {', '.join(TINY_TOKENIZERS)}")


def ship(out_dir: Path | None = None) -> list[Path]:
    """Train the tokenizers and write them as the shipped assets; returns their paths."""
    out_dir = Path(out_dir) if out_dir else Path(__file__).resolve().parents[2] / "assets" / "tiny"
    out_dir.mkdir(parents=True, exist_ok=True)
    train = {"bpe": train_bpe_tokenizer, "unigram": train_unigram_tokenizer}
    written = []
    for kind, name in ASSETS.items():
        (out_dir / name).write_text(to_json(train[kind]()), encoding="utf-8")
        written.append(out_dir / name)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train the tiny models' BPE and unigram tokenizers.")
    parser.add_argument("--ship", action="store_true",
                        help=f"write ftis_flwr/assets/tiny/{{{','.join(ASSETS.values())}}}")
    args = parser.parse_args(argv)
    if not args.ship:
        parser.error("nothing to do: pass --ship")
    for kind, path in zip(ASSETS, ship()):
        backend = Tokenizer.from_file(str(path))
        print(f"wrote {path} ({path.stat().st_size} bytes, vocab {backend.get_vocab_size()}, "
              f"{asset_id(kind)})")


if __name__ == "__main__":
    main()
