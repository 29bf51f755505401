"""The memory a model will take before it is loaded (plan_memory: weights as packed, the KV
cache at its max_model_len and max_num_seqs, activations), and what this machine and its cgroup
have for it (machine_memory). A server holding several models plans each load with these
(server/models.py); the numbers are estimates from the checkpoint's headers, nothing is loaded.
What is not here: sizing the KV cache itself (assemble.plan_kv_cache, which this calls).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

GiB = 1 << 30
# bytes per weight element as the runner packs float weights (bf16 / f16 / f32), and the ggml
# block types that --quantization makes of them: 32 values in 34 (q8_0) or 18 (q4_0) bytes
_FLOAT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_QUANT_BYTES = {"q8_0": 34 / 32, "q4_0": 18 / 32}


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes one model is planned to hold, by part."""
    weights: int
    kv_cache: int
    activations: int
    note: str = ""          # how the parts were estimated

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations

    def as_dict(self) -> dict:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "activations": self.activations,
                "total": self.total}

    def describe(self) -> str:
        return (f"{self.total / GiB:.2f} GiB (weights {self.weights / GiB:.2f}, KV cache {self.kv_cache / GiB:.2f}, "
                f"activations {self.activations / GiB:.2f})")


@dataclass(frozen=True)
class MachineMemory:
    total: int               # MemTotal, or the cgroup's memory.max when lower
    available: int           # MemAvailable, or the room left under the cgroup's limit when lower
    cgroup_limit: int | None


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None       # "max": no limit


def _cgroup_memory(root: str = "/") -> tuple[int | None, int | None]:
    """(limit, usage) of this process's memory cgroup (v2, else v1), None where unlimited/unknown."""
    base = os.path.join(root, "sys/fs/cgroup")
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as fh:
            lines = fh.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":                           # v2: one unified hierarchy
            d = os.path.join(base, path.lstrip("/"))
            limit = _read_int(os.path.join(d, "memory.max")) or _read_int(os.path.join(base, "memory.max"))
            usage = _read_int(os.path.join(d, "memory.current")) or _read_int(os.path.join(base, "memory.current"))
            return limit, usage
        if "memory" in controllers.split(","):
            d = os.path.join(base, "memory", path.lstrip("/"))
            limit = _read_int(os.path.join(d, "memory.limit_in_bytes"))
            if limit is not None and limit >= 1 << 60:  # v1 spells "no limit" as a huge number
                limit = None
            return limit, _read_int(os.path.join(d, "memory.usage_in_bytes"))
    return None, None


def machine_memory(root: str = "/") -> MachineMemory:
    info = _meminfo()
    total = info.get("MemTotal", 8 * GiB)
    available = info.get("MemAvailable", total // 2)
    limit, usage = _cgroup_memory(root)
    if limit is not None:
        total = min(total, limit)
        available = min(available, max(limit - (usage or 0), 0))
    return MachineMemory(total, available, limit)


def model_config(path: str):
    """The ModelConfig of a HF directory or GGUF file, from its headers."""
    from lite_llm.model import arch, gguf
    if os.path.isdir(path):
        return arch.read_config(path)[0]
    f = gguf.GGUFFile(path)
    name = f.metadata.get("general.architecture")
    return arch.for_gguf(name, path, f.metadata).gguf_config(f, name)


def weight_bytes(path: str, dtype: str, quantization: str | None) -> int:
    """The weights as the runner will pack them: a GGUF's block types as stored (the file's
    size); a safetensors checkpoint's float matrices in `dtype`, or in the --quantization block type."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    from lite_llm.model.hf import SafetensorsCheckpoint
    from lite_llm.model.loader import resolve_dtype
    per = _FLOAT_BYTES.get(resolve_dtype(dtype), 2)
    quant = _QUANT_BYTES.get(quantization or "")
    total = 0.0
    for entry in SafetensorsCheckpoint(path).entries.values():
        n = math.prod(entry.shape)
        total += n * (quant if quant and len(entry.shape) == 2 else per)
    return int(total)


def plan_memory(path: str, *, dtype: str = "auto", quantization: str | None = None,
                max_model_len: int | None = None, kv_cache_space: float | None = None,
                max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                block_size: int = 128, kv_cache_dtype: str = "auto", pooling: bool = False) -> MemoryPlan:
    """What loading `path` with these engine settings will take. The KV cache is the one
    assemble.plan_kv_cache would size (its pages are reserved whole, resident as they fill);
    activations: the step's buffers at max_num_batched_tokens tokens and the logits of
    max_num_seqs rows, in float32. A pooling model's KV cache holds one step (engine/pooling.py
    pooling_limits and pooling_num_blocks: blocks of 16 for every token of the step, plus one
    partial block per sequence)."""
    from lite_llm.engine.assemble import default_max_num_seqs, plan_kv_cache, plan_ranks
    from lite_llm.engine.pooling import POOLING_BLOCK_SIZE, pooling_limits, pooling_num_blocks
    from lite_llm.engine.runner import kv_bytes_per_block
    from lite_llm.model.loader import resolve_dtype
    config = model_config(path)
    weights = weight_bytes(path, dtype, quantization)
    length = min(max_model_len or config.max_position_embeddings, config.max_position_embeddings)
    tokens = max_num_batched_tokens or 2048
    if pooling:
        step, max_num_seqs = pooling_limits(length, tokens, max_num_seqs, True)
        kv = pooling_num_blocks(step, max_num_seqs, POOLING_BLOCK_SIZE) \
            * kv_bytes_per_block(config, POOLING_BLOCK_SIZE, resolve_dtype(dtype))
    else:
        if max_num_seqs is None:
            max_num_seqs = default_max_num_seqs(plan_ranks(1, True).num_threads, True)[0]
        plan = plan_kv_cache(config, resolve_dtype(dtype), block_size, length, kv_cache_space, weights,
                             max_num_seqs=max_num_seqs, kv_cache_dtype=kv_cache_dtype)
        kv = plan.num_blocks * plan.bytes_per_block + plan.state_bytes
    qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    per_token = 4 * config.dim + 2 * config.ffn_dim + qkv           # residual, norms, MLP, q/k/v
    activations = 4 * (tokens * per_token + min(max_num_seqs, tokens) * config.vocab_size)
    return MemoryPlan(weights, kv, activations,
                      f"KV at max_model_len {length} and max_num_seqs {max_num_seqs}; {tokens} tokens a step")
