"""Two tiny models with different tokenizers (char-level and byte-level BPE: the ``cpu-xtok``
preset's shipped models) through a real Flower simulation: each trains on the other's samples
through their text (cross-tokenizer F-TIS, SPEC §4)."""

import pytest
from conftest import simulate

from ftis_flwr.config import load_experiment
from ftis_flwr.reporting import load_metrics

pytestmark = pytest.mark.slow

SHORT = {"rounds.num_rounds": 2, "rounds.prompts_per_node": 8, "rounds.eval_every": 2,
         "rounds.eval_size": 32, "rollout.group_size": 4}


def _experiment(root, **overrides):
    return load_experiment("cpu-xtok", overrides={"cache_dir": str(root / "cache"),
                                                  "run_dir": str(root / "runs"), **SHORT, **overrides})


def test_each_node_trains_on_the_other_tokenizers_samples(tmp_path):
    rounds = load_metrics(simulate(_experiment(tmp_path)))
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds[1:]:
        assert set(r["nodes"]) == {"small", "bpe"}
        for me, other in (("small", "bpe"), ("bpe", "small")):
            m = r["nodes"][me]
            assert m[f"{other}/samples"] == 8 * 4 and m[f"{other}/samples_kept"] > 0, m
            assert m.get(f"{other}/groups_rejected", 0) == 0, m
            assert m[f"{other}/xtok_tokens"] > 0
        # the BPE's tokens span several characters: the char node sees chunks of several tokens
        assert r["nodes"]["small"]["bpe/xtok_chunks_per_token"] < 0.9
        assert r["nodes"]["small"]["bpe/xtok_multi_token_share"] > 0.1
        assert r["nodes"]["bpe"]["small/xtok_chunks_per_token"] == 1.0  # a BPE token is >= 1 char

