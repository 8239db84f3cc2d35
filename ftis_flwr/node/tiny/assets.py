"""Writing the shipped tiny models: the warm-starts of the presets' tiny cards (the calculator stage
included where a card asks for it, :mod:`ftis_flwr.node.tiny.tools`), as bfloat16
safetensors with a manifest (key, report, SHA-256) under ``ftis_flwr/assets/tiny``, which
:func:`ftis_flwr.node.tiny.models.warm_start` installs instead of training when the key matches.

    python -m ftis_flwr.node.tiny.assets --ship                   # every shipped preset
    python -m ftis_flwr.node.tiny.assets --ship --presets cpu-xtok
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from ftis_flwr.node.tiny.models import MARKER, sha256_file
from ftis_flwr.node.tiny.tools import warm_started

SHIPPED_PRESETS = ("cpu-pair", "cpu-xtok", "cpu-pair-calc", "cpu-xtok-calc")
"""Presets whose tiny models are shipped (the default run, its cross-tokenizer variant, the
calculator environment's pairs)."""


def ship(presets: tuple[str, ...] = SHIPPED_PRESETS, out_dir: Path | None = None,
         cache_dir: Path | None = None) -> list[Path]:
    """Write the shipped warm-starts of ``presets``' tiny cards (bf16 safetensors + manifest).

    Each model comes from the cache when it is there, else is trained now; the manifest keeps
    its warm-start key, report and SHA-256; one already there (same name, so same key) whose
    hash verifies is kept as it is. Returns the weight files written or kept.
    """
    from safetensors.torch import save_file

    from ftis_flwr.config.merge import load_experiment
    from ftis_flwr.tasks import make_task

    out_dir = Path(out_dir) if out_dir else Path(__file__).resolve().parents[2] / "assets" / "tiny"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for preset in presets:
        exp = load_experiment(preset)
        task = make_task(exp.task)
        for card in exp.nodes:
            if card.source != "tiny":
                continue
            name = warm_started(card, task, cache_dir, build=False).name
            weights, meta = out_dir / f"{name}.safetensors", out_dir / f"{name}.json"
            written.append(weights)
            if weights.is_file() and meta.is_file() and \
                    json.loads(meta.read_text()).get("sha256") == sha256_file(weights):
                print(f"kept {weights} (shipped already)", flush=True)
                continue
            folder = warm_started(card, task, cache_dir)
            model = AutoModelForCausalLM.from_pretrained(str(folder))
            save_file({k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
                       if k != "lm_head.weight"}, str(weights))
            weights.chmod(0o644)  # safetensors writes 0600: installed copies must be readable
            report = json.loads((folder / MARKER).read_text())
            report.pop("losses", None)
            report.pop("shipped", None)
            manifest = {"name": folder.name, "preset": preset, "card": card.name,
                        "sha256": sha256_file(weights), "report": report}
            meta.write_text(json.dumps(manifest, indent=1) + "\n")
            print(f"shipped {weights} ({weights.stat().st_size / 1e6:.1f} MB)", flush=True)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Warm-start the tiny models of presets and write them as shipped assets.")
    parser.add_argument("--ship", action="store_true", help="write ftis_flwr/assets/tiny/*")
    parser.add_argument("--presets", default=",".join(SHIPPED_PRESETS))
    parser.add_argument("--cache-dir", default="", help="where to train (default: the cache)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not args.ship:
        parser.error("nothing to do: pass --ship")
    ship(tuple(p for p in args.presets.split(",") if p), cache_dir=Path(args.cache_dir) if args.cache_dir else None)


if __name__ == "__main__":
    main()
