"""Names shared by the strategy (server side) and the ClientApp (node side).

Kept apart so the ServerApp never imports the ClientApp and both agree on one spelling.
One round is one ``train`` message per node; the run ends with one ``query`` message that asks
each node to save its model and stop its worker.
"""

ROUND = "ftis.round"
"""ConfigRecord server -> node: round, num_rounds, prompt_indices (JSON list), group_size,
evaluate, experiment (JSON of the resolved ExperimentConfig), run_name."""

FOREIGN_PREFIX = "groups."
"""server -> node: ``groups.<source node>`` (ArrayRecord) + ``groups.<source node>.meta``."""

GROUPS = "groups"
GROUPS_META = "groups.meta"
"""node -> server: this node's new groups (ArrayRecord + ConfigRecord)."""

METRICS = "metrics"
"""node -> server: MetricRecord of the round (train, filter, eval, timing)."""

INFO = "info"
"""node -> server: ConfigRecord with node, model_id, rejections, worker_pid, worker_starts."""

FINISH = "ftis.finish"
"""ConfigRecord server -> node (query message): out_dir where the node saves its final model."""

CHECKPOINT = "checkpoint"
"""node -> server (finish reply): ConfigRecord with node and checkpoint path."""


def foreign_keys(source: str) -> tuple[str, str]:
    return f"{FOREIGN_PREFIX}{source}", f"{FOREIGN_PREFIX}{source}.meta"


def foreign_sources(keys) -> list[str]:
    """Source node names present in a round message's content keys."""
    return sorted(k[len(FOREIGN_PREFIX):-len(".meta")] for k in keys
                  if k.startswith(FOREIGN_PREFIX) and k.endswith(".meta"))
