"""Cross-tokenizer F-TIS (algorithm §4): the bytes each token stands for (:mod:`.token_bytes`), the
alignment of two tokenizations of one text into byte-aligned chunks (:mod:`.align`), and the
translation of a peer's group into the receiver's own tokens (:mod:`.translate`).

May import :mod:`ftis_flwr.config` and :mod:`ftis_flwr.wire`; nothing here imports Flower.
"""
