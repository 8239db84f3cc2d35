"""Names shared by the strategy (server side) and the ClientApp (node side).

Kept apart so the ServerApp never imports the ClientApp and both agree on one spelling.
A run (and a resumed run) starts with one ``query`` message per SuperNode that asks which
model card it serves (HELLO), then ``query`` messages that start each node's build and report its
progress until every node is ready (BUILD); one round is one ``train`` message per node; the run ends with one
``query`` message that asks each node to save its model and stop its worker (FINISH).
"""

HELLO = "ftis.hello"
"""ConfigRecord server -> node (query message) with ``experiment`` (JSON), sent to every SuperNode
before its first round; the node answers with a HELLO record: ``node`` = the card it serves, or
"" and ``reason`` when it serves none (a SuperNode of another app, or one started without a
``card``: it is left out) or names a card the experiment does not have (``unknown`` = True: the
run is refused). It builds nothing, so it is answered in seconds."""

BUILD = "ftis.build"
"""ConfigRecord server -> node (query message) with ``experiment`` and ``run_name``, sent before the
first round of a run (fresh or resumed) and again every few seconds while the node builds: the
node starts its worker if none runs, has it build the model in the background, and answers at once
with a BUILD record: ``node``, ``state`` (building, ready, failed or idle), ``seconds`` since the
build started, ``progress`` (the worker's last log line: converting, warm-starting, loading) and
``error`` (the last line of a failed build's error; the first round tries again)."""

ROUND = "ftis.round"
"""ConfigRecord server -> node: round, num_rounds, prompt_indices (JSON list), group_size,
evaluate, experiment (JSON of the resolved ExperimentConfig), run_name, ``send_text`` (put the
completions' texts on the wire: a peer has another tokenizer, or one is not known yet),
``next_within`` (seconds from this message within which the node's next message comes while the
run goes on: its worker exits when none has come by then), and ``foreign``: JSON
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
"""node -> server: ConfigRecord with node, model_id, tokenizer_fp, align_fault (why its tokenizer cannot
train with another one, "" when it can), text_limits (what texts its tokens cannot stand for, "" when
none), rejections, worker_pid, worker_starts.
``rejections``: list of str, each ``"<source>: <reason>"`` ([""] when there are none)."""

REWARDS_NOTE = "came with rewards that differ"
"""In a ``rejections`` line ``"<source>: <n> sample(s) came with rewards that differ ..."``: the
receiver rescored a source's claimed rewards (a ``rewards_corrected`` event, not a rejection)."""

REFUSED_NOTE = "not trained on: this node's tokens cannot stand for their text"
"""In a ``rejections`` line ``"<source>: <n> completion(s) not trained on ... (<reason>: ...)"``: the
receiver refused completions of a source's groups on the text path (a ``text_refused`` event)."""

FINISH = "ftis.finish"
"""ConfigRecord server -> node (query message): out_dir where the node saves its final model."""

STOP = "ftis.stop"
"""ConfigRecord server -> node (query message) with ``experiment`` and ``run_name``, sent when a
run ends early (an error, too few nodes): the node stops its worker if one runs (its saved state
stays on disk for a resume) and starts none. The reply is not needed."""

CHECKPOINT = "checkpoint"
"""node -> server (finish reply): ConfigRecord with node and checkpoint path."""


def foreign_keys(source: str) -> tuple[str, str]:
    """(ArrayRecord key, ConfigRecord key) of one source's forwarded groups."""
    return f"{FOREIGN_ARRAYS}{source}", f"{FOREIGN_META}{source}"
