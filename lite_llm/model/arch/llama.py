"""Llama and Mistral (HF LlamaForCausalLM / MistralForCausalLM, llama.cpp's "llama" graph), and
the decoder pieces the other RMSNorm + RoPE + gated-MLP families build on: config fields,
HF tensor names (model.layers.{i}.self_attn.q_proj, ...) and GGUF names (blk.{i}.attn_q, ...).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.files import ModelLoadError
from lite_llm.model.gguf import NATIVE_TYPES
from lite_llm.model.hf import concat, split, stacked
from lite_llm.model.weights import StackedRows

HF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM"}
# file tensors left unread (arch/__init__.py unread_tensors): (pattern, reason)
HF_UNREAD = ((r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",
              "a buffer older transformers saved beside the weights: RoPE's frequencies, computed here from "
              "rope_theta and rope_scaling"),)
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_tanh", "relu": "relu", "relu2": "relu2"}
ROPE_TYPES = ("linear", "llama3", "yarn")


# ---- config ------------------------------------------------------------------------------


def rope(raw: dict, layer_type: str = "full_attention") -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from either transformers 4 or 5 config spellings; a
    per-layer-type dict (transformers 5: {"full_attention": ..., "sliding_attention": ...})
    gives `layer_type`'s entry."""
    params = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        params = params.get(layer_type, next(iter(params.values())))
    theta = params.get("rope_theta") or raw.get("rope_theta") or 10000.0
    kind = params.get("rope_type", params.get("type"))
    if kind in (None, "default"):
        return float(theta), None
    scaling = {k: v for k, v in params.items() if k not in ("type", "rope_type", "rope_theta")}
    scaling["rope_type"] = kind
    return float(theta), scaling


def eos(raw: dict) -> tuple[int, ...]:
    value = raw.get("eos_token_id")
    if value is None:
        return ()
    return tuple(int(e) for e in value) if isinstance(value, (list, tuple)) else (int(value),)


def activation(name: str, where: str) -> str:
    if name not in ACTIVATIONS:
        raise ModelLoadError(f"{where}: activation {name!r} is not supported ({', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def hf_fields(raw: dict, ffn_key: str = "intermediate_size") -> dict[str, Any]:
    """The ModelConfig fields every family's HF config.json spells alike (the decoders here, BERT,
    OPT): vocabulary, width, MLP width (raw[ffn_key]), layers, query heads, BOS id, stored dtype."""
    return dict(num_heads=int(raw["num_attention_heads"]), dim=int(raw["hidden_size"]),
                vocab_size=int(raw["vocab_size"]), ffn_dim=int(raw[ffn_key]), num_layers=int(raw["num_hidden_layers"]),
                bos_token_id=raw.get("bos_token_id"), torch_dtype=raw.get("torch_dtype") or raw.get("dtype"))


# the pre-Llama block of OPT and BERT: LayerNorm with bias, biases on every projection, an ungated
# fc1/fc2 MLP, learned absolute positions instead of RoPE
BIASED_LAYERNORM_BLOCK = dict(norm="layer", gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, rope=False)


def decoder_config(raw: dict, arch: str, where: str, rope_types: tuple[str, ...] = ROPE_TYPES,
                   **fields: Any) -> ModelConfig:
    """The RMSNorm + RoPE + gated-MLP decoder's ModelConfig; `fields` override or add to it."""
    common = hf_fields(raw)
    num_heads, dim = common["num_heads"], common["dim"]
    theta, scaling = rope(raw)
    if scaling is not None and scaling["rope_type"] not in rope_types:
        raise ModelLoadError(f"{where}: rope scaling {scaling['rope_type']!r} is not supported "
                             f"(supported: {', '.join(rope_types)})")
    attention_bias = bool(raw.get("attention_bias", False))
    values = dict(
        common,
        architecture=arch,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(raw.get("head_dim") or dim // num_heads),
        max_position_embeddings=int(raw["max_position_embeddings"]),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        norm="rms",
        act=activation(raw.get("hidden_act", "silu"), where),
        gated_mlp=True,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        rope=True,
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        eos_token_ids=eos(raw),
    )
    values.update(fields)
    return ModelConfig(**values)


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    sliding = raw.get("sliding_window") if arch == "MistralForCausalLM" else None
    return decoder_config(raw, arch, where, sliding_window=int(sliding) if sliding else None)


# ---- HF tensors ----------------------------------------------------------------------------


def decoder_hf_tensors(ckpt, config: ModelConfig, prefix: str = "model.", norm_offset: float = 0.0,
                       extra_norms: tuple[tuple[str, str], ...] = (), fused: bool = False,
                       mlp: Callable | None = None, lm_head: str = "lm_head.weight") -> Iterator[tuple[str, Any]]:
    """Canonical (name, tensor) pairs of a Llama-layout HF checkpoint: 1-D tensors as arrays,
    2-D ones as StackedRows (q/k/v and gate/up fused). norm_offset is added to every norm
    weight (Gemma's (1 + w)); extra_norms: (canonical, HF) names of further per-layer norms,
    yielded after the attention block (post_attn_norm) or the MLP (post_mlp_norm); fused: the
    checkpoint stores qkv_proj and gate_up_proj (Phi-3), split into their parts here; mlp:
    (ckpt, config, HF layer prefix, canonical prefix) -> the MLP's tensors in place of the dense
    one (mixture of experts, moe.py); lm_head: the output matrix's name."""
    E, F, V = config.dim, config.ffn_dim, config.vocab_size
    q_rows, kv_rows, D = config.q_size, config.kv_size, config.head_dim
    get = ckpt.read

    def norm(name: str, n: int) -> np.ndarray:
        w = get(name, (n,))
        return w if not norm_offset else w.astype(np.float32) + np.float32(norm_offset)

    def rows(*parts: tuple[str, tuple[int, int]]) -> StackedRows:
        return stacked(ckpt, parts)

    extra = dict(extra_norms)
    yield "embed", rows((prefix + "embed_tokens.weight", (V, E)))
    for i in range(config.num_layers):
        h, p = f"{prefix}layers.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", norm(h + "input_layernorm.weight", E)
        a = h + "self_attn."
        if fused:
            yield p + "qkv.weight", split(ckpt, a + "qkv_proj.weight", (q_rows, kv_rows, kv_rows), E)
        else:
            yield p + "qkv.weight", rows((a + "q_proj.weight", (q_rows, E)), (a + "k_proj.weight", (kv_rows, E)),
                                         (a + "v_proj.weight", (kv_rows, E)))
        if config.qkv_bias:
            yield p + "qkv.bias", concat(get(a + "q_proj.bias", (q_rows,)), get(a + "k_proj.bias", (kv_rows,)),
                                         get(a + "v_proj.bias", (kv_rows,)))
        if config.qk_norm:
            yield p + "q_norm.weight", norm(a + "q_norm.weight", D)
            yield p + "k_norm.weight", norm(a + "k_norm.weight", D)
        yield p + "o.weight", rows((a + "o_proj.weight", (E, q_rows)))
        if config.o_bias:
            yield p + "o.bias", get(a + "o_proj.bias", (E,))
        if "post_attn_norm" in extra:
            yield p + "post_attn_norm.weight", norm(h + extra["post_attn_norm"] + ".weight", E)
        yield p + "mlp_norm.weight", norm(h + extra.get("mlp_norm", "post_attention_layernorm") + ".weight", E)
        m = h + "mlp."
        if mlp is not None:
            yield from mlp(ckpt, config, h, p)
        else:
            if fused:
                yield p + "gate_up.weight", split(ckpt, m + "gate_up_proj.weight", (F, F), E)
            else:
                yield p + "gate_up.weight", rows((m + "gate_proj.weight", (F, E)), (m + "up_proj.weight", (F, E)))
            if config.mlp_bias:
                yield p + "gate_up.bias", concat(get(m + "gate_proj.bias", (F,)), get(m + "up_proj.bias", (F,)))
            yield p + "down.weight", rows((m + "down_proj.weight", (E, F)))
            if config.mlp_bias:
                yield p + "down.bias", get(m + "down_proj.bias", (E,))
        if "post_mlp_norm" in extra:
            yield p + "post_mlp_norm.weight", norm(h + extra["post_mlp_norm"] + ".weight", E)
    yield "final_norm.weight", norm(prefix + "norm.weight", E)
    if not config.tie_word_embeddings:
        yield "lm_head.weight", rows((lm_head, (V, E)))


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    return decoder_hf_tensors(ckpt, config)


# ---- GGUF --------------------------------------------------------------------------------


def gguf_key(f, arch: str) -> Callable[..., Any]:
    """key(name, default=None): GGUF file f's metadata `{arch}.{name}`, the default when it has
    none; a clear error when it has none and there is no default."""
    meta = f.metadata

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"{f.path}: metadata {arch}.{name} is missing")
        return value
    return key


def gguf_decoder_config(f, arch: str, architecture: str, **fields: Any) -> ModelConfig:
    """ModelConfig from a GGUF file's metadata (as transformers' GGUF loader reads it) for
    llama.cpp graph `arch`; `fields` override or add to it."""
    meta, key = f.metadata, gguf_key(f, arch)

    dim = int(key("embedding_length"))
    num_heads = int(key("attention.head_count"))
    num_kv_heads = int(key("attention.head_count_kv", num_heads))
    head_dim = (int(meta.get(f"{arch}.attention.key_length", 0))
                or int(meta.get(f"{arch}.rope.dimension_count", 0)) or dim // num_heads)
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    if not vocab:
        raise ModelLoadError(f"{f.path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens gives the vocabulary size")
    rope_scaling = None
    scaling_type = meta.get(f"{arch}.rope.scaling.type")
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling_type == "yarn":
        rope_scaling = {"rope_type": "yarn", "factor": float(key("rope.scaling.factor")),
                        "original_max_position_embeddings": int(key("rope.scaling.original_context_length"))}
    elif scaling_type not in (None, "none"):
        raise ModelLoadError(f"{f.path}: GGUF rope scaling {scaling_type!r} is not supported")
    if "rope_freqs.weight" in f.tensors:    # llama.cpp's converter writes Llama 3's rope scaling as a
        if rope_scaling is not None:        # divisor of each frequency (llama.cpp's freq_factors)
            raise ModelLoadError(f"{f.path}: rope_freqs beside {scaling_type} rope scaling is not supported")
        rope_scaling = {"rope_type": "freq_factors", "factors": f.read("rope_freqs.weight").reshape(-1).tolist()}
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    values = dict(
        architecture=architecture,
        vocab_size=int(vocab),
        dim=dim,
        ffn_dim=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=int(key("context_length")),
        norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        qkv_bias="blk.0.attn_q.bias" in f.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in f.tensors,
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings="output.weight" not in f.tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos_id),) if eos_id is not None else (),
        torch_dtype=None,
    )
    values.update(fields)
    return ModelConfig(**values)


def gguf_config(f, arch: str) -> ModelConfig:
    if f.metadata.get(f"{arch}.expert_count"):   # Mixtral's file: arch.for_gguf picks mixtral.py
        raise ModelLoadError(f"{f.path}: a llama file with experts is read by the mixtral recipe")
    architecture = GGUF_ARCHITECTURES[arch]
    if "mistral" in str(f.metadata.get("general.name", "")).lower():
        architecture = "MistralForCausalLM"     # llama.cpp files Mistral under "llama"; transformers too
    return gguf_decoder_config(f, arch, architecture)


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved-pair rope) -> HF rotate-half order.

    w: [heads * D, ...]; within each head llama.cpp stores rows as (D/2, 2) pairs, HF as (2, D/2).
    """
    d_half = w.shape[0] // heads // 2
    return w.reshape(heads, d_half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def decoder_gguf_tensors(f, config: ModelConfig, permuted: bool, extra_norms: tuple[tuple[str, str], ...] = (),
                         fused: bool = False, mlp: Callable | None = None) -> Iterator[tuple[str, Any]]:
    """Canonical (name, tensor) pairs of llama.cpp's decoder tensor names, one at a time: 1-D
    tensors as float32 arrays, 2-D ones as StackedRows (read when asked, a slice of rows at a
    time), q/k un-permuted when `permuted` (the "llama" graph; a whole head of rows at a time,
    so qkv slices start on multiples of head_dim). extra_norms as in decoder_hf_tensors, with
    llama.cpp names; fused: attn_qkv and a [2F, E] ffn_up (gate rows, then up) in place of
    attn_q/k/v and ffn_gate/up (the "phi3" graph), split into row ranges; mlp: (f, config,
    block prefix, canonical prefix) -> the MLP's tensors in place of the dense one (moe.py)."""
    H, Hkv, D, E, F = config.num_heads, config.num_kv_heads, config.head_dim, config.dim, config.ffn_dim
    extra = dict(extra_norms)

    def vec(name: str, shape: tuple[int, ...]) -> np.ndarray:
        f.info(name, shape)
        return f.read(name)

    def part(name: str, shape: tuple[int, int], heads: int = 0) -> tuple[int, Any]:
        f.info(name, shape)      # missing / unsupported / misshapen: fail now, before any reading
        if heads:
            return shape[0], lambda a, b: _unpermute(f.read_rows(name, a, b), (b - a) // D)
        return shape[0], partial(f.read_rows, name)

    def blocks(name: str, heads: int = 0) -> tuple[str, Any] | None:
        """(block type, raw row reader) of a tensor stored in a type the kernels run natively."""
        type_name = f.tensors[name].type_name
        if type_name not in NATIVE_TYPES:
            return None
        if heads:   # whole rows move: un-permuting raw block rows is the same permutation
            return type_name, lambda a, b: _unpermute(f.read_raw_rows(name, a, b), (b - a) // D)
        return type_name, partial(f.read_raw_rows, name)

    def stacked(specs: list[tuple[str, tuple[int, int], int]], align: int = 1) -> StackedRows:
        return StackedRows(tuple(part(n, s, h) for n, s, h in specs), specs[0][1][1], align=align,
                           blocks=tuple(blocks(n, h) for n, _, h in specs),
                           stored=tuple(f.stored(n, D if h else 0) for n, _, h in specs))

    def one(name: str, shape: tuple[int, int]) -> StackedRows:
        return stacked([(name, shape, 0)])

    def split(name: str, sizes: tuple[int, ...], cols: int) -> StackedRows:
        f.info(name, (sum(sizes), cols))
        native = f.tensors[name].type_name in NATIVE_TYPES
        rows, raw, stored, r0 = [], [], [], 0
        for n in sizes:
            rows.append((n, lambda a, b, r0=r0: f.read_rows(name, r0 + a, r0 + b)))
            raw.append((f.tensors[name].type_name, lambda a, b, r0=r0: f.read_raw_rows(name, r0 + a, r0 + b))
                       if native else None)
            stored.append(f.stored(name, 0, r0, r0 + n))
            r0 += n
        return StackedRows(tuple(rows), cols, blocks=tuple(raw), stored=tuple(stored))

    yield "embed", one("token_embd.weight", (config.vocab_size, E))
    for i in range(config.num_layers):
        p = f"blk.{i}."
        yield f"layers.{i}.attn_norm.weight", vec(p + "attn_norm.weight", (E,))
        if fused:
            yield f"layers.{i}.qkv.weight", split(p + "attn_qkv.weight", (H * D, Hkv * D, Hkv * D), E)
        else:
            yield f"layers.{i}.qkv.weight", stacked([(p + "attn_q.weight", (H * D, E), H if permuted else 0),
                                                     (p + "attn_k.weight", (Hkv * D, E), Hkv if permuted else 0),
                                                     (p + "attn_v.weight", (Hkv * D, E), 0)], align=D if permuted else 1)
        if config.qkv_bias:
            yield f"layers.{i}.qkv.bias", np.concatenate([vec(p + "attn_q.bias", (H * D,)),
                                                          vec(p + "attn_k.bias", (Hkv * D,)),
                                                          vec(p + "attn_v.bias", (Hkv * D,))])
        if config.qk_norm:
            yield f"layers.{i}.q_norm.weight", vec(p + "attn_q_norm.weight", (D,))
            yield f"layers.{i}.k_norm.weight", vec(p + "attn_k_norm.weight", (D,))
        yield f"layers.{i}.o.weight", one(p + "attn_output.weight", (E, H * D))
        if "post_attn_norm" in extra:
            yield f"layers.{i}.post_attn_norm.weight", vec(p + extra["post_attn_norm"] + ".weight", (E,))
        yield f"layers.{i}.mlp_norm.weight", vec(p + "ffn_norm.weight", (E,))
        if mlp is not None:
            yield from mlp(f, config, p, f"layers.{i}.")
        elif fused:
            yield f"layers.{i}.gate_up.weight", split(p + "ffn_up.weight", (F, F), E)
        else:
            yield f"layers.{i}.gate_up.weight", stacked([(p + "ffn_gate.weight", (F, E), 0),
                                                         (p + "ffn_up.weight", (F, E), 0)])
        if mlp is None:   # (the MoE's yields its own down projections)
            yield f"layers.{i}.down.weight", one(p + "ffn_down.weight", (E, F))
        if "post_mlp_norm" in extra:
            yield f"layers.{i}.post_mlp_norm.weight", vec(p + extra["post_mlp_norm"] + ".weight", (E,))
    yield "final_norm.weight", vec("output_norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", one("output.weight", (config.vocab_size, E))


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    if config.is_moe:
        raise ModelLoadError(f"{f.path}: a llama file with experts is read by the mixtral recipe")
    return decoder_gguf_tensors(f, config, permuted=True)
