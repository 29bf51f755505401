"""LFM2 (HF Lfm2ForCausalLM): a hybrid decoder whose layers are either GQA attention with
per-head q/k RMSNorm, or a gated short convolution ("conv" in layer_types):

    in_proj [3E, E] -> B, C, x;  u = B * x;  y = causal depthwise conv of u over time
    (conv_L_cache taps per channel);  out_proj(C * y)

each followed by the SwiGLU MLP (w1 gate, w3 up, w2 down). The conv layers' state per sequence
is the last conv_L_cache - 1 values of u per channel (engine/runner.py keeps it per batch slot);
the final norm is stored as `embedding_norm`. llama.cpp's "lfm2" graph names the same tensors
blk.{i}.shortconv.{in_proj,conv,out_proj} (conv [E, L]) and marks a conv layer by 0 in its
per-layer attention.head_count_kv; its final norm is token_embd_norm. What the layers compute:
forward.pxi's _conv_block and src/kernels/conv.h.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama
from lite_llm.model.files import ModelLoadError
from lite_llm.model.gguf import NATIVE_TYPES
from lite_llm.model.hf import stacked
from lite_llm.model.weights import StackedRows

HF_ARCHITECTURES = ("Lfm2ForCausalLM",)
GGUF_ARCHITECTURES = {"lfm2": "Lfm2ForCausalLM"}


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


# ---- GGUF --------------------------------------------------------------------------------


def gguf_config(f, arch: str) -> ModelConfig:
    """ModelConfig of llama.cpp's "lfm2" graph: attention.head_count_kv per layer, 0 on a conv
    layer; shortconv.l_cache the taps; feed_forward_length already the MLP's width."""
    meta, key = f.metadata, llama.gguf_key(f, arch)
    n = int(key("block_count"))
    kv = key("attention.head_count_kv")
    kv = [int(v) for v in kv] if isinstance(kv, (list, tuple)) else [int(kv)] * n
    heads = sorted(set(v for v in kv if v))
    if len(kv) != n or len(heads) != 1:
        raise ModelLoadError(f"{f.path}: {arch}.attention.head_count_kv must give one KV head count for the "
                             f"attention layers and 0 for the conv layers, {n} entries")
    types = tuple("full_attention" if v else "conv" for v in kv)
    dim, num_heads = int(key("embedding_length")), int(key("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    if not vocab:
        raise ModelLoadError(f"{f.path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens gives the vocabulary size")
    first_conv = types.index("conv") if "conv" in types else 0
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch], vocab_size=int(vocab), dim=dim, ffn_dim=int(key("feed_forward_length")),
        num_layers=n, num_heads=num_heads, num_kv_heads=heads[0],
        head_dim=int(meta.get(f"{arch}.attention.key_length", 0)) or dim // num_heads,
        max_position_embeddings=int(key("context_length")), norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        qk_norm=True, rope_theta=float(meta.get(f"{arch}.rope.freq_base", 1000000.0)),
        tie_word_embeddings="output.weight" not in f.tensors, bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos_id),) if eos_id is not None else (), layer_types=types,
        conv_L_cache=int(key("shortconv.l_cache")),
        conv_bias=f"blk.{first_conv}.shortconv.in_proj.bias" in f.tensors)


def _gguf_rows(f, specs: list[tuple[str, tuple[int, int]]]) -> StackedRows:
    """The tensors `specs` ((name, [rows, cols]) each) stacked by rows, read when asked; their
    blocks as stored where the kernels run that type."""
    for name, shape in specs:
        f.info(name, shape)      # missing / unsupported / misshapen: fail now, before any reading
    native = [f.tensors[name].type_name in NATIVE_TYPES for name, _ in specs]
    return StackedRows(tuple((shape[0], partial(f.read_rows, name)) for name, shape in specs), specs[0][1][1],
                       blocks=tuple((f.tensors[name].type_name, partial(f.read_raw_rows, name)) if nat else None
                                    for (name, _), nat in zip(specs, native)),
                       stored=tuple(f.stored(name) for name, _ in specs))


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, F, V, D = config.dim, config.ffn_dim, config.vocab_size, config.head_dim
    q_rows, kv_rows, L = config.q_size, config.kv_size, config.conv_L_cache

    def vec(name: str, shape: tuple[int, ...]) -> np.ndarray:
        f.info(name, shape)
        return f.read(name)

    yield "embed", _gguf_rows(f, [("token_embd.weight", (V, E))])
    for i in range(config.num_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", vec(b + "attn_norm.weight", (E,))
        if config.layer_types[i] == "conv":
            c = b + "shortconv."
            yield p + "in_proj.weight", _gguf_rows(f, [(c + "in_proj.weight", (3 * E, E))])
            if config.conv_bias:
                yield p + "in_proj.bias", vec(c + "in_proj.bias", (3 * E,))
            yield p + "conv.weight", np.ascontiguousarray(vec(c + "conv.weight", (E, L)).T)   # taps channel-minor
            if config.conv_bias:
                yield p + "conv.bias", vec(c + "conv.bias", (E,))
            yield p + "out_proj.weight", _gguf_rows(f, [(c + "out_proj.weight", (E, E))])
            if config.conv_bias:
                yield p + "out_proj.bias", vec(c + "out_proj.bias", (E,))
        else:   # q/k rows in HF order: the lfm2 converter does not permute them
            yield p + "qkv.weight", _gguf_rows(f, [(b + "attn_q.weight", (q_rows, E)),
                                                   (b + "attn_k.weight", (kv_rows, E)),
                                                   (b + "attn_v.weight", (kv_rows, E))])
            yield p + "q_norm.weight", vec(b + "attn_q_norm.weight", (D,))
            yield p + "k_norm.weight", vec(b + "attn_k_norm.weight", (D,))
            yield p + "o.weight", _gguf_rows(f, [(b + "attn_output.weight", (E, q_rows))])
        yield p + "mlp_norm.weight", vec(b + "ffn_norm.weight", (E,))
        yield p + "gate_up.weight", _gguf_rows(f, [(b + "ffn_gate.weight", (F, E)), (b + "ffn_up.weight", (F, E))])
        yield p + "down.weight", _gguf_rows(f, [(b + "ffn_down.weight", (E, F))])
    yield "final_norm.weight", vec("token_embd_norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", _gguf_rows(f, [("output.weight", (V, E))])
