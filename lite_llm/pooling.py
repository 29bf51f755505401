"""Pooling models: embeddings, classification and scores (vLLM's `runner="pooling"`).

    PoolerConfig      how hidden states become one vector: MEAN / CLS / LAST, normalize,
                      Matryoshka dimensions (from sentence-transformers' modules.json,
                      1_Pooling/config.json, sentence_bert_config.json, or --pooler-config)
    PoolingRunner     the packed kernel model with a KV cache for ONE step: prefill-only
                      steps of whole sequences, one forward() call each, nothing kept after
    PoolingEngine     one engine thread owns the runner (OpenMP's pool is bound to it);
                      callers submit sequences and wait; each sequence is a Request of the
                      generation engine's Scheduler (lite_llm/engine/scheduler.py), which
                      packs steps under the token budget and max_num_seqs, takes a pooling
                      request's whole prompt or none of it, and hands out KV blocks from the
                      same KVCacheManager; every request of a step is finished (its blocks
                      freed) when the step ends; requests arriving meanwhile join the next step
    choose_runner     "pooling" or "generate" from a checkpoint

A step packs whole sequences (T tokens of S sequences) into the same flat arrays the decoder
runner uses; an encoder's tokens attend to their whole sequence (attn_positions = the
sequence's last position), a decoder embedder's causally. The step's kernel call returns the
final hidden rows the pooling type needs (every row for MEAN, the first or last of each
sequence otherwise); the pooling itself is a vectorised reduction per step.

What does not live here: the HTTP bodies (lite_llm/server/pooling.py), the layers
(lite_llm/_kernels/forward.pxi), the checkpoint mapping (lite_llm/model/arch/bert.py).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from lite_llm.model.rope import longrope_rows

log = logging.getLogger("lite_llm")

POOLING_TYPES = ("MEAN", "CLS", "LAST")
RUNNERS = ("auto", "generate", "pooling")


class PoolingInputError(ValueError):
    """A request the pooling model cannot take (HTTP 400)."""


# ---- configuration ----------------------------------------------------------------------


@dataclass(frozen=True)
class PoolerConfig:
    """vLLM's --pooler-config names: pooling_type, normalize, dimensions (a Matryoshka model's
    allowed widths: is_matryoshka / matryoshka_dimensions in config.json)."""
    pooling_type: str = "MEAN"
    normalize: bool = True
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()
    max_seq_length: int | None = None       # sentence_bert_config.json: the input limit
    activation: bool = True                 # classify/score: sigmoid (1 label) or softmax

    def __post_init__(self):
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type {self.pooling_type!r}: expected one of {', '.join(POOLING_TYPES)}")


def _read_json(path: str) -> dict | list | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def sentence_transformers_modules(path: str) -> list[dict]:
    """modules.json of a sentence-transformers directory, [] otherwise."""
    if not os.path.isdir(path):
        return []
    return _read_json(os.path.join(path, "modules.json")) or []


def pooler_config(path: str, config, overrides: dict | str | None = None) -> PoolerConfig:
    """The pooler of the checkpoint at `path` (an HF directory or a .gguf file), then
    `overrides` (--pooler-config: a dict or JSON text with vLLM's keys)."""
    values: dict = {}
    raw = _read_json(os.path.join(path, "config.json")) if os.path.isdir(path) else None
    modules = sentence_transformers_modules(path)
    if modules:
        values["normalize"] = any(m.get("type", "").endswith("Normalize") for m in modules)
        for m in modules:
            if m.get("type", "").endswith(".Pooling"):
                pc = _read_json(os.path.join(path, m.get("path", ""), "config.json")) or {}
                if pc.get("pooling_mode_cls_token"):
                    values["pooling_type"] = "CLS"
                elif pc.get("pooling_mode_lasttoken"):
                    values["pooling_type"] = "LAST"
                elif pc.get("pooling_mode_mean_tokens"):
                    values["pooling_type"] = "MEAN"
                else:
                    raise ValueError(f"{path}: sentence-transformers pooling {pc} is not supported "
                                     "(mean, cls or last token)")
        sb = _read_json(os.path.join(path, "sentence_bert_config.json")) or {}
        if sb.get("max_seq_length"):
            values["max_seq_length"] = int(sb["max_seq_length"])
    elif os.path.isfile(path) and _gguf_arch(path) is not None:   # llama.cpp's {arch}.pooling_type
        from lite_llm.model.gguf import GGUFFile
        f = GGUFFile(path)
        try:
            kind = f.metadata.get(f"{_gguf_arch(path)}.pooling_type")
        finally:
            f.close()
        values.update(pooling_type={1: "MEAN", 2: "CLS", 3: "LAST"}.get(kind, "CLS" if not config.causal else "LAST"),
                      normalize=True)
    elif config.causal:
        values.update(pooling_type="LAST", normalize=True)        # decoder embedders (Qwen3-Embedding)
    elif config.architecture == "NomicBertModel":
        values.update(pooling_type="MEAN", normalize=True)        # nomic-embed-text's sentence-transformers set-up
    else:
        values.update(pooling_type="CLS", normalize=True)         # bge and most bare encoders
    if raw:
        dims = raw.get("matryoshka_dimensions")
        if raw.get("is_matryoshka") or dims:
            values["is_matryoshka"] = True
            values["matryoshka_dimensions"] = tuple(int(d) for d in dims or ())
    if isinstance(overrides, str):
        overrides = json.loads(overrides)
    known = {"pooling_type": "pooling_type", "normalize": "normalize", "softmax": "activation",
             "activation": "activation"}
    for key, value in (overrides or {}).items():
        if key not in known:
            raise ValueError(f"pooler_config: unknown key {key!r} (known: {', '.join(known)})")
        values[known[key]] = value.upper() if key == "pooling_type" and isinstance(value, str) else value
    return PoolerConfig(**values)


def token_head(path: str, config, tokenizer, tokens) -> dict[str, np.ndarray]:
    """vLLM's classifier_from_token: a one-label head from the LM head's rows of `tokens`
    (["no", "yes"]: logit(yes) - logit(no), as Qwen3-Reranker is scored; one token: its logit)."""
    from lite_llm.model.hf import SafetensorsCheckpoint
    from lite_llm.model.weights import convert
    if not isinstance(tokens, (list, tuple)) or not 1 <= len(tokens) <= 2:
        raise ValueError(f"classifier_from_token must list one or two tokens, got {tokens!r}")
    ids = []
    for t in tokens:
        i = tokenizer.token_to_id(t) if tokenizer is not None else None
        if i is None:
            raise ValueError(f"classifier_from_token: {t!r} is not a token of the vocabulary")
        ids.append(i)
    ckpt = SafetensorsCheckpoint(path)
    try:
        name = next(n for n in ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight") if n in ckpt)
        rows = [convert(ckpt.read_rows(name, i, i + 1), "float32")[0] for i in ids]
    finally:
        ckpt.close()
    w = rows[-1] - rows[0] if len(rows) == 2 else rows[0]
    return {"out.weight": w[None, :].astype(np.float32), "out.bias": np.zeros(1, np.float32)}


def choose_runner(path: str, config, requested: str = "auto", hf_overrides: dict | None = None) -> str:
    """"pooling" or "generate": what `requested` says, else what the checkpoint says (an encoder,
    a *ForSequenceClassification head, a sentence-transformers directory, an embedding model)."""
    if requested not in RUNNERS:
        raise ValueError(f"runner {requested!r}: expected one of {', '.join(RUNNERS)}")
    if requested != "auto":
        return requested
    archs = (hf_overrides or {}).get("architectures") or [config.architecture]
    if (not config.causal or any(a.endswith(("ForSequenceClassification", "Model")) for a in archs)
            or sentence_transformers_modules(path)):
        return "pooling"
    return "generate"


# ---- outputs (vLLM's names) -------------------------------------------------------------


@dataclass
class PoolingOutput:
    data: np.ndarray


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float


@dataclass
class PoolingRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: object
    finished: bool = True


# ---- the runner ---------------------------------------------------------------------------


@dataclass
class PoolItem:
    """One sequence to pool: its tokens (and token types for a cross-encoder's pair)."""
    token_ids: np.ndarray                   # [n] int32
    token_types: np.ndarray | None = None   # [n] int32
    arrival: float = field(default_factory=time.monotonic)


class PoolingRunner:
    """The packed model, a one-step KV cache and the workspace; run(items) -> pooled rows."""

    def __init__(self, loaded, pooler: PoolerConfig, *, max_num_batched_tokens: int, max_num_seqs: int,
                 num_threads: int, quantization: str | None = None, block_size: int = 16, kernels=None,
                 head: dict | None = None):
        from lite_llm import _kernels
        from lite_llm._kernels import gemm_path, layout
        from lite_llm.config import attention_path_override
        from lite_llm.engine.runner import kv_cache_format, trim_heap
        from lite_llm.model import arch
        from lite_llm.model.pack import check_quantization, packed_weights
        from lite_llm.model.rope import longrope_switch, rope_tables
        cfg = loaded.config
        self.config, self.pooler, self.dtype = cfg, pooler, loaded.dtype
        self.kernels = kernels or _kernels.kernels
        self.num_threads = num_threads
        self.block_size = block_size
        self.max_model_len = loaded.max_model_len
        # the step's token budget: an input is never split across steps, so the longest one
        # the model takes must fit a step of its own (vLLM's rule without chunked prefill)
        self.max_tokens = max(int(max_num_batched_tokens), self.max_model_len)
        if self.max_tokens > max_num_batched_tokens:
            log.info("pooling: max_num_batched_tokens %d raised to max_model_len %d (a pooling input is never "
                     "split across steps)", max_num_batched_tokens, self.max_model_len)
        self.max_seqs = max(1, int(max_num_seqs))
        kv_dtype = kv_cache_format(self.dtype, "auto")
        self.gemm_paths = gemm_path.choose(self.kernels)
        self.kernel_config = arch.kernel_config(cfg, dtype=self.dtype, block_size=block_size,
                                                max_positions=self.max_model_len, kv_cache_dtype=kv_dtype,
                                                bf16_path=self.gemm_paths.chosen["bf16"],
                                                attn_path=attention_path_override())
        start = time.perf_counter()
        self.packed = packed_weights(loaded, self.dtype, num_threads, check_quantization(quantization), None,
                                     self.kernels)
        packed = self.packed.model
        loaded.release()
        trim_heap()
        # every sequence of a step wastes at most one partial block
        self.num_blocks = num_blocks = self.max_tokens // block_size + self.max_seqs + 1
        k_shape, v_shape = layout.kv_cache_shapes(num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim, kv_dtype)
        kv_np = layout.KV_NUMPY[kv_dtype]
        self.k_caches = [layout.aligned_zeros(k_shape, kv_np) for _ in range(cfg.num_layers)]
        self.v_caches = [layout.aligned_zeros(v_shape, kv_np) for _ in range(cfg.num_layers)]
        tables = [tuple(np.ascontiguousarray(a, np.float32) for a in rope_tables(c, self.max_model_len))
                  for c in arch.rope_configs(cfg)] if cfg.rope else []
        self.model = self.kernels.Model(self.kernel_config, packed, self.k_caches, self.v_caches, tables)
        # LongRoPE: an input longer than this turns all its tokens with the long factors (rope.py)
        self.rope_switch = longrope_switch(cfg, self.max_model_len) if cfg.rope else 0
        self.packed.keep()      # a fresh pack is written for the next start, in the background
        self.workspace = self.kernels.Workspace(self.model, self.max_tokens, self.max_tokens, num_threads)
        self.hidden = np.empty((self.max_tokens, cfg.dim), np.float32)
        self.max_blocks = -(-self.max_model_len // block_size)
        self.weight_bytes = packed.nbytes
        self.formats = self.model.formats()
        self.head = head or {}
        self.last_step_seconds = 0.0
        log.info("pooling model ready in %.2f s: %.1f MB of weights, %s pooling%s, steps of up to %d tokens",
                 time.perf_counter() - start, self.weight_bytes / 2**20, pooler.pooling_type,
                 " + normalize" if pooler.normalize else "", self.max_tokens)

    def run_step(self, items: list[PoolItem], block_tables: list[list[int]]) -> np.ndarray:
        """ONE forward() over whole sequences, item i's KV in blocks block_tables[i] (the
        scheduler's) -> pooled rows [S, E] (before the classifier head, normalization and
        truncation, which are per request)."""
        lens = np.array([len(it.token_ids) for it in items], np.int64)
        S, T, B = len(items), int(lens.sum()), self.block_size
        starts = np.zeros(S, np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        token_ids = np.concatenate([it.token_ids for it in items]).astype(np.int32, copy=False)
        tok_seq = np.repeat(np.arange(S, dtype=np.int32), lens)
        positions = (np.arange(T, dtype=np.int64) - starts[tok_seq]).astype(np.int32)
        block_tables_np = np.zeros((S, max(len(t) for t in block_tables)), np.int32)   # [S, max blocks]
        for seq, table in enumerate(block_tables):
            assert len(table) * B >= lens[seq], f"sequence {seq}: {len(table)} blocks for {lens[seq]} tokens"
            block_tables_np[seq, :len(table)] = table
        slot_mapping = block_tables_np[tok_seq, positions // B].astype(np.int64) * B + positions % B
        attn_positions = None if self.config.causal else (lens - 1)[tok_seq].astype(np.int32)
        token_types = None
        if self.config.type_vocab_size and any(it.token_types is not None for it in items):
            token_types = np.concatenate([it.token_types if it.token_types is not None
                                          else np.zeros(len(it.token_ids), np.int32) for it in items]).astype(np.int32)
        kind = self.pooler.pooling_type
        rows = (np.arange(T, dtype=np.int32) if kind == "MEAN"
                else starts.astype(np.int32) if kind == "CLS" else (starts + lens - 1).astype(np.int32))
        out = self.hidden[:len(rows)]
        rope_rows = longrope_rows(positions, lens[tok_seq] > self.rope_switch, self.rope_switch, self.max_model_len) \
            if self.rope_switch else None
        t0 = time.perf_counter()
        self.kernels.forward(self.model, self.workspace, token_ids, positions, slot_mapping, tok_seq,
                             block_tables_np, rows, out, self.num_threads, None, attn_positions, token_types, True,
                             rope_rows=rope_rows)
        self.last_step_seconds = time.perf_counter() - t0
        if kind == "MEAN":
            return np.add.reduceat(out, starts, axis=0) / lens[:, None].astype(np.float32)
        return out.copy()

    def classify(self, pooled: np.ndarray) -> np.ndarray:
        """The classifier head over pooled rows [S, E] -> logits [S, L]: a cross-encoder's
        dense + tanh then out, or (a reranker scored from two tokens) out alone."""
        if not self.head:
            raise PoolingInputError(f"{self.config.architecture} has no classifier head: it embeds, it does not score")
        h = pooled
        if "dense.weight" in self.head:
            h = np.tanh(h @ self.head["dense.weight"].T + self.head["dense.bias"])
        return h @ self.head["out.weight"].T + self.head["out.bias"]


def finish_embedding(vec: np.ndarray, pooler: PoolerConfig, dimensions: int | None = None,
                     normalize: bool | None = None) -> np.ndarray:
    """Matryoshka truncation to `dimensions`, then L2 normalization (as vLLM orders them)."""
    if dimensions is not None:
        vec = vec[:dimensions]
    if pooler.normalize if normalize is None else normalize:
        vec = vec / max(float(np.linalg.norm(vec)), 1e-12)
    return vec


def check_dimensions(dimensions, pooler: PoolerConfig, dim: int, model: str) -> int | None:
    """The requested Matryoshka width, or a PoolingInputError naming why it cannot be given."""
    if dimensions is None:
        return None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise PoolingInputError(f"dimensions must be an integer, got {dimensions!r}")
    if not pooler.is_matryoshka:
        raise PoolingInputError(f"model {model!r} does not support Matryoshka representation: "
                                "'dimensions' cannot be changed")
    if pooler.matryoshka_dimensions and dimensions not in pooler.matryoshka_dimensions:
        raise PoolingInputError(f"dimensions {dimensions} is not one of the model's {list(pooler.matryoshka_dimensions)}")
    if not 1 <= dimensions <= dim:
        raise PoolingInputError(f"dimensions {dimensions} must be within 1..{dim}")
    return dimensions


# ---- the engine thread --------------------------------------------------------------------


@dataclass
class _Job:
    items: list[PoolItem]
    done: threading.Event = field(default_factory=threading.Event)
    result: list[np.ndarray] | None = None
    error: BaseException | None = None
    requests: list = field(default_factory=list)     # its Requests in the scheduler, item order
    remaining: int = 0


_STOP = object()    # the inbox's shutdown mark


class PoolingEngine:
    """One thread owns the runner and the scheduler; submit() from any thread. Each item is a
    Request of the generation Scheduler: a step takes whole inputs under the token budget
    (first come, first served), concurrent requests share steps, and a request arriving while
    a step runs joins the next one."""

    def __init__(self, build_runner, tokenizer, *, on_start=None, name: str = "model"):
        self.tokenizer = tokenizer
        self.name = name
        self.runner: PoolingRunner | None = None
        self.scheduler = None
        self._build = build_runner
        self._on_start = on_start
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[_Job, int]] = {}   # request id -> (its job, item index)
        self._next_id = 0
        # counters for /metrics and the logs (engine thread writes, others read)
        self.num_requests = 0
        self.num_prompt_tokens = 0
        self.num_steps = 0
        self.queue_seconds = 0.0
        from lite_llm.engine.stats import LATENCY_BUCKETS, HistogramAccumulator
        self.queue_hist = HistogramAccumulator(LATENCY_BUCKETS)
        self.e2e_hist = HistogramAccumulator(LATENCY_BUCKETS)
        self.thread = threading.Thread(target=self._loop, name="lite_llm-pooling", daemon=True)
        self.step_lock = contextlib.nullcontext()   # as AsyncEngine.step_lock

    def start(self) -> None:
        self.thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        from lite_llm.engine.kv_cache import KVCacheManager
        from lite_llm.engine.scheduler import Scheduler
        from lite_llm.sampling_params import SamplingParams
        self._params = SamplingParams(max_tokens=1)    # unused by pooling; a Request carries one
        try:
            if self._on_start is not None:
                self._on_start()
            self.runner = r = self._build()
            # no prefix caching: an encoder's KV of a prefix depends on the tokens after it
            self.scheduler = Scheduler(KVCacheManager(r.num_blocks, r.block_size, enable_prefix_caching=False),
                                       max_num_seqs=r.max_seqs, max_num_batched_tokens=r.max_tokens,
                                       max_model_len=r.max_model_len)
        except BaseException as e:   # noqa: BLE001: raised to start()'s caller
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        while True:
            job = self._inbox.get() if not self.scheduler.has_unfinished_requests() else self._next_job()
            while job is not None:
                if job is _STOP:
                    self._stop_all()
                    return
                self._admit(job)
                job = self._next_job()
            if self.scheduler.has_unfinished_requests():
                with self.step_lock:
                    self._step()

    def _next_job(self):
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            return None

    def _admit(self, job: _Job) -> None:
        """Each item of job becomes a waiting pooling Request."""
        from lite_llm.engine.request import Request
        job.result = [None] * len(job.items)
        job.remaining = len(job.items)
        if not job.items:
            job.done.set()
            return
        for i, it in enumerate(job.items):
            n = len(it.token_ids)
            if not 0 < n <= self.runner.max_model_len:
                self._fail(job, PoolingInputError(f"an input of {n} tokens: the model takes 1 to "
                                                  f"{self.runner.max_model_len}"))
                return
            rid = f"pool-{self._next_id}"
            self._next_id += 1
            request = Request(rid, it.token_ids.tolist(), self._params, 0, arrival_time=it.arrival, max_tokens=0)
            request.pooling = True
            job.requests.append(request)
            self._pending[rid] = (job, i)
            self.scheduler.add_request(request)

    def _step(self) -> None:
        """One scheduler step: its whole inputs through ONE forward(), then every request of it
        finished (its KV blocks freed) and its row handed to its job."""
        from lite_llm.engine.request import RequestStatus
        sched = self.scheduler
        out = sched.schedule()
        for request in sched.take_finished_in_schedule():   # cannot happen with an empty cache at each step
            self._fail(self._pending[request.request_id][0], RuntimeError(
                f"a pooling input of {request.num_tokens} tokens does not fit the KV cache"))
        if not out.chunks:
            if sched.has_unfinished_requests():   # nothing fits an empty cache: never will
                for job in {id(j): j for j, _ in self._pending.values()}.values():
                    self._fail(job, RuntimeError("the pooling scheduler could not place any waiting input"))
            return
        requests = [c.request for c in out.chunks]
        assert all(c.start == 0 and c.num_new_tokens == r.num_tokens for c, r in zip(out.chunks, requests)), \
            "a pooling input was split across steps"
        items = [self._pending[r.request_id][0].items[self._pending[r.request_id][1]] for r in requests]
        tables = [sched.kv_cache_manager.block_tables[r.request_id] for r in requests]
        try:
            pooled = self.runner.run_step(items, tables)
        except BaseException as e:   # noqa: BLE001: the jobs of this step get the failure
            for job in {id(j): j for j, _ in (self._pending[r.request_id] for r in requests)}.values():
                self._fail(job, e)
            return
        sched.finish_requests([r.request_id for r in requests], RequestStatus.FINISHED_STOPPED)
        self.num_steps += 1
        for row, request in enumerate(requests):
            job, i = self._pending.pop(request.request_id)
            job.result[i] = pooled[row]
            job.remaining -= 1
            if job.remaining == 0:
                self._complete(job)

    def _complete(self, job: _Job) -> None:
        self.num_requests += 1
        self.num_prompt_tokens += sum(len(it.token_ids) for it in job.items)
        queued = sum(r.metrics.first_scheduled_time - r.arrival_time for r in job.requests) / len(job.requests)
        self.queue_seconds += queued
        self.queue_hist.observe(queued)
        self.e2e_hist.observe(time.monotonic() - min(r.arrival_time for r in job.requests))
        job.done.set()

    def _fail(self, job: _Job, error: BaseException) -> None:
        """job gets error; its requests still in the scheduler are aborted (blocks freed)."""
        from lite_llm.engine.request import RequestStatus
        ids = [r.request_id for r in job.requests if r.request_id in self._pending]
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
        for rid in ids:
            del self._pending[rid]
        job.error = error
        job.done.set()

    def _stop_all(self) -> None:
        error = RuntimeError("the pooling engine is shutting down")
        for job in {id(j): j for j, _ in self._pending.values()}.values():
            self._fail(job, error)
        while (job := self._next_job()) is not None:
            if job is not _STOP:
                job.error = error
                job.done.set()

    def pool(self, items: list[PoolItem]) -> list[np.ndarray]:
        """Pooled rows [E] of each item (blocks until done); raises the step's error."""
        if self._stopping or self._error is not None:
            raise RuntimeError("the pooling engine is not running")
        job = _Job(items)
        self._inbox.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def is_alive(self) -> bool:
        return self.thread.is_alive() and self._error is None

    @property
    def failure(self) -> str | None:
        return None if self._error is None else repr(self._error)

    def stats(self):
        """An EngineStats for /metrics: requests, prompt tokens, queue time (of finished requests)."""
        from lite_llm.engine.stats import EngineStats
        return pooling_stats(EngineStats, self)

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        self._inbox.put(_STOP)
        if self.thread.is_alive():
            self.thread.join(timeout)


def build_pooling_engine(model: str | None, *, dtype: str = "auto", max_model_len: int | None = None,
                         max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
                         quantization: str | None = None, pooler_config=None, hf_overrides=None,
                         serving: bool = False, progress: bool = True, loaded=None):
    """Load a pooling model and start its engine thread -> (PoolingEngine, loaded, info).
    hf_overrides (vLLM's): {"architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"], ...} scores a decoder from two tokens' logits."""
    hf_overrides = parse_overrides(hf_overrides)
    from lite_llm import _kernels, cpu
    from lite_llm.engine.assemble import plan_ranks
    from lite_llm.model.arch import bert
    from lite_llm.model.loader import load_model
    t0 = time.perf_counter()
    cpu.configure_openmp_env()
    plan = plan_ranks(1, serving)
    if loaded is None:
        loaded = load_model(model, dtype=dtype, max_model_len=max_model_len, progress=progress)
    cfg = loaded.config
    pooler = pooler_config if isinstance(pooler_config, PoolerConfig) else pooler_config_for(loaded, pooler_config)
    limit = min(loaded.max_model_len, pooler.max_seq_length or loaded.max_model_len)
    if max_model_len is None and limit != loaded.max_model_len:
        loaded = replace(loaded, max_model_len=limit)
    head = bert.head_tensors(loaded.source, cfg.architecture, cfg.dim) if os.path.isdir(loaded.source) else {}
    if hf_overrides.get("classifier_from_token"):
        if not os.path.isdir(loaded.source):
            raise ValueError("classifier_from_token needs a Hugging Face directory (its LM head rows)")
        head = token_head(loaded.source, cfg, loaded.tokenizer, hf_overrides["classifier_from_token"])
        if pooler_config is None:
            pooler = replace(pooler, pooling_type="LAST", normalize=False)
    if max_num_batched_tokens is None:
        max_num_batched_tokens = 2048 if serving else 4096
    if max_num_seqs is None:      # pooling steps are prefill only: no decode batch to bound
        max_num_seqs = 256

    def build():
        return PoolingRunner(loaded, pooler, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                             num_threads=plan.num_threads, quantization=quantization, head=head)

    def bind():
        report = cpu.apply_plan(plan)
        for line in report.describe():
            log.info("%s", line)

    engine = PoolingEngine(build, loaded.tokenizer, on_start=bind, name=model or os.path.basename(loaded.source))
    engine.start()
    runner = engine.runner
    info = {"model_path": loaded.source, "model_name": model or os.path.basename(loaded.source),
            "max_model_len": loaded.max_model_len, "dtype": loaded.dtype, "architecture": cfg.architecture,
            "kernel_variant": _kernels.VARIANT.name, "num_threads": plan.num_threads, "runner": "pooling",
            "pooler": pooler, "weight_bytes": runner.weight_bytes, "weight_formats": runner.formats,
            "kv_cache_bytes": sum(c.nbytes for c in runner.k_caches + runner.v_caches),
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "num_labels": len(head.get("out.bias", ())),
            "startup_seconds": time.perf_counter() - t0}
    return engine, loaded, info


def pooler_config_for(loaded, overrides=None) -> PoolerConfig:
    return pooler_config(loaded.source, loaded.config, overrides)


# ---- requests -> items --------------------------------------------------------------------


def encode_text(tokenizer, text: str, pair: str | None = None) -> tuple[list[int], list[int] | None]:
    """Token ids (and, for a pair, token types) as the checkpoint's tokenizer builds them."""
    backend = getattr(tokenizer, "_backend", None)
    if pair is None:
        return tokenizer.encode(text), None
    if backend is None:
        raise PoolingInputError("scoring a pair needs a tokenizers (tokenizer.json) tokenizer")
    enc = backend.encode(text, pair, add_special_tokens=True)
    return list(enc.ids), list(enc.type_ids)


def make_item(ids, types, *, vocab_size: int, max_model_len: int, truncate_prompt_tokens: int | None = None,
              what: str = "input") -> PoolItem:
    """A checked PoolItem: non-empty, ids inside the vocabulary, within max_model_len unless
    truncate_prompt_tokens (-1: to max_model_len; k: the last k tokens, as vLLM keeps them)."""
    ids = list(ids)
    if not ids:
        raise PoolingInputError(f"{what} is empty")
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab_size]
    if bad:
        raise PoolingInputError(f"{what}: token id {bad[0]!r} is outside the vocabulary (0..{vocab_size - 1})")
    if truncate_prompt_tokens is not None:
        k = max_model_len if truncate_prompt_tokens == -1 else int(truncate_prompt_tokens)
        if not 1 <= k <= max_model_len:
            raise PoolingInputError(f"truncate_prompt_tokens {truncate_prompt_tokens} must be -1 or within "
                                    f"1..{max_model_len}")
        if len(ids) > k:
            ids = ids[-k:]
            types = types[-k:] if types is not None else None
    if len(ids) > max_model_len:
        raise PoolingInputError(f"{what} has {len(ids)} tokens, more than the model's maximum of {max_model_len} "
                                "(pass truncate_prompt_tokens to truncate)")
    return PoolItem(np.asarray(ids, np.int32), None if types is None else np.asarray(types, np.int32))


def scores_from_logits(logits: np.ndarray, activation: bool = True) -> np.ndarray:
    """[S, L] -> [S] scores (one label: sigmoid) or [S, L] probabilities (softmax)."""
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits[:, 0])) if activation else logits[:, 0]
    if not activation:
        return logits
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# ---- the offline API's work (LLM.embed / classify / score) ----------------------------------


def _prompt_items(engine: PoolingEngine, prompts, truncate_prompt_tokens=None) -> tuple[list, list]:
    """prompts (a str, {"prompt_token_ids": [...]}, or a list of either) -> (token id lists, items)."""
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    ids_list, items = [], []
    for p in prompts:
        if isinstance(p, dict) and "prompt_token_ids" in p:
            ids = [int(t) for t in p["prompt_token_ids"]]
        elif isinstance(p, dict) and "prompt" in p:
            ids = engine.tokenizer.encode(p["prompt"])
        elif isinstance(p, str):
            if engine.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass {'prompt_token_ids': [...]}")
            ids = engine.tokenizer.encode(p)
        else:
            raise TypeError(f"a prompt is a str or a dict with 'prompt_token_ids', not {type(p).__name__}")
        ids_list.append(ids)
        items.append(make_item(ids, None, vocab_size=engine.runner.config.vocab_size,
                               max_model_len=engine.runner.max_model_len, truncate_prompt_tokens=truncate_prompt_tokens))
    return ids_list, items


def embed(engine: PoolingEngine, prompts, *, dimensions: int | None = None, normalize: bool | None = None,
          truncate_prompt_tokens: int | None = None) -> list[PoolingRequestOutput]:
    pooler = engine.runner.pooler
    dimensions = check_dimensions(dimensions, pooler, engine.runner.config.dim, engine.name)
    ids_list, items = _prompt_items(engine, prompts, truncate_prompt_tokens)
    rows = engine.pool(items)
    return [PoolingRequestOutput(f"embd-{i}", ids, EmbeddingOutput(
        finish_embedding(r, pooler, dimensions, normalize).tolist())) for i, (ids, r) in enumerate(zip(ids_list, rows))]


def classify(engine: PoolingEngine, prompts, *, truncate_prompt_tokens: int | None = None
             ) -> list[PoolingRequestOutput]:
    ids_list, items = _prompt_items(engine, prompts, truncate_prompt_tokens)
    logits = engine.runner.classify(np.stack(engine.pool(items)))
    probs = scores_from_logits(logits, engine.runner.pooler.activation)
    probs = probs[:, None] if probs.ndim == 1 else probs
    return [PoolingRequestOutput(f"classify-{i}", ids, ClassificationOutput(p.tolist()))
            for i, (ids, p) in enumerate(zip(ids_list, probs))]


def score_pairs(engine: PoolingEngine, text_1, text_2, *, truncate_prompt_tokens: int | None = None
                ) -> list[tuple[list[int], float]]:
    """(token ids, score) of text_1 against each of text_2 (one text_1: it is paired with every
    text_2; else pairwise): a cross-encoder's classifier score, or the cosine similarity of the
    two embeddings for an embedding model."""
    t1 = [text_1] if isinstance(text_1, str) else list(text_1)
    t2 = [text_2] if isinstance(text_2, str) else list(text_2)
    if not t1 or not t2:
        raise PoolingInputError("score needs at least one text on each side")
    if len(t1) == 1:
        t1 = t1 * len(t2)
    if len(t1) != len(t2):
        raise PoolingInputError(f"text_1 has {len(t1)} texts and text_2 {len(t2)}: give one text_1 or as many as text_2")
    for t in t1 + t2:
        if not isinstance(t, str) or not t:
            raise PoolingInputError("score texts must be non-empty strings")
    runner = engine.runner
    cfg = runner.config
    kw = dict(vocab_size=cfg.vocab_size, max_model_len=runner.max_model_len,
              truncate_prompt_tokens=truncate_prompt_tokens)
    if runner.head:
        encoded = [encode_text(engine.tokenizer, a, b) for a, b in zip(t1, t2)]
        if cfg.type_vocab_size < 2:     # XLM-R: one token type; the pair's segments are told by </s>
            encoded = [(ids, None) for ids, _ in encoded]
        items = [make_item(ids, types, what="pair", **kw) for ids, types in encoded]
        logits = runner.classify(np.stack(engine.pool(items)))
        if logits.shape[1] != 1:
            raise PoolingInputError(f"scoring needs a one-label classifier; this model has {logits.shape[1]} labels")
        scores = scores_from_logits(logits, runner.pooler.activation)
        return [(ids, float(s)) for (ids, _), s in zip(encoded, scores)]
    if getattr(runner, "yes_no", None) is not None:
        return runner.yes_no_scores(engine, t1, t2, **kw)
    ids1 = [engine.tokenizer.encode(a) for a in t1]
    ids2 = [engine.tokenizer.encode(b) for b in t2]
    rows = engine.pool([make_item(i, None, **kw) for i in ids1 + ids2])
    out = []
    for k, (a, b) in enumerate(zip(ids1, ids2)):
        u, v = rows[k], rows[len(ids1) + k]
        cos = float(u @ v / max(np.linalg.norm(u) * np.linalg.norm(v), 1e-12))
        out.append((a + b, cos))
    return out


def score(engine: PoolingEngine, text_1, text_2, *, truncate_prompt_tokens: int | None = None
          ) -> list[PoolingRequestOutput]:
    return [PoolingRequestOutput(f"score-{i}", ids, ScoringOutput(s)) for i, (ids, s) in
            enumerate(score_pairs(engine, text_1, text_2, truncate_prompt_tokens=truncate_prompt_tokens))]


def parse_overrides(value) -> dict:
    """--hf-overrides: a dict, JSON text or None -> dict."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError(f"hf_overrides must be a JSON object, got {type(value).__name__}")
    return value


def runner_for_model(model: str | None, requested: str = "auto", hf_overrides=None) -> str:
    """The runner of model argument `model` (loader.resolve_model's forms): `requested`, or
    what the checkpoint's config says under "auto"."""
    if requested not in RUNNERS:
        raise ValueError(f"runner {requested!r}: expected one of {', '.join(RUNNERS)}")
    if requested != "auto":
        return requested
    from lite_llm.model import arch
    from lite_llm.model.loader import resolve_model
    path = resolve_model(model)
    if os.path.isdir(path):
        config, _ = arch.read_config(path)
        return choose_runner(path, config, hf_overrides=parse_overrides(hf_overrides))
    return "pooling" if _gguf_arch(path) in ("bert", "nomic-bert") else "generate"


def check_parallel(tensor_parallel_size: int, model: str | None) -> None:
    """Tensor parallelism is refused for pooling models, by name and with what to do instead."""
    if tensor_parallel_size and tensor_parallel_size > 1:
        raise ValueError(
            f"--tensor-parallel-size {tensor_parallel_size}: tensor parallelism is not supported for pooling "
            f"models ({model or 'this model'} runs the 'pooling' runner, whose model runs whole in one process). "
            "An embedding or reranking model fits one NUMA node: drop --tensor-parallel-size, and use "
            "--data-parallel-size N for N replicas (serve) when one is not enough")


def _gguf_arch(path: str) -> str | None:
    """general.architecture of a GGUF file (None for anything else)."""
    from lite_llm.model.gguf import GGUF_MAGIC, GGUFFile
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != GGUF_MAGIC:
                return None
    except OSError:
        return None
    f = GGUFFile(path)
    try:
        return f.metadata.get("general.architecture")
    finally:
        f.close()


def pooling_stats(stats_cls, engine: PoolingEngine):
    """The engine figures /metrics shows (vLLM's names): finished requests, prompt tokens,
    steps, queue time and end-to-end latency."""
    return stats_cls(prompt_tokens_total=engine.num_prompt_tokens,
                     request_success_total={"stop": engine.num_requests} if engine.num_requests else {},
                     num_steps_total=engine.num_steps, queue_time=engine.queue_hist.snapshot(),
                     e2e=engine.e2e_hist.snapshot())
