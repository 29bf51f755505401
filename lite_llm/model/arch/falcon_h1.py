"""Falcon-H1 (HF FalconH1ForCausalLM): every decoder layer runs a Mamba2 mixer (Bamba's, bamba.py)
and Llama attention side by side on the same normed input and adds both into the residual, then
a SwiGLU MLP with its own norm:

    h = rmsnorm(x);  x += ssm_out x mamba(ssm_in x h) + attn_out x attention(attn_in x h)
    x += mlp(rmsnorm(x))

A layer here is two layers of ModelConfig: its Mamba2 mixer alone (no MLP: no_mlp_layers), then
its attention and MLP, which reads the rows the mixer read (shared_input_layers: forward.pxi
reuses the mixer's normed rows instead of norming x again, both mixers adding into x).

The µP multipliers, as transformers' modeling_falcon_h1 applies them:

    embedding_multiplier     the embedding rows (ModelConfig.embedding_multiplier)
    lm_head_multiplier       the logits (ModelConfig.logits_scaling = 1 / it)
    attention_in_multiplier  attention's input: q, k, v weights (not their biases)
    key_multiplier           k's output: k's weight and bias (before RoPE, which is linear)
    attention_out_multiplier o's output: o's weight and bias
    ssm_in_multiplier        the mixer's input: in_proj's weight (not its bias)
    ssm_multipliers          in_proj's output by segment (transformers' mup_vector): z, x, B, C, dt
                             rows, weight and bias
    ssm_out_multiplier       the mixer's output: out_proj's weight and bias
    mlp_multipliers          [gate, down]: the gate rows' output (weight and bias), down's output

each a scale of a projection's rows or of its input, so folded into the weights at load (exact
up to one rounding of the scaled weight). The gated norm is optional (mamba_rms_norm false:
y * silu(z) unnormed) and normalises before or after the gate (mamba_norm_before_gate);
mamba_d_ssm sets the mixer's width apart from hidden_size; in_proj's bias is mamba_proj_bias,
out_proj's projectors_bias.

llama.cpp's "falcon-h1" graph (its converter's FalconH1Model) keeps one block per layer with
Granite 4.0-H's ssm_* tensors (granite_hybrid.py) beside attn_q / attn_k / attn_v / attn_output
(q/k rows as in the checkpoint: it rotates NeoX-style), ffn_norm and the MLP; every multiplier
folded into the tensors by the converter (the embeddings' into token_embd, the logits' into
output), no ssm_norm when the model has no gated norm, which it applies after the gate. llama.cpp
reads the MLP's norm as "blk.N.ffn_norm", without ".weight" (either is read here).
"""
from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import bamba, llama
from lite_llm.model.arch.lfm2 import _gguf_rows
from lite_llm.model.files import ModelLoadError
from lite_llm.model.hf import read_config_json, stacked
from lite_llm.model.weights import StackedRows, convert

HF_ARCHITECTURES = ("FalconH1ForCausalLM",)
GGUF_ARCHITECTURES = {"falcon-h1": "FalconH1ForCausalLM"}


def _mamba_fields(raw: dict, where: str) -> dict[str, Any]:
    dim = int(raw["hidden_size"])
    heads = int(raw.get("mamba_n_heads", 128))
    inner = raw.get("mamba_d_ssm")
    inner = int(inner) if inner is not None else int(raw.get("mamba_expand", 2)) * dim
    d_head = raw.get("mamba_d_head", "auto")
    d_head = inner // heads if d_head in (None, "auto") else int(d_head)
    if d_head * heads != inner:
        raise ModelLoadError(f"{where}: mamba_n_heads {heads} x mamba_d_head {d_head} != the mixer's width {inner} "
                             "(mamba_d_ssm, or mamba_expand x hidden_size)")
    limit = raw.get("time_step_limit")
    if limit is not None and (bamba._number(limit[0]) > 0.0 or not math.isinf(bamba._number(limit[1]))):
        raise ModelLoadError(f"{where}: time_step_limit {list(limit)} is not supported (only (0, inf))")
    if not raw.get("mamba_rms_norm", False):
        norm = "none"
    else:
        norm = "before_gate" if raw.get("mamba_norm_before_gate", True) else "after_gate"
    return dict(mamba_n_heads=heads, mamba_d_head=d_head, mamba_n_groups=int(raw.get("mamba_n_groups", 1)),
                mamba_d_state=int(raw.get("mamba_d_state", 256)), mamba_d_conv=int(raw.get("mamba_d_conv", 4)),
                mamba_conv_bias=bool(raw.get("mamba_conv_bias", True)),
                mamba_proj_bias=bool(raw.get("mamba_proj_bias", False)), mamba_norm=norm,
                mamba_out_bias=bool(raw.get("projectors_bias", False)))


def _pairs(n: int) -> dict[str, Any]:
    """The layer fields of n Falcon-H1 layers as 2 n layers: Mamba2 alone, then attention + MLP on its rows."""
    return dict(num_layers=2 * n, layer_types=("mamba", "full_attention") * n,
                no_mlp_layers=tuple(range(0, 2 * n, 2)), shared_input_layers=tuple(range(1, 2 * n, 2)))


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{where}: hidden_act {raw['hidden_act']!r} is not supported (silu: the MLP's "
                             "and the Mamba2 convolution's activation)")
    lm_head = float(raw.get("lm_head_multiplier", 1.0))
    if lm_head == 0.0:
        raise ModelLoadError(f"{where}: lm_head_multiplier 0 gives no logits")
    return llama.decoder_config(
        raw, arch, where, **_pairs(int(raw["num_hidden_layers"])),
        embedding_multiplier=float(raw.get("embedding_multiplier", 1.0)), logits_scaling=1.0 / lm_head,
        **_mamba_fields(raw, where))


def _scaled(w: StackedRows, scales: tuple[float | np.ndarray, ...]) -> StackedRows:
    """w with part i's rows times scales[i], one number or one per row (read in float32, scaled,
    then converted to the engine dtype as any rows); a part scaled by 1 is left as stored."""
    assert len(scales) == len(w.parts)

    def reader(read, s):
        if isinstance(s, np.ndarray):
            return lambda a, b: convert(read(a, b), "float32") * s[a:b, None]
        return lambda a, b: convert(read(a, b), "float32") * np.float32(s)
    same = [not isinstance(s, np.ndarray) and s == 1.0 for s in scales]
    return StackedRows(tuple((n, read if keep else reader(read, s)) for (n, read), s, keep in zip(w.parts, scales, same)),
                       w.cols, w.align, w.dtype,
                       blocks=tuple(b if keep else None for b, keep in zip(w.blocks or (None,) * len(scales), same)),
                       stored=tuple(p if keep else None for p, keep in zip(w.stored or (None,) * len(scales), same)))


def _vec(a: np.ndarray, s: float) -> np.ndarray:
    """A stored vector (bf16 as its bits) in float32, times s."""
    return convert(a, "float32") * np.float32(s)


def _mult(raw: dict, name: str) -> float:
    value = raw.get(name)
    return 1.0 if value is None else float(value)


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    raw = read_config_json(ckpt.path)   # the multipliers, folded into the weights here (ModelConfig has none of them)
    E, F, V = config.dim, config.ffn_dim, config.vocab_size
    H, Di, Cd, L = config.mamba_n_heads, config.mamba_n_heads * config.mamba_d_head, config.mamba_conv_dim, config.mamba_d_conv
    GN = config.mamba_n_groups * config.mamba_d_state
    q_rows, kv_rows = config.q_size, config.kv_size
    ssm = tuple(float(v) for v in (raw.get("ssm_multipliers") or (1.0,) * 5))
    gate_m, down_m = (float(v) for v in (raw.get("mlp_multipliers") or (1.0, 1.0)))
    a_in, a_out, key = _mult(raw, "attention_in_multiplier"), _mult(raw, "attention_out_multiplier"), _mult(raw, "key_multiplier")
    s_in, s_out = _mult(raw, "ssm_in_multiplier"), _mult(raw, "ssm_out_multiplier")
    if len(ssm) != 5:
        raise ModelLoadError(f"{ckpt.path}: ssm_multipliers must give 5 values (z, x, B, C, dt)")
    mup = np.repeat(np.float32(ssm), (Di, Di, GN, GN, H))   # transformers' mup_vector: in_proj's row scales
    get = ckpt.read
    yield "embed", stacked(ckpt, (("model.embed_tokens.weight", (V, E)),))
    for i in range(config.num_layers // 2):
        h, pm, pa = f"model.layers.{i}.", f"layers.{2 * i}.", f"layers.{2 * i + 1}."
        norm = get(h + "input_layernorm.weight", (E,))
        # the Mamba2 mixer: in_proj's rows z | x | B | C | dt, each segment by its multiplier (one
        # part: the kernels take at most 3 parts a matrix)
        m = h + "mamba."
        yield pm + "attn_norm.weight", norm
        yield pm + "in_proj.weight", _scaled(stacked(ckpt, ((m + "in_proj.weight", (Di + Cd + H, E)),)),
                                             (mup * np.float32(s_in),))
        if config.mamba_proj_bias:
            yield pm + "in_proj.bias", convert(get(m + "in_proj.bias", (Di + Cd + H,)), "float32") * mup
        yield pm + "conv.weight", np.ascontiguousarray(bamba._f32(get(m + "conv1d.weight", (Cd, 1, L))).reshape(Cd, L).T)
        if config.mamba_conv_bias:
            yield pm + "conv.bias", get(m + "conv1d.bias", (Cd,))
        yield pm + "ssm_a", -np.exp(bamba._f32(get(m + "A_log", (H,))))
        yield pm + "ssm_d", get(m + "D", (H,))
        yield pm + "dt_bias", get(m + "dt_bias", (H,))
        if config.mamba_norm != "none":
            yield pm + "gnorm.weight", get(m + "norm.weight", (Di,))
        yield pm + "out_proj.weight", _scaled(stacked(ckpt, ((m + "out_proj.weight", (E, Di)),)), (s_out,))
        if config.mamba_out_bias:
            yield pm + "out_proj.bias", _vec(get(m + "out_proj.bias", (E,)), s_out)
        # attention on the same normed rows (the norm is yielded again; the kernel reuses the mixer's rows)
        a = h + "self_attn."
        yield pa + "attn_norm.weight", norm
        yield pa + "qkv.weight", _scaled(stacked(ckpt, ((a + "q_proj.weight", (q_rows, E)), (a + "k_proj.weight", (kv_rows, E)),
                                                        (a + "v_proj.weight", (kv_rows, E)))), (a_in, a_in * key, a_in))
        if config.qkv_bias:
            yield pa + "qkv.bias", np.concatenate([convert(get(a + "q_proj.bias", (q_rows,)), "float32"),
                                                   _vec(get(a + "k_proj.bias", (kv_rows,)), key),
                                                   convert(get(a + "v_proj.bias", (kv_rows,)), "float32")])
        yield pa + "o.weight", _scaled(stacked(ckpt, ((a + "o_proj.weight", (E, q_rows)),)), (a_out,))
        if config.o_bias:
            yield pa + "o.bias", _vec(get(a + "o_proj.bias", (E,)), a_out)
        yield pa + "mlp_norm.weight", get(h + "pre_ff_layernorm.weight", (E,))
        f = h + "feed_forward."
        yield pa + "gate_up.weight", _scaled(stacked(ckpt, ((f + "gate_proj.weight", (F, E)), (f + "up_proj.weight", (F, E)))),
                                             (gate_m, 1.0))
        if config.mlp_bias:
            yield pa + "gate_up.bias", np.concatenate([_vec(get(f + "gate_proj.bias", (F,)), gate_m),
                                                       convert(get(f + "up_proj.bias", (F,)), "float32")])
        yield pa + "down.weight", _scaled(stacked(ckpt, ((f + "down_proj.weight", (E, F)),)), (down_m,))
        if config.mlp_bias:
            yield pa + "down.bias", _vec(get(f + "down_proj.bias", (E,)), down_m)
    yield "final_norm.weight", get("model.final_layernorm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", stacked(ckpt, (("lm_head.weight", (V, E)),))


# ---- GGUF --------------------------------------------------------------------------------


def gguf_config(f, arch: str) -> ModelConfig:
    meta, key = f.metadata, llama.gguf_key(f, arch)
    n = int(key("block_count"))
    dim, num_heads = int(key("embedding_length")), int(key("attention.head_count"))
    kv = key("attention.head_count_kv")
    if isinstance(kv, (list, tuple)):
        if len(set(int(v) for v in kv)) != 1:
            raise ModelLoadError(f"{f.path}: {arch}.attention.head_count_kv must be one count for every layer")
        kv = kv[0]
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    if not vocab:
        raise ModelLoadError(f"{f.path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens gives the vocabulary size")
    inner, H = int(key("ssm.inner_size")), int(key("ssm.time_step_rank"))
    if inner % H:
        raise ModelLoadError(f"{f.path}: {arch}.ssm.inner_size {inner} is not a multiple of its {H} heads")
    if meta.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ModelLoadError(f"{f.path}: {arch}: RoPE scaling {meta[f'{arch}.rope.scaling.type']!r} is not supported")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    scale = meta.get(f"{arch}.attention.scale")
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch], vocab_size=int(vocab), dim=dim, ffn_dim=int(key("feed_forward_length")),
        num_heads=num_heads, num_kv_heads=int(kv),
        head_dim=int(meta.get(f"{arch}.attention.key_length", 0)) or dim // num_heads,
        max_position_embeddings=int(key("context_length")), norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        qkv_bias="blk.0.attn_q.bias" in f.tensors, o_bias="blk.0.attn_output.bias" in f.tensors,
        mlp_bias="blk.0.ffn_gate.bias" in f.tensors, rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in f.tensors, bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos_id),) if eos_id is not None else (), **_pairs(n),
        attention_multiplier=float(scale) if scale else None,   # llama.cpp: 0 / none is head_dim ** -0.5
        mamba_n_heads=H, mamba_d_head=inner // H, mamba_n_groups=int(key("ssm.group_count")),
        mamba_d_state=int(key("ssm.state_size")), mamba_d_conv=int(key("ssm.conv_kernel")),
        mamba_conv_bias="blk.0.ssm_conv1d.bias" in f.tensors, mamba_proj_bias="blk.0.ssm_in.bias" in f.tensors,
        mamba_out_bias="blk.0.ssm_out.bias" in f.tensors,
        mamba_norm="after_gate" if "blk.0.ssm_norm.weight" in f.tensors else "none")


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, F, V = config.dim, config.ffn_dim, config.vocab_size
    q_rows, kv_rows = config.q_size, config.kv_size

    def vec(name: str, shape: tuple[int, ...]) -> np.ndarray:
        f.info(name, shape)
        return np.asarray(f.read(name), np.float32)

    yield "embed", _gguf_rows(f, [("token_embd.weight", (V, E))])
    for i in range(config.num_layers // 2):
        b, pm, pa = f"blk.{i}.", f"layers.{2 * i}.", f"layers.{2 * i + 1}."
        norm = vec(b + "attn_norm.weight", (E,))
        yield pm + "attn_norm.weight", norm
        yield from bamba.gguf_mixer(f, config, b, pm)
        yield pa + "attn_norm.weight", norm
        yield pa + "qkv.weight", _gguf_rows(f, [(b + "attn_q.weight", (q_rows, E)), (b + "attn_k.weight", (kv_rows, E)),
                                               (b + "attn_v.weight", (kv_rows, E))])
        if config.qkv_bias:
            yield pa + "qkv.bias", np.concatenate([vec(b + "attn_q.bias", (q_rows,)), vec(b + "attn_k.bias", (kv_rows,)),
                                                   vec(b + "attn_v.bias", (kv_rows,))])
        yield pa + "o.weight", _gguf_rows(f, [(b + "attn_output.weight", (E, q_rows))])
        if config.o_bias:
            yield pa + "o.bias", vec(b + "attn_output.bias", (E,))
        ffn_norm = b + "ffn_norm" if b + "ffn_norm" in f.tensors else b + "ffn_norm.weight"
        yield pa + "mlp_norm.weight", vec(ffn_norm, (E,))
        yield pa + "gate_up.weight", _gguf_rows(f, [(b + "ffn_gate.weight", (F, E)), (b + "ffn_up.weight", (F, E))])
        if config.mlp_bias:
            yield pa + "gate_up.bias", np.concatenate([vec(b + "ffn_gate.bias", (F,)), vec(b + "ffn_up.bias", (F,))])
        yield pa + "down.weight", _gguf_rows(f, [(b + "ffn_down.weight", (E, F))])
        if config.mlp_bias:
            yield pa + "down.bias", vec(b + "ffn_down.bias", (E,))
    yield "final_norm.weight", vec("output_norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", _gguf_rows(f, [("output.weight", (V, E))])
