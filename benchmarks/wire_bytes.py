"""Bytes per completion token on the wire, measured from the Flower records themselves (issue #9).

    python -m benchmarks.wire_bytes            # synthetic + real tiny-model groups (~1 min)
    python -m benchmarks.wire_bytes --no-real  # synthetic only (seconds)

Prints, side by side, bytes per completion token of format 1 ("arrays": fp32, 16-bit) and of the
compact format 2 (each log-prob codec, with and without zlib), next to what weight sharing would
ship per generated token (FedAvg: the model's parameters, and a LoRA adapter r=16 on q,k,v,o),
with encode and decode seconds (medians of 5; timings, printed, never asserted).

Payloads: a paper-sized one (12 groups x G=12, 320-640-token completions, Qwen2.5's 151,665-token
vocabulary) and two of the offline default's shape (its 16 groups x 8 x <=3 tokens, and
the preset's real 64 groups x 8, <=6 tokens, 62-symbol vocabulary). Synthetic ids are uniform and
synthetic log-probs -Exp(1): nothing for a compressor to find. ``--real`` (default) also samples
one round of groups from the shipped tiny models of the cpu-pair preset (each node's 64 prompts
x 8) and measures there, and compares fp16 with bf16 on their real log-probs: the error in the
truncated importance weight min(exp(lp - gen), 2) and in the filter's per-sample k3 KL, lp being
the *other* node's log-probs of the same tokens (what a receiver computes).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from flwr.app import RecordDict
from flwr.common.serde import recorddict_to_proto

from ftis_flwr.config.schema import WireConfig  # noqa: E402
from ftis_flwr.wire.groups import Group  # noqa: E402
from ftis_flwr.wire.rollouts import completion_tokens, decode_groups, encode_groups, payload_bytes

VARIANTS = [("arrays", "fp32", "none"), ("arrays", "fp16", "none"), ("arrays", "bf16", "none")] + [
    ("compact", lp, c) for lp in ("fp32", "fp16", "bf16") for c in ("none", "zlib")]
QWEN_1_5B = dict(params=1.54e9, hidden=1536, layers=28, kv_dim=2 * 128)


def lora_params(hidden: int, layers: int, kv_dim: int, r: int = 16) -> int:
    """LoRA r on q, k, v, o: r * (in + out) per projection (q, o: hidden->hidden; k, v: ->kv)."""
    return layers * r * (2 * (hidden + hidden) + 2 * (hidden + kv_dim))


def make_groups(n_groups: int, g: int, length: int, vocab: int, prompt_len: int, seed: int = 0) -> list[Group]:
    rng = np.random.default_rng(seed)
    groups = []
    for i in range(n_groups):
        comps = [rng.integers(0, vocab, size=int(rng.integers(max(length // 2, 1), length + 1)))
                 for _ in range(g)]
        groups.append(Group(
            prompt_id=f"train:{i}", prompt_tokens=rng.integers(0, vocab, size=prompt_len),
            completions=comps, logprobs=[-rng.exponential(1.0, size=len(c)).astype(np.float32) for c in comps],
            rewards=rng.integers(0, 2, size=g).astype(np.float32), node="a", model_id="a:model",
            tokenizer_fp="0123456789abcdef"))
    return groups


def _median_seconds(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(name: str, groups: list[Group], vocab: int, params: float, lora: int) -> None:
    """One block of the table: every wire variant, then weights and adapter per token."""
    wire = WireConfig()
    fp = groups[0].tokenizer_fp
    print(f"\n{name}")
    print(f"  {'format':8s} {'log-prob':8s} {'compress':8s} {'B/token':>8s} {'proto B/tok':>11s} "
          f"{'encode s':>9s} {'decode s':>9s}")
    tokens = 0
    for fmt, lp, comp in VARIANTS:
        if fmt == "arrays" and comp != "none":
            continue

        def enc():  # enc and the decoder below run within this iteration only: the loop's values are this variant's
            return encode_groups(groups, logprob_dtype=lp, vocab_size=vocab, format=fmt, compress=comp)  # noqa: B023

        arrays, meta = enc()
        tokens = completion_tokens(arrays)
        proto = recorddict_to_proto(RecordDict({"groups": arrays, "groups.meta": meta})).ByteSize()
        t_enc = _median_seconds(enc)
        t_dec = _median_seconds(
            lambda: decode_groups(arrays, meta, expected_fp=fp, vocab_size=vocab, wire=wire))  # noqa: B023
        print(f"  {fmt:8s} {lp:8s} {comp:8s} {payload_bytes(arrays, meta) / tokens:8.2f} "
              f"{proto / tokens:11.2f} {t_enc:9.4f} {t_dec:9.4f}")
    for what, count in (("weights (FedAvg)", params), ("LoRA r=16 q,k,v,o", lora)):
        per = " ".join(f"{nbytes}B/param {count * nbytes / tokens:10.1f}" for nbytes in (4, 2))
        print(f"  {what:26s} {count:12,.0f} params  {per}   (per round: {tokens} tokens)")


def logprob_error(gen: np.ndarray, lp: np.ndarray, seq: np.ndarray, g: float = 50.0, c: float = 2.0) -> None:
    """fp16 vs bf16 for the sender's log-probs ``gen`` (lp: the receiver's, exact; seq: sequence
    index of each token): errors in gen, in w = min(exp(lp - gen), c) and in the per-sample k3 KL."""
    from ftis_flwr.wire.compact import decode_logprobs, encode_logprobs

    def k3(gen_):
        d = gen_.astype(np.float64) - lp
        per_tok = np.expm1(d) - d
        n = np.bincount(seq)
        return np.bincount(seq, per_tok) / n

    w_true = np.minimum(np.exp(lp - gen.astype(np.float64)), c)
    kl_true = k3(gen)
    print(f"  {'codec':5s} {'max |dgen|':>11s} {'mean |dgen|':>11s} {'max |dw|':>10s} {'mean |dw|':>10s} "
          f"{'max rel dKL':>11s} {'median rel dKL':>14s} {'filter flips (g=50)':>20s}")
    for codec in ("fp16", "bf16"):
        q = decode_logprobs(encode_logprobs(gen, codec), codec).astype(np.float64)
        dg = np.abs(q - gen)
        w = np.minimum(np.exp(lp - q), c)
        kl = k3(q)
        rel = np.abs(kl - kl_true) / np.maximum(kl_true, 1e-12)
        flips = int(((kl > g) != (kl_true > g)).sum())
        print(f"  {codec:5s} {dg.max():11.2e} {dg.mean():11.2e} {np.abs(w - w_true).max():10.2e} "
              f"{np.abs(w - w_true).mean():10.2e} {rel.max():11.2e} {np.median(rel):14.2e} "
              f"{flips:9d} of {len(kl_true)}")


def range_table() -> None:
    """Worst rounding error of each codec over log-prob ranges (fp16 is subnormal under 6.1e-5,
    tops out at -65504; a sampled token's log-prob is above about -104 in fp32)."""
    from ftis_flwr.wire.compact import decode_logprobs, encode_logprobs

    print("\n16-bit rounding error by log-prob range (1e5 values each, uniform in the range)")
    print(f"  {'range':>18s} {'fp16 max |err|':>15s} {'bf16 max |err|':>15s} {'fp16 max dw/w':>14s} "
          f"{'bf16 max dw/w':>14s}")
    rng = np.random.default_rng(0)
    for lo, hi in ((-1e-6, 0), (-1e-4, -1e-6), (-0.01, -1e-4), (-1, -0.01), (-10, -1), (-70, -10), (-104, -70)):
        x = rng.uniform(lo, hi, 100_000).astype(np.float32)
        errs = [np.abs(decode_logprobs(encode_logprobs(x, c), c).astype(np.float64) - x).max()
                for c in ("fp16", "bf16")]
        print(f"  {f'[{lo:g}, {hi:g}]':>18s} {errs[0]:15.2e} {errs[1]:15.2e} {np.expm1(errs[0]):14.2e} "
              f"{np.expm1(errs[1]):14.2e}")


def real_groups():
    """One round of groups from each shipped tiny model of the cpu-pair preset, and each node's
    learner log-probs of the other node's samples."""
    import torch

    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.logprobs import completion_logprobs, pack_batch
    from ftis_flwr.node.node import Node

    exp = load_experiment("cpu-pair")
    nodes = [Node(card, exp) for card in exp.nodes]
    idx = list(range(exp.rounds.prompts_per_node))
    out = []
    for k, node in enumerate(nodes):
        groups = node.generate(idx if k == 0 else [i + len(idx) for i in idx], exp.rollout.group_size, 0)
        other = nodes[1 - k]
        prompts = [g.prompt_tokens for g in groups for _ in g.completions]
        comps = [c for g in groups for c in g.completions]
        batch = pack_batch(prompts, comps, pad_id=other.tokenizer.pad_token_id)
        with torch.no_grad():
            lp = completion_logprobs(other.model, batch, temperature=exp.rollout.temperature,
                                     vocab_size=other.vocab_size).float().numpy()
        learner = np.concatenate([lp[i, : len(c)] for i, c in enumerate(comps)])
        seq = np.concatenate([np.full(len(c), i) for i, c in enumerate(comps)])
        out.append((node, groups, learner, seq, sum(p.numel() for p in node.model.parameters())))
    return exp, out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-real", action="store_true", help="skip the tiny models' real groups")
    args = ap.parse_args(argv)
    tiny_lora = lora_params(hidden=128, layers=2, kv_dim=2 * 32)  # the small node's architecture
    cases = [("paper (12x12, 320-640 tok, vocab 151665; Qwen2.5-1.5B)", (12, 12, 640, 151_665, 150),
              QWEN_1_5B["params"], lora_params(QWEN_1_5B["hidden"], QWEN_1_5B["layers"], QWEN_1_5B["kv_dim"])),
             ("cpu README case (16x8, <=3 tok, vocab 64; small tiny model)", (16, 8, 3, 64, 6), 0.5e6, tiny_lora),
             ("cpu default shape (64x8, <=6 tok, vocab 62; small tiny model)", (64, 8, 6, 62, 6), 0.5e6, tiny_lora)]
    print("Synthetic payloads (uniform ids, log-probs -Exp(1)); B/token = payload_bytes / completion tokens")
    for name, (n, g, length, vocab, plen), params, lora in cases:
        measure(name, make_groups(n, g, length, vocab, plen), vocab, params, lora)
    range_table()
    rng = np.random.default_rng(1)
    gen = np.concatenate([-rng.exponential(0.02, 80_000), -rng.exponential(3.0, 20_000)]).astype(np.float32)
    lp = gen.astype(np.float64) + rng.normal(0, 0.3, len(gen))
    lp = np.minimum(lp, 0)
    print("\nSynthetic near-zero log-probs (80% -Exp(0.02), 20% -Exp(3); learner = gen + N(0, 0.3), "
          "sequences of 4 tokens)")
    logprob_error(gen, lp, np.arange(len(gen)) // 4)
    if args.no_real:
        return
    print("\nReal groups: one round of the cpu-pair preset's shipped tiny models (64 prompts x 8 each)")
    exp, real = real_groups()
    for node, groups, learner, seq, params in real:
        vocab = node.vocab_size
        gen = np.concatenate([lp for g in groups for lp in g.logprobs]).astype(np.float32)
        print(f"\n[{node.card.name}] {sum(g.num_tokens for g in groups)} completion tokens, "
              f"gen log-prob median {np.median(gen):.2e}, {np.mean(gen > -0.01):.0%} above -0.01, "
              f"min {gen.min():.1f}")
        measure(f"real groups of {node.card.name} ({params:,} params)", groups, vocab, params,
                tiny_lora if node.card.tiny_size == "small" else lora_params(192, 3, 2 * 32))
        print(f"  fp16 vs bf16 on {node.card.name}'s log-probs, lp = the other node's:")
        logprob_error(gen, learner, seq)


if __name__ == "__main__":
    main()
