"""DeepSeek-V2 / V3 (HF DeepseekV2ForCausalLM / DeepseekV3ForCausalLM; DeepSeek-V2-Lite,
V2, V2.5, V3, R1, Kimi K2 share the graph): multi-head latent attention and DeepSeek's MoE.

Attention (MLA). Per token, kv_a_proj_with_mqa gives a latent c of kv_lora_rank values (then
kv_a_layernorm) and one RoPE key k_pe of qk_rope_head_dim values shared by every head;
kv_b_proj [H (dn + dv), r] expands c into each head's k_nope (dn rows, W_UK,h) and value (dv
rows, W_UV,h). The query comes from x (q_proj, V2-Lite) or from a latent of q_lora_rank values
(q_a_proj, q_a_layernorm, q_b_proj), each head's dn + dr components split into q_nope, q_pe.
Scores scale by (dn + dr)^-0.5, times mscale^2 under YaRN with mscale_all_dim, as transformers.

Here the cache holds only [c, k_pe] per token (kv_lora_rank + qk_rope_head_dim values, one
row for all heads: src/kernels/mla.h), and the up-projections are absorbed into the weights
at load (the "absorbed" form of DeepSeek's and ik_llama.cpp's MLA modes), computed in float64:

    q rows of head h   [W_UK,h^T W_q_nope,h ; W_q_pe,h]        (r + dr rows) -> q . [c, k_pe]
    o columns of head h  W_o[:, h dv:(h + 1) dv] W_UV,h       ([E, r]: o reads the latent output)

so attention reads r + dr values per cached token and head-free, and q / o are H (r + dr) / H r
wide instead of H (dn + dr) / H dv. The RoPE parts are stored interleaved (DeepSeek's complex
pairs; V3 with rope_interleave false: halves): their rows are permuted to the halves order the
kernels rotate (the same permutation on q_pe and k_pe leaves q_pe . k_pe unchanged).

Canonical tensors of layer i (besides the norms and the MLP):
    qkv.weight      [H (r + dr) + r + dr, E] absorbed q then kv_a (no q latent), or
                    [ql + r + dr, E] q_a then kv_a
    q_a_norm.weight [ql], q_b.weight [H (r + dr), ql] absorbed (q latent only)
    kv_a_norm.weight [r]
    o.weight        [E, H r] absorbed

MoE: the first first_k_dense_replace layers are dense (intermediate_size); the others route
n_routed_experts of moe_intermediate_size (V2: softmax, greedy or group_limited_greedy over
n_group groups; V3: sigmoid with e_score_correction_bias, the best topk_group of n_group groups by
their two best scores), weights x routed_scaling_factor (V3 renormalised first when
norm_topk_prob), plus n_shared_experts shared experts run as one ungated MLP of
n_shared_experts x moe_intermediate_size features. transformers' V2 router never renormalises
(V2's released configs have norm_topk_prob false): it is followed here when the config asks.
Multi-token prediction layers (V3's num_nextn_predict_layers, stored as extra layers past
num_hidden_layers) are not loaded.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama, moe
from lite_llm.model.files import ModelLoadError
from lite_llm.model.hf import stacked
from lite_llm.model.weights import StackedRows, convert

HF_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")


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


def _halves(dr: int) -> np.ndarray:
    """Row order taking interleaved RoPE pairs (x0, x1), (x2, x3), ... to halves (x0, x2, ... |
    x1, x3, ...)."""
    return np.concatenate([np.arange(0, dr, 2), np.arange(1, dr, 2)])


def _matrix(a: np.ndarray) -> StackedRows:
    a = np.ascontiguousarray(a, np.float32)
    return StackedRows(((a.shape[0], lambda r0, r1: a[r0:r1]),), a.shape[1])


def _f64(ckpt, name: str, shape: tuple[int, ...]) -> np.ndarray:
    return convert(ckpt.read(name, shape), "float32").astype(np.float64)


def absorbed_attention(q: np.ndarray, kv_b: np.ndarray, o: np.ndarray, kv_a: np.ndarray, config: ModelConfig,
                       rope_interleave: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(absorbed q [H (r + dr), K], kv_a with its RoPE rows in halves order [r + dr, E],
    absorbed o [E, H r]) from q [H (dn + dr), K] (q_proj or q_b_proj), kv_b_proj [H (dn + dv), r],
    o_proj [E, H dv] and kv_a_proj_with_mqa [r + dr, E]."""
    H, dn, dr, dv, r = (config.num_heads, config.qk_nope_head_dim, config.head_dim, config.v_head_dim,
                        config.kv_lora_rank)
    perm = _halves(dr) if rope_interleave else np.arange(dr)
    qh = q.reshape(H, dn + dr, -1)
    kvb = kv_b.reshape(H, dn + dv, r)
    w_uk, w_uv = kvb[:, :dn], kvb[:, dn:]                        # [H, dn, r], [H, dv, r]
    q_abs = np.einsum("hnr,hnk->hrk", w_uk, qh[:, :dn])          # W_UK,h^T W_q_nope,h
    q_out = np.concatenate([q_abs, qh[:, dn:][:, perm]], axis=1).reshape(H * (r + dr), -1)
    E = o.shape[0]
    o_abs = np.einsum("ehv,hvr->ehr", o.reshape(E, H, dv), w_uv).reshape(E, H * r)
    kv_out = np.concatenate([kv_a[:r], kv_a[r:][perm]])
    return q_out, kv_out, o_abs


def mla_tensor_names(config: ModelConfig, p: str) -> list[str]:
    """The attention block's canonical tensors of an MLA layer under prefix p."""
    names = [p + "qkv.weight"]
    if config.q_lora_rank:
        names += [p + "q_a_norm.weight", p + "q_b.weight"]
    return names + [p + "kv_a_norm.weight", p + "o.weight"]


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
        kv_b = _f64(ckpt, a + "kv_b_proj.weight", (H * (dn + dv), r))
        o = _f64(ckpt, a + "o_proj.weight", (E, H * dv))
        kv_a = _f64(ckpt, a + "kv_a_proj_with_mqa.weight", (r + dr, E))
        q = (_f64(ckpt, a + "q_b_proj.weight", (H * dq, ql)) if ql else _f64(ckpt, a + "q_proj.weight", (H * dq, E)))
        q_abs, kv_a, o_abs = absorbed_attention(q, kv_b, o, kv_a, config, config.rope_interleave)
        if ql:
            q_a = _f64(ckpt, a + "q_a_proj.weight", (ql, E))
            yield p + "qkv.weight", _matrix(np.concatenate([q_a, kv_a]))
            yield p + "q_a_norm.weight", ckpt.read(a + "q_a_layernorm.weight", (ql,))
            yield p + "q_b.weight", _matrix(q_abs)
        else:
            yield p + "qkv.weight", _matrix(np.concatenate([q_abs, kv_a]))
        yield p + "kv_a_norm.weight", ckpt.read(a + "kv_a_layernorm.weight", (r,))
        yield p + "o.weight", _matrix(o_abs)
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
