"""``task.name=reasoning-gym:<generator>`` on the real reasoning-gym package (the ``[tasks]``
extra), no mocks: deterministic, disjoint splits, ids that round-trip, the generator's own
checker under the strict format, the registry's errors, and prompts through a chat template."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from ftis_flwr.config.schema import TaskConfig  # noqa: E402
from ftis_flwr.tasks import make_task  # noqa: E402
from ftis_flwr.tasks.base import Problem  # noqa: E402
from ftis_flwr.tasks.reasoning_gym import (  # noqa: E402
    HARDER,
    OOD_SIZE,
    TEST_SIZE,
    ReasoningGymTask,
    derived_seed,
)
from ftis_flwr.tasks.registry import TaskError  # noqa: E402
from ftis_flwr.tasks.rewards import SYSTEM_PROMPT  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORDS = "word_sequence_reversal"  # a generator whose answers are words (several of them per answer)
GENERATORS = ("chain_sum", WORDS, "spell_backward")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def strict(answer: str) -> str:
    return f"<think> I reverse them. </think><answer> {answer} </answer>"


def questions(task, split):
    return [p.question for p in task.problems(split)]


@pytest.fixture(scope="module")
def tasks():
    return {g: ReasoningGymTask(g, seed=7, size=300) for g in GENERATORS}


def test_splits_are_deterministic_and_sized(tasks):
    for g, task in tasks.items():
        again = make_task(TaskConfig(name=f"reasoning-gym:{g}", seed=7, size=300))
        for split in ("train", "test", "ood"):
            assert questions(task, split) == questions(again, split), (g, split)
            assert [p.gold for p in task.problems(split)] == [p.gold for p in again.problems(split)]
        assert len(task.problems("train")) == 300
        assert len(task.problems("test")) == TEST_SIZE and len(task.problems("ood")) == OOD_SIZE
    other = ReasoningGymTask("chain_sum", seed=8, size=300)
    assert questions(other, "train") != questions(tasks["chain_sum"], "train")


def test_same_problems_in_another_process():
    """Every node builds its own task: a fresh interpreter (another hash seed) agrees."""
    code = ("import hashlib, json; from ftis_flwr.tasks.reasoning_gym import ReasoningGymTask as T; "
            f"t = T({WORDS!r}, seed=7, size=300); "
            "print(hashlib.sha256(json.dumps([[p.question, p.gold] for s in t.splits "
            "for p in t.problems(s)]).encode()).hexdigest())")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()[-1]
    task = ReasoningGymTask(WORDS, seed=7, size=300)
    here = hashlib.sha256(json.dumps([[p.question, p.gold] for s in task.splits
                                      for p in task.problems(s)]).encode()).hexdigest()
    assert out == here


def test_held_out_splits_share_no_question_with_train(tasks):
    for g, task in tasks.items():
        train, test, ood = (set(questions(task, s)) for s in ("train", "test", "ood"))
        demos = {q for q, _ in task.demos()}
        assert len(test) == TEST_SIZE and len(ood) == OOD_SIZE, g  # no repeats inside a split
        assert not test & train and not ood & train and not ood & test, g
        assert not demos & (test | ood), g
    assert derived_seed(7, "test") != derived_seed(7, "ood") != 7


def test_ood_is_harder_where_a_setting_is_known(tasks):
    assert "chain_sum" in HARDER and WORDS in HARDER
    assert max(p.columns["metadata"]["num_terms"] for p in tasks["chain_sum"].problems("train")) <= 6
    assert min(p.columns["metadata"]["num_terms"] for p in tasks["chain_sum"].problems("ood")) >= 7
    assert min(p.columns["metadata"]["num_words"] for p in tasks[WORDS].problems("ood")) >= 9
    assert ReasoningGymTask("gcd").ood_config == {}  # in-distribution there (another seed)


def test_ids_round_trip_and_train_index_is_stable(tasks):
    task = tasks["chain_sum"]
    for split in task.splits:
        for p in task.problems(split)[:20]:
            assert p.id.startswith(f"{split}:") and task.problem(p.id) is p
    again = ReasoningGymTask("chain_sum", seed=7, size=300)
    assert [task.train_problem(i).id for i in range(50)] == [again.train_problem(i).id for i in range(50)]
    assert task.train_problem(3) == task.train_problem(303)  # modulo the train size
    with pytest.raises(KeyError):
        task.problem("test:256")


def test_columns_hold_the_generator_entry(tasks):
    p = tasks[WORDS].problems("test")[0]
    assert set(p.columns) == {"question", "answer", "metadata"}
    assert p.columns["question"] == p.question and p.columns["answer"] == p.gold
    assert p.columns["metadata"]["source_dataset"] == WORDS


@pytest.mark.parametrize("generator", GENERATORS)
def test_reward_is_the_generators_checker_under_the_strict_format(tasks, generator):
    task = tasks[generator]
    for p in task.problems("test")[:10] + task.problems("ood")[:5] + task.problems("train")[:5]:
        assert task.reward(strict(p.gold), p) == 1.0
        assert task.reward(p.gold, p) == 0.0  # no format
        assert task.reward(f"{strict(p.gold)} and more", p) == 0.0  # text after the answer
        wrong = str(int(p.gold) + 1) if generator == "chain_sum" else "qqqq"
        assert task.reward(strict(wrong), p) == 0.0


def test_partial_credit_and_a_failing_checker():
    task = ReasoningGymTask("word_sorting", seed=1, size=20)
    p = task.problems("test")[0]
    assert task.reward(strict(p.gold), p) == 1.0
    words = p.gold.split(", ")
    assert 0.0 < task.reward(strict(", ".join([words[0], "qqqq", *words[2:]])), p) < 1.0
    broken = Problem(id=p.id, question=p.question, gold=p.gold, columns={"answer": p.gold})
    assert task.reward(strict(p.gold), broken) == 0.0  # score_answer raised KeyError


def test_registry_builds_it_with_size_and_shots():
    task = make_task(TaskConfig(name="reasoning-gym:chain_sum", size=50, shots=1))
    assert isinstance(task, ReasoningGymTask) and task.name == "reasoning-gym:chain_sum"
    assert len(task.problems("train")) == 50 and task.splits == ("train", "test", "ood")
    assert task.max_new_tokens == 256
    assert len(ReasoningGymTask("chain_sum").problems("train")) == 2000  # size 0: the default


def test_unknown_generator_lists_names():
    task = make_task(TaskConfig(name="reasoning-gym:chain_summ"))  # built cheaply, checked on load
    with pytest.raises(TaskError) as exc:
        task.problems("train")
    msg = str(exc.value)
    assert "chain_summ" in msg and "chain_sum" in msg and "basic_arithmetic" in msg
    assert "reasoning_gym.factory" in msg and "DATASETS" in msg
    with pytest.raises(TaskError, match="letters, digits"):
        make_task(TaskConfig(name="reasoning-gym:chain-sum!"))
    with pytest.raises(TaskError, match="shots"):
        make_task(TaskConfig(name="reasoning-gym:chain_sum", shots=3))
    with pytest.raises(TaskError, match="size"):
        make_task(TaskConfig(name="reasoning-gym:chain_sum", size=-1))


def test_missing_package_names_the_pip_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # what `import` sees when not installed
    with pytest.raises(ImportError, match=r'pip install -e "\.\[tasks\]"'):
        ReasoningGymTask("chain_sum", size=5).problems("train")


def test_registration_does_not_import_reasoning_gym():
    code = "import sys, ftis_flwr.tasks; print('reasoning_gym' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()[-1]
    assert out == "False"


def test_prompt_through_a_chat_template():
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(ROOT / "ftis_flwr/assets/tiny/bpe-tokenizer.json"))
    tok.chat_template = CHAT_TEMPLATE
    task = ReasoningGymTask(WORDS, seed=3, size=20, shots=1)
    p = task.problems("test")[0]
    text = task.prompt_text(p, tok)
    (demo_q, demo_a), = task.demos()[:1]
    assert text.startswith(f"<|system|>{SYSTEM_PROMPT}\n<|user|>{demo_q.strip()}\n<|assistant|>{demo_a}\n")
    assert text.endswith(f"<|user|>{p.question.strip()}\n<|assistant|>")
    assert demo_a.startswith("<think>") and demo_a.endswith("</answer>")
    ids = task.prompt_ids(p, tok)
    assert ids and all(isinstance(i, int) for i in ids)
    zero = ReasoningGymTask(WORDS, seed=3, size=20).prompt_text(p, tok)  # shots 0 (default)
    assert zero == f"<|system|>{SYSTEM_PROMPT}\n<|user|>{p.question.strip()}\n<|assistant|>"
    plain = task.prompt_text(p, object())  # no chat template: plain text (a base model)
    assert plain.startswith(SYSTEM_PROMPT) and plain.endswith("Assistant:")


def test_the_installed_release_is_part_of_what_nodes_must_agree_on():
    """Another reasoning-gym release may generate other problems at the same seeds: a node
    reports the release with its task's parts (the server compares them)."""
    from importlib.metadata import version

    from ftis_flwr.tasks.fingerprint import task_parts

    cfg = TaskConfig(name="reasoning-gym:chain_sum", size=5)
    assert task_parts(cfg, make_task(cfg))["reasoning-gym"] == version("reasoning-gym")
