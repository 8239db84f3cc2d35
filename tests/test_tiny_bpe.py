"""The tiny models' byte-level BPE and unigram (ftis_flwr/node/tiny/bpe.py): shipped assets, round trips, keys,
preset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from ftis_flwr.config.schema import ModelCard
from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.models import load_policy, load_tokenizer, save_policy
from ftis_flwr.node.tiny import assets as tiny_assets
from ftis_flwr.node.tiny import models as tiny
from ftis_flwr.node.tiny.bpe import (
    asset_id,
    asset_path,
    bpe_asset_id,
    bpe_asset_path,
    build_bpe_tokenizer,
    build_tiny_tokenizer,
    to_json,
    train_bpe_tokenizer,
    train_unigram_tokenizer,
)
from ftis_flwr.node.tiny.models import build_char_tokenizer, find_shipped, warmstart_dir, warmstart_key
from ftis_flwr.tasks import ArithmeticTask
from ftis_flwr.wire.groups import tokenizer_fingerprint
from ftis_flwr.xtok.align import encode_with_spans
from ftis_flwr.xtok.represent import Unrepresentable
from ftis_flwr.xtok.token_bytes import token_bytes

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ODD_TEXTS = ["", " 12 + 34 = 46", "What is 2 plus 3?\n", "héllo wörld ✓", "  two  spaces "]


@pytest.fixture(scope="module")
def task() -> ArithmeticTask:
    return ArithmeticTask(seed=1234)


@pytest.fixture(scope="module")
def tok():
    return build_bpe_tokenizer()


def task_texts(task: ArithmeticTask, n: int = 300) -> list[str]:
    out = []
    for split in ("train", "test", "ood"):
        for p in task.problems(split)[:n]:
            out += [p.question, p.gold, p.question + p.gold]
    return out


def bpe_card(**kw) -> ModelCard:
    return ModelCard(**{"name": "bpe", "tiny_tokenizer": "bpe", "warmstart_ops": "+-",
                        "warmstart_target": 0.6, "seed": 2, **kw})


@pytest.mark.parametrize("kind,train", [("bpe", train_bpe_tokenizer), ("unigram", train_unigram_tokenizer)])
def test_the_shipped_tokenizer_is_what_training_gives_now(kind, train):
    """Deterministic training, and the asset is up to date (else: python -m ftis_flwr.node.tiny.bpe --ship)."""
    first = to_json(train())
    assert first == asset_path(kind).read_text(encoding="utf-8")
    assert to_json(train()) == first


def _follows_the_char_tokenizers_conventions(tok, lo: int, hi: int) -> None:
    char = build_char_tokenizer()
    assert lo <= len(tok) <= hi
    assert [tok.convert_ids_to_tokens(i) for i in (0, 1, 2)] == ["<pad>", "<eos>", "<unk>"]
    for attr in ("pad_token_id", "eos_token_id", "unk_token_id", "padding_side", "model_max_length",
                 "clean_up_tokenization_spaces"):
        assert getattr(tok, attr) == getattr(char, attr), attr


def test_conventions_match_the_char_tokenizer(tok):
    _follows_the_char_tokenizers_conventions(tok, 320, 400)
    assert build_tiny_tokenizer("bpe").get_vocab() == tok.get_vocab()
    assert build_tiny_tokenizer("char").get_vocab() == build_char_tokenizer().get_vocab()
    with pytest.raises(ValueError, match="tiny_tokenizer"):
        build_tiny_tokenizer("wordpiece")


def test_tokens_span_several_characters(tok, task):
    multi = [t for t in tok.get_vocab() if len(t) > 1 and not t.startswith("<")]
    assert {"12", "37", "99"} <= set(multi)
    prompts = [p.question for p in task.problems("test")]
    n_tok = sum(len(tok(q, add_special_tokens=False)["input_ids"]) for q in prompts)
    assert n_tok < 0.8 * sum(len(q) for q in prompts)
    assert tok.convert_ids_to_tokens(tok("37+48=", add_special_tokens=False)["input_ids"]) == ["37", "+", "48", "="]


def test_decode_and_token_bytes_give_the_text_back(tok, task):
    for text in task_texts(task) + ODD_TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
        assert b"".join(token_bytes(tok, ids)) == text.encode("utf-8")
    assert token_bytes(tok, [tok.eos_token_id, tok.pad_token_id]) == [b"", b""]


def test_a_saved_tokenizer_reloads_with_the_same_ids(tok, task, tmp_path):
    tok.save_pretrained(tmp_path)
    tiny.tiny_config("small", len(tok), tok.pad_token_id, tok.eos_token_id).save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)  # next to a qwen2 config: AutoTokenizer would split digits
    for text in task_texts(task, 50) + ODD_TEXTS:
        assert again(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tok)


def test_fingerprints_and_warmstart_keys_differ_from_the_char_ones(tok, task):
    assert tokenizer_fingerprint(tok) != tokenizer_fingerprint(build_char_tokenizer())
    char_card, card = ModelCard(name="c", warmstart_target=0.6), bpe_card()
    assert "tokenizer" not in warmstart_key(char_card, task)
    key = warmstart_key(card, task)
    assert key["tokenizer"] == bpe_asset_id() and key["tokenizer"].startswith("bpe-")
    assert {k: v for k, v in key.items() if k != "tokenizer"} == \
        warmstart_key(ModelCard(name="c", warmstart_target=0.6, seed=2), task)
    assert warmstart_dir(card, task).name.startswith("small-bpe-addsub-")
    assert "bpe" not in warmstart_dir(char_card, task).name


def test_the_xtok_preset_reuses_the_small_model_and_ships_the_bpe_one(task):
    exp = load_experiment("cpu-xtok")
    assert exp.exchange.cross_tokenizer == "auto"
    cards = {c.name: c for c in exp.nodes}
    assert {c.tiny_tokenizer for c in exp.nodes} == {"char", "bpe"}
    pair_small = next(c for c in load_experiment("cpu-pair").nodes if c.name == "small")
    assert warmstart_dir(cards["small"], task).name == warmstart_dir(pair_small, task).name
    for card in exp.nodes:
        name = warmstart_dir(card, task).name
        shipped = find_shipped(name)
        assert shipped is not None, (f"{name} is not shipped: "
                                     "python -m ftis_flwr.node.tiny.assets --ship --presets cpu-xtok")
        assert shipped[1]["report"]["key"] == warmstart_key(card, task)
    assert "cpu-xtok" in tiny_assets.SHIPPED_PRESETS


def test_the_shipped_bpe_model_installs_without_training(task, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("trained a model that is shipped")

    monkeypatch.setattr(tiny, "train_tiny", boom)
    card = next(c for c in load_experiment("cpu-xtok").nodes if c.tiny_tokenizer == "bpe")
    policy = load_policy(card, task=task, cache_dir=tmp_path)  # warm_start: the shipped model
    path = Path(policy.base)
    assert json.loads((path / tiny.MARKER).read_text())["shipped"].endswith(f"{path.name}.safetensors")
    assert ":tiny-small-bpe-addsub-" in policy.model_id
    tok = policy.tokenizer
    assert tok.get_vocab() == build_bpe_tokenizer().get_vocab() and tok.padding_side == "left"
    assert policy.model.config.vocab_size == len(tok)
    check = task.warmstart_problems(card.warmstart_ops)[:tiny.WARMSTART_CHECK_SIZE]
    acc = tiny.exact_match(policy.model, *tiny._encode_examples(tok, check))
    assert acc >= 0.9 * card.warmstart_target, acc
    out = save_policy(policy, tmp_path / "saved")
    assert "byte-level BPE" in (out / "README.txt").read_text()
    again = load_tokenizer(out)
    assert again("37+48=85")["input_ids"] == tok("37+48=85")["input_ids"] and len(tok("37+48=85")["input_ids"]) == 5
    assert torch.equal(AutoModelForCausalLM.from_pretrained(out).model.embed_tokens.weight,
                       policy.model.model.embed_tokens.weight)


def test_the_asset_travels_in_the_flower_app_bundle():
    from flwr.cli.build import get_filtered_fab_paths

    rel = bpe_asset_path().resolve().relative_to(Path(tiny.__file__).resolve().parents[2]).as_posix()
    assert get_filtered_fab_paths({rel: b"", "pyproject.toml": b""}, {}) == [rel]


# ------------------------------------------------------------------------------ unigram

ASCII_TEXTS = ["", " 12 + 34 = 46", "what is 2 plus 3?\n", "  two  spaces ", " 85", "85 "]
"""Texts in the char tokenizer's alphabet (the unigram has every one of its characters)."""


@pytest.fixture(scope="module")
def uni():
    return build_tiny_tokenizer("unigram")


def pieces(tok, text: str) -> list[str]:
    return tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])


def test_the_unigram_follows_the_char_tokenizers_conventions(uni):
    _follows_the_char_tokenizers_conventions(uni, 200, 300)
    backend = json.loads(uni.backend_tokenizer.to_str())
    assert backend["model"]["type"] == "Unigram" and backend["model"]["unk_id"] == 2
    assert backend["pre_tokenizer"]["type"] == backend["decoder"]["type"] == "Metaspace"
    assert {ch.replace(" ", "▁") for ch in tiny.CHARS} <= set(uni.get_vocab())


def test_unigram_pieces_span_several_characters_and_differ_from_the_bpe(uni, tok, task):
    assert pieces(uni, "37+48=") == ["37+", "48", "="] and pieces(uni, "85") == ["85"]
    assert pieces(uni, "97+79=") == ["97+", "79", "="] and pieces(uni, "176") == ["1", "76"]
    prompts = [p.question for p in task.problems("test")]
    n_tok = sum(len(pieces(uni, q)) for q in prompts)
    assert n_tok < 0.6 * sum(len(q) for q in prompts)  # 1.9 characters a token (the BPE: 1.5)
    assert sum(pieces(uni, q) != pieces(tok, q) for q in prompts) > 0.9 * len(prompts)


def test_unigram_decode_token_bytes_and_spans_give_the_text_back(uni, task):
    for text in task_texts(task, 100) + ASCII_TEXTS:
        ids = uni(text, add_special_tokens=False)["input_ids"]
        assert uni.decode(ids) == text
        assert b"".join(token_bytes(uni, ids)) == text.encode("utf-8")
        got, starts, ends = encode_with_spans(uni, text)
        assert got.tolist() == ids
        assert np.array_equal(np.cumsum([0] + [len(b) for b in token_bytes(uni, ids)])[:-1], starts)
    assert pieces(uni, " 85") == ["▁", "85"]  # a space is its own "▁", nothing prepended
    assert token_bytes(uni, [uni.eos_token_id, uni.pad_token_id]) == [b"", b""]


def test_unigram_characters_outside_its_alphabet_are_unk_and_refused_as_a_receiver(uni):
    """No byte fallback: "W", "é", "✓" are <unk>, so as a receiver the unigram node refuses such a
    text (it cannot stand for its bytes) instead of weighing <unk> against the sender's letters."""
    for text in ["What is 2 plus 3?\n", "héllo wörld ✓"]:
        assert uni.unk_token_id in uni(text, add_special_tokens=False)["input_ids"]
        with pytest.raises(Unrepresentable) as caught:
            encode_with_spans(uni, text)
        assert caught.value.reason == "unknown_token"
    ids, starts, ends = encode_with_spans(uni, "12 plus 3 is 15\n")  # in its alphabet: tiles the bytes
    assert starts[0] == 0 and ends[-1] == len("12 plus 3 is 15\n")
    assert np.array_equal(starts[1:], ends[:-1]) and (ends > starts).all()


def test_a_saved_unigram_reloads_with_the_same_ids(uni, task, tmp_path):
    uni.save_pretrained(tmp_path)
    tiny.tiny_config("small", len(uni), uni.pad_token_id, uni.eos_token_id).save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    for text in task_texts(task, 50) + ASCII_TEXTS:
        assert again(text, add_special_tokens=False)["input_ids"] == uni(text, add_special_tokens=False)["input_ids"]
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(uni)


def test_unigram_fingerprint_and_warmstart_key_are_its_own(uni, tok, task):
    assert tokenizer_fingerprint(uni) not in {tokenizer_fingerprint(tok), tokenizer_fingerprint(build_char_tokenizer())}
    card = ModelCard(name="uni", tiny_tokenizer="unigram", warmstart_steps=60, seed=3)
    key = warmstart_key(card, task)
    assert key["tokenizer"] == asset_id("unigram") and key["tokenizer"].startswith("unigram-")
    others = [warmstart_key(ModelCard(name="c", warmstart_steps=60, seed=3, tiny_tokenizer=kind), task)
              for kind in ("char", "bpe")]
    assert all(key != other for other in others)
    assert {k: v for k, v in key.items() if k != "tokenizer"} == \
        {k: v for k, v in others[1].items() if k != "tokenizer"}
    assert warmstart_dir(card, task).name.startswith("small-unigram-addsub-60steps-seed3-")
    assert find_shipped(warmstart_dir(card, task).name) is None  # trained where needed, in seconds


def test_the_unigram_asset_travels_in_the_flower_app_bundle():
    from flwr.cli.build import get_filtered_fab_paths

    rel = asset_path("unigram").resolve().relative_to(Path(tiny.__file__).resolve().parents[2]).as_posix()
    assert get_filtered_fab_paths({rel: b"", "pyproject.toml": b""}, {}) == [rel]
