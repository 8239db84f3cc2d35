"""The shipped tiny models' numbers, as a pure table the configuration can read without torch.

:mod:`ftis_flwr.node.tiny` builds the models (it imports torch and transformers); the
configuration may not import the node (tests/test_layers.py), yet ``ftis-flwr plan`` sizes the
tiny models and ``ftis-flwr check`` measures prompts against their positions and vocabulary. So
the numbers are copied here, and ``tests/test_prompt_fit.py`` keeps every one of them equal to
:mod:`ftis_flwr.node.tiny`'s (and the vocabulary sizes to the tokenizers the node builds).
"""

from __future__ import annotations

import string

TINY_MAX_POSITIONS = 64
"""Positions of every tiny model (``node.tiny.TINY_MAX_POSITIONS``): prompt and completion together."""
TINY_SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
"""The special tokens, ids 0, 1, 2 (``node.tiny.SPECIAL_TOKENS``)."""
TINY_CHARS = string.digits + "+-=*" + " " + string.ascii_lowercase + ".,:;!?()'\"#_%$\n" + "<>/"
"""The char tokenizer's characters, in id order after the special tokens (``node.tiny.CHARS``):
any other character (a capital, an accent, a tab) becomes ``<unk>``."""
TINY_SIZES: dict[str, dict[str, int]] = {
    "small": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=512),
    "large": dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=2, intermediate_size=768),
}
"""The Qwen2 shape of each ``tiny_size`` (``node.tiny.TINY_SIZES``), tied embeddings."""
TINY_VOCAB = {"char": len(TINY_SPECIAL_TOKENS) + len(TINY_CHARS), "bpe": 384, "unigram": 286}
"""Tokens of each ``tiny_tokenizer`` (``len`` of ``node.tiny_bpe.build_tiny_tokenizer(kind)``)."""
TINY_TOKENIZER_ASSETS = {"bpe": "bpe-tokenizer.json", "unigram": "unigram-tokenizer.json"}
"""The shipped tokenizer file of each ``tiny_tokenizer`` but "char", under ``ftis_flwr/assets/tiny``
(``node.tiny_bpe.ASSETS``)."""


def char_set_words() -> str:
    """The char tokenizer's characters in words, for a message: what a prompt may contain."""
    signs = "".join(c for c in TINY_CHARS if not c.isalnum() and c not in " \n")
    return f"digits, lowercase a-z, space, newline and {signs}"
