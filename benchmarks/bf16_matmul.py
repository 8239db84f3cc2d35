"""bfloat16 against float32 matmul time on this CPU, and whether it has native bfloat16.

    python -m benchmarks.bf16_matmul

One thread, a 256x576 @ 576x1536 product (SmolLM2-135M's hidden -> MLP size), 50 repeats after
3 warm-ups. On a CPU without avx512_bf16 / amx_bf16 torch emulates bfloat16, and the ratio
printed decides whether a CPU card should compute in it (ftis_flwr.node.models.warn_slow_bf16).
"""

import time

import torch

from ftis_flwr.node.models import cpu_has_native_bf16


def ms(dtype: torch.dtype, repeats: int = 50) -> float:
    a, w = torch.randn(256, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype)
    for _ in range(3):
        a @ w
    t = time.perf_counter()
    for _ in range(repeats):
        a @ w
    return (time.perf_counter() - t) / repeats * 1e3


if __name__ == "__main__":
    torch.set_num_threads(1)
    fp32, bf16 = ms(torch.float32), ms(torch.bfloat16)
    print(f"native bfloat16: {cpu_has_native_bf16()}; float32 {fp32:.1f} ms, bfloat16 {bf16:.1f} ms "
          f"per matmul: bfloat16 / float32 = {bf16 / fp32:.1f}x")
