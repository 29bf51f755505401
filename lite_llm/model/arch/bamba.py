"""Bamba (HF BambaForCausalLM): a hybrid decoder of Mamba2 layers and Llama attention layers
(those in attn_layer_indices; RoPE over half of each head), each followed by a SwiGLU MLP.
A Mamba2 layer ("mamba" in ModelConfig.layer_types):

    in_proj [Di + Cd + H, E] -> z [Di], x | B | C [Cd = Di + 2 G N], dt [H]
    x | B | C = silu(causal depthwise conv of mamba_d_conv taps, with bias)
    dt = softplus(dt + dt_bias);  per head h (group g = h // (H / G)), state S [P, N]:
        S = exp(dt A) S + dt x_h B_g^T,  y_h = S C_g + D x_h        (A = -exp(A_log))
    out_proj(rmsnorm(y * silu(z)) per group of Di / G channels, x norm.weight)

Its state per sequence is the conv's last d_conv - 1 inputs and S for every head (runner.py);
the scan runs chunked (src/kernels/ssm.h). What the layers compute: forward.pxi's _mamba_block.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama
from lite_llm.model.arch.lfm2 import _gguf_rows
from lite_llm.model.files import ModelLoadError
from lite_llm.model.hf import concat, stacked
from lite_llm.model.weights import bf16_to_f32

HF_ARCHITECTURES = ("BambaForCausalLM",)


def _number(value: Any) -> float:
    """A config.json number; transformers writes infinity as {"__float__": "Infinity"}."""
    return float(value["__float__"] if isinstance(value, dict) and "__float__" in value else value)


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    n = int(raw["num_hidden_layers"])
    attn = set(raw.get("attn_layer_indices") or ())
    params = raw.get("rope_parameters") or {}
    return llama.decoder_config(
        raw, arch, where, layer_types=tuple("full_attention" if i in attn else "mamba" for i in range(n)),
        partial_rotary_factor=float(params.get("partial_rotary_factor", 0.5)),   # transformers fixes 0.5
        **mamba_fields(raw, where))


def mamba_fields(raw: dict, where: str) -> dict[str, Any]:
    """ModelConfig's mamba_* fields of an HF config (Bamba's and Granite 4.0-H's mamba_* keys)."""
    dim = int(raw["hidden_size"])
    heads, expand = int(raw.get("mamba_n_heads", 128)), int(raw.get("mamba_expand", 2))
    d_head = raw.get("mamba_d_head", "auto")
    d_head = expand * dim // heads if d_head in (None, "auto") else int(d_head)
    if d_head * heads != expand * dim:
        raise ModelLoadError(f"{where}: mamba_n_heads {heads} x mamba_d_head {d_head} != mamba_expand x hidden_size")
    limit = raw.get("time_step_limit")
    if limit is not None and (_number(limit[0]) > 0.0 or not math.isinf(_number(limit[1]))):
        raise ModelLoadError(f"{where}: time_step_limit {list(limit)} is not supported (only (0, inf))")
    return dict(mamba_n_heads=heads, mamba_d_head=d_head, mamba_n_groups=int(raw.get("mamba_n_groups", 1)),
                mamba_d_state=int(raw.get("mamba_d_state", 256)), mamba_d_conv=int(raw.get("mamba_d_conv", 4)),
                mamba_conv_bias=bool(raw.get("mamba_conv_bias", True)),
                mamba_proj_bias=bool(raw.get("mamba_proj_bias", False)))


def tensor_names(config: ModelConfig, moe_names: Callable[[ModelConfig, str], list[str]] | None = None) -> list[str]:
    """The canonical tensors hf_tensors yields, in order: a Mamba2 layer has in_proj, conv.weight
    [L, Cd] (taps channel-minor), ssm_a (= -exp(A_log)), ssm_d, dt_bias, gnorm.weight and
    out_proj where an attention layer has qkv and o; a mixture of experts' MLP (Granite 4.0-H)
    has moe_names(config, prefix) in place of gate_up and down, an ungated one (Nemotron-H) up,
    and a layer of config.no_mlp_layers none."""
    names = ["embed"]
    for i in range(config.num_layers):
        p = f"layers.{i}."
        names.append(p + "attn_norm.weight")
        if config.layer_types[i] == "mamba":
            bias, out_bias = config.mamba_proj_bias, mamba_out_bias(config)
            names += [p + "in_proj.weight"] + ([p + "in_proj.bias"] if bias else [])
            names += [p + "conv.weight"] + ([p + "conv.bias"] if config.mamba_conv_bias else [])
            names += [p + "ssm_a", p + "ssm_d", p + "dt_bias"]
            names += [p + "gnorm.weight"] if config.mamba_norm != "none" else []
            names += [p + "out_proj.weight"] + ([p + "out_proj.bias"] if out_bias else [])
        else:
            names += [p + "qkv.weight"] + ([p + "qkv.bias"] if config.qkv_bias else [])
            names += [p + "o.weight"] + ([p + "o.bias"] if config.o_bias else [])
        if i in config.no_mlp_layers:   # Nemotron-H: a mixer alone
            continue
        names.append(p + "mlp_norm.weight")
        if config.is_moe and i >= config.first_dense_layers:
            names += moe_names(config, p)
            continue
        up = "gate_up" if config.gated_mlp else "up"
        names += [p + up + ".weight"] + ([p + up + ".bias"] if config.mlp_bias else [])
        names += [p + "down.weight"] + ([p + "down.bias"] if config.mlp_bias else [])
    names.append("final_norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def gguf_mixer(f, config: ModelConfig, b: str, p: str) -> Iterator[tuple[str, Any]]:
    """One Mamba2 mixer's tensors, llama.cpp's names under b ("blk.N.") as ours under p
    ("layers.M."), its input norm apart: the hybrid families' GGUF recipes share it."""
    H, Cd, L, G = config.mamba_n_heads, config.mamba_conv_dim, config.mamba_d_conv, config.mamba_n_groups
    Di, E = H * config.mamba_d_head, config.dim

    def vec(name: str, shape: tuple[int, ...]) -> np.ndarray:
        f.info(name, shape)
        return np.asarray(f.read(name), np.float32)

    yield p + "in_proj.weight", _gguf_rows(f, [(b + "ssm_in.weight", (Di + Cd + H, E))])
    if config.mamba_proj_bias:
        yield p + "in_proj.bias", vec(b + "ssm_in.bias", (Di + Cd + H,))
    yield p + "conv.weight", np.ascontiguousarray(vec(b + "ssm_conv1d.weight", (Cd, L)).T)   # taps channel-minor
    if config.mamba_conv_bias:
        yield p + "conv.bias", vec(b + "ssm_conv1d.bias", (Cd,))
    yield p + "ssm_a", vec(b + "ssm_a", (H, 1)).reshape(H)
    yield p + "ssm_d", vec(b + "ssm_d", (H, 1)).reshape(H)
    yield p + "dt_bias", vec(b + "ssm_dt.bias", (H,))
    if config.mamba_norm != "none":
        yield p + "gnorm.weight", vec(b + "ssm_norm.weight", (G, Di // G)).reshape(Di)
    yield p + "out_proj.weight", _gguf_rows(f, [(b + "ssm_out.weight", (E, Di))])
    if mamba_out_bias(config):
        yield p + "out_proj.bias", vec(b + "ssm_out.bias", (E,))


def mamba_out_bias(config: ModelConfig) -> bool:
    """Whether the Mamba2 layers' out_proj has a bias (ModelConfig.mamba_out_bias, else in_proj's)."""
    return config.mamba_proj_bias if config.mamba_out_bias is None else config.mamba_out_bias


def _f32(a: np.ndarray) -> np.ndarray:
    return bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, F, V = config.dim, config.ffn_dim, config.vocab_size
    get = ckpt.read
    yield "embed", stacked(ckpt, (("model.embed_tokens.weight", (V, E)),))
    for i in range(config.num_layers):
        h, p = f"model.layers.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", get(h + "input_layernorm.weight", (E,))
        if config.layer_types[i] == "mamba":
            yield from mamba_hf_tensors(ckpt, config, h + "mamba.", p)
        else:
            yield from attention_hf_tensors(ckpt, config, h + "self_attn.", p)
        yield p + "mlp_norm.weight", get(h + "pre_ff_layernorm.weight", (E,))
        f = h + "feed_forward."
        yield p + "gate_up.weight", stacked(ckpt, ((f + "gate_proj.weight", (F, E)), (f + "up_proj.weight", (F, E))))
        yield p + "down.weight", stacked(ckpt, ((f + "down_proj.weight", (E, F)),))
    yield "final_norm.weight", get("model.final_layernorm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", stacked(ckpt, (("lm_head.weight", (V, E)),))


def mamba_hf_tensors(ckpt, config: ModelConfig, m: str, p: str) -> Iterator[tuple[str, Any]]:
    """The Mamba2 mixer of HF module prefix m ("model.layers.{i}.mamba.") as canonical tensors under p."""
    E, L = config.dim, config.mamba_d_conv
    H, Di, Cd = config.mamba_n_heads, config.mamba_n_heads * config.mamba_d_head, config.mamba_conv_dim
    get = ckpt.read
    yield p + "in_proj.weight", stacked(ckpt, ((m + "in_proj.weight", (Di + Cd + H, E)),))
    if config.mamba_proj_bias:
        yield p + "in_proj.bias", get(m + "in_proj.bias", (Di + Cd + H,))
    # [Cd, 1, L] in the file; the kernel reads tap k of every channel as one row
    yield p + "conv.weight", np.ascontiguousarray(_f32(get(m + "conv1d.weight", (Cd, 1, L))).reshape(Cd, L).T)
    if config.mamba_conv_bias:
        yield p + "conv.bias", get(m + "conv1d.bias", (Cd,))
    yield p + "ssm_a", -np.exp(_f32(get(m + "A_log", (H,))))   # in fp32, as transformers
    yield p + "ssm_d", get(m + "D", (H,))
    yield p + "dt_bias", get(m + "dt_bias", (H,))
    yield p + "gnorm.weight", get(m + "norm.weight", (Di,))
    yield p + "out_proj.weight", stacked(ckpt, ((m + "out_proj.weight", (E, Di)),))
    if config.mamba_proj_bias:
        yield p + "out_proj.bias", get(m + "out_proj.bias", (E,))


def attention_hf_tensors(ckpt, config: ModelConfig, a: str, p: str) -> Iterator[tuple[str, Any]]:
    """The attention of HF module prefix a ("model.layers.{i}.self_attn.") as canonical qkv and o under p."""
    E, q_rows, kv_rows = config.dim, config.q_size, config.kv_size
    get = ckpt.read
    yield p + "qkv.weight", stacked(ckpt, ((a + "q_proj.weight", (q_rows, E)), (a + "k_proj.weight", (kv_rows, E)),
                                           (a + "v_proj.weight", (kv_rows, E))))
    if config.qkv_bias:
        yield p + "qkv.bias", concat(get(a + "q_proj.bias", (q_rows,)), get(a + "k_proj.bias", (kv_rows,)),
                                     get(a + "v_proj.bias", (kv_rows,)))
    yield p + "o.weight", stacked(ckpt, ((a + "o_proj.weight", (E, q_rows)),))
    if config.o_bias:
        yield p + "o.bias", get(a + "o_proj.bias", (E,))
