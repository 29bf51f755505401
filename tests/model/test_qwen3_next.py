"""Qwen3-Next (Qwen3NextForCausalLM) against transformers on tiny random checkpoints built with
its own Qwen3NextConfig: Gated DeltaNet layers (in_proj_qkvz / in_proj_ba de-interleaved at load,
a causal conv with SiLU, L2-normed q and k, the gated delta rule in its chunked form, the gated
RMSNorm, out_proj) around gated attention layers (q_proj's per-head gate, (1 + w) q / k norms,
partial RoPE), every MLP a mixture of experts with a gated shared expert. fp32 logits in a mixed
batch, one shot, prefilled in chunks (both states carried from chunk to chunk) and token by
token (decode as a state update), prompts across a 64-token chunk; greedy tokens through the
engine with concurrent requests and forced preemption; the state cache's size; bf16."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import tiny_checkpoint_path
from test_families import _greedy, hf_logits
from test_parity import (check_engine_greedy_under_preemption, check_llama_cpp_agrees, check_logits, lite_logits,
                        make_runner, override_ids, prompts_for)

def _ids(case) -> str:
    return override_ids(case, ("rope_parameters",))


CASES = [("qwen3_next", {}),
         # key heads = value heads, 3 conv taps, two attention layers, RoPE over half of each
         # head, the top-k weights not renormalised
         ("qwen3_next", {"linear_num_value_heads": 2, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 3,
                         "layer_types": ["full_attention", "linear_attention", "full_attention", "linear_attention"],
                         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.5},
                         "norm_topk_prob": False})]
PROMPT_LENS = [1, 5, 23, 70, 130]     # 70, 130: past one and two 64-token chunks of the delta rule


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_fp32_logits_match_transformers_in_a_mixed_batch(case):
    path = tiny_checkpoint_path(case[0], **case[1])
    runner, loaded = make_runner(path)
    cfg = loaded.config
    assert cfg.num_deltanet_layers == (2 if case[1] else 3) and cfg.num_attention_layers == (2 if case[1] else 1)
    prompts = prompts_for(cfg.vocab_size, PROMPT_LENS)
    check_logits(lite_logits(runner, prompts), hf_logits(path, prompts))


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_and_token_by_token_decode_match_transformers(case, chunk):
    path = tiny_checkpoint_path(case[0], **case[1])
    runner, loaded = make_runner(path)
    prompts = prompts_for(loaded.config.vocab_size, [3, 20, 37, 70])
    check_logits(lite_logits(runner, prompts, chunk=chunk), hf_logits(path, prompts))


def test_fp32_greedy_tokens_match_transformers():
    _greedy(CASES[0], prompt_len=12)


def test_engine_greedy_tokens_match_with_concurrent_requests_and_preemption():
    check_engine_greedy_under_preemption(str(tiny_checkpoint_path("qwen3_next")))


def test_the_state_cache_is_fixed_per_slot():
    """Per DeltaNet layer and batch slot: the conv's 3 rows of 96 channels (q and k of 2 key
    heads x 16, v of 4 value heads x 8) and the rule's 4 heads x 16 x 8, float32; KV blocks for
    the one attention layer."""
    runner, loaded = make_runner(tiny_checkpoint_path("qwen3_next"), max_tokens=32)
    cfg = loaded.config
    per_seq = 3 * (3 * 96 + 4 * 16 * 8) * 4
    assert cfg.deltanet_conv_dim == 96 and cfg.state_bytes_per_seq == per_seq
    assert runner.state_bytes == 32 * per_seq
    assert runner.kv_bytes_per_token == 1 * 2 * 2 * 16 * 4


def test_bf16_weights_stay_close_to_transformers_fp32():
    """bf16 weights (the DeltaNet block's GEMM inputs as bf16 pairs), prefilled 7 tokens a step,
    against the fp32 reference: the MoE families' bf16 bound (test_moe.py: 0.03 of the largest
    |logit| but at the few positions where a near-tied routing flips; transformers' own bf16 run
    flips there too)."""
    from test_moe import _check_routed, _position_errors
    path = tiny_checkpoint_path("qwen3_next")
    runner, loaded = make_runner(path, dtype="bfloat16")
    prompts = prompts_for(loaded.config.vocab_size, PROMPT_LENS)
    err = _position_errors(lite_logits(runner, prompts, chunk=7), hf_logits(path, prompts), lambda r: np.abs(r).max())
    print(f"bf16: |logit diff| / max |logit|: median {np.median(err):.4f}, 95th percentile "
          f"{np.percentile(err, 95):.4f}, max {err.max():.3f}")
    _check_routed(err, 0.03, 0.01)


def test_q8_0_at_load_matches_the_dequantized_reference(tmp_path):
    """Every matrix but the routers and shared gates quantized at load to Q8_0 (the reordered
    in_proj and qkv, out_proj and the experts on the int8-block kernels; the conv taps and the
    delta rule's vectors stay float) against transformers on the same weights quantized and
    dequantized by the gguf package, whole and a token at a time, within the quantized
    families' bound (test_moe.py)."""
    import gguf
    from test_moe import _check_quantized_moe, _roundtrip_reference
    ckpt = tiny_checkpoint_path("qwen3_next")

    def qtype_of(name: str):
        return None if name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")) else gguf.GGMLQuantizationType.Q8_0
    model = _roundtrip_reference(ckpt, tmp_path / "roundtrip", qtype_of)
    runner, _ = make_runner(ckpt, quantization="q8_0")
    for name in ("layers.0.in_proj", "layers.0.out_proj", "layers.1.qkv", "layers.1.o"):
        assert runner.formats[name] == (("Q8_0",), "int8 blocks"), name
    _check_quantized_moe(runner, model, "q8_0")


def test_info_counts_the_state_and_the_attention_layers_kv():
    from lite_llm import info
    m = info.model_weight_bytes(str(tiny_checkpoint_path("qwen3_next")))
    assert m["kv_bytes_per_token_bf16"] == 1 * 2 * 2 * 16 * 2
    assert m["state_bytes_per_seq"] == 3 * (3 * 96 + 4 * 16 * 8) * 4 and "Gated DeltaNet" in m["state_note"]


@pytest.mark.parametrize("kind", ["speculative", "lora", "tensor_parallel", "deterministic"])
def test_what_the_state_cache_cannot_serve_is_refused(kind):
    """As LFM2's and Bamba's (test_lfm2.py); deterministic mode too: the delta rule sums by
    chunks counted from each step's first token, so a prompt cut elsewhere sums otherwise."""
    from lite_llm.config import SpeculativeConfig
    from lite_llm.llm import EngineArgs, build_engine
    path = str(tiny_checkpoint_path("qwen3_next"))
    extra = {"speculative": {"speculative_config": SpeculativeConfig("ngram", 2)},
             "lora": {"enable_lora": True}, "tensor_parallel": {"tensor_parallel_size": 2},
             "deterministic": {"deterministic": True}}[kind]
    match = "Gated DeltaNet layers" if kind == "deterministic" else "recurrent layers: .*Gated DeltaNet"
    with pytest.raises(ValueError, match=match):
        build_engine(EngineArgs(path, dtype="float32", num_kv_blocks=8, progress=False, **extra))


def test_multi_token_prediction_weights_are_not_read(tmp_path):
    """A released checkpoint carries its multi-token-prediction head (mtp.*) beside the model,
    which transformers does not load either: the same logits with and without it."""
    from safetensors.numpy import save_file
    from conftest import checkpoint_copy
    ckpt = tiny_checkpoint_path("qwen3_next")
    sd = checkpoint_copy(ckpt, tmp_path / "mtp")
    E = sd["model.norm.weight"].shape[0]
    rng = np.random.default_rng(0)
    sd.update({"mtp.fc.weight": rng.standard_normal((E, 2 * E)).astype(np.float32),
               "mtp.norm.weight": np.ones(E, np.float32)})
    save_file(sd, str(tmp_path / "mtp" / "model.safetensors"), metadata={"format": "pt"})
    prompts = prompts_for(320, [5, 23])
    want = lite_logits(make_runner(ckpt)[0], prompts)
    for g, w in zip(lite_logits(make_runner(tmp_path / "mtp")[0], prompts), want):
        np.testing.assert_array_equal(g, w)


# llama.cpp keeps the layer kinds as full_attention_interval: configs whose attention layers fall
# every interval-th layer. Every other layer; and the released models' shape (every fourth, key
# and value heads of one width, which llama.cpp's graph assumes), RoPE over half of each head,
# the top-k weights not renormalised
INTERVAL_2 = {"layer_types": ["linear_attention", "full_attention"] * 2, "full_attention_interval": 2}
RELEASED = {"layer_types": ["linear_attention"] * 3 + ["full_attention"], "full_attention_interval": 4,
            "linear_value_head_dim": 16}
GGUF_CASES = [("qwen3_next", INTERVAL_2),
              ("qwen3_next", {**RELEASED, "norm_topk_prob": False,
                              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                  "partial_rotary_factor": 0.5}})]


def _gguf_ids(case) -> str:
    return override_ids(case, ("layer_types", "rope_parameters"))


@pytest.mark.parametrize("case", GGUF_CASES, ids=_gguf_ids)
@pytest.mark.parametrize("split_qkvz", [True, False], ids=["attn_qkv", "ssm_in"])
def test_gguf_of_the_same_weights_gives_the_same_logits(case, split_qkvz, tmp_path):
    """Qwen3-Next as llama.cpp's converter writes it ("qwen3next": the layer kinds as
    full_attention_interval, norms with their + 1, in_proj_qkvz cut into attn_qkv and attn_gate, or
    whole as ssm_in as earlier converters wrote it, ssm_ba, ssm_a = -exp(A_log), the experts
    stacked): the config read from it equals the HF checkpoint's, and its fp32 logits
    transformers' within 1e-4, prefilled 5 tokens a step across a 64-token chunk."""
    from conftest import gguf_from_hf
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    g_runner, g = make_runner(gguf_from_hf(ckpt, tmp_path / "m.gguf", "qwen3next", split_qkvz=split_qkvz))
    h = make_runner(ckpt)[1]
    for field in ("architecture", "layer_types", "num_kv_heads", "head_dim", "partial_rotary_factor", "qk_norm",
                  "attn_output_gate", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim", "ffn_dim", "num_experts", "num_experts_per_tok",
                  "norm_topk_prob", "shared_ffn_dim", "shared_gate", "moe_routing", "tie_word_embeddings"):
        assert getattr(g.config, field) == getattr(h.config, field), field
    assert g.config.rope_theta == h.config.rope_theta and g.config.norm_eps == pytest.approx(h.config.norm_eps, rel=1e-6)
    prompts = prompts_for(h.config.vocab_size, [7, 70])
    check_logits(lite_logits(g_runner, prompts, chunk=5), hf_logits(ckpt, prompts))


def test_a_q8_0_gguf_runs_as_stored(tmp_path):
    """A Qwen3-Next file whose matrices are Q8_0 (attn_qkv, attn_gate, ssm_ba, ssm_out, the
    attention's, the stacked experts, the shared expert, embeddings and head; the routers, shared
    gates, conv taps, norms and the shared expert's down projection, of rows of 48, float) runs its
    blocks as stored, against transformers on the same
    weights quantized and dequantized by the gguf package, whole and a token at a time, within
    the quantized families' bound (test_moe.py)."""
    import gguf
    from conftest import gguf_from_hf
    from test_moe import _check_quantized_moe, _roundtrip_reference
    ckpt = tiny_checkpoint_path("qwen3_next", **INTERVAL_2)

    def qtype_of(name: str):
        return None if name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")) else gguf.GGMLQuantizationType.Q8_0
    model = _roundtrip_reference(ckpt, tmp_path / "roundtrip", qtype_of)
    runner, _ = make_runner(gguf_from_hf(ckpt, tmp_path / "q8.gguf", "qwen3next", block_type="Q8_0"))
    for name in ("layers.0.in_proj", "layers.0.out_proj", "layers.1.qkv", "layers.1.o", "layers.0.experts.gate_up",
                 "layers.1.experts.down", "layers.0.shared.gate_up"):
        parts, kernel = runner.formats[name]
        assert set(parts) == {"Q8_0"} and kernel == "int8 blocks", (name, runner.formats[name])
    _check_quantized_moe(runner, model, "q8_0 gguf")


def test_a_gguf_the_state_cache_cannot_hold_is_refused(tmp_path):
    """What the file cannot describe is refused by name: value heads that do not share the key
    heads evenly."""
    from conftest import gguf_from_hf
    from lite_llm.model.files import ModelLoadError
    from lite_llm.model.gguf import GGUFFile
    from lite_llm.model.arch import qwen3_next
    f = GGUFFile(str(gguf_from_hf(tiny_checkpoint_path("qwen3_next", **INTERVAL_2), tmp_path / "m.gguf", "qwen3next")))
    f.metadata["qwen3next.ssm.time_step_rank"] = 3
    with pytest.raises(ModelLoadError, match="3 value heads"):
        qwen3_next.gguf_config(f, "qwen3next")


@pytest.mark.peers
@pytest.mark.parametrize("split_qkvz", [True, False], ids=["attn_qkv", "ssm_in"])
def test_llama_cpp_on_the_same_gguf_gives_the_same_greedy_tokens(split_qkvz, tmp_path):
    """llama.cpp (llama-cpp-python) runs the same "qwen3next" file (the released models' shape:
    its graph takes the value heads' width for the key heads'): 16 greedy tokens agree."""
    from conftest import gguf_from_hf
    path = gguf_from_hf(tiny_checkpoint_path("qwen3_next", **RELEASED), tmp_path / "m.gguf", "qwen3next",
                        split_qkvz=split_qkvz)
    check_llama_cpp_agrees(path)


@pytest.mark.peers
def test_a_file_quantized_by_llama_cpp_runs_as_stored_and_gives_its_greedy_tokens(tmp_path):
    """The same file quantized by llama.cpp's own quantizer to Q8_0 (attn_qkv, attn_gate, ssm_ba,
    ssm_out, the experts; the shared expert's down projection F16, routers and vectors F32): its
    Q8_0 matrices run as stored, and llama.cpp gives the same 16 greedy tokens on it."""
    from conftest import gguf_from_hf
    from test_parity import llama_cpp_greedy, runner_greedy
    from test_quantized import quantize_with_llama_cpp
    f32 = gguf_from_hf(tiny_checkpoint_path("qwen3_next", **RELEASED), tmp_path / "f32.gguf", "qwen3next")
    path = quantize_with_llama_cpp(f32, tmp_path / "q8.gguf", "Q8_0")
    runner, loaded = make_runner(path)
    for name in ("layers.0.in_proj", "layers.0.out_proj", "layers.3.qkv", "layers.0.experts.gate_up"):
        parts, kernel = runner.formats[name]
        assert set(parts) == {"Q8_0"} and kernel == "int8 blocks", (name, runner.formats[name])
    prompt = prompts_for(loaded.config.vocab_size, [12])[0]
    assert runner_greedy(runner, prompt, 16) == llama_cpp_greedy(path, prompt, 16)
