"""End to end: a real Flower simulation of two tiny heterogeneous nodes exchanging groups."""

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import simulate

from ftis_flwr.experiment import load_experiment
from ftis_flwr.server.reporting.summary import load_metrics

pytestmark = pytest.mark.slow

TINY_FEDERATION = """
rounds: {num_rounds: 2, prompts_per_node: 4, eval_every: 1, eval_size: 16, round_timeout: 300}
rollout: {group_size: 4, max_new_tokens: 6, batch_size: 64}
train: {lr: 1e-3, micro_batch_size: 32}
# one base model (the offline default's shipped small model: no warm-start here) shared by a full
# and a LoRA node: heterogeneous budgets; at ~60% its groups have reward variance
nodes:
  - {name: full, tiny_size: small, warmstart_target: 0.6, seed: 0}
  - {name: lora, tiny_size: small, warmstart_target: 0.6, seed: 0, lora: true,
     lora_config: {r: 8, alpha: 16}, lr: 1e-2}
"""


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """Two rounds, three SuperNodes for two cards; the LoRA node's worker is killed with SIGKILL
    after round 1 (between rounds)."""
    root = tmp_path_factory.mktemp("e2e")
    exp = load_experiment(yaml_text=TINY_FEDERATION,
                          overrides={"cache_dir": str(root / "cache"), "run_dir": str(root / "runs")})

    def kill_lora_worker(rnd, node_metrics):
        if rnd == 1:
            (address,) = (root / "cache").glob("workers/*/lora/address.json")
            os.kill(json.loads(address.read_text())["pid"], signal.SIGKILL)

    # a third SuperNode has no card (partition 2 of 2 cards): it is left out, never failed
    return exp, root, simulate(exp, num_supernodes=3, after_round=kill_lora_worker)


def test_groups_were_exchanged_every_round(federation):
    _, _, run_dir = federation
    rounds = load_metrics(run_dir)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds[1:]:
        assert set(r["nodes"]) == {"full", "lora"}
        for me, other in (("full", "lora"), ("lora", "full")):
            m = r["nodes"][me]
            assert m["samples_foreign"] == 4 * 4, m  # 4 prompts x G=4 from the other node
            assert m[f"{other}/samples"] == 16 and m[f"{me}/samples"] == 16
    # groups are generated in every round but the last; bytes/token comes from the Flower records
    assert all(r["server"]["bytes_per_token"] > 4 for r in rounds[:-1])
    assert rounds[-1]["server"]["bytes_per_token"] is None


def test_each_worker_started_once_and_a_killed_one_resumed_its_state(federation):
    _, root, run_dir = federation
    rounds = load_metrics(run_dir)
    for r in rounds:
        assert r["nodes"]["full"]["worker_starts"] == 1
        assert "resumed_from_round" not in r["nodes"]["full"]
    assert [r["nodes"]["lora"]["worker_starts"] for r in rounds] == [1, 1, 2]
    resumed = rounds[2]["nodes"]["lora"]
    assert resumed["resumed_from_round"] == 1  # the state its dead worker saved after round 1
    assert resumed["updates"] == 2  # the update counter continues, not 1 again
    # its own groups of round 1 came back and its weights are round 1's, not the base model's:
    # the learner scores them exactly as the (killed) generator did
    assert resumed["samples_own"] == 16 and resumed["kl_mean_own"] < 1e-4
    assert all(r["nodes"]["full"]["state_bytes"] > 0 for r in rounds)
    assert len(sorted(root.glob("cache/workers/*/*/starts.log"))) == 2
    assert not list(root.glob("cache/workers/*/*/state/round-*")), "finish keeps no state"


def test_parameters_changed_and_checkpoints_load(federation):
    exp, root, run_dir = federation
    from transformers import AutoModelForCausalLM

    from ftis_flwr.node.tiny.models import warmstart_dir
    from ftis_flwr.tasks import make_task

    summary = json.loads((run_dir / "summary.json").read_text())
    ckpts = summary["checkpoints"]
    assert set(ckpts) == {"full", "lora"}
    task = make_task(exp.task)
    full = exp.nodes[0]
    before = AutoModelForCausalLM.from_pretrained(warmstart_dir(full, task, root / "cache"))
    after = AutoModelForCausalLM.from_pretrained(ckpts["full"])
    changed = [n for n, p in after.state_dict().items() if not torch.equal(p, before.state_dict()[n])]
    assert changed, "two F-TIS updates left every parameter of the full node unchanged"

    from peft import PeftModel

    lora_card = exp.nodes[1]
    base = AutoModelForCausalLM.from_pretrained(warmstart_dir(lora_card, task, root / "cache"))
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    lora = PeftModel.from_pretrained(base, ckpts["lora"])
    merged = lora.merge_and_unload()
    # the run folder is usable on its own: the adapter names the copy of its base saved beside it
    from peft import AutoPeftModelForCausalLM

    config = json.loads((Path(ckpts["lora"]) / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]) == Path(ckpts["lora"]) / "base"
    standalone = AutoPeftModelForCausalLM.from_pretrained(ckpts["lora"]).merge_and_unload()
    assert all(torch.equal(v, merged.state_dict()[k]) for k, v in standalone.state_dict().items())
    assert any(not torch.equal(v, base_state[k]) for k, v in merged.state_dict().items()), \
        "the LoRA node's adapter did not change its weights"


@pytest.mark.usefixtures("one_torch_thread")
def test_answers_reloads_each_checkpoint_and_gives_the_accuracies_the_run_reported(federation, tmp_path, capsys):
    """``ftis-flwr answers`` answers the run's held-out problems greedily from the saved models, on
    the node's own code path: the final checkpoints give the accuracies of the last evaluation and
    the starting models those of round 0, to the digit, or it says they differ; and the shares of
    distinct and full-credit answers the nodes logged are those answers'."""
    from ftis_flwr.cli import main

    _, _, run_dir = federation
    rounds = load_metrics(run_dir)
    for start, row in ((False, rounds[-1]), (True, rounds[0])):
        out = tmp_path / f"answers-{start}.json"
        assert main(["answers", str(run_dir), "--show", "2", "--json", str(out)] + (["--start"] if start else [])) == 0
        printed = capsys.readouterr().out
        assert "NOT the same" not in printed
        got = json.loads(out.read_text())
        assert set(got) == {"full", "lora"}
        for node, splits in got.items():
            for split, d in splits.items():
                assert d["problems"] == len(d["answers"]) == 16
                logged = row["nodes"][node]
                assert d["accuracy"] == pytest.approx(logged[f"eval/{split}/accuracy"], abs=1e-12)
                assert d["distinct"] == len({a["answer"].strip() for a in d["answers"]})
                # the node's own evaluation logged the same answers' distinct and full-credit shares
                assert logged[f"eval/{split}/distinct"] == pytest.approx(d["distinct"] / 16, abs=1e-12)
                assert logged[f"eval/{split}/full_credit"] == pytest.approx(d["full_credit"] / 16, abs=1e-12)
    assert main(["answers", str(run_dir), "--node", "nobody"]) == 2
    assert "ftis-flwr answers: no node nobody in this run (its nodes: full, lora)" in capsys.readouterr().err
    assert main(["answers", str(run_dir), "--split", "train"]) == 2
    assert "no held-out split train" in capsys.readouterr().err
    assert main(["answers", str(tmp_path)]) == 2
    assert "not a finished run's folder: no config.json and no checkpoints" in capsys.readouterr().err
    # the same run's rounds, and the run beside itself: the same settings, no change
    assert main(["report", str(run_dir)]) == 0
    report = capsys.readouterr().out
    assert f"{run_dir}: {len(rounds)} rounds logged" in report and "| full: train / generate / eval s |" in report
    assert main(["compare", str(run_dir), str(run_dir)]) == 0
    same = capsys.readouterr().out
    assert "The two runs have the same settings." in same and "| full | test |" in same and " +0.0 |" in same


def test_run_directory_has_reports(federation):
    _, _, run_dir = federation
    for name in ("metrics.jsonl", "summary.md", "summary.json", "plot.png", "config.json"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


def test_every_metric_the_run_logged_is_in_the_metrics_reference(federation):
    """docs/reference/metrics.md lists every metric a node or the server logged in this run."""
    from ftis_flwr.server.reporting.metric_names import uncatalogued

    _, _, run_dir = federation
    assert uncatalogued(load_metrics(run_dir)) == [], \
        ("add them to ftis_flwr/server/reporting/metric_names.py, then "
         "`python -m ftis_flwr.server.reporting.metric_names --write`")


def test_a_supernode_without_a_card_is_left_out_once(federation):
    from ftis_flwr.server.reporting.summary import load_events

    _, _, run_dir = federation
    left = [e for e in load_events(run_dir) if e["event"] == "node_left_out"]
    assert len(left) == 1 and "partition-id 2 has no model card" in left[0]["reason"]
    assert not [e for e in load_events(run_dir) if e["event"] == "node_failed"]
    assert all(r["missing_nodes"] == [] for r in load_metrics(run_dir))


def simulate_failing(experiment) -> tuple[Path, str]:
    """:func:`conftest.simulate` for a run that ends failed: (its run directory, the one line the
    ServerApp raised it with, "" when it did not fail)."""
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from clients.client_app import app as client_app
    from ftis_flwr.config.schema import default_cache_dir
    from ftis_flwr.node.host.processes import kill_workers_of_run
    from ftis_flwr.server.run_failure import RunFailed
    from server_app.server_app import run, run_name

    out, server, name = {"failed": ""}, ServerApp(), run_name(experiment)

    @server.main()
    def main(grid, context):
        try:
            run(grid, experiment, connect_timeout=60, name=name)
        except RunFailed as exc:
            out["failed"] = str(exc)

    try:
        run_simulation(server, client_app, num_supernodes=2, backend_config={"client_resources": {"num_cpus": 1}})
    finally:
        kill_workers_of_run(default_cache_dir(experiment.cache_dir), name)
    return Path(experiment.run_dir).resolve() / name, out["failed"]


def test_a_failing_node_is_logged_the_rounds_go_on_and_the_run_ends_failed(federation, capsys):
    """One node cannot build its model: every round reports it failed; the other keeps training;
    the run's outputs are complete, and then it fails (issue #56: it used to end as completed),
    its summary saying so first, with the node's reason cut to one line."""
    exp, root, _ = federation
    from ftis_flwr.server.reporting.summary import load_events

    broken = load_experiment(yaml_text=TINY_FEDERATION, overrides={
        "cache_dir": str(root / "cache"), "run_dir": str(root / "runs-broken"),
        "nodes.1.source": str(root / "no-such-model"), "nodes.1.lora": False,
        "rounds.num_rounds": 1, "rounds.eval_every": 0})  # one trained round shows the rounds going on
    run_dir, failed = simulate_failing(broken)
    assert failed.startswith("node lora failed every round (rounds 0-1), so the run's results are the other "
                             "nodes' alone; last reason: lora: code 2: ") and "\n" not in failed
    assert "could not be built" in failed and "is not an existing directory" in failed and "Traceback" not in failed
    assert json.loads((run_dir / "summary.json").read_text())["failure"] == failed
    assert (run_dir / "summary.md").read_text().split("\n\n")[2] == f"**Run failed:** {failed}"
    assert "Traceback" not in capsys.readouterr().out
    rounds = load_metrics(run_dir)
    assert [r["round"] for r in rounds] == [0, 1]
    for r in rounds:
        assert set(r["nodes"]) == {"full"} and r["server"]["nodes_failed"] == 1
    assert rounds[1]["nodes"]["full"]["samples_foreign"] == 0
    assert rounds[1]["nodes"]["full"]["samples_own"] == 16
    failures = [e for e in load_events(run_dir) if e["event"] == "node_failed"]
    assert len(failures) == 2 and all("could not be built" in e["reason"] for e in failures)
