"""The engine a Whisper model is served by: one worker thread owns the model (its encoder cache
and decoder slots); requests come in through a bounded queue, and up to max_num_seqs of them are
decoded together: each worker turn runs ONE decoder step for the current window of every active
request (a prompt prefill or one token each; greedy, sampled and beam-search windows alike), so a
30-minute file and a 5-second clip submitted after it both progress, each token for all of them at
the cost of about one. A request whose window ends has its next window's encoder pass run in
slices between the steps of the others (a new request's first window too), then rejoins the step.

    TranscriptionEngine(model: WhisperModel, name, max_num_seqs)
      .start() / .shutdown()
      .submit(samples, options) -> Job        QueueFullError beyond max_queue waiting + active
      Job.events()                            ("window", Transcription so far) ..., then ("done", it);
                                              or ("error", exception)
      Job.cancel()                            the client left: the worker drops it at its next turn

A request's decoding is WhisperModel.transcription_steps, a program that yields a Step (its states
and new tokens) whenever it needs the decoder; the worker concatenates the Steps of all active
requests into one WhisperDecoder.step and sends each its rows of the logits. Rows of a batched
step equal those of a step alone (the kernels' results do not depend on the other rows), so a
request's tokens do not depend on what it was batched with. The rest of a window's compute (its
features, its encoder pass, its cross-attention K/V) the program yields as Work in slices of
about one encoder layer each; a turn runs the decoder step, then ONE slice (of the request whose
last slice is oldest), so the others' tokens keep coming while a window is encoded: each waits
at most a slice beyond its step. A slice's result is what running the whole at once gives (the
encoder's slices are one pass's bits), so slicing changes no request's tokens either.

On a server of several models the worker's turns (its decoder step and its slice) take the
server's step lock (server/models.py FairLock, set as `step_lock`) as the other engines' steps
do: a chat model and a Whisper model behind one server take turns on all the cores, a turn each,
so a transcription and a chat request both progress.  plan_memory is what the pool plans a
Whisper model's load with.
"""
from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
import time
from collections import deque
from contextlib import nullcontext
from typing import ContextManager

import numpy as np

from lite_llm.engine.memory import MemoryPlan
from lite_llm.multimodal.audio import SAMPLE_RATE
from lite_llm.multimodal.transcribe import Step, TranscribeOptions, WhisperModel, Work

log = logging.getLogger("lite_llm.transcription")


DEFAULT_MAX_NUM_SEQS = 8   # requests a served Whisper model decodes together without --max-num-seqs


def decoder_sequences(max_num_seqs: int) -> int:
    """Self-attention slots of a served Whisper decoder for max_num_seqs requests at once: room for
    beams (a beam search holds 2 x its beams while their caches are reordered), at least 12."""
    return max(12, 2 * max_num_seqs)


class QueueFullError(RuntimeError):
    """More transcriptions than the engine holds (waiting and running)."""


class Job:
    def __init__(self, samples: np.ndarray, options: TranscribeOptions):
        self.samples, self.options = samples, options
        self.queue: queue.Queue = queue.Queue()
        self.cancelled = False
        self.submitted = time.monotonic()
        self.program = None             # its WhisperModel.transcription_steps, once active
        self.step: Step | None = None   # the Step it waits on
        self.work: Work | None = None   # ... or the slice of work (features, encoder, cross K/V)
        self.served = -1                # the engine's slice count when its last slice ran (turns)
        self.reply = None               # what its program is sent next (its rows of a step's logits)
        self.last = None                # the Transcription of its last window

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
    """See the module's docstring. max_num_seqs: requests decoded together (each holds decoder
    slots while it is active; at most the decoder's max_requests); max_queue: requests waiting
    beyond them."""

    def __init__(self, model: WhisperModel, name: str = "whisper", max_num_seqs: int | None = None,
                 max_queue: int = 16):
        self.model, self.name = model, name
        self.tokenizer = model.tokenizer
        dec = model.decoder
        self.max_num_seqs = min(max_num_seqs or dec.max_requests, dec.max_requests)
        self.max_queue = max_queue
        self._waiting: deque[Job] = deque()
        self._lock = threading.Condition()
        self._stopping = False
        self.failure: str | None = None
        self.num_requests = 0
        self.num_windows = 0
        self.num_steps = 0          # decoder steps run
        self.num_step_seqs = 0      # sequences in them (num_step_seqs / num_steps: the mean batch)
        self.num_encoder_slices = 0     # slices of Work run between them (features, encoder layers, cross K/V)
        self.audio_seconds = 0.0
        self.thread = threading.Thread(target=self._loop, name="lite_llm-transcription", daemon=True)
        self._active = 0
        self.step_lock: ContextManager = nullcontext()    # held for each turn's compute (several models)

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
            if len(self._waiting) + self._active >= self.max_queue + self.max_num_seqs:
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

    def _sequences(self, job: Job) -> int:
        """Decoder self-attention slots a request holds at most: 2 x its beams while their caches
        are reordered (decode_beams forks before it releases), else 1."""
        return 2 * job.options.beam_size if job.options.beam_size else 1

    def _admit(self, active: list[Job]) -> None:
        """Waiting requests join in order while their slots fit beside the active ones' (the first
        always does: one alone larger than the decoder fails with its own error)."""
        held = sum(self._sequences(j) for j in active)
        while self._waiting and len(active) < self.max_num_seqs:
            need = self._sequences(self._waiting[0])
            if active and held + need > self.model.decoder.max_sequences:
                break
            job = self._waiting.popleft()
            job.program = self.model.transcription_steps(job.samples, job.options)
            active.append(job)
            held += need

    def _finish(self, job: Job, kind: str, value) -> None:
        job.program.close()             # releases its decoder states (the programs' finally)
        job.queue.put((kind, value))
        if kind == "done":
            self.audio_seconds += job.samples.shape[0] / SAMPLE_RATE

    def _advance(self, job: Job) -> bool:
        """Runs job's program up to its next Step or Work (posting each window on the way); False
        when it has ended (done or failed)."""
        try:
            item = job.program.send(job.reply)
            while not isinstance(item, (Step, Work)):
                self.num_windows += 1
                job.last = item
                job.queue.put(("window", item))
                item = job.program.send(None)
        except StopIteration:
            self._finish(job, "done", job.last)
            return False
        except Exception as e:          # a request's own failure (TranscriptionError, ...)
            if not isinstance(e, ValueError):
                log.exception("transcription failed")
            self._finish(job, "error", e)
            return False
        job.reply = None
        if isinstance(item, Work):
            job.work = item
        else:
            job.step = item
        return True

    def _slice(self, waiting: list[Job]) -> Job | None:
        """ONE slice of Work: of the waiting job served longest ago (round robin); the job if its
        Work failed (it has its error)."""
        job = min(waiting, key=lambda j: j.served)
        work, job.work = job.work, None
        try:
            job.reply = work.run()
        except Exception as e:          # a request's own failure
            if not isinstance(e, ValueError):
                log.exception("a transcription's %s work failed", work.kind)
            self._finish(job, "error", e)
            return job
        finally:
            self.num_encoder_slices += 1
            job.served = self.num_encoder_slices
        return None

    def _step(self, batch: list[Job]) -> None:
        """ONE decoder step over the Steps of every job in batch; each job's rows become its reply."""
        states = [st for j in batch for st in j.step.states]
        tokens = [t for j in batch for t in j.step.tokens]
        try:
            logits = self.model.decoder.step(states, tokens)
        except Exception as e:          # a bad Step fails the requests in it, not the worker
            log.exception("a decoder step failed")
            for j in batch:
                self._finish(j, "error", e)
            raise _StepFailed() from e
        self.num_steps += 1
        self.num_step_seqs += len(states)
        row = 0
        for j in batch:
            n = len(j.step.states)
            j.reply, j.step = logits[row:row + n], None
            row += n

    def _loop(self) -> None:
        active: list[Job] = []
        try:
            while True:
                with self._lock:
                    while not self._stopping and not self._waiting and not active:
                        self._lock.wait()
                    if self._stopping:
                        break
                    self._admit(active)
                    self._active = len(active)
                for job in list(active):
                    if job.cancelled:
                        active.remove(job)
                        self._finish(job, "error", RuntimeError("the transcription was cancelled"))
                    elif job.step is None and job.work is None and not self._advance(job):
                        active.remove(job)
                # the decoder step of every job that has one, then one slice of the others' work:
                # a window's encoder pass never holds the other requests' tokens for more than a slice
                if not active:          # each active job now waits on a Step or on Work
                    continue
                with self.step_lock:        # the cores, in turn with the server's other engines
                    stepping = [j for j in active if j.step is not None]
                    if stepping:
                        try:
                            self._step(stepping)
                        except _StepFailed:
                            active = [j for j in active if j.step is None]
                    waiting = [j for j in active if j.work is not None]
                    if waiting:
                        failed = self._slice(waiting)
                        if failed is not None:
                            active.remove(failed)
        except BaseException as e:      # the worker itself: every request gets an error
            self.failure = f"{type(e).__name__}: {e}"
            log.exception("the transcription worker stopped")
        finally:
            with self._lock:
                rest = list(self._waiting)
                self._waiting.clear()
            for job in active:
                job.program.close()
                rest.append(job)
            for job in rest:
                job.queue.put(("error", RuntimeError("the transcription engine stopped")))


def plan_memory(path: str, *, dtype: str = "auto", quantization: str | None = None,
                max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> MemoryPlan:
    """What serving the Whisper model at path takes, as a server of several models plans a load
    (engine/memory.py plan_memory for the others): its weights (the files' bytes; a checkpoint
    quantized at load to q8_0 / q4_0, about a quarter / an eighth of its float32 bytes), the
    decoder's K/V blocks as WhisperDecoder allocates them (self-attention for max(12, 2 x
    max_num_seqs) sequences, beams among them, cross-attention for max_num_seqs requests, as
    start_transcription_engine sizes them) and one window's encoder activations and a step's
    logits, in float32."""
    from lite_llm._kernels.kv_layout import KV_NUMPY, kv_cache_shapes
    from lite_llm.multimodal.whisper_decoder import BLOCK, WhisperDecoderConfig
    from lite_llm.multimodal.whisper_ggml import GGMLWhisperFile
    if os.path.isfile(path):        # a whisper.cpp file: its stored blocks; int8 K/V when quantized
        f = GGMLWhisperFile(path)
        dcfg, weights, mels = f.decoder_config(), f.size, f.encoder_config().num_mel_bins
        kv_dtype = "float32" if f.ftype in ("F32", "F16") else "int8"
    else:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
            raw = json.load(fh)
        dcfg, mels = WhisperDecoderConfig.from_hf(raw), int(raw.get("num_mel_bins", 80))
        weights = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
                      if n.endswith((".safetensors", ".bin")))
        if quantization:
            weights //= 4 if quantization == "q8_0" else 8
        elif dtype == "bfloat16":
            weights //= 2
        kv_dtype = "int8" if quantization else "bfloat16" if dtype == "bfloat16" else "float32"
    H, D, C, L = dcfg.num_heads, dcfg.head_dim, dcfg.hidden_size, dcfg.num_layers
    sequences = decoder_sequences(max_num_seqs)
    kv = 0
    for nb in (sequences * -(-dcfg.max_target_positions // BLOCK), max_num_seqs * -(-dcfg.max_source_positions // BLOCK)):
        ks, vs = kv_cache_shapes(nb, H, BLOCK, D, kv_dtype)
        kv += L * (math.prod(ks) + math.prod(vs)) * np.dtype(KV_NUMPY[kv_dtype]).itemsize
    frames = 2 * dcfg.max_source_positions
    activations = 4 * (mels * frames + dcfg.max_source_positions * (6 * C + dcfg.intermediate_size)
                       + sequences * dcfg.vocab_size)
    return MemoryPlan(weights, kv, activations, f"decoder K/V ({kv_dtype}) for {sequences} sequences and "
                                                f"{max_num_seqs} requests")


class _StepFailed(Exception):
    """A decoder step raised: its requests have their error."""
