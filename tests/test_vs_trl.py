"""benchmarks/vs_trl.py runs: its own environment with a pinned TRL (scripts/trl_env.sh, TRL never
a dependency of the project), then one interleaved repeat on the tiny model. The figures are a
benchmark's (docs/performance.md), never asserted; this checks the comparison is made on the same
work: the same number of completions per step on both sides, and the summary's last line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def test_vs_trl_runs_both_sides_on_the_same_work(tmp_path):
    venv = tmp_path / "trl"
    env = dict(os.environ, TRL_VENV=str(venv), PYTHON=sys.executable)  # this environment, venv or not
    built = subprocess.run(["scripts/trl_env.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "benchmarks.vs_trl", "--model", "tiny", "--repeats", "1",
                           "--prompts", "4"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{\"repeat\"")]
    assert [r["side"] for r in rows] == ["ftis alone", "ftis + partner", "trl"]
    for r in rows:
        assert r["step"] > 0 and r["generate"] > 0 and r["update"] > 0 and r["tokens"] > 0
    # 4 prompts x G 8 completions of at most 6 tokens on each side: the same work
    assert all(4 * 8 <= r["tokens"] <= 4 * 8 * 6 for r in rows), rows
    assert proc.stdout.strip().splitlines()[-1].startswith("ftis/trl step time ratio = ")
