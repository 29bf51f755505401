"""Qwen3-Next (HF Qwen3NextForCausalLM): a hybrid decoder of Gated DeltaNet layers
("linear_attention" in layer_types) and gated attention layers ("full_attention"), each
followed by a mixture of experts with a gated shared expert (Qwen2-MoE's, moe.py). Every
RMSNorm but the DeltaNet's gated one scales by (1 + w) (the offset is added at load).

A Gated DeltaNet layer ("deltanet" in ModelConfig.layer_types), Hk key heads of Dk, Hv value
heads of Dv (each key head serves Hv / Hk value heads):

    in_proj [2 Hk Dk + 2 Hv Dv + 2 Hv, E] -> q | k | v | z | b | a   (the checkpoint interleaves
        them per key head in in_proj_qkvz and in_proj_ba; the rows are reordered at load)
    q | k | v = silu(causal depthwise conv of linear_conv_kernel_dim taps, no bias)
    q = l2norm(q) / sqrt(Dk), k = l2norm(k) per head;  beta = sigmoid(b),
    g = -exp(A_log) softplus(a + dt_bias);  per value head, state S [Dk, Dv]:
        S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q
    out_proj(rmsnorm(o) x norm.weight x silu(z), per value head)

A gated attention layer: q_proj gives each head's query, then its gate (reordered at load to
q | k | v | gate rows of qkv); q / k RMSNorm; RoPE over the first partial_rotary_factor of
each head; o_proj(attention x sigmoid(gate)).

The DeltaNet state per sequence is the conv's last taps - 1 inputs and S of every value head
(runner.py); the rule runs chunked (src/kernels/delta.h). What the layers compute: forward.pxi's
_deltanet_block and _step. The multi-token-prediction weights (mtp.*) are not read.

llama.cpp's "qwen3next" graph (its converter's Qwen3NextModel) keeps the kinds of layers as
full_attention_interval (every interval-th layer attention), the DeltaNet's shape as ssm.group_count
(Hk), ssm.time_step_rank (Hv), ssm.state_size (Dk), ssm.inner_size (Hv Dv) and ssm.conv_kernel,
and RoPE's share of a head as rope.dimension_count. It stores every (1 + w) norm with its + 1
(the DeltaNet's gated ssm_norm as it is), the MLP's norm as post_attention_norm, q_proj whole as
attn_q; a DeltaNet layer's in_proj_qkvz cut into attn_qkv (q, k, v of all heads) and attn_gate
(z), or, from earlier converters, whole as ssm_in (interleaved per key head as in the checkpoint);
in_proj_ba as ssm_ba, the conv taps as ssm_conv1d [Cd, L], ssm_a (-exp(A_log)), ssm_dt.bias and
ssm_out; the experts as moe.py reads them. (llama.cpp itself assumes Dv = Dk.)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama, moe
from lite_llm.model.arch.moe import _gguf_matrix
from lite_llm.model.files import ModelLoadError
from lite_llm.model.gguf import NATIVE_TYPES
from lite_llm.model.hf import stacked
from lite_llm.model.weights import StackedRows, bf16_to_f32

HF_ARCHITECTURES = ("Qwen3NextForCausalLM",)
GGUF_ARCHITECTURES = {"qwen3next": "Qwen3NextForCausalLM"}
# file tensors left unread (arch/__init__.py unread_tensors): (pattern, reason)
HF_UNREAD = ((r"mtp\..+", "the multi-token-prediction head: it drafts tokens for speculative decoding, the model's "
                           "own logits do not use it"),)
_KINDS = {"linear_attention": "deltanet", "full_attention": "full_attention"}


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if not types:
        every = int(raw.get("full_attention_interval", 4))
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if len(types) != n or any(t not in _KINDS for t in types):
        raise ModelLoadError(f"{where}: layer_types {types}: expected {n} of {', '.join(_KINDS)}")
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    partial = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor") or 0.25))
    hk, hv = int(raw["linear_num_key_heads"]), int(raw["linear_num_value_heads"])
    if hv % hk:
        raise ModelLoadError(f"{where}: linear_num_value_heads {hv} is not a multiple of linear_num_key_heads {hk}")
    if not raw.get("shared_expert_intermediate_size") or not raw.get("num_experts"):
        raise ModelLoadError(f"{where}: Qwen3-Next without experts or without a shared expert is not supported")
    return llama.decoder_config(
        raw, arch, where, layer_types=tuple(_KINDS[t] for t in types), qk_norm=True, attn_output_gate=True,
        partial_rotary_factor=partial, linear_num_key_heads=hk, linear_num_value_heads=hv,
        linear_key_head_dim=int(raw["linear_key_head_dim"]), linear_value_head_dim=int(raw["linear_value_head_dim"]),
        linear_conv_kernel_dim=int(raw.get("linear_conv_kernel_dim", 4)),
        **moe.hf_fields(raw, where, ffn_key="moe_intermediate_size", norm_topk=None, shared=True))


def tensor_names(config: ModelConfig) -> list[str]:
    """The canonical tensors hf_tensors yields, in order: a DeltaNet layer has in_proj, conv.weight
    [L, Cd] (taps channel-minor), ssm_a (= -exp(A_log)), dt_bias, gnorm.weight [Dv] and out_proj
    where an attention layer has qkv (q | k | v | gate rows), q_norm, k_norm and o."""
    names = ["embed"]
    for i in range(config.num_layers):
        p = f"layers.{i}."
        names.append(p + "attn_norm.weight")
        if config.layer_types[i] == "deltanet":
            names += [p + "in_proj.weight", p + "conv.weight", p + "ssm_a", p + "dt_bias", p + "gnorm.weight",
                      p + "out_proj.weight"]
        else:
            names += [p + "qkv.weight", p + "q_norm.weight", p + "k_norm.weight", p + "o.weight"]
        names += [p + "mlp_norm.weight", p + "router.weight"]   # the experts as moe.py yields them
        for j in range(config.num_experts):
            names += [p + f"experts.{j}.gate_up.weight", p + f"experts.{j}.down.weight"]
        names += [p + "shared.gate_up.weight", p + "shared.down.weight", p + "shared_gate.weight"]
    names.append("final_norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def _f32(a: np.ndarray) -> np.ndarray:
    return bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)


def _gathered(ckpt, runs: list[tuple[str, int, int]], cols: int) -> StackedRows:
    """StackedRows of row ranges (tensor, first row, rows) of 2-D tensors, in that order, as one
    part: a reader of canonical rows a..b reads the ranges they fall in."""
    starts = np.cumsum([0] + [r[2] for r in runs])

    def read(a: int, b: int) -> np.ndarray:
        out = []
        for (name, r0, n), s in zip(runs, starts):
            lo, hi = max(a, s), min(b, s + n)
            if lo < hi:
                out.append(ckpt.read_rows(name, r0 + lo - s, r0 + hi - s))
        return np.concatenate(out)
    return StackedRows(((int(starts[-1]), read),), cols)


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, V, D, H, Hkv = config.dim, config.vocab_size, config.head_dim, config.num_heads, config.num_kv_heads
    Hk, Hv = config.linear_num_key_heads, config.linear_num_value_heads
    Dk, Dv, L = config.linear_key_head_dim, config.linear_value_head_dim, config.linear_conv_kernel_dim
    r, Cd = Hv // Hk, config.deltanet_conv_dim
    get = ckpt.read

    def norm(name: str, n: int) -> np.ndarray:   # (1 + w)
        return _f32(get(name, (n,))) + np.float32(1.0)

    yield "embed", stacked(ckpt, (("model.embed_tokens.weight", (V, E)),))
    for i in range(config.num_layers):
        h, p = f"model.layers.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", norm(h + "input_layernorm.weight", E)
        if config.layer_types[i] == "deltanet":
            m = h + "linear_attn."
            qkvz, ba = m + "in_proj_qkvz.weight", m + "in_proj_ba.weight"
            w = 2 * Dk + 2 * r * Dv                 # rows of one key head's group: q, k, its v heads, their z
            ckpt.entry(qkvz, (Hk * w, E))
            ckpt.entry(ba, (2 * Hv, E))
            runs = [(qkvz, g * w + off, n) for off, n in ((0, Dk), (Dk, Dk), (2 * Dk, r * Dv), (2 * Dk + r * Dv, r * Dv))
                    for g in range(Hk)]
            runs += [(ba, g * 2 * r + off, r) for off in (0, r) for g in range(Hk)]
            yield p + "in_proj.weight", _gathered(ckpt, runs, E)
            # [Cd, 1, L] in the file; the kernel reads tap k of every channel as one row
            yield p + "conv.weight", np.ascontiguousarray(_f32(get(m + "conv1d.weight", (Cd, 1, L))).reshape(Cd, L).T)
            yield p + "ssm_a", -np.exp(_f32(get(m + "A_log", (Hv,))))   # in fp32, as transformers
            yield p + "dt_bias", _f32(get(m + "dt_bias", (Hv,)))
            yield p + "gnorm.weight", get(m + "norm.weight", (Dv,))
            yield p + "out_proj.weight", stacked(ckpt, ((m + "out_proj.weight", (E, Hv * Dv)),))
        else:
            a = h + "self_attn."
            qp = a + "q_proj.weight"
            ckpt.entry(qp, (2 * H * D, E))
            runs = [(qp, 2 * j * D, D) for j in range(H)] + [(a + "k_proj.weight", 0, Hkv * D),
                                                             (a + "v_proj.weight", 0, Hkv * D)]
            ckpt.entry(a + "k_proj.weight", (Hkv * D, E))
            ckpt.entry(a + "v_proj.weight", (Hkv * D, E))
            runs += [(qp, 2 * j * D + D, D) for j in range(H)]
            yield p + "qkv.weight", _gathered(ckpt, runs, E)
            yield p + "q_norm.weight", norm(a + "q_norm.weight", D)
            yield p + "k_norm.weight", norm(a + "k_norm.weight", D)
            yield p + "o.weight", stacked(ckpt, ((a + "o_proj.weight", (E, H * D)),))
        yield p + "mlp_norm.weight", norm(h + "post_attention_layernorm.weight", E)
        yield from moe.hf_mlp(ckpt, config, h, p, block="mlp.", names=("gate_proj", "up_proj", "down_proj"),
                              shared="shared_expert")
    yield "final_norm.weight", norm("model.norm.weight", E)
    if not config.tie_word_embeddings:
        yield "lm_head.weight", stacked(ckpt, (("lm_head.weight", (V, E)),))


# ---- GGUF --------------------------------------------------------------------------------


def gguf_config(f, arch: str) -> ModelConfig:
    meta, key = f.metadata, llama.gguf_key(f, arch)
    n, every = int(key("block_count")), int(key("full_attention_interval"))
    if every < 1:
        raise ModelLoadError(f"{f.path}: {arch}.full_attention_interval {every} must be at least 1")
    types = tuple("deltanet" if (i + 1) % every else "full_attention" for i in range(n))
    hk, hv, inner = int(key("ssm.group_count")), int(key("ssm.time_step_rank")), int(key("ssm.inner_size"))
    if not hk or not hv or hv % hk or inner % hv:
        raise ModelLoadError(f"{f.path}: {arch}: {hv} value heads (ssm.time_step_rank) over {hk} key heads "
                             f"(ssm.group_count) and ssm.inner_size {inner}")
    config = llama.gguf_decoder_config(
        f, arch, GGUF_ARCHITECTURES[arch], layer_types=types, qk_norm=True, attn_output_gate=True,
        linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=int(key("ssm.state_size")),
        linear_value_head_dim=inner // hv, linear_conv_kernel_dim=int(key("ssm.conv_kernel")),
        **moe.gguf_fields(f, arch, norm_default=True, shared=True))
    if not config.shared_ffn_dim:
        raise ModelLoadError(f"{f.path}: Qwen3-Next without a shared expert is not supported")
    rotated = int(meta.get(f"{arch}.rope.dimension_count", config.head_dim))
    if not 0 < rotated <= config.head_dim or rotated % 2:
        raise ModelLoadError(f"{f.path}: {arch}.rope.dimension_count {rotated} of heads of {config.head_dim}")
    return dataclasses.replace(config, partial_rotary_factor=rotated / config.head_dim)


def _gguf_gathered(f, runs: list[tuple[str, int, int]], cols: int) -> StackedRows:
    """StackedRows of row ranges (tensor, first row, rows) of 2-D GGUF tensors, in that order, as
    one part (the kernels take a matrix in a few parts): its blocks as stored when every range is
    of one type the kernels run, else read dequantized."""
    starts = np.cumsum([0] + [n for _, _, n in runs])

    def gathered(read):
        def rows(a: int, b: int) -> np.ndarray:
            out = []
            for (name, r0, n), s in zip(runs, starts):
                lo, hi = max(a, s), min(b, s + n)
                if lo < hi:
                    out.append(read(name, r0 + lo - s, r0 + hi - s))
            return np.concatenate(out)
        return rows
    types = {f.tensors[name].type_name for name, _, _ in runs}
    native = len(types) == 1 and next(iter(types)) in NATIVE_TYPES
    return StackedRows(((int(starts[-1]), gathered(f.read_rows)),), cols,
                       blocks=((next(iter(types)), gathered(f.read_raw_rows)),) if native else None)


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, V, D, H, Hkv = config.dim, config.vocab_size, config.head_dim, config.num_heads, config.num_kv_heads
    Hk, Hv = config.linear_num_key_heads, config.linear_num_value_heads
    Dk, Dv, L = config.linear_key_head_dim, config.linear_value_head_dim, config.linear_conv_kernel_dim
    r, Cd = Hv // Hk, config.deltanet_conv_dim

    def vec(name: str, shape: tuple[int, ...]) -> np.ndarray:   # norms: stored with their + 1 already
        f.info(name, shape)
        return np.asarray(f.read(name), np.float32)

    def rows(name: str, shape: tuple[int, int], runs: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
        f.info(name, shape)
        return [(name, r0, count) for r0, count in runs]

    yield "embed", _gguf_matrix(f, rows("token_embd.weight", (V, E), [(0, V)]), E)
    for i in range(config.num_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", vec(b + "attn_norm.weight", (E,))
        if config.layer_types[i] == "deltanet":
            if b + "attn_qkv.weight" in f.tensors:
                runs = rows(b + "attn_qkv.weight", (Cd, E), [(0, Cd)]) + rows(b + "attn_gate.weight", (Hv * Dv, E),
                                                                             [(0, Hv * Dv)])
            else:   # one key head's group after another: its q, k, v heads, their z
                w = 2 * Dk + 2 * r * Dv
                runs = rows(b + "ssm_in.weight", (Hk * w, E), [(g * w + off, count) for off, count in (
                    (0, Dk), (Dk, Dk), (2 * Dk, r * Dv), (2 * Dk + r * Dv, r * Dv)) for g in range(Hk)])
            runs += rows(b + "ssm_ba.weight", (2 * Hv, E), [(g * 2 * r + off, r) for off in (0, r) for g in range(Hk)])
            yield p + "in_proj.weight", _gguf_gathered(f, runs, E)
            yield p + "conv.weight", np.ascontiguousarray(vec(b + "ssm_conv1d.weight", (Cd, L)).T)   # taps channel-minor
            yield p + "ssm_a", vec(b + "ssm_a", (Hv,))
            yield p + "dt_bias", vec(b + "ssm_dt.bias", (Hv,))
            yield p + "gnorm.weight", vec(b + "ssm_norm.weight", (Dv,))
            yield p + "out_proj.weight", _gguf_matrix(f, rows(b + "ssm_out.weight", (E, Hv * Dv), [(0, E)]), Hv * Dv)
        else:   # attn_q: each head's query, then its gate -> q | k | v | gate rows
            q = b + "attn_q.weight"
            runs = (rows(q, (2 * H * D, E), [(2 * j * D, D) for j in range(H)])
                    + rows(b + "attn_k.weight", (Hkv * D, E), [(0, Hkv * D)])
                    + rows(b + "attn_v.weight", (Hkv * D, E), [(0, Hkv * D)])
                    + rows(q, (2 * H * D, E), [(2 * j * D + D, D) for j in range(H)]))
            yield p + "qkv.weight", _gguf_gathered(f, runs, E)
            yield p + "q_norm.weight", vec(b + "attn_q_norm.weight", (D,))
            yield p + "k_norm.weight", vec(b + "attn_k_norm.weight", (D,))
            yield p + "o.weight", _gguf_matrix(f, rows(b + "attn_output.weight", (E, H * D), [(0, E)]), H * D)
        yield p + "mlp_norm.weight", vec(b + "post_attention_norm.weight", (E,))
        yield from moe.gguf_mlp(f, config, b, p)
    yield "final_norm.weight", vec("output_norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", _gguf_matrix(f, rows("output.weight", (V, E), [(0, V)]), E)
