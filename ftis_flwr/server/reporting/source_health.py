"""How far each peer's samples were from each receiver, per source, from the rows of
metrics.jsonl: the effective sample size of the truncated weights, their and the log-ratios'
quantiles, the filtered share, and the samples a receiver could not represent in its tokens.

Why apart: the losses report these per round and source (``<source>/ess``, ``<source>/w_p90``,
...); an operator needs them at a glance over the run, and the summary's first lines must name a
peer whose samples were almost all filtered or refused (algorithm §7: nothing is dropped silently).
"""

from __future__ import annotations

import math

MOSTLY = 0.5
"""Share of a source's text-path samples a receiver refused above which the summary warns first."""
ALMOST_ALL = 0.9
"""Share of a source's samples a receiver's filter dropped above which the summary warns first."""
HEALTH = ("ess", "w_p50", "w_p90", "w_p99", "abs_log_ratio_p50", "abs_log_ratio_p90", "abs_log_ratio_p99")
"""Per-source metrics averaged over the rounds they were reported in (the health table)."""


def _per_pair(rows: list[dict]) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(source, receiver) -> metric name -> the finite values of its rounds."""
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for row in rows:
        for node, m in (row.get("nodes") or {}).items():
            for key, value in m.items():
                src, sep, name = key.partition("/")
                if sep and src != node and isinstance(value, (int, float)) and math.isfinite(value):
                    out.setdefault((src, node), {}).setdefault(name, []).append(float(value))
    return out


def source_health(rows: list[dict]) -> list[dict]:
    """One row per (source, receiver) whose samples the receiver trained on: rounds, samples,
    the filtered share over the run, and each of :data:`HEALTH` averaged over the rounds."""
    out = []
    for (src, node), m in sorted(_per_pair(rows).items()):
        samples = sum(m.get("samples", []))
        if not samples:
            continue
        row = {"source": src, "receiver": node, "rounds": len(m.get("samples", [])), "samples": samples,
               "filtered_share": sum(m.get("filtered", [])) / samples}
        row.update({k: (sum(m[k]) / len(m[k]) if m.get(k) else None) for k in HEALTH})
        out.append(row)
    return out


def warnings_first(rows: list[dict]) -> list[str]:
    """What the summary says before anything else: a peer whose samples a receiver mostly refused
    (over :data:`MOSTLY` of ``<source>/text_samples``) or almost all filtered (over
    :data:`ALMOST_ALL` of ``<source>/samples``)."""
    out = []
    for (src, node), m in sorted(_per_pair(rows).items()):
        received, refused = sum(m.get("text_samples", [])), sum(m.get("text_refused", []))
        if received and refused / received > MOSTLY:
            why = ", ".join(f"{k[len('text_refused_'):]} {sum(v) / received:.0%}"
                            for k, v in sorted(m.items(), key=lambda x: -sum(x[1])) if k.startswith("text_refused_"))
            out.append(f"{node} could not represent most of {src}'s samples in its own tokens: it refused "
                       f"{refused:.0f} of {received:.0f} ({refused / received:.0%}: {why}) and trained on "
                       "the rest only (docs/cross-tokenizer.md)")
        samples, filtered = sum(m.get("samples", [])), sum(m.get("filtered", []))
        if samples and filtered / samples > ALMOST_ALL:
            out.append(f"{node}'s filter dropped almost all of {src}'s samples: {filtered:.0f} of {samples:.0f} "
                       f"({filtered / samples:.0%}); {src} barely taught {node} (see the per-source health table)")
    return out
