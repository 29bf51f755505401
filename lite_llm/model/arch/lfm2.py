"""LFM2 (HF Lfm2ForCausalLM): a hybrid decoder whose layers are either GQA attention with
per-head q/k RMSNorm, or a gated short convolution ("conv" in layer_types):

    in_proj [3E, E] -> B, C, x;  u = B * x;  y = causal depthwise conv of u over time
    (conv_L_cache taps per channel);  out_proj(C * y)

each followed by the SwiGLU MLP (w1 gate, w3 up, w2 down). The conv layers' state per sequence
is the last conv_L_cache - 1 values of u per channel (engine/runner.py keeps it per batch slot);
the final norm is stored as `embedding_norm`. What the layers compute: forward.pxi's
_conv_block and src/kernels/conv.h. llama.cpp's "lfm2" GGUF graph is not read yet.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama
from lite_llm.model.files import ModelLoadError
from lite_llm.model.hf import stacked

HF_ARCHITECTURES = ("Lfm2ForCausalLM",)


def ffn_dim(raw: dict) -> int:
    """The MLP's width as transformers' Lfm2MLP derives it: with block_auto_adjust_ff_dim, 2/3 of
    intermediate_size, times block_ffn_dim_multiplier, rounded up to block_multiple_of."""
    width = int(raw.get("intermediate_size") or raw["block_ff_dim"])
    if raw.get("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = raw.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            width = int(multiplier * width)
            step = int(raw.get("block_multiple_of", 256))
            width = step * ((width + step - 1) // step)
    return width


def layer_types(raw: dict) -> tuple[str, ...]:
    """"full_attention" or "conv" per layer: config.json's layer_types, else full_attn_idxs."""
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:
        full = raw.get("full_attn_idxs")
        full = set(range(n)) if full is None else set(full)
        types = ["full_attention" if i in full else "conv" for i in range(n)]
    return tuple(types)


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    raw = dict(raw)
    raw.setdefault("intermediate_size", raw.get("block_ff_dim"))
    types = layer_types(raw)
    unknown = sorted(set(types) - {"full_attention", "conv"})
    if unknown or len(types) != int(raw["num_hidden_layers"]):
        raise ModelLoadError(f"{where}: LFM2 layer_types must name full_attention or conv for each of the "
                             f"{raw['num_hidden_layers']} layers")
    tied = raw.get("tie_word_embeddings", raw.get("tie_embedding", True))
    return llama.decoder_config(raw, arch, where, ffn_dim=ffn_dim(raw), norm_eps=float(raw.get("norm_eps", 1e-5)),
                                qk_norm=True, layer_types=types, conv_L_cache=int(raw.get("conv_L_cache", 3)),
                                conv_bias=bool(raw.get("conv_bias", False)), tie_word_embeddings=bool(tied),
                                qkv_bias=False, o_bias=False, mlp_bias=False)


def tensor_names(config: ModelConfig) -> list[str]:
    """The canonical tensors hf_tensors yields, in order: a conv layer has in_proj [3E, E],
    conv.weight [L, E] (taps channel-minor) and out_proj [E, E] (biases with conv_bias) where an
    attention layer has qkv, q_norm, k_norm and o."""
    names = ["embed"]
    for i in range(config.num_layers):
        p = f"layers.{i}."
        names.append(p + "attn_norm.weight")
        if config.layer_types[i] == "conv":
            bias = config.conv_bias
            names += [p + "in_proj.weight"] + ([p + "in_proj.bias"] if bias else [])
            names += [p + "conv.weight"] + ([p + "conv.bias"] if bias else [])
            names += [p + "out_proj.weight"] + ([p + "out_proj.bias"] if bias else [])
        else:
            names += [p + "qkv.weight", p + "q_norm.weight", p + "k_norm.weight", p + "o.weight"]
        names += [p + "mlp_norm.weight", p + "gate_up.weight", p + "down.weight"]
    names.append("final_norm.weight")
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, F, V, D = config.dim, config.ffn_dim, config.vocab_size, config.head_dim
    q_rows, kv_rows, L = config.q_size, config.kv_size, config.conv_L_cache
    get = ckpt.read

    def rows(*parts):
        return stacked(ckpt, parts)

    yield "embed", rows(("model.embed_tokens.weight", (V, E)))
    for i in range(config.num_layers):
        h, p = f"model.layers.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", get(h + "operator_norm.weight", (E,))
        if config.layer_types[i] == "conv":
            c = h + "conv."
            yield p + "in_proj.weight", rows((c + "in_proj.weight", (3 * E, E)))
            if config.conv_bias:
                yield p + "in_proj.bias", get(c + "in_proj.bias", (3 * E,))
            # [E, 1, L] in the file; the kernel reads tap k of every channel as one row
            yield p + "conv.weight", np.ascontiguousarray(get(c + "conv.weight", (E, 1, L)).reshape(E, L).T)
            if config.conv_bias:
                yield p + "conv.bias", get(c + "conv.bias", (E,))
            yield p + "out_proj.weight", rows((c + "out_proj.weight", (E, E)))
            if config.conv_bias:
                yield p + "out_proj.bias", get(c + "out_proj.bias", (E,))
        else:
            a = h + "self_attn."
            yield p + "qkv.weight", rows((a + "q_proj.weight", (q_rows, E)), (a + "k_proj.weight", (kv_rows, E)),
                                         (a + "v_proj.weight", (kv_rows, E)))
            yield p + "q_norm.weight", get(a + "q_layernorm.weight", (D,))
            yield p + "k_norm.weight", get(a + "k_layernorm.weight", (D,))
            yield p + "o.weight", rows((a + "out_proj.weight", (E, q_rows)))
        yield p + "mlp_norm.weight", get(h + "ffn_norm.weight", (E,))
        m = h + "feed_forward."
        yield p + "gate_up.weight", rows((m + "w1.weight", (F, E)), (m + "w3.weight", (F, E)))
        yield p + "down.weight", rows((m + "w2.weight", (E, F)))
    yield "final_norm.weight", get("model.embedding_norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", rows(("lm_head.weight", (V, E)))
