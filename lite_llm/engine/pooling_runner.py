"""A pooling model's runner: the packed kernel model with a KV cache for ONE step, behind the
step contract (engine.py): execute(SchedulerOutput) -> RunnerOutput whose `pooled` holds each
request's row. A step's requests are whole prompts (the Scheduler never splits a pooling
request, engine/pooling.py's pooling_limits sizes the steps), one forward() call, nothing kept
after the step.

A step packs whole sequences (T tokens of S sequences) into the same flat arrays the decoder
runner uses; an encoder's tokens attend to their whole sequence (attn_positions = the
sequence's last position), a decoder embedder's causally. The step's kernel call returns the
final hidden rows the pooling type needs (every row for MEAN, the first or last of each
sequence otherwise); the pooling itself is a vectorised reduction per step.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from lite_llm import _kernels
from lite_llm._kernels import gemm_path, layout
from lite_llm.config import attention_path_override
from lite_llm.engine.pooling import POOLING_BLOCK_SIZE, PoolItem, pooling_num_blocks
from lite_llm.engine.runner import kv_cache_format, trim_heap
from lite_llm.engine.runner_output import RunnerOutput
from lite_llm.model import arch
from lite_llm.model.pack import check_quantization, packed_weights
from lite_llm.model.pooler import PoolerConfig
from lite_llm.model.rope import longrope_rows, longrope_switch, rope_tables

log = logging.getLogger("lite_llm")


class PoolingModelRunner:
    """The packed model, a one-step KV cache and the workspace; execute(step) -> pooled rows."""
    steady_decode = None     # a pooling step is never repeated (engine.Runner)

    def __init__(self, loaded, pooler: PoolerConfig, *, max_num_batched_tokens: int, max_num_seqs: int,
                 num_threads: int, quantization: str | None = None, block_size: int = POOLING_BLOCK_SIZE,
                 kernels=None, batch_invariant: bool = False):
        """max_num_batched_tokens and max_num_seqs: the engine's (pooling_limits). batch_invariant:
        deterministic mode (config.KernelConfig.batch_invariant): an input's vector is the same bits in
        any batch."""
        cfg = loaded.config
        if cfg.is_hybrid or cfg.is_mla:
            raise ValueError(f"{cfg.architecture} runs as a generating model only: pooling runs attention "
                             "layers over a paged KV cache (no recurrent states or latent attention)")
        self.config, self.pooler, self.dtype = cfg, pooler, loaded.dtype
        self.kernels = kernels or _kernels.kernels
        self.num_threads = num_threads
        self.block_size = block_size
        self.max_model_len = loaded.max_model_len
        self.max_tokens = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        kv_dtype = kv_cache_format(self.dtype, "auto")
        self.gemm_paths = gemm_path.choose(self.kernels)
        self.kernel_config = arch.kernel_config(cfg, dtype=self.dtype, block_size=block_size,
                                                max_positions=self.max_model_len, kv_cache_dtype=kv_dtype,
                                                bf16_path=self.gemm_paths.chosen["bf16"],
                                                attn_path=attention_path_override(), batch_invariant=batch_invariant)
        start = time.perf_counter()
        self.packed = packed_weights(loaded, self.dtype, num_threads, check_quantization(quantization), None,
                                     self.kernels)
        packed = self.packed.model
        loaded.release()
        trim_heap()
        self.num_blocks = num_blocks = pooling_num_blocks(self.max_tokens, self.max_seqs, block_size)
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
        self.weight_bytes = packed.nbytes
        self.kv_cache_bytes = sum(c.nbytes for c in self.k_caches + self.v_caches)
        self.formats = self.model.formats()
        self.last_step_seconds = 0.0
        log.info("pooling model ready in %.2f s: %.1f MB of weights, %s pooling%s, steps of up to %d tokens",
                 time.perf_counter() - start, self.weight_bytes / 2**20, pooler.pooling_type,
                 " + normalize" if pooler.normalize else "", self.max_tokens)

    def execute(self, sched_out, masks=None) -> RunnerOutput:
        """One step: each chunk a pooling request's whole prompt, entering the step with its
        whole block table (a new chunk's new_block_ids); its row in RunnerOutput.pooled."""
        chunks = sched_out.chunks
        items, tables = [], []
        for c in chunks:
            request = c.request
            assert c.is_new and c.start == 0 and c.num_new_tokens == request.num_tokens, \
                "a pooling input was split across steps"
            types = request.pooling.token_type_ids
            items.append(PoolItem(np.asarray(request.prompt_token_ids, np.int32),
                                  None if types is None else np.asarray(types, np.int32), request.arrival_time))
            tables.append(c.new_block_ids)
        rows = self.run_step(items, tables)
        return RunnerOutput([None] * len(chunks), kernel_seconds=self.last_step_seconds,
                            bytes_read=self.weight_bytes, pooled=list(rows))

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
