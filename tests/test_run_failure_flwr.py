"""A reward that raises, tried as a new user would (issue #56): the own-task command of
docs/your-own-task.md with ``task.reward`` naming a file whose function raises, through
``ftis-flwr run`` and a real local SuperLink this test owns. It used to fail after 30 s with 275
lines of Ray and Flower tracebacks, the useful line 16 times, no summary, no plot."""

import json
import re

import pytest
from test_flwr_run import ftis_flwr_run, superlink  # noqa: F401  (the SuperLink fixture this test owns)

pytestmark = pytest.mark.slow


def test_a_reward_that_raises_ends_the_run_with_one_line_and_exit_1(tmp_path, superlink):  # noqa: F811
    reward = tmp_path / "bad.py"
    reward.write_text("def reward(completions, answer, **kwargs):\n    raise ValueError('my reward is broken')\n")
    cache, runs = tmp_path / "cache", tmp_path / "runs"
    out, proc = ftis_flwr_run(
        "task.name='dataset' task.dataset='json' task.data-files.train='docs/own-task/train.jsonl' "
        f"task.data-files.test='docs/own-task/test.jsonl' task.reward='{reward}:reward' rounds.num-rounds=3 "
        f"cache-dir='{cache}' run-dir='{runs}'", superlink, cache)
    assert proc.returncode == 1, out[-4000:]
    assert "Traceback" not in out and "RayTaskError" not in out, out[-4000:]
    (run_dir,) = runs.iterdir()
    assert re.fullmatch(r"\d{8}-\d{6}-own-task-cpu-pair-vertical-f-tis-[0-9a-f]{4}", run_dir.name)
    why = json.loads((run_dir / "summary.json").read_text())["failure"]
    assert why.startswith(f"round 0: the reward failed on nodes small and large: reward '{reward}:reward' raised "
                          "ValueError: my reward is broken. The run stopped at once")
    run_id = re.search(r"run (\d+) finished", out).group(1)
    said = [line for line in out.splitlines() if "my reward is broken" in line and not line.startswith(
        "ftis-flwr: warning: task dataset: the reward probe")]  # the check's own probe, before the run
    assert said == [f"ftis-flwr: the run failed: {why} (metrics, plot and summary in {run_dir})",
                    f"ftis-flwr: run {run_id} finished:failed: {why.split('. ')[0]}"], said
    assert (run_dir / "plot.png").is_file() and (run_dir / "summary.md").read_text().split("\n\n")[2] == \
        f"**Run failed:** {why}"
    assert len(out.splitlines()) < 80, out  # was 279 lines for this command
