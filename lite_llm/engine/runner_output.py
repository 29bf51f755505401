"""What one runner step gives back (RunnerOutput).

    engine.step():  sched_out = scheduler.schedule()
                    out = runner.execute(sched_out[, masks])   -> RunnerOutput
                    scheduler / engine take out.sampled, out.spec_token_ids,
                    out.prompt_logprobs, out.kernel_seconds, out.bytes_read
                    (a pooling model's step: out.pooled, each request finished with it)

Every runner (the model runner, a tensor-parallel rank 0, the tests' fake runners) returns a
RunnerOutput; nothing of a step is left on the runner for the engine to look up afterwards.
How a runner gets there is its own affair: the model runner's plain step reuses its bound
sampling from the previous step while the batch stays the same (ModelRunner._execute_plain).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

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


class RunnerOutput(NamedTuple):
    """One step of a runner (a NamedTuple: built every step, in compiled code too, and nothing
    changes it once built).

    sampled is aligned with the SchedulerOutput's chunks: None where the chunk does not sample,
    a SampleResult, or (a chunk with drafts) the list of SampleResults of its accepted drafts
    and one more token."""
    sampled: list
    # drafts for the next step, by request id; None when the runner has no proposer (the engine
    # then skips its per-sequence draft bookkeeping)
    spec_token_ids: dict[str, list[int]] | None = None
    prompt_logprobs: list[PromptLogprobs] | tuple = ()
    kernel_seconds: float = 0.0  # forward + sampling time: the step's Python time is the rest
    bytes_read: int = 0          # weights once, plus the KV attention read (bandwidth figures)
    # a pooling model's step (engine/pooling.py): aligned with the chunks, each pooling request's
    # pooled row [E] float32 (before any head or normalization); None when the step pools nothing
    pooled: list | None = None
