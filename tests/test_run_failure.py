"""A failing reward or node ends a run cleanly (issue #56): the reason once, on one line, naming the
node and the reward; the run's summary and plot are written for a failed run too, the failure
first; a node that failed every round fails the run. The strategy and the ServerApp's ``run`` are
driven through test_strategy's fake Grid (the seam), with Flower Messages as a ClientApp sends them;
the real ``flwr run`` is tests/test_run_failure_flwr.py."""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app import Error, Message, RecordDict
from test_strategy import FakeGrid, experiment, honest, run

from ftis_flwr.node.host.handle import WorkerError
from ftis_flwr.server.replies import short_reason
from ftis_flwr.server.roster import Roster
from ftis_flwr.server.run_failure import RunFailed, failed_throughout, reward_stop
from ftis_flwr.wire import protocol

REWARD_ERROR = "node worker failed 'step': RewardError: reward '/tmp/bad.py:reward' raised ValueError: boom"
RAY_WRAPPED = ("<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor.run()"
               "\x1b[39m (pid=1, ip=192.0.2.2)\n  File \"client_app.py\", line 136, in train\n    reply = "
               "handle.call(...)\nftis_flwr.node.host.handle.WorkerError: " + REWARD_ERROR + "\n\nThe above exception "
               "was the direct cause of the following exception:\n\nException ClientAppException occurred. "
               "Message: " + REWARD_ERROR + "'>")


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """Flower stamps new Messages with the running app's ids; outside an app, set them."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)


def reward_fails(msg, name):
    """A node whose reward raises, as the ClientApp answers it (an error reply, the worker's words)."""
    if msg.metadata.message_type != "train":
        return Message(Error(code=2, reason="node worker failed 'finish': no"), reply_to=msg)
    return Message(Error(code=2, reason=REWARD_ERROR), reply_to=msg)


def test_a_reason_is_cut_to_the_words_that_say_it():
    assert short_reason(RAY_WRAPPED) == "RewardError: reward '/tmp/bad.py:reward' raised ValueError: boom"
    assert short_reason(f"<class 'WorkerError'>:<'{REWARD_ERROR}'>") == short_reason(REWARD_ERROR)
    built = "node worker failed 'finish': the node could not be built:\nTraceback:\n  File x\nOSError: gone"
    assert short_reason(built) == "the node could not be built: OSError: gone"
    assert short_reason("payload rejected: Message: kept") == "payload rejected: Message: kept"  # not a wrapper


def test_a_reward_that_raises_is_said_once_for_every_node_it_failed_on():
    line = reward_stop(3, {"a": f"code 2: {REWARD_ERROR}", "b": f"code 2: {RAY_WRAPPED}", "c": "code 2: other"})
    assert line.startswith("round 3: the reward failed on nodes a and b: reward '/tmp/bad.py:reward' raised "
                           "ValueError: boom. The run stopped at once")
    assert line.count("boom") == 1 and "\n" not in line and "Fix the reward function" in line
    assert reward_stop(3, {"c": "code 2: WorkerError: the node could not be built: OSError: x"}) == ""


def test_a_line_naming_several_nodes_names_them_in_the_federations_order():
    """Replies arrive in any order (a full-suite run once read "nodes lora and full"): the roster
    puts the nodes back in the order the federation declares them, an unbound node last."""
    roster = Roster(["small", "large"])
    roster.names.update({7: "large", 3: "small"})
    failures = {7: f"code 2: {REWARD_ERROR}", 9: f"code 2: {REWARD_ERROR}", 3: f"code 2: {REWARD_ERROR}"}
    assert list(roster.by_card(failures)) == ["small", "large", "node-9"]
    assert reward_stop(0, roster.by_card(failures)).startswith("round 0: the reward failed on nodes small, "
                                                                "large and node-9: reward")


def test_the_strategy_stops_after_the_round_a_reward_failed_in_and_tells_the_workers(caplog):
    """Node b's reward raises in round 0: the round is logged (a's metrics, b's failure event), then
    the run stops with one line naming b, the reward and the exception; every node is told to stop
    its worker, and no per-node warning repeats the reason."""
    grid = FakeGrid(honest(special={2: reward_fails}))
    exp = experiment(**{"rounds.num_rounds": 3})
    with caplog.at_level(logging.WARNING, logger="ftis_flwr.server.strategy"):
        strategy, events = run(exp, grid, raises=(RunFailed, r"^round 0: the reward failed on node b: reward "
                                                             r"'/tmp/bad.py:reward' raised ValueError: boom\."))
    assert [sorted(h.node_metrics) for h in strategy.history] == [["a"]]
    assert [(k, f["node"], f["round"]) for k, f in events if k == "node_failed"] == [("node_failed", "b", 0)]
    assert not grid.train_messages(1)  # no second round
    assert {m.metadata.dst_node_id for m in grid.pushed if protocol.STOP in m.content} == {1, 2}
    assert "boom" not in caplog.text


def test_a_node_failing_for_another_reason_fails_its_round_only():
    def crashes(msg, name):
        if msg.metadata.message_type != "train":
            return None
        return Message(Error(code=2, reason="node worker failed 'step': MemoryError: out"), reply_to=msg)

    strategy, events = run(experiment(), FakeGrid(honest(special={2: crashes})))
    assert len(strategy.history) == 3 and all(set(h.node_metrics) == {"a"} for h in strategy.history)
    assert [f["reason"] for k, f in events if k == "node_failed"] == ["code 2: MemoryError: out"] * 3


def test_a_node_that_replied_in_no_round_is_named_with_its_last_reason():
    rows = [{"round": r, "nodes": {"a": {}}} for r in range(3)]
    events = [{"event": "node_failed", "node": "b", "round": r, "reason": f"code 2: {RAY_WRAPPED}"} for r in range(3)]
    line = failed_throughout(rows, events, ["a", "b"])
    assert line.startswith("node b failed every round (rounds 0-2), so the run's results are the other nodes' "
                           "alone; last reason: b: code 2: RewardError: reward")
    assert failed_throughout(rows[:1] + [{"round": 1, "nodes": {"a": {}, "b": {}}}], events, ["a", "b"]) == ""
    assert failed_throughout([], events, ["a", "b"]) == ""


def _server_run(exp, grid, capsys):
    from server_app.server_app import run as server_run

    with pytest.raises(RunFailed) as failed:
        server_run(grid, exp, connect_timeout=0)
    return str(failed.value), capsys.readouterr().out


def test_the_server_app_writes_a_failed_runs_summary_and_plot_failure_first(tmp_path, capsys):
    exp = experiment(**{"rounds.num_rounds": 3, "run_dir": str(tmp_path), "report.to": ["none"]})
    why, out = _server_run(exp, FakeGrid(honest(special={2: reward_fails})), capsys)
    (run_dir,) = tmp_path.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failure"] == why and summary["last_round"] == 0 and summary["num_rounds"] == 3
    md = (run_dir / "summary.md").read_text().split("\n\n")
    assert md[2] == f"**Run failed:** {why}" and md[3].startswith("Rounds: 0 of 3 (1 logged")
    assert (run_dir / "plot.png").read_bytes()[:4] == b"\x89PNG"
    said = [line for line in out.splitlines() if "boom" in line]
    assert said == [f"ftis-flwr: the run failed: {why} (metrics, plot and summary in {run_dir})"]
    assert "| node |" not in out  # the tables are in summary.md; the stream says why, once


def test_a_run_whose_node_failed_every_round_completes_its_outputs_then_fails(tmp_path, capsys):
    def crashes(msg, name):
        if msg.metadata.message_type != "train":
            return None
        return Message(Error(code=2, reason="node worker failed 'step': the node could not be built:\n"
                                            "Traceback (most recent call last):\nOSError: no model"), reply_to=msg)

    exp = experiment(**{"run_dir": str(tmp_path), "report.to": ["none"]})
    why, out = _server_run(exp, FakeGrid(honest(special={2: crashes})), capsys)
    (run_dir,) = tmp_path.iterdir()
    assert why.startswith("node b failed every round (rounds 0-2)") and why.endswith(
        "last reason: b: code 2: the node could not be built: OSError: no model (each reason is in events.jsonl)")
    assert json.loads((run_dir / "summary.json").read_text())["failure"] == why
    assert out.splitlines()[-1] == f"ftis-flwr: the run failed: {why} (metrics, plot and summary in {run_dir})"
    assert "| a | " in out and "**Run failed:**" not in out  # the run's tables, then its verdict once


def test_flowers_log_of_a_failed_run_carries_no_traceback():
    from server_app.server_app import _FILTER

    try:
        raise RunFailed("round 0: x")
    except RunFailed as exc:
        record = logging.LogRecord("flwr", logging.ERROR, __file__, 1, "ServerApp raised an exception", (),
                                   (RunFailed, exc, exc.__traceback__))
    assert _FILTER.filter(record) and record.exc_info is None
    assert record.getMessage() == ("ServerApp raised an exception: the run failed (why: the `ftis-flwr: the run "
                                   "failed` line above)")


def test_the_client_app_answers_a_failed_worker_with_an_error_reply_not_an_exception():
    from clients.client_app import worker_errors

    def handler(msg, context):
        raise WorkerError(REWARD_ERROR)

    msg = Message(content=RecordDict(), dst_node_id=1, message_type="train")
    reply = worker_errors(handler)(msg, None)
    assert reply.has_error() and reply.error.code == 2 and reply.error.reason == REWARD_ERROR
