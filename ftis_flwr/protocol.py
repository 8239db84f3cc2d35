"""Names shared by the strategy (server side) and the ClientApp (node side).

Kept apart so the ServerApp never imports the ClientApp and both agree on one spelling.
One round is one ``train`` message per node; the run ends with one ``query`` message that asks
each node to save its model and stop its worker.
"""

ROUND = "ftis.round"
"""ConfigRecord server -> node: round, num_rounds, prompt_indices (JSON list), group_size,
evaluate, experiment (JSON of the resolved ExperimentConfig), run_name, and ``foreign``: JSON
{source: train indices the server assigned to that source in the round its groups come from}.
``foreign`` is the provenance stamp: the server names each source from the Flower node id that
sent the groups, so a receiver never has to trust the groups' own ``node`` label."""

FOREIGN_ARRAYS = "groups.arrays."
FOREIGN_META = "groups.meta."
"""server -> node: ``groups.arrays.<source>`` (ArrayRecord) + ``groups.meta.<source>``
(ConfigRecord), one pair per source listed in ``foreign``. Distinct prefixes: no source name
can make one source's key equal another's."""

GROUPS = "groups"
GROUPS_META = "groups.meta"
"""node -> server: this node's new groups (ArrayRecord + ConfigRecord)."""

METRICS = "metrics"
"""node -> server: MetricRecord of the round (train, filter, eval, timing)."""

INFO = "info"
"""node -> server: ConfigRecord with node, model_id, rejections, worker_pid, worker_starts.
``rejections``: list of str, each ``"<source>: <reason>"`` ([""] when there are none)."""

FINISH = "ftis.finish"
"""ConfigRecord server -> node (query message): out_dir where the node saves its final model."""

CHECKPOINT = "checkpoint"
"""node -> server (finish reply): ConfigRecord with node and checkpoint path."""


def foreign_keys(source: str) -> tuple[str, str]:
    """(ArrayRecord key, ConfigRecord key) of one source's forwarded groups."""
    return f"{FOREIGN_ARRAYS}{source}", f"{FOREIGN_META}{source}"
