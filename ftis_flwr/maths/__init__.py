"""The maths of F-TIS (algorithm §2-6): group advantages, the sample filter, the loss family and its
metrics. Pure functions over tensors and plain values, tested on synthetic numbers without a model.

Imports no other part of ftis_flwr: its settings (:mod:`.params`) are its own small dataclasses,
which the configuration composes. Nothing here imports Flower.
"""
