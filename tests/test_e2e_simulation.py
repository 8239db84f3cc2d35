"""End to end: a real Flower simulation of two tiny heterogeneous nodes exchanging groups."""

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from flwr.serverapp import ServerApp
from flwr.simulation import run_simulation

from clients.client_app import app as client_app
from ftis_flwr.config import load_experiment
from ftis_flwr.reporting import load_metrics
from server_app.server_app import run

pytestmark = pytest.mark.slow

TINY_FEDERATION = """
rounds: {num_rounds: 2, prompts_per_node: 4, eval_every: 1, eval_size: 16, round_timeout: 300}
rollout: {group_size: 4, max_new_tokens: 6, batch_size: 64}
train: {lr: 1e-3, micro_batch_size: 32}
nodes:
  - {name: small, source: tiny, tiny_size: small, warmstart_ops: "+-", warmstart_steps: 40, seed: 1}
  - {name: large, source: tiny, tiny_size: large, warmstart_ops: "+-", warmstart_steps: 40, seed: 2, lora: true,
     lora_config: {r: 8, alpha: 16}, lr: 1e-2}
"""


def _kill_workers(cache: Path) -> None:
    for address in cache.glob("workers/*/*/address.json"):
        pid = json.loads(address.read_text())["pid"]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    exp = load_experiment(yaml_text=TINY_FEDERATION,
                          overrides={"cache_dir": str(root / "cache"), "run_dir": str(root / "runs")})
    out = {}
    server = ServerApp()

    @server.main()
    def main(grid, context):
        out["run_dir"] = run(grid, exp, connect_timeout=60)

    try:
        run_simulation(server, client_app, num_supernodes=2,
                       backend_config={"client_resources": {"num_cpus": 1}})
    finally:
        _kill_workers(root / "cache")
    assert "run_dir" in out, "the ServerApp did not finish: see the simulation log above"
    return exp, root, out["run_dir"]


def test_groups_were_exchanged_every_round(federation):
    _, _, run_dir = federation
    rounds = load_metrics(run_dir)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds[1:]:
        assert set(r["nodes"]) == {"small", "large"}
        for me, other in (("small", "large"), ("large", "small")):
            m = r["nodes"][me]
            assert m["samples_foreign"] == 4 * 4, m  # 4 prompts x G=4 from the other node
            assert m[f"{other}/samples"] == 16 and m[f"{me}/samples"] == 16
    # groups are generated in every round but the last; bytes/token comes from the Flower records
    assert all(r["server"]["bytes_per_token"] > 4 for r in rounds[:-1])
    assert rounds[-1]["server"]["bytes_per_token"] is None


def test_each_worker_started_once(federation):
    _, root, run_dir = federation
    for r in load_metrics(run_dir):
        for m in r["nodes"].values():
            assert m["worker_starts"] == 1
    starts = sorted(root.glob("cache/workers/*/*/starts.log"))
    assert len(starts) == 2
    assert all(s.read_text().count("\n") == 1 for s in starts)


def test_parameters_changed_and_checkpoints_load(federation):
    exp, root, run_dir = federation
    from transformers import AutoModelForCausalLM

    from ftis_flwr.models import warmstart_dir
    from ftis_flwr.tasks import make_task

    summary = json.loads((run_dir / "summary.json").read_text())
    ckpts = summary["checkpoints"]
    assert set(ckpts) == {"small", "large"}
    task = make_task(exp.task)
    small = exp.nodes[0]
    before = AutoModelForCausalLM.from_pretrained(warmstart_dir(small, task, root / "cache"))
    after = AutoModelForCausalLM.from_pretrained(ckpts["small"])
    changed = [n for n, p in after.state_dict().items() if not torch.equal(p, before.state_dict()[n])]
    assert changed, "two F-TIS updates left every parameter of the small node unchanged"

    from peft import PeftModel

    large = exp.nodes[1]
    base = AutoModelForCausalLM.from_pretrained(warmstart_dir(large, task, root / "cache"))
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    lora = PeftModel.from_pretrained(base, ckpts["large"])
    merged = lora.merge_and_unload()
    assert any(not torch.equal(v, base_state[k]) for k, v in merged.state_dict().items()), \
        "the LoRA node's adapter did not change its weights"


def test_run_directory_has_reports(federation):
    _, _, run_dir = federation
    for name in ("metrics.jsonl", "summary.md", "summary.json", "plot.png", "config.json"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
