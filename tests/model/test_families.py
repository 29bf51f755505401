"""Parity with transformers for the families built on the architecture recipes beyond the
first four (lite_llm/model/arch/): Gemma 2, Gemma 3 (text), Phi-3 and Granite. Built like
test_parity.py: tiny random checkpoints saved with transformers, fp32 logits and greedy tokens,
bf16 logits, chunked prefill and paged decode against one shot, and a GGUF of the same weights.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import gguf_from_hf, tiny_checkpoint_path
from test_parity import check_chunked_matches_one_shot, lite_logits, make_runner, prompts_for

# (arch, overrides): each variant that changes the math
CASES = [
    ("gemma2", {}),                                              # soft-capped scores and logits, sliding +
                                                                 # global layers, four norms, GeGLU
    ("gemma2", {"final_logit_softcapping": None, "attn_logit_softcapping": None}),
    ("gemma3", {}),                                              # sliding layers (window 8 < prompt), q/k norm
    ("gemma3", {"tie_word_embeddings": False, "num_key_value_heads": 1}),
]
PROMPT_LENS = [1, 5, 23, 40]     # 23 and 40 > the sliding window of 8
# Phi-3 with LongRoPE (short context 32, max_position_embeddings 128). An engine serving
# sequences past 32 rotates with the long factors; transformers does the same for a sequence
# longer than 32, so its prompts run past the short context.
PHI3_CASES = [
    ("phi3", {}),
    ("phi3", {"partial_rotary_factor": 0.5, "tie_word_embeddings": True,     # Phi-4-mini's partial rotary
              "rope_scaling": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.2, 1.7, 2.9],
                               "long_factor": [1.0, 2.0, 4.5, 9.0]}}),
]
PHI3_LONG_LENS = [33, 40, 64]


def hf_logits(path, prompts: list[list[int]], dtype=torch.float32) -> list[np.ndarray]:
    """transformers' logits with its eager attention: the one that applies Gemma 2's soft-capping."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0].float().numpy() for p in prompts]


def _ids(case) -> str:
    arch, ov = case
    return arch + ("-" + "-".join(f"{k}={v.get('rope_type') if isinstance(v, dict) else v}"
                                  for k, v in ov.items()) if ov else "")


def check_against_transformers(case, lens: list[int], dtype: str = "float32", **runner_kw) -> list[np.ndarray]:
    """Prompts of `lens` through one runner of `case` in a mixed batch against transformers' fp32
    logits: within 1e-4 (fp32), or test_parity.py's bf16 tolerance; returns the reference."""
    arch, overrides = case
    path = tiny_checkpoint_path(arch, **overrides)
    runner, loaded = make_runner(path, dtype=dtype, **runner_kw)
    prompts = prompts_for(loaded.config.vocab_size, lens)
    ref = hf_logits(path, prompts)
    for r, g in zip(ref, lite_logits(runner, prompts)):
        if dtype == "float32":
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())
        else:
            assert np.abs(g - r).max() <= 0.03 * np.abs(r).max()
    return ref


def check_gguf_matches_hf(case, tmp_path, fields: tuple[str, ...], lens: list[int], **extra_overrides) -> None:
    """A GGUF written from the same checkpoint loads to the same config `fields` and logits (1e-5)."""
    arch, overrides = case
    ckpt = tiny_checkpoint_path(arch, **{**overrides, **extra_overrides})
    g_runner, g = make_runner(gguf_from_hf(ckpt, tmp_path / "m.gguf", arch))
    h_runner, h = make_runner(ckpt)
    for field in fields:
        assert getattr(g.config, field) == pytest.approx(getattr(h.config, field)), field
    prompts = prompts_for(h.config.vocab_size, lens)
    for a, b in zip(lite_logits(h_runner, prompts), lite_logits(g_runner, prompts)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_fp32_logits_match_transformers_in_a_mixed_batch(case):
    check_against_transformers(case, PROMPT_LENS)


@pytest.mark.parametrize("case", CASES[::2], ids=_ids)
def test_fp32_greedy_tokens_match_transformers(case):
    """Greedy generation through the paged cache, token for token (transformers' generate)."""
    _greedy(case, prompt_len=12)


def _greedy(case, prompt_len: int) -> None:
    from transformers import AutoModelForCausalLM
    arch, overrides = case
    path = tiny_checkpoint_path(arch, **overrides)
    runner, loaded = make_runner(path)
    prompt = prompts_for(loaded.config.vocab_size, [prompt_len])[0]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, min_new_tokens=20,
                              eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    table = np.arange(runner.num_blocks, dtype=np.int32)[None, :]
    got, ids = [], list(prompt)
    pos = np.arange(len(ids), dtype=np.int32)
    toks = np.array(ids, np.int32)
    while len(got) < 20:
        slots = table[0, pos // 16].astype(np.int64) * 16 + pos % 16
        seq = np.zeros(len(toks), np.int32)
        logits = runner.forward(toks, pos, slots, seq, table, np.array([len(toks) - 1], np.int32),
                                rope_rows=runner.rope_rows(pos, seq, np.array([len(prompt)], np.int32)))
        nxt = int(np.argmax(logits[0]))
        got.append(nxt)
        toks, pos = np.array([nxt], np.int32), np.array([pos[-1] + 1], np.int32)
    assert got == want


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_and_paged_decode_match_one_shot(case, chunk):
    check_chunked_matches_one_shot(*case, chunk)


@pytest.mark.parametrize("case", CASES[::2], ids=_ids)
def test_bf16_logits_close_to_transformers(case):
    """Within test_parity.py's bf16 tolerance of the fp32 reference."""
    check_against_transformers(case, PROMPT_LENS, dtype="bfloat16")


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_gguf_of_the_same_weights_gives_the_same_logits(case, tmp_path):
    """llama.cpp's gemma2 / gemma3 names and metadata (norms stored with their + 1). llama.cpp
    scales attention by head_dim ** -0.5 (no metadata key carries query_pre_attn_scalar), as
    the released models' query_pre_attn_scalar = head_dim does."""
    check_gguf_matches_hf(case, tmp_path, ("architecture", "layer_types", "sliding_window", "rope_theta",
                                           "rope_scaling", "rope_local_theta", "final_softcap", "tie_word_embeddings",
                                           "qk_norm", "post_norms", "embed_scale"), [7, 30], query_pre_attn_scalar=16)


# ---- Phi-3 -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", PHI3_CASES, ids=_ids)
def test_phi3_fp32_logits_past_the_short_context_match_transformers(case):
    """Fused qkv_proj / gate_up_proj split at load; LongRoPE's long factors (and the attention
    factor) for sequences past original_max_position_embeddings."""
    check_against_transformers(case, PHI3_LONG_LENS)


@pytest.mark.parametrize("case", PHI3_CASES, ids=_ids)
@pytest.mark.parametrize("max_model_len", [32, None])
def test_phi3_within_the_short_context_uses_the_short_factors(case, max_model_len):
    """A prompt that fits the short context rotates with the short factors, as transformers
    does for every sequence that fits it, in an engine that serves only the short context and
    in one that serves longer sequences alike; the two sets of factors differ (transformers'
    logits of a 33-token prompt's first 32 positions are not those of its 32-token prefix)."""
    ref = check_against_transformers(case, [1, 5, 23, 32], max_model_len=max_model_len)
    prompt = prompts_for(320, [1, 5, 23, 32])[-1]
    longer = hf_logits(tiny_checkpoint_path(case[0], **case[1]), [prompt + [7]])[0][:32]
    assert np.abs(longer - ref[-1]).max() > 1e-2 * np.abs(ref[-1]).max()


@pytest.mark.parametrize("case", PHI3_CASES, ids=_ids)
def test_phi3_greedy_tokens_match_transformers(case):
    """A prompt past the short context, then 20 tokens of paged decode (long factors throughout)."""
    _greedy(case, prompt_len=36)


@pytest.mark.parametrize("case", PHI3_CASES, ids=_ids)
@pytest.mark.parametrize("chunk", [1, 7])
def test_phi3_chunked_prefill_and_paged_decode_match_one_shot(case, chunk):
    test_chunked_prefill_and_paged_decode_match_one_shot(case, chunk)


def test_phi3_bf16_logits_close_to_transformers():
    check_against_transformers(PHI3_CASES[0], PHI3_LONG_LENS, dtype="bfloat16")


@pytest.mark.parametrize("case", PHI3_CASES, ids=_ids)
def test_phi3_gguf_of_the_same_weights_gives_the_same_logits(case, tmp_path):
    """llama.cpp's phi3 graph: attn_qkv and a [2F, E] ffn_up split at load, the LongRoPE
    factors as tensors, rope.dimension_count for partial rotary."""
    check_gguf_matches_hf(case, tmp_path, ("architecture", "head_dim", "partial_rotary_factor", "tie_word_embeddings",
                                           "sliding_window"), [7, 40])


# ---- Granite -----------------------------------------------------------------------------

GRANITE_CASES = [("granite", {}), ("granite", {"tie_word_embeddings": False, "num_key_value_heads": 1})]


@pytest.mark.parametrize("case", GRANITE_CASES, ids=_ids)
def test_granite_fp32_logits_match_transformers_in_a_mixed_batch(case):
    """Embedding, residual, attention and logit multipliers (none of them 1)."""
    check_against_transformers(case, PROMPT_LENS)


def test_granite_greedy_tokens_and_bf16_logits_match_transformers():
    _greedy(GRANITE_CASES[0], prompt_len=12)
    check_against_transformers(GRANITE_CASES[0], PROMPT_LENS, dtype="bfloat16")


@pytest.mark.parametrize("chunk", [1, 7])
def test_granite_chunked_prefill_and_paged_decode_match_one_shot(chunk):
    test_chunked_prefill_and_paged_decode_match_one_shot(GRANITE_CASES[0], chunk)


@pytest.mark.parametrize("case", GRANITE_CASES, ids=_ids)
def test_granite_gguf_of_the_same_weights_gives_the_same_logits(case, tmp_path):
    """llama.cpp's granite graph: q/k permuted as for llama, the multipliers under its names."""
    check_gguf_matches_hf(case, tmp_path, ("architecture", "embedding_multiplier", "residual_multiplier",
                                           "logits_scaling"), [7, 30])
