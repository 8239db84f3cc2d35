"""A Flower federation with one vLLM node (SmolLM2-135M-Instruct) and one HF node.

Runs only where vLLM is installed (``scripts/vllm_cpu_env.sh``). Its own module, so that
tests/test_vllm_engine.py's module-scoped engine is shut down before this federation's two
workers (one with its own vLLM engine) start: together they came within 5% of this machine's
24 GiB while other jobs ran, and Ray killed a node worker for memory.
"""

from __future__ import annotations

import os

import pytest

vllm = pytest.importorskip("vllm")

TOL = 1e-3
"""Max |engine - learner| per token for the float32 vLLM node's own samples (as in
tests/test_vllm_engine.py)."""


LEAKABLE = (b"VLLM::", b"EngineCore", b"ftis_flwr.node.host.worker")
"""Command-line marks of the processes a node leaves behind if it leaks (vLLM's are retitled)."""


def tagged(tag: str, names: tuple[bytes, ...] = LEAKABLE) -> list[int]:
    """Live (not zombie) processes whose environment carries ``FTIS_VLLM_TEST_TAG=tag`` and whose
    command line names a node worker or a vLLM engine core."""
    from pathlib import Path

    needle = f"FTIS_VLLM_TEST_TAG={tag}".encode()
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if (needle in (proc / "environ").read_bytes().split(b"\0")
                    and any(n in (proc / "cmdline").read_bytes() for n in names)
                    and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                out.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            pass
    return out


def kill_tagged(tag: str) -> list[int]:
    """SIGKILL, by pid, what :func:`tagged` finds; returns those pids."""
    import signal

    pids = tagged(tag)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@pytest.mark.slow
def test_two_node_federation_with_one_vllm_node(tmp_path):
    """cpu-smollm2 for 2 rounds through a real Flower simulation: node "full" samples with vLLM
    (float32 end to end, so its own samples' learner/generator gap is rounding only), node
    "lora" with HF; both train on each other's groups and the vLLM node syncs every round."""
    from conftest import simulate

    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.server.reporting.summary import load_metrics

    exp = load_experiment("cpu-smollm2", overrides={
        "rounds.num_rounds": 2, "rounds.eval_every": 0, "rounds.eval_size": 4,
        "nodes.0.engine": "vllm", "nodes.0.compute_dtype": "", "nodes.0.vllm_max_model_len": 512,
        "nodes.0.vllm_kv_cache_gib": 1.0,
        "cache_dir": str(tmp_path / "cache"), "run_dir": str(tmp_path / "runs")})
    assert exp.nodes[0].engine == "vllm" and exp.nodes[1].engine == "hf"
    # The vLLM node's worker "crashes" (SIGKILL to its pid only) after round 1: its EngineCore
    # is orphaned until the next message finds the worker dead and kills its process group; at
    # the end the worker shuts its engine down and exits. Processes are tagged through the
    # environment, so that whatever is left (a leak: the test fails) is found and stopped by pid.
    import json
    import signal
    import time

    tag = f"ftis-vllm-test-{os.getpid()}-{tmp_path.name}"
    crashed = {}

    def crash_vllm_worker(rnd, node_metrics):
        if rnd == 1:
            (address,) = (tmp_path / "cache").glob("workers/*/full/address.json")
            crashed["pid"] = json.loads(address.read_text())["pid"]
            crashed["before"] = tagged(tag, (b"EngineCore",))
            os.kill(crashed["pid"], signal.SIGKILL)

    os.environ["FTIS_VLLM_TEST_TAG"] = tag
    try:
        rounds = load_metrics(simulate(exp, after_round=crash_vllm_worker))
        deadline = time.monotonic() + 30
        while tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        os.environ.pop("FTIS_VLLM_TEST_TAG", None)
        leaked = kill_tagged(tag)
    assert crashed["before"], "the vLLM node had no EngineCore process to orphan"
    assert not leaked, f"node workers / vLLM engine cores left running: pids {leaked}"
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert [r["nodes"]["full"]["worker_starts"] for r in rounds] == [1, 1, 2]
    assert rounds[2]["nodes"]["full"]["resumed_from_round"] == 1
    for r in rounds[1:]:
        full, lora = r["nodes"]["full"], r["nodes"]["lora"]
        assert full["samples_foreign"] == full["lora/samples"] > 0
        assert lora["samples_foreign"] == lora["full/samples"] > 0
        assert full["seconds_engine_sync"] > 0 and "seconds_engine_sync" not in lora
        print(f"\nround {r['round']}: vLLM node own gap max {full['own_logprob_gap_max']:.2e} "
              f"mean {full['own_logprob_gap_mean']:.2e}, sync {full['seconds_engine_sync']:.2f} s")
        # the vLLM node's own samples, scored by its learner after the previous round's sync
        assert full["own_logprob_gap_max"] < TOL
