"""Nemotron-H (NemotronHForCausalLM) against transformers on tiny random checkpoints built with
its own NemotronHConfig: blocks of one mixer each (Mamba2, attention without positions, relu^2
MLP, or Nemotron 3's mixture of relu^2 experts with a shared MLP and DeepSeek-V3's routing), a
mixer and the MLP or expert block after it run as one layer, mixer blocks without one alone.
fp32 logits in a mixed batch, prefilled in chunks and token by token; greedy tokens through the
engine with concurrent requests and forced preemption; bf16 and Q8_0 within the families' bounds;
the same weights as llama.cpp's "nemotron_h" / "nemotron_h_moe" GGUF."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import checkpoint_copy, tiny_checkpoint_path
from test_families import _greedy, hf_logits
from test_parity import (check_engine_greedy_under_preemption, check_gguf_matches_hf, check_llama_cpp_agrees, check_logits,
                        lite_logits, make_runner, override_ids, prompts_for)

CASES = [("nemotron_h", {}),                                      # M - * M - M
         # attention first and GQA 4:1, biases on the Mamba2 projections and the MLP, no conv
         # bias, 3 taps, one group, a dt floor (time_step_min) that binds on about half the heads
         ("nemotron_h", {"hybrid_override_pattern": "*-M-MM-", "num_key_value_heads": 1, "use_bias": True,
                         "mlp_bias": True, "use_conv_bias": False, "conv_kernel": 3, "n_groups": 1,
                         "time_step_min": 0.7})]
# Nemotron 3's expert blocks ("E"): 8 relu^2 experts of 32 features, top 2, a shared MLP of 48,
# sigmoid scores with a random correction bias (conftest), x routed_scaling_factor
_EXPERTS = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                moe_shared_expert_intermediate_size=48, routed_scaling_factor=2.5)
MOE_CASES = [  # a dense MLP block before the experts; the best 1 of 2 groups of 4 experts
             ("nemotron_h", {"hybrid_override_pattern": "M-*EME", **_EXPERTS, "n_group": 2, "topk_group": 1}),
             # experts alone, top 3 of 6 not renormalised, GQA 4:1, attention first
             ("nemotron_h", {"hybrid_override_pattern": "*EMEME", **_EXPERTS, "n_routed_experts": 6,
                             "num_experts_per_tok": 3, "norm_topk_prob": False, "num_key_value_heads": 1})]
CASES += MOE_CASES
PROMPT_LENS = [1, 5, 23, 70]     # 70: past one 64-token chunk of the scan


@pytest.mark.parametrize("case", CASES, ids=override_ids)
def test_fp32_logits_match_transformers_in_a_mixed_batch(case):
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path)
    cfg = loaded.config
    pattern = case[1].get("hybrid_override_pattern", "M-*M-M")
    mlps = pattern.count("-") + pattern.count("E")
    assert cfg.num_layers == len(pattern) - mlps and cfg.num_mamba_layers == pattern.count("M")
    assert len(cfg.no_mlp_layers) == cfg.num_layers - mlps and cfg.nope
    assert (cfg.act, cfg.gated_mlp, cfg.num_experts) == ("relu2", False, case[1]["n_routed_experts"] if "E" in pattern else 0)
    prompts = prompts_for(cfg.vocab_size, PROMPT_LENS)
    check_logits(lite_logits(runner, prompts), hf_logits(path, prompts))


@pytest.mark.parametrize("case", CASES, ids=override_ids)
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_and_token_by_token_decode_match_transformers(case, chunk):
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path)
    prompts = prompts_for(loaded.config.vocab_size, [3, 20, 37])
    check_logits(lite_logits(runner, prompts, chunk=chunk), hf_logits(path, prompts))


@pytest.mark.parametrize("case", [CASES[0], MOE_CASES[0]], ids=override_ids)
def test_fp32_greedy_tokens_match_transformers(case):
    _greedy(case, prompt_len=12)


@pytest.mark.parametrize("case", [CASES[0], MOE_CASES[0]], ids=override_ids)
def test_engine_greedy_tokens_match_with_concurrent_requests_and_preemption(case):
    check_engine_greedy_under_preemption(str(tiny_checkpoint_path(*case[:1], **case[1])))


def test_experts_choose_by_the_corrected_scores_in_groups():
    """The expert case's routing as transformers': DeepSeek-V3's sigmoid routing over the
    groups, the correction bias read (not zero), the shared MLP ungated, the dense MLP block
    before the experts a layer of its own width."""
    runner, loaded = make_runner(tiny_checkpoint_path(*MOE_CASES[0][:1], **MOE_CASES[0][1]))
    cfg = loaded.config
    assert (cfg.moe_routing, cfg.n_group, cfg.topk_group, cfg.routed_scale, cfg.norm_topk_prob) == (
        "grouped_sigmoid", 2, 1, 2.5, True)
    assert (cfg.ffn_dim, cfg.shared_ffn_dim, cfg.shared_gate, cfg.first_dense_layers, cfg.dense_ffn_dim) == (
        32, 48, False, 1, 96)
    tensors = dict(loaded.iter_tensors())
    assert np.abs(tensors["layers.1.router.correction_bias"]).max() > 0.01


def test_the_state_cache_and_kv_cover_their_layers():
    """Three Mamba2 layers of a conv state [3, 192] and a scan state [8, 16, 16] per slot, float32;
    KV for the one attention layer alone (2 heads of 16)."""
    runner, loaded = make_runner(tiny_checkpoint_path("nemotron_h"), max_tokens=32)
    per_seq = 3 * (3 * 192 + 8 * 16 * 16) * 4
    assert loaded.config.state_bytes_per_seq == per_seq and runner.state_bytes == 32 * per_seq
    assert runner.kv_bytes_per_token == 1 * 2 * 2 * 16 * 4


@pytest.mark.parametrize("case", [CASES[0], MOE_CASES[0]], ids=override_ids)
@pytest.mark.parametrize("chunk", [7, 1])
def test_bf16_weights_stay_close_to_transformers_fp32(case, chunk):
    """Steps of many tokens (fp32 rows into the bf16 weights) and of one (bf16 pairs: the
    experts' and the MLPs' activations written as such). With experts the prompts stop short of
    70 tokens: there a score in bf16 can fall on the other side of a near tie and route a token to
    another expert than fp32's (a different model from then on, not an error to bound)."""
    path = tiny_checkpoint_path(*case[:1], **case[1])
    runner, loaded = make_runner(path, dtype="bfloat16")
    lens = [1, 5, 23] if loaded.config.is_moe else PROMPT_LENS
    prompts = prompts_for(loaded.config.vocab_size, lens if chunk > 1 else [23])
    for g, r in zip(lite_logits(runner, prompts, chunk=chunk), hf_logits(path, prompts)):
        assert np.abs(g - r).max() <= 0.03 * np.abs(r).max()


@pytest.mark.parametrize("case", [CASES[0], MOE_CASES[0]], ids=override_ids)
def test_q8_0_at_load_matches_the_dequantized_reference(case, tmp_path):
    """Every matrix quantized at load to Q8_0 (the routers excepted: they run in fp32) against
    transformers on the same weights quantized and dequantized by the gguf package, whole and a
    token at a time (test_moe.py's bound)."""
    import gguf
    from safetensors.numpy import save_file
    from transformers import AutoModelForCausalLM
    from test_moe import _check_quantized_moe
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    out = tmp_path / "roundtrip"
    sd = checkpoint_copy(ckpt, out)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, w in sd.items():
        if w.ndim == 2 and w.shape[1] % 32 == 0 and not name.endswith("mixer.gate.weight"):
            sd[name] = gguf.quants.dequantize(gguf.quants.quantize(w.astype(np.float32), q8), q8).astype(w.dtype)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    runner, loaded = make_runner(ckpt, quantization="q8_0")
    assert runner.formats["layers.0.in_proj"] == (("Q8_0",), "int8 blocks")
    if loaded.config.is_moe:   # ungated: each up projection once
        for name in ("layers.0.up", "layers.1.experts.up", "layers.1.shared.up", "layers.1.experts.down"):
            assert runner.formats[name] == (("Q8_0",), "int8 blocks"), name
    else:
        assert runner.formats["layers.0.up"] == (("Q8_0",), "int8 blocks")
    _check_quantized_moe(runner, model, "q8_0")


@pytest.mark.parametrize("block_type", [None, "Q8_0"])
def test_the_experts_hold_their_stored_bytes_once(block_type, tmp_path):
    """The relu^2 experts, the shared MLP and the dense MLP before them run ungated (up, relu^2,
    down): their packed weights take the bytes the checkpoint stores them in, each up row once
    (not as gate and up rows: 1.5x), from an fp32 checkpoint and from a Q8_0 GGUF kept as stored."""
    from conftest import gguf_from_hf
    from safetensors import safe_open
    from lite_llm.model.gguf import GGUFFile
    ckpt = tiny_checkpoint_path(*MOE_CASES[0][:1], **MOE_CASES[0][1])
    if block_type is None:
        path = ckpt
        with safe_open(str(ckpt / "model.safetensors"), "np") as f:
            stored = sum(f.get_tensor(n).nbytes for n in f.keys() if n.endswith(("up_proj.weight", "down_proj.weight")))
    else:
        path = gguf_from_hf(ckpt, tmp_path / "m.gguf", "nemotron_h_moe", block_type=block_type)
        f = GGUFFile(str(path))
        stored = sum(i.nbytes for n, i in f.tensors.items() if ".ffn_up" in n or ".ffn_down" in n)
        assert {f.tensors[n].type_name for n in f.tensors if "ffn_up_exps" in n} == {block_type}
        f.close()
    runner, loaded = make_runner(path)
    mlp = (".up", ".down", ".gate_up")
    packed = runner.packed.model.matrices
    assert sum(m.nbytes for n, m in packed.items() if n.endswith(mlp)) == stored
    assert not [n for n in packed if n.endswith(".gate_up")]


def test_experts_stored_as_3d_tensors_give_the_same_logits(tmp_path):
    """The experts as transformers 5 keeps them in memory (model.* names, experts.up_proj
    [X, F, E] and experts.down_proj [X, E, F]) instead of one tensor per expert: each expert read
    where it lies, the same logits as the per-expert checkpoint."""
    from safetensors.numpy import save_file
    ckpt = tiny_checkpoint_path(*MOE_CASES[0][:1], **MOE_CASES[0][1])
    out = tmp_path / "fused"
    sd = checkpoint_copy(ckpt, out)
    fused = {}
    for name, w in sd.items():
        head, sep, rest = name.partition("mixer.experts.")
        if sep:   # "{j}.up_proj.weight"
            j, proj = rest.split(".")[:2]
            fused.setdefault(f"{head}mixer.experts.{proj}", {})[int(j)] = w
        else:
            fused[name] = w
    fused = {k.replace("backbone.", "model."): (np.stack([v[j] for j in sorted(v)]) if isinstance(v, dict) else v)
             for k, v in fused.items()}
    assert fused["model.layers.3.mixer.experts.up_proj"].shape == (8, 32, 64)
    save_file(fused, str(out / "model.safetensors"), metadata={"format": "pt"})
    prompts = prompts_for(320, [7, 30])
    got = lite_logits(make_runner(out)[0], prompts)
    for a, b in zip(lite_logits(make_runner(ckpt)[0], prompts), got):
        np.testing.assert_array_equal(b, a)


def test_unsupported_blocks_are_refused_by_name():
    import json
    from lite_llm.model.arch import config_from_dict
    from lite_llm.model.files import ModelLoadError
    raw = json.loads((tiny_checkpoint_path("nemotron_h") / "config.json").read_text())
    for types, words in ((["linear_attention", "moe", "full_attention", "mlp"], "dense MLP block after"),
                         (["moe", "linear_attention", "full_attention"], "does not follow a mixer"),
                         (["mlp", "linear_attention", "full_attention"], "does not follow a mixer"),
                         (["linear_attention", "mlp", "mlp", "full_attention"], "does not follow a mixer"),
                         (["linear_attention", "mlp"], "Mamba2 and attention")):
        with pytest.raises(ModelLoadError, match=words):
            config_from_dict({**raw, "layers_block_type": types})
    moe = ["linear_attention", "moe", "full_attention"]
    for extra, words in (({"moe_latent_size": 32}, "moe_latent_size 32: Nemotron-H's latent projections"),
                         ({"mlp_bias": True}, "mlp_bias true"), ({"mlp_hidden_act": "silu"}, "mlp_hidden_act 'silu'"),
                         ({"n_group": 3}, "in 3 groups"),
                         ({"n_group": 4, "topk_group": 1, "num_experts_per_tok": 3}, "top-3 of 8 experts in 4")):
        with pytest.raises(ModelLoadError, match=words):
            config_from_dict({**raw, "layers_block_type": moe, **extra})


GGUF_CASES = [CASES[0], ("nemotron_h", {"hybrid_override_pattern": "*-M-MM-", "num_key_value_heads": 1,
                                        "conv_kernel": 3, "n_groups": 1}),
              ("nemotron_h", {"use_conv_bias": False})]


FIELDS = ("architecture", "layer_types", "no_mlp_layers", "ffn_dim", "num_kv_heads", "head_dim", "act", "gated_mlp",
          "nope", "tie_word_embeddings", "mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state",
          "mamba_d_conv", "mamba_conv_bias")
# llama.cpp's converter writes no expert_group_used_count: its files have one expert group
GGUF_MOE_CASES = [("nemotron_h", {"hybrid_override_pattern": "MEM*EM", **_EXPERTS}), MOE_CASES[1]]


@pytest.mark.parametrize("case", GGUF_CASES, ids=override_ids)
def test_gguf_of_the_same_weights_gives_the_same_logits(case, tmp_path):
    """llama.cpp's "nemotron_h" graph written from the same tensors (a GGUF block per block, the
    kinds in head_count_kv and feed_forward_length per block, the ssm_* tensors, q/k permuted): the
    config read from it and the logits equal the HF checkpoint's."""
    from conftest import gguf_from_hf
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    check_gguf_matches_hf(gguf_from_hf(ckpt, tmp_path / "m.gguf", "nemotron_h"), ckpt, FIELDS)


@pytest.mark.peers
@pytest.mark.parametrize("case", GGUF_CASES[:2], ids=override_ids)
def test_llama_cpp_on_the_same_gguf_gives_the_same_greedy_tokens(case, tmp_path):
    """llama.cpp (llama-cpp-python) runs the same "nemotron_h" file: 16 greedy tokens agree. Not
    the case without conv biases: llama.cpp's Mamba2 graph adds the bias its loader lets be
    missing, and crashes (the released checkpoints have it)."""
    from conftest import gguf_from_hf
    path = gguf_from_hf(tiny_checkpoint_path(*case[:1], **case[1]), tmp_path / "m.gguf", "nemotron_h")
    check_llama_cpp_agrees(path)


@pytest.mark.parametrize("case", GGUF_MOE_CASES, ids=override_ids)
def test_gguf_with_experts_gives_the_same_logits(case, tmp_path):
    """llama.cpp's "nemotron_h_moe" file of the same weights (expert blocks by their
    feed_forward_length and router, ffn_up_exps / ffn_down_exps, exp_probs_b, the shared MLP's
    *_shexp, the routing fields its converter writes): the same config and logits as the HF
    checkpoint, and transformers' within 1e-4."""
    from conftest import gguf_from_hf
    from test_families import hf_logits
    ckpt = tiny_checkpoint_path(*case[:1], **case[1])
    got, prompts, _ = check_gguf_matches_hf(
        gguf_from_hf(ckpt, tmp_path / "m.gguf", "nemotron_h_moe"), ckpt,
        FIELDS + ("num_experts", "num_experts_per_tok", "norm_topk_prob", "moe_routing", "n_group", "topk_group",
                  "routed_scale", "shared_ffn_dim", "shared_gate", "first_dense_layers"))
    check_logits(got, hf_logits(ckpt, prompts))


def test_gguf_latent_experts_are_refused_by_name(tmp_path):
    """A "nemotron_h_moe" file with moe_latent_size (Nemotron 3 Super's latent projections) is
    refused by that name."""
    from conftest import gguf_from_hf
    from lite_llm.model.files import ModelLoadError
    from lite_llm.model.loader import load_model
    ckpt = tiny_checkpoint_path(*GGUF_MOE_CASES[0][:1], **GGUF_MOE_CASES[0][1])
    path = gguf_from_hf(ckpt, tmp_path / "m.gguf", "nemotron_h_moe", moe_latent_size=32)
    with pytest.raises(ModelLoadError, match="moe_latent_size"):
        load_model(str(path), progress=False)


@pytest.mark.peers
@pytest.mark.parametrize("case", GGUF_MOE_CASES, ids=override_ids)
def test_llama_cpp_on_the_same_moe_gguf_gives_the_same_greedy_tokens(case, tmp_path):
    """llama.cpp (llama-cpp-python) runs the same "nemotron_h_moe" file: 16 greedy tokens agree."""
    from conftest import gguf_from_hf
    path = gguf_from_hf(tiny_checkpoint_path(*case[:1], **case[1]), tmp_path / "m.gguf", "nemotron_h_moe")
    check_llama_cpp_agrees(path)
