"""Nemotron-H (HF NemotronHForCausalLM: Nemotron-H 8B / 47B, NVIDIA-Nemotron-Nano-9B-v2): a
stack of blocks, each one sub-layer x + mixer(rmsnorm(x)) whose mixer is a Mamba2 layer (Bamba's
mixer, bamba.py, with dt floored at time_step_min), attention without positions, or an ungated
MLP down(relu(up(x))^2); layers_block_type names them ("linear_attention", "full_attention",
"mlp"), or hybrid_override_pattern does ("M", "*", "-").

A mixer block and the MLP block after it are one layer here (its mixer, then its MLP); a mixer
block without one is a layer of ModelConfig.no_mlp_layers. Checkpoints name the model
"backbone." (NVIDIA's) or "model." (transformers 5), the embeddings "embeddings" and the final
norm "norm_f". Not supported: the mixture-of-experts blocks ("moe", "E": Nemotron 3), an MLP
block that does not follow a mixer block.

llama.cpp's "nemotron_h" graph keeps one GGUF block per block: a Mamba2 block has 0 in both its
attention.head_count_kv and feed_forward_length entries (Granite 4.0-H's ssm_* tensors,
granite_hybrid.py), an attention block head_count_kv, an MLP block feed_forward_length (ffn_up,
ffn_down); each its attn_norm. It keeps no dt floor (time_step_min is not in the file), as
llama.cpp computes without one.
"""
from __future__ import annotations

from typing import Any, Iterator

from lite_llm.config import ModelConfig
import numpy as np

from lite_llm.model.arch import bamba, llama
from lite_llm.model.arch.granite_hybrid import _qk_rows
from lite_llm.model.arch.lfm2 import _gguf_rows
from lite_llm.model.files import ModelLoadError
from lite_llm.model.hf import stacked
from lite_llm.model.weights import StackedRows

HF_ARCHITECTURES = ("NemotronHForCausalLM",)
GGUF_ARCHITECTURES = {"nemotron_h": "NemotronHForCausalLM"}
_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_KINDS = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "full_attention",
          "attention": "full_attention", "mlp": "mlp", "moe": "moe"}


def _blocks(raw: dict, where: str) -> list[str]:
    """Each block's kind: "mamba", "full_attention" or "mlp"."""
    types = raw.get("layers_block_type") or raw.get("layer_types")
    if types is None:
        types = [_PATTERN.get(c, c) for c in str(raw.get("hybrid_override_pattern") or "")]
    kinds = [_KINDS.get(t) for t in types]
    if not kinds or None in kinds:
        raise ModelLoadError(f"{where}: layers_block_type / hybrid_override_pattern must name a mixer for every block")
    if "moe" in kinds:
        raise ModelLoadError(f"{where}: Nemotron-H's mixture-of-experts blocks are not supported")
    return kinds


def _layers(kinds: list[str], where: str) -> list[tuple[str, int, int | None]]:
    """(mixer kind, its block, the MLP block after it or None) of each layer."""
    layers: list[tuple[str, int, int | None]] = []
    for b, kind in enumerate(kinds):
        if kind != "mlp":
            layers.append((kind, b, None))
        elif layers and layers[-1][2] is None:
            layers[-1] = (layers[-1][0], layers[-1][1], b)
        else:
            raise ModelLoadError(f"{where}: block {b}: an MLP block that does not follow a mixer block is not supported")
    return layers


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    layers = _layers(_blocks(raw, where), where)
    types = tuple(kind for kind, _, _ in layers)
    if "mamba" not in types or "full_attention" not in types:
        raise ModelLoadError(f"{where}: a Nemotron-H model needs Mamba2 and attention blocks")
    if raw.get("mamba_hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{where}: mamba_hidden_act {raw['mamba_hidden_act']!r} is not supported (silu)")
    dim, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    raw = dict(raw, num_hidden_layers=len(layers))
    return llama.decoder_config(
        raw, arch, where, act=llama.activation(raw.get("mlp_hidden_act", "relu2"), where), gated_mlp=False,
        mlp_bias=bool(raw.get("mlp_bias", False)), qkv_bias=False, o_bias=False,   # its q/k/v/o have none
        head_dim=int(raw.get("head_dim") or dim // heads), norm_eps=float(raw.get("layer_norm_epsilon", 1e-5)),
        rope=False, nope=True, layer_types=types,
        tie_word_embeddings=False,   # transformers' NemotronH never ties lm_head, whatever the config says
        no_mlp_layers=tuple(j for j, (_, _, mlp) in enumerate(layers) if mlp is None),
        mamba_n_heads=int(raw.get("mamba_num_heads", 128)), mamba_d_head=int(raw.get("mamba_head_dim", 64)),
        mamba_n_groups=int(raw.get("n_groups", 8)), mamba_d_state=int(raw.get("ssm_state_size", 128)),
        mamba_d_conv=int(raw.get("conv_kernel", 4)), mamba_conv_bias=bool(raw.get("use_conv_bias", True)),
        mamba_proj_bias=bool(raw.get("use_bias", False)),
        mamba_dt_min=float(raw.get("time_step_min", raw.get("mamba_dt_min", 0.001))))


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, F, V = config.dim, config.ffn_dim, config.vocab_size
    pre = "backbone." if "backbone.embeddings.weight" in ckpt else "model."
    get = ckpt.read
    yield "embed", stacked(ckpt, ((pre + "embeddings.weight", (V, E)),))
    block = 0
    for j in range(config.num_layers):
        h, p = f"{pre}layers.{block}.", f"layers.{j}."
        yield p + "attn_norm.weight", get(h + "norm.weight", (E,))
        if config.layer_types[j] == "mamba":
            yield from bamba.mamba_hf_tensors(ckpt, config, h + "mixer.", p)
        else:
            yield from bamba.attention_hf_tensors(ckpt, config, h + "mixer.", p)
        block += 1
        if j in config.no_mlp_layers:
            continue
        m = f"{pre}layers.{block}."
        yield p + "mlp_norm.weight", get(m + "norm.weight", (E,))
        yield p + "up.weight", stacked(ckpt, ((m + "mixer.up_proj.weight", (F, E)),))
        if config.mlp_bias:
            yield p + "up.bias", get(m + "mixer.up_proj.bias", (F,))
        yield p + "down.weight", stacked(ckpt, ((m + "mixer.down_proj.weight", (E, F)),))
        if config.mlp_bias:
            yield p + "down.bias", get(m + "mixer.down_proj.bias", (E,))
        block += 1
    yield "final_norm.weight", get(pre + "norm_f.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", stacked(ckpt, (("lm_head.weight", (V, E)),))


# ---- GGUF --------------------------------------------------------------------------------


def _per_block(f, arch: str, name: str, n: int) -> list[int]:
    value = llama.gguf_key(f, arch)(name)
    value = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)] * n
    if len(value) != n:
        raise ModelLoadError(f"{f.path}: {arch}.{name} must have one entry per block ({n})")
    return value


def _gguf_layers(f, arch: str) -> list[tuple[str, int, int | None]]:
    n = int(llama.gguf_key(f, arch)("block_count"))
    kv, ff = _per_block(f, arch, "attention.head_count_kv", n), _per_block(f, arch, "feed_forward_length", n)
    kinds = ["mlp" if ff[b] else "full_attention" if kv[b] else "mamba" for b in range(n)]
    return _layers(kinds, f.path)


def gguf_config(f, arch: str) -> ModelConfig:
    meta, key = f.metadata, llama.gguf_key(f, arch)
    layers = _gguf_layers(f, arch)
    n = int(key("block_count"))
    kv, ff = _per_block(f, arch, "attention.head_count_kv", n), _per_block(f, arch, "feed_forward_length", n)
    types = tuple(kind for kind, _, _ in layers)
    if "mamba" not in types or "full_attention" not in types or len(set(v for v in kv if v)) != 1:
        raise ModelLoadError(f"{f.path}: a Nemotron-H file needs Mamba2 blocks and attention blocks of one KV head count")
    widths = sorted(set(v for v in ff if v))
    dim, num_heads = int(key("embedding_length")), int(key("attention.head_count"))
    inner, H = int(key("ssm.inner_size")), int(key("ssm.time_step_rank"))
    if inner % H or len(widths) > 1:
        raise ModelLoadError(f"{f.path}: {H} Mamba2 heads over ssm.inner_size {inner}, MLP widths {widths}")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    mamba = next(b for kind, b, _ in layers if kind == "mamba")
    mlp = next((m for _, _, m in layers if m is not None), None)
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch], vocab_size=int(vocab), dim=dim, ffn_dim=widths[0] if widths else 0,
        num_layers=len(layers), num_heads=num_heads, num_kv_heads=max(kv),
        head_dim=int(meta.get(f"{arch}.attention.key_length", 0)) or dim // num_heads,
        max_position_embeddings=int(key("context_length")), norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        act="relu2", gated_mlp=False, mlp_bias=mlp is not None and f"blk.{mlp}.ffn_up.bias" in f.tensors,
        rope=False, nope=True, tie_word_embeddings="output.weight" not in f.tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"), eos_token_ids=(int(eos_id),) if eos_id is not None else (),
        layer_types=types, no_mlp_layers=tuple(j for j, (_, _, m) in enumerate(layers) if m is None),
        mamba_n_heads=H, mamba_d_head=inner // H, mamba_n_groups=int(key("ssm.group_count")),
        mamba_d_state=int(key("ssm.state_size")), mamba_d_conv=int(key("ssm.conv_kernel")),
        mamba_conv_bias=f"blk.{mamba}.ssm_conv1d.bias" in f.tensors,
        mamba_proj_bias=f"blk.{mamba}.ssm_in.bias" in f.tensors)


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, F, V, D = config.dim, config.ffn_dim, config.vocab_size, config.head_dim
    H, G, Cd, L = config.mamba_n_heads, config.mamba_n_groups, config.mamba_conv_dim, config.mamba_d_conv
    Di = H * config.mamba_d_head

    def vec(name: str, shape: tuple[int, ...]) -> np.ndarray:
        f.info(name, shape)
        return np.asarray(f.read(name), np.float32)

    yield "embed", _gguf_rows(f, [("token_embd.weight", (V, E))])
    for j, (kind, b, m) in enumerate(_gguf_layers(f, "nemotron_h")):
        g, p = f"blk.{b}.", f"layers.{j}."
        yield p + "attn_norm.weight", vec(g + "attn_norm.weight", (E,))
        if kind == "mamba":
            yield p + "in_proj.weight", _gguf_rows(f, [(g + "ssm_in.weight", (Di + Cd + H, E))])
            if config.mamba_proj_bias:
                yield p + "in_proj.bias", vec(g + "ssm_in.bias", (Di + Cd + H,))
            yield p + "conv.weight", np.ascontiguousarray(vec(g + "ssm_conv1d.weight", (Cd, L)).T)   # taps channel-minor
            if config.mamba_conv_bias:
                yield p + "conv.bias", vec(g + "ssm_conv1d.bias", (Cd,))
            yield p + "ssm_a", vec(g + "ssm_a", (H, 1)).reshape(H)
            yield p + "ssm_d", vec(g + "ssm_d", (H, 1)).reshape(H)
            yield p + "dt_bias", vec(g + "ssm_dt.bias", (H,))
            yield p + "gnorm.weight", vec(g + "ssm_norm.weight", (G, Di // G)).reshape(Di)
            yield p + "out_proj.weight", _gguf_rows(f, [(g + "ssm_out.weight", (E, Di))])
            if config.mamba_proj_bias:
                yield p + "out_proj.bias", vec(g + "ssm_out.bias", (E,))
        else:   # q/k rows permuted by the converter (no RoPE here: undone all the same)
            q = _qk_rows(f, g + "attn_q.weight", (config.q_size, E), D)
            k = _qk_rows(f, g + "attn_k.weight", (config.kv_size, E), D)
            v = _gguf_rows(f, [(g + "attn_v.weight", (config.kv_size, E))])
            yield p + "qkv.weight", StackedRows(q.parts + k.parts + v.parts, E, align=D,
                                                blocks=q.blocks + k.blocks + v.blocks, stored=q.stored + k.stored + v.stored)
            yield p + "o.weight", _gguf_rows(f, [(g + "attn_output.weight", (E, config.q_size))])
        if m is None:
            continue
        g = f"blk.{m}."
        yield p + "mlp_norm.weight", vec(g + "attn_norm.weight", (E,))
        yield p + "up.weight", _gguf_rows(f, [(g + "ffn_up.weight", (F, E))])
        if config.mlp_bias:
            yield p + "up.bias", vec(g + "ffn_up.bias", (F,))
        yield p + "down.weight", _gguf_rows(f, [(g + "ffn_down.weight", (E, F))])
        if config.mlp_bias:
            yield p + "down.bias", vec(g + "ffn_down.bias", (E,))
    yield "final_norm.weight", vec("output_norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", _gguf_rows(f, [("output.weight", (V, E))])
