"""The trackers of ``report.to`` (:mod:`ftis_flwr.server.reporting.trackers`), each against its real
package: MLflow through a real ``mlflow server`` (SQLite store) read back with ``MlflowClient``,
W&B in offline mode read back from the run file it writes, TensorBoard from its event files; a
tracker that fails is left out and the run's reports still complete; ``ftis-flwr check`` names
an unknown tracker and a missing package."""

import glob
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

from ftis_flwr.config import validation
from ftis_flwr.config.choices import TRACKERS
from ftis_flwr.config.schema import ExperimentConfig
from ftis_flwr.server.reporting import trackers
from ftis_flwr.server.reporting.reporter import RunReporter
from ftis_flwr.server.reporting.summary import load_events, load_metrics

CONFIG = {"loss": {"method": "f-tis", "trunc_c": 2.0}, "report": {"to": ["mlflow"]},
          "nodes": [{"name": "a", "lr": None}, {"name": "b+1", "lr": 1e-4}], "note": "x" * 7000}
ROUNDS = [(0, {"a": {"reward_mean": 0.1, "eval/test/accuracy": 0.40}, "b+1": {"reward_mean": 0.2}}),
          (1, {"a": {"reward_mean": 0.3, "eval/test/accuracy": math.nan}, "b+1": {"reward_mean": 0.25}}),
          (2, {"a": {"reward_mean": 0.5, "eval/test/accuracy": 0.55}, "b+1": {"reward_mean": 0.35}})]


def _report(run_dir: Path, report_to: list[str]):
    with RunReporter(run_dir, config=CONFIG, node_names=["a", "b+1"], report_to=report_to) as rep:
        for rnd, nodes in ROUNDS:
            rep.log_round(rnd, nodes, {"bytes_per_token": 3.5 + rnd})
        rep.log_table(2, "samples", ["node", "prompt", "completion", "reward"],
                      [["a", "12+3", "<answer>15</answer>", 1.0], ["b+1", "4-1", "3 | 2", 0.0]])
        return rep.finish()


# ----------------------------------------------------------------------------- registry
def test_the_check_time_names_are_the_registry_s():
    assert TRACKERS == trackers.tracker_names()


def test_registry_refuses_a_second_class_and_lists_the_valid_names(monkeypatch):
    monkeypatch.setattr(trackers, "_TRACKERS", dict(trackers._TRACKERS))
    trackers.register_tracker("mlflow", trackers.MlflowTracker)  # the same class again: fine
    with pytest.raises(trackers.TrackerError, match="already registered"):
        trackers.register_tracker("mlflow", trackers.WandbTracker)
    with pytest.raises(trackers.TrackerError, match="tensorboard, mlflow, wandb, none"):
        trackers.get_tracker("comet")
    with pytest.raises(trackers.TrackerError, match="unknown tracker 'comet'"):
        RunReporter(Path("/nonexistent/never-made"), config={}, node_names=["a"], report_to=["comet"])


def test_params_are_flat_strings_cut_to_mlflow_s_limit():
    flat = trackers.flatten_params(CONFIG)
    assert flat["loss.method"] == "f-tis" and flat["loss.trunc_c"] == "2.0"
    assert flat["report.to"] == '["mlflow"]' and flat["nodes.1.name"] == "b+1" and flat["nodes.0.lr"] == "null"
    assert len(flat["note"]) == 6000


def test_importing_the_server_imports_no_tracker_package():
    code = ("import sys, ftis_flwr.server.reporting.reporter, ftis_flwr.server.reporting.trackers, "
            "ftis_flwr.config.validation; "
            "print(sorted(m for m in ('mlflow', 'wandb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_none_means_no_tracker_and_the_reports_are_still_written(tmp_path):
    s = _report(tmp_path / "run", ["none"])
    assert not (tmp_path / "run" / "tensorboard").exists() and "tensorboard" not in s.paths
    assert [r["round"] for r in load_metrics(tmp_path / "run")] == [0, 1, 2]
    assert (tmp_path / "run" / "summary.md").exists() and (tmp_path / "run" / "plot.png").exists()


def test_tensorboard_gets_the_same_scalars_as_before(tmp_path):
    pytest.importorskip("torch.utils.tensorboard")
    s = _report(tmp_path / "run", ["tensorboard"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(s.paths["tensorboard"])).Reload()
    assert [e.value for e in acc.Scalars("a/reward_mean")] == pytest.approx([0.1, 0.3, 0.5])
    assert [e.step for e in acc.Scalars("a/eval/test/accuracy")] == [0, 2]  # NaN: not logged
    assert "server/bytes_per_token" in acc.Tags()["scalars"]


# ----------------------------------------------------------------------------- MLflow
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` on a free port, stopped by its process group (ours) afterwards."""
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        ["mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--default-artifact-root", str(root / "artifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{uri}/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"mlflow server did not answer: {(root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


@pytest.mark.slow
def test_mlflow_run_read_back_from_a_real_server(tmp_path, monkeypatch, mlflow_server):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "ftis-flwr-test")
    s = _report(tmp_path / "run-mlflow", ["mlflow"])
    run_id = s.paths["mlflow_run_id"]
    assert s.paths["mlflow_tracking_uri"] == mlflow_server
    assert json.loads((tmp_path / "run-mlflow" / "summary.json").read_text())["paths"]["mlflow_run_id"] == run_id
    assert mlflow.active_run() is None  # nothing left on the fluent API's stack

    client = mlflow.MlflowClient(mlflow_server)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run-mlflow"
    assert client.get_experiment(run.info.experiment_id).name == "ftis-flwr-test"
    history = client.get_metric_history(run_id, "a/reward_mean")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(0, 0.1), (1, 0.3), (2, 0.5)]
    assert [m.step for m in client.get_metric_history(run_id, "a/eval/test/accuracy")] == [0, 2]
    assert [m.value for m in client.get_metric_history(run_id, "b_1/reward_mean")] == [0.2, 0.25, 0.35]
    assert run.data.params["loss.method"] == "f-tis" and run.data.params["nodes.1.lr"] == "0.0001"
    assert len(run.data.params["note"]) == 6000
    files = {f.path for f in client.list_artifacts(run_id)}
    assert {"summary.md", "summary.json", "plot.png", "samples.json"} <= files
    md = Path(client.download_artifacts(run_id, "summary.md", str(tmp_path)))
    assert md.read_text() == (tmp_path / "run-mlflow" / "summary.md").read_text()
    table = json.loads(Path(client.download_artifacts(run_id, "samples.json", str(tmp_path))).read_text())
    assert table["columns"][:3] == ["node", "prompt", "completion"] and len(table["data"]) == 2


@pytest.mark.slow
def test_a_run_that_fails_marks_the_mlflow_run_failed(tmp_path, monkeypatch, mlflow_server):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    with pytest.raises(KeyError):
        with RunReporter(tmp_path / "r", config={}, node_names=["a"], report_to=["mlflow"]) as rep:
            rep.log_round(0, {"a": {"reward_mean": 1.0}}, {})
            run_id = rep.trackers.locations()["mlflow_run_id"]
            raise KeyError("boom")
    client = mlflow.MlflowClient(mlflow_server)
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.info.run_name == "r"
    assert client.get_experiment(run.info.experiment_id).name == "ftis-flwr"  # the default name


# ----------------------------------------------------------------------------- W&B
def _wandb_records(path: Path):
    """The records of a W&B run file (``run-<id>.wandb``): a LevelDB-style log of protobuf
    ``Record`` messages in 32 KiB blocks, after a 7-byte header (":W&B", magic, version)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):  # block trailer / padding
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a FULL record, or the LAST chunk of one
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


@pytest.mark.slow
def test_wandb_offline_run_read_back_from_its_files(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "ftis-flwr-test")
    s = _report(tmp_path / "run-wandb", ["wandb"])
    run_dir = Path(s.paths["wandb"])
    assert run_dir.name.startswith("offline-run-") and run_dir.parent == tmp_path / "run-wandb" / "wandb"
    files = run_dir / "files"
    for name in ("summary.md", "summary.json", "plot.png"):
        assert (files / name).read_bytes() == (tmp_path / "run-wandb" / name).read_bytes()
    assert glob.glob(str(files / "media" / "table" / "samples_2_*.table.json"))

    deadline = time.monotonic() + 60  # wandb's own service process writes the file: on a loaded
    while True:                       # machine the last records land a moment after finish()
        records = list(_wandb_records(next(run_dir.glob("run-*.wandb"))))
        # by reads records when called: after the loop, the last read's (the complete file), as intended
        by = lambda kind: [r for r in records if r.WhichOneof("record_type") == kind]  # noqa: E731, B023
        if by("exit") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    run = by("run")[0].run
    assert run.display_name == "run-wandb" and run.project == "ftis-flwr-test"
    config = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for r in by("config")
              for i in r.config.update}
    assert config["loss"] == {"method": "f-tis", "trunc_c": 2.0}
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in by("history")]
    assert [(h["_step"], h["a/reward_mean"]) for h in history] == [(0, 0.1), (1, 0.3), (2, 0.5)]
    assert ["a/eval/test/accuracy" in h for h in history] == [True, False, True]  # NaN: not logged
    assert history[2]["samples/_type"] == "table-file" and history[2]["samples/nrows"] == 2
    assert [r.exit.exit_code for r in by("exit")] == [0]


# ----------------------------------------------------------------------------- failures
class _Broken(trackers.Tracker):
    """A real tracker that goes away after its first round (as a server that stops would)."""

    calls: list = []

    @classmethod
    def open(cls, run_dir, run_name, config):
        return cls()

    def log_metrics(self, step, metrics):
        self.calls.append(step)
        if step >= 1:
            raise ConnectionError("server went away")


def test_a_tracker_that_fails_is_left_out_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setitem(trackers._TRACKERS, "broken", _Broken)
    _Broken.calls = []
    with pytest.warns(RuntimeWarning, match=r"tracker broken failed \(ConnectionError: server went away\)") as got:
        s = _report(tmp_path / "run", ["broken", "none"])
    assert len([w for w in got if "broken" in str(w.message)]) == 1
    assert _Broken.calls == [0, 1]  # not called again after it failed
    assert [r["round"] for r in load_metrics(tmp_path / "run")] == [0, 1, 2] and s.rounds == 3
    assert (tmp_path / "run" / "summary.md").exists() and (tmp_path / "run" / "plot.png").exists()
    failed = [e for e in load_events(tmp_path / "run") if e["event"] == "tracker_failed"]
    assert [(e["tracker"], e["error"]) for e in failed] == [("broken", "ConnectionError: server went away")]


def test_an_mlflow_server_that_does_not_answer_never_stops_the_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_free_port()}")  # nothing listens
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    with pytest.warns(RuntimeWarning, match="tracker mlflow failed"):
        s = _report(tmp_path / "run", ["mlflow"])
    assert "mlflow_run_id" not in s.paths and (tmp_path / "run" / "summary.json").exists()
    assert [e["tracker"] for e in load_events(tmp_path / "run") if e["event"] == "tracker_failed"] == ["mlflow"]


def test_a_tracker_package_missing_at_run_time_is_warned_about(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails
    with pytest.warns(UserWarning, match="wandb unavailable .*pip install wandb"):
        s = _report(tmp_path / "run", ["wandb"])
    assert "wandb" not in s.paths and (tmp_path / "run" / "summary.md").exists()


# ----------------------------------------------------------------------------- check time
def _errors(to):
    cfg = ExperimentConfig()
    cfg.report.to = to
    return validation.report_errors(cfg)


def test_check_names_unknown_trackers_and_none_with_another():
    assert _errors(["tensorboard"]) == [] and _errors(["none"]) == []
    (err,) = _errors(["tensorboard", "comet"])
    assert "report.to=" in err and "'comet'" in err and "tensorboard, mlflow, wandb, none" in err
    (err,) = _errors(["none", "tensorboard"])
    assert "'none'" in err and "combined" in err
    cfg = ExperimentConfig()
    cfg.report.to = ["comet"]
    assert any("comet" in e for e in validation.experiment_errors(cfg, import_registries=False))


def test_check_names_a_tracker_whose_package_is_missing(monkeypatch):
    real = validation._find_spec

    # The narrow seam: validation's own find_spec answers "not installed" for wandb alone.
    monkeypatch.setattr(validation, "_find_spec", lambda name: None if name == "wandb" else real(name))
    cfg = ExperimentConfig()
    cfg.report.to = ["tensorboard", "wandb"]
    assert validation.report_errors(cfg) == []  # a node needs no tracker: not its question
    (err,) = validation.tracker_package_errors(cfg)
    assert "report.to=" in err and "'wandb'" in err
    assert "pip install wandb" in err and 'pip install -e ".[trackers]"' in err


def test_report_to_from_a_flat_override():
    from ftis_flwr.experiment import load_run_config

    exp = load_run_config({"preset": "cpu-pair", "overrides": "report.to=mlflow,wandb"})
    assert exp.report.to == ["mlflow", "wandb"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_run_config({"preset": "cpu-pair"}).report.to == ["tensorboard"]


# ----------------------------------------------------------------------------- where the store goes
def test_mlflow_without_a_tracking_uri_keeps_its_store_in_the_run_folder(tmp_path, monkeypatch):
    """Issue #56: without ``MLFLOW_TRACKING_URI`` MLflow's default wrote ``mlflow.db`` and ``mlruns/``
    into the working directory of the ServerApp's process (the repository, for a local SuperLink
    started there). The store is now the run's own, in its folder; the working directory stays empty."""
    pytest.importorskip("mlflow")
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cwd = tmp_path / "where-the-superlink-started"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    s = _report(tmp_path / "run", ["mlflow"])
    assert list(cwd.iterdir()) == []
    store = tmp_path / "run" / "mlflow"
    assert s.paths["mlflow_tracking_uri"] == f"sqlite:///{store / 'mlflow.db'}"
    run = mlflow.MlflowClient(s.paths["mlflow_tracking_uri"]).get_run(s.paths["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    (md,) = store.glob("artifacts/*/artifacts/summary.md")
    assert md.read_text() == (tmp_path / "run" / "summary.md").read_text()


def test_a_users_sqlite_store_keeps_a_new_experiments_artifacts_beside_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mine' / 'mlflow.db'}")
    assert trackers.mlflow_store(tmp_path / "run") == (f"sqlite:///{tmp_path / 'mine' / 'mlflow.db'}",
                                                       (tmp_path / "mine" / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert trackers.mlflow_store(tmp_path / "run") == ("http://127.0.0.1:5000", None)  # the server's own
