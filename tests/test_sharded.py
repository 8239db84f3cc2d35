"""A node sharded over ranks (FSDP2 on gloo): its update equals the one-rank update on the same groups.

Each rank is a real process (tests/rank_child.py) joined over gloo on the loopback, as a node's
worker starts them; the tiny models are real Qwen2 models, full and LoRA.
"""

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.host.ranks import Ranks, micro_batches
from ftis_flwr.node.node import Node

ROOT = Path(__file__).resolve().parents[1]
YAML = """
rounds: {num_rounds: 3, prompts_per_node: 3, eval_size: 8}
rollout: {group_size: 3, max_new_tokens: 6}
train: {lr: 1e-3, micro_batch_size: 4}
nodes:
  - {name: a, tiny_size: small, warmstart_steps: 60, seed: 1}
  - {name: b, tiny_size: small, warmstart_steps: 60, seed: 2}
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sharded-cache")


def test_shares_concatenate_in_rank_order_and_differ_by_at_most_one():
    for n in range(0, 12):
        for world in (1, 2, 3, 5):
            parts = [Ranks(r, world).share(list(range(n))) for r in range(world)]
            assert [x for p in parts for x in p] == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
            assert max(map(len, parts)) == Ranks(0, world).most(n)


def test_every_rank_runs_as_many_micro_batches_as_the_largest_share():
    samples = list(range(9))  # shares 5 and 4: rank 1 pads one empty micro-batch
    a, b = (micro_batches(samples, 4, Ranks(r, 2)) for r in (0, 1))
    assert a == [[0, 1, 2, 3], [4]] and b == [[5, 6, 7, 8], []]
    assert micro_batches(samples, 4, Ranks()) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]  # one rank: as before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sharded_train(tmp_path, job: dict, world: int = 2) -> dict:
    """Train once on ``world`` ranks; rank 0's metrics and the whole trainable parameters."""
    job_path, out_path = tmp_path / "job.pkl", tmp_path / "out.pkl"
    job_path.write_bytes(pickle.dumps(job))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "rank_child.py"), str(r), str(world),
                               str(port), str(job_path), str(out_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:  # stopped by pid whatever happened
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return pickle.loads(out_path.read_bytes())


def _crafted(node, index, answers):
    """One of ``node``'s groups whose completions are the given answers (rewards follow from them)."""
    import numpy as np

    from ftis_flwr.wire.groups import Group

    problem = node.task.train_problem(index)
    comps = [np.asarray(node.tokenizer(t, add_special_tokens=False)["input_ids"] + [node.tokenizer.eos_token_id])
             for t in answers]
    return Group(prompt_id=problem.id, prompt_tokens=node._prompt_tokens(problem), completions=comps,
                 logprobs=[np.full(len(c), -0.5, dtype=np.float32) for c in comps],
                 rewards=np.zeros(len(comps), dtype=np.float32), node=node.card.name,
                 model_id=node.policy.model_id, tokenizer_fp=node.fingerprint)


def _job(cache, lora: bool, leave_out: str = "", **overrides):
    exp = load_experiment(yaml_text=YAML, overrides={"cache_dir": str(cache), **overrides})
    card = exp.nodes[0]
    if lora:
        card.lora = True
        card.lora_config.r = 4
    a, b = Node(card, exp, cache_dir=cache), Node(exp.nodes[1], exp, cache_dir=cache)
    gold = a.task.train_problem(1).gold  # right and wrong in turn: the update has a signal
    groups = a.generate([0], 3, 0) + [_crafted(a, 1, [gold, "x", gold])] + b.generate([2], 3, 0)
    return a, {"exp": exp, "card": card, "cache": cache, "groups": groups, "round": 1, "num_rounds": 3,
               "leave_out": leave_out}


@pytest.mark.parametrize("lora,updates", [(False, 2), (True, 1)], ids=["full-2-updates", "lora"])
def test_the_two_rank_update_equals_the_one_rank_update(cache, tmp_path, lora, updates):
    """Loss, gradient norm and every trainable parameter after the update, to float32 tolerance."""
    one, job = _job(cache, lora, **{"train.updates_per_round": updates})
    assert sum(g.size for g in job["groups"]) == 9  # shares of 5 and 4: rank 1 runs an empty micro-batch
    before = {n: p.detach().clone() for n, p in one.model.named_parameters() if p.requires_grad}
    want = one.train(job["groups"], 1, 3)
    got = _sharded_train(tmp_path, job)
    for key in ("loss", "denominator", "grad_norm", "samples", "samples_foreign", "kl_mean_foreign",
                "w_mean", "b/samples"):
        assert got["metrics"][key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    if updates > 1:
        assert got["metrics"]["grad_norm_last"] == pytest.approx(want["grad_norm_last"], rel=1e-5)
    params = {n: p.detach() for n, p in one.model.named_parameters() if p.requires_grad}
    assert set(got["params"]) == set(params)
    lr = job["exp"].train.lr  # Adam divides by sqrt(v): on a gradient element near 0 the ranks'
    close = total = 0         # float32 rounding moves a step by up to a few % of lr (measured: 1.2%)
    for name, p in params.items():
        torch.testing.assert_close(got["params"][name], p, rtol=0, atol=0.05 * lr)
        close += int(torch.isclose(got["params"][name], p, rtol=1e-5, atol=1e-7).sum())
        total += p.numel()
    assert close >= 0.98 * total, (close, total)
    assert max(float((params[n] - before[n]).abs().max()) for n in params) > 1e-4  # the update moved them


@pytest.mark.parametrize("leave_out,key", [("all_sum", "grad_norm"), ("gather", "samples")])
def test_leaving_a_reduction_out_breaks_the_equality(cache, tmp_path, leave_out, key):
    """The test above can fail: without the summed denominator each rank normalises by its own
    samples (the gradient norm is wrong); without the gathered stats the metrics see one share."""
    one, job = _job(cache, False, leave_out)
    want = one.train(job["groups"], 1, 3)
    got = _sharded_train(tmp_path, job)
    assert got["metrics"][key] != pytest.approx(want[key], rel=1e-3)


def test_a_state_saved_on_one_rank_resumes_on_two_and_back(cache, tmp_path):
    """The saved state is world-size agnostic: one rank saves, two ranks resume and take the same
    next update as one rank resuming; two ranks save, and one rank resumes their parameters and
    Adam moments exactly as a one-rank node that took the same update saved them."""
    from ftis_flwr.node.state import load_state, save_state

    one, job = _job(cache, False)
    one.train(job["groups"], 1, 3)
    save_state(one, tmp_path / "one", 1)
    ref = Node(job["card"], job["exp"], cache_dir=cache)
    load_state(ref, tmp_path / "one")
    want = ref.train(job["groups"], 2, 3)
    got = _sharded_train(tmp_path, {**job, "round": 2, "resume_from": str(tmp_path / "one"),
                                    "save_to": str(tmp_path / "two")})
    assert got["metrics"]["updates"] == 2 == ref.updates
    assert got["metrics"]["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    lr = job["exp"].train.lr
    for name, p in ref.model.named_parameters():
        torch.testing.assert_close(got["params"][name], p.detach(), rtol=0, atol=0.05 * lr)
    back = Node(job["card"], job["exp"], cache_dir=cache)
    assert load_state(back, tmp_path / "two") == 2 and back.updates == 2
    for name, p in back.model.named_parameters():
        assert torch.equal(p.detach(), got["params"][name]), name
    mine, theirs = ref.optimizer.state_dict()["state"], back.optimizer.state_dict()["state"]
    assert set(mine) == set(theirs)
    for i in mine:
        torch.testing.assert_close(theirs[i]["exp_avg"], mine[i]["exp_avg"], rtol=1e-4, atol=1e-9)
        assert float(theirs[i]["step"]) == float(mine[i]["step"]) == 2


def test_a_cuda_rank_takes_its_own_device_before_it_joins_nccl(monkeypatch):
    """NCCL's first collective runs on ``torch.cuda.current_device()``: each rank must make
    ``cuda:<rank>`` current and name it to the group before joining, or every rank sits on cuda:0
    and NCCL refuses them. CUDA and NCCL cannot exist here: the two calls are recorded instead,
    the one seam replaced; the order and the arguments are what is checked."""
    import torch.distributed as dist

    from ftis_flwr.node.host import rank_group

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", str(device))))
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **kw: calls.append(("init", backend, str(kw.get("device_id")), kw["rank"])))
    rank_group.join(1, 2, 29_999, "cuda")
    assert calls == [("set_device", "cuda:1"), ("init", "nccl", "cuda:1", 1)]
    calls.clear()
    rank_group.join(1, 2, 29_999, "cpu")  # gloo: no device
    assert calls == [("init", "gloo", "None", 1)]
