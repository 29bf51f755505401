"""DeepSeek-V2 / V3 against transformers on tiny random checkpoints (DeepseekV2ForCausalLM /
DeepseekV3ForCausalLM, tests/conftest.py): latent attention over the compressed cache in the
absorbed form (V2-Lite's q_proj, V3's q latent), interleaved RoPE, YaRN with mscale in the
softmax scale (V3), a dense first layer, then DeepSeek's MoE: V2's softmax routing limited to
groups, V3's sigmoid routing with the correction bias, the routed scale, ungated shared experts.
fp32 logits of a mixed batch (prompts of 1 to 40 tokens in each step), chunked prefill and
token-by-token decode through the paged cache, greedy tokens, and the cache's bytes per token."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import gguf_from_hf, tiny_checkpoint_path
from test_families import _greedy, hf_logits
from test_moe import _check_routed, _position_errors
from test_parity import check_llama_cpp_agrees, check_variant_matches_default, lite_logits, make_runner, prompts_for
from lite_llm import _kernels

CASES = [("deepseek_v2", {}), ("deepseek_v3", {}),
         ("deepseek_v3", {"rope_interleave": False, "q_lora_rank": None, "n_group": 1, "topk_group": 1,
                          "norm_topk_prob": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
         ("deepseek_v2", {"topk_method": "greedy", "first_k_dense_replace": 0, "q_lora_rank": 48}),
         # V2-Lite's latent widths: cached rows of 512 + 64 values, wider than the heads the
         # other attention kernels take (LL_MAX_HEAD_DIM 512)
         ("deepseek_v2", {"kv_lora_rank": 512, "qk_rope_head_dim": 64})]
PROMPT_LENS = [1, 5, 23, 40]


def _ids(case) -> str:
    arch, ov = case
    return arch + ("-" + "-".join(f"{k}={v.get('rope_type') if isinstance(v, dict) else v}" for k, v in ov.items())
                   if ov else "")


def _check(got: list[np.ndarray], ref: list[np.ndarray]) -> None:
    print(f"max |logit diff| vs transformers: {max(float(np.abs(g - r).max()) for g, r in zip(got, ref)):.2e} "
          f"(logits up to {max(float(np.abs(r).max()) for r in ref):.2f})")
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * np.abs(r).max())


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_fp32_logits_match_transformers_in_a_mixed_batch(case):
    arch, overrides = case
    path = tiny_checkpoint_path(arch, **overrides)
    runner, loaded = make_runner(path)
    cfg = loaded.config
    assert cfg.is_mla and (cfg.kv_lora_rank, cfg.head_dim) == (overrides.get("kv_lora_rank", 32),
                                                               overrides.get("qk_rope_head_dim", 16))
    assert cfg.moe_routing == ("grouped_sigmoid" if arch == "deepseek_v3" else "grouped_softmax")
    prompts = prompts_for(cfg.vocab_size, PROMPT_LENS)
    _check(lite_logits(runner, prompts), hf_logits(path, prompts))


@pytest.mark.parametrize("case", CASES[:2], ids=_ids)
@pytest.mark.parametrize("chunk", [1, 7])
def test_chunked_prefill_and_token_by_token_decode_match_transformers(case, chunk):
    """chunk=1: every position decoded alone over the latent rows cached before it."""
    arch, overrides = case
    path = tiny_checkpoint_path(arch, **overrides)
    runner, loaded = make_runner(path)
    prompts = prompts_for(loaded.config.vocab_size, [3, 20, 37])
    _check(lite_logits(runner, prompts, chunk=chunk), hf_logits(path, prompts))


@pytest.mark.parametrize("case", CASES[:2], ids=_ids)
def test_fp32_greedy_tokens_match_transformers(case):
    _greedy(case, prompt_len=12)


@pytest.mark.parametrize("dtype,itemsize", [("float32", 4), ("bfloat16", 2)])
def test_the_cache_holds_the_latent_and_the_rope_key_alone(dtype, itemsize):
    """(kv_lora_rank + qk_rope_head_dim) x layers x the cache dtype's bytes per token, in the
    runner's arrays and in the capacity plan (kv_bytes_per_block), against 2 x heads x head
    width x layers for the full K and V transformers caches in the naive form."""
    from lite_llm.engine.runner import kv_bytes_per_block
    path = tiny_checkpoint_path("deepseek_v3")
    runner, loaded = make_runner(path, dtype=dtype)
    cfg = loaded.config
    want = (cfg.kv_lora_rank + cfg.head_dim) * cfg.num_layers * itemsize
    assert runner.kv_bytes_per_token == want == (32 + 16) * 3 * itemsize
    assert kv_bytes_per_block(cfg, 16, dtype) == 16 * want
    naive = cfg.num_layers * cfg.num_heads * ((cfg.qk_nope_head_dim + cfg.head_dim) + cfg.v_head_dim) * itemsize
    print(f"{dtype}: {want} cached bytes per token (naive K and V: {naive})")


def test_info_and_the_capacity_plan_count_the_latent_rows():
    """`info --model` and the KV plan (the capacity line's blocks) at (kv_lora_rank +
    qk_rope_head_dim) x layers x 2 bytes per token with the bf16 cache; a Llama at 2 x KV heads
    x head_dim x layers x 2."""
    from lite_llm import info
    from lite_llm.engine.assemble import plan_kv_cache
    from lite_llm.model.arch import read_config
    for arch, want in (("deepseek_v2", (32 + 16) * 3 * 2), ("llama", 2 * 2 * 16 * 2 * 2)):
        path = tiny_checkpoint_path(arch)
        m = info.model_weight_bytes(str(path))
        assert m["kv_bytes_per_token_bf16"] == want, (arch, m)
        plan = plan_kv_cache(read_config(str(path))[0], "bfloat16", 16, 128, kv_cache_space=1 / 1024)
        assert plan.bytes_per_block == 16 * want and plan.num_blocks == 2**20 // (16 * want), (arch, plan)


@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v3"])
def test_bf16_cache_logits_stay_close_to_transformers(arch):
    """bf16 weights and the bf16 latent cache, prefilled 7 tokens a step, against the fp32
    reference: the MoE families' bf16 bound where no near-tied routing flips (test_moe)."""
    path = tiny_checkpoint_path(arch)
    runner, loaded = make_runner(path, dtype="bfloat16")
    assert runner.kv_cache_dtype == "bfloat16"
    prompts = prompts_for(loaded.config.vocab_size, PROMPT_LENS)
    err = _position_errors(lite_logits(runner, prompts, chunk=7), hf_logits(path, prompts), lambda r: np.abs(r).max())
    print(f"bf16: |logit error| / max |logit|: median {np.median(err):.4f}, max {err.max():.4f}")
    _check_routed(err, 0.03, 0.01)


@pytest.mark.parametrize("variant", _kernels.available())
def test_every_variant_gives_the_same_logits(variant):
    """The grouped routing and the latent attention on every kernel build this CPU runs."""
    check_variant_matches_default(tiny_checkpoint_path("deepseek_v3"), variant)


def test_an_8bit_cache_is_refused_naming_what_runs():
    from lite_llm.engine.runner import ModelRunner
    from lite_llm.model.loader import load_model
    loaded = load_model(str(tiny_checkpoint_path("deepseek_v2")), dtype="float32", progress=False)
    with pytest.raises(ValueError, match="float32 or bfloat16 cache"):
        ModelRunner(loaded, num_blocks=8, block_size=16, max_num_batched_tokens=32, max_num_seqs=4, num_threads=1,
                    kv_cache_dtype="int8")


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[3]], ids=_ids)
def test_gguf_of_the_same_weights_gives_the_same_logits(case, tmp_path):
    """llama.cpp's "deepseek2" graph written from the same tensors (attn_kv_a_mqa, attn_k_b /
    attn_v_b, exp_probs_b, the routing and widths in the metadata): the config read from it and
    the logits equal the HF checkpoint's."""
    arch, overrides = case
    ckpt = tiny_checkpoint_path(arch, **overrides)
    g_runner, g = make_runner(gguf_from_hf(ckpt, tmp_path / "m.gguf", "deepseek2"))
    h_runner, h = make_runner(ckpt)
    for field in ("architecture", "num_experts", "num_experts_per_tok", "norm_topk_prob", "ffn_dim", "dense_ffn_dim",
                  "shared_ffn_dim", "moe_routing", "n_group", "topk_group", "routed_scale", "first_dense_layers",
                  "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "v_head_dim", "head_dim", "num_heads"):
        assert getattr(g.config, field) == getattr(h.config, field), field
    prompts = prompts_for(h.config.vocab_size, [7, 30])
    for a, b in zip(lite_logits(h_runner, prompts), lite_logits(g_runner, prompts)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())


def test_a_whole_attn_kv_b_gives_the_same_logits(tmp_path):
    """Older converters keep kv_b_proj whole as attn_kv_b [H (dn + dv), r]: its W_UV rows run as
    stored and W_UK is transposed at load; the logits equal the split file's and the HF ones."""
    ckpt = tiny_checkpoint_path("deepseek_v3")
    prompts = prompts_for(320, [7, 30])
    want = lite_logits(make_runner(ckpt)[0], prompts)
    runner, _ = make_runner(gguf_from_hf(ckpt, tmp_path / "m.gguf", "deepseek2", split_kv_b=False))
    for g, w in zip(lite_logits(runner, prompts), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v3"])
def test_every_latent_attention_weight_runs_as_stored(arch, tmp_path):
    """A Q8_0 "deepseek2" file (heads of 32 + 16, values of 32): q (or q_a and q_b), kv_a, each
    head's W_UK^T (attn_k_b) and W_UV (attn_v_b) and o run in the file's own Q8_0 blocks, none
    multiplied into another at load, so the attention bytes a token reads are the file's; the
    logits stay within Q8_0's error of the F32 file's."""
    ckpt = tiny_checkpoint_path(arch, qk_nope_head_dim=32, v_head_dim=32)
    q8 = gguf_from_hf(ckpt, tmp_path / "q8.gguf", "deepseek2", block_type="Q8_0")
    runner, loaded = make_runner(q8)
    cfg = loaded.config
    H, r, dn, dv, dr = cfg.num_heads, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.head_dim
    for i in range(cfg.num_layers):
        for name in ("qkv", "k_b", "v_b", "o") + (("q_b",) if cfg.q_lora_rank else ()):
            assert set(runner.formats[f"layers.{i}.{name}"][0]) == {"Q8_0"}, (i, name, runner.formats)
    # Q8_0: 34 bytes a block of 32 values, in the file and as packed
    file_values = (H * (dn + dr) * (cfg.q_lora_rank or cfg.dim) + (cfg.q_lora_rank * cfg.dim if cfg.q_lora_rank else 0)
                   + (r + dr) * cfg.dim + H * r * dn + H * dv * r + cfg.dim * H * dv)
    packed = sum(v.nbytes for k, v in runner.packed.model.arrays() if k.startswith("layers.1.")
                 and k.split(".")[2] in ("qkv", "q_b", "k_b", "v_b", "o"))
    assert packed == file_values // 32 * 34, (packed, file_values // 32 * 34)
    prompts = prompts_for(cfg.vocab_size, [7, 30])
    want = lite_logits(make_runner(_dequantized_copy(q8, tmp_path / "f32.gguf"))[0], prompts)
    err = _position_errors(lite_logits(runner, prompts), want, lambda w: w.max() - w.min())
    print(f"Q8_0 file vs its dequantized F32 copy: |logit error| / logit range: median {np.median(err):.4f}, "
          f"max {err.max():.4f}")
    # the int8 activation blocks' error alone: test_quantized.py's bound on the largest error; the
    # median twice its (measured 0.6 %: these layers are 64 wide, two blocks a row)
    _check_routed(err, 0.04, 0.01)


def _dequantized_copy(source, dest):
    """GGUF `source` with every tensor dequantized to F32 (the weights a run of it must compute with)."""
    import gguf
    from lite_llm.bench.common import copy_gguf_keys
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(dest), reader.fields["general.architecture"].contents())
    copy_gguf_keys(reader, writer, gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


@pytest.mark.peers
@pytest.mark.parametrize("case", [("deepseek_v2", {"topk_method": "greedy"}), CASES[1]], ids=_ids)
def test_llama_cpp_on_the_same_gguf_gives_the_same_greedy_tokens(case, tmp_path):
    """llama.cpp (llama-cpp-python) runs the same "deepseek2" file: 16 greedy tokens agree. V2's
    group_limited_greedy is left out: llama.cpp scores a group by its two best experts (V3's
    rule) where transformers and DeepSeek's V2 code take the best one (their logits then differ
    by 0.08 on this checkpoint; with greedy routing by 4e-4)."""
    arch, overrides = case
    path = gguf_from_hf(tiny_checkpoint_path(arch, **overrides), tmp_path / "m.gguf", "deepseek2")
    check_llama_cpp_agrees(path)


def test_multi_token_prediction_layers_are_not_read(tmp_path):
    """V3's released files carry a multi-token-prediction layer numbered past num_hidden_layers
    (transformers does not load it either): the same logits with and without it. A tensor of an
    ordinary layer that the recipe does not know is still refused."""
    from safetensors.numpy import save_file
    from conftest import checkpoint_copy
    from lite_llm.model.loader import ModelLoadError
    ckpt = tiny_checkpoint_path("deepseek_v3")
    sd = checkpoint_copy(ckpt, tmp_path / "mtp")
    n = max(int(k.split(".")[2]) for k in sd if k.startswith("model.layers.")) + 1
    E = sd["model.norm.weight"].shape[0]
    rng = np.random.default_rng(0)
    mtp = {f"model.layers.{n}.eh_proj.weight": rng.standard_normal((E, 2 * E)).astype(np.float32),
           f"model.layers.{n}.enorm.weight": np.ones(E, np.float32),
           f"model.layers.{n}.shared_head.norm.weight": np.ones(E, np.float32)}
    save_file({**sd, **mtp}, str(tmp_path / "mtp" / "model.safetensors"), metadata={"format": "pt"})
    prompts = prompts_for(320, [5, 23])
    want = lite_logits(make_runner(ckpt)[0], prompts)
    for g, w in zip(lite_logits(make_runner(tmp_path / "mtp")[0], prompts), want):
        np.testing.assert_array_equal(g, w)
    save_file({**sd, f"model.layers.{n - 1}.eh_proj.weight": mtp[f"model.layers.{n}.eh_proj.weight"]},
              str(tmp_path / "mtp" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=rf"recipe does not read: model\.layers\.{n - 1}\.eh_proj\.weight"):
        make_runner(tmp_path / "mtp")
