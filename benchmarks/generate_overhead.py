"""Where a node's generate phase goes beyond plain HF ``generate`` (#27): the same two prompts x 8
samples on cpu-smollm2's full card, three interleaved repeats after a warm-up, of (1) plain
``model.generate`` with the same sampling settings, (2) the node's engine (``HFEngine.sample``:
the warper and the recorded log-probs) and (3) ``Node.generate`` (the engine, rewards, groups,
texts). Seconds per call and generated tokens; nothing asserted.

    python -m benchmarks.generate_overhead
"""



import time

import torch

from ftis_flwr.experiment import load_experiment  # noqa: E402
from ftis_flwr.node.node import Node  # noqa: E402


def main() -> None:
    exp = load_experiment("cpu-smollm2", overrides={"advantage.mode": "alone"})
    card = next(c for c in exp.nodes if c.name == "full")
    torch.set_num_threads(card.torch_threads)
    node = Node(card, exp)
    probs = [node.task.train_problem(i) for i in range(2)]
    prompts = [node._prompt_tokens(p).tolist() for p in probs]
    eng = node.engine
    def plain():
        seqs = [p for p in prompts for _ in range(8)]
        ids, mask = eng._left_pad(seqs)
        t = time.perf_counter()
        out = node.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.7, top_k=0,
                                  top_p=1.0,
                                  max_new_tokens=48, eos_token_id=node.stop_ids, pad_token_id=eng.pad_token_id)
        return time.perf_counter() - t, int((out[:, ids.shape[1]:] != eng.pad_token_id).sum())
    def engine():
        t = time.perf_counter()
        eng.sample(prompts, 8, temperature=0.7, max_new_tokens=48, batch_size=32)
        return time.perf_counter() - t, None
    def nodegen():
        t = time.perf_counter()
        g = node.generate([0, 1], 8, 0)
        return time.perf_counter() - t, sum(x.num_tokens for x in g)
    res = {"plain": [], "engine": [], "node": []}
    for f in (plain, engine, nodegen):  # warm-up
        f()
    for _ in range(3):
        for name, f in (("plain", plain), ("engine", engine), ("node", nodegen)):
            res[name].append(f())
    for k, v in res.items():
        print(k, "seconds", [round(x[0], 2) for x in v], "tokens", [x[1] for x in v])


if __name__ == "__main__":
    main()
