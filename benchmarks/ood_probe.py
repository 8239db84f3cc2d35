"""Choose the arithmetic task's out-of-distribution split from the STARTING models only.

    nice -n 15 python -m benchmarks.ood_probe

An OOD split is useful when the warm-started models start clearly above 0 and below their
in-distribution accuracy: then it can move either way as the federation trains. This script
scores every candidate split with the warm-started (shipped / cached) models, greedily, before
any federated training (no method result is read). Each candidate has one question length,
so left padding never mixes shapes within a batch.
"""

from __future__ import annotations

import argparse
import logging
import random
import time

import torch

from ftis_flwr.config.schema import ModelCard  # noqa: E402
from ftis_flwr.node.tiny.models import build_char_tokenizer, warm_start  # noqa: E402
from ftis_flwr.tasks import ArithmeticTask  # noqa: E402

N = 400


def _ans(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def candidates() -> dict[str, list[tuple[str, str]]]:
    """name -> (question, gold) pairs; every question of a candidate has the same length."""
    two, one = range(10, 100), range(0, 10)

    def fmt(items, la="{:d}", lb="{:d}"):
        return [(f"{la.format(a)}{op}{lb.format(b)}=", str(_ans(a, op, b))) for a, op, b in items]

    c = {
        "test (in-distribution)": None,
        "lead0 (current ood: 07+48=, 48-07=)": None,
        "3d+2d, first 100-199 (123+45=)": fmt([(a, "+", b) for a in range(100, 200) for b in two]),
        "2d+3d, second 100-199 (45+123=)": fmt([(a, "+", b) for a in two for b in range(100, 200)]),
        "3d-2d, first 100-199 (123-45=)": fmt([(a, "-", b) for a in range(100, 200) for b in two]),
        "3d+-2d, first 100-119 (104+37=, 104-37=)":
            fmt([(a, op, b) for a in range(100, 120) for b in two for op in "+-"]),
        "both lead0 (07+05=)": fmt([(a, "+", b) for a in one for b in one]
                                   + [(a, "-", b) for a in one for b in one if a >= b], "{:02d}", "{:02d}"),
        "negative result (23-48=)": fmt([(a, "-", b) for a in two for b in two if a < b]),
        "unpadded 1-digit second (48+7=, 48-7=)":
            fmt([(a, op, b) for a in two for b in one for op in "+-"]),
        "unpadded 1-digit first (7+48=)": fmt([(a, "+", b) for a in one for b in two]),
        "3-digit zero-padded first (037+48=)":
            fmt([(a, op, b) for a in two for b in two for op in "+-" if _ans(a, op, b) >= 0], "{:03d}"),
    }
    # format shifts of in-distribution questions (same skill, shape never seen in warm-start)
    ind = [(a, op, b) for a in two for b in two for op in "+-" if _ans(a, op, b) >= 0]
    for label, tmpl in [("leading space ( 37+48=)", " {a}{op}{b}="), ("two leading spaces", "  {a}{op}{b}="),
                        ("space before op (37 +48=)", "{a} {op}{b}="), ("space after op (37+ 48=)", "{a}{op} {b}="),
                        ("space before = (37+48 =)", "{a}{op}{b} ="), ("trailing space (37+48= )", "{a}{op}{b}= "),
                        ("parentheses ((37+48)=)", "({a}{op}{b})="), ("prefix q: (q:37+48=)", "q:{a}{op}{b}=")]:
        c[label] = [(tmpl.format(a=a, op=op, b=b), str(_ans(a, op, b))) for a, op, b in ind]
    return c


@torch.no_grad()
def greedy(model, tok, pairs: list[tuple[str, str]]) -> float:
    enc = tok([q for q, _ in pairs], return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, do_sample=False, max_new_tokens=6, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(t.strip() == g for t, (_, g) in zip(texts, pairs)) / len(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=N, help="problems per candidate (sampled, fixed seed)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    task = ArithmeticTask(seed=1234)
    cards = [  # the shipped cpu-pair models, and the cached same-recipe small model of seed 1
        ModelCard(name="small-s0 (shipped)", tiny_size="small", warmstart_ops="+-", warmstart_target=0.6, seed=0),
        ModelCard(name="large-s1 (shipped)", tiny_size="large", warmstart_ops="+-", warmstart_target=0.6, seed=1),
        ModelCard(name="small-s1", tiny_size="small", warmstart_ops="+-", warmstart_target=0.6, seed=1),
    ]
    from ftis_flwr.node.tiny.models import MARKER, warmstart_dir

    for ops, name in (("+++-", "adder (cpu-expertise)"), ("+---", "subtractor (cpu-expertise)")):
        card = ModelCard(name=name, tiny_size="small", warmstart_ops=ops, warmstart_target=0.6, seed=0)
        if (warmstart_dir(card, task) / MARKER).is_file():  # shown when cached; never built here
            cards.append(card)
    tok = build_char_tokenizer()
    models = {c.name: AutoModelForCausalLM.from_pretrained(str(warm_start(c, task))).eval() for c in cards}
    rng = random.Random(0)
    cands = candidates()
    cands["test (in-distribution)"] = [(p.question, p.gold) for p in task.problems("test")]
    cands["lead0 (current ood: 07+48=, 48-07=)"] = [(p.question, p.gold) for p in task.problems("ood")]
    held = ArithmeticTask(seed=1234, heldout=True)  # a kind held out of RL (see the task docstring)
    cands["heldout test (test minus carry additions)"] = [(p.question, p.gold) for p in held.problems("test")]
    cands["heldout ood (test's units-carry additions: 37+48=)"] = [(p.question, p.gold) for p in held.problems("ood")]
    names = list(models)
    print(f"| candidate | n | {' | '.join(names)} |")
    print("| --- | --- |" + " --- |" * len(names))
    t0 = time.perf_counter()
    for cname, pairs in cands.items():
        pairs = list(pairs)
        if len(pairs) > args.n:
            pairs = rng.sample(pairs, args.n)
        by_len: dict[int, list] = {}
        for q in pairs:
            by_len.setdefault(len(q[0]), []).append(q)
        accs = []
        for m in models.values():  # one batch per question length: no mixed left padding
            hits = sum(greedy(m, tok, grp) * len(grp) for grp in by_len.values())
            accs.append(hits / len(pairs))
        print(f"| {cname} | {len(pairs)} | {' | '.join(f'{a:.3f}' for a in accs)} |", flush=True)
    print(f"\n({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
