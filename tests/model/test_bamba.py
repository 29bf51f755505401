"""Bamba (BambaForCausalLM) against transformers on tiny random checkpoints built with its own
BambaConfig: Mamba2 layers (in_proj, a causal conv with SiLU, the selective state-space scan in
its chunked form, the gated group RMSNorm, out_proj) around attention layers. fp32 logits in a
mixed batch, prefilled in chunks (both states carried from chunk to chunk) and token by token
(decode as a state update); greedy tokens through the engine with concurrent requests and
forced preemption; the state cache's size; the GGUF file llama.cpp's converter writes for it
("granitehybrid"), in F32 and Q8_0."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import tiny_checkpoint_path
from test_families import _greedy, hf_logits
from test_parity import (check_engine_greedy_under_preemption, check_gguf_matches_hf, check_logits, lite_logits,
                        make_runner, override_ids, prompts_for)

CASES = [("bamba", {}),
         # one group, biases on in_proj / out_proj, no conv bias, two attention layers
         ("bamba", {"mamba_n_groups": 1, "mamba_proj_bias": True, "mamba_conv_bias": False, "mamba_d_conv": 3,
                    "num_hidden_layers": 4, "attn_layer_indices": [0, 2]})]
PROMPT_LENS = [1, 5, 23, 70]     # 70: past one 64-token chunk of the scan


@pytest.mark.parametrize("case", CASES, ids=override_ids)
def test_fp32_logits_match_transformers_in_a_mixed_batch(case):
    path = tiny_checkpoint_path(case[0], **case[1])
    runner, loaded = make_runner(path)
    cfg = loaded.config
    assert cfg.num_mamba_layers == cfg.num_layers - len(case[1].get("attn_layer_indices", [1]))
    prompts = prompts_for(cfg.vocab_size, PROMPT_LENS)
    check_logits(lite_logits(runner, prompts), hf_logits(path, prompts))


@pytest.mark.parametrize("case", CASES, ids=override_ids)
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_and_token_by_token_decode_match_transformers(case, chunk):
    path = tiny_checkpoint_path(case[0], **case[1])
    runner, loaded = make_runner(path)
    prompts = prompts_for(loaded.config.vocab_size, [3, 20, 37])
    check_logits(lite_logits(runner, prompts, chunk=chunk), hf_logits(path, prompts))


def test_fp32_greedy_tokens_match_transformers():
    _greedy(CASES[0], prompt_len=12)


def test_engine_greedy_tokens_match_with_concurrent_requests_and_preemption():
    check_engine_greedy_under_preemption(str(tiny_checkpoint_path("bamba")))


def test_the_state_cache_is_fixed_per_slot():
    """Per Mamba2 layer and batch slot: the conv's 3 rows of 192 channels (x 128, then B and C
    of 2 groups x 16) and the scan's 8 heads x 16 x 16, float32; KV blocks for the one
    attention layer."""
    runner, loaded = make_runner(tiny_checkpoint_path("bamba"), max_tokens=32)
    cfg = loaded.config
    per_seq = 2 * (3 * 192 + 8 * 16 * 16) * 4
    assert cfg.mamba_conv_dim == 192 and cfg.state_bytes_per_seq == per_seq
    assert runner.state_bytes == 32 * per_seq
    assert runner.kv_bytes_per_token == 1 * 2 * 2 * 16 * 4


def test_bf16_weights_stay_close_to_transformers_fp32():
    """bf16 weights (the Mamba2 block's GEMM inputs as bf16 pairs), prefilled 7 tokens a step,
    against the fp32 reference: the dense families' bf16 bound (test_families.py)."""
    path = tiny_checkpoint_path("bamba")
    runner, loaded = make_runner(path, dtype="bfloat16")
    prompts = prompts_for(loaded.config.vocab_size, PROMPT_LENS)
    for g, r in zip(lite_logits(runner, prompts, chunk=7), hf_logits(path, prompts)):
        assert np.abs(g - r).max() <= 0.03 * np.abs(r).max()


def test_q8_0_at_load_matches_the_dequantized_reference(tmp_path):
    """Every matrix quantized at load to Q8_0 (in_proj and out_proj on the int8-block kernels,
    their inputs as int8 blocks; the conv taps and the scan's vectors stay float) against
    transformers on the same weights quantized and dequantized by the gguf package, whole and a
    token at a time, within the quantized families' bound (test_moe.py)."""
    import gguf
    from test_moe import _check_quantized_moe, _roundtrip_reference
    ckpt = tiny_checkpoint_path("bamba")
    model = _roundtrip_reference(ckpt, tmp_path / "roundtrip", lambda name: gguf.GGMLQuantizationType.Q8_0)
    runner, _ = make_runner(ckpt, quantization="q8_0")
    assert runner.formats["layers.0.in_proj"] == (("Q8_0",), "int8 blocks")
    assert runner.formats["layers.0.out_proj"] == (("Q8_0",), "int8 blocks")
    _check_quantized_moe(runner, model, "q8_0")


def test_info_counts_the_state_and_the_attention_layers_kv():
    from lite_llm import info
    m = info.model_weight_bytes(str(tiny_checkpoint_path("bamba")))
    assert m["kv_bytes_per_token_bf16"] == 1 * 2 * 2 * 16 * 2
    assert m["state_bytes_per_seq"] == 2 * (3 * 192 + 8 * 16 * 16) * 4 and "Mamba2" in m["state_note"]


GGUF_CASES = [CASES[0],
              # the released checkpoints' config: attn_rotary_emb (half a head) as rope.dimension_count
              ("bamba", {"attn_rotary_emb": 8}),
              CASES[1]]


@pytest.mark.parametrize("case", GGUF_CASES, ids=override_ids)
def test_gguf_of_the_same_weights_gives_the_same_logits(case, tmp_path):
    """Bamba as llama.cpp's converter writes it ("granitehybrid": q/k rows permuted over whole heads,
    RoPE on by rope.scaling.finetuned, rope.dimension_count the whole head or attn_rotary_emb, the
    Mamba2 tensors as Granite 4.0-H's, the dense SwiGLU, no multipliers): read as Bamba, the
    permutation undone a whole head at a time, RoPE over the first half of each head as
    transformers does, so the config and the logits equal the HF checkpoint's."""
    from conftest import gguf_from_hf
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    check_gguf_matches_hf(
        gguf_from_hf(ckpt, tmp_path / "m.gguf", "granitehybrid"), ckpt,
        ("architecture", "layer_types", "ffn_dim", "num_kv_heads", "head_dim", "partial_rotary_factor", "rope", "nope",
         "num_experts", "embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling",
         "tie_word_embeddings", "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv",
         "mamba_conv_bias", "mamba_proj_bias"), approx=("norm_eps",))


def test_a_q8_0_gguf_runs_as_stored(tmp_path):
    """A Bamba file whose matrices are Q8_0 (ssm_in, ssm_out, q/k/v/o, the SwiGLU, embeddings and
    head; the conv taps, the scan's vectors and the norms float) runs its blocks as stored, the q/k
    blocks un-permuted a whole head at a time, against transformers on the same weights quantized
    and dequantized by the gguf package, whole and a token at a time, within the quantized
    families' bound (test_moe.py)."""
    import gguf
    from conftest import gguf_from_hf
    from test_moe import _check_quantized_moe, _roundtrip_reference
    ckpt = tiny_checkpoint_path("bamba")
    model = _roundtrip_reference(ckpt, tmp_path / "roundtrip", lambda name: gguf.GGMLQuantizationType.Q8_0)
    runner, loaded = make_runner(gguf_from_hf(ckpt, tmp_path / "q8.gguf", "granitehybrid", block_type="Q8_0"))
    assert loaded.config.architecture == "BambaForCausalLM"
    for name in ("layers.0.in_proj", "layers.0.out_proj", "layers.1.qkv", "layers.1.o", "layers.2.gate_up"):
        parts, kernel = runner.formats[name]
        assert set(parts) == {"Q8_0"} and kernel == "int8 blocks", (name, runner.formats[name])
    _check_quantized_moe(runner, model, "q8_0 gguf")


def test_a_rotation_of_neither_half_nor_whole_heads_is_refused(tmp_path):
    """A Bamba file whose rope.dimension_count is neither half of a head (the released models')
    nor the whole head (as the converter writes it without attn_rotary_emb) is refused by name."""
    from conftest import gguf_from_hf
    from lite_llm.model.arch import granite_hybrid
    from lite_llm.model.files import ModelLoadError
    from lite_llm.model.gguf import GGUFFile
    f = GGUFFile(str(gguf_from_hf(tiny_checkpoint_path("bamba"), tmp_path / "m.gguf", "granitehybrid")))
    f.metadata["granitehybrid.rope.dimension_count"] = 4
    with pytest.raises(ModelLoadError, match="rope.dimension_count 4 of heads of 16 is not supported"):
        granite_hybrid.gguf_config(f, "granitehybrid")


def _transformers_with_llama_cpp_rotation(ckpt, rotated: int):
    """transformers' Bamba rotating what llama.cpp rotates on its file: llama.cpp pairs component j
    of the (whole-head) permuted rows with j + 1, that is component j of transformers' rows with
    j + head_dim / 2, for j < rotated / 2. Here: RoPE over `rotated` components of each head, q / k
    rows reordered so that its rotate-half pairs are those (the other rows follow in any order, the
    same for q and k)."""
    import copy
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.bamba.modeling_bamba import BambaRotaryEmbedding
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    cfg = model.config
    D = cfg.hidden_size // cfg.num_attention_heads
    half = rotated // 2
    first = list(range(half)) + list(range(D // 2, D // 2 + half))
    order = torch.tensor(first + [j for j in range(D) if j not in first])
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "self_attn"):
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    w = proj.weight.view(-1, D, cfg.hidden_size)
                    proj.weight.copy_(w[:, order].reshape(-1, cfg.hidden_size))
    rope = copy.deepcopy(cfg)
    rope.rope_parameters = dict(cfg.rope_parameters, partial_rotary_factor=rotated / D)
    model.model.rotary_emb = BambaRotaryEmbedding(rope)
    return model


@pytest.mark.peers
@pytest.mark.parametrize("case", GGUF_CASES[:2], ids=override_ids)
def test_llama_cpp_on_the_same_gguf_rotates_otherwise(case, tmp_path):
    """llama.cpp (llama-cpp-python) on Bamba's file is not transformers' Bamba: its converter
    permutes q/k over whole heads while Bamba's RoPE (rotate-half) covers half of each head, so
    its graph rotates other pairs of components (_transformers_with_llama_cpp_rotation). Its
    logits equal that model's and differ from transformers' own (and ours) beyond the first
    position, where RoPE is the identity and the two agree: so greedy tokens are not compared."""
    import llama_cpp
    import torch
    from conftest import gguf_from_hf
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    path = gguf_from_hf(ckpt, tmp_path / "m.gguf", "granitehybrid")
    prompt = prompts_for(320, [12])[0]
    theirs = llama_cpp.Llama(str(path), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    try:
        theirs.eval(prompt)
        got = np.array(theirs.scores[:len(prompt)], np.float64)
    finally:
        theirs.close()
    ours = lite_logits(make_runner(path)[0], [prompt])[0]
    with torch.no_grad():
        rotated = _transformers_with_llama_cpp_rotation(ckpt, case[1].get("attn_rotary_emb", 16))
        want = rotated(torch.tensor([prompt])).logits[0].numpy()
    scale = np.abs(ours).max()
    print(f"llama.cpp vs its rotation in transformers: {np.abs(got - want).max():.1e}; vs ours (transformers' Bamba): "
          f"{np.abs(got - ours).max():.3f} of max |logit| {scale:.2f}")
    assert np.abs(got - want).max() <= 2e-3 * scale             # llama.cpp's own precision on these models
    assert np.abs(got[0] - ours[0]).max() <= 2e-3 * scale
    assert np.abs(got[1:] - ours[1:]).max() > 2e-2 * scale      # another function than Bamba's
