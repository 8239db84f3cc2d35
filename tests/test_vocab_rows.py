"""A model with more output rows than its tokenizer has tokens (Qwen2.5: 151,936 vs 151,665).

The spare rows are made the most likely ones on purpose: the sampler must still never emit them,
the learner must score the same restricted distribution (own samples have ratio exactly 1), and
no group may be lost."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.node import Node, StepRequest
from ftis_flwr.node.tiny.models import build_char_tokenizer, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SPARE = 16


@pytest.fixture(scope="module")
def spare_rows_model(tmp_path_factory):
    """A tiny Qwen2 with SPARE extra output rows that hold most of the probability mass."""
    tok = build_char_tokenizer()
    vocab = len(tok)
    config = tiny_config("small", vocab + SPARE, tok.pad_token_id, tok.eos_token_id)
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    prompts = tok(["12+34=", "56-7=", "99+99="], add_special_tokens=False, padding=True,
                  return_tensors="pt")
    with torch.no_grad():
        hidden = model.model(**prompts).last_hidden_state[:, -1].mean(0)
        model.lm_head.weight[vocab:] = 50 * hidden / hidden.norm()
        probs = model(**prompts).logits[:, -1].softmax(-1)
    spare_mass = probs[:, vocab:].sum(-1)
    assert (spare_mass > 0.9).all(), spare_mass  # without the mask these rows would be sampled
    path = tmp_path_factory.mktemp("spare") / "model"
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, vocab


def test_spare_rows_are_never_sampled_and_own_samples_are_on_policy(spare_rows_model, tmp_path):
    path, vocab = spare_rows_model
    exp = load_experiment(yaml_text=f"""
rollout: {{group_size: 8, max_new_tokens: 6, batch_size: 64}}
train: {{lr: 1e-3, micro_batch_size: 32}}
rounds: {{num_rounds: 2, prompts_per_node: 8, eval_size: 16}}
nodes: [{{name: a, source: "{path}", seed: 3}}]
""", overrides={"cache_dir": str(tmp_path / "cache")})
    node = Node(exp.nodes[0], exp)
    assert node.vocab_size == vocab < node.model.get_input_embeddings().weight.shape[0] + 1
    out = node.step(StepRequest(round=0, num_rounds=2, prompt_indices=list(range(8)), group_size=8,
                                evaluate=True))
    assert out.metrics["groups_dropped_unencodable"] == 0
    assert len(out.groups) == 8 and all(g.size == 8 for g in out.groups)
    ids = torch.cat([torch.as_tensor(c) for g in out.groups for c in g.completions])
    assert int(ids.max()) < vocab
    out = node.step(StepRequest(round=1, num_rounds=2, prompt_indices=list(range(8, 16)), group_size=8,
                                evaluate=False))
    assert out.metrics["samples_own"] == 64
    assert out.metrics["own_logprob_gap_max"] < 1e-5, out.metrics  # ratio exactly 1 in float32
    assert all(int(c.max()) < vocab for g in out.groups for c in g.completions)
