"""The attack study's table (``simulations/attack_study.py``) on hand-written run files: the
forger's paired difference against each baseline, the level rule and the inside-the-spread count."""

import json

from simulations.attack_study import table


def _run(out, condition, seed, small, large, rejected=0):
    nodes = {"small": {"accuracy": [[0, 0.6], [20, small]], "samples_rejected_from_third": rejected,
                       "samples_foreign": 100},
             "large": {"accuracy": [[0, 0.62], [20, large]], "samples_rejected_from_third": rejected,
                       "samples_foreign": 100}}
    if condition != "pair":
        nodes["third"] = {"accuracy": [[0, 0.6], [20, 0.7]], "samples_rejected_from_third": 0, "samples_foreign": 0}
    (out / f"{condition}-seed-{seed}.json").write_text(json.dumps(
        {"condition": condition, "seed": seed, "run_dir": "", "nodes": nodes}))


def test_forger_level_with_the_baselines_or_not(tmp_path):
    for s in range(5):
        _run(tmp_path, "pair", s, 0.70 + 0.01 * s, 0.75)
        _run(tmp_path, "honest", s, 0.72 + 0.01 * s, 0.75)
        # small: alternately 1 point above and below pair; large: 10 points below in every seed
        _run(tmp_path, "forger", s, 0.70 + 0.01 * s + (0.01 if s % 2 else -0.01), 0.65, rejected=480 + s)
    rows = {tuple(c.strip() for c in r.split("|")[1:3]): r for r in table(tmp_path).splitlines()
            if "forger - " in r and "baseline" not in r}
    assert "-0.2 (-1.0..+1.0)" in rows[("small", "forger - pair")]
    assert "reproduced (mean within ±2 points; 2 above, 3 below)" in rows[("small", "forger - pair")]
    assert "| 4/5 |" in rows[("small", "forger - pair")]  # seed 0 (0.69) is under pair's min 0.70
    assert "not reproduced (below in every seed: -10.0 points)" in rows[("large", "forger - pair")]
    assert "| 0/5 |" in rows[("large", "forger - honest")]
    assert "-2.2 (-3.0..-1.0)" in rows[("small", "forger - honest")]
    assert "not reproduced (below in every seed: -2.2 points)" in rows[("small", "forger - honest")]
    assert "rejected per honest node and run: 480..484" in table(tmp_path)
    assert not any(r.startswith("| third") for r in table(tmp_path).splitlines())


def test_fewer_than_five_seeds_decide_nothing(tmp_path):
    for s in range(3):
        for cond in ("pair", "honest", "forger"):
            _run(tmp_path, cond, s, 0.7, 0.7)
    rows = [r for r in table(tmp_path).splitlines() if "forger - " in r and "baseline" not in r]
    assert len(rows) == 4 and all("inconclusive (3 seeds < 5)" in r for r in rows)
