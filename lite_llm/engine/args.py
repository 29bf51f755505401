"""EngineArgs (vLLM's name): everything that decides how an engine is built, in one typed,
validated value. It is made once, from the serve flags (from_cli), from `LLM(...)`'s
arguments, or by a data-parallel front end for its replicas (as_replica), and handed whole to
the one assembly function (engine/assemble.py: build_engine). A bad value fails here, before
anything is loaded, with a ValueError naming the argument.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from lite_llm.config import KV_CACHE_DTYPES, SpeculativeConfig, check_quantization
from lite_llm.model.pooler import check_parallel

def check_kv_cache_dtype(name: str | None) -> str:
    """A key of KV_CACHE_DTYPES (None: "auto"), else a ValueError listing them."""
    key = "auto" if name is None else str(name).lower()
    if key not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {name!r} is not supported; choose one of {', '.join(KV_CACHE_DTYPES)}")
    return key


@dataclass(frozen=True)
class EngineArgs:
    model: str | None = None                 # HF directory, .gguf file or hub id; None: the embedded default
    dtype: str = "auto"
    max_model_len: int | None = None
    block_size: int = 128                    # tokens per KV block
    kv_cache_space: float | None = None      # GiB; None: LITE_LLM_CPU_KVCACHE_SPACE, else auto-sized
    max_num_seqs: int | None = None          # None: default_max_num_seqs over the computing threads
    max_num_batched_tokens: int | None = None   # None: 2048 serving, 4096 offline
    enable_prefix_caching: bool = True
    seed: int = 0
    disable_sliding_window: bool = False
    skip_tokenizer_init: bool = False
    max_queue: int | None = None             # requests waiting in the AsyncEngine's inbox
    serving: bool = False                    # the server's defaults (budget, seqs, bandwidth probe)
    progress: bool = True                    # loading progress on stderr
    num_kv_blocks: int | None = None         # exactly this many KV blocks instead of kv_cache_space
    quantization: str | None = None          # None, or a key of config.QUANTIZATIONS
    kv_cache_dtype: str = "auto"             # a key of config.KV_CACHE_DTYPES
    speculative_config: SpeculativeConfig | None = None   # given as JSON text or a dict too
    tensor_parallel_size: int = 1
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    lora_modules: tuple[tuple[str, str], ...] = ()   # (name, path) adapters loaded at start
    mmproj: str | None = None                # llama.cpp's image encoder file beside a GGUF model
    deterministic: bool = False              # batch-invariant kernels: the same bits in any batch (config.KernelConfig)
    runner: str = "generate"                 # "pooling": embeddings, classification, scores (model/pooler.py)
    pooler_config: dict | str | None = None  # a pooling model's --pooler-config (vLLM's keys)
    hf_overrides: dict | str | None = None   # --hf-overrides (a reranker's classifier_from_token)

    def __post_init__(self) -> None:
        set_ = object.__setattr__      # frozen: the checked, normalised values replace the given ones
        set_(self, "quantization", check_quantization(self.quantization))
        set_(self, "kv_cache_dtype", check_kv_cache_dtype(self.kv_cache_dtype))
        set_(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))
        set_(self, "lora_modules", tuple(tuple(m) for m in self.lora_modules or ()))
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size}: must be >= 1")
        if self.lora_modules and not self.enable_lora:
            raise ValueError("--lora-modules needs --enable-lora")
        if self.runner not in ("generate", "pooling"):
            raise ValueError(f"runner {self.runner!r}: expected 'generate' or 'pooling' (resolve 'auto' first: "
                             "model.pooler.runner_for_model)")
        if self.runner == "pooling":
            check_parallel(self.tensor_parallel_size, self.model)

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots a draft model writes past each sampling chunk (its k), else 0."""
        spec = self.speculative_config
        return spec.num_speculative_tokens if spec is not None and spec.method == "draft_model" else 0

    def as_replica(self) -> EngineArgs:
        """These arguments for a data-parallel replica process: serving, no progress bar."""
        return dataclasses.replace(self, serving=True, progress=False)

    @classmethod
    def from_cli(cls, args: argparse.Namespace, **extra) -> EngineArgs:
        """From the serve flags (flags left unset keep the defaults above); extra: arguments
        the flags' owner resolved itself (the LoRA ones)."""
        values = dict(
            model=args.model or getattr(args, "model_flag", None), dtype=args.dtype,
            max_model_len=args.max_model_len, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=args.enable_prefix_caching,
            seed=args.seed, max_queue=getattr(args, "max_queue", None), kv_cache_space=args.kv_cache_space,
            disable_sliding_window=args.disable_sliding_window, quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype, speculative_config=args.speculative_config,
            tensor_parallel_size=args.tensor_parallel_size, mmproj=getattr(args, "mmproj", None),
            pooler_config=getattr(args, "pooler_config", None), hf_overrides=getattr(args, "hf_overrides", None),
            deterministic=getattr(args, "deterministic", None))
        values = {k: v for k, v in values.items() if v is not None}
        return cls(serving=True, **values, **extra)
