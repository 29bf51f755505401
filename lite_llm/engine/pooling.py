"""Pooling models on the engine: the runner's pooling step, and the calls (pool, embed,
classify, score) that front ends make of an engine serving a pooling model.

    PoolingModelRunner  the packed kernel model with a KV cache for ONE step behind the step
                        contract: execute(SchedulerOutput) -> RunnerOutput whose `pooled` holds
                        each request's row; a step's requests are whole prompts (the Scheduler
                        never splits a pooling request), one forward() call, nothing kept after
    PoolingClient       an engine (AsyncEngine, or the data-parallel front end) serving a pooling
                        model, with its PoolingSpec: pool(items) submits each input as a request
                        with PoolingParams and waits for the rows; the same engine thread, step
                        loop and Scheduler as generation (engine.py), so concurrent callers'
                        inputs share steps, and an input arriving while a step runs joins the next
    make_item, embed, classify, score_pairs, score
                        what LLM.embed / classify / score and the HTTP routes do with it

A step packs whole sequences (T tokens of S sequences) into the same flat arrays the decoder
runner uses; an encoder's tokens attend to their whole sequence (attn_positions = the
sequence's last position), a decoder embedder's causally. The step's kernel call returns the
final hidden rows the pooling type needs (every row for MEAN, the first or last of each
sequence otherwise); the pooling itself is a vectorised reduction per step.

The pooler and head (model-level) are lite_llm/model/pooler.py; the HTTP bodies
lite_llm/server/pooling.py; the engine's assembly engine/assemble.py.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lite_llm import _kernels
from lite_llm._kernels import gemm_path, layout
from lite_llm.config import attention_path_override
from lite_llm.engine.runner import kv_cache_format, trim_heap
from lite_llm.engine.runner_output import RunnerOutput
from lite_llm.model import arch
from lite_llm.model.pack import check_quantization, packed_weights
from lite_llm.model.pooler import (PoolerConfig, PoolingInputError, PoolingSpec, check_dimensions, finish_embedding,
                                   scores_from_logits)
from lite_llm.model.rope import longrope_rows, longrope_switch, rope_tables
from lite_llm.outputs import ClassificationOutput, EmbeddingOutput, PoolingRequestOutput, ScoringOutput
from lite_llm.sampling_params import PoolingParams

log = logging.getLogger("lite_llm")

POOLING_BLOCK_SIZE = 16     # tokens per KV block: a step's cache is small, a block wastes little


@dataclass
class PoolItem:
    """One sequence to pool: its tokens (and token types for a cross-encoder's pair)."""
    token_ids: np.ndarray                   # [n] int32
    token_types: np.ndarray | None = None   # [n] int32
    arrival: float = field(default_factory=time.monotonic)


# ---- the runner ---------------------------------------------------------------------------


class PoolingModelRunner:
    """The packed model, a one-step KV cache and the workspace; execute(step) -> pooled rows."""

    def __init__(self, loaded, pooler: PoolerConfig, *, max_num_batched_tokens: int, max_num_seqs: int,
                 num_threads: int, quantization: str | None = None, block_size: int = POOLING_BLOCK_SIZE,
                 kernels=None):
        """max_num_batched_tokens and max_num_seqs: the engine's (pooling_limits)."""
        cfg = loaded.config
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
                                                attn_path=attention_path_override())
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

    def decode_binding(self, num_seqs: int) -> None:
        return None         # a pooling step is never repeated

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


def pooling_limits(max_model_len: int, max_num_batched_tokens: int | None, max_num_seqs: int | None,
                   serving: bool) -> tuple[int, int]:
    """(token budget, sequences) of a pooling model's steps. An input is never split across
    steps, so the longest one the model takes must fit a step of its own (vLLM's rule without
    chunked prefill): a smaller budget is raised to max_model_len. Pooling steps are prefill
    only: no decode batch bounds the sequences (256 by default)."""
    budget = max_num_batched_tokens if max_num_batched_tokens is not None else (2048 if serving else 4096)
    if max_model_len > budget:
        log.info("pooling: max_num_batched_tokens %d raised to max_model_len %d (a pooling input is never "
                 "split across steps)", budget, max_model_len)
    return max(int(budget), max_model_len), max(1, int(max_num_seqs if max_num_seqs is not None else 256))


def pooling_num_blocks(max_tokens: int, max_seqs: int, block_size: int) -> int:
    """KV blocks of one step: every sequence of it wastes at most one partial block."""
    return max_tokens // block_size + max_seqs + 1


# ---- the front: pooling calls over an engine ---------------------------------------------------


_ids = itertools.count()          # request ids of pooling inputs, unique in the process
_ids_lock = threading.Lock()


class PoolingClient:
    """An engine serving a pooling model (AsyncEngine, or data_parallel.DataParallelEngine),
    the model's PoolingSpec and tokenizer: what LLM.embed and the pooling routes call."""

    def __init__(self, engine: Any, tokenizer: Any, spec: PoolingSpec, name: str = "model"):
        self.engine, self.tokenizer, self.spec, self.name = engine, tokenizer, spec, name

    def pool(self, items: list[PoolItem]) -> list[np.ndarray]:
        """Pooled rows [E] of each item (blocks until done). The items are requests of one
        owner, submitted together, so they share steps; a bad input is a PoolingInputError."""
        if not items:
            return []
        with _ids_lock:
            first = next(_ids)
            for _ in range(len(items) - 1):
                next(_ids)
        owner = f"pool-{first}"
        streams = []
        try:
            with self.engine.submitting():
                for k, it in enumerate(items):
                    types = None if it.token_types is None else tuple(int(t) for t in it.token_types)
                    streams.append(self.engine.add_request(f"pool-{first + k}", it.token_ids.tolist(),
                                                           PoolingParams(types), owner=owner))
        except ValueError as e:
            for s in streams:
                s.abort()
            raise PoolingInputError(str(e)) from None
        except BaseException:
            for s in streams:
                s.abort()
            raise
        rows = []
        for k, s in enumerate(streams):
            try:
                out = s.get()
            except ValueError as e:
                for rest in streams[k + 1:]:
                    rest.abort()
                raise PoolingInputError(str(e)) from None
            if not isinstance(out, PoolingRequestOutput):     # aborted: the engine is stopping
                for rest in streams[k + 1:]:
                    rest.abort()
                raise RuntimeError("the pooling engine is shutting down")
            rows.append(out.outputs.data)
        return rows

    # the engine's own interface, for the server (health, /metrics, shutdown, turns on the cores)
    def stats(self):
        return self.engine.stats()

    @property
    def is_alive(self) -> bool:
        return self.engine.is_alive

    @property
    def failure(self) -> str | None:
        return getattr(self.engine, "failure", None)

    @property
    def step_lock(self):
        return self.engine.step_lock

    @step_lock.setter
    def step_lock(self, lock) -> None:
        self.engine.step_lock = lock

    def shutdown(self, grace_seconds: float = 0.0) -> None:
        self.engine.shutdown(grace_seconds)


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


# ---- the offline API's work (LLM.embed / classify / score) ----------------------------------


def _prompt_items(client: PoolingClient, prompts, truncate_prompt_tokens=None) -> tuple[list, list]:
    """prompts (a str, {"prompt_token_ids": [...]}, or a list of either) -> (token id lists, items)."""
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    ids_list, items = [], []
    for p in prompts:
        if isinstance(p, dict) and "prompt_token_ids" in p:
            ids = [int(t) for t in p["prompt_token_ids"]]
        elif isinstance(p, dict) and "prompt" in p:
            ids = client.tokenizer.encode(p["prompt"])
        elif isinstance(p, str):
            if client.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; pass {'prompt_token_ids': [...]}")
            ids = client.tokenizer.encode(p)
        else:
            raise TypeError(f"a prompt is a str or a dict with 'prompt_token_ids', not {type(p).__name__}")
        ids_list.append(ids)
        items.append(make_item(ids, None, vocab_size=client.spec.config.vocab_size,
                               max_model_len=client.spec.max_model_len, truncate_prompt_tokens=truncate_prompt_tokens))
    return ids_list, items


def embed(client: PoolingClient, prompts, *, dimensions: int | None = None, normalize: bool | None = None,
          truncate_prompt_tokens: int | None = None) -> list[PoolingRequestOutput]:
    pooler = client.spec.pooler
    dimensions = check_dimensions(dimensions, pooler, client.spec.config.dim, client.name)
    ids_list, items = _prompt_items(client, prompts, truncate_prompt_tokens)
    rows = client.pool(items)
    return [PoolingRequestOutput(f"embd-{i}", ids, EmbeddingOutput(
        finish_embedding(r, pooler, dimensions, normalize).tolist())) for i, (ids, r) in enumerate(zip(ids_list, rows))]


def classify(client: PoolingClient, prompts, *, truncate_prompt_tokens: int | None = None
             ) -> list[PoolingRequestOutput]:
    ids_list, items = _prompt_items(client, prompts, truncate_prompt_tokens)
    logits = client.spec.classify(np.stack(client.pool(items)))
    probs = scores_from_logits(logits, client.spec.pooler.activation)
    probs = probs[:, None] if probs.ndim == 1 else probs
    return [PoolingRequestOutput(f"classify-{i}", ids, ClassificationOutput(p.tolist()))
            for i, (ids, p) in enumerate(zip(ids_list, probs))]


def score_pairs(client: PoolingClient, text_1, text_2, *, truncate_prompt_tokens: int | None = None
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
    spec = client.spec
    cfg = spec.config
    kw = dict(vocab_size=cfg.vocab_size, max_model_len=spec.max_model_len,
              truncate_prompt_tokens=truncate_prompt_tokens)
    if spec.head:
        encoded = [encode_text(client.tokenizer, a, b) for a, b in zip(t1, t2)]
        if cfg.type_vocab_size < 2:     # XLM-R: one token type; the pair's segments are told by </s>
            encoded = [(ids, None) for ids, _ in encoded]
        items = [make_item(ids, types, what="pair", **kw) for ids, types in encoded]
        logits = spec.classify(np.stack(client.pool(items)))
        if logits.shape[1] != 1:
            raise PoolingInputError(f"scoring needs a one-label classifier; this model has {logits.shape[1]} labels")
        scores = scores_from_logits(logits, spec.pooler.activation)
        return [(ids, float(s)) for (ids, _), s in zip(encoded, scores)]
    ids1 = [client.tokenizer.encode(a) for a in t1]
    ids2 = [client.tokenizer.encode(b) for b in t2]
    rows = client.pool([make_item(i, None, **kw) for i in ids1 + ids2])
    out = []
    for k, (a, b) in enumerate(zip(ids1, ids2)):
        u, v = rows[k], rows[len(ids1) + k]
        cos = float(u @ v / max(np.linalg.norm(u) * np.linalg.norm(v), 1e-12))
        out.append((a + b, cos))
    return out


def score(client: PoolingClient, text_1, text_2, *, truncate_prompt_tokens: int | None = None
          ) -> list[PoolingRequestOutput]:
    return [PoolingRequestOutput(f"score-{i}", ids, ScoringOutput(s)) for i, (ids, s) in
            enumerate(score_pairs(client, text_1, text_2, truncate_prompt_tokens=truncate_prompt_tokens))]
