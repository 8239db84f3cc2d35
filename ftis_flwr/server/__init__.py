"""The server side: the Flower strategy (:mod:`.strategy`) that hands every node the groups the
others generated, its synchronous and asynchronous rounds (:mod:`.async_rounds`, :mod:`.grid_io`),
the messages outside the rounds (:mod:`.lifecycle`: HELLO, BUILD, STOP, FINISH), the roster of nodes
and their replies (:mod:`.roster`, :mod:`.replies`, :mod:`.peer_tokenizers`, :mod:`.task_agreement`),
the foreign-group budget (:mod:`.budget`), the saved server state (:mod:`.state`), and the
run's reports, trackers and plots (:mod:`.reporting`, :mod:`.trackers`, :mod:`.summary`,
:mod:`.source_health`, :mod:`.plots`, :mod:`.incidents`).

May import :mod:`ftis_flwr.config` and :mod:`ftis_flwr.wire`; never a node (a server holds no model).
"""
