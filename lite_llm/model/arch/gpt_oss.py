"""gpt-oss (HF GptOssForCausalLM): a mixture-of-experts decoder with

  - attention sinks: a learned logit per query head (self_attn.sinks) that joins every
    softmax's denominator and carries no value (canonical layers.{i}.sinks [H]);
  - sliding-window layers (sliding_window 128) alternating with full ones (layer_types);
  - YaRN RoPE (factor 32 over 4096 positions, truncate false: lite_llm/model/rope.py);
  - biases on q, k, v and o;
  - a router with a bias that takes the top num_experts_per_tok logits first and a softmax
    over those ("topk_softmax" routing);
  - experts with biases whose MLP is the clamped SwiGLU: g = min(gate, 7), u = clamp(up, -7, 7),
    (u + 1) g sigmoid(1.702 g) (act "swiglu_oai").

HF stores the experts fused and interleaved: mlp.experts.gate_up_proj [X, E, 2F] (x @ W, so
transposed against a Linear) whose columns alternate gate, up; gate_up_proj_bias [X, 2F] alike;
down_proj [X, F, E], down_proj_bias [X, E]. They are de-interleaved here into the canonical
gate rows then up rows ([2F, E]) per expert.

The released checkpoints store the experts in MXFP4 instead: gate_up_proj_blocks [X, 2F, E/32,
16] uint8 (two e2m1 values per byte, the low nibble first) with gate_up_proj_scales [X, 2F,
E/32] (e8m0: 2^(s - 127)), and down_proj_blocks / _scales [X, E, F/32, ...]; rows are output
features, gate and up rows interleaved. They run as stored, as ggml MXFP4 blocks (_MXFP4_STORED);
a build whose kernels lack that type dequantizes them at load (_mxfp4_rows).

llama.cpp's "gpt-oss" GGUF graph keeps the same model under its names: attn_sinks [H],
post_attention_norm (the MLP's norm), ffn_gate_inp (+ bias) the router, the experts split and
de-interleaved into ffn_gate_exps / ffn_up_exps [X, F, E] and ffn_down_exps [X, E, F], each with
a bias [X, F] / [X, E]; sliding layers on even layers (llama.cpp's pattern of 2); YaRN from
rope.scaling.*, not truncated (as gpt-oss's config.json says). Its MXFP4 expert tensors (ggml
type 39) load once lite_llm/model/gguf.py reads that type.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama, moe
from lite_llm.model.files import ModelLoadError
from lite_llm.model import gguf, hfquant
from lite_llm.model.hf import stacked
from lite_llm.model.weights import StackedRows

HF_ARCHITECTURES = ("GptOssForCausalLM",)
GGUF_ARCHITECTURES = {"gpt-oss": "GptOssForCausalLM"}
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0     # the kernels' LL_SWIGLU_OAI_* (src/kernels/act.h)

# e2m1 values of the 16 codes (sign in bit 3), as OCP's MX spec and transformers' MXFP4 tables
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      np.float32)

# MXFP4 experts kept as stored: the ggml block type name the kernels take them as (GGUF type
# 39, "MXFP4", in lite_llm/model/gguf.py NATIVE_TYPES); HF's blocks are handed to the packer as
# ggml blocks (hfquant.mxfp4_blocks: the same codes and exponents, nibbles reordered). Without it
# they would be dequantized to the engine dtype at load (bf16: 4x the stored bytes).
_MXFP4_STORED = "MXFP4"


def _layer_types(raw: dict, num_layers: int, where: str) -> tuple[str, ...]:
    """raw layer_types, or transformers' default: sliding on even layers, full on odd ones."""
    types = tuple(raw.get("layer_types") or ("sliding_attention" if (i + 1) % 2 else "full_attention"
                                              for i in range(num_layers)))
    if len(types) != num_layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise ModelLoadError(f"{where}: layer_types {list(types)} do not name {num_layers} layers "
                             "as sliding_attention / full_attention")
    return types


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    alpha, limit = float(raw.get("swiglu_alpha", SWIGLU_ALPHA)), float(raw.get("swiglu_limit", SWIGLU_LIMIT))
    if (alpha, limit) != (SWIGLU_ALPHA, SWIGLU_LIMIT):
        raise ModelLoadError(f"{where}: swiglu_alpha {alpha} / swiglu_limit {limit}: the kernels run "
                             f"gpt-oss's {SWIGLU_ALPHA} / {SWIGLU_LIMIT}")
    window = raw.get("sliding_window")
    fields = moe.hf_fields(raw, where, ffn_key="intermediate_size", norm_topk=False)
    return llama.decoder_config(
        raw, arch, where, act="swiglu_oai", sliding_window=int(window) if window else None,
        layer_types=_layer_types(raw, int(raw["num_hidden_layers"]), where),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        moe_routing="topk_softmax", expert_bias=True, attn_sinks=True, **fields)


# ---- HF tensors ----------------------------------------------------------------------------


class _Expert:
    """One expert's [rows, cols] matrix of a fused 3-D tensor, read whole once and kept while
    its parts are read (the gate rows, then the up rows)."""

    def __init__(self, read):
        self._read, self._value = read, None

    def __call__(self) -> np.ndarray:
        if self._value is None:
            self._value = self._read()
        return self._value

    def rows(self, select, a: int, b: int) -> np.ndarray:
        return np.ascontiguousarray(select(self())[a:b])


def _GATE_ROWS(w: np.ndarray) -> np.ndarray:
    return w[0::2]


def _UP_ROWS(w: np.ndarray) -> np.ndarray:
    return w[1::2]


def _ALL_ROWS(w: np.ndarray) -> np.ndarray:
    return w


def _deinterleave(expert: _Expert, F: int, cols: int, transposed: bool) -> StackedRows:
    """Canonical gate-then-up [2F, cols] of an expert whose gate and up alternate: as columns
    of [cols, 2F] (transposed: HF's bf16 parameter) or as rows of [2F, cols] (MXFP4's)."""
    if transposed:
        gate, up = (lambda w: w[:, 0::2].T), (lambda w: w[:, 1::2].T)
    else:
        gate, up = _GATE_ROWS, _UP_ROWS
    return StackedRows(((F, partial(expert.rows, gate)), (F, partial(expert.rows, up))), cols)


def _mxfp4_rows(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 [rows, 32 n] of MXFP4 blocks [rows, n, 16] uint8 and scales [rows, n] uint8."""
    lo, hi = FP4_VALUES[blocks & 0x0F], FP4_VALUES[blocks >> 4]
    values = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)        # low nibble first
    scale = np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127).astype(np.float32)
    return (values * scale[..., None]).reshape(blocks.shape[0], -1)


def _mxfp4_stored() -> bool:
    """Whether the kernels take MXFP4 blocks as stored (the MXFP4 block type is available)."""
    return _MXFP4_STORED in gguf.NATIVE_TYPES


def _mlp(ckpt, config: ModelConfig, h: str, p: str) -> Iterator[tuple[str, Any]]:
    E, F, X = config.dim, config.ffn_dim, config.num_experts
    m = h + "mlp."
    yield p + "router.weight", stacked(ckpt, ((m + "router.weight", (X, E)),))
    yield p + "router.bias", ckpt.read(m + "router.bias", (X,))
    x = m + "experts."
    mxfp4 = x + "gate_up_proj_blocks" in ckpt
    stored = mxfp4 and _mxfp4_stored()
    if mxfp4:
        ckpt.entry(x + "gate_up_proj_blocks", (X, 2 * F, E // 32, 16))
        ckpt.entry(x + "gate_up_proj_scales", (X, 2 * F, E // 32))
        ckpt.entry(x + "down_proj_blocks", (X, E, F // 32, 16))
        ckpt.entry(x + "down_proj_scales", (X, E, F // 32))
    else:
        ckpt.entry(x + "gate_up_proj", (X, E, 2 * F))
        ckpt.entry(x + "down_proj", (X, F, E))
    gate_up_bias = ckpt.read(x + "gate_up_proj_bias", (X, 2 * F))
    down_bias = ckpt.read(x + "down_proj_bias", (X, E))

    def mx(name: str, j: int, form=_mxfp4_rows) -> np.ndarray:
        return form(ckpt.read_rows(name + "_blocks", j, j + 1)[0], ckpt.read_rows(name + "_scales", j, j + 1)[0])

    def with_blocks(t: StackedRows, raw: _Expert, parts) -> StackedRows:
        """t, its parts also as ggml MXFP4 rows (selected from raw's as t's from the values)."""
        if not stored:
            return t
        return replace(t, blocks=tuple((_MXFP4_STORED, partial(raw.rows, select)) for select in parts))

    for j in range(X):
        if mxfp4:
            gate_up = _Expert(partial(mx, x + "gate_up_proj", j))
            down = _Expert(partial(mx, x + "down_proj", j))
            gate_up_raw = _Expert(partial(mx, x + "gate_up_proj", j, hfquant.mxfp4_blocks))
            down_raw = _Expert(partial(mx, x + "down_proj", j, hfquant.mxfp4_blocks))
            yield p + f"experts.{j}.gate_up.weight", with_blocks(_deinterleave(gate_up, F, E, transposed=False),
                                                                 gate_up_raw, (_GATE_ROWS, _UP_ROWS))
            yield p + f"experts.{j}.gate_up.bias", _bias(np.concatenate([gate_up_bias[j, 0::2], gate_up_bias[j, 1::2]]))
            yield p + f"experts.{j}.down.weight", with_blocks(StackedRows(((E, partial(down.rows, _ALL_ROWS)),), F),
                                                              down_raw, (_ALL_ROWS,))
        else:
            gate_up = _Expert(partial(lambda j: ckpt.read_rows(x + "gate_up_proj", j * E, (j + 1) * E, flat=True), j))
            down = _Expert(partial(lambda j: ckpt.read_rows(x + "down_proj", j * F, (j + 1) * F, flat=True), j))
            yield p + f"experts.{j}.gate_up.weight", _deinterleave(gate_up, F, E, transposed=True)
            yield p + f"experts.{j}.gate_up.bias", _bias(np.concatenate([gate_up_bias[j, 0::2], gate_up_bias[j, 1::2]]))
            yield p + f"experts.{j}.down.weight", StackedRows(((E, partial(down.rows, lambda w: w.T)),), F)
        yield p + f"experts.{j}.down.bias", _bias(down_bias[j])


def _bias(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x)


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    """llama.decoder_hf_tensors with the MoE MLP above and each layer's sinks after its o."""
    H = config.num_heads
    for name, t in llama.decoder_hf_tensors(ckpt, config, mlp=_mlp):
        yield name, t
        if name.endswith(".o.bias" if config.o_bias else ".o.weight"):
            i = name.split(".")[1]
            yield f"layers.{i}.sinks", ckpt.read(f"model.layers.{i}.self_attn.sinks", (H,))


# ---- GGUF ----------------------------------------------------------------------------------


def gguf_config(f, arch: str) -> ModelConfig:
    import dataclasses
    meta = f.metadata
    num_layers = int(meta.get(f"{arch}.block_count", 0))
    window = meta.get(f"{arch}.attention.sliding_window")
    layer_types = tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers))
    cfg = llama.gguf_decoder_config(
        f, arch, GGUF_ARCHITECTURES[arch], act="swiglu_oai", sliding_window=int(window) if window else None,
        layer_types=layer_types, o_bias="blk.0.attn_output.bias" in f.tensors, moe_routing="topk_softmax",
        expert_bias=True, attn_sinks=True, **moe.gguf_fields(f, arch, norm_default=False))
    if cfg.rope_scaling and cfg.rope_scaling.get("rope_type") == "yarn":
        cfg = dataclasses.replace(cfg, rope_scaling={**cfg.rope_scaling, "truncate": False})
    return cfg


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    H, Hkv, D, E, F, X = (config.num_heads, config.num_kv_heads, config.head_dim, config.dim, config.ffn_dim,
                          config.num_experts)
    matrix = moe._gguf_matrix

    def vec(name: str, shape: tuple[int, ...]) -> np.ndarray:
        f.info(name, shape)
        return np.asarray(f.read(name), np.float32)

    yield "embed", matrix(f, [("token_embd.weight", 0, config.vocab_size)], E)
    for i in range(config.num_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", vec(b + "attn_norm.weight", (E,))
        for name, rows in (("attn_q", H * D), ("attn_k", Hkv * D), ("attn_v", Hkv * D)):
            f.info(b + name + ".weight", (rows, E))
        yield p + "qkv.weight", matrix(f, [(b + "attn_q.weight", 0, H * D), (b + "attn_k.weight", 0, Hkv * D),
                                           (b + "attn_v.weight", 0, Hkv * D)], E)
        if config.qkv_bias:
            yield p + "qkv.bias", np.concatenate([vec(b + "attn_q.bias", (H * D,)), vec(b + "attn_k.bias", (Hkv * D,)),
                                                  vec(b + "attn_v.bias", (Hkv * D,))])
        f.info(b + "attn_output.weight", (E, H * D))
        yield p + "o.weight", matrix(f, [(b + "attn_output.weight", 0, E)], H * D)
        if config.o_bias:
            yield p + "o.bias", vec(b + "attn_output.bias", (E,))
        yield p + "sinks", vec(b + "attn_sinks.weight", (H,))
        yield p + "mlp_norm.weight", vec(b + "post_attention_norm.weight", (E,))
        f.info(b + "ffn_gate_inp.weight", (X, E))
        yield p + "router.weight", matrix(f, [(b + "ffn_gate_inp.weight", 0, X)], E)
        yield p + "router.bias", vec(b + "ffn_gate_inp.bias", (X,))
        f.info(b + "ffn_gate_exps.weight", (X, F, E))
        f.info(b + "ffn_up_exps.weight", (X, F, E))
        f.info(b + "ffn_down_exps.weight", (X, E, F))
        gate_b, up_b = vec(b + "ffn_gate_exps.bias", (X, F)), vec(b + "ffn_up_exps.bias", (X, F))
        down_b = vec(b + "ffn_down_exps.bias", (X, E))
        for j in range(X):
            yield p + f"experts.{j}.gate_up.weight", matrix(
                f, [(b + "ffn_gate_exps.weight", j * F, F), (b + "ffn_up_exps.weight", j * F, F)], E)
            yield p + f"experts.{j}.gate_up.bias", np.concatenate([gate_b[j], up_b[j]])
            yield p + f"experts.{j}.down.weight", matrix(f, [(b + "ffn_down_exps.weight", j * E, E)], F)
            yield p + f"experts.{j}.down.bias", np.ascontiguousarray(down_b[j])
    yield "final_norm.weight", vec("output_norm.weight", (E,))
    if not config.tie_word_embeddings:
        f.info("output.weight", (config.vocab_size, E))
        yield "lm_head.weight", matrix(f, [("output.weight", 0, config.vocab_size)], E)
