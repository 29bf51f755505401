"""Request: one sequence the engine generates, from the scheduler's point of view.

A Request holds token ids (prompt + outputs), how many of them already have KV entries
(`num_computed_tokens`), its sampling parameters and effective seed, its lifecycle status and
what it produced (logprobs, finish reason). SampleResult is what the model runner returns per
sampled sequence. Text (detokenization, stop strings) and the user-facing RequestOutput are
built by the engine, not here; a user request with n > 1 becomes n Requests.
"""
from __future__ import annotations

import enum
import time
from typing import NamedTuple

from lite_llm.outputs import Logprob, RequestMetrics
from lite_llm.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"                  # never scheduled, or preempted (back in the queue)
    RUNNING = "running"                  # holds KV blocks
    FINISHED_STOPPED = "stop"            # EOS, stop token or stop string
    FINISHED_LENGTH = "length"           # max_tokens or max_model_len
    FINISHED_ABORTED = "abort"           # cancelled, or can never fit the KV cache

    @property
    def is_finished(self) -> bool:
        return self.value in ("stop", "length", "abort")

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's finish_reason string, None while unfinished."""
        return self.value if self.is_finished else None


class SampleResult(NamedTuple):
    """The token the runner sampled for one sequence this step (a NamedTuple: one per
    sequence per step, and a frozen dataclass costs ~1 us to build)."""
    token_id: int
    logprob: float | None = None                           # of token_id, when logprobs were asked
    top_logprobs: list[tuple[int, float]] | None = None    # [(token_id, logprob)] best first
    rank: int | None = None                                # 1-based rank of token_id, if known


class Request:
    """One sequence: prompt_token_ids + output_token_ids, and how far its KV is computed.

        all_token_ids:  [ p0 p1 ... p(P-1) | o0 o1 ... o(O-1) ]
                          computed KV ----------->|            num_computed_tokens
        A running request has num_computed_tokens <= num_tokens - 1 after each step: the
        newest token's KV is written when it is fed back in the next step.
    """
    # slots: its fields sit in the object itself, not in a dict beside it (a step reads a few
    # of every running request's, after the forward pass has flushed the caches); those a
    # decode step reads come first, in the object's first two cache lines
    __slots__ = ("step_state", "status", "num_computed_tokens", "spec_token_ids", "request_id", "parent_id",
                 "output_token_ids", "_all_token_ids", "metrics", "logprobs", "sampling_params", "mm",
                 "prompt_logprobs", "index", "prompt", "prompt_token_ids", "seed", "eos_token_ids", "stop_check",
                 "max_tokens", "arrival_time", "priority", "num_cached_tokens", "num_preemptions",
                 "cumulative_logprob", "finish_reason", "stop_reason", "block_hashes", "lora_slot", "lora_salt",
                 "pooling", "owner")

    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, seed: int, *,
                 prompt: str | None = None, arrival_time: float | None = None,
                 priority: int = 0, eos_token_ids: tuple[int, ...] = (),
                 max_tokens: int | None = None, parent_id: str | None = None,
                 index: int = 0, owner: str | None = None):
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r}: the prompt has no tokens")
        self.request_id = request_id
        self.parent_id = request_id if parent_id is None else parent_id
        self.index = index                         # completion index within the parent (n > 1)
        # whom the scheduler shares max_num_seqs between (fair admission, scheduler.py): the HTTP
        # request that submitted it, all its prompts and samples; by default its user request
        self.owner = self.parent_id if owner is None else owner
        self.prompt = prompt
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(self.prompt_token_ids)   # kept in step, O(1) append
        self.sampling_params = sampling_params
        self.seed = seed                           # effective seed for this sequence's sampling
        self.eos_token_ids = eos_token_ids         # runner: mask them before min_tokens
        # (ids that may stop it, outputs at which its length stops it): Scheduler.add_request's
        self.stop_check: tuple[frozenset[int], int] = (frozenset(), 0)
        # max_tokens resolved by the engine (None in params = up to max_model_len)
        self.max_tokens = max_tokens if max_tokens is not None else sampling_params.max_tokens
        self.status = RequestStatus.WAITING
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1                # prompt tokens from the prefix cache (-1: unset)
        self.num_preemptions = 0
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        self.logprobs: list[dict[int, Logprob]] | None = \
            [] if sampling_params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if sampling_params.logprobs is not None else None
        # per prompt token (None for the first, which nothing predicts), filled during prefill
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = \
            [None] if sampling_params.prompt_logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.block_hashes: list[bytes] = []        # content hash per full block, filled by KV manager
        # speculative decoding: tokens drafted after the newest one, verified by the next step
        self.spec_token_ids: list[int] = []
        # LoRA (lite_llm/lora.py): the adapter's slot in the stacked weights (-1: the base model
        # alone) and its prefix-cache salt (no cached block is shared across adapters)
        self.lora_slot = -1
        self.lora_salt: bytes | None = None
        self.mm = None      # the prompt's images (multimodal.MMPrompt), set by the engine
        # a pooling request's PoolingParams (engine.py), None for one that generates: its whole
        # prompt in one step, never split across steps; no output token; its blocks freed when
        # that step ends
        self.pooling = None
        self.step_state = None   # what the compiled decode step keeps of it (_step.pyx), set there

    @property
    def all_token_ids(self) -> list[int]:
        """prompt + outputs; the engine's own list: read it, never modify it."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def wants_prompt_logits(self) -> bool:
        """Asked for prompt logprobs and does not have them all yet: its prefill must compute
        every prompt position (no prefix cache hits) and hand over their logits."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        # identity tests: asked per request several times a step, and an enum's properties
        # go through its descriptors
        status = self.status
        return status is not RequestStatus.RUNNING and status is not RequestStatus.WAITING

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def truncate_outputs(self, num: int) -> None:
        """Drop the newest num output tokens (accepted drafts after a stop string)."""
        if num > 0:
            del self.output_token_ids[-num:]
            del self._all_token_ids[-num:]

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")
