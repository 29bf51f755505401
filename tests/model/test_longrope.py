"""Phi-3 LongRoPE against transformers around the switch from the short to the long factors.

transformers (as Microsoft's reference code) turns every token of a sequence with the factors
its length picks: the long ones past original_max_position_embeddings, the short ones
otherwise, one attention factor for both; generate() drops its cache when the sequence grows
past the short context and recomputes it with the long factors
(Phi3ForCausalLM.prepare_inputs_for_generation). The checkpoint: short context 64,
max_position_embeddings 256, factors that differ by up to 8x; prompts of 40, 64 (short), 65
and 200 (long) tokens, and decodes that cross 64."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_checkpoint_path
from lite_llm import LLM, SamplingParams
from test_parity import lite_logits, make_runner, paged_greedy, prompts_for

ORIGINAL = 64
PHI3 = dict(original_max_position_embeddings=ORIGINAL, max_position_embeddings=256,
            rope_scaling={"rope_type": "longrope", "rope_theta": 10000.0,
                          "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                          "long_factor": [1.0, 1.5, 2.2, 3.4, 5.0, 7.5, 11.0, 16.0]})
LENS = [40, 64, 65, 200]


def _path():
    return tiny_checkpoint_path("phi3", **PHI3)


def _hf():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(_path(), dtype=torch.float32).eval()


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("chunk", [None, 7])
def test_prompts_below_at_and_past_the_short_context_match_transformers(chunk):
    """One shot and in chunks of 7 (a chunk of the 200-token prompt that lies below 64 still
    turns with the long factors, as the prompt's one forward in transformers does)."""
    model = _hf()
    runner, loaded = make_runner(_path(), num_blocks=64, max_tokens=512)
    prompts = prompts_for(loaded.config.vocab_size, LENS)
    with torch.no_grad():
        want = [model(torch.tensor([p])).logits[0].numpy() for p in prompts]
    for g, w in zip(lite_logits(runner, prompts, chunk=chunk), want):
        _close(g, w)


def _hf_generate(model, prompt: list[int], new: int):
    with torch.no_grad():
        gen = model.generate(torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    return gen.sequences[0, len(prompt):].tolist(), [w[0].numpy() for w in gen.logits]


@pytest.mark.parametrize("prompt_len,new", [(64, 8), (200, 8), (30, 8)])
def test_greedy_decode_on_either_side_of_the_switch_matches_transformers_generate(prompt_len, new):
    """Through the paged cache: 200 + 8 long throughout, 30 + 8 short throughout, and 64 + 8,
    whose first decode step makes it 65 tokens long: transformers recomputes the sequence with
    the long factors there, as the engine's scheduler does (here: the 65 tokens prefilled
    again). Tokens identical, every step's logits within 1e-4."""
    model = _hf()
    runner, loaded = make_runner(_path(), num_blocks=64, max_tokens=512)
    prompt = prompts_for(loaded.config.vocab_size, [prompt_len], seed=prompt_len)[0]
    want, want_logits = _hf_generate(model, prompt, new)
    if prompt_len <= ORIGINAL < prompt_len + new:    # the engine's recompute at the switch
        got, logits = paged_greedy(runner, prompt, 1)
        more, more_logits = paged_greedy(runner, prompt + got, new - 1)
        got, logits = got + more, logits + more_logits
    else:
        got, logits = paged_greedy(runner, prompt, new)
    assert got == want
    for g, w in zip(logits, want_logits):
        _close(g, w)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_engine_generate_across_the_switch_matches_transformers(prefix_caching):
    """Through the engine, prefilled 32 tokens a step: prompts of 40 (+ 40 tokens) and 60
    (+ 12) cross 64 while decoding, as does one of 64 at its first step; one of 120 shares the
    whole 40-token prompt (long factors for all of them: the cached blocks of
    that prefix, turned short, are not its blocks). Greedy tokens identical to transformers'
    generate, each token's logprob within 1e-4 of transformers' log-softmax."""
    model = _hf()
    rng = np.random.default_rng(5)
    first = rng.integers(3, 320, 40).tolist()
    prompts = [(first, 40), (rng.integers(3, 320, 60).tolist(), 12), (rng.integers(3, 320, 64).tolist(), 6),
               (first[:40] + rng.integers(3, 320, 80).tolist(), 10)]
    want = [_hf_generate(model, p, n) for p, n in prompts]
    with LLM(str(_path()), dtype="float32", block_size=16, max_num_batched_tokens=32, kv_cache_space=0.01,
             enable_prefix_caching=prefix_caching) as llm:
        for (p, n), (tokens, logits) in zip(prompts, want):
            out = llm.generate([{"prompt_token_ids": p}], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True,
                                                                          logprobs=0))[0].outputs[0]
            assert out.token_ids == tokens, len(p)
            ref = [float(torch.log_softmax(torch.from_numpy(w), -1)[t]) for w, t in zip(logits, tokens)]
            got = [lp[t].logprob for lp, t in zip(out.logprobs, tokens)]
            np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0, err_msg=f"prompt of {len(p)}")


def test_pooling_runner_turns_a_long_input_with_the_long_factors():
    """An embedding of the same Phi-3 (last token, not normalized) for inputs of 40 (short) and
    100 (long) tokens: transformers' last hidden state of each."""
    from transformers import AutoModel
    prompts = prompts_for(320, [40, 100], seed=3)
    llm = LLM(str(_path()), dtype="float32", runner="pooling",
              pooler_config={"pooling_type": "LAST", "normalize": False})
    try:
        outs = llm.embed([{"prompt_token_ids": p} for p in prompts])
    finally:
        llm.shutdown()
    model = AutoModel.from_pretrained(_path(), dtype=torch.float32).eval()
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            h = model(torch.tensor([p])).last_hidden_state[0, -1].numpy()
        np.testing.assert_allclose(out.outputs.embedding, h, atol=1e-4 * np.abs(h).max(), rtol=1e-4)


def test_speculative_decoding_across_the_switch_gives_the_same_tokens():
    """The checkpoint as its own draft model (2 drafts a step): a 60-token prompt decoded past
    64, drafts verified across the switch; greedy tokens identical to transformers'."""
    model = _hf()
    prompt = np.random.default_rng(8).integers(3, 320, 60).tolist()
    want, _ = _hf_generate(model, prompt, 14)
    spec = {"method": "draft_model", "model": str(_path()), "num_speculative_tokens": 2}
    with LLM(str(_path()), dtype="float32", block_size=16, kv_cache_space=0.01, speculative_config=spec) as llm:
        out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=14,
                                                                          ignore_eos=True))[0].outputs[0]
        accepted = llm.stats().spec_decode_num_accepted_tokens
    assert out.token_ids == want
    assert accepted > 0
