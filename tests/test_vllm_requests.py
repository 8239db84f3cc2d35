"""What the vLLM engine sends to vLLM, checked without vLLM: runs in the default suite.

vLLM's GPU sampler (Model Runner V2) caps per-request lists and dies inside its engine core when a
request exceeds them; vLLM's CPU build, the only one these machines can run, has no such caps. So
the requests and the weight folder the engine builds are held here to what vLLM 0.33.0 declares
(ftis_flwr/node/engines/vllm_limits.py names the files): no request carries ``allowed_token_ids``
(the old engine sent 151,665 ids for every Qwen2.5 node, against a cap of 1,024), the folder vLLM
loads has exactly the tokenizer's rows, and the distribution it serves over them is the
learner's. tests/test_vllm_engine.py checks the same on a real vLLM where one is installed.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import pickle

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from ftis_flwr.node.engines.vllm_limits import (
    VLLM_033_LIMITS,
    RequestLimitError,
    check_request,
    declared_limits,
    request_fields,
)
from ftis_flwr.node.engines.vllm_weights import (
    engine_weights,
    ipc_update_info,
    output_row_names,
    refuse_vocabulary_adapters,
    write_base,
    write_weights,
)
from ftis_flwr.node.tiny.models import build_char_tokenizer, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SPARE = 16
QWEN25_TOKENS = 151_665
"""Qwen2.5's tokenizer (its models have 151,936 output rows)."""


def spare_rows_model(tied: bool):
    """A tiny Qwen2 with SPARE output rows past the char tokenizer, those rows made the likeliest."""
    tok = build_char_tokenizer()
    config = tiny_config("small", len(tok) + SPARE, tok.pad_token_id, tok.eos_token_id)
    config.tie_word_embeddings = tied
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.get_output_embeddings().weight[len(tok):] *= 50.0
    return model.eval(), tok


def sampling_requests(eos: list[int]) -> list[dict]:
    """The keyword arguments of every request the engine builds: sample (as VLLMEngine.sample
    passes them) and greedy (as VLLMEngine.greedy)."""
    return [request_fields(eos, n=1, temperature=1.0, top_k=0, top_p=1.0, max_tokens=640, logprobs=0, seed=7),
            request_fields(eos, n=1, temperature=0.7, top_k=20, top_p=0.9, max_tokens=64, logprobs=0, seed=None),
            request_fields(eos, n=1, temperature=0.0, max_tokens=640)]


def test_no_request_carries_a_list_past_vllm_s_declared_caps():
    """Every request fits Model Runner V2's tables, for Qwen2.5's stop ids; none restricts the
    vocabulary per request (the folder vLLM loads does)."""
    qwen_stops = [151643, 151645]  # <|endoftext|>, <|im_end|>
    for fields in sampling_requests(qwen_stops):
        check_request(fields, declared_limits())
        assert "allowed_token_ids" not in fields and "logit_bias" not in fields
        assert fields["min_tokens"] == 0 and fields.get("logprobs") in (0, None)


def test_the_request_the_old_engine_sent_is_refused_before_it_reaches_vllm():
    """The old engine hid Qwen2.5's spare rows with allowed_token_ids=range(151665): Model Runner V2
    raises on it inside the engine core (logit_bias.py, MAX_NUM_ALLOWED_TOKEN_IDS = 1024)."""
    old = request_fields([151645], n=1, temperature=1.0, max_tokens=8, logprobs=0,
                         allowed_token_ids=list(range(QWEN25_TOKENS)))
    with pytest.raises(RequestLimitError, match=r"allowed_token_ids: 151665 > 1024"):
        check_request(old)
    with pytest.raises(RequestLimitError, match=r"stop_token_ids \(with min_tokens > 0\): 129 > 128"):
        check_request(request_fields(list(range(129)), min_tokens=1))
    with pytest.raises(RequestLimitError, match=r"logprobs: 21 > 20"):
        check_request(request_fields([1], logprobs=21))


def test_the_limits_are_vllm_033_s_where_no_vllm_is_installed():
    """Without vLLM the recorded values stand; with it, its own constants replace them (the
    vLLM environment's test compares the two)."""
    limits = declared_limits()
    assert set(limits) == set(VLLM_033_LIMITS)
    assert VLLM_033_LIMITS["allowed_token_ids"] == 1024 and VLLM_033_LIMITS["stop_token_ids_with_min_tokens"] == 128


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_folder_vllm_loads_has_the_tokenizer_s_rows_and_the_learner_s_distribution(tmp_path, tied):
    """write_base cuts the embedding and output rows to the tokenizer and says so in config.json;
    transformers loads the folder (as vLLM's loader reads it) and its log-probs over the tokenizer
    equal the learner's renormalised over the same rows, though the learner's spare rows hold
    most of its mass."""
    model, tok = spare_rows_model(tied)
    vocab = len(tok)
    write_base(model, tok, tmp_path, vocab)
    assert json.loads((tmp_path / "config.json").read_text())["vocab_size"] == vocab
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for name in output_row_names(model):
        if name in tensors:
            assert tensors[name].shape[0] == vocab, name
    assert all(t.shape[0] != vocab + SPARE for t in tensors.values())
    served = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ids = tok(["12+34=", "99-7="], add_special_tokens=False, padding=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        learner = torch.log_softmax(model(input_ids=ids).logits[..., :vocab], dim=-1)
        full = torch.softmax(model(input_ids=ids).logits, dim=-1)
        engine = torch.log_softmax(served(input_ids=ids).logits, dim=-1)
    assert float(full[..., vocab:].sum(-1).mean()) > 0.5  # the spare rows would dominate a sampler
    assert engine.shape[-1] == vocab
    torch.testing.assert_close(engine, learner, atol=1e-5, rtol=1e-5)


def test_every_weight_update_is_cut_the_same_way(tmp_path):
    """After a step, the file update carries the new weights with the tokenizer's rows."""
    model, tok = spare_rows_model(tied=False)
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(0.5)
    write_weights(model, tmp_path, len(tok))
    tensors = load_file(str(tmp_path / "model.safetensors"))
    emb = tensors["model.embed_tokens.weight"]
    assert emb.shape[0] == len(tok)
    torch.testing.assert_close(emb, model.get_input_embeddings().weight[: len(tok)].detach())
    assert json.loads((tmp_path / "config.json").read_text())["vocab_size"] == len(tok)


def test_an_ipc_update_names_every_tensor_cut_and_hands_over_one_handle_each():
    """The IPC update's fields as vLLM's IPCWeightTransferUpdateInfo reads them. The handle itself
    is CUDA's (torch's reduce_tensor on a GPU tensor): the one seam replaced here, by a function
    that returns the tensor's shape where CUDA would return its rebuild arguments."""
    model, tok = spare_rows_model(tied=True)
    held = [(n, t.contiguous()) for n, t in engine_weights(model, len(tok))]
    info = ipc_update_info(held, "GPU-uuid-0", reduce=lambda t: (None, tuple(t.shape)))
    assert info["names"] == [n for n, _ in held] and len(set(info["names"])) == len(held)
    assert info["dtype_names"] == ["float32"] * len(held)
    rows = dict(zip(info["names"], info["shapes"]))
    assert rows["model.embed_tokens.weight"][0] == len(tok)
    assert "lm_head.weight" not in rows  # tied: sent once, under the embedding's name
    handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
    assert [list(h["GPU-uuid-0"]) for h in handles] == info["shapes"]


def test_a_lora_adapter_on_the_vocabulary_layers_is_refused_by_name():
    """The engine serves the vocabulary layers cut to the tokenizer, where an adapter trained on
    them has the learner's row count."""
    from peft import LoraConfig, get_peft_model

    model, _ = spare_rows_model(tied=False)
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    with pytest.raises(ValueError, match="trains lm_head"):
        refuse_vocabulary_adapters(lora)
    model, _ = spare_rows_model(tied=False)
    refuse_vocabulary_adapters(get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])))


def test_a_gpu_node_plans_its_engine_by_the_rules_ftis_flwr_plan_shows():
    """The memory figures a node hands its vLLM engine are the plan's (ftis-flwr plan, check):
    what the learner still allocates, the round's KV tokens and vLLM's runtime; a CPU card and an
    hf card get none."""
    from ftis_flwr.config.engine_memory import BLOCK_TOKENS, OVERHEAD, learner_reserve, round_sequences, sequence_tokens
    from ftis_flwr.config.plan import estimate
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.engines.vllm_memory import engine_plan_options

    exp = load_experiment("paper-peft-1.5b", {"nodes.b.engine": "vllm"})
    card = next(c for c in exp.nodes if c.name == "b")
    model, _ = spare_rows_model(tied=True)
    options = engine_plan_options(card, exp, model)
    assert options == {"learner_reserve_bytes": learner_reserve(estimate(card, exp)),
                       "kv_tokens": round_sequences(exp) * sequence_tokens(card, exp) + BLOCK_TOKENS,
                       "runtime_bytes": OVERHEAD}
    assert options["learner_reserve_bytes"] > 0 and options["kv_tokens"] >= 12 * 12 * 256
    other = next(c for c in exp.nodes if c.name != "b")
    assert engine_plan_options(other, exp, model) == {}  # the hf node
    assert engine_plan_options(dataclasses.replace(card, device="cpu"), exp, model) == {}
