"""Every paper preset validates and gets a memory estimate and a placement, offline."""

import pytest

from ftis_flwr.cli import main as cli
from ftis_flwr.config.plan import GIB, KNOWN, estimate
from ftis_flwr.experiment import load_experiment


def main(argv):
    """``ftis-flwr plan ARGV``."""
    return cli(["plan", *argv])

PAPER = ["paper-size-base", "paper-size-coder", "paper-expertise-1.5b", "paper-expertise-3b",
         "paper-peft-1.5b", "paper-peft-3b"]


def test_parameter_counts_match_the_published_models():
    assert round(KNOWN["Qwen/Qwen2.5-1.5B"].params() / 1e9, 2) == 1.54
    assert round(KNOWN["Qwen/Qwen2.5-3B"].params() / 1e9, 2) == 3.09
    assert round(KNOWN["smollm2"].params() / 1e6) == 135
    assert round(KNOWN["gemma3-270m"].params() / 1e6) == 268  # its head size is not hidden / heads


@pytest.mark.parametrize("preset", PAPER)
def test_paper_preset_plans_offline(preset, capsys):
    main([preset])
    out = capsys.readouterr().out
    assert "valid" in out and "Placement:" in out and "?" not in out
    exp = load_experiment(preset)
    ests = [estimate(c, exp) for c in exp.nodes]
    for card, e in zip(exp.nodes, ests):
        assert e.trainable < e.params if card.lora else e.trainable == e.params
        assert 1 < e.total / GIB < 141


def test_lora_needs_far_less_optimizer_memory():
    exp = load_experiment("paper-peft-1.5b")
    full, lora = (estimate(c, exp) for c in exp.nodes)
    assert lora.optimizer < full.optimizer / 10


def test_a_card_larger_than_its_machine_is_named_before_it_builds(monkeypatch):
    import ftis_flwr.config.plan as plan

    assert plan.available_bytes("cpu") > 0  # this machine's /proc/meminfo
    exp = load_experiment("paper-size-base")
    card = exp.nodes[0]
    monkeypatch.setattr(plan, "available_bytes", lambda device: 8 * GIB)  # the probe: an 8 GiB machine
    note = plan.memory_warning(card, exp)
    assert note.startswith(f"node {card.name}: needs about ") and "8.0 GiB free" in note
    monkeypatch.setattr(plan, "available_bytes", lambda device: 1024 * GIB)
    assert plan.memory_warning(card, exp) is None
    monkeypatch.setattr(plan, "available_bytes", lambda device: None)  # cannot be told: silent
    assert plan.memory_warning(card, exp) is None


def test_the_placement_speaks_gib_and_takes_the_users_device_size(capsys):
    """One unit (GiB) throughout; a CPU card is placed on this machine's memory, not on a GPU; a
    stated device size decides for GPU cards."""
    main(["paper-size-base", "--device-gib", "80"])
    out = capsys.readouterr().out
    assert " GB " not in out and "b: 140.1 GiB with 20% margin -> needs more than one 80 GiB device" in out
    main(["paper-size-base"])
    assert "a: 80.0 GiB with 20% margin -> fits one 139 GiB device" in capsys.readouterr().out
    main(["cpu-smollm2"])
    out = capsys.readouterr().out
    assert "runs on the CPU" in out and "GPU" not in out.split("Placement:")[1]


def _flat(node: str, ranks: int, card: dict) -> dict:
    return {f"nodes.{node}.{k}": v for k, v in {"ranks": ranks, **card}.items()}


def test_ranks_divide_what_fsdp2_shards_and_keep_the_rest_whole():
    """FSDP2 splits the parameters, gradients and AdamW state over a node's ranks; each rank keeps
    whole the engine's copy of the weights, the KV cache of its generation batch and the
    activations of its micro-batch (one rank has no copy: its engine samples from the learner)."""
    one = estimate(load_experiment("paper-size-base").nodes[1], load_experiment("paper-size-base"))
    exp = load_experiment("paper-size-base", _flat("b", 4, {"device": "cuda"}))
    four = estimate(exp.nodes[1], exp)
    assert (four.ranks, one.ranks) == (4, 1)
    for part in ("weights", "gradients", "optimizer"):
        assert getattr(four, part) == pytest.approx(getattr(one, part) / 4), part
    assert (four.kv_cache, four.activations) == (one.kv_cache, one.activations)
    assert (one.engine_copy, four.engine_copy) == (0.0, pytest.approx(one.weights))
    assert four.total == pytest.approx(one.sharded / 4 + one.weights + max(one.kv_cache, one.activations))
    assert one.with_ranks(4).total == pytest.approx(four.total)


def test_the_table_shows_the_rank_count_and_the_per_rank_figure(capsys):
    from ftis_flwr.cli import main as cli

    assert cli(["plan", "paper-size-base", "--run-config", "overrides='nodes.b.ranks=2 nodes.b.device=cuda'"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| b |"))
    # 116.7 GiB less half of 46.0, plus the engine's 11.5 GiB copy of the weights
    assert row.split(" | ")[4:6] == ["2", "5.7 GiB"] and row.endswith("| 11.5 GiB | 8.9 GiB | 70.8 GiB | 105.3 GiB |")
    assert "b: 126.3 GiB with 20% margin per rank, 2 ranks -> fits one 139 GiB device per rank" in out


def test_a_vllm_node_counts_its_engine_and_the_rounds_kv_cache(capsys):
    """#54: a node on vLLM was planned as an hf one (engine copy 0.0 GiB, the generation batch's KV
    cache). Its engine holds its own bfloat16 weights with the adapter, the KV cache of the round's
    144 sequences and vLLM's runtime; asleep during the update, those and the activations take turns."""
    from ftis_flwr.cli import main as cli

    assert cli(["plan", "paper-peft-1.5b", "--run-config", "nodes.b.engine='vllm'"]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0]: line for line in out.splitlines() if line.startswith("| ")}
    assert "| vLLM runtime |" in rows["| node"]
    assert rows["| a"].endswith("| 0.0 GiB | 6.9 GiB | 0.0 GiB | 43.7 GiB | 66.7 GiB |")  # hf: as before
    assert rows["| b"].endswith("| 3.2 GiB | 3.4 GiB | 2.0 GiB | 43.7 GiB | 51.1 GiB |")
    assert "b: 61.3 GiB with 20% margin (its vLLM engine 8.6 GiB, asleep during the update) -> fits one 80 GiB" in out
    exp = load_experiment("paper-peft-1.5b", {"nodes.b.engine": "vllm"})
    awake = load_experiment("paper-peft-1.5b", {"nodes.b.engine": "vllm", "nodes.b.vllm_sleep": False})
    e, w = estimate(exp.nodes[1], exp), estimate(awake.nodes[1], awake)
    engine = e.engine_copy + e.kv_cache + e.engine_runtime
    assert e.total == pytest.approx(e.sharded + max(engine, e.activations))
    assert w.total == pytest.approx(e.sharded + engine + e.activations)
    assert e.with_ranks(1).engine_copy == e.engine_copy and e.ranks_to_fit(40 * GIB) is None  # one GPU, no ranks


def test_device_gib_names_the_fewest_ranks_that_fit_one_device_each(capsys):
    """The 1.5B node (80.0 GiB with the margin) needs 2 ranks of 80 GiB, not 1 (nor 3); the 3B
    node's activations alone overflow 80 GiB, so no rank count is offered for it as it is."""
    exp = load_experiment("paper-size-base")
    a, b = (estimate(c, exp) for c in exp.nodes)
    assert a.total * 1.2 > 80 * GIB and a.with_ranks(2).total * 1.2 <= 80 * GIB
    assert a.ranks_to_fit(80 * GIB) == 2 and b.ranks_to_fit(80 * GIB) is None
    main(["paper-size-base", "--device-gib", "80"])
    out = capsys.readouterr().out
    assert "a: 80.0 GiB with 20% margin -> needs more than one 80 GiB device: set nodes.a.ranks=2 " \
           "nodes.a.device=cuda:0,1 (73.1 GiB per rank" in out
    line_b = next(line for line in out.splitlines() if line.startswith("  b: "))
    assert "sharding alone cannot fit it" in line_b and "nodes.b.ranks=2 nodes.b.device=cuda:1,2" in line_b
    assert "set train.micro_batch_size=2 (76.4 GiB per rank with the margin on one 80 GiB device)" in line_b


def test_a_cpu_card_with_ranks_counts_every_rank_on_the_one_machine(capsys):
    from ftis_flwr.cli import main as cli

    # compute_dtype stated: "auto" (the preset's) resolves by this CPU's bfloat16 flags, and so would the figures
    assert cli(["plan", "cpu-smollm2", "--run-config",
                "overrides='nodes.full.ranks=2 nodes.full.compute_dtype=bfloat16'"]) == 0
    out = capsys.readouterr().out.split("Placement:")[1]
    assert "full: 4.4 GiB with 20% margin per rank, 2 ranks -> runs on the CPU (8.8 GiB for its 2 ranks together)" \
        in out and "GPU" not in out and "device:" not in out.replace("card device: cpu", "")


def test_the_plan_subcommand_errors_are_named_with_their_exit_codes(capsys):
    """Unknown preset and bad values: 2, each named, no traceback; a bad command line: 64."""
    from ftis_flwr.cli import main as cli

    assert cli(["plan", "paper-size-bas"]) == 2
    err = capsys.readouterr().err
    assert "preset 'paper-size-bas' is neither" in err and "paper-size-base" in err and "Traceback" not in err
    assert cli(["plan", "paper-size-base", ".", "--run-config", "loss.trunc=3 train.lr=0"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'loss.trunc'; did you mean loss.trunc-c" in err and "train.lr=0.0 must be > 0" in err
    for bad in (["plan"], ["plan", "paper-size-base", "--device-gib", "-1"], ["plan", "x", "--device-gib", "a"]):
        with pytest.raises(SystemExit) as done:
            cli(bad)
        assert done.value.code == 64, bad
    with pytest.raises(SystemExit) as done:
        main(["paper-size-base", "--device-gib", "0"])
    assert done.value.code == 64 and "a number > 0" in capsys.readouterr().err


@pytest.mark.parametrize("section", ["Memory plan", "Sharding the 3B node"])
def test_the_documented_plans_are_what_the_commands_print(section, capsys):
    """docs/configuration.md shows each command with its output: both must stay true."""
    import shlex

    from conftest import doc_block

    from ftis_flwr.cli import main as cli

    command = doc_block(section, "bash", page="docs/configuration.md").strip()
    argv = shlex.split(command)
    assert argv[:2] == ["ftis-flwr", "plan"], command
    assert cli(argv[1:]) == 0
    assert capsys.readouterr().out.strip() == doc_block(section, "text", page="docs/configuration.md").strip()


def test_the_plan_imports_no_torch():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from ftis_flwr.cli import main; main(['plan', 'paper-size-base', '--device-gib', '80']); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("[]"), proc.stdout[-500:] + proc.stderr[-2000:]


@pytest.mark.parametrize("preset", ["cpu-pair", "cpu-xtok"])
def test_the_shipped_tiny_models_are_sized_offline(preset, capsys):
    """#56: `plan cpu-pair` printed `?` in every cell ('architecture unknown offline') for models
    the package ships; their shape is known (ftis_flwr.config.tiny_models, the node's numbers)."""
    main([preset])
    out = capsys.readouterr().out
    assert "?" not in out and "unknown" not in out, out
    exp = load_experiment(preset)
    for card in exp.nodes:
        e = estimate(card, exp)
        assert e.params == e.trainable and e.params < 2e6 and 0 < e.total < 2 * GIB  # 64 positions at most
        assert f"| {card.name} | tiny | {e.params / 1e6:.2f} M |" in out
    small = estimate(exp.nodes[0], exp)
    assert small.kv_cache == 2 * 2 * 2 * 32 * 64 * exp.rollout.batch_size * 4  # 2 layers, 2 kv heads, 64 positions
