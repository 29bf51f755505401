"""The one assembly of a running engine from EngineArgs: load -> size the KV cache (KVPlan)
-> runner (built on the engine thread, after it binds the OpenMP pool) -> LLMEngine ->
AsyncEngine. LLM (llm.py), the server, data-parallel replicas (data_parallel.py) and Ray Serve
replicas (serve_ray.py) all build their engines here; tensor-parallel workers are started from
here (tp.start_group) and build their shard's runner in their own process (tp.py). A pooling
model (args.runner "pooling") is the same LLMEngine and AsyncEngine over a PoolingModelRunner
(engine/pooling.py), its KV cache one step's; Assembled.pooling then holds its PoolingSpec.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from lite_llm import cpu
from lite_llm.config import env
from lite_llm.engine import tp
from lite_llm.engine.args import EngineArgs
from lite_llm.engine.async_engine import AsyncEngine, EngineDeadError
from lite_llm.engine.engine import EngineConfig, LLMEngine
from lite_llm.engine.live import attach_engine_threads
from lite_llm.engine.pooling import POOLING_BLOCK_SIZE, PoolingClient, pooling_limits, pooling_num_blocks
from lite_llm.engine.spec_decode import make_proposer
from lite_llm.model.loader import load_model
from lite_llm.model.pooler import pooling_spec

# The kernels (lite_llm._kernels, and engine/runner.py, which imports them) are imported in the
# functions below, not here: loading them loads libgomp, which reads its environment once, as it
# loads, and cpu.configure_openmp_env() must set that environment first (build_engine's first act).

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
    state_bytes: int = 0         # hybrid models: the recurrent state of max_num_seqs sequences beside the blocks
    num_state_slots: int = 0

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
                + (f" ({self.reason})" if self.reason else "")
                + (f"; recurrent state: {self.num_state_slots} slots x "
                   f"{self.state_bytes // max(self.num_state_slots, 1)} bytes = {self.state_bytes / GiB:.3f} GiB beside the blocks (resident as slots fill), constant in "
                   "context length" if self.state_bytes else ""))


def mem_available() -> int:
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
    # hybrid models: a fixed-size state per batch slot beside the blocks (runner.conv_states), not
    # taken from their space: its pages become resident only as slots are used (the lowest first),
    # and a large state (Mamba2's: MBs per sequence) would otherwise leave no blocks at the
    # default max_num_seqs
    slots = (max_num_seqs or 0) if config.is_hybrid else 0
    state = slots * config.state_bytes_per_seq
    plan = _plan_blocks(config, dtype, block_size, max_model_len, kv_cache_space, weight_bytes, num_blocks,
                        max_num_seqs, kv_cache_dtype, tensor_parallel_size)
    return dataclasses.replace(plan, state_bytes=state, num_state_slots=slots) if state else plan


def _plan_blocks(config, dtype: str, block_size: int, max_model_len: int, kv_cache_space: float | None,
                 weight_bytes: int, num_blocks: int | None, max_num_seqs: int | None, kv_cache_dtype: str | None,
                 tensor_parallel_size: int) -> KVPlan:
    from lite_llm.engine.runner import kv_bytes_per_block, kv_cache_format   # the kernels: see the top
    per_block = kv_bytes_per_block(config, block_size, dtype, kv_cache_dtype)
    per_rank = per_block
    if tensor_parallel_size > 1:
        tp.check_tensor_parallel(config, tensor_parallel_size)
        ranks = [kv_bytes_per_block(tp.rank_config(config, r, tensor_parallel_size), block_size, dtype, kv_cache_dtype)
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
                  f"half of the {mem_available() / GiB:.1f} GiB available after the weights":
                      max(mem_available() - weight_bytes, 0) / 2}
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


@dataclass(frozen=True)
class EngineInfo:
    """What an assembled engine runs, as the server (/version, /v1/models, the dashboard, /metrics),
    `LLM.info` and the benchmarks describe it. as_dict() is its JSON form: what LLM.info holds and
    a data-parallel replica sends over its pipe; the fields that do not apply to the model's
    runner (None) are left out of it."""
    model_path: str
    model_name: str
    architecture: str
    dtype: str
    max_model_len: int
    vocab_size: int
    num_layers: int
    kernel_variant: str
    num_threads: int
    thread_plan: list[str]
    kv_cache_tokens: int
    kv_cache_blocks: int
    kv_cache_bytes: int
    weight_bytes: int
    weight_formats: dict[str, Any]      # matrix -> (its stored parts, the format it runs in)
    startup_seconds: float
    runner: str = "generate"            # or "pooling"
    # a generating model's
    kv_cache_dtype: str | None = None
    max_concurrency: float | None = None
    generation_config: dict[str, Any] | None = None
    bytes_per_token: int | None = None
    gemm_paths: dict[str, Any] | None = None
    layer_macs_per_token: int | None = None
    head_macs_per_row: int | None = None
    q_size: int | None = None
    num_attention_layers: int | None = None   # of num_layers (hybrids: the others keep a state)
    speculative_config: dict[str, Any] | None = None
    tensor_parallel_size: int | None = None
    tensor_parallel_ranks: list[Any] | None = None
    enable_lora: bool | None = None
    max_loras: int | None = None
    max_lora_rank: int | None = None
    mmproj: str | None = None
    # a pooling model's
    pooler: str | None = None
    hidden_size: int | None = None
    num_labels: int | None = None

    # a generating model's fields that are None when they do not apply (and still named in the JSON)
    _KEPT_WHEN_NONE = ("speculative_config", "mmproj")

    def as_dict(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None or (self.runner == "generate" and f.name in self._KEPT_WHEN_NONE):
                out[f.name] = value
        return out


@dataclass
class Assembled:
    """A started engine and what it was built from (build_engine's result)."""
    engine: AsyncEngine
    loaded: Any                  # model.loader's loaded checkpoint: config, tokenizer, generation_config
    args: EngineArgs
    kv: KVPlan
    plan: cpu.ThreadPlan
    info: EngineInfo
    pooling: Any = None          # a pooling model's model.pooler.PoolingSpec; None for a generating one

    @property
    def tokenizer(self):
        return self.loaded.tokenizer


def build_engine(args: EngineArgs) -> Assembled:
    """Everything from EngineArgs to a started AsyncEngine: the one assembly of an engine, used by
    LLM, the server, data-parallel replicas and Ray Serve replicas (tensor-parallel workers are
    started from here too, each building its shard's ModelRunner, engine/tp.py).
    tensor_parallel_size: ranks (engine/tp.py): from the bind spec's lists, or NUMA nodes under auto.
    enable_lora: room for max_loras LoRA adapters of rank <= max_lora_rank, served per request
    (lora.py); lora_modules: (name, path) adapters loaded at start.
    max_num_seqs None: default_max_num_seqs over every rank's computing threads."""
    t0 = time.perf_counter()
    cpu.configure_openmp_env()          # before the first OpenMP region in the process
    from lite_llm import _kernels       # the kernels, now: see the top
    from lite_llm.engine.runner import ModelRunner
    serving, tensor_parallel_size = args.serving, args.tensor_parallel_size
    plan = plan_ranks(tensor_parallel_size, serving)
    for line in plan.describe():
        log.info("%s", line)
    for note in plan.notes:
        log.info("note: %s", note)
    max_num_seqs = args.max_num_seqs
    if max_num_seqs is None and args.runner != "pooling":
        max_num_seqs, why = default_max_num_seqs(sum(r.num_threads for r in plan.ranks), serving)
        log.info("max_num_seqs %d (%s; --max-num-seqs to change)", max_num_seqs, why)
    block_size, spec = args.block_size, args.speculative_config
    quantization, kv_cache_dtype = args.quantization, args.kv_cache_dtype
    enable_lora, max_loras, max_lora_rank = args.enable_lora, args.max_loras, args.max_lora_rank

    log.info("kernel variant %s (%s)", _kernels.VARIANT.name, "; ".join(_kernels.explain()))
    loaded = load_model(args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                        skip_tokenizer_init=args.skip_tokenizer_init, progress=args.progress, mmproj=args.mmproj)
    if args.runner == "pooling":
        return _build_pooling_engine(args, loaded, plan, t0)
    cfg = loaded.config
    enable_prefix_caching = args.enable_prefix_caching
    if cfg.is_hybrid:
        if spec is not None or tensor_parallel_size > 1 or enable_lora:
            raise ValueError(f"{cfg.architecture} (recurrent layers: short convolutions, Mamba2 or Gated DeltaNet, a state per "
                             "sequence) runs without "
                             "speculative decoding, tensor parallel and LoRA adapters")
        if enable_prefix_caching:
            # a cached block holds attention's KV of its tokens, not the conv layers' state after them
            log.info("prefix caching is off for %s: its recurrent layers' state is not kept per block",
                     cfg.architecture)
            enable_prefix_caching = False
    max_num_batched_tokens = args.max_num_batched_tokens
    if max_num_batched_tokens is None:
        max_num_batched_tokens = 2048 if serving else 4096
    weight_estimate = os.path.getsize(loaded.source) if os.path.isfile(loaded.source) else 0
    kv = plan_kv_cache(cfg, loaded.dtype, block_size, loaded.max_model_len, args.kv_cache_space, weight_estimate,
                       num_blocks=args.num_kv_blocks, max_num_seqs=max_num_seqs, kv_cache_dtype=kv_cache_dtype,
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
                                 max_model_len=loaded.max_model_len, seed=args.seed, eos_token_ids=eos,
                                 vocab_size=cfg.vocab_size, num_lookahead_tokens=args.num_lookahead_tokens)
    engine = LLMEngine(None, loaded.tokenizer, engine_config)   # the runner is built on the engine thread
    group = None

    def start_on_engine_thread():
        """Bind the OpenMP pool, then load: every OpenMP region of the process runs from this
        thread. A second thread's pool would make libgomp count more threads than CPUs and
        drop its barrier spinning to almost nothing: every barrier a sleep and a wake-up."""
        nonlocal group
        if tensor_parallel_size > 1:   # workers load their shards while this rank loads its own
            group = tp.start_group(loaded, plan, num_blocks=kv.num_blocks, block_size=block_size,
                                   max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                   kv_cache_dtype=kv_cache_dtype, disable_sliding_window=args.disable_sliding_window,
                                   quantization=quantization, on_failure=_exit_server if serving else None,
                                   batch_invariant=args.deterministic)
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
            runner = ModelRunner(loaded, num_blocks=kv.num_blocks, block_size=block_size,
                                 max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                 num_threads=num_threads, disable_sliding_window=args.disable_sliding_window,
                                 quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                                 proposer=proposer, batch_invariant=args.deterministic,
                                 shard=tp.RankShard(cfg, 0, tensor_parallel_size)
                                 if tensor_parallel_size > 1 else None,
                                 tp_group=group, max_loras=max_loras if enable_lora else 0,
                                 max_lora_rank=max_lora_rank)
            engine.attach_runner(runner, runner.vision)
            if enable_lora:
                # only with adapters: lora.py's hashlib import keeps OpenSSL resident (~6 MiB)
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

    async_engine = AsyncEngine(engine, max_queue=args.max_queue, on_engine_thread_start=start_on_engine_thread)
    try:
        async_engine.start()
    except EngineDeadError as e:     # a broken checkpoint: raise what the loader said
        raise (e.__cause__ or e) from None
    runner = engine.runner
    for name, path in args.lora_modules:
        try:
            engine.lora.load(name, path)
        except ValueError:
            async_engine.shutdown(0.0)
            raise
    info = EngineInfo(
        model_path=loaded.source, model_name=args.model or os.path.basename(loaded.source),
        max_model_len=loaded.max_model_len, dtype=loaded.dtype, architecture=cfg.architecture,
        kernel_variant=_kernels.VARIANT.name, num_threads=num_threads,
        thread_plan=plan.describe(), kv_cache_tokens=kv.num_tokens, kv_cache_blocks=kv.num_blocks,
        kv_cache_bytes=kv.num_blocks * kv.bytes_per_block, kv_cache_dtype=kv.kv_cache_dtype,
        max_concurrency=kv.max_concurrency, generation_config=loaded.generation_config,
        vocab_size=cfg.vocab_size, weight_bytes=runner.weight_bytes,
        bytes_per_token=runner.bytes_per_token, weight_formats=runner.formats,
        gemm_paths=runner.gemm_paths.as_dict(), layer_macs_per_token=runner.layer_macs_per_token,
        head_macs_per_row=runner.head_macs_per_row, num_layers=cfg.model_layers, q_size=cfg.q_size,
        num_attention_layers=cfg.num_attention_layers,
        startup_seconds=time.perf_counter() - t0,
        speculative_config=None if spec is None else dataclasses.asdict(spec),
        tensor_parallel_size=tensor_parallel_size,
        enable_lora=enable_lora, max_loras=max_loras if enable_lora else 0, max_lora_rank=max_lora_rank,
        tensor_parallel_ranks=group.ranks if group is not None else [],
        mmproj=loaded.mmproj)
    if group is not None:
        async_engine.tp_group = group      # closed with the engine (LLM.shutdown, server exit)
    log.info("engine ready in %.2f s: %s, %d threads, %s", info.startup_seconds, _kernels.VARIANT.name,
             num_threads, kv.describe())
    return Assembled(async_engine, loaded, args, kv, plan, info)


def _build_pooling_engine(args: EngineArgs, loaded, plan: cpu.ThreadPlan, t0: float) -> Assembled:
    """build_engine's rest for a pooling model: its PoolingSpec, one step's KV cache, the
    PoolingModelRunner built on the engine thread, an LLMEngine of pooling requests (no prefix
    caching: an encoder's KV of a prefix depends on the tokens after it)."""
    from lite_llm import _kernels       # the kernels, now: see the top
    from lite_llm.engine.pooling_runner import PoolingModelRunner
    from lite_llm.engine.runner import kv_cache_format
    loaded, spec = pooling_spec(loaded, args.pooler_config, args.hf_overrides, args.max_model_len)
    cfg = loaded.config
    max_tokens, max_seqs = pooling_limits(loaded.max_model_len, args.max_num_batched_tokens, args.max_num_seqs,
                                          args.serving)
    block_size = POOLING_BLOCK_SIZE
    num_blocks = pooling_num_blocks(max_tokens, max_seqs, block_size)
    engine_config = EngineConfig(max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens, block_size=block_size,
                                 num_blocks=num_blocks, enable_prefix_caching=False,
                                 max_model_len=loaded.max_model_len, seed=args.seed, vocab_size=cfg.vocab_size,
                                 pooling=True)
    engine = LLMEngine(None, loaded.tokenizer, engine_config)

    def start_on_engine_thread():
        report = cpu.apply_plan(plan)
        for line in report.describe():
            log.info("%s", line)
        attach_engine_threads(async_engine.live, plan.num_threads, report.planned, measure_bandwidth=False)
        engine.attach_runner(PoolingModelRunner(loaded, spec.pooler, max_num_batched_tokens=max_tokens,
                                                max_num_seqs=max_seqs, num_threads=plan.num_threads,
                                                quantization=args.quantization, block_size=block_size,
                                                batch_invariant=args.deterministic))

    async_engine = AsyncEngine(engine, on_engine_thread_start=start_on_engine_thread)
    try:
        async_engine.start()
    except EngineDeadError as e:     # a broken checkpoint: raise what the loader said
        raise (e.__cause__ or e) from None
    runner = engine.runner
    kv = KVPlan(num_blocks, block_size, runner.kv_cache_bytes // num_blocks, loaded.max_model_len,
                kv_cache_format(loaded.dtype, "auto"), "one step of whole inputs")
    info = EngineInfo(
        model_path=loaded.source, model_name=args.model or os.path.basename(loaded.source),
        max_model_len=loaded.max_model_len, dtype=loaded.dtype, architecture=cfg.architecture,
        kernel_variant=_kernels.VARIANT.name, num_threads=plan.num_threads,
        thread_plan=plan.describe(), runner="pooling", pooler=spec.pooler,
        weight_bytes=runner.weight_bytes, weight_formats=runner.formats,
        kv_cache_tokens=kv.num_tokens, kv_cache_blocks=num_blocks, kv_cache_bytes=runner.kv_cache_bytes,
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, num_labels=spec.num_labels,
        num_layers=cfg.model_layers, startup_seconds=time.perf_counter() - t0)
    return Assembled(async_engine, loaded, args, kv, plan, info, spec)


def plan_ranks(tensor_parallel_size: int, serving: bool, topology: cpu.Topology | None = None) -> cpu.ThreadPlan:
    """The thread plan for `tensor_parallel_size` ranks on `topology` (None: this machine's):
    auto deals NUMA nodes (or slices of one) to them; an explicit bind spec must list exactly
    that many CPU lists."""
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


def build_async_engine(args: EngineArgs | str | None = None, **kwargs):
    """For the server: (AsyncEngine, tokenizer, info as a dict); a pooling model's AsyncEngine with the
    pooling calls over it (engine/pooling.py PoolingClient). args: EngineArgs, or the model
    argument and EngineArgs' fields as keywords (serving defaults: a 2048-token budget)."""
    if not isinstance(args, EngineArgs):
        kwargs.setdefault("serving", True)
        args = EngineArgs(args if args is not None else kwargs.pop("model", None), **kwargs)
    built = build_engine(args)
    if built.pooling is not None:
        return PoolingClient(built.engine, built.tokenizer, built.pooling, built.info.model_name), \
            built.tokenizer, built.info.as_dict()
    return built.engine, built.tokenizer, built.info.as_dict()
