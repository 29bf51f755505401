"""The offline API (vLLM's `LLM`) and the one function that builds a running engine from a
model argument: load -> size the KV cache -> runner -> LLMEngine -> AsyncEngine whose thread
binds the OpenMP pool to the planned cores. The server uses build_async_engine too.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any

from lite_llm import cpu
from lite_llm.config import SpeculativeConfig, env
from lite_llm.outputs import RequestOutput, fold
from lite_llm.sampling_params import RequestOutputKind, SamplingParams

log = logging.getLogger("lite_llm")

GiB = 1 << 30
DEFAULT_AUTO_KV_GIB = 4.0   # vLLM CPU's default; the pages are touched only as blocks fill
SEQS_PER_THREAD = 32        # the default max_num_seqs per computing thread (see default_max_num_seqs)


def default_max_num_seqs(num_threads: int, serving: bool) -> tuple[int, str]:
    """max_num_seqs when none is given, and why: vLLM's CPU default (256 offline, 128 for the
    server), capped at SEQS_PER_THREAD per computing thread. Past a few sequences a decode step
    is bound by compute, not by the weight stream, so each further sequence adds its own time
    to the step: on 2 threads throughput is flat from 48 to 128 sequences (BENCHMARKS.md,
    "How many sequences at once") while every running sequence keeps its KV pages resident and
    each token waits for the whole batch. Requests past the cap queue, as past vLLM's."""
    base = 128 if serving else 256
    cap = SEQS_PER_THREAD * max(1, num_threads)
    if cap < base:
        return cap, f"{SEQS_PER_THREAD} per computing thread x {num_threads}; vLLM's {base} past {base // SEQS_PER_THREAD} threads"
    return base, f"vLLM's CPU default{' for the server' if serving else ''}"


@dataclass(frozen=True)
class KVPlan:
    num_blocks: int
    block_size: int
    bytes_per_block: int
    max_model_len: int
    kv_cache_dtype: str = ""     # the cache's format (layout.KV_DTYPES), for messages
    reason: str = ""             # why this size (the bound an automatic size met)

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        return self.num_tokens / self.max_model_len

    def describe(self) -> str:
        dtype = f" {self.kv_cache_dtype}" if self.kv_cache_dtype else ""
        return (f"KV cache: {self.num_blocks} blocks x {self.block_size} tokens = {self.num_tokens} tokens "
                f"({self.num_blocks * self.bytes_per_block / GiB:.2f} GiB{dtype}); maximum concurrency for "
                f"{self.max_model_len} tokens per request: {self.max_concurrency:.2f}x"
                + (f" ({self.reason})" if self.reason else ""))


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * GiB


def plan_kv_cache(config, dtype: str, block_size: int, max_model_len: int,
                  kv_cache_space: float | None, weight_bytes: int = 0, num_blocks: int | None = None,
                  max_num_seqs: int | None = None, kv_cache_dtype: str | None = "auto",
                  tensor_parallel_size: int = 1) -> KVPlan:
    """Blocks for `kv_cache_space` GiB (argument, else LITE_LLM_CPU_KVCACHE_SPACE /
    VLLM_CPU_KVCACHE_SPACE, else auto: the least of 4 GiB, half the memory available after the
    weights, and what max_num_seqs sequences of max_model_len tokens can ever hold), or exactly
    `num_blocks` when given (a caller that knows its workload: bench latency), each block as
    many bytes as kv_cache_dtype makes it (int8 / fp8: about half of bf16). The cache's pages
    become resident only as blocks are first written (see block_pool). Raises ValueError with
    the numbers when one max_model_len request cannot fit.
    With tensor_parallel_size N, a space in GiB (given, or the 4 GiB default) is each rank's,
    as vLLM's VLLM_CPU_KVCACHE_SPACE is each worker's: every rank holds the same blocks of its
    own KV heads, so the block count is the space over the largest rank's block. The memory
    available bounds all ranks together; bytes_per_block is then every rank's block summed."""
    from lite_llm.engine.runner import kv_bytes_per_block, kv_cache_format
    per_block = kv_bytes_per_block(config, block_size, dtype, kv_cache_dtype)
    per_rank = per_block
    if tensor_parallel_size > 1:
        from lite_llm.engine.tp import check_tensor_parallel, rank_config
        check_tensor_parallel(config, tensor_parallel_size)
        ranks = [kv_bytes_per_block(rank_config(config, r, tensor_parallel_size), block_size, dtype, kv_cache_dtype)
                 for r in range(tensor_parallel_size)]
        per_block, per_rank = sum(ranks), max(ranks)
    each = per_block / per_rank          # a per-rank byte budget in bytes of every rank's blocks
    fmt = kv_cache_format(dtype, kv_cache_dtype)
    source = "argument"
    if num_blocks is not None:
        return _checked_plan(num_blocks * per_block, per_block, block_size, max_model_len, "num_blocks", fmt)
    if kv_cache_space is None:
        value = env("CPU_KVCACHE_SPACE")
        if value is not None:
            try:
                kv_cache_space, source = float(value), "LITE_LLM_CPU_KVCACHE_SPACE"
            except ValueError:
                raise ValueError(f"LITE_LLM_CPU_KVCACHE_SPACE must be a number of GiB, got {value!r}") from None
    if kv_cache_space is None or kv_cache_space <= 0:
        per = f" per rank of {tensor_parallel_size}" if tensor_parallel_size > 1 else ""
        bounds = {f"{DEFAULT_AUTO_KV_GIB:g} GiB{per}, vLLM's default": DEFAULT_AUTO_KV_GIB * GiB * each,
                  f"half of the {_mem_available() / GiB:.1f} GiB available after the weights":
                      max(_mem_available() - weight_bytes, 0) / 2}
        if max_num_seqs:
            bounds[f"all that {max_num_seqs} sequences of {max_model_len} tokens can hold"] = \
                max_num_seqs * -(-max_model_len // block_size) * per_block
        reason, nbytes = min(bounds.items(), key=lambda kv: kv[1])
        return _checked_plan(nbytes, per_block, block_size, max_model_len, "auto", fmt, f"auto-sized: {reason}")
    return _checked_plan(kv_cache_space * GiB * each, per_block, block_size, max_model_len, source, fmt,
                         f"{kv_cache_space:g} GiB for each of {tensor_parallel_size} ranks"
                         if tensor_parallel_size > 1 else "")


def _checked_plan(nbytes: float, per_block: int, block_size: int, max_model_len: int, source: str,
                  kv_cache_dtype: str = "", reason: str = "") -> KVPlan:
    """The plan for nbytes of KV cache, or ValueError when one max_model_len request cannot fit."""
    num_blocks = int(nbytes // per_block)
    needed = -(-max_model_len // block_size)
    if num_blocks < needed:
        need_gib = needed * per_block / GiB
        raise ValueError(
            f"the KV cache ({source}: {nbytes / GiB:.3f} GiB = {num_blocks} blocks of {block_size} tokens, "
            f"{num_blocks * block_size} tokens) cannot hold one request of max_model_len={max_model_len} "
            f"tokens, which needs {needed} blocks ({need_gib:.3f} GiB). Raise kv_cache_space / "
            f"LITE_LLM_CPU_KVCACHE_SPACE to at least {need_gib:.3f} or lower max_model_len.")
    return KVPlan(num_blocks, block_size, per_block, max_model_len, kv_cache_dtype, reason)


def build_engine(model: str | None = None, *, dtype: str = "auto", max_model_len: int | None = None,
                 block_size: int = 128, kv_cache_space: float | None = None, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, enable_prefix_caching: bool = True,
                 seed: int = 0, disable_sliding_window: bool = False, skip_tokenizer_init: bool = False,
                 max_queue: int | None = None, serving: bool = False, progress: bool = True,
                 num_kv_blocks: int | None = None, quantization: str | None = None,
                 kv_cache_dtype: str | None = "auto", speculative_config=None, tensor_parallel_size: int = 1,
                 enable_lora: bool = False, max_loras: int = 1, max_lora_rank: int = 16,
                 lora_modules: list[tuple[str, str]] | None = None, mmproj: str | None = None):
    """Everything from a model argument to a started AsyncEngine. Returns (engine, loaded, info).
    num_kv_blocks: exactly this many KV blocks instead of kv_cache_space (see plan_kv_cache).
    speculative_config: config.SpeculativeConfig, its dict or JSON text (vLLM's keys).
    tensor_parallel_size: ranks (engine/tp.py): from the bind spec's lists, or NUMA nodes under auto.
    enable_lora: room for max_loras LoRA adapters of rank <= max_lora_rank, served per request
    (lora.py); lora_modules: (name, path) adapters loaded at start.
    max_num_seqs None: default_max_num_seqs over every rank's computing threads."""
    t0 = time.perf_counter()
    cpu.configure_openmp_env()          # before the first OpenMP region in the process
    plan = plan_ranks(tensor_parallel_size, serving)
    for line in plan.describe():
        log.info("%s", line)
    for note in plan.notes:
        log.info("note: %s", note)
    if max_num_seqs is None:
        max_num_seqs, why = default_max_num_seqs(sum(r.num_threads for r in plan.ranks), serving)
        log.info("max_num_seqs %d (%s; --max-num-seqs to change)", max_num_seqs, why)

    from lite_llm import _kernels
    from lite_llm.engine.async_engine import AsyncEngine, EngineDeadError
    from lite_llm.engine.engine import EngineConfig, LLMEngine
    from lite_llm.engine.live import attach_engine_threads
    from lite_llm.engine.runner import ModelRunner, check_kv_cache_dtype, check_quantization
    from lite_llm.engine.spec_decode import make_proposer
    from lite_llm.model.loader import load_model

    quantization = check_quantization(quantization)      # a bad value fails before any loading
    kv_cache_dtype = check_kv_cache_dtype(kv_cache_dtype)
    spec = SpeculativeConfig.parse(speculative_config)

    log.info("kernel variant %s (%s)", _kernels.VARIANT.name, "; ".join(_kernels.explain()))
    loaded = load_model(model, dtype=dtype, max_model_len=max_model_len,
                        skip_tokenizer_init=skip_tokenizer_init, progress=progress, mmproj=mmproj)
    cfg = loaded.config
    if max_num_batched_tokens is None:
        max_num_batched_tokens = 2048 if serving else 4096
    weight_estimate = os.path.getsize(loaded.source) if os.path.isfile(loaded.source) else 0
    kv = plan_kv_cache(cfg, loaded.dtype, block_size, loaded.max_model_len, kv_cache_space, weight_estimate,
                       num_blocks=num_kv_blocks, max_num_seqs=max_num_seqs, kv_cache_dtype=kv_cache_dtype,
                       tensor_parallel_size=tensor_parallel_size)
    log.info("%s", kv.describe())
    num_threads = plan.num_threads
    eos = tuple(cfg.eos_token_ids)
    gen_eos = loaded.generation_config.get("eos_token_id")
    if gen_eos is not None:
        eos = tuple(dict.fromkeys(eos + tuple(gen_eos if isinstance(gen_eos, list) else [gen_eos])))
    engine_config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                 block_size=block_size, num_blocks=kv.num_blocks,
                                 enable_prefix_caching=enable_prefix_caching,
                                 max_model_len=loaded.max_model_len, seed=seed, eos_token_ids=eos,
                                 vocab_size=cfg.vocab_size,
                                 num_lookahead_tokens=spec.num_speculative_tokens
                                 if spec is not None and spec.method == "draft_model" else 0)
    engine = LLMEngine(None, loaded.tokenizer, engine_config)   # the runner is built on the engine thread
    group = None

    def start_on_engine_thread():
        """Bind the OpenMP pool, then load: every OpenMP region of the process runs from this
        thread. A second thread's pool would make libgomp count more threads than CPUs and
        drop its barrier spinning to almost nothing: every barrier a sleep and a wake-up."""
        nonlocal group
        if tensor_parallel_size > 1:   # workers load their shards while this rank loads its own
            from lite_llm.engine import tp
            group = tp.start_group(loaded, plan, num_blocks=kv.num_blocks, block_size=block_size,
                                   max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                   kv_cache_dtype=kv_cache_dtype, disable_sliding_window=disable_sliding_window,
                                   quantization=quantization, on_failure=_exit_server if serving else None)
        try:
            report = cpu.apply_plan(plan)
            for line in report.describe():
                log.info("%s", line)
            attach_engine_threads(async_engine.live, num_threads, report.planned, measure_bandwidth=serving)
            proposer = None
            if spec is not None:
                proposer = make_proposer(spec, loaded.config, dtype=loaded.dtype, num_blocks=kv.num_blocks,
                                         block_size=block_size, max_num_batched_tokens=max_num_batched_tokens,
                                         max_num_seqs=max_num_seqs, num_threads=num_threads,
                                         max_model_len=loaded.max_model_len, kv_cache_dtype=kv_cache_dtype)
            engine.runner = ModelRunner(loaded, num_blocks=kv.num_blocks, block_size=block_size,
                                        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                        num_threads=num_threads, disable_sliding_window=disable_sliding_window,
                                        quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                                        proposer=proposer, tp_rank=0, tp_size=tensor_parallel_size,
                                        tp_group=group, max_loras=max_loras if enable_lora else 0,
                                        max_lora_rank=max_lora_rank)
            if enable_lora:
                from lite_llm.lora import LoRAManager
                engine.lora = LoRAManager(loaded.config, engine.runner.lora_weights, max_loras, max_lora_rank)
            if group is not None:
                group.wait_ready()
                group.ranks[0].update(binding="; ".join(report.describe()), cpus=list(report.planned),
                                      observed=list(report.observed), ok=report.ok)
                for line in group.describe():
                    log.info("%s", line)
        except BaseException:
            if group is not None:
                group.close()
            raise

    async_engine = AsyncEngine(engine, max_queue=max_queue, on_engine_thread_start=start_on_engine_thread)
    try:
        async_engine.start()
    except EngineDeadError as e:     # a broken checkpoint: raise what the loader said
        raise (e.__cause__ or e) from None
    runner = engine.runner
    if lora_modules and not enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    for name, path in lora_modules or ():
        try:
            engine.lora.load(name, path)
        except ValueError:
            async_engine.shutdown(0.0)
            raise
    info = {
        "model_path": loaded.source, "model_name": model or os.path.basename(loaded.source),
        "max_model_len": loaded.max_model_len, "dtype": loaded.dtype, "architecture": cfg.architecture,
        "kernel_variant": _kernels.VARIANT.name, "num_threads": num_threads,
        "thread_plan": plan.describe(), "kv_cache_tokens": kv.num_tokens, "kv_cache_blocks": kv.num_blocks,
        "kv_cache_bytes": kv.num_blocks * kv.bytes_per_block, "kv_cache_dtype": kv.kv_cache_dtype,
        "max_concurrency": kv.max_concurrency, "generation_config": loaded.generation_config,
        "vocab_size": cfg.vocab_size, "weight_bytes": runner.weight_bytes,
        "bytes_per_token": runner.bytes_per_token, "weight_formats": runner.formats,
        "gemm_paths": runner.gemm_paths.as_dict(), "layer_macs_per_token": runner.layer_macs_per_token,
        "head_macs_per_row": runner.head_macs_per_row, "num_layers": cfg.num_layers, "q_size": cfg.q_size,
        "startup_seconds": time.perf_counter() - t0,
        "speculative_config": None if spec is None else dataclasses.asdict(spec),
        "tensor_parallel_size": tensor_parallel_size,
        "enable_lora": enable_lora, "max_loras": max_loras if enable_lora else 0, "max_lora_rank": max_lora_rank,
        "tensor_parallel_ranks": group.ranks if group is not None else [],
        "mmproj": loaded.mmproj,
    }
    if group is not None:
        async_engine.tp_group = group      # closed with the engine (LLM.shutdown, server exit)
    log.info("engine ready in %.2f s: %s, %d threads, %s", info["startup_seconds"], _kernels.VARIANT.name,
             num_threads, kv.describe())
    return async_engine, loaded, info


def plan_ranks(tensor_parallel_size: int, serving: bool, topology: cpu.Topology | None = None) -> cpu.ThreadPlan:
    """The thread plan for `tensor_parallel_size` ranks on `topology` (None: this machine's):
    auto deals NUMA nodes (or slices of one) to them; an explicit bind spec must list exactly
    that many CPU lists."""
    from lite_llm.engine import tp
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size}: must be >= 1")
    bind = env("CPU_OMP_THREADS_BIND", "auto").strip()
    topo = topology or cpu.read_topology()
    if bind in ("auto", "nobind"):
        return cpu.plan_threads(topo, serving=serving, world_size=tensor_parallel_size)
    plan = cpu.plan_threads(topo, serving=serving)
    tp.check_plan(plan, tensor_parallel_size, bind)
    return plan


def _exit_server(message: str) -> None:
    """A tensor-parallel rank died under a server: nothing can run; say so and stop the process
    (SIGTERM: the server's own shutdown, whose drain ends at once as every request fails)."""
    log.critical("%s: stopping the server", message)
    os.kill(os.getpid(), signal.SIGTERM)


def build_async_engine(model: str | None = None, **kwargs):
    """For the server: (AsyncEngine, tokenizer, info); serving defaults (2048-token budget)."""
    kwargs.setdefault("serving", True)
    engine, loaded, info = build_engine(model, **kwargs)
    return engine, loaded.tokenizer, info


def default_sampling_params(generation_config: dict) -> SamplingParams:
    """SamplingParams with the model's generation_config.json defaults, as vLLM applies them."""
    fields = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
              "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
    kwargs = {ours: generation_config[theirs] for theirs, ours in fields.items()
              if generation_config.get(theirs) is not None}
    return SamplingParams(**kwargs)


class LLM:
    """Offline batched generation, vLLM-compatible:

        llm = LLM("path/to/model")                       # or a .gguf file; None: SmolLM2-135M
        outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
        outs[0].outputs[0].text
    """

    def __init__(self, model: str | None = None, dtype: str = "auto", max_model_len: int | None = None,
                 seed: int = 0, block_size: int = 128, kv_cache_space: float | None = None,
                 enable_prefix_caching: bool = True, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, skip_tokenizer_init: bool = False,
                 disable_sliding_window: bool = False, tokenizer: str | None = None,
                 quantization: str | None = None, kv_cache_dtype: str = "auto",
                 speculative_config: dict | str | None = None, tensor_parallel_size: int = 1,
                 runner: str = "auto", pooler_config: dict | str | None = None,
                 hf_overrides: dict | str | None = None, enable_lora: bool = False, max_loras: int = 1,
                 max_lora_rank: int = 16, **kwargs: Any):
        from lite_llm import multimodal
        self._media = multimodal.media_config(kwargs.pop("limit_mm_per_prompt", None),   # image inputs
                                              kwargs.pop("mm_processor_kwargs", None),
                                              kwargs.pop("allowed_media_domains", None))
        mmproj = kwargs.pop("mmproj", None)     # llama.cpp's image encoder file beside a GGUF model
        if kwargs:
            log.warning("LLM: ignoring unsupported arguments %s", sorted(kwargs))
        from lite_llm import pooling   # runner="pooling": embeddings, classification, scores
        self.runner_type = pooling.runner_for_model(model, runner, hf_overrides)
        self._pooling = None
        if self.runner_type == "pooling":
            self._engine = None
            pooling.check_parallel(tensor_parallel_size, model)
            self._pooling, self._loaded, self.info = pooling.build_pooling_engine(
                model, dtype=dtype, max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs, quantization=quantization, pooler_config=pooler_config,
                hf_overrides=hf_overrides)
            self.tokenizer, self.config = self._loaded.tokenizer, self._loaded.config
            return
        self._engine, self._loaded, self.info = build_engine(
            model, dtype=dtype, max_model_len=max_model_len, block_size=block_size,
            kv_cache_space=kv_cache_space, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=enable_prefix_caching,
            seed=seed, disable_sliding_window=disable_sliding_window,
            skip_tokenizer_init=skip_tokenizer_init, serving=False, quantization=quantization,
            kv_cache_dtype=kv_cache_dtype, speculative_config=speculative_config,
            tensor_parallel_size=tensor_parallel_size, enable_lora=enable_lora, max_loras=max_loras,
            max_lora_rank=max_lora_rank, mmproj=mmproj)
        self.tokenizer = self._loaded.tokenizer
        self.config = self._loaded.config
        self._mm_processor = multimodal.Processor.for_model(self._loaded.source, self._loaded.mmproj)

    # ---- public API -------------------------------------------------------------------

    def get_tokenizer(self):
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        return default_sampling_params(self._loaded.generation_config)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True, lora_request=None) -> list[RequestOutput]:
        """prompts: a str, a {"prompt_token_ids": [...]} dict, or a list of either. Runs them
        batched; returns one RequestOutput per prompt, in order. lora_request: a LoRARequest
        (or None: the base model) for every prompt, or a list of them, one per prompt."""
        self._need("generate")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        # folded below: the engine needs to hand each request over only once, finished
        final = {id(sp): sp.replace(output_kind=RequestOutputKind.FINAL_ONLY) for sp in params}
        params = [final[id(sp)] for sp in params]
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"{len(loras)} LoRA requests for {len(prompts)} prompts")
        requests = [self._to_request(p) + (self._images(p),) for p in prompts]
        streams = []
        owner = f"generate-{uuid.uuid4().hex}"    # one caller: its prompts take slots FCFS between them
        for (text, ids, images), sp, lora in zip(requests, params, loras):
            mm = None
            if images is not None:   # vLLM's {"prompt", "multi_modal_data": {"image": PIL or [PIL]}}
                ids, mm = self._mm_processor.process(ids, images, self._media)
            streams.append(self._engine.add_request(f"offline-{uuid.uuid4().hex}", ids, sp, prompt=text,
                                                    lora_request=lora, mm=mm, owner=owner))
        results = []
        show = use_tqdm and sys.stderr.isatty()
        for i, stream in enumerate(streams):
            results.append(fold(stream))
            if show:
                sys.stderr.write(f"\rgenerate: {i + 1}/{len(streams)} requests done")
        if show:
            sys.stderr.write("\n")
        return results

    def chat(self, messages, sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template: str | None = None,
             add_generation_prompt: bool = True) -> list[RequestOutput]:
        """messages: one conversation (list of {"role", "content"}) or a list of them."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer (skip_tokenizer_init=True was given)")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = []
        from lite_llm.multimodal import flatten_chat
        for conv in conversations:
            conv, images = flatten_chat(conv, self._mm_processor, self._media)   # image parts -> placeholders
            text = self.tokenizer.apply_chat_template(conv, add_generation_prompt=add_generation_prompt,
                                                      chat_template=chat_template)
            # the template already holds BOS and special tokens: don't add them twice
            prompts.append({"prompt": text,
                            "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=False)})
            if images:
                prompts[-1]["multi_modal_data"] = {"image": images}
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def embed(self, prompts, *, dimensions: int | None = None, normalize: bool | None = None,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = True):
        """One PoolingRequestOutput per prompt, .outputs.embedding (vLLM's LLM.embed)."""
        from lite_llm import pooling
        return pooling.embed(self._need("pooling"), prompts, dimensions=dimensions,
                             normalize=normalize, truncate_prompt_tokens=truncate_prompt_tokens)

    def classify(self, prompts, *, truncate_prompt_tokens: int | None = None, use_tqdm: bool = True):
        """One PoolingRequestOutput per prompt, .outputs.probs (a classifier head's)."""
        from lite_llm import pooling
        return pooling.classify(self._need("pooling"), prompts,
                                truncate_prompt_tokens=truncate_prompt_tokens)

    def score(self, text_1, text_2, *, truncate_prompt_tokens: int | None = None, use_tqdm: bool = True):
        """text_1 against each of text_2: one PoolingRequestOutput per pair, .outputs.score."""
        from lite_llm import pooling
        return pooling.score(self._need("pooling"), text_1, text_2,
                             truncate_prompt_tokens=truncate_prompt_tokens)

    def _need(self, runner: str):
        """The pooling engine (runner "pooling"), or a ValueError naming this model's runner."""
        if self.runner_type != runner:
            what = "generate text" if runner == "generate" else "embed, classify or score"
            raise ValueError(f"this model runs the {self.runner_type!r} runner: it cannot {what} "
                             f"(LLM(model, runner={runner!r}) for a model that supports it)")
        return self._pooling

    def shutdown(self) -> None:
        if self._pooling is not None:
            self._pooling.shutdown()
            return
        self._engine.shutdown(0.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # ---- helpers ----------------------------------------------------------------------

    def _images(self, prompt) -> list | None:
        """The PIL images of a prompt dict's multi_modal_data (None: a text prompt)."""
        data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if not data:
            return None
        from lite_llm import multimodal
        if self._mm_processor is None:
            raise multimodal.MediaError(f"{self._loaded.source} does not take images")
        if set(data) != {"image"}:
            raise multimodal.MediaError(f"multi_modal_data takes \"image\" only, not {sorted(set(data) - {'image'})}")
        images = data["image"] if isinstance(data["image"], (list, tuple)) else [data["image"]]
        return [multimodal.check_image(im, f"image {k}", self._media) for k, im in enumerate(images)]

    def _to_request(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass {'prompt_token_ids': [...]}")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
        if isinstance(prompt, dict) and "prompt" in prompt:
            return self._to_request(prompt["prompt"])
        raise TypeError(f"a prompt is a str or a dict with 'prompt_token_ids', not {type(prompt).__name__}")
