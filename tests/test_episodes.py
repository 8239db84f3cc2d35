"""The episode loop (``ftis_flwr/node/episodes.py``, ``ftis_flwr/node/turns.py``) and the loss over
episodes (``ftis_flwr/node/batch.py``), algorithm §13, on real tiny models and real tokenizers.

A tiny Qwen2 with the character tokenizer is first taught one episode of the calculator
environment (``toy_environments.CalcEnv``): ``12+34=`` -> ``#calc(12+34)<eos>`` [tool turn
``=46\\n``] ``#submit(46)<eos>`` [``=ok\\n``] ``done<eos>``. Then, through the HF engine:

- its episodes have three model turns and two tool calls, the environment's reward, and the tool
  turns' tokens are exactly the tokenizer's encoding of the wrapped results, with mask 0 and
  log-prob 0; at temperature 1 (whatever path it samples) every sampled token's pi_gen equals the
  model's own log-prob given the episode's tokens before it (the tokens trained on are the tokens
  it conditioned on), and the group passes the wire's rules;
- the turn limit, the token budget and a turn cut by the budget end an episode on a model token;
- a tool that raises or times out becomes an appended, counted error observation;
- ``reset``'s text is appended to the prompt; a reset that differs within a group is refused;
- with a chat template the tool turn is the template's suffix after the model's end-of-turn
  token, and a template that re-renders the history is refused;
- the tool-call formats read calls and name what they cannot read;
- the loss with sampled masks equals, in value, statistics and gradients, the loss of the same
  learner log-probs with the context tokens removed, and differs from treating them as sampled.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from conftest import tiny_qwen2
from transformers import AutoModelForCausalLM

from ftis_flwr.config.schema import LossConfig
from ftis_flwr.maths.loss import LossInputs, compute_loss
from ftis_flwr.node.batch import Sample, loss_inputs
from ftis_flwr.node.engines import make_engine
from ftis_flwr.node.episodes import Sampling, run_group, run_groups
from ftis_flwr.node.logprobs import completion_logprobs, pack_batch
from ftis_flwr.node.tiny.models import build_char_tokenizer, tiny_config
from ftis_flwr.node.turns import PLAIN_TOOL_TURN, tool_turn_ids
from ftis_flwr.tasks.environment import EnvironmentFault, ToolResult, load_environment
from ftis_flwr.tasks.episode_prompt import prompt_ids
from ftis_flwr.tasks.tool_calls import TOOL_FORMATS, tool_format_for

ROW = {"question": "12+34=", "answer": "46"}
MESSAGES = [{"role": "user", "content": "12+34="}]


def _enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def taught():
    """(tokenizer, engine, model, the episode's tokens after the prompt, its sampled mask): a tiny
    model trained until its greedy choice follows the scripted episode with a logit margin > 3."""
    tok = build_char_tokenizer()
    eos = tok.eos_token_id
    turns = [(_enc(tok, "#calc(12+34)") + [eos], 1), (_enc(tok, PLAIN_TOOL_TURN.format(content="46")), 0),
             (_enc(tok, "#submit(46)") + [eos], 1), (_enc(tok, PLAIN_TOOL_TURN.format(content="ok")), 0),
             (_enc(tok, "done") + [eos], 1)]
    episode = [t for ids, _ in turns for t in ids]
    mask = [m for ids, m in turns for _ in ids]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("small", len(tok), tok.pad_token_id, eos))
    x = torch.tensor([_enc(tok, "12+34=") + episode])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _step in range(400):
        logits = model(input_ids=x).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, x[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        top = logits.detach().topk(2, dim=-1)
        if (top.indices[:, 0] == x[0, 1:]).all() and (top.values[:, 0] - top.values[:, 1]).min() > 3:
            break
    else:
        pytest.fail("the tiny model did not learn the scripted episode in 400 steps")
    model.eval()
    engine = make_engine("hf", model, tok, vocab_size=len(tok), eos_token_ids=[eos])
    return tok, engine, model, np.array(episode), np.array(mask, np.uint8)


def _run(taught, env="CalcEnv", n=2, seed=5, tool_timeout=10.0, row=ROW, **sampling):
    tok, engine = taught[0], taught[1]
    spec = load_environment(f"toy_environments:{env}", tool_timeout=tool_timeout)
    kw = {"max_turns": 4, "max_tokens": 50, "temperature": 0.1, **sampling}
    return run_group(engine, tok, spec, row=row, messages=MESSAGES, n=n, seed=seed,
                     stop_ids=[tok.eos_token_id], sampling=Sampling(**kw))


def test_episodes_alternate_sampled_turns_and_appended_tool_turns(taught):
    tok, _, _, episode, mask = taught
    group = _run(taught, n=3)
    assert group.prompt_ids.tolist() == _enc(tok, "12+34=")
    for ep in group.episodes:
        assert (ep.turns, ep.tool_calls, ep.tool_errors, ep.stop, ep.reward) == (3, 2, 0, "answer", 1.0)
        assert ep.tokens.tolist() == episode.tolist() and ep.sampled.tolist() == mask.tolist()
        first_tool = ep.tokens[ep.sampled == 0][:4].tolist()
        assert first_tool == _enc(tok, "=46\n")  # the tokenizer's encoding of the wrapped result
        assert (ep.logprobs[ep.sampled == 0] == 0.0).all() and (ep.logprobs[ep.sampled == 1] <= 0).all()
        assert [m["role"] for m in ep.messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
        assert ep.messages[1] == {"role": "tool", "name": "calc", "content": "46"}
    g = group.group("train:0", node="a", model_id="m", tokenizer_fp="fp")
    g.validate(len(tok))
    assert g.rewards.tolist() == [1.0, 1.0, 1.0] and g.sampled_masks[0].tolist() == mask.tolist()


def test_sampled_log_probs_are_the_models_given_the_appended_context(taught):
    tok, _, model, _, _ = taught
    group = _run(taught, n=4, seed=11, temperature=1.0)
    prompt = group.prompt_ids.tolist()
    comps = [ep.tokens.tolist() for ep in group.episodes]
    with torch.no_grad():
        lp = completion_logprobs(model, pack_batch([prompt] * len(comps), comps, pad_id=tok.pad_token_id),
                                 temperature=1.0, vocab_size=len(tok))
    for i, ep in enumerate(group.episodes):
        sampled = ep.sampled.astype(bool)
        np.testing.assert_allclose(ep.logprobs[sampled], lp[i, : len(ep.tokens)].numpy()[sampled], atol=2e-4)
        assert ep.sampled[0] == 1 and ep.sampled[-1] == 1
    group.group("train:0", node="a", model_id="m", tokenizer_fp="fp").validate(len(tok))


def test_turn_limit_and_budget_end_an_episode_on_a_model_token(taught):
    tok = taught[0]
    one = _run(taught, n=1, max_turns=1).episodes[0]
    assert (one.stop, one.turns, one.tool_calls) == ("max_turns", 1, 1)
    assert one.tokens.tolist() == _enc(tok, "#calc(12+34)") + [tok.eos_token_id] and one.sampled.all()
    assert one.messages[-1]["content"] == "46"  # the tool ran (its state counts for get_reward)
    budget = _run(taught, n=1, max_tokens=16).episodes[0]  # 13 sampled + 4 tool tokens would leave none
    assert (budget.stop, len(budget.tokens), budget.tool_calls) == ("budget", 13, 1)
    cut = _run(taught, n=1, max_tokens=8).episodes[0]
    assert (cut.stop, cut.tokens.tolist(), cut.tool_calls) == ("length", _enc(tok, "#calc(12"), 0)
    per_turn = _run(taught, n=1, max_turn_tokens=5).episodes[0]
    assert (per_turn.stop, len(per_turn.tokens)) == ("length", 5)


def test_tool_failures_become_counted_appended_error_observations(taught):
    tok = taught[0]
    for env, kw, content in [("BrokenCalc", {}, "{'error': 'calculator broken'}"),
                             ("SlowCalc", {"tool_timeout": 0.2}, "{'error': 'timed out after 0.2 s'}")]:
        ep = _run(taught, env=env, n=1, max_turns=2, max_tokens=58, **kw).episodes[0]
        assert (ep.tool_calls, ep.tool_errors, ep.turns) == (1, 1, 2)
        assert ep.messages[1] == {"role": "tool", "name": "calc", "content": content}
        tool = _enc(tok, PLAIN_TOOL_TURN.format(content=content))
        assert ep.tokens[13:13 + len(tool)].tolist() == tool and not ep.sampled[13:13 + len(tool)].any()


def test_reset_text_joins_the_prompt_and_must_be_reproducible(taught):
    tok = taught[0]
    group = _run(taught, env="SeededEnv", n=2, max_turns=1, max_tokens=4)
    extra = group.prompt_messages[0]["content"][len("12+34="):]
    assert extra.startswith(" secret ") and group.prompt_ids.tolist() == _enc(tok, "12+34=" + extra)
    assert [ep.reward for ep in group.episodes] == [0.0, 0.0]  # async get_reward: no guess made
    with pytest.raises(EnvironmentFault, match=r"Unreproducible.reset\(\*\*row\) returned different texts"):
        _run(taught, env="Unreproducible", n=2)


CHAT = ("{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %};{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}<eos>\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_a_chat_templates_tool_turn_is_its_suffix_after_the_end_of_turn():
    tok = build_char_tokenizer()
    tok.chat_template = CHAT
    eos = tok.eos_token_id
    results = [ToolResult("calc", "46"), ToolResult("submit", "ok")]
    ids = tool_turn_ids(tok, results, [eos])
    assert ids == _enc(tok, "\n<tool>46<eos>\n<tool>ok<eos>\n<assistant>")  # "\n" after the model's <eos> too
    spec = load_environment("toy_environments:CalcEnv")
    assert prompt_ids(tok, MESSAGES, spec.schemas) == _enc(tok, "tools: calc submit;<user>12+34=<eos>\n<assistant>")
    tok.chat_template = "{{ messages[-1].content }}<eos>"  # renders the last message only: history changes
    with pytest.raises(ValueError, match="renders the assistant turn differently"):
        tool_turn_ids(tok, results, [eos])
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"  # no end-of-turn token at all
    with pytest.raises(ValueError, match="does not end with one of the stop tokens"):
        tool_turn_ids(tok, results, [eos])
    with pytest.raises(ValueError, match="writes neither <tool_call> nor Llama 3"):
        tool_format_for(tok)
    tok.chat_template = "<tool_call>" + CHAT
    assert tool_format_for(tok).name == "hermes" and tool_format_for(build_char_tokenizer()).name == "tiny"


def test_a_tool_turn_layout_is_the_templates_markers_around_the_results():
    """What a sender tells peers of another template: the text before, between and after tool
    results, read from its own tool turns, so that filled with any results it is byte for byte the
    tool turn the node appends; a template whose tool turn writes the tool's name has none."""
    from ftis_flwr.node.turns import tool_turn_layout
    from ftis_flwr.wire.tool_turns import ToolTurnLayout

    tok = build_char_tokenizer()
    eos = tok.eos_token_id
    assert tool_turn_layout(tok, [eos]) == ToolTurnLayout("=", "\n=", "\n")  # PLAIN_TOOL_TURN
    tok.chat_template = CHAT
    layout = tool_turn_layout(tok, [eos])
    assert layout == ToolTurnLayout("\n<tool>", "<eos>\n<tool>", "<eos>\n<assistant>")
    results = [ToolResult("calc", "46"), ToolResult("submit", "ok")]
    assert layout.text(["46", "ok"]) == tok.decode(tool_turn_ids(tok, results, [eos])).encode()
    assert ToolTurnLayout.from_wire(layout.wire()) == layout
    tok.chat_template = CHAT.replace("<{{ m.role }}>", "<{{ m.role }}{{ m.name or '' }}>")
    with pytest.raises(ValueError, match="writes each result's tool name"):
        tool_turn_layout(tok, [eos])


LLAMA_LIKE = ("{%- for m in messages %}"
              "{%- if m.role == 'tool' %}<|h|>ipython<|/h|>\n\n{{ m.content | tojson }}<eos>"
              "{%- elif m.tool_calls is defined and m.tool_calls %}<|h|>assistant<|/h|>\n\n"
              "{{- '{\"name\": \"' + m.tool_calls[0].function.name + '\", ' }}{{- '\"parameters\": ' }}"
              "{{- m.tool_calls[0].function.arguments | tojson }}}<eos>"
              "{%- else %}<|h|>{{ m.role }}<|/h|>\n\n{{ m.content }}<eos>{%- endif %}"
              "{%- endfor %}{%- if add_generation_prompt %}<|h|>assistant<|/h|>\n\n{% endif %}")
"""Llama 3.1's layout on the tiny BPE tokenizer: a call is the whole assistant turn as JSON with
``parameters``, each tool result its own ``ipython`` turn with the content written by ``tojson``."""


def test_llama3_json_calls_are_read_detected_and_their_tool_turns_laid_out():
    """``llama3-json``: the turn is one ``{"name", "parameters"}`` object (after an optional
    ``<|python_tag|>``), anything else an answer; a turn that opens a call and breaks is a call with
    its error. A template that writes ``"parameters"`` and an ``ipython`` turn is detected; its tool
    turns (content quoted by ``tojson``) have a layout a peer of another template can check."""
    from ftis_flwr.node.tiny.bpe import build_bpe_tokenizer
    from ftis_flwr.node.turns import tool_turn_layout

    tools = load_environment("toy_environments:CalcEnv").tools
    fmt = TOOL_FORMATS["llama3-json"]
    call = fmt.render("calc", {"expression": "12+34"}, tools)
    assert call == '{"name": "calc", "parameters": {"expression": "12+34"}}'
    assert [(c.name, c.arguments) for c in fmt.parse(call, tools)] == [("calc", {"expression": "12+34"})]
    assert fmt.parse("<|python_tag|>" + call, tools)[0].arguments == {"expression": "12+34"}
    assert fmt.parse("46", tools) == [] and fmt.parse('{"answer": 46}', tools) == []
    (broken,) = fmt.parse('{"name": "calc", "parameters": {', tools)
    assert broken.error.startswith("the tool call is not JSON")
    tok = build_bpe_tokenizer()
    tok.chat_template = LLAMA_LIKE
    assert tool_format_for(tok).name == "llama3-json"
    eos = tok.eos_token_id
    layout = tool_turn_layout(tok, [eos])
    assert (layout.head, layout.tail) == ('<|h|>ipython<|/h|>\n\n"', '"<eos><|h|>assistant<|/h|>\n\n')
    ids = tool_turn_ids(tok, [ToolResult("calc", "46"), ToolResult("calc", "7")], [eos])
    assert layout.text(["46", "7"]) == tok.decode(ids).encode()


def test_tool_call_formats_read_calls_and_name_what_they_cannot():
    tools = load_environment("toy_environments:SeededEnv").tools
    hermes, tiny = TOOL_FORMATS["hermes"], TOOL_FORMATS["tiny"]
    text = ('I will guess.\n<tool_call>\n{"name": "guess", "arguments": {"value": 3, "mode": "near"}}\n</tool_call>'
            '<tool_call>{"name": "nap", "arguments": "{\\"seconds\\": 1}"}</tool_call>'
            "<tool_call>{name: guess}</tool_call><tool_call>[1]</tool_call><tool_call>{\"name\": \"boom\"")
    calls = hermes.parse(text, tools)
    assert [(c.name, c.arguments) for c in calls[:2]] == [("guess", {"value": 3, "mode": "near"}),
                                                          ("nap", {"seconds": 1})]
    assert [c.error.split(" (")[0] for c in calls[2:]] == [
        "the tool call is not JSON", 'a tool call is a JSON object {"name": ..., "arguments": {...}}',
        "a <tool_call> block is never closed with </tool_call>"]
    assert hermes.parse(hermes.render("guess", {"value": 3}, tools), tools)[0].arguments == {"value": 3}
    calls = tiny.parse("#guess(12,near) then #nap(0.5) #guess(x) #look(1) #guess(1,exact,a,b) #boom()", tools)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("guess", {"value": 12, "mode": "near"}, ""), ("nap", {"seconds": 0.5}, ""),
        ("guess", {}, "guess: value must be a integer, got 'x'"),
        ("look", {}, "Tool look not found. Tools: boom, guess, nap"),
        ("guess", {}, "guess takes 3 values, got 4"), ("boom", {}, "")]
    assert tiny.render("guess", {"value": 12, "mode": "near"}, tools) == "#guess(12,near)"


@pytest.mark.parametrize("share_prompts", [False, True])
@pytest.mark.parametrize("reduction", ["sequence", "token"])
def test_the_loss_runs_over_sampled_tokens_only(share_prompts, reduction):
    model = tiny_qwen2(False).train()
    g = torch.Generator().manual_seed(3)
    prompts = [[5, 9, 12, 7], [5, 9, 12, 7], [8, 3]]
    comps, masks = [], []
    for spans in ([(3, 1), (4, 0), (2, 1)], [(2, 1), (3, 0), (2, 1)], [(1, 1), (6, 0), (3, 1), (2, 0), (1, 1)]):
        comps.append(torch.randint(3, 62, (sum(n for n, _ in spans),), generator=g).numpy())
        masks.append(np.array([m for n, m in spans for _ in range(n)], np.uint8))
    gens = [np.where(m == 1, -torch.rand(len(m), generator=g).numpy() * 4, 0.0).astype(np.float32) for m in masks]
    advs, foreign = [-1.0, 0.5, -0.7], [True, False, True]
    samples = [Sample(np.array(p), c, gl, a, f, "b" if f else "a", None, m)
               for p, c, gl, a, f, m in zip(prompts, comps, gens, advs, foreign, masks)]
    kw = dict(pad_id=0, vocab_size=70, temperature=1.0, share_prompts=share_prompts, sequence_ratio=False,
              compute=contextlib.nullcontext)
    cfg = LossConfig(method="f-tis", kl_threshold=1.0, reduction=reduction)
    full = loss_inputs(model, samples, **kw)
    assert full.mask.sum().item() == sum(int(m.sum()) for m in masks)  # the context is not in the loss
    width = max(int(m.sum()) for m in masks)  # the same learner log-probs, context tokens cut out
    lp, gen = torch.zeros(3, width), torch.zeros(3, width)
    kept = torch.zeros(3, width, dtype=torch.bool)
    for i, m in enumerate(masks):
        at = torch.from_numpy(np.flatnonzero(m))
        lp[i, : len(at)], gen[i, : len(at)], kept[i, : len(at)] = full.logprobs[i, at], full.gen_logprobs[i, at], True
    cut = LossInputs(lp, gen, full.advantages, kept, full.foreign, full.sources)
    a, b = compute_loss(full, cfg), compute_loss(cut, cfg)
    assert a.denominator == b.denominator
    torch.testing.assert_close(a.loss, b.loss)
    for key in ("sample_kl", "n_tokens", "filtered", "counted", "w", "log_ratio"):
        np.testing.assert_allclose(getattr(a.stats, key), getattr(b.stats, key), rtol=1e-6, err_msg=key)
    assert a.stats.filtered.any() and not a.stats.filtered.all()  # the filter decided on sampled tokens
    params = [p for p in model.parameters() if p.requires_grad]
    ga = torch.autograd.grad(a.loss, params, retain_graph=True)
    gb = torch.autograd.grad(b.loss, params)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y)
    every = loss_inputs(model, [s._replace(sampled=None) for s in samples], **kw)
    assert not torch.allclose(compute_loss(every, cfg).loss, a.loss)  # the mask matters


def test_a_groups_live_episodes_sample_each_turn_in_one_engine_call(taught):
    """The G episodes of a group sample turn by turn together (one engine call a step, over the
    episodes still live), not one episode after another: 4 taught episodes of 3 turns, 3 calls; a
    round's groups sample together too, in batches of rollout.batch_size."""
    tok, engine = taught[0], taught[1]
    calls = []

    class Counting:  # the real engine, its calls counted
        def sample(self, prompts, n, **kw):
            calls.append((len(prompts), kw["batch_size"]))
            return engine.sample(prompts, n, **kw)

    spec = load_environment("toy_environments:CalcEnv")
    group = run_group(Counting(), tok, spec, row=ROW, messages=MESSAGES, n=4, seed=5, stop_ids=[tok.eos_token_id],
                      sampling=Sampling(max_turns=4, max_tokens=50, temperature=0.1))
    assert [ep.turns for ep in group.episodes] == [3, 3, 3, 3] and calls == [(4, 4)] * 3
    calls.clear()  # two rows' groups together, at most 4 sequences a batch (rollout.batch_size)
    groups = run_groups(Counting(), tok, spec, rows=[(ROW, MESSAGES, 5), (ROW, MESSAGES, 6)], n=3, sample_seed=5,
                        stop_ids=[tok.eos_token_id], sampling=Sampling(max_turns=4, max_tokens=50, temperature=0.1,
                                                                       batch_size=4))
    assert [len(g.episodes) for g in groups] == [3, 3] and calls == [(6, 4)] * 3
