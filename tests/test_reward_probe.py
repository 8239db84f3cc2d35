"""The reward probe (#55): ``ftis-flwr check`` scores cheap answers with the task's own reward on
real tasks (reasoning-gym's generators, the built-in tasks, a data set with a user's reward file)
and warns, naming the answer and its score, when one earns more than a tenth of the gold's."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from ftis_flwr.cli import CheckError, check, main  # noqa: E402
from ftis_flwr.tasks.base import Problem  # noqa: E402
from ftis_flwr.tasks.reasoning_gym import ReasoningGymTask  # noqa: E402
from ftis_flwr.tasks.reward_probe import THRESHOLD, probe_answers, probe_lines, probe_task, wrap  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PRESETS = sorted(p.stem for p in (REPO / "ftis_flwr" / "config" / "presets").glob("*.yaml"))
SPELL = "preset='cpu-smollm2' task.name='reasoning-gym:spell_backward'"
"""On a real model's preset: the tiny character models cannot read reasoning-gym's prompts (capitals,
hundreds of characters), which the check refuses (ftis_flwr.tasks.prompt_fit)."""
OWN_TRAIN = REPO / "docs" / "own-task" / "train.jsonl"


def probe(*run_config: str) -> list[str]:
    _, exp = check(REPO, list(run_config))
    return probe_lines(exp)


def own_task(reward_file: Path, name: str = "reward") -> str:
    return (f"task.name='dataset' task.dataset='json' task.data-files.train='{OWN_TRAIN}' "
            f"task.reward='{reward_file}:{name}'")


def test_check_names_spell_backwards_cheap_answers_and_their_scores_and_still_exits_0(capsys):
    assert main(["check", str(REPO), "--run-config", SPELL]) == 0
    err = capsys.readouterr().err
    repeated = next(line for line in err.splitlines() if "first character repeated" in line)
    assert repeated.startswith("ftis-flwr: warning: task reasoning-gym:spell_backward: the cheap answer")
    assert 0.13 <= float(re.search(r"scores (\d\.\d\d) on average", repeated).group(1)) <= 0.22
    assert "against the gold's 1.00" in repeated and "> 10%" in repeated
    assert "use task.partial-credit=false" in repeated and "--no-reward-probe" in repeated
    first = next(line for line in err.splitlines() if "\"the gold's first character\"" in line)
    assert 0.11 <= float(re.search(r"scores (\d\.\d\d)", first).group(1)) <= 0.16
    assert "the gold followed by junk" in err  # the per-letter sum ignores what follows the word


def test_the_probe_adds_little_to_the_check_it_follows():
    _, exp = check(REPO, [SPELL])
    start = time.perf_counter()
    probe_lines(exp)  # the checked task is reused: its train split is not generated again
    assert time.perf_counter() - start < 1.0


def test_no_reward_probe_silences_it(capsys):
    assert main(["check", str(REPO), "--no-reward-probe", "--run-config", SPELL]) == 0
    assert "warning" not in capsys.readouterr().err


def test_the_exact_answer_option_passes_its_probe_and_pays_only_the_word():
    assert probe(f"{SPELL} task.partial-credit=false") == []
    partial, strict = ReasoningGymTask("spell_backward"), ReasoningGymTask("spell_backward", partial_credit=False)
    for n in (7, 9):  # the per-letter sum with junk after the word: 0.9999999999999998 and 1.0000000000000002
        problem = next(p for p in partial.problems("train") if len(p.gold) == n)
        assert partial.reward(wrap(problem.gold + " qz"), problem) > 0.99
        assert strict.reward(wrap(problem.gold + " qz"), problem) == 0.0
        assert strict.reward(wrap(problem.gold), problem) == strict.reward(wrap(problem.gold.upper()), problem) == 1.0
        assert strict.reward(wrap(problem.gold[:1] * n), problem) == 0.0
        assert strict.reward(problem.gold, problem) == 0.0  # the strict format is still required


def test_partial_credit_off_is_refused_where_there_is_no_partial_credit():
    with pytest.raises(CheckError, match="task.partial-credit=false applies to reasoning-gym"):
        check(REPO, ["task.name='arithmetic' task.partial-credit=false"])


def test_a_user_reward_that_pays_for_length_is_flagged(tmp_path):
    reward = tmp_path / "length.py"
    reward.write_text("def reward(completions, **kwargs):\n"
                      "    return [min(1.0, len(c) / 100) for c in completions]\n")
    lines = probe(own_task(reward), "rollout.max-new-tokens=64")
    for strategy in ("a long run of filler", "the prompt repeated to the token budget"):  # 256 characters
        line = next(line for line in lines if f'"{strategy}" scores 1.00' in line)
        assert int(re.search(r"\((\d+)% > 10%", line).group(1)) > 100  # above the gold's own score
    assert all("make task.reward pay only for the answer" in line for line in lines)


def test_a_user_reward_that_fails_on_a_cheap_answer_is_named(tmp_path):
    reward = tmp_path / "number.py"
    reward.write_text("def reward(completions, answer, **kwargs):\n"
                      "    return [float(int(c) == int(a)) for c, a in zip(completions, answer)]\n")
    [line] = probe(own_task(reward))
    assert "made the task or its reward fail: RewardError" in line and "invalid literal for int()" in line


def test_quiet_on_uppercase_and_the_shipped_arithmetic_and_basic_math():
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.tasks import make_task

    for preset in ("cpu-xfamily-upper", "cpu-pair", "cpu-smollm2"):
        assert probe(f"preset='{preset}'") == [], preset
        exp = load_experiment(preset)
        result = probe_task(make_task(exp.task), budget_chars=4 * exp.rollout.max_new_tokens)
        assert len(result.findings) >= 9 and not result.notes, preset  # it did measure, on the gold's 1.0
        assert {f.gold for f in result.findings} == {1.0} and max(f.score for f in result.findings) == 0.0


def test_every_shipped_preset_passes_its_own_probe():
    for preset in PRESETS:
        lines = probe(f"preset='{preset}'")
        assert not [line for line in lines if line.startswith("warning")], (preset, lines)
        if check(REPO, [f"preset='{preset}'"])[1].task.name in ("gsm8k", "math500"):
            assert lines and "skipped" in lines[0] and "task.train-path" in lines[0]


def test_anything_that_scores_final_answers_uses_the_same_probe():
    """An environment: the generator's own checker on final answers, no format, no Task."""
    import reasoning_gym

    ds = reasoning_gym.create_dataset("spell_backward", seed=3, size=32)
    problems = [Problem(id=f"train:{i}", question=e["question"], gold=e["answer"], columns=e)
                for i, e in enumerate(ds)]
    partial = probe_answers(lambda answers, ps: [ds.score_answer(a, dict(p.columns)) for a, p in zip(answers, ps)],
                            problems, budget_chars=384)
    assert "the gold's first character repeated to the gold's length" in {f.strategy for f in partial.flagged}
    assert all(f.share > THRESHOLD for f in partial.flagged) and len(partial.findings) > len(partial.flagged)
    exact = probe_answers(lambda answers, ps: [float(ds.score_answer(a, dict(p.columns)) == 1.0)
                                               for a, p in zip(answers, ps)], problems, budget_chars=384)
    assert exact.flagged == [] and len(exact.findings) >= 9


def test_an_environment_that_pays_for_an_episode_without_tools_is_flagged():
    """With task.environment the cheap answers end episodes that call no tool: the docs' CalcEnv
    pays nothing for them; a class that pays half a point for never submitting is named."""
    env = f"task.environment='{REPO / 'tests' / 'toy_environments.py'}:{{}}'"
    base = f"task.name='dataset' task.dataset='json' task.data-files.train='{OWN_TRAIN}'"
    assert [line for line in probe(f"{base} {env.format('CalcEnv')}") if line.startswith("warning")] == []
    lines = probe(f"{base} {env.format('LenientCalcEnv')}")
    assert any('(episodes that call no tool): the cheap answer "the empty answer" scores 0.50' in line
               for line in lines), lines
