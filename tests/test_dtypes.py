"""``dtype: auto`` / ``compute_dtype: auto`` (#24): bfloat16 only where the device computes it natively.

The hardware probe is the one seam: ``ftis_flwr.config.dtypes.cpu_has_native_bf16`` is set to each answer
in turn, because no one machine has both kinds of CPU."""

import pytest

from ftis_flwr.config import dtypes
from ftis_flwr.config.plan import estimate
from ftis_flwr.config.schema import ModelCard
from ftis_flwr.experiment import load_experiment


@pytest.mark.parametrize("native,weights,compute", [(True, "bfloat16", "bfloat16"), (False, "float32", "")])
def test_auto_picks_bfloat16_only_where_the_cpu_computes_it(monkeypatch, native, weights, compute):
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: native)
    card, note = dtypes.resolve_dtypes(ModelCard(name="lora", dtype="auto", compute_dtype="auto"))
    assert (card.dtype, card.compute_dtype) == (weights, compute)
    assert note.startswith("node lora: dtype auto -> ") and ("natively" in note) is native
    full, _ = dtypes.resolve_dtypes(ModelCard(name="full", dtype="float32", compute_dtype="auto"))
    assert (full.dtype, full.compute_dtype) == ("float32", "bfloat16" if native else "")


def test_explicit_dtypes_are_kept_and_the_preset_uses_auto():
    card = ModelCard(name="x", dtype="bfloat16", compute_dtype="")
    assert dtypes.resolve_dtypes(card) == (card, None)
    exp = load_experiment("cpu-smollm2")
    assert [c.dtype for c in exp.nodes] == ["float32", "auto"] and exp.nodes[0].compute_dtype == "auto"


def test_the_memory_plan_resolves_auto_as_this_machine_does(monkeypatch):
    exp = load_experiment("cpu-smollm2")
    sizes = {}
    for native in (True, False):
        monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda native=native: native)
        sizes[native] = estimate(exp.nodes[1], exp).weights
    assert sizes[False] == 2 * sizes[True]  # the LoRA node's frozen weights: float32 vs bfloat16
