"""Every paper preset validates and gets a memory estimate and a placement, offline."""

import pytest

from ftis_flwr.config.merge import load_experiment
from ftis_flwr.config.plan import GIB, KNOWN, estimate, main

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
