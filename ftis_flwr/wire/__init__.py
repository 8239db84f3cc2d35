"""What nodes exchange and how it travels: the :class:`~.groups.Group` (tokens and per-token
log-probs), the two payload formats (:mod:`.compact`, format 2; :mod:`.arrays`, format 1) and
their Flower records (:mod:`.rollouts`), the server's cutter for a foreign-group budget
(:mod:`.selection`) and the message protocol's names (:mod:`.protocol`).

May import only :mod:`ftis_flwr.config`.
"""
