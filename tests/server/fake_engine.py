"""FakeEngine: AsyncEngine's interface over a deterministic token stream, for server tests.

Same methods and output shapes as lite_llm.engine.async_engine.AsyncEngine (add_request ->
iterator of DELTA RequestOutputs, abort, stats, shutdown, is_alive, QueueFullError over
max_queue), its own thread, one token per running completion per step. Tokens: at
temperature 0 a hash of (prompt, tokens so far); otherwise drawn from a Random seeded by
`seed + index` (fresh when no seed). Honours n, max_tokens, min_tokens, stop, stop_token_ids,
include_stop_str_in_output and logprobs. Deliberately not here: penalties, top_p/top_k
(they change nothing the server can observe).
"""
from __future__ import annotations

import hashlib
import os
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from lite_llm.engine.async_engine import QueueFullError
from lite_llm.engine.stats import FinishedRequestRecord, StatsCollector
from lite_llm.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from lite_llm.sampling_params import SamplingParams


class FakeStream:
    """Iterator of delta RequestOutputs; ends after the one with finished=True."""

    def __init__(self) -> None:
        self._q: queue.Queue[RequestOutput] = queue.Queue()

    def put(self, out: RequestOutput) -> None:
        self._q.put(out)

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            out = self._q.get()
            yield out
            if out.finished:
                return


@dataclass
class _Seq:
    index: int
    rng: random.Random | None
    token_ids: list[int] = field(default_factory=list)
    sent_text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _Req:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: FakeStream
    seqs: list[_Seq]
    metrics: RequestMetrics

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.seqs)


class FakeEngine:
    def __init__(self, tokenizer: Any, *, max_num_seqs: int = 256, max_queue: int = 1024,
                 step_seconds: float = 0.002, kv_capacity_tokens: int = 1 << 16):
        self.tokenizer = tokenizer
        self.max_num_seqs, self.max_queue = max_num_seqs, max_queue
        self.step_seconds = step_seconds
        self.kv_capacity_tokens = kv_capacity_tokens
        specials = getattr(tokenizer, "all_special_ids", set())
        # tokens that decode to clean text on their own: outputs stay readable and exact
        self.vocab = [i for i in range(tokenizer.vocab_size) if i not in specials
                      and (t := tokenizer.decode([i])) and t.isprintable() and "\ufffd" not in t]
        self._lock = threading.Lock()
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._waiting: list[_Req] = []
        self._running: list[_Req] = []
        self._stats = StatsCollector()
        self._preempted = 0
        self._stopping = False
        self.aborted: list[str] = []          # request ids aborted, for tests
        self.peak_running = 0
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    # ---- AsyncEngine's interface -----------------------------------------------------------

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                    prompt: str | None = None) -> FakeStream:
        if not self.is_alive:
            raise RuntimeError("engine is not running")
        params = sampling_params.clone()
        seqs = [_Seq(i, None if params.is_greedy else random.Random(
            (params.seed + i) if params.seed is not None else os.urandom(16))) for i in range(params.n)]
        req = _Req(request_id, prompt, list(prompt_token_ids), params, FakeStream(), seqs,
                   RequestMetrics(arrival_time=time.monotonic()))
        with self._lock:
            if len(self._waiting) + self._inbox.qsize() >= self.max_queue:
                raise QueueFullError(f"waiting queue is full ({self.max_queue})")
            self._inbox.put(("add", req))
        return req.stream

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def stats(self):
        with self._lock:
            held = sum(len(r.prompt_token_ids) + max(len(s.token_ids) for s in r.seqs)
                       for r in self._running)
            return self._stats.snapshot(
                num_running=len(self._running), num_waiting=len(self._waiting),
                num_preempted_total=self._preempted,
                kv_cache_usage=min(1.0, held / self.kv_capacity_tokens),
                prefix_cache_queries=0, prefix_cache_hits=0)

    def shutdown(self, grace_seconds: float = 0.0) -> None:
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline:
            with self._lock:
                if not self._running and not self._waiting and self._inbox.empty():
                    break
            time.sleep(0.01)
        self._stopping = True
        self._thread.join(timeout=5)

    # ---- the engine thread --------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            if self._stopping:
                with self._lock:
                    for req in self._waiting + self._running:
                        self._finish_all(req, "abort")
                        self._emit(req, [])
                    self._waiting.clear()
                    self._running.clear()
                return
            self._drain_inbox()
            with self._lock:
                while self._waiting and sum(len(r.seqs) for r in self._running) < self.max_num_seqs:
                    req = self._waiting.pop(0)
                    req.metrics.first_scheduled_time = time.monotonic()
                    self._running.append(req)
                self.peak_running = max(self.peak_running, len(self._running))
                running = list(self._running)
            if not running:
                time.sleep(0.001)
                continue
            for req in running:
                self._step(req)
            with self._lock:
                self._running = [r for r in self._running if not r.finished]
            time.sleep(self.step_seconds)

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, value = self._inbox.get_nowait()
            except queue.Empty:
                return
            with self._lock:
                if kind == "add":
                    self._waiting.append(value)
                    continue
                for group in (self._waiting, self._running):
                    for req in group:
                        if req.request_id == value and not req.finished:
                            self.aborted.append(value)
                            self._finish_all(req, "abort")
                            self._emit(req, [])
                            group.remove(req)
                            break

    def _finish_all(self, req: _Req, reason: str) -> None:
        for s in req.seqs:
            if s.finish_reason is None:
                s.finish_reason = reason
        self._record(req)

    def _record(self, req: _Req) -> None:
        now = time.monotonic()
        m = req.metrics
        m.finished_time = now
        for s in req.seqs:
            first = m.first_token_time
            self._stats.record_finished(FinishedRequestRecord(
                request_id=req.request_id, finish_reason=s.finish_reason,
                num_prompt_tokens=len(req.prompt_token_ids), num_generation_tokens=len(s.token_ids),
                num_cached_tokens=0, num_preemptions=0,
                queue_time=(m.first_scheduled_time - m.arrival_time) if m.first_scheduled_time else None,
                ttft=(first - m.arrival_time) if first else None,
                tpot=((now - first) / (len(s.token_ids) - 1)) if first and len(s.token_ids) > 1 else None,
                e2e=now - m.arrival_time))
        self._stats.prompt_tokens_total += len(req.prompt_token_ids)

    def _emit(self, req: _Req, deltas: list[CompletionOutput]) -> None:
        by_index = {d.index: d for d in deltas}
        outs = [by_index.get(s.index) or CompletionOutput(s.index, "", [], finish_reason=s.finish_reason,
                                                          stop_reason=s.stop_reason) for s in req.seqs]
        if not req.finished:
            outs = [o for o in outs if o.token_ids or o.text]
        req.stream.put(RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs,
                                     finished=req.finished, metrics=req.metrics))

    def _next_token(self, req: _Req, seq: _Seq) -> int:
        if seq.rng is None:
            h = hashlib.blake2b(repr((req.prompt_token_ids, seq.token_ids)).encode(), digest_size=8)
            return self.vocab[int.from_bytes(h.digest(), "little") % len(self.vocab)]
        return seq.rng.choice(self.vocab)

    def _logprobs(self, req: _Req, seq: _Seq, token_id: int) -> dict[int, Logprob]:
        k = max(req.params.logprobs or 0, 1)
        pos = len(seq.token_ids)
        out = {token_id: Logprob(-0.25 - 0.001 * pos, 1, self.tokenizer.decode([token_id]))}
        rank = 2
        for j in range(len(self.vocab)):
            if len(out) >= k:
                break
            other = self.vocab[(token_id + 7919 * (j + 1)) % len(self.vocab)]
            if other not in out:
                out[other] = Logprob(-1.0 * rank - 0.001 * pos, rank, self.tokenizer.decode([other]))
                rank += 1
        return out

    def _step(self, req: _Req) -> None:
        p = req.params
        deltas = []
        now = time.monotonic()
        for seq in req.seqs:
            if seq.finish_reason is not None:
                continue
            tid = self._next_token(req, seq)
            seq.token_ids.append(tid)
            self._stats.generation_tokens_total += 1
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = now
            lps = [self._logprobs(req, seq, tid)] if p.logprobs is not None else None
            full = self.tokenizer.decode(seq.token_ids, skip_special_tokens=p.skip_special_tokens)
            counted = len(seq.token_ids) > p.min_tokens
            if counted and tid in p.stop_token_ids:
                seq.finish_reason, seq.stop_reason = "stop", tid
            elif counted and p.stop:
                hits = [(full.find(s, max(0, len(seq.sent_text) - len(s) + 1)), s) for s in p.stop]
                hits = [(at, s) for at, s in hits if at >= 0]
                if hits:
                    at, s = min(hits)
                    full = full[:at + len(s)] if p.include_stop_str_in_output else full[:at]
                    seq.finish_reason, seq.stop_reason = "stop", s
            if seq.finish_reason is None and p.max_tokens is not None and len(seq.token_ids) >= p.max_tokens:
                seq.finish_reason = "length"
            if seq.finish_reason is None and p.stop:
                # hold back what could still become a stop string, as a real detokenizer must
                full = full[:max(len(seq.sent_text), len(full) - max(map(len, p.stop)) + 1)]
            new_text = full[len(seq.sent_text):]
            seq.sent_text += new_text
            deltas.append(CompletionOutput(seq.index, new_text, [tid], logprobs=lps,
                                           finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
        with self._lock:
            if req.finished:
                self._record(req)
            self._emit(req, deltas)
