"""The shipped tiny models' numbers and character vocabulary: their one definition, torch-free.

:mod:`ftis_flwr.node.tiny.models` builds the models from these (it imports torch and transformers); the
configuration and the tasks may not import the node (tests/test_layers.py), yet ``ftis-flwr plan``
sizes the tiny models and ``ftis-flwr check`` measures prompts against their positions and
vocabulary, so the numbers live here, below both. ``tests/test_prompt_fit.py`` keeps the
vocabulary sizes equal to the tokenizers the node builds.
"""

from __future__ import annotations

import string

TINY_MAX_POSITIONS = 64
"""Positions of every tiny model (``node.tiny.models.TINY_MAX_POSITIONS``): prompt and completion together."""
TINY_SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
"""The special tokens, ids 0, 1, 2 (``node.tiny.models.SPECIAL_TOKENS``)."""
TINY_CHARS = string.digits + "+-=*" + " " + string.ascii_lowercase + ".,:;!?()'\"#_%$\n" + "<>/"
"""The char tokenizer's characters, in id order after the special tokens (``node.tiny.models.CHARS``):
any other character (a capital, an accent, a tab) becomes ``<unk>``. Append only: ids must never
move (the shipped models' embeddings are indexed by them)."""
TINY_SIZES: dict[str, dict[str, int]] = {
    "small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=512),
    "large": dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=2, intermediate_size=768),
}
"""The Qwen2 shape of each ``tiny_size`` (``node.tiny.models.TINY_SIZES``), tied embeddings."""
TINY_VOCAB = {"char": len(TINY_SPECIAL_TOKENS) + len(TINY_CHARS), "bpe": 384, "unigram": 286}
"""Tokens of each ``tiny_tokenizer`` (``len`` of ``node.tiny_bpe.build_tiny_tokenizer(kind)``)."""
TINY_TOKENIZER_ASSETS = {"bpe": "bpe-tokenizer.json", "unigram": "unigram-tokenizer.json"}
"""The shipped tokenizer file of each ``tiny_tokenizer`` but "char", under ``ftis_flwr/assets/tiny``
(``node.tiny_bpe.ASSETS``)."""


def char_set_words() -> str:
    """The char tokenizer's characters in words, for a message: what a prompt may contain."""
    signs = "".join(c for c in TINY_CHARS if not c.isalnum() and c not in " \n")
    return f"digits, lowercase a-z, space, newline and {signs}"


def char_tokenizer_backend():
    """The char tokenizer as a ``tokenizers`` backend (no transformers, no torch): one token per
    character of :data:`TINY_CHARS`, ids after :data:`TINY_SPECIAL_TOKENS`, anything else
    ``<unk>``; decoding joins tokens without separators, so text round-trips exactly. The node
    wraps it for transformers (``node.tiny.models.build_char_tokenizer``), the check uses it as it is."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tok_models

    vocab = {tok: i for i, tok in enumerate(TINY_SPECIAL_TOKENS)}
    for ch in TINY_CHARS:
        vocab[ch] = len(vocab)
    backend = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return backend
