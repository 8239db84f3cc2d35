"""What a run says about itself: the files the ServerApp writes as it goes (``reporter``:
``metrics.jsonl``, ``events.jsonl``, the trackers of ``report.to`` in ``trackers``), what is read
back from them (``summary``, ``plots``, the health tables ``answer_health``, ``reward_health``,
``source_health``, ``incidents``, ``eta``, ``run_names``), the catalogue of every metric
(``metric_names``), and a finished run's own tools (``round_report``, ``run_compare``:
``ftis-flwr report`` and ``ftis-flwr compare``).
"""
