"""DeepSeek-V2 / V3 (HF DeepseekV2ForCausalLM / DeepseekV3ForCausalLM; DeepSeek-V2-Lite,
V2, V2.5, V3, R1, Kimi K2 share the graph): multi-head latent attention and DeepSeek's MoE.

Attention (MLA). Per token, kv_a_proj_with_mqa gives a latent c of kv_lora_rank values (then
kv_a_layernorm) and one RoPE key k_pe of qk_rope_head_dim values shared by every head;
kv_b_proj [H (dn + dv), r] expands c into each head's k_nope (dn rows, W_UK,h) and value (dv
rows, W_UV,h). The query comes from x (q_proj, V2-Lite) or from a latent of q_lora_rank values
(q_a_proj, q_a_layernorm, q_b_proj), each head's dn + dr components split into q_nope, q_pe.
Scores scale by (dn + dr)^-0.5, times mscale^2 under YaRN with mscale_all_dim, as transformers.

Here the cache holds only [c, k_pe] per token (kv_lora_rank + qk_rope_head_dim values, one
row for all heads: src/kernels/mla.h), and attention runs in the "absorbed" form of DeepSeek's
and ik_llama.cpp's MLA modes, the up-projections applied per head to the activations rather
than folded into the weights (which would make q and o r / dn and r / dv times as wide):

    q_h      [W_UK,h^T q_nope,h ; q_pe,h]     (r + dr values) -> q_h . [c, k_pe] per cached row
    out_h    sum_j p_hj c_j                    (r values, the latent output)
    o input  W_UV,h out_h                      (dv values per head) -> o as stored

so a cached row is read once for all heads, and every weight a token reads is the file's own,
in its stored format (forward.pxi's _mla_block). The RoPE components stay in the stored order
(interleaved pairs, DeepSeek's complex form; V3 with rope_interleave false: halves); the kernel
takes q_pe and k_pe to the halves order it rotates (one permutation on both leaves q_pe . k_pe
unchanged).

Canonical tensors of layer i (besides the norms and the MLP), all as stored:
    qkv.weight      [H (dn + dr) + r + dr, E] q then kv_a (no q latent), or
                    [ql + r + dr, E] q_a then kv_a
    q_a_norm.weight [ql], q_b.weight [H (dn + dr), ql] (q latent only)
    kv_a_norm.weight [r]
    k_b.{h}.weight  [r, dn] head h's W_UK transposed; v_b.{h}.weight [dv, r] its W_UV
    o.weight        [E, H dv]

MoE: the first first_k_dense_replace layers are dense (intermediate_size); the others route
n_routed_experts of moe_intermediate_size (V2: softmax, greedy or group_limited_greedy over
n_group groups; V3: sigmoid with e_score_correction_bias, the best topk_group of n_group groups by
their two best scores), weights x routed_scaling_factor (V3 renormalised first when
norm_topk_prob), plus n_shared_experts shared experts run as one ungated MLP of
n_shared_experts x moe_intermediate_size features. transformers' V2 router never renormalises
(V2's released configs have norm_topk_prob false): it is followed here when the config asks.
Multi-token prediction layers (V3's num_nextn_predict_layers, stored as extra layers past
num_hidden_layers) are not loaded.

llama.cpp's "deepseek2" GGUF graph keeps the same weights under its names (its converter
leaves the RoPE rows interleaved): attn_q or attn_q_a / attn_q_a_norm / attn_q_b,
attn_kv_a_mqa, attn_kv_a_norm, kv_b_proj whole as attn_kv_b or (current converters) split into
attn_k_b [H, r, dn] (W_UK,h transposed) and attn_v_b [H, dv, r], attn_output, ffn_gate_inp,
exp_probs_b (the correction bias), ffn_*_exps, ffn_*_shexp; the widths in
attention.kv_lora_rank / q_lora_rank / key_length_mla / value_length_mla /
rope.dimension_count, the routing in expert_gating_func (1 softmax: V2, 2 sigmoid: V3),
expert_weights_scale / _norm, expert_group_count / _used_count, expert_shared_count,
leading_dense_block_count, and YaRN's mscale_all_dim as rope.scaling.yarn_log_multiplier
(0.1 mscale_all_dim). attn_k_b / attn_v_b run as stored, a head's rows at a time; a whole
attn_kv_b keeps its W_UV rows as stored and gives W_UK transposed in float32, as does a
quantized kv_b_proj of an HF checkpoint (DeepSeek-V3 / R1's FP8 blocks).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama, moe
from lite_llm.model.files import ModelLoadError
from lite_llm.model import hfquant
from lite_llm.model.hf import quantized_rows, stacked
from lite_llm.model.weights import StackedRows, convert

HF_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
GGUF_ARCHITECTURES = {"deepseek2": "DeepseekV2ForCausalLM"}


def HF_UNREAD(config: ModelConfig) -> tuple[tuple[str, str], ...]:
    """File tensors left unread (arch/__init__.py unread_tensors): V3's multi-token-prediction
    layers, numbered past num_hidden_layers (llama.cpp's converter drops them from its files)."""
    past = "|".join(str(i) for i in range(config.num_layers, 2 * config.num_layers))
    return ((rf"model\.layers\.(?:{past})\..+", "a multi-token-prediction layer: it drafts tokens for speculative "
                                                 "decoding, the model's own logits do not use it"),)
GATING_SOFTMAX, GATING_SIGMOID = 1, 2      # llama.cpp's expert_gating_func values


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    v3 = arch == "DeepseekV3ForCausalLM"
    num_experts = raw.get("n_routed_experts")
    if not num_experts:
        raise ModelLoadError(f"{where}: {arch} config lacks n_routed_experts")
    if int(raw.get("moe_layer_freq", 1) or 1) != 1:
        raise ModelLoadError(f"{where}: moe_layer_freq {raw.get('moe_layer_freq')}: only every layer past "
                             "first_k_dense_replace as an expert layer is supported")
    if raw.get("attention_bias"):
        raise ModelLoadError(f"{where}: attention_bias true is not supported for {arch}")
    method = raw.get("topk_method") or ("noaux_tc" if v3 else "greedy")
    if method not in (("noaux_tc",) if v3 else ("greedy", "group_limited_greedy")):
        raise ModelLoadError(f"{where}: topk_method {method!r} is not supported for {arch}")
    grouped = v3 or method == "group_limited_greedy"
    n_group = int(raw.get("n_group") or 1) if grouped else 1
    topk_group = int(raw.get("topk_group") or n_group) if grouped else 1
    rope_dim, r = int(raw["qk_rope_head_dim"]), int(raw["kv_lora_rank"])
    if (r + rope_dim) % 16:
        raise ModelLoadError(f"{where}: kv_lora_rank {r} + qk_rope_head_dim {rope_dim} is not a multiple of 16")
    K = int(raw["num_experts_per_tok"])
    if not 0 < K <= int(num_experts) or int(num_experts) % n_group or not 0 < topk_group <= n_group:
        raise ModelLoadError(f"{where}: top-{K} of {num_experts} experts in {n_group} groups (best {topk_group})")
    shared = int(raw.get("n_shared_experts") or 0) * int(raw["moe_intermediate_size"])
    first_dense = min(int(raw.get("first_k_dense_replace") or 0), int(raw["num_hidden_layers"]))
    return llama.decoder_config(
        raw, arch, where, head_dim=rope_dim, num_kv_heads=int(raw["num_attention_heads"]),
        ffn_dim=int(raw["moe_intermediate_size"]), num_experts=int(num_experts), num_experts_per_tok=K,
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        moe_routing="grouped_sigmoid" if v3 else "grouped_softmax", n_group=n_group, topk_group=topk_group,
        routed_scale=float(raw.get("routed_scaling_factor") or 1.0), shared_ffn_dim=shared, shared_gate=False,
        first_dense_layers=first_dense, dense_ffn_dim=int(raw["intermediate_size"]),
        kv_lora_rank=r, q_lora_rank=int(raw.get("q_lora_rank") or 0),
        qk_nope_head_dim=int(raw["qk_nope_head_dim"]), v_head_dim=int(raw["v_head_dim"]),
        rope_interleave=bool(raw.get("rope_interleave", True)) if v3 else True)


def softmax_scale(config: ModelConfig) -> float:
    """(qk_nope_head_dim + qk_rope_head_dim)^-0.5, times mscale^2 with YaRN's mscale_all_dim
    (transformers' yarn_apply_mscale)."""
    scale = (config.qk_nope_head_dim + config.head_dim) ** -0.5
    scaling = config.rope_scaling or {}
    m = scaling.get("mscale_all_dim")
    if scaling.get("rope_type") not in (None, "default") and m:
        factor = float(scaling.get("factor", 1.0))
        mscale = 1.0 if factor <= 1 else 0.1 * float(m) * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


def _matrix(a: np.ndarray) -> StackedRows:
    a = np.ascontiguousarray(a, np.float32)
    return StackedRows(((a.shape[0], lambda r0, r1: a[r0:r1]),), a.shape[1])


def _w_uk_heads(kv_b: np.ndarray, config: ModelConfig, p: str) -> Iterator[tuple[str, StackedRows]]:
    """k_b.{h} of a whole kv_b_proj [H (dn + dv), r]: each head's W_UK transposed, in float32."""
    H, dn, dv, r = config.num_heads, config.qk_nope_head_dim, config.v_head_dim, config.kv_lora_rank
    kvb = np.asarray(kv_b, np.float32).reshape(H, dn + dv, r)
    for h in range(H):
        yield p + f"k_b.{h}.weight", _matrix(kvb[h, :dn].T)


def _heads_of_kv_b(kv_b: np.ndarray, config: ModelConfig, p: str) -> Iterator[tuple[str, StackedRows]]:
    """k_b.{h} / v_b.{h} of a whole kv_b_proj [H (dn + dv), r]: W_UK,h transposed and W_UV,h."""
    H, dn, dv, r = config.num_heads, config.qk_nope_head_dim, config.v_head_dim, config.kv_lora_rank
    yield from _w_uk_heads(kv_b, config, p)
    kvb = np.asarray(kv_b, np.float32).reshape(H, dn + dv, r)
    for h in range(H):
        yield p + f"v_b.{h}.weight", _matrix(kvb[h, dn:])


def mla_tensor_names(config: ModelConfig, p: str) -> list[str]:
    """The attention block's canonical tensors of an MLA layer under prefix p."""
    names = [p + "qkv.weight"]
    if config.q_lora_rank:
        names += [p + "q_a_norm.weight", p + "q_b.weight"]
    heads = range(config.num_heads)
    return (names + [p + "kv_a_norm.weight"] + [p + f"k_b.{h}.weight" for h in heads]
            + [p + f"v_b.{h}.weight" for h in heads] + [p + "o.weight"])


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, V, H = config.dim, config.vocab_size, config.num_heads
    dn, dr, dv, r, ql = (config.qk_nope_head_dim, config.head_dim, config.v_head_dim, config.kv_lora_rank,
                         config.q_lora_rank)
    dq = dn + dr
    routed = dataclasses.replace(config, shared_ffn_dim=0)
    yield "embed", stacked(ckpt, (("model.embed_tokens.weight", (V, E)),))
    for i in range(config.num_layers):
        h, p = f"model.layers.{i}.", f"layers.{i}."
        a = h + "self_attn."
        yield p + "attn_norm.weight", ckpt.read(h + "input_layernorm.weight", (E,))
        kv_a = (a + "kv_a_proj_with_mqa.weight", (r + dr, E))
        if ql:
            yield p + "qkv.weight", stacked(ckpt, ((a + "q_a_proj.weight", (ql, E)), kv_a))
            yield p + "q_a_norm.weight", ckpt.read(a + "q_a_layernorm.weight", (ql,))
            yield p + "q_b.weight", stacked(ckpt, ((a + "q_b_proj.weight", (H * dq, ql)),))
        else:
            yield p + "qkv.weight", stacked(ckpt, ((a + "q_proj.weight", (H * dq, E)), kv_a))
        yield p + "kv_a_norm.weight", ckpt.read(a + "kv_a_layernorm.weight", (r,))
        kv_b, kv_b_shape = a + "kv_b_proj", (H * (dn + dv), r)
        if hfquant.is_quantized_linear(ckpt, kv_b):
            # FP8 (DeepSeek-V3 / R1's released files), AWQ, GPTQ: each head's W_UV rows as stored,
            # its W_UK transposed from the dequantized rows in float32
            q = hfquant.QuantLinear(ckpt, kv_b, ckpt.quant, kv_b_shape)
            yield from _w_uk_heads(q.read_rows(0, kv_b_shape[0]), config, p)
            for hd in range(H):
                yield p + f"v_b.{hd}.weight", quantized_rows(q, hd * (dn + dv) + dn, dv)
        else:
            yield from _heads_of_kv_b(convert(ckpt.read(kv_b + ".weight", kv_b_shape), "float32"), config, p)
        yield p + "o.weight", stacked(ckpt, ((a + "o_proj.weight", (E, H * dv)),))
        yield p + "mlp_norm.weight", ckpt.read(h + "post_attention_layernorm.weight", (E,))
        m = h + "mlp."
        if i < config.first_dense_layers:
            F = config.dense_ffn_dim
            yield p + "gate_up.weight", stacked(ckpt, ((m + "gate_proj.weight", (F, E)), (m + "up_proj.weight", (F, E))))
            yield p + "down.weight", stacked(ckpt, ((m + "down_proj.weight", (E, F)),))
            continue
        yield from moe.hf_mlp(ckpt, routed, h, p, block="mlp.", names=("gate_proj", "up_proj", "down_proj"))
        if config.moe_routing == "grouped_sigmoid":
            bias = m + "gate.e_score_correction_bias"
            yield p + "router.correction_bias", (convert(ckpt.read(bias, (config.num_experts,)), "float32")
                                                 if bias in ckpt else np.zeros(config.num_experts, np.float32))
        if config.shared_ffn_dim:
            s, Fs = m + "shared_experts.", config.shared_ffn_dim
            yield p + "shared.gate_up.weight", stacked(ckpt, ((s + "gate_proj.weight", (Fs, E)),
                                                              (s + "up_proj.weight", (Fs, E))))
            yield p + "shared.down.weight", stacked(ckpt, ((s + "down_proj.weight", (E, Fs)),))
    yield "final_norm.weight", ckpt.read("model.norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", stacked(ckpt, (("lm_head.weight", (V, E)),))


# ---- GGUF ----------------------------------------------------------------------------------


def gguf_config(f, arch: str) -> ModelConfig:
    key = llama.gguf_key(f, arch)

    gating = int(key("expert_gating_func", GATING_SOFTMAX))
    if gating not in (GATING_SOFTMAX, GATING_SIGMOID):
        raise ModelLoadError(f"{f.path}: {arch}.expert_gating_func {gating} is not supported (1 softmax, 2 sigmoid)")
    H, dr = int(key("attention.head_count")), int(key("rope.dimension_count"))
    r, ql = int(key("attention.kv_lora_rank")), int(key("attention.q_lora_rank", 0))
    dq, dv = int(key("attention.key_length_mla")), int(key("attention.value_length_mla"))
    n_group = int(key("expert_group_count", 1) or 1)
    expert_ffn = int(key("expert_feed_forward_length"))
    fields = moe.gguf_fields(f, arch, norm_default=False)
    num_layers = int(key("block_count"))
    cfg = llama.gguf_decoder_config(
        f, arch, "DeepseekV3ForCausalLM" if gating == GATING_SIGMOID else GGUF_ARCHITECTURES[arch], head_dim=dr,
        num_kv_heads=H, qkv_bias=False, qk_norm=False, **fields,
        moe_routing="grouped_sigmoid" if gating == GATING_SIGMOID else "grouped_softmax", n_group=n_group,
        topk_group=int(key("expert_group_used_count", n_group) or n_group),
        routed_scale=float(key("expert_weights_scale", 1.0) or 1.0),
        shared_ffn_dim=int(key("expert_shared_count", 0)) * expert_ffn, shared_gate=False,
        first_dense_layers=min(int(key("leading_dense_block_count", 0)), num_layers),
        dense_ffn_dim=int(key("feed_forward_length")), kv_lora_rank=r, q_lora_rank=ql, qk_nope_head_dim=dq - dr,
        v_head_dim=dv, rope_interleave=True)
    if cfg.num_experts % cfg.n_group or not 0 < cfg.topk_group <= cfg.n_group or (r + dr) % 16:
        raise ModelLoadError(f"{f.path}: {cfg.num_experts} experts in {cfg.n_group} groups (best {cfg.topk_group}), "
                             f"latent rows of {r} + {dr}: not supported")
    if cfg.rope_scaling and cfg.rope_scaling.get("rope_type") == "yarn":
        m = float(key("rope.scaling.yarn_log_multiplier", 0.0) or 0.0) / 0.1
        if m:   # DeepSeek's configs give mscale = mscale_all_dim: cos / sin unscaled, the softmax scale mscale^2
            cfg = dataclasses.replace(cfg, rope_scaling={**cfg.rope_scaling, "mscale": m, "mscale_all_dim": m})
    return cfg


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, V, H = config.dim, config.vocab_size, config.num_heads
    dn, dr, dv, r, ql = (config.qk_nope_head_dim, config.head_dim, config.v_head_dim, config.kv_lora_rank,
                         config.q_lora_rank)
    matrix = moe._gguf_matrix
    routed = dataclasses.replace(config, shared_ffn_dim=0)

    def vec(name: str, shape: tuple[int, ...]) -> np.ndarray:
        f.info(name, shape)
        return np.asarray(f.read(name), np.float32)

    yield "embed", matrix(f, [("token_embd.weight", 0, V)], E)
    for i in range(config.num_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", vec(b + "attn_norm.weight", (E,))
        f.info(b + "attn_kv_a_mqa.weight", (r + dr, E))
        if ql:
            f.info(b + "attn_q_a.weight", (ql, E))
            f.info(b + "attn_q_b.weight", (H * (dn + dr), ql))
            yield p + "qkv.weight", matrix(f, [(b + "attn_q_a.weight", 0, ql), (b + "attn_kv_a_mqa.weight", 0, r + dr)], E)
            yield p + "q_a_norm.weight", vec(b + "attn_q_a_norm.weight", (ql,))
            yield p + "q_b.weight", matrix(f, [(b + "attn_q_b.weight", 0, H * (dn + dr))], ql)
        else:
            f.info(b + "attn_q.weight", (H * (dn + dr), E))
            yield p + "qkv.weight", matrix(f, [(b + "attn_q.weight", 0, H * (dn + dr)),
                                               (b + "attn_kv_a_mqa.weight", 0, r + dr)], E)
        yield p + "kv_a_norm.weight", vec(b + "attn_kv_a_norm.weight", (r,))
        if b + "attn_kv_b.weight" in f.tensors:   # W_UV rows as stored, W_UK transposed in float32
            kv_b = b + "attn_kv_b.weight"
            yield from _w_uk_heads(vec(kv_b, (H * (dn + dv), r)), config, p)
            for hd in range(H):
                yield p + f"v_b.{hd}.weight", matrix(f, [(kv_b, hd * (dn + dv) + dn, dv)], r)
        else:   # W_UK,h stored transposed beside W_UV,h: both as stored, a head's rows at a time
            f.info(b + "attn_k_b.weight", (H, r, dn))
            f.info(b + "attn_v_b.weight", (H, dv, r))
            for hd in range(H):
                yield p + f"k_b.{hd}.weight", matrix(f, [(b + "attn_k_b.weight", hd * r, r)], dn)
            for hd in range(H):
                yield p + f"v_b.{hd}.weight", matrix(f, [(b + "attn_v_b.weight", hd * dv, dv)], r)
        f.info(b + "attn_output.weight", (E, H * dv))
        yield p + "o.weight", matrix(f, [(b + "attn_output.weight", 0, E)], H * dv)
        yield p + "mlp_norm.weight", vec(b + "ffn_norm.weight", (E,))
        if i < config.first_dense_layers:
            F = config.dense_ffn_dim
            for name, shape in (("ffn_gate", (F, E)), ("ffn_up", (F, E)), ("ffn_down", (E, F))):
                f.info(b + name + ".weight", shape)
            yield p + "gate_up.weight", matrix(f, [(b + "ffn_gate.weight", 0, F), (b + "ffn_up.weight", 0, F)], E)
            yield p + "down.weight", matrix(f, [(b + "ffn_down.weight", 0, E)], F)
            continue
        yield from moe.gguf_mlp(f, routed, b, p)
        if config.moe_routing == "grouped_sigmoid":
            name = b + "exp_probs_b.bias"
            yield p + "router.correction_bias", (vec(name, (config.num_experts,)) if name in f.tensors
                                                 else np.zeros(config.num_experts, np.float32))
        if config.shared_ffn_dim:
            Fs = config.shared_ffn_dim
            for name, shape in (("ffn_gate_shexp", (Fs, E)), ("ffn_up_shexp", (Fs, E)), ("ffn_down_shexp", (E, Fs))):
                f.info(b + name + ".weight", shape)
            yield p + "shared.gate_up.weight", matrix(f, [(b + "ffn_gate_shexp.weight", 0, Fs),
                                                          (b + "ffn_up_shexp.weight", 0, Fs)], E)
            yield p + "shared.down.weight", matrix(f, [(b + "ffn_down_shexp.weight", 0, E)], Fs)
    yield "final_norm.weight", vec("output_norm.weight", (E,))
    if not config.tie_word_embeddings:
        f.info("output.weight", (V, E))
        yield "lm_head.weight", matrix(f, [("output.weight", 0, V)], E)
