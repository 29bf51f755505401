"""Pooling models with data parallel (`serve --runner pooling --data-parallel-size N`): N
replica processes, each a PoolingEngine on its own share of the cores (the same thread plan
as the generation replicas: engine/data_parallel.py replica_plans / replica_bind), behind one
front end with the PoolingEngine interface the pooling routes and LLM-style helpers use
(pool, tokenizer, runner.pooler / config / max_model_len / classify, stats, is_alive,
shutdown).

    HTTP threads --pool(items)--> PoolingReplicas --pipe--> replica 0 (PoolingEngine, CPUs 0-15)
                 <--rows-------   (least tokens     --pipe--> replica 1 (PoolingEngine, CPUs 16-31)
                                   in flight)

A request's inputs go to one replica, the one with the fewest input tokens in flight (ties in
turn), so they share its steps; the rows come back as float32 arrays. The classifier head (a few [L, E]
arrays) is sent once at start-up: scores are finished in the front end as with one engine.
A replica that exits unasked fails its open requests and the front end stops accepting.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import numpy as np

from lite_llm.engine.data_parallel import (build_or_report, replica_bind, replica_plans, replica_process_setup,
                                           replies, spawn_replicas)
from lite_llm.engine.stats import merge_stats
from lite_llm.pooling import PoolingInputError, PoolingRunner, PoolItem, build_pooling_engine

log = logging.getLogger("lite_llm.data_parallel")


class _RunnerView:
    """What the front end needs of a replica's PoolingRunner (no weights)."""

    classify = PoolingRunner.classify

    def __init__(self, pooler, config, max_model_len: int, head: dict):
        self.pooler, self.config, self.max_model_len, self.head = pooler, config, max_model_len, head


def _replica_main(index: int, environ: dict[str, str], affinity: list[int] | None, log_level: int,
                  model: str | None, kwargs: dict, requests: Any, replies: Any) -> None:
    """One replica: a PoolingEngine; each ("pool", job id, items) is pooled on a thread of its
    own (so concurrent jobs share the engine's steps) and answered ("done", job id, rows, error)."""
    send = replica_process_setup(index, environ, affinity, log_level, replies)
    built = build_or_report(send, lambda: build_pooling_engine(model, serving=True, progress=False, **kwargs))
    if built is None:
        return
    engine, _, info = built
    r = engine.runner
    send(("ready", {"info": {k: v for k, v in info.items() if isinstance(v, (int, float, str, bool, type(None)))},
                    "pid": os.getpid(), "pooler": r.pooler, "config": r.config, "max_model_len": r.max_model_len,
                    "head": r.head}))

    def work(job_id: int, items: list[PoolItem]) -> None:
        try:
            rows, error = np.stack(engine.pool(items)), None
        except BaseException as e:  # noqa: BLE001 - the caller gets it
            rows, error = None, (isinstance(e, PoolingInputError), f"{e}")
        try:
            send(("done", job_id, rows, error))
        except OSError:
            pass

    try:
        while True:
            try:
                msg = requests.recv()
            except (EOFError, OSError):         # the front end is gone
                break
            if msg[0] == "pool":
                threading.Thread(target=work, args=msg[1:], name="lite-llm-pool-job", daemon=True).start()
            elif msg[0] == "stats":
                send(("stats", engine.stats()))
            elif msg[0] == "shutdown":
                break
    finally:
        engine.shutdown()


class _Job:
    def __init__(self, num_tokens: int):
        self.num_tokens = num_tokens
        self.done = threading.Event()
        self.rows: np.ndarray | None = None
        self.error: BaseException | None = None


class _Replica:
    def __init__(self, index: int, cpus: str, process: Any, requests: Any, replies: Any):
        self.index, self.cpus, self.process = index, cpus, process
        self.requests, self.replies = requests, replies
        self.jobs: dict[int, _Job] = {}
        self.tokens_in_flight = 0
        self.alive = True
        self.stats = None                   # its latest EngineStats
        self.stats_event = threading.Event()
        self.info: dict = {}

    def describe(self) -> str:
        return f"replica {self.index} (pid {self.process.pid}, CPUs {self.cpus or 'any'})"


class PoolingReplicas:
    """The front end: PoolingEngine's interface over N replica processes."""

    def __init__(self, replicas: list[_Replica], tokenizer, name: str):
        first = replicas[0].info
        self.replicas, self.tokenizer, self.name = replicas, tokenizer, name
        self.runner = _RunnerView(first["pooler"], first["config"], first["max_model_len"], first["head"])
        self._lock = threading.Lock()
        self._next_job = 0
        self._stopping = False
        self._failure: str | None = None
        for rep in replicas:
            threading.Thread(target=self._read, args=(rep,), name=f"lite-llm-pool-replica-{rep.index}",
                             daemon=True).start()

    def pool(self, items: list[PoolItem]) -> list[np.ndarray]:
        """Pooled rows [E] of each item, from the replica with the fewest input tokens in flight."""
        if not items:
            return []
        job = _Job(sum(len(it.token_ids) for it in items))
        with self._lock:
            if self._stopping or self._failure is not None:
                raise RuntimeError("the pooling engine is not running" + (f": {self._failure}" if self._failure else ""))
            n = len(self.replicas)     # ties (idle replicas) taken in turn
            rep = min((r for r in self.replicas if r.alive),
                      key=lambda r: (r.tokens_in_flight, (r.index - self._next_job) % n))
            job_id = self._next_job
            self._next_job += 1
            rep.jobs[job_id] = job
            rep.tokens_in_flight += job.num_tokens
            try:
                rep.requests.send(("pool", job_id, items))
            except OSError as e:
                del rep.jobs[job_id]
                rep.tokens_in_flight -= job.num_tokens
                raise RuntimeError(f"data-parallel {rep.describe()} is gone: {e}") from None
        job.done.wait()
        if job.error is not None:
            raise job.error
        return list(job.rows)

    def _read(self, rep: _Replica) -> None:
        for msg in replies(rep.replies):
            if msg[0] == "done":
                _, job_id, rows, error = msg
                with self._lock:
                    job = rep.jobs.pop(job_id)
                    rep.tokens_in_flight -= job.num_tokens
                if error is not None:
                    is_input, text = error
                    job.error = PoolingInputError(text) if is_input else RuntimeError(f"{rep.describe()}: {text}")
                job.rows = rows
                job.done.set()
            elif msg[0] == "stats":
                rep.stats = msg[1]
                rep.stats_event.set()
        with self._lock:        # the replica exited: its open jobs fail, and so does the front end
            rep.alive = False
            if not self._stopping:
                self._failure = f"data-parallel {rep.describe()} exited (code {rep.process.exitcode})"
                log.error("%s", self._failure)
            jobs, rep.jobs = list(rep.jobs.values()), {}
        for job in jobs:
            job.error = RuntimeError(self._failure or "the pooling engine is shutting down")
            job.done.set()

    # ---- counters, health, shutdown (PoolingEngine's interface) ---------------------------------

    def _replica_stats(self, timeout: float = 5.0) -> list:
        out = []
        for rep in self.replicas:
            if not rep.alive:
                continue
            rep.stats_event.clear()
            try:
                rep.requests.send(("stats",))
            except OSError:
                continue
            if rep.stats_event.wait(timeout) and rep.stats is not None:
                out.append(rep.stats)
        return out

    def stats(self):
        """The replicas' EngineStats as one (/metrics)."""
        return merge_stats(self._replica_stats())

    def is_alive(self) -> bool:
        return self._failure is None and all(r.alive for r in self.replicas)

    @property
    def failure(self) -> str | None:
        return self._failure

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        for rep in self.replicas:
            try:
                rep.requests.send(("shutdown",))
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for rep in self.replicas:
            rep.process.join(max(0.0, deadline - time.monotonic()))
            if rep.process.is_alive():
                rep.process.terminate()
                rep.process.join(2.0)


def build_pooling_replicas(model: str | None, data_parallel_size: int, **kwargs: Any
                           ) -> tuple[PoolingReplicas, Any, dict]:
    """Start data_parallel_size pooling replica processes (build_pooling_engine's keyword
    arguments), each on its share of the thread plan -> (front end, tokenizer, info)."""
    plan = replica_plans(data_parallel_size)
    for line in plan.describe():
        log.info("pooling data parallel %s", line.replace("rank ", "replica ", 1))
    binds = [replica_bind(plan, i) for i in range(data_parallel_size)]
    replicas, loaded = spawn_replicas(
        _replica_main, "lite-llm-pool-replica", binds, model, kwargs,
        lambda i, bind, affinity, proc, req_write, rep_read: _Replica(i, bind if affinity else "", proc, req_write,
                                                                       rep_read),
        dtype=kwargs.get("dtype") or "auto", max_model_len=kwargs.get("max_model_len"))
    first = replicas[0].info
    engine = PoolingReplicas(replicas, loaded.tokenizer, first["info"].get("model_name") or str(model))
    info = {**first["info"], "pooler": first["pooler"], "data_parallel_size": data_parallel_size,
            "num_threads": sum(r.info["info"].get("num_threads", 0) for r in replicas),
            "replicas": [{"pid": r.info["pid"], "cpus": r.cpus} for r in replicas]}
    return engine, loaded.tokenizer, info

