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
"""
from __future__ import annotations

from typing import Any, Iterator

from lite_llm.config import ModelConfig
from lite_llm.model.arch import bamba, llama
from lite_llm.model.files import ModelLoadError
from lite_llm.model.hf import stacked

HF_ARCHITECTURES = ("NemotronHForCausalLM",)
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
