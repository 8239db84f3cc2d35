"""Every metric a node or the server logs, with its meaning and unit: the catalogue the metrics
reference page (``docs/reference/metrics.md``) is generated from, as the configuration reference is
from the field docstrings, so the page cannot drift from it (a test fails when it does, and
another when a real tiny run logs a metric that is not here).

    python -m ftis_flwr.server.reporting.metric_names --write   # regenerate the page
    python -m ftis_flwr.server.reporting.metric_names --check   # exit 1 if it is stale

Torch-free and import-free: the server, a test and a reader of a run folder may all use it.
A name may hold placeholders: ``<source>`` (the card whose samples these are, the node's own
name included), ``<split>`` (an evaluation split), ``<q>`` (a percentile: 50, 90, 99) and
``<reason>`` (a slug of :data:`ftis_flwr.xtok.represent.REASONS`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PAGE = Path(__file__).resolve().parents[3] / "docs" / "reference" / "metrics.md"


@dataclass(frozen=True)
class Metric:
    """One logged metric (or a family of them, when ``name`` holds placeholders)."""

    name: str
    unit: str
    meaning: str
    section: str
    scope: str = "node"
    """"node": in ``nodes.<card>`` of a metrics.jsonl record (a tracker's ``<card>/<name>``);
    "server": in its ``server`` part (``server/<name>``)."""


SECTIONS = {
    "update": ("The update", "What the round's training step did; a node that trained on nothing "
               "this round reports none of these. With `train.updates_per_round` > 1 they describe "
               "the first step, and `*_last` the last."),
    "samples": ("Samples and the filter", "Counts over every sample of the update (own and received), "
                "before and after the F-TIS filter ([algorithm](../algorithm.md) §6)."),
    "weights": ("Truncated weights and KL", "The truncated importance weight "
                "`w = min(pi_old / pi_gen, C)` per real token and the per-sample KL estimate between "
                "the learner at the round start (`pi_old`) and the generator; an empty selection "
                "gives weights 1.0, `ess` 1.0 and KL 0.0."),
    "source": ("Per source", "The same quantities over the samples of one source, `<source>` being "
               "the card that generated them (the node's own name included)."),
    "intake": ("Received groups", "What became of the groups another node sent: refused, rescored or "
               "re-tokenised ([cross-tokenizer](../cross-tokenizer.md))."),
    "rollout": ("Rollouts and evaluation", "The groups the node generated, and its greedy evaluation."),
    "timing": ("Timing", "Where a node's round went; `compute_seconds` and `idle_fraction` are added "
               "by the server."),
    "process": ("The node's process", "Its worker, its saved state and its numerics."),
    "exchange": ("Exchange", "Added by the server to each node's row: what it sent and received. The "
                 "rows marked async are logged with `exchange.schedule=async` only."),
    "server": ("Server", "The `server` part of a record (`server/<name>` in a tracker)."),
}
"""Section key -> (heading, what the section's metrics have in common), in page order."""

_COUNTS = (
    ("samples", "samples (completions) the update saw, own and received"),
    ("samples_kept", "samples not filtered: their advantage reaches the gradient (it may be 0)"),
    ("filtered", "samples the filter removed (advantage set to 0, or dropped with "
                 "`loss.filter_action=drop`); 0 with a method without the filter"),
    ("filtered_negative", "filtered samples with advantage <= 0 (the paper's test, so advantage 0 too)"),
    ("filtered_kl", "filtered samples whose KL estimate is above g (or not finite)"),
    ("filtered_zero_advantage", "filtered samples whose advantage was exactly 0 (no gradient anyway)"),
    ("zero_advantage", "samples with advantage exactly 0, before the filter"),
    ("negative_advantage", "samples with a negative advantage, before the filter"),
)
_WEIGHTS = (
    ("w_mean", "ratio", "mean truncated weight over all real tokens"),
    ("w_min", "ratio", "smallest truncated weight"),
    ("w_max", "ratio", "largest truncated weight (at most C, `loss.trunc_c`)"),
    ("frac_tokens_truncated", "fraction", "share of real tokens whose weight is at the cap C"),
)


def _m(name: str, unit: str, meaning: str, section: str, scope: str = "node") -> Metric:
    return Metric(name, unit, meaning[0].upper() + meaning[1:].rstrip(".") + ".", section, scope)


METRICS: tuple[Metric, ...] = (
    _m("loss", "-", "the loss of the round's first step: its sum over counted samples / `denominator` "
                    "(0 when nothing is counted)", "update"),
    _m("denominator", "count", "what the loss is divided by: the counted sequences "
                               "(`loss.reduction=sequence`) or their real tokens (`token`)", "update"),
    _m("grad_norm", "L2 norm", "gradient norm of the first step, before clipping at `train.grad_clip`", "update"),
    _m("clip_frac", "fraction", "share of real tokens with a non-zero advantage where the method's clip "
                                "binds (tis, vis and their filtered variants only)", "update"),
    _m("loss_last", "-", "the loss of the round's last step", "update"),
    _m("grad_norm_last", "L2 norm", "gradient norm of the round's last step", "update"),
    _m("clip_frac_last", "fraction", "`clip_frac` at the round's last step", "update"),
    _m("lr", "learning rate", "the learning rate of the round's steps (after `train.warmup_rounds`)", "update"),
    _m("g", "nats", "this round's KL threshold g of the filter (the card's `g` schedule)", "update"),
    _m("frac_zero_std_groups", "fraction", "share of the trained groups whose rewards are all equal "
                                           "(advantages 0: nothing to learn from them)", "update"),
    _m("updates", "count", "updates this node has made in the run (a resumed worker continues the count)",
       "update"),
    _m("steps_skipped_nonfinite", "count", "optimiser steps skipped this round for a non-finite "
                                           "gradient norm", "update"),
    *(_m(name, "count", meaning, "samples") for name, meaning in _COUNTS),
    _m("positive_advantage", "count", "samples with a positive advantage", "samples"),
    _m("samples_foreign", "count", "samples received from other nodes", "samples"),
    _m("samples_own", "count", "this node's own samples (generated in its previous round)", "samples"),
    _m("samples_counted", "count", "samples in the loss's denominator (all of them, or only the kept "
                                   "ones with `loss.filter_action=drop`)", "samples"),
    _m("samples_effective", "count", "samples with a gradient: kept and a non-zero advantage", "samples"),
    _m("would_filter", "count", "samples the filter would remove, whether or not the method filters "
                                "(what f-tis would drop under tis)", "samples"),
    _m("tokens", "count", "real completion tokens of all samples", "samples"),
    _m("tokens_counted", "count", "real tokens of the counted samples", "samples"),
    _m("foreign_ignored_alone", "count", "received samples not trained on: `advantage.mode=alone`",
       "samples"),
    *(_m(name, unit, meaning, "weights") for name, unit, meaning in _WEIGHTS),
    _m("ess", "fraction", "effective sample size of the received samples' weights, "
                          "(sum w)^2 / (N sum w^2): 1 when they are all equal, near 0 when a few "
                          "dominate", "weights"),
    _m("kl_mean_foreign", "nats", "mean KL estimate (`loss.kl_estimator`) of the received samples, "
                                  "each clamped to +-1e12", "weights"),
    _m("kl_median_foreign", "nats", "median KL estimate of the received samples (not clamped)", "weights"),
    _m("kl_mean_own", "nats", "mean KL estimate of own samples (about 0 for an on-policy learner)", "weights"),
    _m("kl_median_own", "nats", "median KL estimate of own samples", "weights"),
    _m("own_logprob_gap_max", "nats", "largest abs(log pi_old - log pi_gen) on own samples' tokens: 0 up "
                                      "to rounding when the learner scores what the engine sampled from",
       "weights"),
    _m("own_logprob_gap_mean", "nats", "mean abs(log pi_old - log pi_gen) on own samples' tokens", "weights"),
    _m("<source>/samples", "count", "samples from `<source>` in the update", "source"),
    *(_m(f"<source>/{name}", "count", f"as `{name}`, of `<source>`'s samples", "source")
      for name, _ in _COUNTS[1:]),
    _m("<source>/foreign", "count", "how many of `<source>`'s samples are foreign (0 for the node's own)",
       "source"),
    *(_m(f"<source>/{name}", unit, f"as `{name}`, over `<source>`'s tokens", "source")
      for name, unit, _ in _WEIGHTS),
    _m("<source>/ess", "fraction", "as `ess`, of `<source>`'s weights", "source"),
    _m("<source>/w_p<q>", "ratio", "the q-th percentile of `<source>`'s truncated weights", "source"),
    _m("<source>/abs_log_ratio_p<q>", "nats", "the q-th percentile of abs(log pi_old - log pi_gen) over "
                                              "`<source>`'s tokens: a far peer shows in the tails", "source"),
    _m("<source>/kl_mean", "nats", "mean KL estimate of `<source>`'s samples (clamped to +-1e12)", "source"),
    _m("<source>/kl_median", "nats", "median KL estimate of `<source>`'s samples", "source"),
    _m("<source>/payloads_rejected", "count", "1 when `<source>`'s whole payload could not be read; "
                                              "its groups and samples are counted below", "intake"),
    _m("<source>/groups_rejected", "count", "groups from `<source>` not trained on: its unreadable "
                                            "payload, or groups that failed a receiver check", "intake"),
    _m("<source>/samples_rejected", "count", "the samples of those groups", "intake"),
    _m("<source>/rewards_corrected", "count", "samples whose claimed reward differs from this node's own "
                                              "scoring of their text (its own is used)", "intake"),
    _m("<source>/episodes_no_replay", "count", "episodes from `<source>` not trained on because they cannot "
                                               "be replayed here (an environment that does not declare itself "
                                               "deterministic, or no environment here): a receiver never trusts "
                                               "a reward it did not compute (algorithm §8)", "intake"),
    _m("<source>/env_replayed", "count", "episodes from `<source>` replayed through this node's environment, "
                                         "every tool turn matching, and trained on with this node's rewards "
                                         "(another tokenizer's: replayed from their text, in this node's tokens)",
       "intake"),
    _m("<source>/env_replay_refused", "count", "episodes from `<source>` whose replay parted from what was sent "
                                               "(a prompt, a tool turn, a turn without a call): their groups are "
                                               "not trained on", "intake"),
    _m("<source>/text_samples", "count", "samples re-tokenised from their text (another tokenizer)", "intake"),
    _m("<source>/text_refused", "count", "completions on the text path not trained on: this node's "
                                         "tokens cannot stand for their text", "intake"),
    _m("<source>/text_refused_<reason>", "count", "the same, for one reason (e.g. `unknown_token`, "
                                                  "`normalised`, `too_long`)", "intake"),
    _m("<source>/xtok_tokens", "count", "this node's tokens of `<source>`'s re-tokenised completions", "intake"),
    _m("<source>/xtok_chunks_per_token", "ratio", "byte-aligned chunks per receiver token (1: every "
                                                  "token its own chunk)", "intake"),
    _m("<source>/xtok_multi_token_share", "fraction", "share of receiver tokens in a chunk of several "
                                                      "tokens", "intake"),
    _m("<source>/xtok_word_merged_share", "fraction", "with `loss.cross_tokenizer_ratio=word`: the share "
                                                      "of chunks merged into words", "intake"),
    _m("<source>/xtok_align_seconds", "seconds", "time spent aligning `<source>`'s texts to this node's "
                                                 "tokens", "intake"),
    _m("reward_mean", "reward", "mean reward of the groups the node generated this round", "rollout"),
    _m("train_reward_own", "reward", "mean reward of the own samples trained on (null when none)", "rollout"),
    _m("train_reward_foreign", "reward", "mean reward, by this node's scoring, of the received samples "
                                         "trained on (null when none)", "rollout"),
    _m("groups_dropped_unencodable", "count", "own groups dropped before sending: they cannot go on the "
                                              "wire", "rollout"),
    _m("env/episodes", "count", "episodes the node ran this round with `task.environment` (G per prompt)",
       "rollout"),
    _m("env/turns_mean", "count", "mean model turns per episode (at most `task.max_turns`)", "rollout"),
    _m("env/tool_calls", "count", "tool calls the node's episodes made this round", "rollout"),
    _m("env/tool_errors", "count", "of those, calls that failed: unreadable, unknown tool, raised or "
                                   "timed out (the model read an error observation)", "rollout"),
    _m("groups_unsent_no_text", "count", "own groups kept home: a peer needs texts and theirs could not "
                                         "be attached", "rollout"),
    _m("eval/<split>/accuracy", "fraction", "greedy pass@1 on the held-out split `<split>` (its first "
                                            "`rounds.eval_size` problems), on evaluation rounds", "rollout"),
    _m("eval/<split>/full_credit", "fraction", "share of those greedy answers with full credit (reward 1): "
                                               "below the accuracy when the task pays part of a wrong answer",
       "rollout"),
    _m("eval/<split>/distinct", "fraction", "distinct greedy answers over answers on `<split>`: 1 / n when "
                                            "every problem gets the same answer (the summary warns)", "rollout"),
    _m("seconds_train", "seconds", "the round's training, every step", "timing"),
    _m("seconds_generate", "seconds", "generating the round's groups", "timing"),
    _m("seconds_eval", "seconds", "the evaluation (evaluation rounds only)", "timing"),
    _m("seconds_engine_sync", "seconds", "copying the updated weights into an engine with its own copy "
                                         "(vLLM)", "timing"),
    _m("state_save_seconds", "seconds", "saving the node's state for a resume (`rounds.state_every`)", "timing"),
    _m("worker_seconds", "seconds", "the worker's whole round: compute plus decoding, checks and encoding",
       "timing"),
    _m("clientapp_seconds", "seconds", "the ClientApp's round: the worker's plus finding and reaching it",
       "timing"),
    _m("compute_seconds", "seconds", "in-worker compute: train + generate + eval + state save", "timing"),
    _m("idle_fraction", "fraction", "share of the round's wall time the node did not compute (it waited "
                                    "for the slowest node, or for Flower)", "timing"),
    _m("round", "round", "the round this reply is for", "process"),
    _m("worker_starts", "count", "times this node's worker has started in the run (more than 1: it was "
                                 "replaced and resumed from its state)", "process"),
    _m("resumed_from_round", "round", "the saved round a restarted worker resumed from (its first round "
                                      "after the restart)", "process"),
    _m("state_bytes", "bytes", "size of the state saved this round", "process"),
    _m("weights_bfloat16", "flag", "1 when the weights are held in bfloat16 (the first round a worker "
                                   "runs: what `dtype=auto` chose)", "process"),
    _m("compute_bfloat16", "flag", "1 when the forward passes compute in bfloat16 (first round only)", "process"),
    _m("ranks", "count", "processes this node's learner is sharded over (`ranks`; 1: not sharded)", "process"),
    _m("payload_bytes", "bytes", "size of the groups the node sent this round", "exchange"),
    _m("foreign_groups_received", "count", "groups forwarded to the node with this round's message", "exchange"),
    _m("foreign_bytes_received", "bytes", "their size on the wire", "exchange"),
    _m("round_seconds", "seconds", "async: time since the node's previous reply (its round's span)", "exchange"),
    _m("wall_seconds", "seconds", "async: time since the run started", "exchange"),
    _m("server_send_seconds", "seconds", "async: the server building and pushing the node's message", "exchange"),
    _m("server_reply_seconds", "seconds", "async: the server handling the node's previous reply", "exchange"),
    _m("foreign_groups_stale_dropped", "count", "async: groups not forwarded, older than "
                                                "`exchange.max_staleness`", "exchange"),
    _m("foreign_staleness_mean", "rounds", "async: mean staleness of the forwarded groups, in their "
                                           "source's rounds", "exchange"),
    _m("foreign_staleness_max", "rounds", "async: largest staleness of the forwarded groups", "exchange"),
    _m("nodes_replied", "count", "nodes whose reply was used this round", "server", "server"),
    _m("nodes_failed", "count", "nodes that failed this round (no reply, an error, a malformed reply)",
       "server", "server"),
    _m("bytes_per_token", "bytes/token", "bytes of the round's payloads per completion token (null in "
                                         "the last round, which generates nothing)", "server", "server"),
    _m("round_seconds", "seconds", "the round's wall time at the server (async: the longest node span of "
                                   "the step)", "server", "server"),
)
"""The catalogue, in page order."""


def _regex(name: str) -> re.Pattern:
    """``name`` with each ``<placeholder>`` standing for one path part (no "/")."""
    parts = re.split(r"<[a-z]+>", name)
    return re.compile("[^/]+".join(re.escape(p) for p in parts) + r"\Z")


_PATTERNS = [(m, _regex(m.name)) for m in METRICS]


def find(key: str, scope: str = "node") -> Metric | None:
    """The catalogue entry a logged ``key`` is, or None; an exact name wins over a pattern."""
    hits = [m for m, rx in _PATTERNS if m.scope == scope and rx.match(key)]
    return next((m for m in hits if m.name == key), hits[0] if hits else None)


def uncatalogued(records: Iterable[Mapping]) -> list[str]:
    """``"<scope>: <key>"`` for each metric in metrics.jsonl ``records`` that is not catalogued
    (event lines are skipped)."""
    missing = set()
    for rec in records:
        for key in rec.get("server") or {}:
            if find(key, "server") is None:
                missing.add(f"server: {key}")
        for metrics in (rec.get("nodes") or {}).values():
            missing |= {f"node: {key}" for key in metrics if find(key, "node") is None}
    return sorted(missing)


def _cell(text: str) -> str:
    """Text as one Markdown table cell: | escaped, and < outside code spans."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts).replace("|", "\\|")


INTRO = """\
# Metrics reference

<!-- Generated by `python -m ftis_flwr.server.reporting.metric_names --write` from the catalogue in
ftis_flwr/server/reporting/metric_names.py; do not edit by hand. -->

A run's `metrics.jsonl` has one line per round: `{"round", "time", "elapsed", "server": {...},
"nodes": {"<card>": {...}}, "missing_nodes": [...]}` (the events go to `events.jsonl`, see
[trackers](../configuration.md#trackers)). Each tracker of `report.to` gets the same numbers as
`<card>/<name>` and `server/<name>` at step `round`. With `exchange.schedule=async` a line is a
*step* (the replies of one pull) and a node's own round is its `round` metric. A metric is logged
only where it applies (`clip_frac` with a clipping method, `xtok_*` on the text path); a value
that is not finite is written as `null`.

In a name, `<source>` is the card whose samples a figure counts (the node's own name included),
`<split>` an evaluation split, `<q>` a percentile (50, 90, 99) and `<reason>` why a text was refused.
Units: *count* a number of items; *fraction* a share in [0, 1]; *ratio* a non-negative ratio;
*nats* a KL or a log-ratio (natural log); *flag* 0 or 1; *reward* the task's reward (0 to 1 for
the built-in tasks); *-* no unit.
"""


def render() -> str:
    """The whole page, ending with a newline."""
    out = [INTRO]
    for key, (heading, about) in SECTIONS.items():
        rows = [m for m in METRICS if m.section == key]
        out += [f"## {heading}", "", about, "", "| metric | unit | meaning |", "|---|---|---|"]
        out += [f"| `{m.name}` | {_cell(m.unit)} | {_cell(m.meaning)} |" for m in rows]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from ftis_flwr.config.reference import page_cli  # the generated pages' one command line

    return page_cli(render, PAGE, "ftis_flwr.server.reporting.metric_names", __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
