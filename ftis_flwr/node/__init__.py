"""One institution's model: the :class:`~.node.Node` (generate, score, the local F-TIS step),
the worker process that holds it across Flower messages (:mod:`.worker`; reached through
:mod:`.handle`, found and stopped by :mod:`.processes`; its temporary folders, which the next
process deletes if it was killed, by :mod:`.tempdirs`), its
saved state (:mod:`.state`), model loading (:mod:`.models`, :mod:`.sources`), the offline tiny
models (:mod:`.tiny`, :mod:`.tiny_bpe`, shipped by :mod:`.tiny_assets`), log-prob scoring (:mod:`.logprobs`,
:mod:`.logprobs_shared`), the intake of foreign groups (:mod:`.intake`) and the rollout engines
(:mod:`.engines`).

May import every part below it (maths, config, tasks, wire, xtok), never :mod:`ftis_flwr.server`;
the Node itself knows nothing about Flower.
"""
