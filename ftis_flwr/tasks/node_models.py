"""What a check knows of each node's model without loading it: its positions and its tokenizer,
from this machine only (:mod:`ftis_flwr.tasks.prompt_fit` measures the prompts against them).

- A tiny card's tokenizer is built from :mod:`ftis_flwr.config.tiny_models` (char) or the shipped
  file (bpe, unigram) with ``tokenizers`` alone: milliseconds, no transformers, the node's ids
  (tests/test_prompt_fit.py); 64 positions.
- Another card's files are found where the node finds them: a local folder, the converted folder
  of a named source (``smollm2``) or GGUF file in the cache (``<cache>/gguf/<stem>-<hash>``), the
  hub's local cache. Its positions are its ``config.json``'s (a vLLM card's
  ``vllm_max_model_len`` when smaller), and its ``tokenizer.json``'s head says whether it has a
  token for every byte (a byte-level BPE, or byte fallback, and no lowercasing or accent-stripping
  normaliser): then no character can be lost, and a prompt whose UTF-8 bytes fit the positions
  fits (a token stands for at least one byte). Only a model where that bound does not settle it is
  loaded, with transformers as the node loads it (:meth:`NodeModel.tokenizer`). Nothing is
  downloaded: a model whose files are not here is named in a warning, never an error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftis_flwr.config.choices import Engine
from ftis_flwr.config.choices import TinyTokenizer as TinyKind
from ftis_flwr.config.named_sources import NAMED_SOURCES, SMOLLM2_FILE
from ftis_flwr.config.schema import ExperimentConfig, ModelCard, default_cache_dir
from ftis_flwr.config.tiny_models import (
    TINY_MAX_POSITIONS,
    TINY_SPECIAL_TOKENS,
    TINY_TOKENIZER_ASSETS,
    char_tokenizer_backend,
)

NAMED_STEMS = {"smollm2": Path(SMOLLM2_FILE).stem, "gemma3-270m": "gemma-3-270m-q4_k_m"}
"""A named source -> the stem of its GGUF file: its converted folder is ``<cache>/gguf/<stem>-<hash>``."""
HEAD_BYTES = 4 << 20
"""How much of a ``tokenizer.json`` is read for its kind: everything before the vocabulary."""
_BYTES = re.compile(r'"type"\s*:\s*"(ByteLevel|ByteFallback)"|"byte_fallback"\s*:\s*true')
_LOSSY = re.compile(r'"type"\s*:\s*"(Lowercase|StripAccents|Strip)"')


class TinyTokenizer:
    """A tiny card's tokenizer with the surface a task renders prompts with (``__call__``,
    ``decode``, ``chat_template``), on ``tokenizers`` alone."""

    chat_template = None
    model_max_length = TINY_MAX_POSITIONS

    def __init__(self, backend: Any, kind: str) -> None:
        self.backend, self.kind = backend, kind
        self.pad_token, self.eos_token, self.unk_token = TINY_SPECIAL_TOKENS
        self.pad_token_id, self.eos_token_id, self.unk_token_id = (backend.token_to_id(t) for t in TINY_SPECIAL_TOKENS)

    def __call__(self, text: str, add_special_tokens: bool = True, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": self.backend.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False, **_: Any) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return self.backend.encode(text, add_special_tokens=False).offsets

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)


def tiny_tokenizer(kind: str) -> TinyTokenizer:
    """The tokenizer of a tiny card with ``tiny_tokenizer=kind`` (as ``node.tiny_bpe`` builds it)."""
    from tokenizers import Tokenizer

    if kind in TINY_TOKENIZER_ASSETS:
        backend = Tokenizer.from_file(str(Path(__file__).resolve().parents[1] / "assets" / "tiny" /
                                          TINY_TOKENIZER_ASSETS[kind]))
    else:
        backend = char_tokenizer_backend()
    backend.add_special_tokens(list(TINY_SPECIAL_TOKENS))  # as transformers does: "<eos>" in a text is the token
    return TinyTokenizer(backend, kind)


@dataclass
class NodeModel:
    """One model of the federation as a check sees it, with the nodes that use it."""

    nodes: list[str]
    what: str
    positions: int
    tiny: str = ""
    """The tiny tokenizer's kind; "" for a real model."""
    folder: str = ""
    """A real model's folder or hub id (its files are on this machine)."""
    every_byte: bool = False
    """Whether the tokenizer has a token for every byte and loses no character (tiny bpe, or a real
    model's byte-level BPE or byte fallback)."""
    _tokenizer: Any = field(default=None, repr=False)

    def tokenizer(self) -> Any:
        """The tokenizer, loaded on first use (a real model's with transformers, as the node does)."""
        if self._tokenizer is None:
            self._tokenizer = tiny_tokenizer(self.tiny) if self.tiny else real_tokenizer(self.folder)
        return self._tokenizer

    @property
    def names(self) -> str:
        return ", ".join(f"nodes[{n}]" for n in self.nodes)


def real_tokenizer(folder: str) -> Any:
    """A real model's tokenizer as the node loads it (``node.models.load_tokenizer``), offline."""
    config = Path(folder) / "tokenizer_config.json"
    cls = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    if cls in ("PreTrainedTokenizerFast", "TokenizersBackend"):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def _file(folder: str, name: str) -> Path | None:
    """``name`` in a local folder, or in the hub's local cache for a hub id; None when not here."""
    path = Path(folder) / name
    if path.is_file():
        return path
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(folder, name)
    except Exception:  # not a repo id the hub's cache could hold
        return None
    return Path(found) if isinstance(found, str) else None


def model_folder(card: ModelCard, cache: Path) -> tuple[str | None, str]:
    """(the folder or hub id whose files are on this machine, or None; why not)."""
    source = card.source
    stem = NAMED_STEMS.get(source) or (Path(source).stem if source.endswith(".gguf") else "")
    if stem:
        found = sorted((cache / "gguf").glob(f"{stem}-*/ftis_converted.json"))
        return (str(found[-1].parent), "") if found else (None, "its model is converted into the cache on its "
                                                                 "first run, not yet on this machine")
    if Path(source).expanduser().is_dir():
        return str(Path(source).expanduser()), ""
    if source in NAMED_SOURCES or source.startswith(("/", ".", "~")):
        return None, "no such folder"
    if _file(source, "config.json") is None:
        return None, "it is not in the hub's cache on this machine (a check never downloads)"
    return source, ""


def every_byte(tokenizer_json: Path | None) -> bool:
    """Whether a ``tokenizer.json`` (its head, before the vocabulary) declares a token for every byte
    and no normaliser that drops or changes characters."""
    if tokenizer_json is None:
        return False
    with open(tokenizer_json, "rb") as fh:
        head = fh.read(HEAD_BYTES).decode("utf-8", "replace")
    head = head.split('"vocab"', 1)[0]
    return bool(_BYTES.search(head)) and not _LOSSY.search(head)


def _positions(folder: str) -> int:
    config = json.loads(_file(folder, "config.json").read_text())
    return int(config.get("max_position_embeddings") or
               (config.get("text_config") or {}).get("max_position_embeddings") or 0)


def node_models(exp: ExperimentConfig) -> tuple[list[NodeModel], list[str]]:
    """Each distinct model of the federation, with the nodes that use it; a warning for each model
    whose files this machine does not have."""
    models: dict[tuple, NodeModel] = {}
    notes: list[str] = []
    cache = default_cache_dir(exp.cache_dir)
    for card in exp.nodes:
        limit = card.vllm_max_model_len if card.engine == Engine.VLLM else 0
        key = ("tiny", card.tiny_tokenizer) if card.source == "tiny" else ("real", card.source, limit)
        if key in models:
            models[key].nodes.append(card.name)
            continue
        if card.source == "tiny":
            models[key] = NodeModel([card.name], f"tiny models, {card.tiny_tokenizer} tokenizer, "
                                    f"{TINY_MAX_POSITIONS} positions", TINY_MAX_POSITIONS, card.tiny_tokenizer,
                                    every_byte=card.tiny_tokenizer == TinyKind.BPE)
            continue
        folder, why = model_folder(card, cache)
        try:
            positions = _positions(folder) if folder else 0
        except Exception as exc:  # a config that does not read: told, never a traceback
            folder, why = None, f"its config.json does not read ({type(exc).__name__}: {exc})"
        if folder is None:
            notes.append(f"warning: nodes[{card.name}]: the prompts were not checked against source "
                         f"{card.source!r}'s positions and tokenizer: {why}")
            continue
        positions = min(p for p in (positions, limit) if p > 0) if positions or limit else 1 << 30
        models[key] = NodeModel([card.name], f"{card.source}, {positions} positions", positions, folder=folder,
                                every_byte=every_byte(_file(folder, "tokenizer.json")))
    return list(models.values()), notes
