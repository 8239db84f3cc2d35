"""The tiny models this project builds and trains itself, so that the offline default, the tests
and CI need no download: their tokenizers (``chars``: one character a token; ``bpe``: byte-level
BPE and unigram, trained on the task's text), their warm start (``models``), the tool warm start
of the environment presets (``tools``), and the weights that ship with the package (``shipped``,
``assets``: ``python -m ftis_flwr.node.tiny.assets --ship``).
"""
