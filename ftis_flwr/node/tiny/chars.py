"""The tiny models' character-level tokenizer, and how any tiny tokenizer backend becomes a transformers
tokenizer with the tiny models' conventions. Apart from :mod:`ftis_flwr.node.tiny.models` (the models and their
warm start) and :mod:`ftis_flwr.node.tiny.bpe` (the BPE and unigram tokenizers), which both build on it."""

from __future__ import annotations

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from ftis_flwr.config.tiny_models import TINY_MAX_POSITIONS, char_tokenizer_backend


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The shared character-level tokenizer: one token per character, ids fixed by :data:`CHARS`.

    Characters outside the vocabulary (e.g. upper case) become ``<unk>`` (id 2), never dropped.
    ``decode`` joins tokens without separators (``decoders.Fuse``), so text round-trips exactly.
    """
    return as_tiny_tokenizer(char_tokenizer_backend())


def as_tiny_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """A tiny model's ``tokenizers`` backend as a transformers tokenizer, with the tiny models'
    conventions: specials ``<pad> <eos> <unk>``, left padding (batched generation), no clean-up
    of spaces, ``model_max_length`` :data:`TINY_MAX_POSITIONS`."""
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                  unk_token="<unk>", clean_up_tokenization_spaces=False,
                                  model_max_length=TINY_MAX_POSITIONS)
    tok.padding_side = "left"
    return tok
