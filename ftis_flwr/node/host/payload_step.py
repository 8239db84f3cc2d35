"""One round of a node from the payloads the ClientApp hands its worker: decode the received groups
(rejecting bad ones loudly), run the round, encode the reply. Apart from the worker process (which
only serves requests) and from the rank group (which runs it on rank 0), so neither imports the other.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)


def step_from_payloads(node, payload: dict[str, Any]) -> dict[str, Any]:
    """Decode received payloads (rejecting bad ones loudly), run the round, encode the reply.

    ``payload["foreign_payloads"]``: {source: (arrays, meta, assigned train indices)}, the source
    being the server's stamp. A payload that fails decoding is counted in groups and samples.
    """
    from ftis_flwr.node.node import Received, StepRequest
    from ftis_flwr.wire.rollouts import PayloadError, decode_groups, encode_groups, payload_size

    payload = dict(payload)
    payload.pop("next_within", None)  # the worker's own business (_Server._step)
    foreign, rejected, reasons = [], {}, []
    for src, (arrays, meta, indices) in payload.pop("foreign_payloads", {}).items():
        try:
            groups = decode_groups(arrays, meta, expected_fp=node.fingerprint,
                                   vocab_size=node.vocab_size, wire=node.cfg.wire,
                                   cross_tokenizer=node.cfg.exchange.cross_tokenizer)
        except PayloadError as exc:
            n_groups, n_samples = rejected[src] = payload_size(arrays, meta)
            reasons.append(f"{src}: payload rejected ({n_groups} group(s), {n_samples} sample(s)): {exc}")
            log.warning("node %s: %s", node.card.name, reasons[-1])
            continue
        foreign.append(Received(src, groups, [int(i) for i in indices]))
    result = node.step(StepRequest(**payload, foreign=foreign, rejected=rejected))
    wire = node.cfg.wire
    arrays, meta = encode_groups(result.groups, logprob_dtype=wire.logprob_dtype,
                                 vocab_size=node.vocab_size, format=wire.format,
                                 compress=wire.compress)
    return {"arrays": arrays, "meta": meta, "metrics": result.metrics,
            "rejections": reasons + result.rejections,
            "node": node.card.name, "model_id": node.policy.model_id, "tokenizer_fp": node.fingerprint,
            "align_fault": node.align_fault, "text_limits": node.text_limits,
            "task_parts": json.dumps(node.task_parts, sort_keys=True),
            "samples": json.dumps(result.samples)}
