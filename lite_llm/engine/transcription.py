"""The engine a Whisper model is served by: one worker thread owns the model (its encoder cache
and decoder slots); requests come in through a bounded queue and are advanced window by window
in turn, so a 30-minute file and a 5-second clip submitted after it both progress (neither waits
for the other to finish).

    TranscriptionEngine(model: WhisperModel, name)
      .start() / .shutdown()
      .submit(samples, options) -> Job        QueueFullError beyond max_queue waiting + active
      Job.events()                            ("window", Transcription so far) ..., then ("done", it);
                                              or ("error", exception)
      Job.cancel()                            the client left: the worker drops it at its next turn

The worker's unit of work is one window of one request (encoder pass, decoding with the fallback);
within a window the decoder steps one request. Batching the windows of several requests into one
decoder step (the engine's scheduler, paged self-attention KV and cross-attention blocks) is the
next step: WhisperDecoder.step already takes several requests' states.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import numpy as np

from lite_llm.multimodal.audio import SAMPLE_RATE
from lite_llm.multimodal.transcribe import TranscribeOptions, WhisperModel

log = logging.getLogger("lite_llm.transcription")


class QueueFullError(RuntimeError):
    """More transcriptions than the engine holds (waiting and running)."""


class Job:
    def __init__(self, samples: np.ndarray, options: TranscribeOptions):
        self.samples, self.options = samples, options
        self.queue: queue.Queue = queue.Queue()
        self.cancelled = False
        self.submitted = time.monotonic()

    def cancel(self) -> None:
        self.cancelled = True

    def events(self, timeout: float | None = None):
        """("window", Transcription) per window decoded, then ("done", Transcription) or ("error", e)."""
        while True:
            kind, value = self.queue.get(timeout=timeout)
            yield kind, value
            if kind in ("done", "error"):
                return

    def result(self, timeout: float | None = None):
        for kind, value in self.events(timeout):
            if kind == "error":
                raise value
            if kind == "done":
                return value


class TranscriptionEngine:
    """See the module's docstring. max_active: requests advanced in turn (each holds a decoder
    slot while a window decodes); max_queue: requests waiting beyond them."""

    def __init__(self, model: WhisperModel, name: str = "whisper", max_active: int = 4, max_queue: int = 16):
        self.model, self.name = model, name
        self.tokenizer = model.tokenizer
        self.max_active, self.max_queue = max_active, max_queue
        self._waiting: deque[Job] = deque()
        self._lock = threading.Condition()
        self._stopping = False
        self.failure: str | None = None
        self.num_requests = 0
        self.num_windows = 0
        self.audio_seconds = 0.0
        self.thread = threading.Thread(target=self._loop, name="lite_llm-transcription", daemon=True)
        self._active = 0

    def start(self) -> None:
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread.is_alive() and self.failure is None

    def stats(self):
        return None         # the generation engine's EngineStats do not apply

    def submit(self, samples: np.ndarray, options: TranscribeOptions) -> Job:
        job = Job(samples, options)
        with self._lock:
            if self._stopping:
                raise RuntimeError("the transcription engine is shutting down")
            if len(self._waiting) + self._active >= self.max_queue + self.max_active:
                raise QueueFullError()
            self._waiting.append(job)
            self.num_requests += 1
            self._lock.notify()
        return job

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _loop(self) -> None:
        active: deque[tuple[Job, object]] = deque()
        try:
            while True:
                with self._lock:
                    while not self._stopping and not self._waiting and not active:
                        self._lock.wait()
                    if self._stopping:
                        break
                    while self._waiting and len(active) < self.max_active:
                        job = self._waiting.popleft()
                        active.append((job, self.model.transcribe_iter(job.samples, job.options)))
                    self._active = len(active)
                job, it = active.popleft()           # round robin: one window of the oldest turn
                if job.cancelled:
                    it.close()
                    job.queue.put(("error", RuntimeError("the transcription was cancelled")))
                    continue
                try:
                    result = next(it)
                except StopIteration:
                    job.queue.put(("done", getattr(job, "last", None)))
                    self.audio_seconds += job.samples.shape[0] / SAMPLE_RATE
                    continue
                except Exception as e:          # a request's own failure (TranscriptionError, ...)
                    if not isinstance(e, ValueError):
                        log.exception("transcription failed")
                    job.queue.put(("error", e))
                    continue
                self.num_windows += 1
                job.last = result
                job.queue.put(("window", result))
                active.append((job, it))
        except BaseException as e:      # the worker itself: every request gets an error
            self.failure = f"{type(e).__name__}: {e}"
            log.exception("the transcription worker stopped")
        finally:
            with self._lock:
                rest = list(self._waiting)
                self._waiting.clear()
            for job, it in list(active):
                rest.append(job)
            for job in rest:
                job.queue.put(("error", RuntimeError("the transcription engine stopped")))
