"""What one runner step gives back (RunnerOutput), and what a steady decode batch binds of the
runner to repeat its step without the engine's Python (DecodeBinding).

    engine.step():  sched_out = scheduler.schedule()
                    out = runner.execute(sched_out[, masks])   -> RunnerOutput
                    scheduler / engine take out.sampled, out.spec_token_ids,
                    out.prompt_logprobs, out.kernel_seconds, out.bytes_read
                    (a pooling model's step: out.pooled, each request finished with it)

Every runner (the model runner, a tensor-parallel rank 0, the tests' fake runners) returns a
RunnerOutput; nothing of a step is left on the runner for the engine to look up afterwards.
The compiled decode lane (_step.DecodeLane) is the runner's plain step repeated: it takes a
DecodeBinding from ModelRunner.decode_binding() and feeds the same per-sequence work
(_step.pyx) as a RunnerOutput would.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


@dataclass(slots=True)
class PromptLogprobs:
    """Prompt logprobs of one chunk's prompt positions: prompt tokens first .. first + n - 1."""
    request: Any                 # engine.request.Request
    first: int                   # index of the first prompt token these rows predict
    logprobs: np.ndarray         # [n] float32, of each prompt token
    ranks: np.ndarray            # [n] int32, 1-based rank of each prompt token
    top_ids: np.ndarray          # [n, k] int32
    top_logprobs: np.ndarray     # [n, k] float32


@dataclass(slots=True)
class RunnerOutput:
    """One step of a runner.

    sampled is aligned with the SchedulerOutput's chunks: None where the chunk does not sample,
    a SampleResult, or (a chunk with drafts) the list of SampleResults of its accepted drafts
    and one more token."""
    sampled: list
    # drafts for the next step, by request id; None when the runner has no proposer (the engine
    # then skips its per-sequence draft bookkeeping)
    spec_token_ids: dict[str, list[int]] | None = None
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)
    kernel_seconds: float = 0.0  # forward + sampling time: the step's Python time is the rest
    bytes_read: int = 0          # weights once, plus the KV attention read (bandwidth figures)
    plain: bool = False          # a plain step (ModelRunner._execute_plain): decode_binding may repeat it
    # a pooling model's step (engine/pooling.py): aligned with the chunks, each pooling request's
    # pooled row [E] float32 (before any head or normalization); None when the step pools nothing
    pooled: list | None = None


@dataclass(slots=True, frozen=True)
class DecodeBinding:
    """A plain decode step of S sequences as bound calls on the runner's arrays, which a steady
    batch (_step.DecodeLane) repeats step after step: gather() -> gather_params() ->
    sample.check() -> forward(*forward_args) -> finish(sample.run)."""
    gather: Callable[[], int]              # the step's arrays from the rows; returns the context tokens
    gather_params: Callable[[], None] | None   # the slots' parameter rows (None: slots are 0..S-1)
    sample: Any                            # the bound sampling (_sampler.PreparedSample: check, run)
    forward: Callable[..., None]           # the kernels' forward
    forward_args: tuple                    # its arguments
    finish: Callable[[Any], float]         # sample, append to the rows; returns kernel seconds
    tokens: np.ndarray                     # [S] int32, the sampled tokens
    slots: np.ndarray                      # [S] int32, each sequence's batch slot
    bytes_per_token: int                   # weight bytes a decoded token streams
    kv_bytes_per_token: int                # KV bytes of one context token (all layers, K and V)
    append_blocks: Callable[[int, list[int]], None]   # a sequence's new KV blocks into its slot's table
