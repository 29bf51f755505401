"""Frozen configuration values, and the only module that reads environment variables.

ModelConfig is what a checkpoint (HF directory or GGUF file) says about the network, in one
vocabulary for every supported architecture; the forward pass reads nothing else.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    architecture: str            # HF name, e.g. "LlamaForCausalLM", "OPTForCausalLM"
    vocab_size: int              # V
    dim: int                     # E
    ffn_dim: int                 # F
    num_layers: int
    num_heads: int               # H
    num_kv_heads: int            # Hkv (H for MHA, 1 for MQA)
    head_dim: int                # D
    max_position_embeddings: int
    norm_eps: float = 1e-6
    norm: str = "rms"            # "rms" (RMSNorm) | "layer" (LayerNorm with bias)
    act: str = "silu"            # "silu" | "gelu" | "gelu_tanh" | "relu"
    gated_mlp: bool = True       # down(act(gate(x)) * up(x)); False: down(act(up(x))) (OPT fc1/fc2)
    qkv_bias: bool = False       # Qwen2, OPT
    o_bias: bool = False         # OPT
    mlp_bias: bool = False       # OPT
    qk_norm: bool = False        # Qwen3: RMSNorm over each head of q and k before RoPE
    rope: bool = True            # False: learned absolute positions (OPT)
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None   # HF's dict: {"rope_type": "linear"|"llama3"|"yarn", ...}
    pos_offset: int = 0          # learned positions: row of position 0 (OPT stores 2 extra rows)
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # attend to at most the last W positions (incl. self)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None     # what the checkpoint says, for dtype="auto" hints only

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


# --kv-cache-dtype (vLLM's names) -> the cache format (lite_llm/_kernels/layout.py KV_DTYPES);
# auto: float32 for fp32 models, bfloat16 for 16-bit ones; fp8 is e4m3, as in vLLM
KV_CACHE_DTYPES = {"auto": None, "bfloat16": "bfloat16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3",
                   "fp8_e5m2": "fp8_e5m2", "int8": "int8"}


def env(name: str, default: str | None = None) -> str | None:
    """LITE_LLM_<name>, else its vLLM alias VLLM_<name>, else default."""
    for key in (f"LITE_LLM_{name}", f"VLLM_{name}"):
        value = os.environ.get(key)
        if value not in (None, ""):
            return value
    return default
