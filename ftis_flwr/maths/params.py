"""The maths' own settings and their allowed values: plain dataclasses, ``str`` Enums and tuples, no torch.

:class:`LossConfig` and :class:`GSchedule` are what the loss family and the g schedule read; the
experiment's configuration (:mod:`ftis_flwr.config.schema`) composes them, so the maths never
imports the configuration. The vocabularies the maths implements are ``str`` Enums (a member equals
its plain string, so configurations and JSON keep strings while the code compares with members and
a typo fails at attribute lookup), with their values as tuples; each number's bounds are declared
on its field (``metadata`` ``gt``/``ge``/``lt``/``le``). The configuration validates against both
without importing torch (:mod:`ftis_flwr.config.validation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


def names(choice: type[StrEnum]) -> tuple[str, ...]:
    """A choice's values as plain strings, in declaration order: what configurations, JSON and the
    wire carry (a member equals its string, so code compares the values with the members)."""
    return tuple(str(member.value) for member in choice)


BUILTIN_LOSSES = ("nois", "vis", "tis", "f-nois", "f-vis", "f-tis")
"""``loss.method`` names :mod:`ftis_flwr.maths.loss` registers itself (more with ``register_loss``)."""


class Scale(StrEnum):
    """``advantage.scale_rewards``: divide by the group std, or mean-centre only."""

    GROUP = "group"
    NONE = "none"


class FilterRule(StrEnum):
    """``loss.filter_rule``: filter when A<=0 and/or KL>g."""

    AND = "and"
    OR = "or"


class FilterScope(StrEnum):
    """``loss.filter_scope``: which samples the filter may drop."""

    FOREIGN = "foreign"
    ALL = "all"


class FilterAction(StrEnum):
    """``loss.filter_action``: zero a filtered sample's advantage, or drop it from the loss."""

    ZERO = "zero"
    DROP = "drop"


class KlEstimator(StrEnum):
    """``loss.kl_estimator``: the per-token KL estimate the filter sums."""

    K3 = "k3"
    K1 = "k1"


class Reduction(StrEnum):
    """``loss.reduction``: mean per sequence then over sequences, or over all tokens."""

    SEQUENCE = "sequence"
    TOKEN = "token"


class CrossTokenizerRatio(StrEnum):
    """``loss.cross_tokenizer_ratio``: per aligned chunk, per chunk merged to word boundaries, or
    one per completion from mean log-probs."""

    CHUNK = "chunk"
    WORD = "word"
    SEQUENCE = "sequence"


class GKind(StrEnum):
    """``nodes.N.g.kind``: a constant g, or linear from ``start`` to ``end`` over the rounds."""

    CONSTANT = "constant"
    LINEAR = "linear"


SCALES = names(Scale)
FILTER_RULES = names(FilterRule)
FILTER_SCOPES = names(FilterScope)
FILTER_ACTIONS = names(FilterAction)
KL_ESTIMATORS = names(KlEstimator)
REDUCTIONS = names(Reduction)
CROSS_TOKENIZER_RATIOS = names(CrossTokenizerRatio)
G_KINDS = names(GKind)


@dataclass
class LossConfig:
    """The F-TIS loss family and its filter (algorithm §5-6)."""

    method: str = "f-tis"
    """Loss method: a name in ``ftis_flwr.maths.loss.LOSS_REGISTRY`` (built in: nois, vis, tis, f-nois,
    f-vis, f-tis; add one with ``register_loss``) or an import path "package.module:function"
    ("f-package.module:function" = filtered), imported on first use. Default f-tis (paper)."""
    trunc_c: float = field(default=2.0, metadata={"gt": 0})
    """C: the truncated importance weight is min(pi_theta/pi_gen, C). Default 2 (paper)."""
    clip_eps: float = field(default=0.2, metadata={"gt": 0, "lt": 1})
    """eps of the PPO-style clip used by vis and tis. Default 0.2 (paper)."""
    kl_threshold: float = field(default=50.0, metadata={"ge": 0})
    """g: a sample whose per-sequence KL estimate exceeds g may be filtered. Default 50 (paper).
    Overridden each round by the node's g schedule when one is set on its model card."""
    filter_rule: str = "and"
    """"and": filter when A<=0 and KL>g (what the authors ran, default); "or": A<=0 or KL>g."""
    filter_scope: str = "foreign"
    """"foreign" (default): filter received samples only; "all": own samples too."""
    filter_action: str = "zero"
    """"zero" (default, paper): the filtered sample's advantage is 0 but it stays in the
    denominator; "drop": it is removed from the loss and its denominator."""
    kl_estimator: str = "k3"
    """Per-token KL estimator: "k3" = exp(d)-d-1 (default, paper) or "k1" = d, d = gen - lp."""
    reduction: str = "sequence"
    """"sequence" (default, paper): mean over a sequence's tokens, then over sequences;
    "token": sum of token losses / number of tokens (Dr.GRPO-style)."""
    cross_tokenizer_ratio: str = "chunk"
    """How a sample from a peer with another tokenizer is weighted (cross-tokenizer F-TIS,
    algorithm §4): "chunk" (default) takes w and the filter's KL per aligned chunk (the chain rule over
    byte-aligned runs of tokens); "word" takes them per chunk too, with the chunks merged until
    every chunk boundary is also a word boundary (a change between whitespace, letters, digits and
    other characters), so no chunk ends mid-word (as ALM, arXiv 2503.20083); "sequence" uses one
    ratio per completion from the two sides' per-token *mean* log-probs (as HACPO, arXiv
    2603.02604). "word" and "sequence" are kept as the ablation."""


@dataclass
class GSchedule:
    """Per-node filter threshold g over rounds (algorithm §6, beyond the paper)."""

    kind: str = "constant"
    """"constant" (default: LossConfig.kl_threshold) or "linear" from start to end."""
    start: float = field(default=50.0, metadata={"ge": 0})
    """g at the first round (linear)."""
    end: float = field(default=50.0, metadata={"ge": 0})
    """g at the last round (linear)."""
