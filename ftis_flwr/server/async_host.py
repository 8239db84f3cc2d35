"""What the asynchronous rounds need of the strategy whose rounds they run, declared.

Why a declaration: :class:`~ftis_flwr.server.async_rounds.AsyncRounds` reuses the strategy's message
building and reply handling, and keeps its own schedule in the strategy's fields (the prompt
schedule, the groups per card, the result); these are private to the strategy, so the contract
between the two is written here, where a change to either side shows, and a test checks that
:class:`~ftis_flwr.server.strategy.FTISStrategy` meets it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from flwr.serverapp import Grid

from ftis_flwr.config.schema import ExperimentConfig
from ftis_flwr.server.roster import Roster
from ftis_flwr.server.state import ServerState


@runtime_checkable
class AsyncHost(Protocol):
    """What :class:`AsyncRounds` reads and calls on the strategy whose rounds it runs
    (:class:`~ftis_flwr.server.strategy.FTISStrategy` sets or defines each of these), as
    :class:`~ftis_flwr.server.lifecycle.LifecycleHost` declares the lifecycle mixin's. It writes
    ``_result``, ``_next_prompt``, ``_groups``, ``_first_round``, ``_lost`` and ``step_word``."""

    cfg: ExperimentConfig
    """The run's experiment: its rounds, exchange and cards."""
    roster: Roster
    """Node id <-> model card."""
    state_dir: str
    """Where the server state is saved after each step ("" : not saved)."""
    on_round: Any
    """``on_round(round, node_metrics, server_metrics)`` after each step, or None."""
    on_event: Callable[..., None]
    """``on_event(kind, **fields)``: a run event for the report."""
    history: list
    """One outcome per round (step) handled."""
    tasks: Any
    """The nodes' task fingerprints, compared (:class:`~ftis_flwr.server.task_agreement.TaskAgreement`)."""
    rejections: Any
    """Rejected groups per source (:class:`~ftis_flwr.server.rejections.Rejections`)."""
    peers: Any
    """The nodes' tokenizers, for texts (:class:`~ftis_flwr.server.peer_tokenizers.PeerTokenizers`)."""
    step_word: str
    """"round" or, once these rounds run, "step": how the per-round line names one."""
    _async_state: ServerState | None
    """A resumed run's saved state (its store of groups per node), else None."""
    _result: Any
    """The run's result, rebuilt by these rounds (the strategy returns it)."""
    _lost: dict[int, str]
    """Node id -> why the last exchange got no reply from it."""
    _sent: dict[str, int]
    """Message id -> destination node id, for the reply's checks."""
    _received: dict[int, dict[str, float]]
    """Node id -> the foreign groups and bytes sent to it."""
    _next_prompt: int
    """The schedule's next train index."""
    _groups: dict
    """Card -> its last groups as sent (arrays, meta, indices)."""
    _first_round: int
    """The first round this session runs (after a resume: the saved round + 1)."""

    def next_prompts(self) -> list[int]:
        """The schedule's next prompt indices."""
        ...

    def message(self, nid: int, rnd: int, prompts: list[int], others: dict, evaluate: bool | None = None,
                limit: float | None = None, **received: float) -> Any:
        """Node ``nid``'s message of its round ``rnd``."""
        ...

    def unsent(self, nid: int, rnd: int, exc: Exception) -> str:
        """Why a node's message could not be built."""
        ...

    def bound_nodes(self, grid: Grid) -> list[int]:
        """The node ids bound to a card, in card order."""
        ...

    def introduce(self, grid: Grid, timeout: float, *, first: bool) -> None:
        """HELLO (and BUILD) to nodes not yet bound."""
        ...

    def aggregate_train(self, server_round: int, replies: Any) -> tuple[Any, Any]:
        """A round's replies handled: binding, checks, rejections, metrics."""
        ...
