"""OPT (HF OPTForCausalLM): learned absolute positions, pre-LayerNorm with biases, an ungated
fc1/fc2 MLP; HF safetensors only (llama.cpp has no OPT graph)."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from lite_llm.config import ModelConfig
from lite_llm.model.arch import llama
from lite_llm.model.files import ModelLoadError
from lite_llm.model.hf import concat, stacked
from lite_llm.model.weights import StackedRows

HF_ARCHITECTURES = ("OPTForCausalLM",)
POSITION_OFFSET = 2     # OPT's learned position table keeps 2 unused rows before position 0


def config(raw: dict, arch: str, where: str) -> ModelConfig:
    dim = int(raw["hidden_size"])
    if not raw.get("do_layer_norm_before", True):
        raise ModelLoadError(f"{where}: OPT with do_layer_norm_before=false (post-norm, OPT-350m) is not supported")
    if int(raw.get("word_embed_proj_dim", dim)) != dim:
        raise ModelLoadError(f"{where}: OPT with word_embed_proj_dim {raw['word_embed_proj_dim']} != hidden_size "
                             f"{dim} (projected embeddings) is not supported")
    if not raw.get("enable_bias", True) or not raw.get("layer_norm_elementwise_affine", True):
        raise ModelLoadError(f"{where}: OPT without biases or LayerNorm affine is not supported")
    if raw.get("_remove_final_layer_norm", False):
        raise ModelLoadError(f"{where}: OPT with _remove_final_layer_norm is not supported")
    common = llama.hf_fields(raw, ffn_key="ffn_dim")
    return ModelConfig(
        **common,
        architecture="OPTForCausalLM",
        num_kv_heads=common["num_heads"],
        head_dim=dim // common["num_heads"],
        max_position_embeddings=int(raw["max_position_embeddings"]),
        **llama.BIASED_LAYERNORM_BLOCK,
        norm_eps=1e-5,                  # OPT's nn.LayerNorm default; config.json does not store it
        act=llama.activation(raw.get("activation_function", "relu"), where),
        qk_norm=False,
        rope_theta=10000.0,
        rope_scaling=None,
        pos_offset=0,                   # hf_tensors strips POSITION_OFFSET rows: row 0 = position 0
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        sliding_window=None,
        eos_token_ids=llama.eos(raw),
    )


def hf_tensors(ckpt, config: ModelConfig) -> Iterator[tuple[str, np.ndarray | StackedRows]]:
    E, F, V, P = config.dim, config.ffn_dim, config.vocab_size, config.max_position_embeddings
    get = ckpt.read

    def rows(*parts: tuple[str, tuple[int, int]]) -> StackedRows:
        return stacked(ckpt, parts)

    d = "model.decoder."
    yield "embed", rows((d + "embed_tokens.weight", (V, E)))
    ckpt.entry(d + "embed_positions.weight", (P + POSITION_OFFSET, E))
    yield "pos_embed", StackedRows(((P, lambda a, b: ckpt.read_rows(d + "embed_positions.weight", a + POSITION_OFFSET,
                                                                    b + POSITION_OFFSET)),), E)
    for i in range(config.num_layers):
        h, p = f"{d}layers.{i}.", f"layers.{i}."
        yield p + "attn_norm.weight", get(h + "self_attn_layer_norm.weight", (E,))
        yield p + "attn_norm.bias", get(h + "self_attn_layer_norm.bias", (E,))
        a = h + "self_attn."
        yield p + "qkv.weight", rows(*((a + f"{x}_proj.weight", (E, E)) for x in "qkv"))
        yield p + "qkv.bias", concat(*(get(a + f"{x}_proj.bias", (E,)) for x in "qkv"))
        yield p + "o.weight", rows((a + "out_proj.weight", (E, E)))
        yield p + "o.bias", get(a + "out_proj.bias", (E,))
        yield p + "mlp_norm.weight", get(h + "final_layer_norm.weight", (E,))
        yield p + "mlp_norm.bias", get(h + "final_layer_norm.bias", (E,))
        yield p + "up.weight", rows((h + "fc1.weight", (F, E)))
        yield p + "up.bias", get(h + "fc1.bias", (F,))
        yield p + "down.weight", rows((h + "fc2.weight", (E, F)))
        yield p + "down.bias", get(h + "fc2.bias", (E,))
    yield "final_norm.weight", get(d + "final_layer_norm.weight", (E,))
    yield "final_norm.bias", get(d + "final_layer_norm.bias", (E,))
    if not config.tie_word_embeddings:
        yield "lm_head.weight", rows(("lm_head.weight", (V, E)))
