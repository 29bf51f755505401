"""LFM2 (Lfm2ForCausalLM) against transformers on tiny random checkpoints built with its own
Lfm2Config: short-convolution layers (in_proj -> B, C, x; a causal depthwise conv of B * x over
time; C * it; out_proj) between attention layers with q/k norms. fp32 logits in a mixed batch,
prefilled in chunks (the conv state carried from chunk to chunk) and token by token (decode as
a state update); greedy tokens through the runner and through the engine with concurrent
requests and forced preemption (a recomputed request restarts from an empty state); the state
cache's size; the refusals (speculative decoding, LoRA, tensor parallel) and prefix caching off."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from conftest import tiny_checkpoint_path
from test_families import _greedy, hf_logits
from test_parity import (check_llama_cpp_agrees, check_logits, engine_outputs, hf_greedy, lite_logits, make_runner,
                        override_ids, prompts_for)

def _ids(case) -> str:
    return override_ids(case, ("layer_types",))


CASES = [("lfm2", {}),
         # biases on in_proj, the conv and out_proj; the MLP width adjusted as transformers does
         # (2/3 of intermediate_size x 1.5, rounded up to 32); two attention layers, GQA 4:1
         ("lfm2", {"conv_bias": True, "block_auto_adjust_ff_dim": True, "intermediate_size": 120,
                   "block_ffn_dim_multiplier": 1.5, "block_multiple_of": 32, "num_key_value_heads": 1,
                   "layer_types": ["full_attention", "conv", "conv", "full_attention"]}),
         # four taps per channel, the first layer a conv layer and the last too
         ("lfm2", {"conv_L_cache": 4, "num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"]})]
PROMPT_LENS = [1, 5, 23, 40]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_fp32_logits_match_transformers_in_a_mixed_batch(case):
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path)
    cfg = loaded.config
    assert cfg.is_hybrid and cfg.num_conv_layers == list(cfg.layer_types).count("conv") >= 1
    if case[1].get("block_auto_adjust_ff_dim"):
        assert cfg.ffn_dim == 128   # int(2 * 120 / 3) = 80, x 1.5 = 120, up to a multiple of 32
    prompts = prompts_for(cfg.vocab_size, PROMPT_LENS)
    check_logits(lite_logits(runner, prompts), hf_logits(path, prompts))


@pytest.mark.parametrize("case", CASES[:2], ids=_ids)
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_and_token_by_token_decode_match_transformers(case, chunk):
    """chunk=7: each sequence's prefill in chunks of 7 beside the others', the conv state
    carried across chunks; chunk=1: every position a decode step (a state update)."""
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path)
    prompts = prompts_for(loaded.config.vocab_size, [3, 20, 37])
    check_logits(lite_logits(runner, prompts, chunk=chunk), hf_logits(path, prompts))


def test_a_sequence_restarted_at_position_zero_ignores_its_slots_old_state():
    """The slot's state after one prompt does not leak into the next prompt run in the same slot:
    a step that begins a sequence at position 0 starts from an empty state."""
    path = tiny_checkpoint_path("lfm2")
    runner, loaded = make_runner(path)
    a, b = prompts_for(loaded.config.vocab_size, [9, 6], seed=5)
    lite_logits(runner, [a])                 # slot 0 now holds a's state
    check_logits(lite_logits(runner, [b]), hf_logits(path, [b]))


@pytest.mark.parametrize("case", CASES[:2], ids=_ids)
def test_fp32_greedy_tokens_match_transformers(case):
    _greedy(case, prompt_len=12)


@pytest.mark.parametrize("case", CASES[:2], ids=_ids)
def test_bf16_weights_stay_close_to_transformers_fp32(case):
    """bf16 weights (the conv block's GEMM inputs as bf16 pairs), prefilled 7 tokens a step,
    against the fp32 reference: the dense families' bf16 bound (test_families.py)."""
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path, dtype="bfloat16")
    prompts = prompts_for(loaded.config.vocab_size, PROMPT_LENS)
    for g, r in zip(lite_logits(runner, prompts, chunk=7), hf_logits(path, prompts)):
        assert np.abs(g - r).max() <= 0.03 * np.abs(r).max()


def test_q8_0_at_load_matches_the_dequantized_reference(tmp_path):
    """Every matrix quantized at load to Q8_0 (in_proj and out_proj on the int8-block kernels,
    their inputs as int8 blocks; the conv taps stay float) against transformers on the same
    weights quantized and dequantized by the gguf package, whole and a token at a time, within
    the quantized families' bound (test_moe.py)."""
    import gguf
    from test_moe import _check_quantized_moe, _roundtrip_reference
    ckpt = tiny_checkpoint_path(*CASES[1][:1], **CASES[1][1])
    model = _roundtrip_reference(ckpt, tmp_path / "roundtrip", lambda name: gguf.GGMLQuantizationType.Q8_0)
    runner, _ = make_runner(ckpt, quantization="q8_0")
    assert runner.formats["layers.1.in_proj"] == (("Q8_0",), "int8 blocks")
    assert runner.formats["layers.1.out_proj"] == (("Q8_0",), "int8 blocks")
    _check_quantized_moe(runner, model, "q8_0")


def test_engine_greedy_tokens_match_with_concurrent_requests_and_preemption(caplog):
    """Six requests of 1 to 37 prompt tokens through the engine at once, prefilled in chunks
    under a 16-token budget, with 6 KV blocks of 16 where they need up to 4 each: they preempt
    one another (recompute: a readmitted request restarts from an empty state) and every
    greedy token equals transformers'. Prefix caching is asked for and turned off."""
    from lite_llm import SamplingParams
    from lite_llm.llm import EngineArgs
    path = str(tiny_checkpoint_path("lfm2"))
    prompts = prompts_for(320, [1, 5, 14, 23, 30, 37], seed=2)
    want = hf_greedy(path, prompts, 20)
    with caplog.at_level(logging.INFO, logger="lite_llm"):
        outs, stats = engine_outputs(EngineArgs(path, dtype="float32", block_size=16, max_num_batched_tokens=16,
                                                num_kv_blocks=6, max_model_len=64, max_num_seqs=4, progress=False,
                                                enable_prefix_caching=True),
                                     prompts, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    assert [list(o.outputs[0].token_ids) for o in outs] == want
    assert stats.num_preempted_total > 0
    assert "prefix caching is off" in caplog.text and "recurrent state" in caplog.text


def test_llm_generate_matches_transformers_for_a_batch():
    from lite_llm import LLM, SamplingParams
    path = tiny_checkpoint_path(*CASES[1][:1], **CASES[1][1])
    prompts = prompts_for(320, [2, 9, 31], seed=4)
    want = hf_greedy(path, prompts, 12)
    with LLM(str(path), dtype="float32", block_size=16, max_num_batched_tokens=32, kv_cache_space=0.01) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == want


def test_the_state_cache_is_fixed_per_slot_and_counted_in_the_plan():
    """One [L - 1, E] float32 row per batch slot and conv layer, whatever the context length;
    the KV blocks hold only the attention layers; the capacity plan carries both."""
    from lite_llm.engine.assemble import plan_kv_cache
    from lite_llm.engine.runner import kv_bytes_per_block
    path = tiny_checkpoint_path("lfm2")
    runner, loaded = make_runner(path, max_tokens=64)
    cfg = loaded.config
    per_seq = 3 * (3 - 1) * 64 * 4            # 3 conv layers x 2 rows x 64 channels x float32
    assert cfg.state_bytes_per_seq == per_seq
    assert runner.state_bytes == 64 * per_seq and [s.shape for s in runner.conv_states] == [(64, 2, 64)] * 3
    assert runner.kv_bytes_per_token == 1 * 2 * 2 * 16 * 4   # one attention layer: K and V of 2 heads of 16
    assert kv_bytes_per_block(cfg, 16, "float32") == 16 * runner.kv_bytes_per_token
    for length in (64, 128):                   # the state does not grow with the context
        plan = plan_kv_cache(cfg, "float32", 16, length, kv_cache_space=1 / 1024, max_num_seqs=8)
        assert plan.state_bytes == 8 * per_seq and "recurrent state: 8 slots" in plan.describe()
        # beside the blocks (resident only as slots are used): the space is the blocks'
        assert plan.num_blocks == 2**20 // plan.bytes_per_block
    from lite_llm import info
    m = info.model_weight_bytes(str(path))     # `info --model`
    assert m["kv_bytes_per_token_bf16"] == 1 * 2 * 2 * 16 * 2 and m["state_bytes_per_seq"] == per_seq


@pytest.mark.parametrize("arch", ["lfm2", "bamba"])
@pytest.mark.parametrize("kind", ["speculative", "lora", "tensor_parallel"])
def test_what_the_state_cache_cannot_serve_is_refused(kind, arch):
    from lite_llm.config import SpeculativeConfig
    from lite_llm.llm import EngineArgs, build_engine
    path = str(tiny_checkpoint_path(arch))
    extra = {"speculative": {"speculative_config": SpeculativeConfig("ngram", 2)},
             "lora": {"enable_lora": True}, "tensor_parallel": {"tensor_parallel_size": 2}}[kind]
    with pytest.raises(ValueError, match="recurrent layers"):
        build_engine(EngineArgs(path, dtype="float32", num_kv_blocks=8, progress=False, **extra))


def test_a_step_that_splits_a_sequence_is_refused():
    """The conv block runs each sequence's tokens of a step in one pass: a step whose tokens of
    one sequence are not contiguous and consecutive is an error, not silently wrong."""
    runner, loaded = make_runner(tiny_checkpoint_path("lfm2"))
    table = np.arange(8, dtype=np.int32).reshape(2, 4)
    toks = np.array([5, 6, 7], np.int32)
    rows = np.array([2], np.int32)
    for pos, seq in (([0, 1, 2], [0, 1, 0]), ([0, 2, 3], [0, 0, 0])):
        pos, seq = np.array(pos, np.int32), np.array(seq, np.int32)
        slots = table[seq, pos // 16].astype(np.int64) * 16 + pos % 16
        with pytest.raises(ValueError, match="a sequence's tokens"):
            runner.forward(toks, pos, slots, seq, table, rows)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_gguf_of_the_same_weights_gives_the_same_logits(case, tmp_path):
    """llama.cpp's "lfm2" graph written from the same tensors (shortconv.*, head_count_kv 0 on
    conv layers, token_embd_norm as the final norm): the config read from it and the logits
    equal the HF checkpoint's."""
    from conftest import gguf_from_hf
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    g_runner, g = make_runner(gguf_from_hf(ckpt, tmp_path / "m.gguf", "lfm2"))
    h_runner, h = make_runner(ckpt)
    for field in ("architecture", "layer_types", "conv_L_cache", "conv_bias", "ffn_dim", "num_kv_heads", "head_dim",
                  "tie_word_embeddings", "qk_norm"):
        assert getattr(g.config, field) == getattr(h.config, field), field
    assert g.config.norm_eps == pytest.approx(h.config.norm_eps, rel=1e-6)   # a float32 in the file
    prompts = prompts_for(h.config.vocab_size, [7, 30])
    for a, b in zip(lite_logits(h_runner, prompts), lite_logits(g_runner, prompts, chunk=5)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())


@pytest.mark.peers
@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=_ids)
def test_llama_cpp_on_the_same_gguf_gives_the_same_greedy_tokens(case, tmp_path):
    """llama.cpp (llama-cpp-python) runs the same "lfm2" file: 16 greedy tokens agree. Not the
    conv_bias case: llama.cpp's lfm2 graph loads no conv biases ("wrong number of tensors"; the
    released LFM2 checkpoints have none)."""
    from conftest import gguf_from_hf
    path = gguf_from_hf(tiny_checkpoint_path(*case[:1], **case[1]), tmp_path / "m.gguf", "lfm2")
    check_llama_cpp_agrees(path)


def test_pooling_runner_refuses_recurrent_layers():
    """runner="pooling" on a hybrid model: one clear error, not a kernel's complaint about state arrays."""
    from lite_llm import LLM
    with pytest.raises(ValueError, match="generating model only"):
        LLM(str(tiny_checkpoint_path("lfm2")), runner="pooling", dtype="float32")
