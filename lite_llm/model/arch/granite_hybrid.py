"""Granite 4.0-H (HF GraniteMoeHybridForCausalLM): a hybrid decoder of Mamba2 layers (Bamba's
mixer, bamba.py) and attention layers, layer_types "mamba" / "attention" ("linear_attention" /
"full_attention" as transformers 5 writes them), with Granite's four multipliers (granite.py):
embeddings x embedding_multiplier, each sub-layer's output x residual_multiplier before its
residual add, attention_multiplier as the attention scale, logits / logits_scaling. Attention
rotates q and k by RoPE with position_embedding_type "rope", else ("nope", None) uses no
positions at all: the Mamba2 layers carry the order. Each layer's MLP is

    num_local_experts > 0: top num_experts_per_tok of the experts' logits, a softmax over those
                           (moe_routing "topk_softmax"), each expert a SwiGLU of intermediate_size,
                           plus the shared SwiGLU of shared_intermediate_size, ungated
    num_local_experts 0:   the shared SwiGLU alone (the dense "micro" models)

The checkpoint stores every SwiGLU's gate and up rows fused (input_linear [2F, E], gate first)
and the experts as 3-D tensors (block_sparse_moe.input_linear [X, 2F, E], output_linear
[X, E, F]; transformers 5 names them experts.gate_up_proj / down_proj), read per expert where
they lie.

llama.cpp's "granitehybrid" graph (its converter's GraniteHybridModel) marks a Mamba2 layer by 0
in its per-layer attention.head_count_kv and names the mixer's tensors blk.{i}.ssm_in, ssm_conv1d
([Cd, L]), ssm_dt.bias, ssm_a ([H, 1], already -exp(A_log)), ssm_d ([H, 1]), ssm_norm ([G, Di / G])
and ssm_out; the experts ffn_{gate,up,down}_exps with ffn_gate_inp as the router, the shared MLP
ffn_*_shexp (the dense models' ffn_gate / ffn_up / ffn_down); q/k rows permuted as for Llama.
Its attention rotates by RoPE only when rope.scaling.finetuned is true (the converter writes false
for every model with Mamba2 layers: Granite 4.0-H's "nope").

llama.cpp files Bamba (BambaForCausalLM) under "granitehybrid" too: the converter writes
rope.scaling.finetuned true for it alone among the hybrids, a dense SwiGLU and none of Granite's
multipliers, which is how its file is told apart here. Its q/k rows are permuted over whole heads,
as for Llama, while Bamba's RoPE (rotate-half) covers only the first half of each head: un-permuted
whole heads at load, the rows are transformers' again and the first half of each head rotates
as transformers rotates it. (llama.cpp instead rotates rope.dimension_count components in pairs of
the permuted rows, which pairs component j with j + head_dim / 2: another function than Bamba's.)
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import bamba, llama, moe
from lite_llm.model.arch.lfm2 import _gguf_rows
from lite_llm.model.files import ModelLoadError
from lite_llm.model.gguf import NATIVE_TYPES
from lite_llm.model.hf import split, stacked
from lite_llm.model.weights import StackedRows

HF_ARCHITECTURES = ("GraniteMoeHybridForCausalLM",)
GGUF_ARCHITECTURES = {"granitehybrid": "GraniteMoeHybridForCausalLM"}
# config.json's layer types -> ModelConfig.layer_types
_KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "full_attention",
          "full_attention": "full_attention"}


def layer_types(raw: dict, where: str) -> tuple[str, ...]:
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types") or raw.get("layers_block_type") or ["mamba"] * n
    if len(types) != n or any(t not in _KINDS for t in types):
        raise ModelLoadError(f"{where}: layer_types must name mamba or attention for each of the {n} layers")
    kinds = tuple(_KINDS[t] for t in types)
    if "full_attention" not in kinds:
        raise ModelLoadError(f"{where}: a model of Mamba2 layers only is not supported (at least one attention layer)")
    return kinds


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    position = raw.get("position_embedding_type")
    if position not in (None, "nope", "rope"):
        raise ModelLoadError(f"{where}: position_embedding_type {position!r} is not supported (rope, nope)")
    experts, shared = int(raw.get("num_local_experts") or 0), int(raw.get("shared_intermediate_size") or 0)
    if experts:
        top_k = int(raw.get("num_experts_per_tok") or 0)
        if not 0 < top_k <= experts:
            raise ModelLoadError(f"{where}: num_experts_per_tok {top_k} of {experts} experts")
        mlp = dict(ffn_dim=int(raw["intermediate_size"]), num_experts=experts, num_experts_per_tok=top_k,
                   moe_routing="topk_softmax", shared_ffn_dim=shared, shared_gate=False)
    elif shared:
        mlp = dict(ffn_dim=shared)
    else:
        raise ModelLoadError(f"{where}: neither experts (num_local_experts) nor a shared MLP (shared_intermediate_size)")
    return llama.decoder_config(
        raw, arch, where, layer_types=layer_types(raw, where), rope=position == "rope", nope=position != "rope",
        embedding_multiplier=float(raw.get("embedding_multiplier", 1.0)),
        residual_multiplier=float(raw.get("residual_multiplier", 1.0)),
        attention_multiplier=float(raw.get("attention_multiplier", 1.0)),
        logits_scaling=float(raw.get("logits_scaling", 1.0)), **mlp, **bamba.mamba_fields(raw, where))


def _name(ckpt, *names: str) -> str:
    """The first of `names` the checkpoint holds (else the first, for its error)."""
    return next((n for n in names if n in ckpt), names[0])


def _swiglu(ckpt, h: str, p: str, width: int, E: int) -> Iterator[tuple[str, Any]]:
    """A fused SwiGLU (h + "input_linear.weight" [2F, E], gate rows first; output_linear [E, F])
    as canonical gate_up and down under p."""
    yield p + "gate_up.weight", split(ckpt, h + "input_linear.weight", (width, width), E)
    yield p + "down.weight", stacked(ckpt, ((h + "output_linear.weight", (E, width)),))


def _moe(ckpt, config: ModelConfig, h: str, p: str) -> Iterator[tuple[str, Any]]:
    E, F, X = config.dim, config.ffn_dim, config.num_experts
    m = h + "block_sparse_moe."
    yield p + "router.weight", stacked(ckpt, ((_name(ckpt, m + "router.layer.weight", m + "router.weight"), (X, E)),))
    gate_up = _name(ckpt, m + "input_linear.weight", m + "experts.gate_up_proj")
    down = _name(ckpt, m + "output_linear.weight", m + "experts.down_proj")
    ckpt.entry(gate_up, (X, 2 * F, E))
    ckpt.entry(down, (X, E, F))
    for j in range(X):
        yield p + f"experts.{j}.gate_up.weight", split(ckpt, gate_up, (F, F), E, first=j * 2 * F)
        yield p + f"experts.{j}.down.weight", split(ckpt, down, (E,), F, first=j * E)
    if config.shared_ffn_dim:
        yield from _swiglu(ckpt, h + "shared_mlp.", p + "shared.", config.shared_ffn_dim, E)


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, V = config.dim, config.vocab_size
    get = ckpt.read
    yield "embed", stacked(ckpt, (("model.embed_tokens.weight", (V, E)),))
    for i in range(config.num_layers):
        h, p = f"model.layers.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", get(h + "input_layernorm.weight", (E,))
        if config.layer_types[i] == "mamba":
            yield from bamba.mamba_hf_tensors(ckpt, config, h + "mamba.", p)
        else:
            yield from bamba.attention_hf_tensors(ckpt, config, h + "self_attn.", p)
        yield p + "mlp_norm.weight", get(h + "post_attention_layernorm.weight", (E,))
        if config.is_moe:
            yield from _moe(ckpt, config, h, p)
        else:
            yield from _swiglu(ckpt, h + "shared_mlp.", p, config.ffn_dim, E)
    yield "final_norm.weight", get("model.norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", stacked(ckpt, (("lm_head.weight", (V, E)),))


# ---- GGUF --------------------------------------------------------------------------------


def gguf_config(f, arch: str) -> ModelConfig:
    meta, key = f.metadata, llama.gguf_key(f, arch)
    n = int(key("block_count"))
    kv = key("attention.head_count_kv")
    kv = [int(v) for v in kv] if isinstance(kv, (list, tuple)) else [int(kv)] * n
    heads = sorted(set(v for v in kv if v))
    if len(kv) != n or len(heads) != 1:
        raise ModelLoadError(f"{f.path}: {arch}.attention.head_count_kv must give one KV head count for the "
                             f"attention layers and 0 for the Mamba2 layers, {n} entries")
    types = tuple("full_attention" if v else "mamba" for v in kv)
    dim, num_heads = int(key("embedding_length")), int(key("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    if not vocab:
        raise ModelLoadError(f"{f.path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens gives the vocabulary size")
    inner, H = int(key("ssm.inner_size")), int(key("ssm.time_step_rank"))
    if "mamba" not in types or inner % H or inner != 2 * dim:
        raise ModelLoadError(f"{f.path}: {arch}: Mamba2 layers of {H} heads over ssm.inner_size {inner} "
                             f"(twice embedding_length {dim})")
    first = types.index("mamba")
    experts = int(meta.get(f"{arch}.expert_count") or 0)
    mlp = (dict(moe.gguf_fields(f, arch, norm_default=True, shared=True), moe_routing="topk_softmax",
                shared_gate=False) if experts else {})
    rope = bool(meta.get(f"{arch}.rope.scaling.finetuned", True))   # llama.cpp's default: RoPE on
    scale = meta.get(f"{arch}.attention.scale")
    multipliers = [meta.get(f"{arch}.{k}") for k in ("embedding_scale", "residual_scale", "attention.scale", "logit_scale")]
    bamba = rope and not experts and not any(multipliers)
    head_dim = int(meta.get(f"{arch}.attention.key_length", 0)) or dim // num_heads
    rotated = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rope and rotated not in ((head_dim, head_dim // 2) if bamba else (head_dim,)):
        raise ModelLoadError(f"{f.path}: {arch}.rope.dimension_count {rotated} of heads of {head_dim} is not supported "
                             f"({'Bamba: the whole head or half of it' if bamba else 'the whole head'})")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture="BambaForCausalLM" if bamba else GGUF_ARCHITECTURES[arch], vocab_size=int(vocab), dim=dim,
        ffn_dim=int(key("feed_forward_length")), num_layers=n, num_heads=num_heads, num_kv_heads=heads[0],
        head_dim=head_dim,
        partial_rotary_factor=0.5 if bamba else 1.0,   # transformers' Bamba rotates half of each head, always
        max_position_embeddings=int(key("context_length")), norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        qkv_bias=f"blk.{types.index('full_attention')}.attn_q.bias" in f.tensors,
        rope=rope, nope=not rope, rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in f.tensors, bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos_id),) if eos_id is not None else (), layer_types=types,
        # llama.cpp reads 0 (or no key) as "none": scale 1, the attention scale head_dim ** -0.5
        embedding_multiplier=float(meta.get(f"{arch}.embedding_scale") or 1.0),
        residual_multiplier=float(meta.get(f"{arch}.residual_scale") or 1.0),
        attention_multiplier=float(scale) if scale else None,
        logits_scaling=float(meta.get(f"{arch}.logit_scale") or 1.0),
        mamba_n_heads=H, mamba_d_head=inner // H, mamba_n_groups=int(key("ssm.group_count")),
        mamba_d_state=int(key("ssm.state_size")), mamba_d_conv=int(key("ssm.conv_kernel")),
        mamba_conv_bias=f"blk.{first}.ssm_conv1d.bias" in f.tensors,
        mamba_proj_bias=f"blk.{first}.ssm_in.bias" in f.tensors, **mlp)


def _qk_rows(f, name: str, shape: tuple[int, int], head_dim: int) -> StackedRows:
    """q or k rows [heads * D, E] as llama.cpp's converter permuted them, un-permuted per head."""
    f.info(name, shape)
    raw = (f.tensors[name].type_name, lambda a, b: llama._unpermute(f.read_raw_rows(name, a, b), (b - a) // head_dim))
    return StackedRows(((shape[0], lambda a, b: llama._unpermute(f.read_rows(name, a, b), (b - a) // head_dim)),),
                       shape[1], align=head_dim, blocks=(raw if raw[0] in NATIVE_TYPES else None,),
                       stored=(f.stored(name, head_dim),))


def gguf_tensors(f, config: ModelConfig) -> Iterator[tuple[str, Any]]:
    E, F, V, D = config.dim, config.ffn_dim, config.vocab_size, config.head_dim

    def vec(name: str, shape: tuple[int, ...]) -> np.ndarray:
        f.info(name, shape)
        return np.asarray(f.read(name), np.float32)

    yield "embed", _gguf_rows(f, [("token_embd.weight", (V, E))])
    for i in range(config.num_layers):
        b, p = f"blk.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", vec(b + "attn_norm.weight", (E,))
        if config.layer_types[i] == "mamba":
            yield from bamba.gguf_mixer(f, config, b, p)
        else:
            q = _qk_rows(f, b + "attn_q.weight", (config.q_size, E), D)
            k = _qk_rows(f, b + "attn_k.weight", (config.kv_size, E), D)
            v = _gguf_rows(f, [(b + "attn_v.weight", (config.kv_size, E))])
            yield p + "qkv.weight", StackedRows(q.parts + k.parts + v.parts, E, align=D, blocks=q.blocks + k.blocks + v.blocks,
                                                stored=q.stored + k.stored + v.stored)
            if config.qkv_bias:
                yield p + "qkv.bias", np.concatenate([vec(b + "attn_q.bias", (config.q_size,)),
                                                      vec(b + "attn_k.bias", (config.kv_size,)),
                                                      vec(b + "attn_v.bias", (config.kv_size,))])
            yield p + "o.weight", _gguf_rows(f, [(b + "attn_output.weight", (E, config.q_size))])
        yield p + "mlp_norm.weight", vec(b + "ffn_norm.weight", (E,))
        if config.is_moe:
            yield from moe.gguf_mlp(f, config, b, p)
        else:
            yield p + "gate_up.weight", _gguf_rows(f, [(b + "ffn_gate.weight", (F, E)), (b + "ffn_up.weight", (F, E))])
            yield p + "down.weight", _gguf_rows(f, [(b + "ffn_down.weight", (E, F))])
    yield "final_norm.weight", vec("output_norm.weight", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", _gguf_rows(f, [("output.weight", (V, E))])
