"""One participant: its policy, optimiser, rollout engine and the groups it generated last round.

A round is one call of :meth:`Node.step` (docs/how-it-works.md: one round, one message per node):

1. train on last round's own groups (exactly on-policy) plus the groups received from the other
   nodes (one update stale, corrected by the importance weights), with rewards recomputed here;
2. generate G completions per new prompt with the updated policy;
3. evaluate greedily on the task's held-out splits when asked.

Nothing here knows about Flower; the worker feeds it decoded groups and ships its replies.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ftis_flwr.config.choices import AdvantageMode, CardDtype, CrossTokenizerRatio
from ftis_flwr.config.dtypes import resolve_dtypes
from ftis_flwr.config.plan import memory_warning
from ftis_flwr.config.schema import ExperimentConfig, LossConfig, ModelCard
from ftis_flwr.maths.advantages import frac_zero_std_groups, g_for_round, pooled_advantages, pooled_rewards
from ftis_flwr.maths.loss import LossInputs, compute_loss
from ftis_flwr.maths.loss_metrics import LossStats, clip_frac, loss_metrics, own_gap
from ftis_flwr.node import env_rollout
from ftis_flwr.node.batch import Sample, loss_inputs
from ftis_flwr.node.engines import make_engine
from ftis_flwr.node.engines.vllm_memory import engine_plan_options
from ftis_flwr.node.host.ranks import SINGLE, Ranks, micro_batches
from ftis_flwr.node.intake import Received, usable  # noqa: F401 (Received: the node's input type)
from ftis_flwr.node.models import compute_context, load_policy, save_policy, stop_token_ids
from ftis_flwr.node.sharding import norm_value, sync_copy
from ftis_flwr.tasks import make_task
from ftis_flwr.tasks.fingerprint import task_parts
from ftis_flwr.wire import protocol
from ftis_flwr.wire.groups import Group, PayloadError, span_ends, text_fault, tokenizer_fingerprint
from ftis_flwr.xtok.align import alignment_fault
from ftis_flwr.xtok.represent import describe_limits, text_limits
from ftis_flwr.xtok.token_bytes import TokenBytesError, completion_text

log = logging.getLogger(__name__)


@dataclass
class StepRequest:
    """What the strategy asked of this node for one round."""

    round: int
    """0 = the first (generate-only) round; 1..num_rounds take an update each."""
    num_rounds: int
    prompt_indices: list[int]
    """Indices into the task's training set to generate groups for (may be empty)."""
    group_size: int
    """Completions per prompt this node samples (G, or G/m in horizontal mode)."""
    evaluate: bool
    foreign: list[Received] = field(default_factory=list)
    """What the server forwarded from other nodes' last round, already decoded and validated."""
    rejected: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Source -> (groups, samples) of its payload that failed decoding (counted, never silent)."""
    send_text: bool = False
    """Put the completions' texts on the wire: a peer with another tokenizer (or
    ``exchange.cross_tokenizer=always``) trains on them through the text (the server decides)."""


@dataclass
class StepResult:
    groups: list[Group]
    metrics: dict[str, float]
    rejections: list[str] = field(default_factory=list)
    """``"<source>: <reason>"`` per source and kind of rejected group, for the server's log."""
    samples: list[dict] = field(default_factory=list)
    """At evaluated rounds, ``report.samples_per_node`` of the new completions (prompt id, text,
    reward) for the trackers' tables."""


def sampling_seed(card_seed: int, run_seed: int, round_idx: int) -> int:
    """The torch seed of one node's sampling in one round: distinct per card, run and round."""
    return (int(card_seed) * 1_000_003 + int(run_seed) * 7_919_000_047 + int(round_idx)) % (2**63)


class Node:
    """A node's whole training state, driven one round at a time."""

    def __init__(self, card: ModelCard, experiment: ExperimentConfig, *, cache_dir: Path | None = None,
                 ranks: Ranks = SINGLE):
        """``ranks``: this process's place among the node's ranks (``card.ranks`` > 1: the learner
        is sharded over them, :mod:`ftis_flwr.node.sharding`); the default is one rank."""
        self.ranks = ranks
        card, self.dtype_note = resolve_dtypes(card)  # "auto": bfloat16 only where it is native
        if self.dtype_note:
            log.warning(self.dtype_note)
        self.card = card
        self.cfg = experiment
        torch.set_num_threads(card.torch_threads)
        torch.manual_seed(sampling_seed(card.seed, experiment.rounds.seed, 0))
        self.task = make_task(experiment.task)
        self.task_parts = task_parts(experiment.task, self.task)
        """What this node's rewards are computed from (the server checks every node agrees)."""
        self.memory_note = memory_warning(card, experiment)  # before building, not killed mid-run
        if self.memory_note:
            log.warning(self.memory_note)
        with ranks.leader_first():  # one rank warm-starts or converts into the shared cache
            self.policy = load_policy(card, task=self.task, cache_dir=cache_dir)
        self.model = self.policy.model
        """The learner (sharded over the ranks when there are several)."""
        self.engine_model = self.model
        """What the rollout engine samples from and the checkpoint is saved from: the learner
        itself on one rank, a plain copy refreshed after every update on several."""
        if ranks.sharded:
            from ftis_flwr.node.sharding import plain_copy, shard

            self.engine_model = plain_copy(self.model)
            groups = shard(self.model, card.device)
            log.info("node %s rank %d of %d: learner sharded in %d FSDP2 groups", card.name,
                     ranks.rank, ranks.world, groups)
        self.tokenizer = self.policy.tokenizer
        self.vocab_size = len(self.tokenizer)
        """The sampling vocabulary: the tokenizer's tokens, never the model's spare output rows."""
        self.stop_ids = stop_token_ids(self.tokenizer, self.model, card.stop_tokens)
        """Ids that end a completion; the first is this node's end-of-turn token in aligned text."""
        self.engine = make_engine(card.engine, self.engine_model, self.tokenizer, vocab_size=self.vocab_size,
                                  eos_token_ids=self.stop_ids, card=card,
                                  share_prompts=experiment.rollout.share_prompts,
                                  **engine_plan_options(card, experiment, self.engine_model))
        self.compute = compute_context(card)
        self.generate_metrics: dict[str, float] = {}
        self.fingerprint = tokenizer_fingerprint(self.tokenizer)
        self.align_fault = alignment_fault(self.tokenizer)
        """Why this node's tokenizer cannot train with another tokenizer ("" when it can)."""
        self.text_limits = "" if self.align_fault else describe_limits(text_limits(self.tokenizer))
        """What texts this node's tokens cannot stand for, so it refuses them from peers of another
        tokenizer ("" when it stands for any text): the server names each pairing at the start."""
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.base_lr = card.lr if card.lr is not None else experiment.train.lr
        self.optimizer = torch.optim.AdamW(self.params, lr=self.base_lr,
                                           weight_decay=experiment.train.weight_decay)
        self.pending: list[Group] = []
        self.updates = 0
        self.round = -1
        """The last round this node completed (-1: none yet); ftis_flwr.node.state saves it."""
        self.steps_run = 0
        """Rounds this process has run (a resumed node restores ``round``, not this)."""
        self._prompt_cache: dict[str, np.ndarray] = {}
        self.env = env_rollout.EnvironmentRollout(experiment, self.tokenizer, self.stop_ids, card.name) \
            if experiment.task.environment else None
        """The task's environment (``task.environment``): each group is G episodes (:mod:`.env_rollout`)."""
        log.info("node %s ready: %s (%d/%d trainable params)", card.name, self.policy.model_id,
                 self.policy.trainable_params, self.policy.total_params)

    # ------------------------------------------------------------------ round
    def step(self, req: StepRequest) -> StepResult:
        metrics: dict[str, float] = {"round": float(req.round)}
        if not self.steps_run:  # the first round this process runs: what "auto" chose, once
            metrics["ranks"] = float(self.ranks.world)
            metrics["weights_bfloat16"] = float(self.card.dtype == CardDtype.BFLOAT16)
            metrics["compute_bfloat16"] = float((self.card.compute_dtype or self.card.dtype) == CardDtype.BFLOAT16)
        for src, (n_groups, n_samples) in req.rejected.items():
            metrics[f"{src}/payloads_rejected"] = 1.0
            metrics[f"{src}/groups_rejected"] = float(n_groups)
            metrics[f"{src}/samples_rejected"] = float(n_samples)
        rejections: list[str] = []
        batch = list(self.pending)
        last_own = batch  # the last round's own groups: the samples table of a round that makes none
        if self.cfg.advantage.mode != AdvantageMode.ALONE:
            batch += self._usable(req.foreign, metrics, rejections)
        elif req.foreign:
            metrics["foreign_ignored_alone"] = float(sum(g.size for r in req.foreign for g in r.groups))
        t0 = time.perf_counter()
        if batch:
            metrics.update(self.train(batch, req.round, req.num_rounds))
            for key in [k for k in metrics if k.endswith("/rewards_corrected")]:
                rejections.append(f"{key.split('/')[0]}: {metrics[key]:.0f} sample(s) {protocol.REWARDS_NOTE} "
                                  "from this node's own scoring of their text; its own were used")
        metrics["seconds_train"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.pending = self.generate(req.prompt_indices, req.group_size, req.round, send_text=req.send_text)
        metrics["seconds_generate"] = time.perf_counter() - t0
        metrics.update(self.generate_metrics)
        if self.pending:
            metrics["reward_mean"] = float(np.mean(np.concatenate([g.rewards for g in self.pending])))
        if req.evaluate:
            t0 = time.perf_counter()
            metrics.update(self.evaluate())
            metrics["seconds_eval"] = time.perf_counter() - t0
        self.round = req.round
        self.steps_run += 1
        sent = self.pending
        if req.send_text:  # a payload carries every group's texts or none: the rest stay home
            sent = [g for g in self.pending if g.texts is not None]
            metrics["groups_unsent_no_text"] = float(len(self.pending) - len(sent))
        samples = self._sample_rows(self.cfg.report.samples_per_node, self.pending or last_own) \
            if req.evaluate else []
        return StepResult(groups=sent, metrics=metrics, rejections=rejections, samples=samples)

    # ---------------------------------------------------------------- helpers
    def _prompt_tokens(self, problem) -> np.ndarray:
        cached = self._prompt_cache.get(problem.id)
        if cached is None:
            ids = self.task.prompt_ids(problem, self.tokenizer)
            cached = self._prompt_cache[problem.id] = np.asarray(ids, dtype=np.int64)
        return cached

    def _sample_rows(self, k: int, groups: list[Group]) -> list[dict]:
        """The first completion of each of the first ``k`` of ``groups``, decoded, with its reward."""
        rows = []
        for g in groups[:max(k, 0)]:
            text = self.tokenizer.decode(g.completions[0].tolist(), skip_special_tokens=True)
            rows.append({"prompt": g.prompt_id, "completion": text[:2000], "reward": float(g.rewards[0])})
        return rows

    def _usable(self, received: list[Received], metrics: dict[str, float],
                reasons: list[str]) -> list[Group]:
        """Foreign groups this node may train on (:func:`ftis_flwr.node.intake.usable`)."""
        return usable(self, received, metrics, reasons)

    def _rewards(self, group: Group) -> np.ndarray:
        """Recomputed from the decoded text: a node never trusts a reward it did not compute."""
        if (group.sampled_masks is not None or self.env is not None) and group.node == self.card.name:
            return np.asarray(group.rewards, np.float32)  # its own episodes, scored here (env_rollout)
        if group.replayed_rewards is not None:  # a peer's episodes, scored here by replay (intake)
            return np.asarray(group.replayed_rewards, np.float32)
        problem = self.task.problem(group.prompt_id)
        texts = group.source_texts if group.source_texts is not None else \
            self.tokenizer.batch_decode([c.tolist() for c in group.completions], skip_special_tokens=True)
        return np.asarray(self.task.rewards(list(texts), [problem] * len(texts)), dtype=np.float32)

    def _lr_scale(self) -> float:
        warm = self.cfg.train.warmup_rounds
        return 1.0 if warm <= 0 else min(1.0, (self.updates + 1) / warm)

    # ------------------------------------------------------------------ train
    def train(self, groups: list[Group], round_idx: int, num_rounds: int) -> dict[str, float]:
        """One F-TIS update (``updates_per_round`` optimiser steps) on own + received groups.

        Every step after the first takes its ratio against the first step's log-probs (pi_old,
        kept on the CPU per micro-batch), and keeps the weights and filter decisions of the
        round start (:mod:`ftis_flwr.maths.loss`). Metrics describe the first step; ``*_last`` the last.
        """
        cfg = self.cfg
        rewards = [self._rewards(g) for g in groups]
        metrics: dict[str, float] = {}
        for g, r in zip(groups, rewards):  # a peer's claimed rewards are never used, only counted
            wrong = int(np.sum(np.abs(np.asarray(g.rewards, np.float32) - r) > 1e-6))
            if wrong and g.node != self.card.name:
                key = f"{g.node}/rewards_corrected"
                metrics[key] = metrics.get(key, 0.0) + wrong
        keys = self._group_keys(groups)
        samples = self._samples(groups, rewards)
        g_now = g_for_round(self.card.g, cfg.loss.kl_threshold, round_idx, num_rounds)
        loss_cfg = dataclasses.replace(cfg.loss, kl_threshold=g_now)
        for pg in self.optimizer.param_groups:
            pg["lr"] = self.base_lr * self._lr_scale()

        release = getattr(self.engine, "release_memory", None)  # an engine that sleeps (vLLM on a GPU)
        if release is not None:  # frees its memory for the update; sync_weights wakes it
            release()
        self.model.train()
        n_updates = cfg.train.updates_per_round
        batches = micro_batches(samples, cfg.train.micro_batch_size, self.ranks)
        old: list[torch.Tensor | None] = []  # per micro-batch pi_old log-probs (CPU), for updates >= 1
        for update in range(n_updates):
            denominator, grad_norm, stats = self._step(samples, batches, loss_cfg, old, update, metrics)
            if update == 0:  # the round-start policy: what the filter and the weights saw
                whole = LossStats.concat(stats)
                metrics.update(loss_metrics(whole, loss_cfg.trunc_c))
                metrics.update(own_gap(whole))
                metrics["grad_norm"] = grad_norm
            elif update == n_updates - 1:  # how far the policy moved within the round
                whole = LossStats.concat(stats)
                metrics["loss_last"] = whole.loss_sum / denominator if denominator > 0 else 0.0
                metrics["grad_norm_last"] = grad_norm
                frac = clip_frac(whole)
                if frac is not None:
                    metrics["clip_frac_last"] = frac
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        if self.ranks.sharded:  # the engine's plain copy takes the update
            t0 = time.perf_counter()
            sync_copy(self.engine_model, self.model)
            metrics["seconds_copy_sync"] = time.perf_counter() - t0
        sync = getattr(self.engine, "sync_weights", None)  # an engine with its own copy (vLLM)
        if sync is not None:
            metrics["seconds_engine_sync"] = float(sync(self.engine_model))
        own = [r for g, r in zip(groups, rewards) if g.node == self.card.name]
        foreign = [r for g, r in zip(groups, rewards) if g.node != self.card.name]
        metrics.update({
            "lr": self.base_lr * self._lr_scale(),
            "g": g_now,
            "frac_zero_std_groups": frac_zero_std_groups(pooled_rewards(rewards, keys)),
            "train_reward_own": float(np.mean(np.concatenate(own))) if own else float("nan"),
            "train_reward_foreign": float(np.mean(np.concatenate(foreign))) if foreign else float("nan"),
            "updates": float(self.updates),
        })
        return metrics

    def _step(self, samples: list[Sample], batches: list[list[Sample]], loss_cfg: LossConfig,
              old: list[torch.Tensor | None], update: int,
              metrics: dict[str, float]) -> tuple[float, float, list[LossStats]]:
        """One optimiser step over every micro-batch: returns the loss denominator summed over
        ranks, the clipped gradient norm, and the micro-batches' stats (every rank's on the first
        and last update, the ones the metrics describe). The first update fills ``old`` with its
        log-probs when more updates follow; the later ones take their ratios against them."""
        n_updates = self.cfg.train.updates_per_round
        self.optimizer.zero_grad(set_to_none=True)
        denominator = 0.0
        stats: list[LossStats] = []
        for k, part in enumerate(batches):
            if not part:  # a rank with fewer samples still runs every forward and backward
                out = compute_loss(self._loss_inputs(samples[:1]), loss_cfg, metrics=False)
                (out.loss_sum * 0.0).backward()  # (FSDP2 gathers and reduces in lockstep)
                if update == 0 and n_updates > 1:
                    old.append(None)
                continue
            inputs = self._loss_inputs(part, old[k] if update else None)
            out = compute_loss(inputs, loss_cfg, metrics=False)
            if out.denominator > 0 or self.ranks.sharded:
                out.loss_sum.backward()
            denominator += out.denominator
            stats.append(out.stats)
            if update == 0 and n_updates > 1:  # the forward the first update trains on
                old.append(inputs.logprobs.detach().to("cpu", copy=True))
        denominator = self.ranks.all_sum(denominator)
        if denominator > 0:
            # FSDP2 averages gradients over the ranks: the sum over every sample is world x that
            scale = denominator / self.ranks.world if self.ranks.sharded else denominator
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(scale)
        grad_norm = norm_value(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.train.grad_clip))
        if update in (0, n_updates - 1):  # the stats the metrics describe: every rank's
            stats = self.ranks.gather(stats)
        if denominator > 0 and math.isfinite(grad_norm):
            self.optimizer.step()
        elif not math.isfinite(grad_norm):
            log.warning("node %s: non-finite grad norm, step skipped", self.card.name)
            metrics["steps_skipped_nonfinite"] = metrics.get("steps_skipped_nonfinite", 0.0) + 1
        return denominator, grad_norm, stats

    def _group_keys(self, groups: list[Group]) -> list[str]:
        """Groups sharing a key share advantage statistics (only horizontal mode pools)."""
        horizontal = self.cfg.advantage.mode == AdvantageMode.HORIZONTAL
        return [g.prompt_id if horizontal else f"{g.node}|{g.prompt_id}|{i}" for i, g in enumerate(groups)]

    def _samples(self, groups: list[Group], rewards: list[np.ndarray]) -> list[Sample]:
        """One :class:`Sample` per completion, in group order. A refused completion
        (``Group.refused``) counts in its group's advantages and is left out here (counted at
        intake)."""
        adv_cfg = self.cfg.advantage
        advs = pooled_advantages(rewards, self._group_keys(groups), scale=adv_cfg.scale_rewards,
                                 eps=adv_cfg.eps)
        samples = []
        for g, adv in zip(groups, advs):
            foreign = g.node != self.card.name
            chunks = g.chunks if g.chunks is not None else [None] * g.size
            refused = g.refused if g.refused is not None else [""] * g.size
            masks = g.sampled_masks if g.sampled_masks is not None else [None] * g.size  # episodes
            for c, lp, a, ch, why, m in zip(g.completions, g.logprobs, adv, chunks, refused, masks):
                if not why:
                    samples.append(Sample(g.prompt_tokens, c, lp, float(a), foreign, g.node, ch, m))
        return samples

    def _loss_inputs(self, chunk: list[Sample], old: torch.Tensor | None = None) -> LossInputs:
        """One micro-batch's forward; ``old``: its pi_old log-probs from the round's first update."""
        return loss_inputs(self.model, chunk, old, pad_id=self.tokenizer.pad_token_id, vocab_size=self.vocab_size,
                           temperature=self.cfg.rollout.temperature, share_prompts=self.cfg.train.share_prompts,
                           sequence_ratio=self.cfg.loss.cross_tokenizer_ratio == CrossTokenizerRatio.SEQUENCE,
                           compute=self.compute)

    # --------------------------------------------------------------- generate
    def generate(self, indices: list[int], n: int, round_idx: int, *, send_text: bool = False) -> list[Group]:
        """G completions per prompt, with rewards; ``send_text``: each group also carries its
        completions' texts and byte lengths where it can (else ``texts`` stays None)."""
        if not indices:
            return []
        if self.env is not None:  # episodes (task.environment)
            seed = sampling_seed(self.card.seed, self.cfg.rounds.seed, round_idx)
            return env_rollout.generate(self, indices, n, seed, send_text=send_text)
        r = self.cfg.rollout
        problems = [self.task.train_problem(i) for i in self.ranks.share(indices)]  # this rank's prompts
        prompts = [self._prompt_tokens(p) for p in problems]
        with self.compute():
            samples = self.engine.sample(
                [p.tolist() for p in prompts], n, temperature=r.temperature, top_k=r.top_k,
                top_p=r.top_p, max_new_tokens=r.max_new_tokens, batch_size=r.batch_size,
                generator_seed=sampling_seed(self.card.seed, self.cfg.rounds.seed, round_idx) + self.ranks.rank)
        groups, dropped = [], 0
        for problem, prompt, group in zip(problems, prompts, samples):
            g = Group(
                prompt_id=problem.id, prompt_tokens=prompt,
                completions=[s.tokens for s in group], logprobs=[s.logprobs for s in group],
                rewards=np.zeros(len(group), dtype=np.float32), node=self.card.name,
                model_id=self.policy.model_id, tokenizer_fp=self.fingerprint)
            try:  # a group that cannot go on the wire is dropped and counted, never the whole reply
                g.validate(self.vocab_size)
            except PayloadError as exc:
                dropped += 1
                log.warning("node %s drops its own group %s: %s", self.card.name, problem.id, exc)
                continue
            g.rewards = self._rewards(g)
            if send_text:
                self._attach_texts(g)
            groups.append(g)
        self.generate_metrics = {"groups_dropped_unencodable": self.ranks.all_sum(float(dropped))}
        return self.ranks.gather(groups)

    def _attach_texts(self, g: Group) -> None:
        """Texts and byte lengths of ``g``'s completions (``Group.texts``), or none with a warning
        when one cannot be put on the wire (a token that stands for no text; a completion cut
        inside a multi-byte character is not valid UTF-8)."""
        texts, lengths = [], []
        masks = g.sampled_masks or [None] * g.size  # an episode: the text of its model and tool turns
        for ids, mask in zip(g.completions, masks):
            try:
                text, lens = completion_text(self.tokenizer, ids, self.stop_ids, mask)
            except TokenBytesError as exc:
                why = str(exc)
            else:
                why = text_fault(text, lens, len(ids), None if mask is None else span_ends(mask))
            if why:
                log.warning("node %s: group %s goes without its texts (peers of another tokenizer "
                            "cannot use it): %s", self.card.name, g.prompt_id, why)
                return
            texts.append(text)
            lengths.append(lens)
        g.texts, g.byte_lengths = texts, lengths

    # --------------------------------------------------------------- evaluate
    def evaluate(self) -> dict[str, float]:
        """Greedy pass@1 on each held-out split (algorithm §9), with two signs of answers that
        stopped depending on the problem: the share of distinct answers (one answer for every
        problem: 1 / n) and the share with full credit (a task with partial credit can pay a
        model that never answers right)."""
        out = {}
        size = self.cfg.rounds.eval_size
        for split in self.task.eval_splits:
            problems = self.task.problems(split)
            problems = self.ranks.share(problems[:size] if size else problems)  # this rank's problems
            scores, answers = self._eval_answers(problems)
            scores, answers = self.ranks.gather(scores), self.ranks.gather(answers)
            out[f"eval/{split}/accuracy"] = float(np.mean(scores)) if scores else float("nan")
            out[f"eval/{split}/full_credit"] = float(np.mean([s >= 1.0 for s in scores])) if scores else float("nan")
            out[f"eval/{split}/distinct"] = len(set(answers)) / len(answers) if answers else float("nan")
        return out

    def _eval_answers(self, problems: list) -> tuple[list[float], list[str]]:
        """Each problem's greedy score and stripped answer: one completion, or one greedy episode
        with ``task.environment`` (:func:`.env_rollout.evaluate`)."""
        with self.compute():
            if self.env is not None:
                return env_rollout.evaluate(self, problems)
            prompts = [self._prompt_tokens(p).tolist() for p in problems]
            completions = self.engine.greedy(prompts, max_new_tokens=self.cfg.rollout.max_new_tokens,
                                             batch_size=self.cfg.rollout.batch_size)
        texts = self.tokenizer.batch_decode([c.tolist() for c in completions], skip_special_tokens=True)
        return list(self.task.rewards(list(texts), problems)), [t.strip() for t in texts]

    def save(self, out_dir: Path) -> Path:
        """The final model, whole (rank 0 writes it; the others return the same path)."""
        if not self.ranks.leader:
            return Path(out_dir)
        return save_policy(dataclasses.replace(self.policy, model=self.engine_model), Path(out_dir))

