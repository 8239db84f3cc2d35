"""The Flower ClientApp: a thin adapter that forwards each message to this node's worker.

It holds no model and no maths. It works out which node it is (``card`` in the node config in
deployment, ``partition-id`` in simulation), finds or starts that node's long-lived worker
(``ftis_flwr.node.host.worker``) and relays the round: received groups in, new groups + metrics out.

Flower routes each message by its type: ``train`` to :func:`train`, and ``query.<action>`` to the
function registered with ``@app.query("<action>")`` (:data:`QUERIES`: hello, build, stop, finish),
so a query this app does not serve fails in Flower with ``No query function registered with name
'<action>'`` instead of reaching another handler.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from ftis_flwr.config.merge import card_from_dict, from_dict
from ftis_flwr.config.plan import build_notes
from ftis_flwr.config.schema import ExperimentConfig, ModelCard, default_cache_dir, to_dict
from ftis_flwr.node.host.handle import PING_TIMEOUT, WorkerError, WorkerTimeout, connect_or_spawn, stop_worker
from ftis_flwr.node.host.processes import safe_name, worker_dir
from ftis_flwr.wire import protocol

app = ClientApp()


class NoCard(ValueError):
    """This SuperNode serves no model card of the experiment (it is left out of the run)."""


def select_card(experiment: ExperimentConfig, node_config: dict) -> ModelCard:
    """Deployment: ``--node-config 'card="<name or YAML path>"'``; simulation: partition-id.

    NoCard when the SuperNode names no card (or its partition has none); ValueError when it names
    a card the experiment does not define.
    """
    wanted = node_config.get("card")
    if wanted:
        for card in experiment.nodes:
            if card.name == wanted:
                return card
        path = Path(str(wanted)).expanduser()
        if path.is_file():
            from omegaconf import OmegaConf

            return card_from_dict(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
        names = ", ".join(c.name for c in experiment.nodes)
        raise ValueError(f"node config card={wanted!r} is neither a model card in the experiment "
                         f"({names}) nor a YAML file; restart this SuperNode with "
                         f"--node-config 'card=\"<one of: {names}>\"'")
    if "partition-id" not in node_config:
        raise NoCard("this SuperNode has neither a 'card' nor a 'partition-id' in its node config; "
                     "to take part, start it with --node-config 'card=\"<card name or YAML file>\"'")
    pid = int(node_config["partition-id"])
    if not 0 <= pid < len(experiment.nodes):
        raise NoCard(f"partition-id {pid} has no model card: the experiment defines "
                     f"{len(experiment.nodes)} nodes; run with num-supernodes={len(experiment.nodes)}")
    return experiment.nodes[pid]


def _worker_env(card: ModelCard) -> dict[str, str]:
    env = {"OMP_NUM_THREADS": str(card.torch_threads), "MKL_NUM_THREADS": str(card.torch_threads)}
    if card.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif card.device.startswith("cuda:"):
        env["CUDA_VISIBLE_DEVICES"] = card.device.split(":", 1)[1]
    return env


@functools.lru_cache(maxsize=4)
def experiment_of(text: str) -> ExperimentConfig:
    """The run's experiment from a message's JSON, parsed and validated once per process (read
    only: every message of a run carries the same text). OmegaConf's structured merge takes about
    0.1 s; in simulation the ClientApp's Ray actor lives for the whole run, so this is paid once
    instead of once a round. An invalid text raises every time (failures are not cached)."""
    return from_dict(json.loads(text))


def _worker(msg_config: ConfigRecord, context: Context):
    experiment = experiment_of(str(msg_config["experiment"]))
    card = select_card(experiment, dict(context.node_config))
    cache = default_cache_dir(experiment.cache_dir).resolve()
    run_key = str(msg_config.get("run_name") or context.run_id)
    spec = {"card": to_dict(card), "experiment": to_dict(experiment), "cache_dir": str(cache),
            "idle_timeout": experiment.idle_timeout()}
    handle = connect_or_spawn(worker_dir(cache, run_key, card.name), spec, env=_worker_env(card))
    # a worker that has not built its node yet may warm-start or load first: the start-up allowance
    timeout = experiment.rounds.round_timeout + (0 if handle.ready else experiment.rounds.startup_timeout)
    return card, handle, timeout


def step_payload(msg: Message) -> dict:
    """The worker's ``step`` request for a round message; foreign groups keyed by the server's stamp."""
    cfg = msg.content[protocol.ROUND]
    foreign = {}  # source as the server stamped it -> (arrays, meta, train indices it assigned)
    for src, indices in json.loads(str(cfg.get("foreign", "{}"))).items():
        arrays_key, meta_key = protocol.foreign_keys(src)
        foreign[src] = (msg.content[arrays_key], msg.content[meta_key], [int(i) for i in indices])
    return {
        "round": int(cfg["round"]), "num_rounds": int(cfg["num_rounds"]),
        "prompt_indices": [int(i) for i in json.loads(str(cfg["prompt_indices"]))],
        "group_size": int(cfg["group_size"]), "evaluate": bool(cfg["evaluate"]),
        "send_text": bool(cfg.get("send_text", False)), "foreign_payloads": foreign,
        "next_within": float(cfg.get("next_within", 0.0)),
    }


def worker_errors(handler):
    """A handler whose worker failed (its error, a reward that raised, no answer in time) answers
    with an error reply carrying the worker's reason, instead of raising: Flower logs a raised
    exception's traceback through every layer (Ray's and its own), once per node, before the
    server can say what failed. The traceback is in the worker's log."""

    @functools.wraps(handler)
    def wrapped(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except WorkerError as exc:
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(exc)), reply_to=msg)
    return wrapped


@app.train()
@worker_errors
def train(msg: Message, context: Context) -> Message:
    """One round: the worker trains on the received groups and answers with its new groups,
    metrics and info (see protocol.ROUND, GROUPS, METRICS, INFO).

    Args:
        msg: The server's round message: ``protocol.ROUND`` (round, prompt indices, the
            experiment...) and the other nodes' groups under their stamped keys.
        context: Flower's context: its node config names this SuperNode's card (``card``, or
            ``partition-id`` in simulation).

    Returns:
        The reply: this node's new groups (``protocol.GROUPS``, ``GROUPS_META``), its metrics
            (``METRICS``, with ``clientapp_seconds``) and ``INFO`` (name, tokenizer, rejections...).

        A worker that failed the round (its error, a reward that raised) or did not answer in
        time (it is killed; the next message starts a new one, which resumes from its saved
        state) makes the reply an error with the worker's reason (:func:`worker_errors`).
    """
    t0 = time.perf_counter()
    card, handle, timeout = _worker(msg.content[protocol.ROUND], context)
    try:
        reply = handle.call("step", step_payload(msg), timeout=timeout)
    except WorkerTimeout as exc:  # hung (or hopelessly slow): replaced, it resumes from its state
        handle.kill(str(exc))
        raise
    starts = (handle.directory / "starts.log").read_text().count("\n")
    # this ClientApp's share of the round: the worker's request plus finding and reaching it
    reply["metrics"]["clientapp_seconds"] = time.perf_counter() - t0
    content = RecordDict({
        protocol.GROUPS: reply["arrays"],
        protocol.GROUPS_META: reply["meta"],
        protocol.METRICS: MetricRecord({k: float(v) for k, v in reply["metrics"].items()}),
        protocol.INFO: ConfigRecord({"node": reply["node"], "model_id": reply["model_id"],
                                     "tokenizer_fp": reply.get("tokenizer_fp", ""),
                                     "align_fault": reply.get("align_fault", ""),
                                     "text_limits": reply.get("text_limits", ""),
                                     "task_parts": reply.get("task_parts", ""),
                                     "samples": reply.get("samples", ""),
                                     "rejections": list(reply["rejections"]) or [""],
                                     "worker_pid": handle.pid, "worker_starts": starts}),
    })
    return Message(content=content, reply_to=msg)


@app.query("stop")
def stop(msg: Message, context: Context) -> Message:
    """Stop this node's worker for the run, if one runs; never start one (see protocol.STOP).

    Args:
        msg: The server's ``query.stop`` message (``protocol.STOP``: the experiment, run name).
        context: Flower's context (the node config names the card).

    Returns:
        ``protocol.STOP``: the card's ``node`` name and whether a worker was ``stopped``.
    """
    cfg = msg.content[protocol.STOP]
    experiment = experiment_of(str(cfg["experiment"]))
    card = select_card(experiment, dict(context.node_config))
    cache = default_cache_dir(experiment.cache_dir).resolve()
    stopped = stop_worker(worker_dir(cache, str(cfg.get("run_name") or context.run_id), card.name))
    return Message(content=RecordDict({protocol.STOP: ConfigRecord({"node": card.name, "stopped": stopped})}),
                   reply_to=msg)


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    """Name this SuperNode's card without building anything (see protocol.HELLO).

    Args:
        msg: The server's ``query.hello`` message (``protocol.HELLO``: the experiment).
        context: Flower's context (the node config names the card).

    Returns:
        ``protocol.HELLO``: the card's ``node`` name ("" when it serves none), the ``reason``
            it serves none, whether the card it names is ``unknown`` to the experiment, and
            ``notes`` on its dtype and memory for the server's log.
    """
    experiment = experiment_of(str(msg.content[protocol.HELLO]["experiment"]))
    answer = {"node": "", "reason": "", "unknown": False, "notes": ""}
    try:
        card = select_card(experiment, dict(context.node_config))
        answer["node"] = card.name
    except NoCard as exc:
        answer["reason"] = str(exc)
    except ValueError as exc:
        answer.update(reason=str(exc), unknown=True)
    else:
        try:  # what the worker will say before it builds, said now to the server's stream
            answer["notes"] = "\n".join(build_notes(card, experiment))
        except Exception as exc:  # a note that cannot be made never keeps a node out
            answer["notes"] = f"node {card.name}: could not check its dtype and memory ({type(exc).__name__}: {exc})"
    return Message(content=RecordDict({protocol.HELLO: ConfigRecord(answer)}), reply_to=msg)


@app.query("build")
@worker_errors
def build(msg: Message, context: Context) -> Message:
    """Start this node's worker if none runs and have it build the model in the background; answer
    at once with how far it is (see protocol.BUILD).

    Args:
        msg: The server's ``query.build`` message (``protocol.BUILD``: the experiment, run name).
        context: Flower's context (the node config names the card).

    Returns:
        ``protocol.BUILD``: the card's ``node`` name, the build's ``state`` (ready, building, failed
            or idle), its ``seconds`` so far, its ``progress`` and any ``error``.
    """
    card, handle, _ = _worker(msg.content[protocol.BUILD], context)
    status = handle.call("build", timeout=PING_TIMEOUT)
    answer = {"node": card.name, "state": str(status["state"]), "seconds": float(status["seconds"]),
              "progress": str(status["progress"]), "error": str(status["error"])}
    return Message(content=RecordDict({protocol.BUILD: ConfigRecord(answer)}), reply_to=msg)


def checkpoint_dir(server_out_dir: str, run_name: str, card: str, node_config: dict) -> Path:
    """Where this node saves its final model. The node decides: ``out-dir`` in its node config
    (``<out-dir>/<run name>/<card>``), else the server's absolute ``out_dir`` (``<out_dir>/<card>``);
    a relative or ``..``-climbing path from the server is refused."""
    own = str(node_config.get("out-dir", "") or "")
    if own:
        return Path(own).expanduser().resolve() / safe_name(run_name) / safe_name(card)
    path = Path(server_out_dir)
    if not path.is_absolute() or ".." in path.parts:
        raise ValueError(f"the server asked to save the model under {server_out_dir!r}, which is not a "
                         "plain absolute path; give this SuperNode --node-config 'out-dir=\"<folder>\"'")
    return path / safe_name(card)


@app.query("finish")
@worker_errors
def finish(msg: Message, context: Context) -> Message:
    """Have the worker save the final model where this node decides (:func:`checkpoint_dir`) and
    stop; answer with the checkpoint's path (see protocol.FINISH, CHECKPOINT).

    Args:
        msg: The server's ``query.finish`` message (``protocol.FINISH``: the experiment, run
            name and the server's ``out_dir``).
        context: Flower's context (the node config names the card, and may give ``out-dir``).

    Returns:
        ``protocol.CHECKPOINT``: the card's ``node`` name, the model's ``path`` and the
            worker's number of ``updates``.
    """
    cfg = msg.content[protocol.FINISH]
    card, handle, timeout = _worker(cfg, context)
    out_dir = checkpoint_dir(str(cfg["out_dir"]), str(cfg.get("run_name") or context.run_id), card.name,
                             dict(context.node_config))
    out = handle.call("finish", {"out_dir": str(out_dir)}, timeout=timeout)
    content = RecordDict({protocol.CHECKPOINT: ConfigRecord({"node": card.name, "path": out["checkpoint"],
                                                             "updates": int(out["updates"])})})
    return Message(content=content, reply_to=msg)


QUERIES = {"hello": hello, "build": build, "stop": stop, "finish": finish}
"""Query action -> its handler: the server's ``"query.<action>"`` messages reach these."""


def serve_queries(other: ClientApp) -> ClientApp:
    """Register :data:`QUERIES` on another ClientApp (one that wraps :func:`train`, as the attack
    studies' forger does), so it answers the server's queries as this app does."""
    for action, handler in QUERIES.items():
        other.query(action)(handler)
    return other
