"""RunReporter end to end on a hand-written sequence of rounds, in a real tmp run dir."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from ftis_flwr.server.reporting.reporter import RunReporter
from ftis_flwr.server.reporting.summary import final_line, format_summary_table, load_events, load_metrics

NODES = ["a", "b", "c"]  # c never evaluates


def _node(reward, filtered=3, foreign=48, test=None, ood=None, **more):
    m = {"reward_mean": reward, "filtered": filtered, "samples": 96, "samples_foreign": foreign,
         "loss": 0.01, "grad_norm": 0.3, "seconds": 4.2, "b/filtered": 2, **more}
    if test is not None:
        m["eval/test/accuracy"] = test
    if ood is not None:
        m["eval/ood/accuracy"] = ood
    return m


# Eval every 2 rounds. Node b fails in round 4 (an eval round), so its last eval is round 6.
ROUNDS = [
    (1, {"a": _node(0.10), "b": _node(0.20, filtered=1), "c": _node(0.05)}),
    (2, {"a": _node(0.30, test=0.40, ood=0.10), "b": _node(0.25, test=0.50, ood=0.30),
         "c": _node(0.06)}),
    (3, {"a": _node(0.35), "b": _node(float("nan")), "c": _node(0.07)}),
    (4, {"a": _node(0.41, test=0.55, ood=0.20), "c": _node(0.08)}),
    (5, {"a": _node(0.45), "b": _node(0.52), "c": _node(0.09, foreign=0)}),
    (6, {"a": _node(0.50, test=0.70, ood=0.25), "b": _node(0.60, test=0.65, ood=float("inf")),
         "c": _node(0.10)}),
]
SERVER = {"bytes_per_token": 8.3, "round_seconds": 5.1, "nodes_replied": 3, "nodes_failed": 0}


def _run(tmp_path, rounds=ROUNDS, **kw):
    lines = []
    with RunReporter(tmp_path / "run", config={"preset": "unit", "lr": 1e-5, "nodes": NODES},
                     node_names=NODES, num_rounds=len(rounds), **kw) as rep:
        for r, nodes in rounds:
            lines.append(rep.log_round(r, nodes, SERVER))
        rep.log_event("checkpoint", node="a", path="/tmp/ckpt/a", round=6)
        summary = rep.finish({"checkpoints": {"a": "/ckpt/a", "b": "/ckpt/b"}})
    return lines, summary


def test_metrics_jsonl_config_and_events(tmp_path):
    _run(tmp_path, tensorboard=False)
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["lr"] == 1e-5
    rows = load_metrics(run)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[2]["nodes"]["b"]["reward_mean"] is None  # NaN -> null
    assert rows[5]["nodes"]["b"]["eval/ood/accuracy"] is None  # inf -> null
    assert rows[3]["missing_nodes"] == ["b"] and "b" not in rows[3]["nodes"]
    assert rows[0]["nodes"]["a"]["filtered"] == 3 and rows[0]["server"] == SERVER
    assert "NaN" not in (run / "metrics.jsonl").read_text()
    events = load_events(run)
    assert events[0]["event"] == "checkpoint" and events[0]["path"] == "/tmp/ckpt/a"


def test_progress_line(tmp_path):
    lines, _ = _run(tmp_path, tensorboard=False)
    assert lines[0] == ("round 1/6 | a: reward 0.10 filt 6% | b: reward 0.20 filt 2% | "
                        "c: reward 0.05 filt 6% | 8.3 B/tok | 5.1 s")
    assert "acc" not in lines[0]  # no eval this round
    assert "a: reward 0.41 acc test 0.55 ood 0.20" in lines[3]
    assert "b: FAILED" in lines[3]
    assert "b: reward nan" in lines[2]
    assert "c: reward 0.09 |" in lines[4]  # samples_foreign == 0: no filter percentage


def test_summary_numbers_and_files(tmp_path):
    _, s = _run(tmp_path, tensorboard=False)
    assert s.rounds == 6 and s.splits == ["test", "ood"]
    a, b, c = (s.accuracy[n] for n in NODES)
    assert (a["test"].first, a["test"].last) == (0.40, 0.70)
    assert (a["test"].first_round, a["test"].last_round) == (2, 6)
    assert a["test"].delta == pytest.approx(30.0)
    assert (b["test"].first, b["test"].last, b["test"].last_round) == (0.50, 0.65, 6)
    assert (b["ood"].first, b["ood"].last, b["ood"].last_round) == (0.30, 0.30, 2)  # inf skipped
    assert c["test"].first is None and c["test"].delta is None
    assert s.mean_delta["test"] == pytest.approx((30.0 + 15.0) / 2)
    assert s.mean_last["ood"] == pytest.approx((0.25 + 0.30) / 2)
    assert s.reward["b"].last == 0.60 and s.reward["c"].first == 0.05

    run = tmp_path / "run"
    data = json.loads((run / "summary.json").read_text())
    assert data["accuracy"]["a"]["test"]["last"] == 0.70
    assert data["accuracy"]["c"]["ood"]["first"] is None
    assert data["mean"]["test"]["delta_points"] == pytest.approx(22.5)
    assert data["checkpoints"] == {"a": "/ckpt/a", "b": "/ckpt/b"}
    md = (run / "summary.md").read_text()
    assert md.endswith(format_summary_table(s))
    assert "| a | test | 0.400 (r2) | 0.700 (r6) | +30.0 |" in md
    assert "| c | test | n/a | n/a | n/a |" in md
    assert "| **mean** | test | 0.450 | 0.675 | +22.5 |" in md
    assert "- b: `/ckpt/b`" in md

    png = (run / "plot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000


def test_tensorboard_event_files(tmp_path):
    pytest.importorskip("torch.utils.tensorboard")
    _, s = _run(tmp_path)
    tb = s.paths["tensorboard"]
    files = list(tb.glob("events.out.tfevents.*"))
    assert files and files[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tb)).Reload()
    assert [e.value for e in acc.Scalars("a/reward_mean")] == pytest.approx(
        [0.10, 0.30, 0.35, 0.41, 0.45, 0.50])
    assert [e.step for e in acc.Scalars("b/eval/test/accuracy")] == [2, 6]
    assert "server/bytes_per_token" in acc.Tags()["scalars"]


def test_zero_rounds_and_no_eval(tmp_path):
    _, s = _run(tmp_path, rounds=[], tensorboard=False)
    assert s.rounds == 0 and s.splits == [] and s.mean_delta == {}
    assert load_metrics(tmp_path / "run") == []
    assert "No evaluation was recorded." in (tmp_path / "run" / "summary.md").read_text()
    assert (tmp_path / "run" / "plot.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_input_and_lifecycle(tmp_path):
    rep = RunReporter(tmp_path / "r", config={}, node_names=["a"], tensorboard=False)
    with pytest.raises(ValueError, match="unknown nodes \\['z'\\]"):
        rep.log_round(1, {"z": {}}, {})
    with pytest.raises(TypeError, match="'reward_mean'"):
        rep.log_round(1, {"a": {"reward_mean": "high"}}, {})
    assert rep.log_round(1, {"a": {"reward_mean": 1}}, {}) == "round 1 | a: reward 1.00"
    with pytest.raises(ValueError, match="not after"):
        rep.log_round(1, {"a": {}}, {})
    rep.close()
    with pytest.raises(RuntimeError, match="after finish"):
        rep.log_round(2, {"a": {}}, {})
    with pytest.raises(FileExistsError):
        RunReporter(tmp_path / "r", config={}, node_names=["a"], tensorboard=False)
    RunReporter(tmp_path / "r", config={}, node_names=["a"], tensorboard=False,
                overwrite=True).close()
    assert load_metrics(tmp_path / "r") == []


def test_context_manager_closes_on_exception(tmp_path):
    with pytest.raises(KeyError):
        with RunReporter(tmp_path / "r", config={}, node_names=["a"], tensorboard=False) as rep:
            rep.log_round(1, {"a": {"reward_mean": math.nan}}, {})
            raise KeyError("boom")
    assert rep._metrics.closed and rep._events.closed
    assert load_metrics(tmp_path / "r")[0]["nodes"]["a"]["reward_mean"] is None


def test_runs_without_tensorboard_and_warns_once(tmp_path, monkeypatch):
    import sys

    import ftis_flwr.server.reporting.reporter as reporting
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails
    monkeypatch.setattr(reporting, "_TB_WARNED", False)
    with pytest.warns(UserWarning, match="TensorBoard unavailable"):
        _, s = _run(tmp_path / "one")
    assert "tensorboard" not in s.paths and (tmp_path / "one" / "run" / "plot.png").exists()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run(tmp_path / "two")  # second reporter: no second warning


def test_a_node_missing_the_first_evaluation_is_flagged_never_compared_from_later(tmp_path):
    """Round 0 evaluates every node; one that failed it must not report a change from round 2."""
    with RunReporter(tmp_path, config={}, node_names=["a", "b"], tensorboard=False) as rep:
        rep.log_round(0, {"a": {"eval/test/accuracy": 0.5}}, {})  # b failed round 0
        rep.log_round(1, {"a": {}, "b": {}}, {})
        rep.log_round(2, {"a": {"eval/test/accuracy": 0.7}, "b": {"eval/test/accuracy": 0.9}}, {})
        s = rep.finish()
    b = s.accuracy["b"]["test"]
    assert b.no_start and b.first is None and b.delta is None and b.last == 0.9
    assert s.mean_delta["test"] == pytest.approx(20.0)  # a's change alone, not b's 0.9 from nowhere
    md = (tmp_path / "summary.md").read_text()
    assert "| b | test | n/a (no r0 eval: not compared) | 0.900 (r2) | n/a |" in md
    assert json.loads((tmp_path / "summary.json").read_text())["accuracy"]["b"]["test"]["no_start_eval"]


def test_the_summary_counts_every_failure_and_rejection_the_events_name(tmp_path):
    with RunReporter(tmp_path, config={}, node_names=["a", "b"], tensorboard=False) as rep:
        rep.log_round(0, {"a": {"reward_mean": 0.5}, "b": {"reward_mean": 0.4}}, {})
        rep.log_event("node_failed", round=1, node="b", reason="payload rejected by the server: x")
        rep.log_event("payload_rejected", round=1, node="server", source="b", groups=2, samples=8, reason="x")
        rep.log_event("payload_rejected", round=2, node="a", source="b", groups=1, samples=4, reason="y")
        rep.log_event("payload_rejected", round=3, node="a", source="b", groups=2, samples=8, reason="y")
        rep.log_event("rewards_corrected", round=3, node="a", source="b", samples=5)
        rep.log_event("checkpoint", node="a", path="/x")  # not an incident
        summary = rep.finish()
    rows = {(r["event"], r["who"], r["by"]): r for r in summary.incidents}
    assert set(rows) == {("node_failed", "b", ""), ("payload_rejected", "b", "server"),
                         ("payload_rejected", "b", "a"), ("rewards_corrected", "b", "a")}
    assert rows[("payload_rejected", "b", "a")] == {"event": "payload_rejected", "who": "b", "by": "a", "times": 2,
                                                    "rounds": [2, 3], "groups": 3.0, "samples": 12.0}
    assert rows[("rewards_corrected", "b", "a")]["samples"] == 5.0
    data = json.loads((tmp_path / "summary.json").read_text())
    assert len(data["incidents"]) == 4
    md = (tmp_path / "summary.md").read_text()
    assert "| payload_rejected | b | server | 1 | 1 | 2 | 8 |" in md
    assert "| node_failed | b | - | 1 | 1 | 0 | 0 |" in md
    assert "Rounds logged: 1; failed node rounds: b 1 (round 1)" in md  # the first line says so too
    assert final_line(summary, "/r").startswith("ftis-flwr: finished with failed node rounds: b 1 (round 1); ")


def test_the_plot_shows_the_cross_tokenizer_share_only_where_text_path_samples_were_received(tmp_path):
    from ftis_flwr.server.reporting.plots import _panels, _xtok_share, plot_run

    plain = [{"round": 1, "nodes": {"a": {"kl_mean_foreign": 3e5}}}]
    xtok = [{"round": 1, "nodes": {"a": {"b/xtok_tokens": 30.0, "b/xtok_multi_token_share": 0.5,
                                         "c/xtok_tokens": 10.0, "c/xtok_multi_token_share": 0.1}}}]
    assert _xtok_share(xtok[0]["nodes"]["a"]) == pytest.approx((0.5 * 30 + 0.1 * 10) / 40)
    assert [t for t, *_ in _panels([], xtok)][-1].startswith("Cross-tokenizer")
    assert not any(t.startswith("Cross-tokenizer") for t, *_ in _panels([], plain))
    plot_run(tmp_path / "p.png", "t", ["a"], [], xtok + [{"round": 2, "nodes": {"a": {"kl_mean_foreign": 2.0}}}])
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_the_plot_shows_the_received_weights_health():
    """The ESS of the received weights and the farthest source's |log-ratio| p99 (own ~0)."""
    from ftis_flwr.server.reporting.plots import _panels, _worst_tail

    m = {"ess": 0.8, "a/abs_log_ratio_p99": 0.01, "b/abs_log_ratio_p99": 3.5, "c/abs_log_ratio_p99": float("nan")}
    panels = {t: get for t, get, *_ in _panels([], [])}
    assert panels["Effective sample size of received samples' weights"](m) == 0.8
    assert panels["Received |log-ratio| p99, farthest source"](m) == 3.5 == _worst_tail(m)
    assert _worst_tail({"ess": 1.0}) is None


# ----------------------------------------------------------------------------- issue #56
def _xtok_config(task: dict) -> dict:
    return {"preset": "cpu-xtok", "task": task, "advantage": {"mode": "vertical"}, "loss": {"method": "f-tis"},
            "nodes": [{"name": "small", "source": "tiny", "tiny_tokenizer": "char", "warmstart_ops": "+-"},
                      {"name": "bpe", "source": "tiny", "tiny_tokenizer": "bpe", "warmstart_ops": "+-"}]}


def test_a_node_whose_reward_stayed_at_zero_is_named_first_with_why(tmp_path):
    """The cross-tokenizer preset's BPE node on a task that is not arithmetic: 0.00 every round while
    its partner earns. The summary's first lines name it, what the other earned and the two usual
    causes (its warm start, a reward that never pays); a node at zero in half its rounds is not named."""
    config = _xtok_config({"name": "dataset", "dataset": "json", "data_files": {"train": "/d/words/train.jsonl"}})
    with RunReporter(tmp_path, config=config, node_names=["small", "bpe"], num_rounds=5, tensorboard=False) as rep:
        for r in range(6):
            rep.log_round(r, {"small": {"reward_mean": 0.0 if r % 2 else 0.3}, "bpe": {"reward_mean": 0.0}}, {})
        summary = rep.finish()
    (warning,) = summary.warnings
    assert warning.startswith("bpe's training reward was 0 in 6 of its 6 rounds: with rewards of 0 or more, every "
                              "completion of its groups scored 0, so their advantages were 0")
    for said in ("The other nodes earned small 0.15 on average on the same task, so the task does pay",
                 "its model's warm start (a tiny model (bpe tokenizer) warm-started on 2-digit arithmetic (+-) "
                 "only) may never write this task's (words) answers",
                 "or the task's own reward (dataset) may never pay what this model writes",
                 "samples/bpe"):
        assert said in warning, said
    md = (tmp_path / "summary.md").read_text().split("\n\n")
    assert md[2] == f"**Warning:** {warning}"
    assert json.loads((tmp_path / "summary.json").read_text())["warnings"] == [warning]


def test_a_named_reward_and_a_real_model_are_named_in_the_zero_reward_warning():
    from ftis_flwr.server.reporting.reward_health import zero_reward

    rows = [{"round": r, "nodes": {"m": {"reward_mean": 0.0}}} for r in range(3)]
    config = {"task": {"name": "dataset", "reward": "/x/r.py:reward"}, "nodes": [{"name": "m", "source": "org/m"}]}
    (line,) = zero_reward(rows, config)
    assert "No other node earned a reward either" in line and "its model (org/m) may not write answers" in line
    assert "the reward (/x/r.py:reward) may never pay" in line
    assert zero_reward(rows[:2], config) == []  # two rounds are too few to say


def test_round_counts_agree_in_the_progress_line_the_summary_and_the_plot_title(tmp_path, monkeypatch):
    """A run of 2 rounds logs rounds 0, 1 and 2: "round 2/2", "Rounds: 2 of 2 (3 logged: ...)" and a
    title "(2 rounds)", where the title used to say 3."""
    from matplotlib.figure import Figure

    titles = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (titles.append(fig._suptitle.get_text()),
                                                                   real(fig, *a, **k))[1])
    config = _xtok_config({"name": "arithmetic"})
    with RunReporter(tmp_path, config=config, node_names=["small", "bpe"], num_rounds=2, tensorboard=False) as rep:
        lines = [rep.log_round(r, {"small": {"reward_mean": 0.5}, "bpe": {"reward_mean": 0.5}}, {}) for r in range(3)]
        rep.finish()
    assert lines[-1].startswith("round 2/2 | ")
    assert "Rounds: 2 of 2 (3 logged: round 0 only generates and evaluates the starting models)" in \
        (tmp_path / "summary.md").read_text()
    assert titles == ["arithmetic on cpu-xtok: vertical f-tis (2 rounds)"]


def test_the_folder_and_title_carry_the_task_or_the_run_name():
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.server.reporting.run_names import run_name, run_title, task_label

    own_task = Path(__file__).resolve().parent.parent / "docs" / "own-task"
    own = load_experiment("cpu-pair", overrides={"task.name": "dataset", "task.dataset": "json",
                                                 "task.data_files.train": str(own_task / "train.jsonl"),
                                                 "task.data_files.test": str(own_task / "test.jsonl")})
    assert re.fullmatch(r"\d{8}-\d{6}-own-task-cpu-pair-vertical-f-tis-[0-9a-f]{4}", run_name(own))
    named = load_experiment("cpu-pair", overrides={"report.run_name": "lr sweep/3"})
    assert re.fullmatch(r"\d{8}-\d{6}-lr_sweep_3-[0-9a-f]{4}", run_name(named))
    from ftis_flwr.config.schema import to_dict

    assert run_title(to_dict(named)) == "lr sweep/3: arithmetic on cpu-pair: vertical f-tis"
    assert task_label({"name": "reasoning-gym:chain_sum"}) == "chain_sum"
    assert task_label({"name": "/home/me/tasks.py:my_task"}) == "my_task"
    assert task_label({"name": "dataset", "dataset": "org/gsm-hard"}) == "gsm-hard"
    assert task_label({"name": "dataset", "dataset": "csv", "data_files": {"train": "/d/sums.csv"}}) == "sums"


def test_a_failed_runs_plot_says_why_under_its_title(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    titles = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (titles.append(fig._suptitle.get_text()),
                                                                   real(fig, *a, **k))[1])
    with RunReporter(tmp_path, config=_xtok_config({"name": "arithmetic"}), node_names=["small", "bpe"],
                     num_rounds=40, tensorboard=False) as rep:
        rep.log_round(0, {}, {})
        summary = rep.finish(failure="round 0: the reward failed on nodes small and bpe: boom")
    assert summary.failure and titles[0].startswith("arithmetic on cpu-xtok: vertical f-tis (failed, last round "
                                                   "logged 0 of 40)\nRun failed: round 0: the reward failed")
