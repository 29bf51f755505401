"""Data parallel on one machine: N engine replicas, each its own process on its own cores,
behind one front end that speaks AsyncEngine's interface (add_request / abort / stats /
is_alive / shutdown), so the HTTP server (server/app.py) serves over it unchanged.

    HTTP threads --add/abort--> DataParallelEngine --pipe--> replica 0 process (AsyncEngine, CPUs 0-15)
                 <--deltas----   (routes, streams)  --pipe--> replica 1 process (AsyncEngine, CPUs 16-31)

Routing (PrefixRouter): a request whose prompt's leading full KV blocks were last sent to a
replica goes there, so that replica's prefix cache serves them, unless that replica has more
than PREFIX_MAX_IMBALANCE requests in flight beyond the least loaded one; otherwise the least
loaded replica (in-flight requests: its running + waiting as the front end counts them, ties
taken in turn). Blocks are keyed by the prefix cache's own content hash (block_pool.
hash_block_tokens, chained over blocks of the replicas' block_size); entries age out after
PREFIX_TTL_SECONDS and the map keeps at most PREFIX_MAP_SIZE of them.

Wire: two one-way pipes per replica carry small pickled tuples: a request's token ids and
SamplingParams once (and a multimodal prompt's preprocessed images: the front end expanded its
placeholders, so it holds them already; the requests added in one submitting() block, such as a
pooling call's inputs, in one message), then per engine step one message with that step's
deltas (token ids and text, without the prompt). Metrics are asked for at scrape time. Nothing
per layer; no arrays but a request's images, once, and a pooling request's row.

Pooling models: the replicas are pooling engines (EngineArgs.runner "pooling"); a pooling
request's row comes back in one message, and its PoolingSpec (pooler, classifier head) is sent
once at start-up, so the front end (engine/pooling.py PoolingClient) finishes scores itself.

Failure: a replica process that exits unasked (killed, crashed) fails its open requests with
EngineDeadError naming it, and the front end stops accepting (503; `serve` then exits). The
replica processes are daemons and also stop when the front end's pipe closes.

What is not here: the engine itself (engine.py, async_engine.py), thread plans (cpu.py), HTTP.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable, Iterator

from lite_llm import cpu
from lite_llm.config import env
from lite_llm.engine.args import EngineArgs
from lite_llm.engine.assemble import build_engine
from lite_llm.engine.async_engine import (EngineDeadError, EngineShutdownError, QueueFullError,
                                          RequestStream)
from lite_llm.engine.block_pool import hash_block_tokens
from lite_llm.engine.engine import check_kind, check_pooling_request, check_request
from lite_llm.engine.stats import EngineStats, merge_stats
from lite_llm.engine.structured import Grammars
from lite_llm.model.loader import load_model
from lite_llm.multimodal import check_images_fit
from lite_llm.outputs import PoolingOutput, PoolingRequestOutput, RequestOutput
from lite_llm.sampling_params import PoolingParams, SamplingParams

log = logging.getLogger("lite_llm.data_parallel")

PREFIX_MAX_BLOCKS = 64          # leading blocks of a prompt the router hashes and remembers
PREFIX_MAP_SIZE = 1 << 16       # remembered blocks over all replicas (LRU beyond)
PREFIX_TTL_SECONDS = 600.0      # a replica's cache turns over; an old entry is a guess
PREFIX_MAX_IMBALANCE = 4        # in-flight requests a prefix hit may add over the least loaded replica
STATS_TIMEOUT = 5.0             # seconds a /metrics scrape waits for a busy replica's snapshot
STATS_RECENT_STEPS = 256        # step records a replica sends per snapshot (not its 4096)


# ---- routing -----------------------------------------------------------------------------------

class PrefixRouter:
    """Which replica gets a request: prefix affinity first, load second (module docstring).

    Not thread-safe: the caller holds its lock around choose() + record()."""

    def __init__(self, num_replicas: int, block_size: int, *, max_blocks: int = PREFIX_MAX_BLOCKS,
                 capacity: int = PREFIX_MAP_SIZE, ttl: float = PREFIX_TTL_SECONDS,
                 max_imbalance: int = PREFIX_MAX_IMBALANCE, clock: Any = time.monotonic):
        self.num_replicas, self.block_size = num_replicas, block_size
        self.max_blocks, self.capacity, self.ttl = max_blocks, capacity, ttl
        self.max_imbalance, self.clock = max_imbalance, clock
        self._owner: OrderedDict[bytes, tuple[int, float]] = OrderedDict()   # hash -> (replica, when)
        self._next = 0                      # where the next tie-break starts

    def block_hashes(self, token_ids: list[int], mm=None) -> list[bytes]:
        """Content hashes of the prompt's leading full blocks, as the replicas' prefix cache keys
        them (with the hashes of the images a block holds: mm, a multimodal.MMPrompt)."""
        bs, out, parent = self.block_size, [], None
        for blk in range(min(len(token_ids) // bs, self.max_blocks)):
            parent = hash_block_tokens(parent, token_ids[blk * bs:(blk + 1) * bs],
                                       mm.block_key(blk * bs, (blk + 1) * bs) if mm is not None else b"")
            out.append(parent)
        return out

    def cached_on(self, hashes: list[bytes]) -> tuple[int | None, int]:
        """(replica that got the longest remembered prefix, its length in blocks)."""
        now, replica, depth = self.clock(), None, 0
        for i, h in enumerate(hashes):
            entry = self._owner.get(h)
            if entry is None or now - entry[1] > self.ttl:
                break
            replica, depth = entry[0], i + 1
        return replica, depth

    def choose(self, hashes: list[bytes], loads: list[int | None]) -> int:
        """loads[i]: requests in flight on replica i, None when it cannot take any."""
        alive = [i for i, load in enumerate(loads) if load is not None]
        if not alive:
            raise EngineDeadError("no data-parallel replica is running")
        least = min(loads[i] for i in alive)
        replica, _ = self.cached_on(hashes)
        if replica is not None and loads[replica] is not None and loads[replica] - least <= self.max_imbalance:
            return replica
        ties = [i for i in alive if loads[i] == least]
        pick = next((i for i in ties if i >= self._next), ties[0])
        self._next = (pick + 1) % self.num_replicas
        return pick

    def record(self, hashes: list[bytes], replica: int) -> None:
        now = self.clock()
        for h in reversed(hashes):      # the leading blocks most recent: the LRU drops tails first
            self._owner[h] = (replica, now)
            self._owner.move_to_end(h)
        while self._owner:
            oldest = next(iter(self._owner.values()))
            if len(self._owner) <= self.capacity and now - oldest[1] <= self.ttl:
                break
            self._owner.popitem(last=False)

    def forget(self, replica: int) -> None:
        for h in [h for h, (r, _) in self._owner.items() if r == replica]:
            del self._owner[h]


# ---- thread plans per replica ------------------------------------------------------------------

def replica_plans(data_parallel_size: int, topology: cpu.Topology | None = None,
                  bind: str | None = None, tensor_parallel_size: int = 1) -> cpu.ThreadPlan:
    """The thread plan split into one rank per replica (or, with tensor_parallel_size N, N
    consecutive ranks per replica: its tensor-parallel ranks): auto deals NUMA nodes / cores
    out; an explicit LITE_LLM_CPU_OMP_THREADS_BIND must list exactly one CPU list per rank."""
    topology = cpu.read_topology() if topology is None else topology
    bind = (env("CPU_OMP_THREADS_BIND", "auto") if bind is None else bind).strip()
    world = data_parallel_size * tensor_parallel_size
    what = (f"--data-parallel-size is {data_parallel_size}" if tensor_parallel_size == 1 else
            f"--data-parallel-size {data_parallel_size} x --tensor-parallel-size {tensor_parallel_size} "
            f"is {world} ranks")
    if bind not in ("auto", "nobind"):
        lists = bind.split("|")
        if len(lists) != world:
            example = "|".join(cpu.format_cpulist(g) for g in _deal(topology.allowed, world))
            fix = (f"set --data-parallel-size {len(lists)}" if tensor_parallel_size == 1 else
                   f"list {tensor_parallel_size} per replica, replica after replica")
            raise ValueError(
                f"LITE_LLM_CPU_OMP_THREADS_BIND={bind!r} lists {len(lists)} CPU list(s) but {what}: give one "
                f"list per rank separated by '|' (such as {example!r}), {fix}, or use 'auto'")
    try:
        return cpu.plan_threads(topology, bind=bind, serving=True, world_size=world)
    except ValueError as e:
        raise ValueError(f"--data-parallel-size {data_parallel_size}"
                         + (f" x --tensor-parallel-size {tensor_parallel_size}" if tensor_parallel_size > 1 else "")
                         + f": {e}") from None


def replica_bind(plan: cpu.ThreadPlan, replica: int, tensor_parallel_size: int = 1) -> tuple[str, list[int] | None]:
    """(LITE_LLM_CPU_OMP_THREADS_BIND of replica `replica`'s process, its CPU affinity or None):
    its ranks' CPU lists, '|'-separated for its own tensor-parallel plan."""
    ranks = plan.ranks[replica * tensor_parallel_size:(replica + 1) * tensor_parallel_size]
    if plan.mode == "nobind":
        return "nobind", None
    return ("|".join(cpu.format_cpulist(r.cpus) for r in ranks),
            sorted({c for r in ranks for c in (*r.cpus, *r.reserved)}))


def _deal(cpus: tuple[int, ...], n: int) -> list[list[int]]:
    size = max(1, len(cpus) // n)
    return [list(cpus[i * size:(i + 1) * size]) or list(cpus[-1:]) for i in range(n)]


# ---- the replica process -----------------------------------------------------------------------

def _slim(stats: EngineStats) -> EngineStats:
    return replace(stats, recent_steps=stats.recent_steps[-STATS_RECENT_STEPS:])


_ERRORS = {"invalid": ValueError, "shutdown": EngineShutdownError, "dead": EngineDeadError}


def _error_wire(e: BaseException) -> tuple[str, str]:
    """A request's failure as (kind, message): any exception pickles this way, causes included."""
    kind = "invalid" if isinstance(e, ValueError) else "shutdown" if isinstance(e, EngineShutdownError) else "dead"
    cause = e.__cause__
    return kind, str(e) + (f": {type(cause).__name__}: {cause}" if cause is not None else "")


def replica_process_setup(index: int, environ: dict[str, str], affinity: list[int] | None, log_level: int,
                          replies: Any) -> Callable[[tuple], None]:
    """The start of a replica process: the front end's
    environment, SIGINT left to the front end, log lines tagged with the replica, its CPUs.
    Returns a sender of messages on `replies` that threads may share."""
    os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # the front end decides when replicas stop
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s replica {index} %(name)s: %(message)s")
    if affinity:
        os.sched_setaffinity(0, affinity)
    lock = threading.Lock()

    def send(msg: tuple) -> None:
        with lock:
            replies.send(msg)
    return send


def wait_ready(replicas: list) -> None:
    """Each replica's ("ready", info) into its .info; a RuntimeError naming the replica that
    exited or failed while starting."""
    for rep in replicas:
        try:
            msg = rep.replies.recv()
        except (EOFError, OSError):
            raise RuntimeError(f"data-parallel {rep.describe()} exited while starting "
                               f"(code {rep.process.exitcode}); see its log above") from None
        if msg[0] != "ready":
            raise RuntimeError(f"data-parallel {rep.describe()} failed to start: {msg[1]}")
        rep.info = msg[1]


def build_or_report(send: Callable[[tuple], None], build: Callable[[], Any]):
    """In a replica process: build() (assemble.build_engine of the replica's EngineArgs here,
    generating or pooling), or None once ("failed", why) is sent."""
    try:
        return build()
    except BaseException as e:  # noqa: BLE001 - the front end reports it
        send(("failed", f"{type(e).__name__}: {e}"))
        return None


def replies(conn) -> Iterator[tuple]:
    """The messages a replica sends on its pipe, until it closes (the reader threads' loop)."""
    while True:
        try:
            yield conn.recv()
        except (EOFError, OSError):
            return


def spawn_replicas(main: Callable, name: str, binds: list[tuple[str, list[int] | None]], model: str | None,
                   kwargs: Any, make_replica: Callable, dtype: str = "auto",
                   max_model_len: int | None = None) -> tuple[list, Any]:
    """Start a spawned process per (bind spec, affinity) of binds, running main(index, environ,
    affinity, log level, model, kwargs, requests pipe, replies pipe) (kwargs: what the replica
    builds its engine from; dtype and max_model_len: the model's, as the front end reads its
    config and tokenizer); make_replica(index, bind,
    affinity, process, requests writer, replies reader) is the front end's handle on each (generation
    replicas, generating or pooling). Then the model's config and tokenizer are read
    here (weights stay mapped) and every replica's ready message awaited; if one fails, all stop
    and the error is raised. Returns (replicas, the loaded model without weights)."""
    ctx = multiprocessing.get_context("spawn")     # a fresh interpreter: no OpenMP pool, no locks held
    replicas = []
    for i, (bind, affinity) in enumerate(binds):
        req_read, req_write = ctx.Pipe(duplex=False)
        rep_read, rep_write = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=main, name=f"{name}-{i}", daemon=True,
                           args=(i, {"LITE_LLM_CPU_OMP_THREADS_BIND": bind}, affinity,
                                 logging.getLogger().getEffectiveLevel(), model, kwargs, req_read, rep_write))
        proc.start()
        req_read.close()
        rep_write.close()
        replicas.append(make_replica(i, bind, affinity, proc, req_write, rep_read))
    try:
        # config and tokenizer only: weights stay mapped
        loaded = load_model(model, dtype=dtype, max_model_len=max_model_len, progress=False)
        loaded.release()
        wait_ready(replicas)
    except BaseException:
        for rep in replicas:
            if rep.process.is_alive():
                rep.process.terminate()
            rep.process.join(5.0)
        raise
    return replicas, loaded


def _replica_main(index: int, environ: dict[str, str], affinity: list[int] | None, log_level: int,
                  model: str | None, args: EngineArgs, requests: Any, replies: Any) -> None:
    """One replica: an AsyncEngine fed from the `requests` pipe, its deltas batched onto `replies`."""
    send = replica_process_setup(index, environ, affinity, log_level, replies)
    built = build_or_report(send, lambda: build_engine(args))
    if built is None:
        return
    engine, info = built.engine, built.info
    config = engine.engine.config
    keep = ("model_path", "model_name", "max_model_len", "dtype", "architecture", "kernel_variant",
            "num_threads", "thread_plan", "kv_cache_tokens", "kv_cache_blocks", "kv_cache_bytes",
            "kv_cache_dtype", "max_concurrency", "generation_config", "vocab_size", "weight_bytes",
            "bytes_per_token", "num_layers", "startup_seconds", "tensor_parallel_size", "mmproj", "runner",
            "hidden_size", "num_labels")
    info = info.as_dict()
    send(("ready", {**{k: info[k] for k in keep if k in info}, "pid": os.getpid(),
                    "block_size": config.block_size, "max_num_seqs": config.max_num_seqs,
                    "max_num_batched_tokens": config.max_num_batched_tokens,
                    "eos_token_ids": tuple(config.eos_token_ids), "pooling": built.pooling}))

    outbox: deque = deque()
    wake = threading.Condition()
    closing = threading.Event()

    def sink_for(rid: str):
        def sink(item: Any) -> None:        # on the engine thread: never blocks
            with wake:
                outbox.append((rid, item))
                wake.notify()
        return sink

    def sender() -> None:
        """One message per batch of deltas (an engine step's, usually), prompt left out."""
        while True:
            with wake:
                while not outbox and not closing.is_set():
                    wake.wait()
                items = list(outbox)
                outbox.clear()
            if not items and closing.is_set():
                return
            batch = [(rid, _error_wire(item)) if isinstance(item, BaseException) else
                     (rid, ("pooled", item.outputs.data)) if isinstance(item, PoolingRequestOutput) else
                     (rid, (item.outputs, item.finished, item.metrics, item.num_cached_tokens,
                            item.prompt_logprobs)) for rid, item in items]
            try:
                send(("out", batch))
            except OSError:
                return

    out_thread = threading.Thread(target=sender, name="lite-llm-replica-out", daemon=True)
    out_thread.start()
    grace = 0.0
    failed = False
    try:
        while True:
            try:
                msg = requests.recv()
            except (EOFError, OSError):         # the front end is gone: stop at once
                break
            kind = msg[0]
            if kind in ("add", "adds"):
                with engine.submitting():       # a batch's requests reach the engine thread together
                    for _, rid, token_ids, params, prompt, priority, mm, owner in \
                            ([msg] if kind == "add" else msg[1]):
                        try:
                            engine.add_request(rid, token_ids, params, prompt, priority=priority, sink=sink_for(rid),
                                               mm=mm, owner=owner)
                        except (ValueError, RuntimeError) as e:
                            sink_for(rid)(e)
                if not engine.is_alive:     # its thread failed (logged there): the front end must know
                    send(("failed", "its engine thread failed; see the replica's log"))
                    failed = True
                    break
            elif kind == "abort":
                engine.abort(msg[1])
            elif kind == "stats":
                send(("stats", msg[1], _slim(engine.stats())))
            elif kind == "shutdown":
                grace = msg[1]
                break
    finally:
        engine.shutdown(grace)                  # aborted requests' last deltas go through the sinks
        closing.set()
        with wake:
            wake.notify()
        out_thread.join()
        try:
            send(("bye",))
        except OSError:
            pass
    if failed:
        os._exit(1)          # the front end reports the exit with the reason sent above


# ---- the front end -----------------------------------------------------------------------------

class _Replica:
    def __init__(self, index: int, cpus: tuple[int, ...], process: Any, requests: Any, replies: Any):
        self.index, self.cpus, self.process = index, cpus, process
        self.requests, self.replies = requests, replies     # our ends: we send on one, read the other
        self.send_lock = threading.Lock()
        self.inflight: dict[str, tuple[RequestStream, str | None, list[int]]] = {}
        self.info: dict = {}
        self.alive = True
        self.stopping = False
        self.stats: EngineStats | None = None
        self.stats_seq = 0                  # of the latest snapshot received
        self.failure: str | None = None     # what the replica said before it exited
        self.reader: threading.Thread | None = None

    def describe(self) -> str:
        return f"replica {self.index} (pid {self.process.pid}, CPUs {cpu.format_cpulist(self.cpus) or 'any'})"

    def send(self, msg: tuple) -> None:
        with self.send_lock:
            self.requests.send(msg)


class DataParallelEngine:
    """AsyncEngine's interface over N replica processes (module docstring)."""

    def __init__(self, replicas: list[_Replica], tokenizer: Any, *, max_model_len: int,
                 max_num_seqs: int, block_size: int, vocab_size: int, eos_token_ids: tuple[int, ...],
                 max_queue: int | None = None, max_num_batched_tokens: int | None = None, pooling=None):
        """pooling: a pooling model's PoolingSpec (its replicas pool), None when they generate."""
        self.replicas = replicas
        self.pooling = pooling
        self.vocab_size = vocab_size
        self.max_model_len, self.max_num_seqs, self.max_queue = max_model_len, max_num_seqs, max_queue
        self.max_num_batched_tokens = max_num_batched_tokens
        self.router = PrefixRouter(len(replicas), block_size)
        self.grammars = Grammars(tokenizer, vocab_size, eos_token_ids)    # 400s before routing
        self._lock = threading.Condition()
        self._owner: dict[str, _Replica] = {}
        self._accepting = True
        self._batch = threading.local()     # submitting(): the adds a thread holds back
        self.failure: str | None = None     # why the engine stopped serving, when a replica died
        for rep in replicas:
            rep.reader = threading.Thread(target=self._read, args=(rep,), name=f"lite-llm-dp-{rep.index}",
                                          daemon=True)
            rep.reader.start()

    # ---- AsyncEngine's interface ----------------------------------------------------------

    def validate_request(self, prompt_token_ids: list[int], sampling_params: SamplingParams, mm=None) -> None:
        """The engine's own checks (LLMEngine.validate_request), before a replica is chosen."""
        if isinstance(sampling_params, PoolingParams) or self.pooling is not None:
            check_kind(sampling_params, self.pooling is not None)
            check_pooling_request(prompt_token_ids, sampling_params, self.max_model_len, self.vocab_size)
            return
        check_request(prompt_token_ids, sampling_params, self.max_model_len, self.max_num_seqs, self.grammars)
        if mm is not None and self.max_num_batched_tokens:
            check_images_fit(mm, self.max_num_batched_tokens)

    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                    prompt: str | None = None, *, priority: int = 0,
                    timeout: float | None = None, mm=None, owner: str | None = None) -> RequestStream:
        """mm: the prompt's images (multimodal.MMPrompt), preprocessed here and sent whole to the
        chosen replica, which encodes them (its encoder cache and prefix cache key on their hashes).
        owner: whom the replica's scheduler shares slots between (LLMEngine.add_request)."""
        self.validate_request(prompt_token_ids, sampling_params, mm)
        token_ids = list(prompt_token_ids)
        # a pooling model's replicas keep no prefix cache: load alone decides
        hashes = self.router.block_hashes(token_ids, mm) if self.pooling is None else []
        with self._lock:
            if self.failure is not None:
                raise EngineDeadError(self.failure)
            if not self._accepting:
                raise EngineShutdownError("the engine is not accepting requests")
            if request_id in self._owner:
                raise ValueError(f"request id {request_id!r} is already in use")
            loads = [len(r.inflight) if r.alive else None for r in self.replicas]
            if self.max_queue is not None:
                waiting = sum(max(0, n - self.max_num_seqs) for n in loads if n is not None)
                if waiting >= self.max_queue:
                    raise QueueFullError(f"more than {self.max_queue} requests are waiting")
            rep = self.replicas[self.router.choose(hashes, loads)]
            self.router.record(hashes, rep.index)
            stream = RequestStream(request_id, self, timeout)
            rep.inflight[request_id] = (stream, prompt, token_ids)
            self._owner[request_id] = rep
        msg = ("add", request_id, token_ids, sampling_params, prompt, priority, mm, owner)
        batch = getattr(self._batch, "adds", None)
        if batch is not None:                   # inside submitting(): sent when it ends
            batch.append((rep, msg))
            return stream
        try:
            rep.send(msg)
        except (OSError, ValueError) as e:      # its pipe is closed: the reader reports the death
            self._finish(rep, request_id)
            raise EngineDeadError(f"{rep.describe()} is not running") from e
        return stream

    @contextmanager
    def submitting(self):
        """As AsyncEngine.submitting: the requests this thread adds inside the block go to their
        replicas when it ends, one message per replica, which adds them to its engine together."""
        if getattr(self._batch, "adds", None) is not None:      # nested: the outer block sends
            yield
            return
        self._batch.adds = []
        try:
            yield
        finally:
            adds, self._batch.adds = self._batch.adds, None
            for rep in {id(r): r for r, _ in adds}.values():
                msgs = [m for r, m in adds if r is rep]
                try:
                    rep.send(("adds", msgs))
                except (OSError, ValueError):   # its pipe is closed: these requests fail now
                    for m in msgs:
                        with self._lock:
                            entry = rep.inflight.get(m[1])
                        self._finish(rep, m[1])
                        if entry is not None:
                            entry[0].put(EngineDeadError(f"{rep.describe()} is not running"))

    def abort(self, request_id: str) -> None:
        with self._lock:
            rep = self._owner.get(request_id)
        if rep is not None and rep.alive:
            try:
                rep.send(("abort", request_id))
            except (OSError, ValueError):
                pass

    def stats(self) -> EngineStats:
        return merge_stats([s for s in self.replica_stats() if s is not None])

    def replica_stats(self, timeout: float = STATS_TIMEOUT) -> list[EngineStats | None]:
        """A fresh snapshot of each live replica (None for a dead one); a replica too busy to
        answer within timeout gives its previous one."""
        asked = {}
        for rep in self.replicas:
            if rep.alive:
                seq = rep.stats_seq + 1
                try:
                    rep.send(("stats", seq))
                    asked[rep.index] = seq
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + timeout
        with self._lock:
            while any(self.replicas[i].alive and self.replicas[i].stats_seq < seq for i, seq in asked.items()):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            return [r.stats if r.alive else None for r in self.replicas]

    @property
    def is_alive(self) -> bool:
        return self.failure is None and all(r.alive for r in self.replicas)

    def shutdown(self, grace_seconds: float = 0.0) -> None:
        """Stop accepting; each replica finishes its requests within the grace, aborts the rest
        (their streams end with "abort"), and exits."""
        with self._lock:
            self._accepting = False
        for rep in self.replicas:
            rep.stopping = True
            if rep.alive:
                try:
                    rep.send(("shutdown", grace_seconds))
                except (OSError, ValueError):
                    pass
        for rep in self.replicas:
            if rep.reader is not None:
                rep.reader.join(grace_seconds + 30.0)
            rep.process.join(10.0)
            if rep.process.is_alive():
                log.warning("%s did not stop: terminating it", rep.describe())
                rep.process.terminate()
                rep.process.join(5.0)

    # ---- the reader thread of each replica ------------------------------------------------

    def _read(self, rep: _Replica) -> None:
        for msg in replies(rep.replies):
            kind = msg[0]
            if kind == "out":
                for rid, item in msg[1]:
                    self._deliver(rep, rid, item)
            elif kind == "stats":
                with self._lock:
                    rep.stats, rep.stats_seq = msg[2], max(rep.stats_seq, msg[1])
                    self._lock.notify_all()
            elif kind == "failed":
                rep.failure = msg[1]
            elif kind == "bye":
                break
        self._lost(rep)

    def _deliver(self, rep: _Replica, rid: str, item: Any) -> None:
        with self._lock:
            entry = rep.inflight.get(rid)
        if entry is None:
            return
        stream, prompt, token_ids = entry
        if item[0] == "pooled":                 # a pooling request's row
            stream.put(PoolingRequestOutput(rid, token_ids, PoolingOutput(item[1])))
            self._finish(rep, rid)
            return
        if len(item) == 2:                      # (kind, message): the request failed there
            stream.put(_ERRORS[item[0]](item[1]))
            self._finish(rep, rid)
            return
        outputs, finished, metrics, num_cached, prompt_logprobs = item
        stream.put(RequestOutput(rid, prompt, token_ids, outputs, finished=finished, metrics=metrics,
                                  num_cached_tokens=num_cached, prompt_logprobs=prompt_logprobs))
        if finished:
            self._finish(rep, rid)

    def _finish(self, rep: _Replica, rid: str) -> None:
        with self._lock:
            rep.inflight.pop(rid, None)
            if self._owner.get(rid) is rep:
                del self._owner[rid]

    def _lost(self, rep: _Replica) -> None:
        """The replica's pipe closed: a requested stop, or a death every open request hears of."""
        rep.process.join(5.0)
        code = rep.process.exitcode
        with self._lock:
            rep.alive = False
            self.router.forget(rep.index)
            orphans = list(rep.inflight.items())
            rep.inflight.clear()
            for rid, _ in orphans:
                self._owner.pop(rid, None)
            if not rep.stopping:
                if code is None:
                    how = "closed its pipe"
                elif code < 0:
                    how = f"was killed by signal {-code} ({signal.Signals(-code).name})"
                else:
                    how = f"exited with code {code}"
                if rep.failure:
                    how += f" ({rep.failure})"
                self.failure = self.failure or (f"data-parallel {rep.describe()} {how}; the server "
                                                f"stops accepting requests")
                log.error("%s", self.failure)
            self._lock.notify_all()
        reason = self.failure or f"{rep.describe()} stopped"
        for _, (stream, _, _) in orphans:
            stream.put(EngineDeadError(reason))


# ---- building it -------------------------------------------------------------------------------

def build_data_parallel_engine(args: EngineArgs, data_parallel_size: int) -> tuple[DataParallelEngine, Any, dict]:
    """Start data_parallel_size replica processes (each an engine of args, on its share of the
    thread plan) and the front end over them: (engine, tokenizer, info) like
    assemble.build_async_engine. args.max_queue bounds the front end's queue."""
    if data_parallel_size < 1:
        raise ValueError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
    tp_size = args.tensor_parallel_size
    plan = replica_plans(data_parallel_size, tensor_parallel_size=tp_size)
    for line in plan.describe():
        log.info("data parallel %s", line if tp_size > 1 else line.replace("rank ", "replica ", 1))
    for note in plan.notes:
        log.info("note: %s", note)

    def make_replica(i: int, bind: str, affinity, proc, req_write, rep_read) -> _Replica:
        cpus = () if affinity is None else tuple(c for r in plan.ranks[i * tp_size:(i + 1) * tp_size] for c in r.cpus)
        log.info("data parallel replica %d: pid %d, CPUs %s", i, proc.pid, bind if affinity else "not bound")
        return _Replica(i, cpus, proc, req_write, rep_read)

    binds = [replica_bind(plan, i, tp_size) for i in range(data_parallel_size)]
    replica_args = replace(args.as_replica(), max_queue=None)     # the queue is the front end's
    replicas, loaded = spawn_replicas(_replica_main, "lite-llm-replica", binds, args.model, replica_args,
                                      make_replica, dtype=args.dtype, max_model_len=args.max_model_len)
    first = replicas[0].info
    engine = DataParallelEngine(replicas, loaded.tokenizer, max_model_len=first["max_model_len"],
                                max_num_seqs=first["max_num_seqs"], block_size=first["block_size"],
                                vocab_size=first["vocab_size"], eos_token_ids=first["eos_token_ids"],
                                max_queue=args.max_queue if args.runner != "pooling" else None,
                                max_num_batched_tokens=first.get("max_num_batched_tokens"), pooling=first.get("pooling"))
    if engine.pooling is not None:
        first = {**{k: v for k, v in first.items() if k != "pooling"}, "pooler": engine.pooling.pooler}
    info = {**first, "data_parallel_size": data_parallel_size,
            "num_threads": sum(r.info["num_threads"] for r in replicas),
            "kv_cache_tokens": sum(r.info["kv_cache_tokens"] for r in replicas),
            "replicas": [{"pid": r.info["pid"], "cpus": cpu.format_cpulist(r.cpus),
                          "num_threads": r.info["num_threads"]} for r in replicas],
            "generation_config": loaded.generation_config or first.get("generation_config") or {}}
    return engine, loaded.tokenizer, info
