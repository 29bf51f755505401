"""Falcon-H1 (FalconH1ForCausalLM) against transformers on tiny random checkpoints built with its
own FalconH1Config: a Mamba2 mixer (mamba_d_ssm apart from hidden_size) and attention side by
side on each layer's normed input, every µP multiplier away from 1 (embeddings, logits, attention
in / out, keys, the five in_proj segments, SSM in / out, gate and down), the gated norm before the
gate, after it, or none; projection biases. fp32 logits in a mixed batch of four lengths,
prefilled in chunks and token by token; greedy tokens through the engine with concurrent requests
and forced preemption; bf16 within the families' bound; llama.cpp's "falcon-h1" GGUF of the same
weights (multipliers folded as its converter does) gives the same logits, and llama.cpp the same
greedy tokens."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import tiny_checkpoint_path
from test_families import _greedy, hf_logits
from test_parity import (check_engine_greedy_under_preemption, check_gguf_matches_hf, check_llama_cpp_agrees, check_logits,
                         lite_logits, make_runner, override_ids, prompts_for)

CASES = [("falcon_h1", {}),                                        # gated norm before the gate, 3 layers of 6 heads
         # no gated norm (y * silu(z)), tied embeddings, MQA, biases on every projection (attention,
         # MLP, in_proj, out_proj), no conv bias, 3 taps, one group, the width 2 x hidden
         ("falcon_h1", {"mamba_rms_norm": False, "tie_word_embeddings": True, "num_key_value_heads": 1,
                        "attention_bias": True, "mlp_bias": True, "mamba_proj_bias": True, "projectors_bias": True,
                        "mamba_conv_bias": False, "mamba_d_conv": 3, "mamba_n_groups": 1, "mamba_d_ssm": None,
                        "mamba_n_heads": 8}),
         # the norm after the gate (llama.cpp's), head_dim apart from hidden / heads, 3 layers
         ("falcon_h1", {"mamba_norm_before_gate": False, "head_dim": 32, "num_hidden_layers": 3})]
PROMPT_LENS = [1, 5, 23, 70]     # 70: past one 64-token chunk of the scan


@pytest.mark.parametrize("case", CASES, ids=override_ids)
def test_fp32_logits_match_transformers_in_a_mixed_batch(case):
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path)
    cfg = loaded.config
    n = case[1].get("num_hidden_layers", 2)
    # each layer: its Mamba2 mixer alone, then attention on the same rows with the MLP
    assert cfg.num_layers == 2 * n and cfg.layer_types == ("mamba", "full_attention") * n
    assert cfg.no_mlp_layers == tuple(range(0, 2 * n, 2)) and cfg.shared_input_layers == tuple(range(1, 2 * n, 2))
    assert cfg.mamba_norm == ("none" if case[1].get("mamba_rms_norm") is False else
                              "after_gate" if case[1].get("mamba_norm_before_gate") is False else "before_gate")
    prompts = prompts_for(cfg.vocab_size, PROMPT_LENS)
    check_logits(lite_logits(runner, prompts), hf_logits(path, prompts))


@pytest.mark.parametrize("case", CASES[:2], ids=override_ids)
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_and_token_by_token_decode_match_transformers(case, chunk):
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path)
    prompts = prompts_for(loaded.config.vocab_size, [3, 20, 37])
    check_logits(lite_logits(runner, prompts, chunk=chunk), hf_logits(path, prompts))


@pytest.mark.parametrize("case", CASES[:2], ids=override_ids)
def test_fp32_greedy_tokens_match_transformers(case):
    _greedy(case, prompt_len=12)


@pytest.mark.parametrize("case", CASES[:2], ids=override_ids)
def test_engine_greedy_tokens_match_with_concurrent_requests_and_preemption(case):
    check_engine_greedy_under_preemption(str(tiny_checkpoint_path(*case[:1], **case[1])))


def test_bf16_weights_stay_close_to_transformers_fp32():
    """bf16 weights (the multipliers folded in before the rounding), prefilled 7 tokens a step,
    against the fp32 reference: the dense families' bf16 bound (test_families.py)."""
    path = tiny_checkpoint_path("falcon_h1")
    runner, loaded = make_runner(path, dtype="bfloat16")
    prompts = prompts_for(loaded.config.vocab_size, PROMPT_LENS)
    got, ref = lite_logits(runner, prompts, chunk=7), hf_logits(path, prompts)
    err = max(float(np.abs(g - r).max() / np.abs(r).max()) for g, r in zip(got, ref))
    assert err <= 0.03


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=override_ids)
def test_q8_0_at_load_matches_the_dequantized_reference(case, tmp_path):
    """Every matrix quantized at load to Q8_0 after its multipliers are folded in (in_proj by
    its five segments' rows) against transformers on weights W' = dequant(quant(W s)) / s, which
    it scales by s again: the same products, whole and a token at a time, within the quantized
    families' bound (test_moe.py)."""
    import json
    import gguf
    import torch
    from safetensors.numpy import save_file
    from transformers import AutoModelForCausalLM
    from conftest import checkpoint_copy
    from test_moe import _check_quantized_moe
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    cfg = json.loads((ckpt / "config.json").read_text())
    Di, GN, H = cfg["mamba_d_ssm"], cfg["mamba_n_groups"] * cfg["mamba_d_state"], cfg["mamba_n_heads"]
    mup = np.repeat(np.float32(cfg["ssm_multipliers"]), (Di, Di, GN, GN, H))[:, None] * cfg["ssm_in_multiplier"]
    a_in = cfg["attention_in_multiplier"]
    scales = {"mamba.in_proj": mup, "mamba.out_proj": cfg["ssm_out_multiplier"], "q_proj": a_in,
              "k_proj": a_in * cfg["key_multiplier"], "v_proj": a_in, "o_proj": cfg["attention_out_multiplier"],
              "gate_proj": cfg["mlp_multipliers"][0], "down_proj": cfg["mlp_multipliers"][1]}
    out = tmp_path / "roundtrip"
    sd = checkpoint_copy(ckpt, out)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, w in sd.items():   # rows not whole 32-value blocks stay float, as the engine keeps them
        if w.ndim == 2 and w.shape[-1] % 32 == 0:
            s = next((v for k, v in scales.items() if name.endswith(k + ".weight")), 1.0)
            scaled = (w.astype(np.float32) * s).astype(np.float32)
            sd[name] = (gguf.quants.dequantize(gguf.quants.quantize(scaled, q8), q8) / s).astype(w.dtype)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    runner, _ = make_runner(ckpt, quantization="q8_0")
    assert runner.formats["layers.0.in_proj"] == (("Q8_0",), "int8 blocks")
    _check_quantized_moe(runner, model, "q8_0")


def test_a_bf16_checkpoint_reads_its_biases_and_scales_as_bf16(tmp_path):
    """Released checkpoints store bf16: every tensor (the biases the multipliers scale too) read
    from its bf16 bits, run in fp32 against transformers on the same bf16 file widened to fp32."""
    import torch
    from transformers import AutoModelForCausalLM
    # multipliers of 1 on the k and gate biases: those are left unscaled, still read from bf16 bits
    src = tiny_checkpoint_path("falcon_h1", **{**CASES[1][1], "key_multiplier": 1.0, "mlp_multipliers": [1.0, 1.3]})
    out = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).exists():
            (out / f).write_bytes((src / f).read_bytes())
    runner, loaded = make_runner(out)
    prompts = prompts_for(loaded.config.vocab_size, [5, 23])
    check_logits(lite_logits(runner, prompts), hf_logits(out, prompts))


def test_the_state_cache_and_kv_cover_their_layers():
    """Per layer and batch slot: the conv's 3 rows of 96 + 2 x 2 x 16 = 160 channels and the scan's
    6 heads x 16 x 16, float32; KV for every layer's attention (2 heads of 16)."""
    runner, loaded = make_runner(tiny_checkpoint_path("falcon_h1"), max_tokens=32)
    per_seq = 2 * (3 * 160 + 6 * 16 * 16) * 4
    assert loaded.config.state_bytes_per_seq == per_seq and runner.state_bytes == 32 * per_seq
    assert loaded.config.num_attention_layers == 2 and runner.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=override_ids)
def test_the_engine_description_counts_the_models_layers(case):
    """LLM.info (EngineInfo: /version, the dashboard, the benchmarks) gives the model's
    num_hidden_layers, as the KV and state lines do, not the two layers (Mamba2, attention)
    each is run as, and its attention layers (every one of them here), which the benchmarks'
    multiply-add counts take for the attention work."""
    from lite_llm import LLM
    from lite_llm.bench.common import request_macs
    n = case[1].get("num_hidden_layers", 2)
    with LLM(str(tiny_checkpoint_path(*case[:1], **case[1])), dtype="float32", block_size=16,
             kv_cache_space=0.01, max_num_seqs=2) as llm:
        info = llm.info
    assert info["num_layers"] == n and info["num_attention_layers"] == n
    attention = n * info["q_size"] * 9 * 10
    assert request_macs(info, 9, 1) == 9 * info["layer_macs_per_token"] + attention + info["head_macs_per_row"]


def test_the_benchmarks_count_attention_work_in_the_attention_layers_only():
    """A hybrid's recurrent layers do no attention: Granite 4.0-H's shape (a Mamba2, an attention
    and a Mamba2 layer) counts one layer's causal attention in a request's multiply-adds."""
    from lite_llm import LLM
    from lite_llm.bench.common import request_macs
    with LLM(str(tiny_checkpoint_path("granite_hybrid")), dtype="float32", block_size=16, kv_cache_space=0.01,
             max_num_seqs=2) as llm:
        info = llm.info
    assert info["num_layers"] == 3 and info["num_attention_layers"] == 1
    assert request_macs(info, 9, 1) == 9 * info["layer_macs_per_token"] + info["q_size"] * 9 * 10 \
        + info["head_macs_per_row"]


def test_unsupported_configs_are_refused_by_name():
    import json
    from lite_llm.model.arch import config_from_dict
    from lite_llm.model.files import ModelLoadError
    raw = json.loads((tiny_checkpoint_path("falcon_h1") / "config.json").read_text())
    for change, words in (({"hidden_act": "gelu"}, "hidden_act"),
                          ({"mamba_d_head": 10}, "mamba_n_heads 6 x mamba_d_head 10"),
                          ({"time_step_limit": [0.001, 100.0]}, "time_step_limit"),
                          ({"lm_head_multiplier": 0.0}, "lm_head_multiplier")):
        with pytest.raises(ModelLoadError, match=words):
            config_from_dict({**raw, **change})


@pytest.mark.parametrize("kind", ["speculative", "lora", "tensor_parallel"])
def test_what_the_state_cache_cannot_serve_is_refused(kind):
    """As the other Mamba2 families: the state per sequence is neither sharded, adapted nor rolled back."""
    from lite_llm.config import SpeculativeConfig
    from lite_llm.llm import EngineArgs, build_engine
    extra = {"speculative": {"speculative_config": SpeculativeConfig("ngram", 2)},
             "lora": {"enable_lora": True}, "tensor_parallel": {"tensor_parallel_size": 2}}[kind]
    with pytest.raises(ValueError, match="FalconH1ForCausalLM .recurrent layers: .*Mamba2"):
        build_engine(EngineArgs(str(tiny_checkpoint_path("falcon_h1")), dtype="float32", num_kv_blocks=8,
                                progress=False, **extra))


# llama.cpp's falcon-h1 has no in_proj / out_proj biases and one norm kind (after the gate, or none);
# its graph loads attn_output.bias but never adds it (transformers does): attention biases are
# read from the file here and checked against transformers' weights, not against llama.cpp
GGUF_CASES = [CASES[2], ("falcon_h1", {"mamba_rms_norm": False, "tie_word_embeddings": True, "mlp_bias": True,
                                       "num_key_value_heads": 1})]
ATTENTION_BIAS = ("falcon_h1", {"attention_bias": True, "mamba_rms_norm": False})


@pytest.mark.parametrize("case", GGUF_CASES + [ATTENTION_BIAS], ids=override_ids)
def test_gguf_of_the_same_weights_gives_the_same_logits(case, tmp_path):
    """llama.cpp's "falcon-h1" file written from the same tensors as its converter writes them
    (every multiplier folded into the weights, ssm_* names, q/k as stored, an output matrix even
    for a tied head): the config read from it and the logits equal the HF checkpoint's."""
    from conftest import gguf_from_hf
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    _, _, config = check_gguf_matches_hf(
        gguf_from_hf(ckpt, tmp_path / "m.gguf", "falcon-h1"), ckpt,
        ("architecture", "num_layers", "layer_types", "no_mlp_layers", "shared_input_layers", "ffn_dim", "num_kv_heads",
         "head_dim", "qkv_bias", "o_bias", "mlp_bias", "mamba_n_heads", "mamba_d_head", "mamba_n_groups",
         "mamba_d_state", "mamba_d_conv", "mamba_conv_bias", "mamba_norm"))
    assert config.embedding_multiplier == config.logits_scaling == 1.0   # in the weights


@pytest.mark.peers
@pytest.mark.parametrize("case", GGUF_CASES, ids=override_ids)
def test_llama_cpp_on_the_same_gguf_gives_the_same_greedy_tokens(case, tmp_path):
    """llama.cpp (llama-cpp-python) runs the same "falcon-h1" file: 16 greedy tokens agree."""
    from conftest import gguf_from_hf
    path = gguf_from_hf(tiny_checkpoint_path(*case[:1], **case[1]), tmp_path / "m.gguf", "falcon-h1")
    check_llama_cpp_agrees(path)


@pytest.mark.parametrize("change", [{"residual_multiplier": 0.5}, {"no_mlp_layers": ()},
                                    {"layer_types": ("full_attention", "full_attention") * 2}])
def test_a_layer_reads_shared_rows_only_after_a_mamba2_layer_that_leaves_them(change):
    """The kernel's attention reuses the rows the Mamba2 layer before it normed: refused unless that
    layer is a Mamba2 mixer alone adding its output into x unscaled (a residual scale would route
    it through those rows)."""
    import dataclasses
    from lite_llm.model.arch import config_from_dict, kernel_config
    import json
    raw = json.loads((tiny_checkpoint_path("falcon_h1") / "config.json").read_text())
    cfg = dataclasses.replace(config_from_dict(raw), **change)
    with pytest.raises(ValueError, match="reads its input from layer 0"):
        kernel_config(cfg, dtype="float32", block_size=16, max_positions=64, kv_cache_dtype="float32")
