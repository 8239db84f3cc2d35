"""Tasks: generated arithmetic splits, GSM8K/MATH JSONL loading, ids and the train shuffle."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from ftis_flwr.config.schema import TaskConfig
from ftis_flwr.node.tiny.models import build_char_tokenizer
from ftis_flwr.tasks import ArithmeticTask, MathTask, Problem, load_jsonl, make_task, op_of
from ftis_flwr.tasks.chat_prompt import chat_prompt

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
"""``../shared/data`` beside the clone (a session's and CI's layout); tests that read it skip without it."""


def _eval(question: str) -> int:
    m = re.fullmatch(r"(\d\d)([+-])(\d\d)=", question)
    assert m, question
    a, op, b = int(m[1]), m[2], int(m[3])
    return a + b if op == "+" else a - b


# ------------------------------------------------------------------------------ arithmetic

@pytest.fixture(scope="module")
def arith() -> ArithmeticTask:
    return ArithmeticTask(seed=1234)


def test_arithmetic_splits_are_disjoint_and_golds_correct(arith):
    questions = {s: [p.question for p in arith.problems(s)] for s in arith.splits}
    assert arith.splits == ("train", "test", "ood")
    for s, qs in questions.items():
        assert len(set(qs)) == len(qs), f"duplicates in {s}"
    assert not set(questions["train"]) & set(questions["test"])
    assert not set(questions["train"]) & set(questions["ood"])
    assert not set(questions["test"]) & set(questions["ood"])
    for s in arith.splits:
        for p in arith.problems(s):
            assert int(p.gold) == _eval(p.question) >= 0
            assert p.gold == str(int(p.gold))  # no leading zeros in answers
    # in-distribution: two 2-digit operands; ood: one operand below 10 (written "0d")
    assert all(not re.search(r"(^|[+-])0", q) for q in questions["train"] + questions["test"])
    assert all(re.search(r"(^|[+-])0\d", q) for q in questions["ood"])
    for s in arith.splits:  # both operations in every split
        assert {op_of(p) for p in arith.problems(s)} == {"+", "-"}


def test_arithmetic_is_deterministic_and_seeded(arith):
    again = ArithmeticTask(seed=1234)
    for s in arith.splits:
        assert again.problems(s) == arith.problems(s)
    other = ArithmeticTask(seed=99)
    assert other.problems("test") != arith.problems("test")
    assert [again.train_problem(i) for i in range(50)] == [arith.train_problem(i) for i in range(50)]


def test_train_problem_index_is_modulo_a_shuffle(arith):
    n = len(arith.problems("train"))
    assert arith.train_problem(3) == arith.train_problem(3 + n) == arith.train_problem(3 + 5 * n)
    first = [arith.train_problem(i) for i in range(n)]
    assert sorted(p.id for p in first) == sorted(p.id for p in arith.problems("train"))
    assert [p.id for p in first[:20]] != [p.id for p in arith.problems("train")[:20]]


def test_problem_lookup_and_unknown_ids(arith):
    p = arith.problems("test")[7]
    assert arith.problem("test:7") == p and p.id == "test:7"
    n = len(arith.problems("test"))
    for bad in (f"test:{n}", "test:-1", "test:x", "test:07", "nosplit:1", "17"):
        with pytest.raises(KeyError, match=re.escape(bad)):
            arith.problem(bad)
    with pytest.raises(KeyError, match=f"0..{n - 1}"):
        arith.problem(f"test:{n}")
    with pytest.raises(KeyError, match="train, test, ood"):
        arith.problems("validation")


def test_warmstart_data_restricted_to_ops_and_train(arith):
    train_ids = {p.id for p in arith.problems("train")}
    add, sub, both = (arith.warmstart_problems(o) for o in ("+", "-", "+-"))
    assert {op_of(p) for p in add} == {"+"} and {op_of(p) for p in sub} == {"-"}
    assert len(add) + len(sub) == len(both) == len(train_ids)
    assert {p.id for p in both} == train_ids
    for bad in ("", "*", "+x"):
        with pytest.raises(ValueError, match="ops"):
            arith.warmstart_problems(bad)


def test_arithmetic_prompt_and_reward(arith):
    p = arith.problems("test")[0]
    assert arith.prompt_text(p, build_char_tokenizer()) == p.question
    assert arith.reward(p.gold, p) == 1.0
    assert arith.reward(p.gold + "1", p) == 0.0
    assert arith.max_new_tokens >= 4


def test_make_task():
    assert isinstance(make_task(TaskConfig()), ArithmeticTask)
    assert make_task(TaskConfig(seed=7)).seed == 7
    assert isinstance(make_task(TaskConfig(name="gsm8k")), MathTask)
    assert make_task(TaskConfig(name="math500")).eval_splits[0] == "math500"
    assert make_task(TaskConfig(name="arithmetic-heldout")).name == "arithmetic-heldout"
    assert make_task(TaskConfig(name="arithmetic-chain")).eval_splits == ("test",)
    names = "arithmetic, arithmetic-heldout, arithmetic-chain, basic-math, basic-math-20, gsm8k, math500"
    with pytest.raises(ValueError, match=names):
        make_task(TaskConfig(name="mnist"))


# ------------------------------------------------------------------------------ gsm8k / math

GSM_ROWS = [
    {"question": "tom has 3 apples and buys 4 more. how many?", "answer": "3+4=7\n#### 7"},
    {"question": "a box holds 1,200 pins; how many in 2 boxes?", "answer": "so\n#### 2,400"},
]
MATH_ROWS = [{"problem": "what is $\\frac{1}{2}+\\frac{1}{4}$?", "answer": "\\frac{3}{4}",
              "solution": "...", "level": 1}]


def _write(path: Path, rows, extra: str = "") -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n" + extra)
    return path


def test_jsonl_gsm8k_and_math_rows(tmp_path):
    gsm = load_jsonl(_write(tmp_path / "g.jsonl", GSM_ROWS, extra="\n\n"), "train")
    assert gsm == [Problem("train:0", GSM_ROWS[0]["question"], "7"),
                   Problem("train:1", GSM_ROWS[1]["question"], "2400")]
    math = load_jsonl(_write(tmp_path / "m.jsonl", MATH_ROWS), "math500")
    assert math == [Problem("math500:0", MATH_ROWS[0]["problem"], "\\frac{3}{4}")]


@pytest.mark.parametrize("line, match", [
    ("{not json", "invalid JSON"),
    ('{"question": "q", "answer": "no marker"}', "####"),
    ('{"text": "q"}', "'question'\\+'answer'"),
    ('["a", "b"]', "JSON object"),
])
def test_jsonl_bad_rows_name_file_and_line(tmp_path, line, match):
    path = _write(tmp_path / "bad.jsonl", GSM_ROWS, extra=line + "\n")
    with pytest.raises(ValueError, match=match) as err:
        load_jsonl(path, "train")
    assert f"{path}: line 3" in str(err.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_jsonl(tmp_path / "nope.jsonl", "train")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no rows"):
        load_jsonl(tmp_path / "empty.jsonl", "train")
    task = make_task(TaskConfig(name="gsm8k", train_path=str(tmp_path / "gone.jsonl"),
                                eval_paths={"test": str(tmp_path / "gone.jsonl")}))
    with pytest.raises(FileNotFoundError, match="gone.jsonl"):
        task.train_problem(0)


def test_math_task_from_local_files(tmp_path):
    train = _write(tmp_path / "train.jsonl", GSM_ROWS)
    math = _write(tmp_path / "math.jsonl", MATH_ROWS)
    task = make_task(TaskConfig(name="gsm8k", train_path=str(train),
                                eval_paths={"test": str(train), "math500": str(math)}, seed=3))
    assert task.splits == ("train", "test", "math500")
    assert task.problem("math500:0").gold == "\\frac{3}{4}"
    assert {task.train_problem(i).id for i in range(4)} == {"train:0", "train:1"}
    assert task.train_problem(0) == task.train_problem(2)
    with pytest.raises(KeyError, match="math500:1"):
        task.problem("math500:1")
    p = task.problem("train:0")
    assert task.reward("<think>3 and 4</think><answer>7</answer>", p) == 1.0
    assert task.reward("<think>3 and 4</think><answer>8</answer>", p) == 0.0
    assert task.reward("7", p) == 0.0  # strict format
    with pytest.raises(ValueError, match="reserved"):
        MathTask("gsm8k", str(train), {"train": str(train)})


def test_math_prompt_uses_chat_template_with_system_prompt():
    from ftis_flwr.tasks.rewards import SYSTEM_PROMPT

    tok = build_char_tokenizer()
    plain = chat_prompt("what is 2+2?", tok)  # no template: plain-text fallback
    assert plain.startswith(SYSTEM_PROMPT) and "what is 2+2?" in plain
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    text = chat_prompt("what is 2+2?", tok)
    assert text == f"[system]{SYSTEM_PROMPT}\n[user]what is 2+2?\n[assistant]"


@pytest.mark.parametrize("name, rows", [("gsm8k_train.jsonl", 7473), ("gsm8k_test.jsonl", 1319),
                                        ("math500_test.jsonl", 500)])
def test_shared_data_files(name, rows):
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"{path} not present (optional real data; the project does not need it)")
    problems = load_jsonl(path, "x")
    assert len(problems) == rows
    assert all(p.gold and p.question for p in problems)
    if name.startswith("gsm8k"):
        assert all(re.fullmatch(r"-?[\d.]+", p.gold) for p in problems)


def test_gsm8k_and_math500_are_data_set_tasks_with_the_same_problems_and_ids():
    """GSM8K and MATH-500 load through the data set task (tasks/dataset.py); the first problems,
    their ids, golds and train order are pinned (from ../shared/data, skipped without it)."""
    from ftis_flwr.tasks.dataset import DatasetTask

    files = {n: SHARED / f for n, f in (("train", "gsm8k_train.jsonl"), ("test", "gsm8k_test.jsonl"),
                                         ("math500", "math500_test.jsonl"))}
    if not all(f.is_file() for f in files.values()):
        pytest.skip("../shared/data not present (optional real data; the project does not need it)")
    task = make_task(TaskConfig(name="gsm8k", train_path=str(files["train"]),
                                eval_paths={"test": str(files["test"]), "math500": str(files["math500"])}))
    assert isinstance(task, DatasetTask) and task.splits == ("train", "test", "math500")
    first = task.problem("test:0")
    assert first.question.startswith("Janet\u2019s ducks lay 16 eggs per day.") and first.gold == "18"
    assert task.problem("train:0").gold == "72" and task.problem("train:0").question.startswith("Natalia sold clips")
    assert task.problem("math500:0").gold == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert [task.train_problem(i).id for i in range(3)] == ["train:3169", "train:797", "train:5780"]
    every = "".join(p.id + p.question + p.gold for s in task.splits for p in task.problems(s))
    assert hashlib.sha256(every.encode()).hexdigest()[:16] == "8658d072c703dc12"  # as before the data set task
    assert task.rewards(["<think> x </think><answer> 18 </answer>"], [first]) == [1.0]


# ------------------------------------------------------------------------------ arithmetic-heldout

def test_heldout_variant_holds_carried_additions_out_of_rl_and_keeps_warmstarts(arith):
    """The OOD split with signal (benchmarks/ood_probe.py): units-carry additions of the base test
    split, never in the RL train split; the warm-start data is the base task's, unchanged."""
    held = make_task(TaskConfig(name="arithmetic-heldout", seed=1234))
    assert held.name == "arithmetic-heldout" and held.eval_splits == ("test", "ood")
    q = {s: [p.question for p in held.problems(s)] for s in held.splits}
    parsed = {s: [re.fullmatch(r"(\d\d)([+-])(\d\d)=", x).groups() for x in qs]
              for s, qs in q.items() if s != "ood-lead0"}
    carry = lambda a, op, b: op == "+" and int(a) % 10 + int(b) % 10 >= 10  # noqa: E731
    assert q["ood"] and all(carry(*t) for t in parsed["ood"])
    assert not any(carry(*t) for t in parsed["train"] + parsed["test"])
    base_test = [p.question for p in arith.problems("test")]
    assert sorted(q["test"] + q["ood"]) == sorted(base_test)  # a partition of the base test split
    assert set(q["train"]) < set(p.question for p in arith.problems("train"))
    assert not set(q["train"]) & set(q["ood"]) and not set(q["test"]) & set(q["ood"])
    assert {op_of(p) for p in held.problems("test")} == {"+", "-"}
    assert q["ood-lead0"] == [p.question for p in arith.problems("ood")]  # the old split, renamed
    same = lambda ps: [(p.question, p.gold) for p in ps]  # noqa: E731
    assert same(held.warmstart_problems("+-")) == same(arith.warmstart_problems("+-"))
    assert [int(p.gold) for p in held.problems("ood")] == \
        [int(a) + int(b) for a, _, b in parsed["ood"]]


def test_weighted_warmstart_mix_and_unchanged_plain_keys(arith):
    from ftis_flwr.config.schema import ModelCard
    from ftis_flwr.node.tiny.models import warmstart_dir

    plain = arith.warmstart_problems("+-")
    heavy_add = arith.warmstart_problems("+++-")
    n_add = sum(op_of(p) == "+" for p in plain)
    assert sum(op_of(p) == "+" for p in heavy_add) == n_add
    assert sum(op_of(p) == "-" for p in heavy_add) == round((len(plain) - n_add) / 3)
    assert set(p.id for p in heavy_add) < set(p.id for p in plain)
    assert arith.warmstart_problems("++--") == plain  # equal weights: the plain mix
    card = lambda ops: ModelCard(tiny_size="small", warmstart_ops=ops, warmstart_target=0.6, seed=0)  # noqa: E731
    # the shipped model's folder name (and key) must not move; weighted mixes get their own
    assert warmstart_dir(card("+-"), arith, Path("/tmp/c")).name == "small-addsub-2500steps-seed0-49285e49cb0dbde0"
    assert warmstart_dir(card("+++-"), arith, Path("/tmp/c")).name.startswith("small-add3sub1-")
    assert warmstart_dir(card("+---"), arith, Path("/tmp/c")).name.startswith("small-add1sub3-")


def test_basic_math_20_holds_out_256_disjoint_problems_and_keeps_basic_math_as_it_was():
    """basic-math-20 (#24's sweep): 256 held-out test problems, disjoint from train, none of them
    a worked example; OOD operands above 20. basic-math itself draws the same splits as before."""
    import re

    from ftis_flwr.config.schema import TaskConfig
    from ftis_flwr.tasks import make_task
    from ftis_flwr.tasks.basic_math import DEMOS

    wide = make_task(TaskConfig(name="basic-math-20", shots=1))
    test, train, ood = (wide._load_split(s) for s in ("test", "train", "ood"))
    assert len(test) == 256 and len(train) >= 340 and len(ood) == 64
    questions = [p.question for p in test + train]
    assert len(set(questions)) == len(questions)
    assert not set(questions) & {q for q, _ in DEMOS}
    assert max(int(n) for p in test + train for n in re.findall(r"\d+", p.question)) == 20
    assert min(max(int(n) for n in re.findall(r"\d+", p.question)) for p in ood) > 20
    narrow = make_task(TaskConfig(name="basic-math", shots=1))
    assert len(narrow._load_split("test")) == 64 and narrow.name == "basic-math" and wide.name == "basic-math-20"
    assert narrow._load_split("test")[0].question == "What is 2 plus 8?"  # as generated before #24


def test_a_plain_prompt_gets_the_tokenizers_bos_and_a_chat_template_prompt_does_not():
    """A base model's tokenizer (no chat template) adds its own BOS, as Gemma's does: the prompt
    must carry it (base Gemma 3: 0/32 greedy without, 10/32 with). A chat template writes its
    special tokens itself, so nothing is added to its text."""
    from tokenizers.processors import TemplateProcessing

    from ftis_flwr.config.schema import TaskConfig
    from ftis_flwr.node.tiny.bpe import build_tiny_tokenizer
    from ftis_flwr.tasks import make_task

    tok = build_tiny_tokenizer("char")
    bos = tok.convert_tokens_to_ids("<eos>")  # stands in for a BOS: any special token will do
    backend = tok.backend_tokenizer
    backend.post_processor = TemplateProcessing(single="<eos> $A", special_tokens=[("<eos>", bos)])
    task = make_task(TaskConfig(name="basic-math", shots=1))
    problem = task._load_split("test")[0]
    plain = tok(task.prompt_text(problem, tok), add_special_tokens=False)["input_ids"]
    assert task.prompt_ids(problem, tok) == [bos] + plain
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    templated = task.prompt_text(problem, tok)
    assert task.prompt_ids(problem, tok) == tok(templated, add_special_tokens=False)["input_ids"]


def test_basic_math_pays_for_the_number_not_for_the_question_copied_into_the_answer():
    """#24: Gemma 3 270M, trained alone, learned to answer ``<answer>43+29</answer>``, which
    math-verify evaluates to 72 (100% on every split). basic-math pays only for the number; the
    paper's math reward (GSM8K, MATH) still takes expressions, as math-verify does."""
    from ftis_flwr.config.schema import TaskConfig
    from ftis_flwr.tasks import make_task
    from ftis_flwr.tasks.rewards import math_reward

    task = make_task(TaskConfig(name="basic-math-20", shots=1))
    problem = next(p for p in task._load_split("ood") if "plus" in p.question)
    a, b = (int(w) for w in problem.question.rstrip("?").split()[2::2])
    copied = f"<think>{a}+{b}</think><answer>{a}+{b}</answer>"
    assert math_reward(copied, problem.gold) == 1.0  # the hole: math-verify adds them up
    assert task.reward(copied, problem) == 0.0
    for answer in (problem.gold, f" {problem.gold} ", f"${problem.gold}$", f"\\boxed{{{problem.gold}}}",
                   f"{problem.gold}."):
        assert task.reward(f"<think> {a} plus {b} is {problem.gold}. </think><answer>{answer}</answer>",
                           problem) == 1.0, answer
    wrong = str(int(problem.gold) + 1)
    for answer in (wrong, f"{problem.gold}+0", f"{int(problem.gold) * 2}/2", "", "seventy"):
        assert task.reward(f"<think>x</think><answer>{answer}</answer>", problem) == 0.0, answer
    assert task.reward(f"{problem.gold}", problem) == 0.0  # the format still counts
