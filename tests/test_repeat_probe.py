"""benchmarks/repeat_probe.py on tiny models: a probe repeats itself bit for bit in one process, and
its op trace and replay find no op that parts from itself (the real models: the script's docstring)."""

import pytest

from benchmarks import repeat_probe
from ftis_flwr.experiment import load_experiment

pytestmark = pytest.mark.slow

YAML = """
rounds: {num_rounds: 1, eval_size: 4}
rollout: {group_size: 2, max_new_tokens: 6, batch_size: 8}
nodes:
  - {name: a, tiny_size: small, warmstart_steps: 20, seed: 1}
"""


def test_probe_digest_trace_and_replay_repeat(tmp_path, monkeypatch):
    monkeypatch.setattr(repeat_probe, "SAMPLED", 2)
    exp = load_experiment(yaml_text=YAML, overrides={"cache_dir": str(tmp_path / "cache")})
    node = repeat_probe.build_node("a", 1, exp)
    first = repeat_probe.probe(node, 4)
    repeat_probe.save(first, tmp_path / "ref")
    again = repeat_probe.digest(repeat_probe.probe(node, 4), repeat_probe.load(tmp_path / "ref"))
    assert again["n"] == 4 and again["sampled"] == 4
    assert (again["differing"], again["max_dlogit"], again["sampled_differing"], again["max_dlogp"]) == (0, 0.0, 0, 0.0)
    problems = node.task.problems("test")[:2]
    ops = repeat_probe.trace(node, problems, tmp_path / "ops")
    assert any("linear" in o["op"] for o in ops) and repeat_probe.origins(ops, repeat_probe.trace(node, problems)) == []
    replayed = repeat_probe.replay(tmp_path / "ops")
    assert replayed and all(r["bitwise"] for r in replayed)
