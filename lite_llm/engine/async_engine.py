"""AsyncEngine: one engine thread owns an LLMEngine; other threads talk to it through queues.

HTTP threads call add_request() (returns a RequestStream of DELTA RequestOutputs), abort()
and stats(); all three are thread-safe and never touch engine state: adds and aborts go
into an inbox the engine thread drains before each step, stats are an immutable snapshot
the engine thread republishes after each step. The engine thread sleeps on a condition
when there is nothing to do. All kernel calls therefore come from this one thread, which
is what OpenMP thread binding (on_engine_thread_start) relies on.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from contextlib import AbstractContextManager as ContextManager, nullcontext
from collections.abc import Callable
from dataclasses import replace

from lite_llm.engine._step import PendingOutput
from lite_llm.engine.engine import LLMEngine
from lite_llm.engine.live import LiveMeter
from lite_llm.engine.stats import EngineStats
from lite_llm.outputs import RequestOutput
from lite_llm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """Too many requests are waiting (HTTP 429)."""


class EngineShutdownError(RuntimeError):
    """The engine is not accepting requests: not started or shutting down (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The engine thread failed; the cause is chained."""


class RequestStream:
    """DELTA RequestOutputs of one request, in order; iteration ends after the finished one.

    `for out in stream` blocks for each output (at most `timeout` seconds each, if set:
    TimeoutError). The engine's failure is raised from the iteration.
    """

    def __init__(self, request_id: str, owner: AsyncEngine, timeout: float | None = None,
                 sink: Callable[[RequestOutput | BaseException], None] | None = None):
        self.request_id = request_id
        self.timeout = timeout
        self._owner = owner
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._sink = sink
        self._done = False

    def put(self, item: RequestOutput | PendingOutput | BaseException) -> None:
        """An output (or the error that ends the stream) for its reader: the engine thread's side."""
        if self._sink is not None:      # forwarded as produced (a data-parallel replica's pipe)
            self._sink(item.materialize() if type(item) is PendingOutput else item)
        else:
            self._queue.put(item)

    def get(self, timeout: float | None = None) -> RequestOutput | None:
        """The next delta; None once the stream has ended. TimeoutError after timeout seconds."""
        if self._done:
            return None
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no output for request {self.request_id!r} within {timeout} s") from None
        if type(item) is PendingOutput:   # built here, on the reader's thread (engine.step(lazy=True))
            item = item.materialize()
        elif isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finished:
            self._done = True
        return item

    def __iter__(self) -> RequestStream:
        return self

    def __next__(self) -> RequestOutput:
        out = self.get(self.timeout)
        if out is None:
            raise StopIteration
        return out

    @property
    def finished(self) -> bool:
        """True once the final output (or an error) has been read."""
        return self._done

    def abort(self) -> None:
        self._owner.abort(self.request_id)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, *, max_queue: int | None = None,
                 on_engine_thread_start: Callable[[], None] | None = None):
        self.engine = engine
        self.max_queue = max_queue                  # waiting requests beyond this: QueueFullError
        self.on_engine_thread_start = on_engine_thread_start
        self._cond = threading.Condition()
        self._inbox: deque[tuple] = deque()         # ("add", stream, args) | ("abort", request_id)
        self._num_inbox_adds = 0
        self._active_ids: set[str] = set()          # accepted and not yet finished
        self._streams: dict[str, RequestStream] = {}   # engine thread only
        self._stats: EngineStats = engine.stats()
        self._accepting = False
        self._stopping = False
        self._deadline = 0.0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.live = LiveMeter()    # thread ids attached on the engine thread (llm.build_engine)
        # held around each step: engines of one server that share the cores take turns (server/models.py)
        self.step_lock: ContextManager = nullcontext()

    # ---- any thread -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread; returns once on_engine_thread_start has run (its error is
        raised here)."""
        if self._thread is not None:
            raise RuntimeError("AsyncEngine already started")
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,),
                                        name="lite-llm-engine", daemon=True)
        self._thread.start()
        started.wait()
        if self._error is not None:
            self._thread.join()
            raise EngineDeadError("on_engine_thread_start failed") from self._error
        with self._cond:
            self._accepting = True

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    sampling_params: SamplingParams, prompt: str | None = None, *,
                    priority: int = 0, timeout: float | None = None,
                    sink: Callable[[RequestOutput | BaseException], None] | None = None,
                    lora_request=None, mm=None, owner: str | None = None) -> RequestStream:
        """Submit a request; raises ValueError (invalid), QueueFullError, EngineShutdownError.
        sink: called on the engine thread with each delta (and a failure) instead of queueing
        them for iteration; it must not block. mm: the prompt's images (multimodal.MMPrompt).
        owner: whom slots are shared between (LLMEngine.add_request); None: this request."""
        self.engine.validate_request(prompt_token_ids, sampling_params, mm)
        params = sampling_params.clone()
        arrival = time.monotonic()
        lora = None
        if lora_request is not None:   # a LoRARequest or an adapter's name (lite_llm/lora.py)
            if self.engine.lora is None:
                raise ValueError("a LoRA adapter was asked for, but LoRA is not enabled (--enable-lora)")
            lora = self.engine.lora.acquire(lora_request)    # this reference is the inbox's
        try:
            return self._submit(request_id, prompt_token_ids, params, prompt, arrival, priority, timeout, sink, lora,
                                mm, owner)
        except BaseException:
            if lora is not None:
                self.engine.lora.release(lora[0])
            raise

    def _submit(self, request_id, prompt_token_ids, params, prompt, arrival, priority, timeout, sink, lora, mm,
                owner):
        with self._cond:
            if self._error is not None:
                raise EngineDeadError("the engine thread failed") from self._error
            if not self._accepting:
                raise EngineShutdownError("the engine is not accepting requests")
            if request_id in self._active_ids:
                raise ValueError(f"request id {request_id!r} is already in use")
            if self.max_queue is not None and \
                    self._stats.num_waiting + self._num_inbox_adds >= self.max_queue:
                raise QueueFullError(f"more than {self.max_queue} requests are waiting")
            stream = RequestStream(request_id, self, timeout, sink)
            self._active_ids.add(request_id)
            self._inbox.append(("add", stream, (request_id, list(prompt_token_ids), params,
                                               prompt, arrival, priority, lora, mm, owner)))
            self._num_inbox_adds += 1
            self._cond.notify()
        return stream

    def submitting(self) -> ContextManager:
        """Requests added inside this block reach the engine thread together (a pooling call's
        inputs: they share its next step rather than the first one running alone)."""
        return self._cond

    def abort(self, request_id: str) -> None:
        """Abort a request; its blocks are freed before the next step. Unknown ids are ignored."""
        with self._cond:
            self._inbox.append(("abort", request_id))
            self._cond.notify()

    def stats(self) -> EngineStats:
        """The snapshot published after the latest step, with the live window's rates and
        thread loads (shared by every reader within one window)."""
        st = self._stats
        return replace(st, live=self.live.sample(st.prompt_tokens_total, st.generation_tokens_total))

    @property
    def accepting(self) -> bool:
        """True from start() until shutdown() begins (then add_request raises EngineShutdownError)."""
        return self._accepting

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._error is None

    def shutdown(self, grace_seconds: float = 0.0) -> None:
        """Stop accepting, let in-flight requests finish for up to grace_seconds, abort the
        rest (their streams end with finish_reason "abort"), then stop the engine thread."""
        with self._cond:
            self._accepting = False
            if not self._stopping:
                self._stopping = True
                self._deadline = time.monotonic() + grace_seconds
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        group = getattr(self, "tp_group", None)   # tensor-parallel workers (llm.build_engine)
        if group is not None:
            group.close()

    # ---- engine thread --------------------------------------------------------------------

    def _run(self, started: threading.Event) -> None:
        try:
            if self.on_engine_thread_start is not None:
                self.on_engine_thread_start()
        except BaseException as e:  # noqa: BLE001 - reported to start()'s caller
            self._error = e
            started.set()
            return
        started.set()
        engine = self.engine
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._stopping or engine.has_unfinished_requests()):
                        self._cond.wait()
                    items = list(self._inbox)
                    self._inbox.clear()
                    stopping, deadline = self._stopping, self._deadline
                outputs = self._handle_inbox(items)
                if stopping and engine.has_unfinished_requests() and time.monotonic() >= deadline:
                    outputs += engine.abort_request(engine.unfinished_request_ids)
                if engine.has_unfinished_requests():
                    with self.step_lock:
                        outputs += engine.step(lazy=True)
                # before the outputs: a reader never sees older; fresh once idle
                self._stats = engine.stats(fresh=not engine.has_unfinished_requests())
                self._dispatch(outputs)
                if stopping and not engine.has_unfinished_requests():
                    with self._cond:
                        if not self._inbox:
                            break
        except BaseException as e:  # noqa: BLE001 - every waiting stream must hear of it
            logger.exception("engine thread failed; failing every open request")
            with self._cond:
                self._error = e
                self._accepting = False
                pending = [item[1] for item in self._inbox if item[0] == "add"]
                self._inbox.clear()
                self._active_ids.clear()
            for stream in [*self._streams.values(), *pending]:
                err = EngineDeadError("the engine thread failed")
                err.__cause__ = e
                stream.put(err)
            self._streams.clear()

    def _handle_inbox(self, items: list[tuple]) -> list[RequestOutput]:
        """Apply queued adds and aborts; returns the aborted requests' final outputs."""
        engine = self.engine
        outputs: list[RequestOutput] = []
        num_adds = 0
        for item in items:
            if item[0] == "add":
                stream, args = item[1], item[2]
                num_adds += 1
                try:
                    engine.add_request(*args)
                except ValueError as e:
                    with self._cond:
                        self._active_ids.discard(stream.request_id)
                    stream.put(e)
                    continue
                finally:    # the sequences took references of their own
                    lora = args[6]      # (request_id, ids, params, prompt, arrival, priority, lora, mm, owner)
                    if lora is not None:
                        engine.lora.release(lora[0])
                self._streams[stream.request_id] = stream
            else:
                outputs += engine.abort_request(item[1])
        if num_adds:
            # both at once under the lock: add_request's queue count must never see a
            # request twice (in the inbox and in the published waiting count)
            with self._cond:
                self._stats = engine.stats(fresh=False)
                self._num_inbox_adds -= num_adds
        return outputs

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            stream.put(out)
            if out.finished:
                del self._streams[out.request_id]
                with self._cond:
                    self._active_ids.discard(out.request_id)
