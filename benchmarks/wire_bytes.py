"""Bytes per completion token on the wire, measured from the Flower records themselves.

    python benchmarks/wire_bytes.py

Prints, for a paper-sized payload (12 groups x G=12, 640-token completions, Qwen2.5's 151,665-
token vocabulary) and for the offline default (16 groups x 8, 3-token completions, the character
vocabulary), the payload bytes per completion token for each log-prob encoding, plus the size of
the whole message as Flower serialises it (protobuf).
"""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict
from flwr.common.serde import recorddict_to_proto

from ftis_flwr.groups import Group  # noqa: E402
from ftis_flwr.rollouts import completion_tokens, encode_groups, payload_bytes


def make_groups(n_groups: int, g: int, length: int, vocab: int, prompt_len: int, seed: int = 0) -> list[Group]:
    rng = np.random.default_rng(seed)
    groups = []
    for i in range(n_groups):
        comps = [rng.integers(0, vocab, size=int(rng.integers(length // 2, length + 1))) for _ in range(g)]
        groups.append(Group(
            prompt_id=f"train:{i}", prompt_tokens=rng.integers(0, vocab, size=prompt_len),
            completions=comps, logprobs=[-rng.exponential(1.0, size=len(c)).astype(np.float32) for c in comps],
            rewards=rng.integers(0, 2, size=g).astype(np.float32), node="a", model_id="a:model",
            tokenizer_fp="0123456789abcdef"))
    return groups


def main() -> None:
    cases = {"paper (12x12, <=640 tok, vocab 151665)": (12, 12, 640, 151_665, 150),
             "cpu default (16x8, <=3 tok, char vocab)": (16, 8, 3, 64, 6)}
    print(f"{'payload':42s} {'dtype':6s} {'tokens':>8s} {'B/token':>8s} {'proto B/token':>14s}")
    for name, (n, g, length, vocab, plen) in cases.items():
        groups = make_groups(n, g, length, vocab, plen)
        for dtype in ("fp32", "fp16", "bf16"):
            arrays, meta = encode_groups(groups, logprob_dtype=dtype, vocab_size=vocab)
            tokens = completion_tokens(arrays)
            proto = recorddict_to_proto(RecordDict({"groups": arrays, "groups.meta": meta})).ByteSize()
            print(f"{name:42s} {dtype:6s} {tokens:8d} {payload_bytes(arrays, meta) / tokens:8.2f} "
                  f"{proto / tokens:14.2f}")


if __name__ == "__main__":
    main()
