"""Pooling models on the engine: the runner's pooling step, and the calls (pool, embed,
classify, score) that front ends make of an engine serving a pooling model.

    PoolingModelRunner  (engine/pooling_runner.py) the packed kernel model with a KV cache for
                        ONE step behind the step contract: execute(SchedulerOutput) ->
                        RunnerOutput whose `pooled` holds each request's row
    PoolingClient       an engine (AsyncEngine, or the data-parallel front end) serving a pooling
                        model, with its PoolingSpec: pool(items) submits each input as a request
                        with PoolingParams and waits for the rows; the same engine thread, step
                        loop and Scheduler as generation (engine.py), so concurrent callers'
                        inputs share steps, and an input arriving while a step runs joins the next
    make_item, embed, classify, score_pairs, score
                        what LLM.embed / classify / score and the HTTP routes do with it

This module loads no kernels (the server imports it before the OpenMP environment is set).
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

from lite_llm.model.pooler import PoolingInputError, PoolingSpec, check_dimensions, finish_embedding, scores_from_logits
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
