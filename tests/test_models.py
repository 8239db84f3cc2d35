"""Tiny models: char tokenizer, warm-start (training, cache, lock, crash), policies, save/reload."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from ftis_flwr.config.schema import LoraConfig, ModelCard
from ftis_flwr.node.models import load_policy, load_tokenizer, save_policy
from ftis_flwr.node.tiny import models
from ftis_flwr.node.tiny.models import CHARS, SPECIAL_TOKENS, build_char_tokenizer, tiny_config, train_tiny, warm_start
from ftis_flwr.tasks import ArithmeticTask

STEPS = 20


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def task() -> ArithmeticTask:
    return ArithmeticTask(seed=1234)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ftis-cache")


def card(**kw) -> ModelCard:
    return ModelCard(**{"name": "t", "warmstart_steps": STEPS, **kw})


# ------------------------------------------------------------------------------ tokenizer

def test_char_tokenizer_ids_are_fixed_by_the_vocabulary():
    tok, again = build_char_tokenizer(), build_char_tokenizer()
    expected = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    expected.update({c: len(SPECIAL_TOKENS) + i for i, c in enumerate(CHARS)})
    assert tok.get_vocab() == again.get_vocab() == expected
    assert len(set(CHARS)) == len(CHARS) and len(tok) == len(expected)
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1 and tok.unk_token_id == 2
    assert tok.padding_side == "left"
    ids = tok("12+34=", add_special_tokens=False)["input_ids"]
    assert ids == [expected[c] for c in "12+34="]


@pytest.mark.parametrize("text", ["12+34=", "91-26=85", "a b  c.\n<think>x</think>", " 7 "])
def test_char_tokenizer_decode_round_trips(text):
    tok = build_char_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text


def test_unknown_characters_become_unk_not_dropped():
    tok = build_char_tokenizer()
    ids = tok("1Z2€", add_special_tokens=False)["input_ids"]
    assert ids[0] == tok("1")["input_ids"][0] and ids[2] == tok("2")["input_ids"][0]
    assert ids[1] == ids[3] == tok.unk_token_id


def test_tokenizer_saved_next_to_qwen2_config_loads_back_unchanged(tmp_path):
    tok = build_char_tokenizer()
    cfg = tiny_config("small", len(tok), tok.pad_token_id, tok.eos_token_id)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    text = "12+34= ab<eos>"
    want = tok(text)["input_ids"]
    for loaded in (PreTrainedTokenizerFast.from_pretrained(tmp_path), load_tokenizer(tmp_path)):
        assert loaded(text)["input_ids"] == want
        assert loaded.get_vocab() == tok.get_vocab()
        assert loaded.decode(want[:6]) == "12+34="


def test_tiny_config_sizes():
    tok = build_char_tokenizer()
    n = {s: sum(p.numel() for p in AutoModelForCausalLM.from_config(
        tiny_config(s, len(tok), 0, 1)).parameters()) for s in ("small", "large")}
    assert 400_000 < n["small"] < 600_000
    assert n["large"] > 2.5 * n["small"]
    with pytest.raises(ValueError, match="medium"):
        tiny_config("medium", 10, 0, 1)


# ------------------------------------------------------------------------------ warm start

def test_warm_start_training_learns(task):
    c = card(seed=3, warmstart_steps=40)
    tok = build_char_tokenizer()
    torch.manual_seed(3)
    init = AutoModelForCausalLM.from_config(tiny_config("small", len(tok), 0, 1))
    model, _, report = train_tiny(c, task)
    losses = report["losses"]
    assert report["steps_run"] == len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    changed = [not torch.equal(a, b) for a, b in zip(init.parameters(), model.parameters())]
    assert all(changed)
    # the same card from scratch is bit-identical (seeded init and data order)
    again, _, report2 = train_tiny(c, task)
    assert report2["losses"] == losses
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), model.parameters()))


def test_warm_start_stops_at_target(task):
    c = card(warmstart_steps=200)
    c.warmstart_target = 1e-9  # any check reaches it: stops at the first check
    _, _, report = train_tiny(c, task)
    assert report["reached_target"] and report["steps_run"] == models.WARMSTART_CHECK


def test_exact_match_equals_greedy_decoding(task):
    """The early-stop check must score exactly what greedy decoding would produce."""
    from ftis_flwr.tasks import Problem

    model, tok, _ = train_tiny(card(warmstart_steps=30), task)
    problems = task.problems("test")[:64]
    enc = tok([p.question for p in problems], return_tensors="pt", add_special_tokens=False)
    out = model.generate(**enc, do_sample=False, max_new_tokens=5)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:])
    ended = [(p, t.split("<eos>")[0]) for p, t in zip(problems, texts) if "<eos>" in t]
    ended = [(p, a) for p, a in ended if a and "<" not in a]
    assert len(ended) >= 10, texts
    # labelled with the model's own greedy answers: every one matches
    own = [Problem(p.id, p.question, a) for p, a in ended]
    assert models.exact_match(model, *models._encode_examples(tok, own)) == 1.0
    # one character changed: none matches
    other = [Problem(p.id, p.question, a[:-1] + ("1" if a[-1] != "1" else "2")) for p, a in ended]
    assert models.exact_match(model, *models._encode_examples(tok, other)) == 0.0
    # against the real golds: the greedy accuracy
    greedy = sum(t.split("<eos>")[0] == p.gold and "<eos>" in t for t, p in zip(texts, problems))
    real = models.exact_match(model, *models._encode_examples(tok, problems))
    assert real == pytest.approx(greedy / len(problems))


def test_warm_start_is_cached(task, cache, monkeypatch):
    path = warm_start(card(), task, cache)
    assert (path / models.MARKER).is_file() and (path / "model.safetensors").is_file()
    assert cache in path.parents
    mtime = (path / "model.safetensors").stat().st_mtime_ns

    def boom(*a, **k):
        raise AssertionError("retrained a cached model")

    monkeypatch.setattr(models, "train_tiny", boom)
    assert warm_start(card(), task, cache) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    with pytest.raises(AssertionError, match="retrained"):  # a different key is not a hit
        warm_start(card(seed=1), task, cache)


def test_warm_start_crash_leaves_nothing_and_concurrent_calls_train_once(task, tmp_path, monkeypatch):
    real = models.train_tiny
    calls = []

    def crash(*a, **k):
        raise RuntimeError("killed mid-training")

    monkeypatch.setattr(models, "train_tiny", crash)
    with pytest.raises(RuntimeError, match="killed"):
        warm_start(card(seed=5), task, tmp_path)
    leftovers = [p for p in (tmp_path / "tiny").iterdir() if not p.name.endswith(".lock")]
    assert leftovers == []

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(models, "train_tiny", counted)
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(warm_start(card(seed=5), task, tmp_path)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(paths) == 2 and paths[0] == paths[1] and len(calls) == 1


def test_cache_dir_inside_the_repo_is_refused(task):
    repo = Path(models.__file__).resolve().parent.parent
    with pytest.raises(ValueError, match="10 MB"):
        warm_start(card(), task, repo / ".cache")


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("FTIS_CACHE", str(tmp_path / "c"))
    assert models.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("FTIS_CACHE")
    assert models.default_cache_dir() == Path.home() / ".cache" / "ftis-flwr"


# ------------------------------------------------------------------------------ policies

def _logits(model, tok) -> torch.Tensor:
    enc = tok(["12+34=", "91-26="], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return model(**enc).logits


def test_full_policy_save_and_reload(task, cache, tmp_path):
    pol = load_policy(card(), task=task, cache_dir=cache)
    tok = pol.tokenizer
    assert pol.trainable_params == pol.total_params > 0
    assert tok.pad_token_id != tok.eos_token_id and tok.padding_side == "left"
    assert pol.model_id.startswith(f"t:tiny-small-addsub-{STEPS}steps-seed0:") and pol.model.device.type == "cpu"
    assert load_policy(card(name="u"), task=task, cache_dir=cache).model_id != pol.model_id
    with torch.no_grad():  # training moved the weights away from the cached warm start
        for p in pol.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    out = save_policy(pol, tmp_path / "full")
    assert "from_pretrained" in (out / "README.txt").read_text()
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    tok2 = PreTrainedTokenizerFast.from_pretrained(out)
    assert tok2.get_vocab() == tok.get_vocab()
    assert torch.equal(_logits(reloaded, tok2), _logits(pol.model, tok))
    # a saved policy is itself a valid local-directory model source
    again = load_policy(card(source=str(out)), task=task)
    assert torch.equal(_logits(again.model, again.tokenizer), _logits(pol.model, tok))
    assert again.tokenizer.get_vocab() == tok.get_vocab()


def test_lora_policy_trains_only_adapters_and_reloads_with_peft(task, cache, tmp_path):
    from peft import PeftModel

    lc = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    pol = load_policy(card(lora=True, lora_config=lc), task=task, cache_dir=cache)
    assert 0 < pol.trainable_params < pol.total_params // 20
    trainable = [n for n, p in pol.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    full = load_policy(card(), task=task, cache_dir=cache)
    assert pol.model_id != full.model_id
    with torch.no_grad():  # a trained adapter: lora_B starts at zero, which would hide bugs
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05 * torch.randn_like(p))
    out = save_policy(pol, tmp_path / "lora")
    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    assert "PeftModel.from_pretrained" in (out / "README.txt").read_text()
    base = AutoModelForCausalLM.from_pretrained(pol.base)
    base_logits = _logits(base, pol.tokenizer)
    reloaded = PeftModel.from_pretrained(base, out)
    assert torch.allclose(_logits(reloaded, pol.tokenizer), _logits(pol.model, pol.tokenizer),
                          atol=1e-6)
    assert not torch.allclose(base_logits, _logits(pol.model, pol.tokenizer), atol=1e-3)


def test_lora_checkpoint_links_a_cache_built_base_and_copies_any_other(task, cache, tmp_path, monkeypatch):
    """A LoRA checkpoint's ``base/`` shares the model cache's files (a converted Gemma base is not
    written again per checkpoint), copies a folder the cache did not build (a user's model, which
    a later save may overwrite in place), and copies where a hard link fails (another
    filesystem). Each way, the checkpoint loads on its own with the same logits."""
    import shutil

    from peft import AutoPeftModelForCausalLM

    import ftis_flwr.node.models as policy_models

    lc = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    pol = load_policy(card(lora=True, lora_config=lc), task=task, cache_dir=cache)
    assert (Path(pol.base) / models.MARKER).is_file(), "the tiny base is expected to come from the cache"
    with torch.no_grad():
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05 * torch.randn_like(p))
    want = _logits(pol.model, pol.tokenizer)

    def standalone(out: Path) -> torch.Tensor:
        return _logits(AutoPeftModelForCausalLM.from_pretrained(str(out)), pol.tokenizer)

    linked = save_policy(pol, tmp_path / "linked")
    assert (linked / "base" / "model.safetensors").samefile(Path(pol.base) / "model.safetensors")
    assert torch.allclose(standalone(linked), want, atol=1e-6)

    own = tmp_path / "own-model"  # the same weights, in a folder the cache did not build
    shutil.copytree(pol.base, own, ignore=shutil.ignore_patterns(models.MARKER))
    copied = save_policy(dataclasses.replace(pol, base=str(own)), tmp_path / "copied")
    assert not (copied / "base" / "model.safetensors").samefile(own / "model.safetensors")
    assert torch.allclose(standalone(copied), want, atol=1e-6)

    def no_links(src, dst):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(policy_models.os, "link", no_links)
    across = save_policy(pol, tmp_path / "across")
    assert not (across / "base" / "model.safetensors").samefile(Path(pol.base) / "model.safetensors")
    assert torch.allclose(standalone(across), want, atol=1e-6)


def test_load_policy_errors(task, tmp_path):
    with pytest.raises(ValueError, match="arithmetic"):
        load_policy(card(), task=None, cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="missing-model"):
        load_policy(card(source=str(tmp_path / "missing-model")), task=task)
    with pytest.raises(ValueError, match="float8"):
        load_policy(dataclasses.replace(card(), dtype="float8"), task=task, cache_dir=tmp_path)


# ------------------------------------------------------------------------------ shipped models

def _preset_cards(name="cpu-pair"):
    from ftis_flwr.experiment import load_experiment

    return load_experiment(name).nodes


def test_default_preset_models_are_shipped_and_used_without_training(task, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("trained a model that is shipped")

    monkeypatch.setattr(models, "train_tiny", boom)
    for c in _preset_cards():
        path = warm_start(c, task, tmp_path)
        report = json.loads((path / models.MARKER).read_text())
        assert report["shipped"].endswith(f"{path.name}.safetensors")
        model = AutoModelForCausalLM.from_pretrained(path)
        for p in model.parameters():  # stored as bf16 values
            assert torch.equal(p, p.to(torch.bfloat16).float())
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        # the shipped model is warm-started: it answers a good share of the check slice
        tok = build_char_tokenizer()
        check = task.warmstart_problems(c.warmstart_ops)[:models.WARMSTART_CHECK_SIZE]
        acc = models.exact_match(model, *models._encode_examples(tok, check))
        assert acc >= 0.9 * c.warmstart_target, acc


def test_a_damaged_shipped_model_is_refused(task, tmp_path, monkeypatch):
    c = _preset_cards()[0]
    name = models.warmstart_dir(c, task, tmp_path).name
    weights, manifest = models.find_shipped(name)
    bad = tmp_path / "assets"
    bad.mkdir()
    (bad / weights.name).write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    (bad / f"{name}.json").write_text(json.dumps(manifest))
    from ftis_flwr.node.tiny import shipped as tiny_shipped

    monkeypatch.setattr(tiny_shipped, "shipped_dirs", lambda: [bad])
    with pytest.raises(ValueError, match="SHA-256"):
        warm_start(c, task, tmp_path / "cache")
    assert not (tmp_path / "cache" / "tiny" / name).exists()


def test_a_trained_warm_start_holds_bf16_values(task, cache):
    model, _, report = train_tiny(card(), task)
    assert all(torch.equal(p, p.to(torch.bfloat16).float()) for p in model.parameters())
    assert 0 <= report["train_exact_match_bf16"] <= 1


def test_stop_tokens_include_the_chat_templates_end_of_turn():
    from types import SimpleNamespace

    from ftis_flwr.node.models import stop_token_ids

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>", "<|endoftext|>"]})
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=tok.convert_tokens_to_ids("<|endoftext|>")))
    assert stop_token_ids(tok, model) == [tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")]
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"
    ids = stop_token_ids(tok, model, ["x"])
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids and tok.convert_tokens_to_ids("x") in ids
    with pytest.raises(ValueError, match="single token"):
        stop_token_ids(tok, model, ["not one token"])
