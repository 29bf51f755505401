"""Granite 4.0-H (GraniteMoeHybridForCausalLM) against transformers on tiny random checkpoints
built with its own GraniteMoeHybridConfig: Bamba's Mamba2 layers and attention layers, Granite's
multipliers (embeddings, residuals, attention scale, logits), top-k-then-softmax experts beside
a shared MLP or the shared MLP alone (num_local_experts 0), attention with RoPE or without any
positions ("nope"). fp32 logits in a mixed batch of four lengths, prefilled in chunks and token
by token; greedy tokens through the engine with concurrent requests and forced preemption; bf16
and Q8_0 weights within the families' bounds."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import checkpoint_copy, tiny_checkpoint_path
from test_families import _greedy, hf_logits
from test_parity import (check_engine_greedy_under_preemption, check_gguf_matches_hf, check_llama_cpp_agrees, check_logits,
                         lite_logits, make_runner, override_ids, prompts_for)

DENSE_NOPE = {"num_local_experts": 0, "position_embedding_type": "nope", "tie_word_embeddings": True,
              "num_hidden_layers": 4, "layer_types": ["attention", "mamba", "mamba", "attention"]}
def _ids(case) -> str:
    return override_ids(case, ("layer_types",))


CASES = [("granite_hybrid", {}),                                   # experts + shared MLP, RoPE
         ("granite_hybrid", DENSE_NOPE),                           # the shared MLP alone, no positions
         # experts without positions, top-1 of 4, GQA 4:1, biases on in_proj / out_proj, no conv
         # bias, 3 conv taps, one group
         ("granite_hybrid", {"position_embedding_type": "nope", "num_experts_per_tok": 1, "num_key_value_heads": 1,
                             "mamba_proj_bias": True, "mamba_conv_bias": False, "mamba_d_conv": 3,
                             "mamba_n_groups": 1}),
         ("granite_hybrid", {"num_local_experts": 0})]             # the shared MLP alone, RoPE
PROMPT_LENS = [1, 5, 23, 70]     # 70: past one 64-token chunk of the scan


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_fp32_logits_match_transformers_in_a_mixed_batch(case):
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path)
    cfg = loaded.config
    assert cfg.num_mamba_layers == list(case[1].get("layer_types", ["mamba", "attention", "mamba"])).count("mamba")
    assert cfg.is_moe == bool(case[1].get("num_local_experts", 4)) and cfg.rope != cfg.nope
    assert cfg.nope == (case[1].get("position_embedding_type") == "nope")
    prompts = prompts_for(cfg.vocab_size, PROMPT_LENS)
    check_logits(lite_logits(runner, prompts), hf_logits(path, prompts))


@pytest.mark.parametrize("case", CASES[:2], ids=_ids)
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_and_token_by_token_decode_match_transformers(case, chunk):
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path)
    prompts = prompts_for(loaded.config.vocab_size, [3, 20, 37])
    check_logits(lite_logits(runner, prompts, chunk=chunk), hf_logits(path, prompts))


@pytest.mark.parametrize("case", CASES[:2], ids=_ids)
def test_fp32_greedy_tokens_match_transformers(case):
    _greedy(case, prompt_len=12)


@pytest.mark.parametrize("case", CASES[:2], ids=_ids)
def test_engine_greedy_tokens_match_with_concurrent_requests_and_preemption(case):
    check_engine_greedy_under_preemption(str(tiny_checkpoint_path(*case[:1], **case[1])))


@pytest.mark.parametrize("case", CASES[:2], ids=_ids)
def test_bf16_weights_stay_close_to_transformers_fp32(case):
    """bf16 weights, prefilled 7 tokens a step, against the fp32 reference: the dense families'
    bf16 bound (test_families.py), at the positions where no near-tied routing flips
    (test_moe.py's _check_routed) for the experts."""
    from test_moe import _check_routed
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path, dtype="bfloat16")
    prompts = prompts_for(loaded.config.vocab_size, PROMPT_LENS)
    got, ref = lite_logits(runner, prompts, chunk=7), hf_logits(path, prompts)
    err = np.concatenate([np.abs(g - r).max(-1) / np.abs(r).max() for g, r in zip(got, ref)])
    if loaded.config.is_moe:
        _check_routed(err, 0.03, 0.01)
    else:
        assert err.max() <= 0.03


@pytest.mark.parametrize("case", CASES[:2], ids=_ids)
def test_q8_0_at_load_matches_the_dequantized_reference(case, tmp_path):
    """Every matrix quantized at load to Q8_0 (in_proj, out_proj, attention, each expert, the
    shared MLP; the router, the conv taps and the scan's vectors stay float) against
    transformers on the same weights quantized and dequantized by the gguf package (the 3-D
    expert tensors per row as well), whole and a token at a time, within the quantized
    families' bound (test_moe.py)."""
    import gguf
    from safetensors.numpy import save_file
    from transformers import AutoModelForCausalLM
    from test_moe import _check_quantized_moe
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    out = tmp_path / "roundtrip"
    sd = checkpoint_copy(ckpt, out)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, w in sd.items():   # rows not whole 32-value blocks stay float, as the engine keeps them
        if w.ndim >= 2 and w.shape[-1] % 32 == 0 and "router" not in name and "conv1d" not in name:
            sd[name] = gguf.quants.dequantize(gguf.quants.quantize(w.astype(np.float32), q8), q8).astype(w.dtype)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    runner, _ = make_runner(ckpt, quantization="q8_0")
    mamba = case[1].get("layer_types", ["mamba"]).index("mamba")
    assert runner.formats[f"layers.{mamba}.in_proj"] == (("Q8_0",), "int8 blocks")
    _check_quantized_moe(runner, model, "q8_0")


def test_the_state_cache_and_kv_cover_their_layers():
    """Per Mamba2 layer and batch slot: the conv's 3 rows of 192 channels and the scan's 8 heads x
    16 x 16, float32; KV for the one attention layer (2 heads of 16)."""
    runner, loaded = make_runner(tiny_checkpoint_path("granite_hybrid"), max_tokens=32)
    per_seq = 2 * (3 * 192 + 8 * 16 * 16) * 4
    assert loaded.config.state_bytes_per_seq == per_seq and runner.state_bytes == 32 * per_seq
    assert runner.kv_bytes_per_token == 1 * 2 * 2 * 16 * 4


def test_unsupported_configs_are_refused_by_name(tmp_path):
    import json
    from lite_llm.model.arch import config_from_dict
    from lite_llm.model.files import ModelLoadError
    raw = json.loads((tiny_checkpoint_path("granite_hybrid") / "config.json").read_text())
    for change, words in (({"position_embedding_type": "alibi"}, "position_embedding_type"),
                          ({"layer_types": ["mamba"] * 3}, "at least one attention layer"),
                          ({"num_local_experts": 0, "shared_intermediate_size": 0}, "neither experts"),
                          ({"time_step_limit": [0.001, 100.0]}, "time_step_limit")):
        with pytest.raises(ModelLoadError, match=words):
            config_from_dict({**raw, **change})


GGUF_CASES = [CASES[0], CASES[1], ("granite_hybrid", {"position_embedding_type": "nope"})]


@pytest.mark.parametrize("case", GGUF_CASES, ids=_ids)
def test_gguf_of_the_same_weights_gives_the_same_logits(case, tmp_path):
    """llama.cpp's "granitehybrid" graph written from the same tensors (ssm_* names, A as
    -exp(A_log), the conv taps [Cd, L], ssm_norm per group, head_count_kv 0 on Mamba2 layers, q/k
    permuted, RoPE by rope.scaling.finetuned): the config read from it and the logits equal the
    HF checkpoint's."""
    from conftest import gguf_from_hf
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    check_gguf_matches_hf(
        gguf_from_hf(ckpt, tmp_path / "m.gguf", "granitehybrid"), ckpt,
        ("architecture", "layer_types", "ffn_dim", "num_kv_heads", "head_dim", "tie_word_embeddings", "rope", "nope",
         "num_experts", "num_experts_per_tok", "shared_ffn_dim", "moe_routing", "shared_gate", "mamba_n_heads",
         "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_conv_bias"),
        approx=("norm_eps", "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"))


@pytest.mark.peers
@pytest.mark.parametrize("case", GGUF_CASES, ids=_ids)
def test_llama_cpp_on_the_same_gguf_gives_the_same_greedy_tokens(case, tmp_path):
    """llama.cpp (llama-cpp-python) runs the same "granitehybrid" file: 16 greedy tokens agree."""
    from conftest import gguf_from_hf
    path = gguf_from_hf(tiny_checkpoint_path(*case[:1], **case[1]), tmp_path / "m.gguf", "granitehybrid")
    check_llama_cpp_agrees(path)
