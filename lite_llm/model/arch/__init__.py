"""Architecture recipes, one module per family: how a checkpoint's config and tensors map onto
ModelConfig, the canonical tensor names (lite_llm/model/__init__.py) and the per-layer
properties of the kernel model.

    llama.py   LlamaForCausalLM, MistralForCausalLM (and the "llama" GGUF graph)
    qwen.py    Qwen2ForCausalLM, Qwen3ForCausalLM ("qwen2", "qwen3")
    opt.py     OPTForCausalLM
    gemma.py   Gemma2ForCausalLM, Gemma3ForCausalLM ("gemma2", "gemma3")
    phi3.py    Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4-mini; "phi3")
    granite.py GraniteForCausalLM ("granite")
    mixtral.py MixtralForCausalLM (llama.cpp files it under "llama", with experts)
    qwen2_moe.py  Qwen2MoeForCausalLM ("qwen2moe": routed experts and a gated shared expert)
    qwen3_moe.py  Qwen3MoeForCausalLM ("qwen3moe")
    gpt_oss.py GptOssForCausalLM (attention sinks, clamped SwiGLU experts, top-k-then-softmax routing)
    deepseek.py   DeepseekV2ForCausalLM, DeepseekV3ForCausalLM (latent attention, grouped routing)
    lfm2.py    Lfm2ForCausalLM (hybrid: short-convolution layers with a per-sequence state, and attention)
    bamba.py   BambaForCausalLM (hybrid: Mamba2 layers with a per-sequence state, and attention; its
               GGUF, a "granitehybrid" file, is read by granite_hybrid.py)
    qwen3_next.py  Qwen3NextForCausalLM (hybrid: Gated DeltaNet layers with a per-sequence state, gated
               attention, experts with a gated shared expert)
    granite_hybrid.py  GraniteMoeHybridForCausalLM (Granite 4.0-H: Bamba's layers, Granite's multipliers,
               experts with a shared MLP or the shared MLP alone, attention with or without RoPE)
    nemotron_h.py  NemotronHForCausalLM (Nemotron-H: blocks of one mixer each, Mamba2, attention, relu^2 MLP
               or relu^2 experts with a shared MLP and DeepSeek-V3's routing; "nemotron_h" / "nemotron_h_moe")
    falcon_h1.py   FalconH1ForCausalLM (Falcon-H1: Mamba2 and attention side by side in every layer, µP multipliers)
    bert.py    BertModel, XLMRobertaModel and their *ForSequenceClassification (encoders, post-norm)
    qwen2_vl.py   Qwen2_5_VLForConditionalGeneration's language model (multimodal RoPE)
    llava.py   LlavaForConditionalGeneration's language model (a Llama; the GGUF is a "llama" file)
    moe.py     the mixture-of-experts MLP's config fields and tensors (HF and GGUF), for the above

A recipe module defines HF_ARCHITECTURES (the config.json names it reads), GGUF_ARCHITECTURES
(llama.cpp's general.architecture -> HF name), config(raw, arch, where) -> ModelConfig,
hf_tensors(ckpt, config), and, where GGUF is supported, gguf_config(f, arch) and
gguf_tensors(f, config). A file tensor neither read by the recipe nor named by its HF_UNREAD /
GGUF_UNREAD ((full-match pattern, reason) pairs: what it may leave unread, and why) refuses the
file (unread_tensors) before any tensor data is read: the loader walks the recipe on the names
first (loader.LoadedModel.iter_tensors). File formats stay in hf.py / gguf.py; what the layers compute is
lite_llm/_kernels/forward.pxi, driven by the KernelConfig built here.
"""
from __future__ import annotations

import dataclasses
import os
import re
from types import ModuleType

from lite_llm.config import KernelConfig, LayerConfig, ModelConfig
from lite_llm.model.arch import (bamba, bert, deepseek, falcon_h1, gemma, gpt_oss, granite, granite_hybrid, lfm2, llama,
                                 llava, mixtral, nemotron_h, opt, phi3, qwen, qwen2_moe, qwen2_vl, qwen3_moe, qwen3_next)
from lite_llm.model import hf
from lite_llm.model.files import ModelLoadError
from lite_llm.model.rope import rope_dim
from lite_llm.model.weights import bf16_to_f32, to_bf16

RECIPES: tuple[ModuleType, ...] = (llama, qwen, opt, gemma, phi3, granite, mixtral, qwen2_moe, qwen3_moe, bert,
                                   qwen2_vl, llava, gpt_oss, deepseek, lfm2, bamba, qwen3_next, granite_hybrid, nemotron_h,
                                   falcon_h1)
_BY_HF = {name: r for r in RECIPES for name in r.HF_ARCHITECTURES}
_BY_GGUF = {name: r for r in RECIPES for name in getattr(r, "GGUF_ARCHITECTURES", {})}
SUPPORTED_ARCHITECTURES = tuple(_BY_HF)
SUPPORTED_GGUF_ARCHITECTURES = tuple(_BY_GGUF)


def _recipe(table: dict, arch: str | None, where: str, kind: str, supported: tuple[str, ...]) -> ModuleType:
    recipe = table.get(arch)
    if recipe is None:
        raise ModelLoadError(f"{where}: {kind}architecture {arch!r} is not supported "
                             f"(supported: {', '.join(supported)})")
    return recipe


def for_hf(arch: str | None, where: str) -> ModuleType:
    """The recipe of HF architecture name `arch`, else a ModelLoadError listing the supported ones."""
    return _recipe(_BY_HF, arch, where, "", SUPPORTED_ARCHITECTURES)


def for_gguf(arch: str | None, where: str, metadata: dict | None = None) -> ModuleType:
    """The recipe of llama.cpp graph name `arch` (general.architecture); given the file's
    metadata, a "llama" file with experts is Mixtral's (llama.cpp files Mixtral under "llama")."""
    recipe = _recipe(_BY_GGUF, arch, where, "GGUF ", SUPPORTED_GGUF_ARCHITECTURES)
    if recipe is llama and metadata is not None and metadata.get(f"{arch}.expert_count"):
        return mixtral
    return recipe


# left unread by every recipe: a tied model's output matrix is its embedding (transformers ties
# them too), so a copy the file still carries is not read
_TIED_HEAD = (r"(?:.+\.)?lm_head\.weight", "a tied model's copy of its embedding")


def unread_tensors(recipe: ModuleType, names, read: set[str], config: ModelConfig, gguf: bool,
                   also: tuple[tuple[str, str], ...] = ()) -> list[str]:
    """Tensors of `names` (the file's, in file order) that the recipe neither read (`read`) nor
    lists as left unread with a reason: GGUF_UNREAD / HF_UNREAD of its module, (full-match
    pattern, reason) pairs, or a function of the config giving them; `also`: more such pairs
    (a quantization's, hfquant.unread)."""
    allowed = getattr(recipe, "GGUF_UNREAD" if gguf else "HF_UNREAD", ())
    allowed = tuple(allowed(config) if callable(allowed) else allowed) + tuple(also)
    if config.tie_word_embeddings and not gguf:
        allowed += (_TIED_HEAD,)
    return [n for n in names if n not in read and not any(re.fullmatch(p, n) for p, _ in allowed)]


def read_config(path: str) -> tuple[ModelConfig, dict]:
    """(ModelConfig, raw config.json dict) for the HF directory `path`."""
    raw = hf.read_config_json(path)
    return config_from_dict(raw, os.path.join(path, "config.json")), raw


def config_from_dict(raw: dict, where: str = "config.json") -> ModelConfig:
    """ModelConfig of an HF config.json dict."""
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else None
    recipe = for_hf(arch, where)
    try:
        return recipe.config(raw, arch, where)
    except KeyError as e:
        raise ModelLoadError(f"{where}: {arch} config lacks field {e.args[0]!r}") from None


def tensor_names(config: ModelConfig) -> list[str]:
    """Every canonical tensor a checkpoint of `config` yields, in load order (any source)."""
    if config.post_ln:
        return bert.tensor_names(config)
    if config.num_mamba_layers:
        return bamba.tensor_names(config, moe_tensor_names)
    if config.num_deltanet_layers:
        return qwen3_next.tensor_names(config)
    if config.is_hybrid:
        return lfm2.tensor_names(config)
    names = ["embed"] + (["pos_embed"] if not config.rope else [])
    layer_norm = config.norm == "layer"
    for i in range(config.num_layers):
        p = f"layers.{i}."
        names += [p + "attn_norm.weight"] + ([p + "attn_norm.bias"] if layer_norm else [])
        if config.is_mla:
            names += deepseek.mla_tensor_names(config, p) + [p + "mlp_norm.weight"]
            if i < config.first_dense_layers:
                names += [p + "gate_up.weight", p + "down.weight"]
            else:
                names += moe_tensor_names(config, p)
            continue
        names += [p + "qkv.weight"] + ([p + "qkv.bias"] if config.qkv_bias else [])
        if config.qk_norm:
            names += [p + "q_norm.weight", p + "k_norm.weight"]
        names += [p + "o.weight"] + ([p + "o.bias"] if config.o_bias else [])
        if config.attn_sinks:
            names.append(p + "sinks")
        if config.post_norms:
            names.append(p + "post_attn_norm.weight")
        names += [p + "mlp_norm.weight"] + ([p + "mlp_norm.bias"] if layer_norm else [])
        if config.is_moe:
            names += moe_tensor_names(config, p)
        else:
            mlp_in = "gate_up" if config.gated_mlp else "up"
            names += [p + f"{mlp_in}.weight"] + ([p + f"{mlp_in}.bias"] if config.mlp_bias else [])
            names += [p + "down.weight"] + ([p + "down.bias"] if config.mlp_bias else [])
        if config.post_norms:
            names.append(p + "post_mlp_norm.weight")
    names += ["final_norm.weight"] + (["final_norm.bias"] if layer_norm else [])
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def moe_tensor_names(config: ModelConfig, p: str) -> list[str]:
    """A mixture-of-experts MLP's canonical tensors under layer prefix p: the router [X, E]
    (run in fp32), each expert's gate_up [2F, E] (ungated experts, gated_mlp False: up [F, E])
    and down [E, F], and the shared expert with its gate vector [E] where the model has one."""
    names = [p + "router.weight"] + ([p + "router.bias"] if config.expert_bias else [])
    up = "gate_up" if config.gated_mlp else "up"
    for j in range(config.num_experts):
        if config.expert_bias:   # gpt-oss
            names += [p + f"experts.{j}.{up}.{w}" for w in ("weight", "bias")]
            names += [p + f"experts.{j}.down.{w}" for w in ("weight", "bias")]
        else:
            names += [p + f"experts.{j}.{up}.weight", p + f"experts.{j}.down.weight"]
    if config.moe_routing == "grouped_sigmoid":
        names.append(p + "router.correction_bias")
    if config.shared_ffn_dim:
        names += [p + f"shared.{up}.weight", p + "shared.down.weight"]
        names += [p + "shared_gate.weight"] if config.shared_gate else []
    return names


def layer_is_sliding(config: ModelConfig, layer: int) -> bool:
    """Whether `layer` attends within config.sliding_window (every layer when layer_types is
    empty and a window is set: Mistral, Qwen2 with use_sliding_window)."""
    if not config.sliding_window:
        return False
    return not config.layer_types or config.layer_types[layer] == "sliding_attention"


def rope_configs(config: ModelConfig) -> list[ModelConfig]:
    """The distinct RoPE setups of the model's layers, as configs rope.rope_tables() takes:
    [global] or [global, sliding] when sliding layers have their own base (Gemma 3)."""
    tables = [config]
    if config.rope_local_theta is not None and any(layer_is_sliding(config, i) for i in range(config.num_layers)):
        tables.append(dataclasses.replace(config, rope_theta=config.rope_local_theta, rope_scaling=None))
    return tables


def kernel_config(config: ModelConfig, *, dtype: str, block_size: int, max_positions: int, kv_cache_dtype: str,
                  bf16_path: str | None = None, attn_path: str = "auto",
                  disable_sliding_window: bool = False, batch_invariant: bool = False) -> KernelConfig:
    """The typed configuration of the kernel model (checked once, in KernelConfig)."""
    local_rope = 1 if len(rope_configs(config)) > 1 else 0
    layers = []
    for i in range(config.num_layers):
        sliding = layer_is_sliding(config, i) and not disable_sliding_window
        layers.append(LayerConfig(sliding_window=int(config.sliding_window) if sliding else 0,
                                  rope_table=local_rope if layer_is_sliding(config, i) else 0,
                                  kind=_layer_kind(config, i), mlp=i not in config.no_mlp_layers,
                                  shared_input=i in config.shared_input_layers))
    scale = (config.query_pre_attn_scalar if config.query_pre_attn_scalar else config.head_dim) ** -0.5
    if config.attention_multiplier is not None:
        scale = config.attention_multiplier
    if config.is_mla:
        scale = deepseek.softmax_scale(config)
    return KernelConfig(
        dtype=dtype, num_layers=config.num_layers, dim=config.dim, ffn_dim=config.ffn_dim,
        vocab_size=config.vocab_size, num_heads=config.num_heads, num_kv_heads=config.cache_kv_heads,
        head_dim=config.cache_head_dim, block_size=block_size, max_positions=max_positions, norm=config.norm,
        norm_eps=config.norm_eps, act=config.act, gated_mlp=config.gated_mlp, rope=config.rope,
        rope_dim=rope_dim(config),
        qk_norm=config.qk_norm, post_norms=config.post_norms, attn_scale=float(scale),
        embed_scale=_embed_scale(config, dtype) * config.embedding_multiplier,
        residual_scale=float(config.residual_multiplier), logit_scale=1.0 / config.logits_scaling, attn_softcap=float(config.attn_softcap or 0.0),
        final_softcap=float(config.final_softcap or 0.0),
        kv_cache_dtype=kv_cache_dtype, bf16_path=bf16_path, layers=tuple(layers), attn_path=attn_path, nope=config.nope,
        batch_invariant=batch_invariant,
        num_experts=config.num_experts, num_experts_per_tok=config.num_experts_per_tok,
        norm_topk_prob=config.norm_topk_prob, shared_ffn_dim=config.shared_ffn_dim, post_ln=config.post_ln,
        moe_routing=config.moe_routing,
        mrope_section=tuple(config.mrope_section), n_group=config.n_group, topk_group=config.topk_group,
        routed_scale=config.routed_scale, shared_gate=config.shared_gate,
        first_dense_layers=config.first_dense_layers, dense_ffn_dim=config.dense_ffn_dim,
        kv_lora_rank=config.kv_lora_rank, q_lora_rank=config.q_lora_rank,
        qk_nope_head_dim=config.qk_nope_head_dim if config.is_mla else 0,
        v_head_dim=config.v_head_dim if config.is_mla else 0, rope_interleave=config.rope_interleave,
        conv_len=config.recurrent_len if config.is_hybrid else 0, mamba_heads=config.mamba_n_heads,
        mamba_head_dim=config.mamba_d_head, mamba_groups=config.mamba_n_groups, mamba_state=config.mamba_d_state,
        gdn_k_heads=config.linear_num_key_heads, gdn_v_heads=config.linear_num_value_heads,
        gdn_k_dim=config.linear_key_head_dim, gdn_v_dim=config.linear_value_head_dim,
        attn_gate=config.attn_output_gate, mamba_dt_min=config.mamba_dt_min, mamba_norm=config.mamba_norm)


def _layer_kind(config: ModelConfig, layer: int) -> str:
    """LayerConfig.kind of `layer`: "conv" (LFM2's short convolution), "mamba", "deltanet", else
    "attention"."""
    kind = config.layer_types[layer] if config.layer_types else ""
    return kind if kind in ("conv", "mamba", "deltanet") else "attention"


def _embed_scale(config: ModelConfig, dtype: str) -> float:
    """sqrt(dim) rounded to the model dtype, as transformers multiplies Gemma's embeddings by a
    tensor of that dtype (1.0: no scaling)."""
    if not config.embed_scale:
        return 1.0
    import numpy as np
    value = np.array([config.dim ** 0.5], np.float32)
    if dtype == "bfloat16":
        value = bf16_to_f32(to_bf16(value))
    elif dtype == "float16":
        value = value.astype(np.float16).astype(np.float32)
    return float(value[0])
