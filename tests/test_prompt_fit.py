"""What a check knows of each node's model (#56 items 2 and 8): the configuration's copy of the tiny
models' numbers is the node's, the check's torch-free tiny tokenizers give the node's ids, a real
model's tokenizer is judged from its files, and prompts that a model cannot read are refused with
the row, the nodes and the limit."""

from __future__ import annotations

import json

import pytest

from ftis_flwr.config import tiny_models
from ftis_flwr.config.schema import ConfigError
from ftis_flwr.experiment import load_experiment
from ftis_flwr.tasks import node_models, prompt_fit

TEXTS = ["27+82=", "what is 2 plus 3?\n", "Hello World? é\ttab", "  two  spaces", "<eos> <unk> ñ 😀", ""]


def test_the_configurations_tiny_table_is_the_nodes():
    """The node builds its tiny models from the configuration's table (one definition); the
    shipped tokenizer files and every tokenizer's size are what the table says."""
    from ftis_flwr.node.tiny import bpe as tiny_bpe
    from ftis_flwr.node.tiny import models as tiny

    assert tiny.TINY_MAX_POSITIONS is tiny_models.TINY_MAX_POSITIONS and tiny.TINY_SIZES is tiny_models.TINY_SIZES
    assert tiny.CHARS is tiny_models.TINY_CHARS and tiny.SPECIAL_TOKENS is tiny_models.TINY_SPECIAL_TOKENS
    assert tiny_models.TINY_TOKENIZER_ASSETS == tiny_bpe.ASSETS
    for kind, size in tiny_models.TINY_VOCAB.items():
        assert len(tiny_bpe.build_tiny_tokenizer(kind)) == size, kind


@pytest.mark.parametrize("kind", ["char", "bpe", "unigram"])
def test_the_checks_tiny_tokenizer_gives_the_nodes_ids_and_text(kind):
    from ftis_flwr.node.tiny.bpe import build_tiny_tokenizer

    node, check = build_tiny_tokenizer(kind), node_models.tiny_tokenizer(kind)
    assert len(check) == len(node) and check.unk_token_id == node.unk_token_id
    for text in TEXTS:
        for special in (True, False):
            ids = node(text, add_special_tokens=special)["input_ids"]
            assert check(text, add_special_tokens=special)["input_ids"] == ids, (kind, text)
        assert check.decode(ids) == node.decode(ids), (kind, text)
    assert node_models.every_byte(None) is False


def test_the_tiny_tokenizers_lose_what_the_node_would_lose():
    char, bpe, unigram = (node_models.tiny_tokenizer(k) for k in ("char", "bpe", "unigram"))
    assert prompt_fit.lost_characters(char, "27+82=") == ("", [])
    assert prompt_fit.lost_characters(char, "Hi Ann") == ("<unk>i <unk>nn", ["H", "A"])
    assert prompt_fit.lost_characters(bpe, "Hi Ann é") == ("", [])  # byte-level: every character has tokens
    assert prompt_fit.lost_characters(unigram, "Hé ok")[1] == ["H", "é"]  # one <unk> over both


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("kind", ["char", "bpe", "unigram"])
def test_the_plan_counts_the_tiny_models_parameters_as_built(size, kind):
    from transformers import AutoModelForCausalLM

    from ftis_flwr.config.plan import card_architecture
    from ftis_flwr.config.schema import ModelCard
    from ftis_flwr.node.tiny.bpe import build_tiny_tokenizer
    from ftis_flwr.node.tiny.models import tiny_config

    tok = build_tiny_tokenizer(kind)
    model = AutoModelForCausalLM.from_config(tiny_config(size, len(tok), tok.pad_token_id, tok.eos_token_id))
    arch = card_architecture(ModelCard(source="tiny", tiny_size=size, tiny_tokenizer=kind))
    assert arch.params() == sum(p.numel() for p in model.parameters())
    assert arch.positions == model.config.max_position_embeddings


def test_a_sample_keeps_the_first_and_last_rows():
    rows = list(range(5000))
    got = [i for i, _ in prompt_fit._sample(rows)]
    assert len(got) == prompt_fit.SAMPLE_ROWS and got[0] == 0 and got[-1] == 4999
    assert [i for i, _ in prompt_fit._sample(rows[:7])] == list(range(7))


def _rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _errors(overrides: dict, yaml_text: str | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_experiment(overrides=overrides, yaml_text=yaml_text)
    return str(caught.value)


def test_a_local_model_is_measured_with_its_own_tokenizer_and_positions(tmp_path):
    """A real (non-tiny) card whose folder is here: its tokenizer (the char one, saved as a real
    model's would be: no token for every byte) and its config's 32 positions."""
    from ftis_flwr.node.tiny.bpe import build_tiny_tokenizer

    folder = tmp_path / "model"
    build_tiny_tokenizer("char").save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 32}))
    assert node_models.every_byte(folder / "tokenizer.json") is False
    train = _rows(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"},
                                             {"prompt": "a much longer prompt than 32 positions =", "answer": "4"},
                                             {"prompt": "Caps=", "answer": "5"}])
    yaml = f"nodes:\n  - {{name: mine, source: {str(folder)!r}}}\n  - {{name: t, source: tiny}}\n"
    msg = _errors({"task.name": "dataset", "task.dataset": "json", "task.data_files.train": train}, yaml)
    assert ("nodes[mine] (" + str(folder) + ", 32 positions): the prompt of row 2 of task.data_files.train is 40 "
            "tokens as the node renders it and its answer '4' 2 with the end token: 42 positions, more than the "
            "model's 32; 1 of the 3 rows checked") in msg
    assert "nodes[mine] (" in msg and "row 3 of task.data_files.train has characters the tokenizer cannot " \
        "represent: 'C'" in msg
    tiny = [line for line in msg.splitlines() if "nodes[t]" in line]
    assert len(tiny) == 1 and "nodes[t] (tiny models, char tokenizer, 64 positions): the prompt of row 3" in tiny[0]
    # 'C' is not in its vocabulary either; 40 + 2 tokens fit its 64 positions


def test_a_model_whose_files_are_not_here_is_a_warning_never_an_error(tmp_path, monkeypatch):
    """A hub id in no local cache: the check cannot be made; it says so and passes."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    train = _rows(tmp_path / "train.jsonl", [{"prompt": "What Is 1+1?", "answer": "2"}])
    yaml = "nodes:\n  - {name: hub, source: someone/not-a-model-here}\n"
    exp = load_experiment(overrides={"task.name": "dataset", "task.dataset": "json", "task.data_files.train": train,
                                     "cache_dir": str(tmp_path / "cache")}, yaml_text=yaml)
    assert exp.nodes[0].source == "someone/not-a-model-here"
    notes = prompt_fit.prompt_notes()
    assert notes == ["warning: nodes[hub]: the prompts were not checked against source 'someone/not-a-model-here''s "
                     "positions and tokenizer: it is not in the hub's cache on this machine (a check never "
                     "downloads)"]


def test_a_byte_level_model_is_settled_by_its_bytes_without_loading_its_tokenizer(tmp_path, monkeypatch):
    """The tiny BPE's file stands for a real byte-level tokenizer: 64 positions hold a 40-byte
    prompt with the chat markup's allowance only above 1,024 positions, so a 2,000-position model
    is settled without a tokenizer, and a 64-position one is tokenised (and fits)."""
    import shutil
    from pathlib import Path

    folder = tmp_path / "bytes"
    folder.mkdir()
    shutil.copy(Path(node_models.__file__).parents[1] / "assets" / "tiny" / "bpe-tokenizer.json",
                folder / "tokenizer.json")
    assert node_models.every_byte(folder / "tokenizer.json") is True
    loads = []
    monkeypatch.setattr(node_models, "real_tokenizer", lambda f: loads.append(f) or node_models.tiny_tokenizer("bpe"))
    train = _rows(tmp_path / "train.jsonl", [{"prompt": "What Is 12 + 30? Answer: é", "answer": "42"}])
    for positions, loaded in ((2000, 0), (64, 1)):
        (folder / "config.json").write_text(json.dumps({"max_position_embeddings": positions}))
        loads.clear()
        load_experiment(overrides={"task.name": "dataset", "task.dataset": "json", "task.data_files.train": train},
                        yaml_text=f"nodes:\n  - {{name: real, source: {str(folder)!r}}}\n")
        assert len(loads) == loaded, positions
