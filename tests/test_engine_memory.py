"""A vLLM node's memory beside its learner (#54): the engine's dtype, weights and round-sized KV cache,
the GPU share it is given, and the checks that refuse what cannot run. No GPU here: the device's
figures are given as numbers."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ftis_flwr.cli import main as cli
from ftis_flwr.config.device_fit import device_fit_errors, planned_share
from ftis_flwr.config.engine_memory import (
    GIB,
    OVERHEAD,
    EngineMemoryError,
    engine_dtype,
    engine_need,
    engine_share,
    kv_bytes_per_token,
    learner_reserve,
    margin,
    round_sequences,
)
from ftis_flwr.config.plan import KNOWN, estimate
from ftis_flwr.config.schema import ModelCard
from ftis_flwr.experiment import load_experiment

REPO = Path(__file__).resolve().parent.parent
QWEN15 = KNOWN["Qwen/Qwen2.5-1.5B"]


def _vllm(preset: str, node: str, **card) -> tuple:
    exp = load_experiment(preset, {f"nodes.{node}.{k}": v for k, v in {"engine": "vllm", **card}.items()})
    return next(c for c in exp.nodes if c.name == node), exp


@pytest.mark.parametrize("lora,device,dtype,expected", [
    (True, "cuda:0", "float32", "bfloat16"),  # vLLM's GPU LoRA kernels: float16 / bfloat16 only
    (True, "cpu", "float32", "float32"),      # the CPU keeps the card's compute dtype
    (False, "cuda:0", "float32", "float32"),
    (False, "cpu", "bfloat16", "bfloat16"),
    (True, "cuda", "bfloat16", "bfloat16"),
    (False, "cuda", "bfloat16", "bfloat16"),
])
def test_the_engine_samples_in_the_cards_dtype_but_a_float32_lora_gpu_card_in_bfloat16(lora, device, dtype, expected):
    assert engine_dtype(ModelCard(lora=lora, device=device, dtype=dtype)) == expected


def test_compute_dtype_then_an_explicit_vllm_dtype_decide():
    card = ModelCard(lora=True, device="cuda:0", dtype="float32", compute_dtype="float16")
    assert engine_dtype(card) == "float16"
    assert engine_dtype(replace(card, vllm_dtype="bfloat16")) == "bfloat16"
    assert engine_dtype(ModelCard(device="cpu", dtype="float32", vllm_dtype="float16")) == "float16"


def test_kv_bytes_and_the_rounds_sequences():
    assert kv_bytes_per_token(QWEN15.layers, QWEN15.kv_heads, QWEN15.head_dim, "bfloat16") == 2 * 28 * 2 * 128 * 2
    exp = load_experiment("paper-peft-1.5b")
    assert round_sequences(exp) == 12 * 12  # eval_size 0 (the whole split) is not known offline
    assert round_sequences(replace(exp, rounds=replace(exp.rounds, eval_size=500))) == 500
    horizontal = replace(exp, advantage=replace(exp.advantage, mode="horizontal"))
    assert round_sequences(horizontal) == 12 * 6  # G / 2 nodes per prompt


def test_the_engine_holds_its_weights_and_the_rounds_kv_cache():
    card, exp = _vllm("paper-peft-1.5b", "b")
    weights, kv = engine_need(card, exp, QWEN15)
    adapter = QWEN15.lora_params(128, list(card.lora_config.target_modules))
    assert weights == (QWEN15.params() + adapter) * 2  # bfloat16: a float32 LoRA card on a GPU
    assert kv == (144 * (256 + 640) + 16) * 28672  # 144 sequences of 896 tokens and vLLM's null block
    card5 = replace(card, vllm_kv_cache_gib=5.0)
    assert engine_need(card5, exp, QWEN15)[1] == 5 * GIB
    long = replace(card, vllm_max_model_len=131072)  # vLLM refuses a KV cache short of one such sequence
    assert engine_need(long, exp, QWEN15)[1] == (131072 + 16) * 28672


def test_the_share_is_what_the_learner_leaves_less_the_margin():
    assert margin(80 * GIB) == 4 * GIB and margin(16 * GIB) == 1 * GIB  # 5%, at least 1 GiB
    share = engine_share(total=80 * GIB, free=70 * GIB, learner_reserve=10 * GIB, weights=3 * GIB,
                         kv_cache=3.5 * GIB)
    assert share == pytest.approx((70 - 10 - 4) / 80)
    assert share * 80 * GIB < 70 * GIB  # vLLM's start check: total x share must be free


def test_an_engine_that_does_not_fit_is_refused_with_every_number_and_the_fix():
    with pytest.raises(EngineMemoryError) as err:
        engine_share(total=80 * GIB, free=20 * GIB, learner_reserve=12 * GIB, weights=3.1 * GIB,
                     kv_cache=3.4 * GIB, node="b")
    msg = str(err.value)
    for part in ("node b: vLLM's engine needs 3.1 GiB weights + 3.4 GiB KV cache + 2.0 GiB runtime = 8.5 GiB",
                 "80.0 GiB in all", "20.0 GiB free", "12.0 GiB the learner still allocates", "4.0 GiB margin",
                 "4.0 GiB left", "rollout.group_size", "rounds.prompts_per_node", "nodes.b.vllm_max_model_len",
                 "nodes.b.vllm_sleep=true", "larger GPU", "nodes.b.ranks > 1 is not available"):
        assert part in msg, part
    with pytest.raises(EngineMemoryError, match=r"vllm_kv_cache_gib lower \(to 1\.9 GiB or less\)"):
        engine_share(total=80 * GIB, free=20 * GIB, learner_reserve=10 * GIB, weights=2.1 * GIB,
                     kv_cache=3.4 * GIB, overhead=OVERHEAD, node="b")


def test_the_planned_share_reserves_the_learners_gradients_and_adamw():
    card, exp = _vllm("paper-peft-1.5b", "b")
    est = estimate(card, exp)
    assert est.engine_sleeps and learner_reserve(est) == pytest.approx(
        est.gradients + est.optimizer + est.activations - (est.engine_copy + est.kv_cache + est.engine_runtime))
    share = planned_share(card, exp, total=80 * GIB, free=74 * GIB)
    assert share == pytest.approx((74 * GIB - learner_reserve(est) - 4 * GIB) / (80 * GIB), abs=1e-4)
    with pytest.raises(EngineMemoryError, match="node b: "):
        planned_share(card, exp, total=80 * GIB, free=40 * GIB)


def test_a_card_that_cannot_fit_the_gpu_it_would_run_on_is_named_with_its_numbers():
    card, exp = _vllm("paper-size-base", "b")  # 3B, every weight trained in float32
    (msg,) = device_fit_errors(card, exp, "nodes[b]", total=80 * GIB)
    assert msg.startswith("nodes[b].engine='vllm' on cuda:1 (80.0 GiB in all) needs 116.7 GiB + a 4.0 GiB margin")
    assert "11.5 GiB weights + 11.5 GiB grads + 23.0 GiB AdamW" in msg and "70.8 GiB activations" in msg
    assert "lower train.micro_batch_size" in msg
    assert device_fit_errors(card, exp, "nodes[b]", total=139 * GIB) == []
    assert device_fit_errors(replace(card, vllm_gpu_memory_utilization=0.5), exp, "nodes[b]", total=80 * GIB) == []


def test_check_refuses_float32_lora_sampling_and_ipc_for_lora_naming_the_keys(capsys):
    base = "preset='paper-peft-1.5b' nodes.b.engine='vllm'"
    assert cli(["check", str(REPO), "--run-config", base + " nodes.b.vllm_dtype='float32'"]) == 2
    err = capsys.readouterr().err
    assert "nodes[b].vllm_dtype='float32' with lora: true on cuda:1: vLLM's GPU LoRA kernels take float16 or " \
           "bfloat16 only (vllm/lora/ops/triton_ops/lora_shrink_op.py" in err and "set vllm_dtype to bfloat16" in err
    assert cli(["check", str(REPO), "--run-config", base + " nodes.b.vllm_weight_sync='ipc'"]) == 2
    err = capsys.readouterr().err
    assert "nodes[b].vllm_weight_sync='ipc' is for full fine-tuning" in err
    assert cli(["check", str(REPO), "--run-config", base + " nodes.b.vllm_dtype='half'"]) == 2
    assert "nodes[b].vllm_dtype='half' is not one of float32, bfloat16, float16, auto" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["paper-size-base", "paper-size-coder", "paper-expertise-1.5b",
                                    "paper-expertise-3b", "paper-peft-1.5b", "paper-peft-3b"])
def test_check_accepts_the_paper_presets_on_vllm(preset, capsys):
    names = [c.name for c in load_experiment(preset).nodes]
    engines = " ".join(f"nodes.{n}.engine='vllm'" for n in names)
    assert cli(["check", str(REPO), "--run-config", f"preset='{preset}' {engines}"]) == 0, capsys.readouterr().err


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="an NVIDIA driver here: the fit check reads the GPU")
def test_checking_a_vllm_card_without_a_gpu_imports_no_torch():
    code = ("import sys; from ftis_flwr.experiment import load_experiment; "
            "load_experiment('paper-peft-1.5b', {'nodes.b.engine': 'vllm'}); print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr[-2000:]
