"""Three tiny models with three tokenizers through a real Flower simulation: the ``cpu-xtok``
preset's shipped char-level and byte-level BPE models and a SentencePiece-style unigram one. Each
trains on the others' samples through their text (cross-tokenizer F-TIS, algorithm §4). One test, not
one per pair: a Flower run of tiny models costs about 80 s on this machine."""

import dataclasses
import json

import pytest
from conftest import simulate

from ftis_flwr.experiment import load_experiment
from ftis_flwr.server.reporting.summary import load_metrics

pytestmark = pytest.mark.slow

SHORT = {"rounds.num_rounds": 2, "rounds.prompts_per_node": 8, "rounds.eval_every": 2,
         "rounds.eval_size": 32, "rollout.group_size": 4}


def _experiment(root, **overrides):
    return load_experiment("cpu-xtok", overrides={"cache_dir": str(root / "cache"),
                                                  "run_dir": str(root / "runs"), **SHORT, **overrides})


UNI = {"name": "uni", "source": "tiny", "tiny_size": "small", "tiny_tokenizer": "unigram", "warmstart_steps": 60,
       "seed": 3}


def test_three_tokenizers_train_on_each_others_samples(tmp_path):
    """char, byte-level BPE and unigram (Metaspace) in one federation: three segmentations of
    every problem (``"37+48="``: 6 / 4 / 3 tokens), each node aligning both others' texts.

    The unigram model is warm-started here for 60 steps only (seconds): it gets nearly no answer
    right, so its groups are all reward 0 (zero advantage) and its wrong answers are unlikely under
    the trained char and BPE models, whose F-TIS KL filter drops most or all of them (0 of 16 kept
    in a run here). So from ``uni`` the others are only checked to receive, align and filter every
    sample (none rejected, none lost); every node keeps samples of the two trained models."""
    nodes = [dataclasses.asdict(c) for c in load_experiment("cpu-xtok").nodes] + [UNI]
    exp = load_experiment("cpu-xtok", yaml_text=json.dumps({"nodes": nodes}), overrides={
        "cache_dir": str(tmp_path / "cache"), "run_dir": str(tmp_path / "runs"), **SHORT,
        "rounds.prompts_per_node": 4, "rounds.eval_size": 16})
    assert [c.tiny_tokenizer for c in exp.nodes] == ["char", "bpe", "unigram"]
    rounds = load_metrics(simulate(exp, num_supernodes=3))
    assert [r["round"] for r in rounds] == [0, 1, 2]
    names = ("small", "bpe", "uni")
    for r in rounds[1:]:
        assert set(r["nodes"]) == set(names)
        for me in names:
            m = r["nodes"][me]
            for other in set(names) - {me}:
                assert m[f"{other}/samples"] == 4 * 4, (me, other, m)
                assert m.get(f"{other}/groups_rejected", 0) == 0, (me, other, m)
                assert m[f"{other}/xtok_tokens"] > 0, (me, other, m)
                if other == "uni":  # filtered by F-TIS's KL test only, not lost on the way
                    assert m["uni/samples_kept"] + m["uni/filtered_kl"] == 4 * 4, (me, m)
                else:
                    assert m[f"{other}/samples_kept"] > 0, (me, other, m)
        # the BPE's tokens span several characters: the char node sees chunks of several tokens,
        # and the BPE node sees one chunk per token of the char node's text
        assert r["nodes"]["small"]["bpe/xtok_chunks_per_token"] < 0.9
        assert r["nodes"]["small"]["bpe/xtok_multi_token_share"] > 0.1
        assert r["nodes"]["bpe"]["small/xtok_chunks_per_token"] == 1.0
