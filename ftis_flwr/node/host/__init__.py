"""The processes a node lives in: a long-lived worker per run and node that holds the
:class:`~ftis_flwr.node.node.Node` (``worker``), how a ClientApp finds or starts it (``handle``),
finding and stopping workers by pid (``processes``, ``tempdirs``), and the ranks of a node sharded
over several processes (``ranks``, ``rank_group``). ``payload_step`` is one round from the
payloads the ClientApp hands its worker.
"""
