"""Scheduler: which tokens of which requests the next step computes (continuous batching).

Each step lets requests' num_computed_tokens catch up with their num_tokens under a token
budget (max_num_batched_tokens) and a sequence cap (max_num_seqs): running requests first
(a decode token, or the next chunk of a long prompt), then waiting ones in FCFS (or
priority) order, fairly between owners (below). There are no prefill/decode modes and
prefill is always chunked. When the KV cache runs out, the most recently admitted running
request (of the owner holding the most slots, when several run) is preempted by recompute:
its blocks are freed and it goes back to the FRONT of the waiting queue.

Fair admission. Every request has an owner (Request.owner): the HTTP request that submitted
it, whose prompts and n samples are all its sequences; by default its user request. Slots
(max_num_seqs) and KV blocks are shared between owners, not handed out FCFS over sequences,
so one owner's job cannot keep another's request waiting for all of it:
- admission takes, instead of the queue's head, the head of the waiting owner with the
  fewest running sequences (ties: the owner that began waiting first; under the priority
  policy the best priority first, then the fewest): round robin over owners;
- an owner's cap on running sequences is its fair share, and only when someone else waits:
  a waiting owner with at least two running sequences fewer than the owner holding the most
  (the "richest") claims one of its slots. At the start of a step, before anyone is served,
  the richest owner's newest running sequence is preempted by recompute for each claimant
  that no free slot serves (or whose head found the KV cache short in the previous step), at
  most one per claimant per step; the claimant is then admitted in this step, with a part
  of the token budget kept from the running requests' prefill chunks for it. The "two
  fewer" keeps owners that are one apart from trading a slot back and forth, and a
  preempted sequence resumes from its prefix-cached blocks.
- alone, an owner may use every slot: nothing is held back as headroom, since capacity
  left idle by a per-request cap is lost to a server's only client, while a preemption costs
  only the victim's recompute, and only when another owner actually waits.
Owners belong to clients: an owner id "client|request" (the server's: the client's address,
then its HTTP request) is request `request` of client `client`; an id without "|" is a client
of its own. Fairness holds between clients first, then between one client's owners: "fewest
running" compares (the client's running sequences, the owner's), and a waiting owner claims a
slot when its client runs at least two fewer than the client holding the most (the victim is
that client's richest owner's newest sequence), or, within its own client, when it runs at
least two fewer than that client's richest owner (the victim is that owner's newest). So a
client that opens hundreds of requests gets the share of one client, and one request of a
client cannot hold its other requests back either.
Under the priority policy fairness never preempts a sequence of better priority (a lower
value) than the claimant's head.

Token stops (EOS, stop token ids, max_tokens, max_model_len) are checked here when sampled
tokens come back; stop strings need text and are the engine's.

A request that asks for prompt logprobs needs the logits of every prompt position: it takes
no prefix cache hits, and its prefill chunks share a per-step cap of PROMPT_LOGITS_ROWS
tokens (each is a [V] row of logits the runner keeps for the step).

The SchedulerOutput speaks in deltas to a runner that keeps its per-sequence arrays from
step to step (vLLM v1's SchedulerOutput / CachedRequestData): a chunk with is_new enters the
runner's batch with its whole block table; any other chunk belongs to a request the runner
already holds and brings only the block ids appended since its previous step. Requests
leave the batch through finished_req_ids and preempted_req_ids, which reach the runner with
the next step that runs (before that step's new requests, which may reuse a request id).

    step k:   chunks [A new, blocks 3 7] [B new, blocks 1]
    step k+1: chunks [A, blocks +()] [B, blocks +(4)]          preempted_req_ids [ ]
    step k+2: chunks [A, blocks +(9)]                          preempted_req_ids [B]

Speculative decoding: a decoding request with drafted tokens (request.spec_token_ids, set
from the runner's proposals after each step) is scheduled as one chunk of 1 + s tokens,
the last real token then the s drafts, all at consecutive positions; their slots are
allocated as lookahead (never published for prefix caching). The runner verifies the drafts
and returns the accepted ones plus one more token; num_computed_tokens then counts the
real token and the accepted drafts, so a rejected draft's slot is simply written again
later. s is capped so no token can pass max_tokens or max_model_len; when the cache is
short the drafts are dropped before anyone is preempted. A draft model writes its next
drafts' KV after the step: num_lookahead_tokens more slots per sampling chunk.
"""
from __future__ import annotations

import bisect
import time
from collections import deque
from typing import NamedTuple

from lite_llm.engine import _step
from lite_llm.engine.kv_cache import KVCacheManager
from lite_llm.engine.request import Request, RequestStatus, SampleResult
from lite_llm.multimodal import encoder_cut, whole_images


_new_chunk = tuple.__new__
PROMPT_LOGITS_ROWS = 256     # prompt positions whose logits one step keeps (prompt logprobs)


class ScheduledChunk(NamedTuple):
    """Compute request.all_token_ids[start:start + num_new_tokens] this step. (A NamedTuple:
    one per running request per step, and a frozen dataclass costs ~1 us to build.)"""
    request: Request
    start: int                  # num_computed_tokens before this step
    num_new_tokens: int
    new_block_ids: list[int]    # is_new: the whole block table; else the ids appended this step
    sample: bool                # all tokens are computed after this chunk: sample the next one
    is_new: bool = False        # enters the runner's batch (admitted, or resumed after preemption)
    spec_token_ids: list[int] | tuple = ()   # drafts: the chunk's last len() tokens (not the request's yet)


if ScheduledChunk._fields != _step.CHUNK_FIELDS:   # the compiled readers take the fields by index
    raise ImportError("ScheduledChunk's fields differ from _chunk.pxi's; update both together")


class SchedulerOutput(NamedTuple):
    """One step's plan (a NamedTuple: built every step, in compiled code too, and nothing
    changes it once built)."""
    chunks: list[ScheduledChunk]
    num_tokens: int                                   # sum of chunks' num_new_tokens (T)
    preempted_req_ids: list[str] | tuple = ()         # left the batch since the last step
    finished_req_ids: list[str] | tuple = ()          # freed since the last step
    encoder_tokens: int = 0                           # the images this step encodes, counted in its budget
    # the previous step's requests again, in the same order, each computing one token that
    # samples, none new, no drafts, none gone since (a steady decode batch): the runner may
    # repeat its previous step's arrays (_step.repeats_decodes)
    steady: bool = False
    # requests schedule() finished with "abort" because they can never fit the KV cache (whether
    # or not the step runs): the engine records them
    aborted: list[Request] | tuple = ()

    @property
    def num_seqs(self) -> int:
        return len(self.chunks)


class Client:
    """The running sequences of one client's owners together (fair admission's first level)."""
    __slots__ = ("client_id", "num_running", "num_owners")

    def __init__(self, client_id: str):
        self.client_id = client_id
        self.num_running = 0
        self.num_owners = 0


class Owner:
    """What fair admission keeps of one owner with running or waiting sequences."""
    __slots__ = ("owner_id", "num_running", "waiting", "client")

    def __init__(self, owner_id: str, client: Client):
        self.owner_id = owner_id
        self.num_running = 0
        self.waiting: deque[Request] = deque()    # its waiting requests, in the queue's order
        self.client = client

    def load(self) -> tuple[int, int]:
        """What "fewest running" compares: its client's running sequences, then its own."""
        return self.client.num_running, self.num_running


def client_of(owner_id: str) -> str:
    """The client part of an owner id "client|request"; an id without "|" is its own client."""
    return owner_id.partition("|")[0]


class Scheduler:
    # the running requests' common decode case (one token, blocks in hand or allocated) taken in
    # one compiled call (_step.schedule_decodes); False: the Python loop below, its reference
    compiled_decodes = True

    def __init__(self, kv_cache_manager: KVCacheManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int, policy: str = "fcfs",
                 num_lookahead_tokens: int = 0):
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling policy must be 'fcfs' or 'priority', got {policy!r}")
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.kv_cache_manager = kv_cache_manager
        self.block_size = kv_cache_manager.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.policy = policy
        self.num_lookahead_tokens = num_lookahead_tokens   # per sampling chunk (draft model: k)
        self.requests: dict[str, Request] = {}        # every unfinished request
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []              # admission order (priority order if "priority")
        self.owners: dict[str, Owner] = {}            # owner id -> Owner, of every owner with a request
        self.clients: dict[str, Client] = {}          # client id -> Client, of every owner's client
        self._waiting_owners: dict[str, Owner] = {}   # those with waiting ones, as they began waiting
        self._running_owners: dict[str, Owner] = {}   # those with running ones
        self._kv_short: Owner | None = None            # a claimant whose head found the cache short
        self.num_preemptions_total = 0
        self._finished_req_ids: list[str] = []         # freed since the last step that ran
        self._preempted_req_ids: list[str] = []        # preempted since the last step that ran
        self._finished_in_schedule: list[Request] = []  # requests that can never fit (SchedulerOutput.aborted)
        self._rows_budget = PROMPT_LOGITS_ROWS            # this step's prompt-logits rows left
        self.encoder_cache = None     # image hash -> encoder rows (the runner's), images that cost no encoding
        self._step_images: set = set()                    # hashes of the images this step encodes
        self._step_encoder_tokens = 0                     # their tokens, counted in the step's budget
        # the steady step compiled (schedule()'s first case; the engine's SteadyStep calls it too):
        # it keeps these queues, which are therefore never rebound, and the latest step's chunks
        self._steady = _step.SteadySchedule(self.waiting, self.running, self._finished_req_ids,
                                            self._preempted_req_ids, kv_cache_manager.room,
                                            kv_cache_manager.allocate_slots, ScheduledChunk, SchedulerOutput,
                                            max_num_batched_tokens)

    # ---- queue management ---------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        assert request.request_id not in self.requests, f"duplicate request id {request.request_id!r}"
        # what a sampled token is checked against before the full stop check runs (most steps
        # of most requests: neither a stop id nor the length limit)
        params = request.sampling_params
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids.update(request.eos_token_ids)
        limit = self.max_model_len - request.num_prompt_tokens
        if request.max_tokens is not None:
            limit = min(limit, request.max_tokens)
        request.stop_check = (frozenset(stop_ids), limit)
        self.requests[request.request_id] = request
        self._push_waiting(request, front=False)

    def finish_requests(self, request_ids: list[str] | str, status: RequestStatus) -> list[Request]:
        """Finish unfinished requests with status (e.g. FINISHED_ABORTED); frees blocks at once."""
        assert status.is_finished
        out = []
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            request = self.requests.get(rid)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
                self._stop_running(request)
            else:
                self._unqueue(request)
            self._finish(request, status)
            out.append(request)
        return out

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def steady(self) -> _step.SteadySchedule | None:
        """The compiled steady schedule where it applies (compiled decodes, no lookahead slots for
        a draft model), else None: schedule() takes it first, and the engine's compiled steady
        step calls it in schedule()'s place."""
        return self._steady if self.compiled_decodes and not self.num_lookahead_tokens else None

    @property
    def pending_removal_ids(self) -> list[str]:
        """The requests that left the runner's batch (finished, then preempted) since the last
        step that ran: the next SchedulerOutput will carry them."""
        return self._finished_req_ids + self._preempted_req_ids

    # ---- one step -----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        preempted = self._preempted_req_ids
        if self._step_images:
            self._step_images = set()
        self._step_encoder_tokens = 0
        pending = None
        compiled = self.steady
        if compiled is not None:
            # nobody to admit, nothing gone: the running requests' common case first (most steps of
            # a steady batch end there), the loop below from wherever it stopped
            sched_out = compiled.schedule()
            if sched_out is not None:
                return sched_out
            pending = compiled.take_pending()
        if pending is not None:
            chunks, idx, budget = pending
            budget = self._schedule_running(chunks, preempted, 0, idx, budget)
        else:
            chunks: list[ScheduledChunk] = []
            reserve = 0
            if self._waiting_owners and len(self.owners) > 1:
                reserve = self._preempt_for_claims(preempted)
            num_preempted = len(preempted)
            budget = self._schedule_running(chunks, preempted, reserve) + reserve
            if len(preempted) == num_preempted:
                # after a preemption the cache is full: admitting would only preempt again
                budget = self._schedule_waiting(chunks, budget)
        num_tokens = self.max_num_batched_tokens - budget - self._step_encoder_tokens
        finished, preempted = list(self._finished_req_ids), list(preempted)
        steady = False
        if chunks:           # an empty step is not run: its removals wait for the next one
            self._finished_req_ids.clear()
            self._preempted_req_ids.clear()
            steady = not finished and not preempted and _step.repeats_decodes(self._steady.last_chunks, chunks)
            self._steady.last_chunks = chunks
        aborted = self._finished_in_schedule
        if aborted:
            self._finished_in_schedule = []
        return SchedulerOutput(chunks, num_tokens, preempted, finished, self._step_encoder_tokens, steady, aborted)

    def _schedule_running(self, chunks: list[ScheduledChunk], preempted: list[str], reserve: int = 0,
                          idx: int = 0, budget: int | None = None) -> int:
        """Serve the running requests first, leaving reserve tokens of the budget for admission;
        from running[idx] on with budget left when the first ones are in chunks already."""
        if budget is None:
            budget = self.max_num_batched_tokens - reserve
        self._rows_budget = PROMPT_LOGITS_ROWS
        kv = self.kv_cache_manager
        room = kv.room
        fast = self.compiled_decodes and not self.num_lookahead_tokens
        while idx < len(self.running) and budget > 0:
            if fast:        # the loop's common case below, compiled, up to the next other one
                idx, budget = _step.schedule_decodes(self.running, room, chunks, budget, idx, ScheduledChunk,
                                                      kv.allocate_slots)
                if idx >= len(self.running) or budget <= 0:
                    break
            request = self.running[idx]
            if kv.rope_switch and request.num_tokens > kv.rope_switch and request.request_id not in kv.rope_long:
                self._restart(self.running.pop(idx))
                preempted.append(request.request_id)
                continue
            start = request.num_computed_tokens
            num_new = min(len(request.all_token_ids) - start, budget)
            enc = 0
            if request.mm is not None:      # never end a chunk inside an image; encoding counts
                num_new = whole_images(request, start, num_new)
                if num_new:
                    num_new, enc, images = encoder_cut(request, start, num_new, budget, self.encoder_cache,
                                                       self._step_images)
                if num_new == 0:
                    idx += 1
                    continue
            if request.prompt_logprobs is not None and request.wants_prompt_logits:
                num_new = min(num_new, self._rows_budget)
                if num_new == 0:        # its prompt rows wait for the next step
                    idx += 1
                    continue
                self._rows_budget -= num_new
            assert num_new > 0, f"{request} has nothing to compute"
            if request.spec_token_ids or self.num_lookahead_tokens:
                spec = self._drafts(request, num_new, budget)
                lookahead = self._lookahead(request, num_new, len(spec))
            else:                 # no speculation (most steps): what the two calls would give
                spec, lookahead = (), 0
                if start + num_new <= room.get(request.request_id, -1):
                    # its blocks hold the new tokens (most decode steps): allocate_slots' first
                    # check, without the call
                    chunks.append(_new_chunk(ScheduledChunk, (request, start, num_new, [],
                                                              start + num_new == len(request.all_token_ids),
                                                              False, spec)))
                    budget -= num_new
                    if enc:
                        budget -= self._encoder_charge(enc, images)
                    idx += 1
                    continue
            while (block_ids := kv.allocate_slots(request, num_new, (), len(spec) + lookahead)) is None:
                if spec or lookahead:       # drop the speculation before preempting anyone
                    spec, lookahead = (), 0
                    continue
                # never one served earlier this step (running[:idx])
                victim = self._pop_victim(idx)
                if victim is request and not self.running:
                    # alone with the whole cache and still short: it can never fit
                    self._stop_running(request)
                    self._finish(request, RequestStatus.FINISHED_ABORTED)
                    self._finished_in_schedule.append(request)
                    break
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            if block_ids is None:
                continue           # request left running; running[idx] is the next one
            # tuple.__new__: the NamedTuple's own __new__ is a Python frame per chunk
            chunks.append(_new_chunk(ScheduledChunk, (request, start, num_new + len(spec), block_ids,
                                                      start + num_new == request.num_tokens, False, spec)))
            budget -= num_new + len(spec)
            if enc:
                budget -= self._encoder_charge(enc, images)
            idx += 1
        return budget

    def _encoder_charge(self, enc: int, images: list) -> int:
        """Record a scheduled chunk's images to encode (encoder_cut); their tokens, for the budget."""
        self._step_images.update(images)
        self._step_encoder_tokens += enc
        return enc

    def _drafts(self, request: Request, num_new: int, budget: int) -> list[int] | tuple:
        """The drafts this step verifies for request: none unless it decodes one token, at most
        what the budget leaves, and never more than the tokens it may still produce."""
        spec = request.spec_token_ids
        if not spec or num_new != 1 or request.num_tokens - request.num_computed_tokens != 1:
            return ()
        room = min(budget - 1, request.max_tokens - request.num_output_tokens - 1,
                   self.max_model_len - request.num_tokens - 1)
        return spec if len(spec) <= room else spec[:max(room, 0)]

    def _lookahead(self, request: Request, num_new: int, num_spec: int) -> int:
        """Slots past this step's tokens a draft model writes after the step (0 without one)."""
        if not self.num_lookahead_tokens or request.num_computed_tokens + num_new != request.num_tokens:
            return 0
        end = request.num_tokens + num_spec
        return max(0, min(self.num_lookahead_tokens, self.max_model_len - end))

    def _schedule_waiting(self, chunks: list[ScheduledChunk], budget: int) -> int:
        if not self.waiting:
            return budget
        kv = self.kv_cache_manager
        now = time.monotonic()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self._next_waiting()
            wants_rows = request.wants_prompt_logits
            hits, num_hit_tokens = kv.get_computed_blocks(request) if not wants_rows else ([], 0)
            num_new = min(request.num_tokens - num_hit_tokens, budget)
            enc = 0
            if request.mm is not None:      # never end a chunk inside an image; encoding counts
                num_new = whole_images(request, num_hit_tokens, num_new)
                if num_new:
                    num_new, enc, images = encoder_cut(request, num_hit_tokens, num_new, budget,
                                                       self.encoder_cache, self._step_images)
                if num_new == 0:
                    break
            if wants_rows:
                num_new = min(num_new, self._rows_budget)
                if num_new == 0:
                    break
            if request.pooling and num_new < request.num_tokens - num_hit_tokens:
                break          # a pooling input is never split: it waits for a step with room
            block_ids = kv.allocate_slots(request, num_new, hits)
            if block_ids is None:
                if not self.running:
                    # the whole cache is free and the head still does not fit: never will
                    self._unqueue(request)
                    self._finish(request, RequestStatus.FINISHED_ABORTED)
                    self._finished_in_schedule.append(request)
                    continue
                if len(self.owners) > 1:     # the next step may preempt for it (fair admission)
                    owner = self.owners[request.owner]
                    if self._victim_for(owner) is not None:
                        self._kv_short = owner
                break          # FCFS: later requests wait behind the head
            self._start_running(request)       # first: the owner stays while it runs
            self._unqueue(request)
            if wants_rows:
                self._rows_budget -= num_new
            kv.record_prefix_lookup(request.num_tokens, num_hit_tokens)
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = now
            request.status = RequestStatus.RUNNING
            if self.policy == "priority":
                bisect.insort(self.running, request, key=_priority_key)
            else:
                self.running.append(request)
            chunks.append(ScheduledChunk(request, num_hit_tokens, num_new, block_ids,
                                         num_hit_tokens + num_new == request.num_tokens, is_new=True))
            budget -= num_new
            if enc:
                budget -= self._encoder_charge(enc, images)
        return budget

    def _restart(self, request: Request) -> None:
        """A LongRoPE sequence, already taken out of self.running, that outgrew the original
        context with keys turned by the short factors: recomputed from its first token with the
        long factors, as transformers drops its cache there (lite_llm/model/rope.py). Not a
        preemption in the counts; it goes first in line."""
        self._stop_running(request)
        self.kv_cache_manager.free(request)
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.status = RequestStatus.WAITING
        self._push_waiting(request, front=True)

    def _preempt(self, request: Request) -> None:
        """Preempt a running request, already taken out of self.running, by recompute."""
        self._stop_running(request)
        self.kv_cache_manager.free(request)    # before resetting num_computed_tokens: see free()
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        request.metrics.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.num_preemptions_total += 1
        self._push_waiting(request, front=True)

    def _push_waiting(self, request: Request, front: bool) -> None:
        owner = self.owners.get(request.owner)
        if owner is None:
            owner = self.owners[request.owner] = self._new_owner(request.owner)
        for queue in (self.waiting, owner.waiting):     # the same order: an owner's is a sub-sequence
            if self.policy == "priority":
                keys = [_priority_key(r) for r in queue]
                queue.insert(bisect.bisect_right(keys, _priority_key(request)), request)
            elif front:
                queue.appendleft(request)
            else:
                queue.append(request)
        if owner.owner_id not in self._waiting_owners:
            if front:         # a preempted sequence's owner keeps its turn
                self._waiting_owners = {owner.owner_id: owner, **self._waiting_owners}
            else:
                self._waiting_owners[owner.owner_id] = owner

    # ---- fair admission (see the module's docstring) ---------------------------------------

    def _unqueue(self, request: Request) -> None:
        """Take a request out of the waiting queue (and its owner's)."""
        if self.waiting[0] is request:
            self.waiting.popleft()
        else:
            self.waiting.remove(request)
        owner = self.owners[request.owner]
        if owner.waiting[0] is request:
            owner.waiting.popleft()
        else:
            owner.waiting.remove(request)
        if not owner.waiting:
            del self._waiting_owners[owner.owner_id]
            if not owner.num_running:
                self._drop_owner(owner)

    def _new_owner(self, owner_id: str) -> Owner:
        client_id = client_of(owner_id)
        client = self.clients.get(client_id)
        if client is None:
            client = self.clients[client_id] = Client(client_id)
        client.num_owners += 1
        return Owner(owner_id, client)

    def _drop_owner(self, owner: Owner) -> None:
        del self.owners[owner.owner_id]
        client = owner.client
        client.num_owners -= 1
        if not client.num_owners:
            del self.clients[client.client_id]

    def _start_running(self, request: Request) -> None:
        owner = self.owners[request.owner]
        owner.num_running += 1
        owner.client.num_running += 1
        if owner.num_running == 1:
            self._running_owners[owner.owner_id] = owner

    def _stop_running(self, request: Request) -> None:
        """Count a request that left self.running (preempted or finished) out of its owner's."""
        owner = self.owners[request.owner]
        owner.num_running -= 1
        owner.client.num_running -= 1
        if not owner.num_running:
            del self._running_owners[owner.owner_id]
            if not owner.waiting:
                self._drop_owner(owner)

    def _next_waiting(self) -> Request:
        """The waiting request admission tries next: the queue's head while one owner waits,
        else the head of the waiting owner with the fewest running sequences (priority policy:
        of the best head priority, then the fewest), ties to the one that began waiting first."""
        if len(self._waiting_owners) == 1:
            return self.waiting[0]
        best = None
        if self.policy == "priority":
            best_key = None
            for owner in self._waiting_owners.values():
                key = (owner.waiting[0].priority, *owner.load())
                if best_key is None or key < best_key:
                    best, best_key = owner, key
        else:
            fewest = None
            for owner in self._waiting_owners.values():
                load = owner.load()
                if fewest is None or load < fewest:
                    best, fewest = owner, load
                    if fewest == (0, 0):
                        break
        return best.waiting[0]

    def _claimants(self, view: tuple | None = None) -> list[Owner]:
        """Waiting owners at least two running sequences short of the richest, in admission
        order (fewest running first; priority policy: best head priority first). view: as
        _richest_for's."""
        view = view if view is not None else self._fair_view()
        top = view[0]
        if top is None or top.num_running < 2:
            return []
        out = [o for o in self._waiting_owners.values() if self._richest_for(o, view) is not None]
        if self.policy == "priority":
            out.sort(key=lambda o: (o.waiting[0].priority, *o.load()))
        else:
            out.sort(key=Owner.load)
        return out

    def _fair_view(self) -> tuple[Client | None, dict[str, Owner]]:
        """The client running the most, and each client's richest running owner (by client id):
        one pass, so that judging every waiting owner's claim costs O(waiting + running)."""
        top = max(self.clients.values(), key=lambda c: c.num_running, default=None)
        richest_of: dict[str, Owner] = {}
        for owner in self._running_owners.values():
            best = richest_of.get(owner.client.client_id)
            if best is None or owner.num_running > best.num_running:
                richest_of[owner.client.client_id] = owner
        return top, richest_of

    def _richest_for(self, claimant: Owner, view: tuple | None = None) -> Owner | None:
        """The owner a claimant's slot comes from, if it has a claim: the richest owner of the
        client holding the most, when that client runs at least two more than claimant's; else,
        within claimant's own client, its richest owner, when it runs at least two more than
        claimant. None: no claim. view: _fair_view(), when several claims are judged at once."""
        top, richest_of = view if view is not None else self._fair_view()
        client = claimant.client
        if top is not None and top is not client and top.num_running >= client.num_running + 2:
            return richest_of.get(top.client_id)
        if client.num_owners < 2:
            return None
        richest = richest_of.get(client.client_id)
        if richest is None or richest.num_running < claimant.num_running + 2:
            return None
        return richest

    def _victim_for(self, claimant: Owner, view: tuple | None = None) -> Request | None:
        """The running sequence preempted so claimant gets a slot: the newest (priority policy:
        the least important) of the owner _richest_for names, if claimant has a claim and
        (priority policy) that sequence is not more important than claimant's head."""
        richest = self._richest_for(claimant, view)
        if richest is None:
            return None
        owner_id = richest.owner_id
        victim = next(r for r in reversed(self.running) if r.owner == owner_id)
        if self.policy == "priority" and victim.priority < claimant.waiting[0].priority:
            return None
        return victim

    def _preempt_for_claims(self, preempted: list[str]) -> int:
        """Before anyone is served: one slot for each claimant, a free one if there is one, else
        (or if its head found the KV cache short last step) one preempted from the richest.
        Returns the tokens of the budget the running requests leave to the first claimant's
        head (its prompt, up to half the budget), so that their prefill chunks cannot starve it."""
        short, self._kv_short = self._kv_short, None
        free = self.max_num_seqs - len(self.running)
        reserve = 0
        for owner in self._claimants():
            if free > 0 and owner is not short:
                free -= 1
            else:
                victim = self._victim_for(owner)
                if victim is None:
                    continue
                self.running.remove(victim)
                self._preempt(victim)
                preempted.append(victim.request_id)
            if not reserve:
                reserve = min(owner.waiting[0].num_tokens, self.max_num_batched_tokens // 2)
        return reserve

    def _pop_victim(self, idx: int) -> Request:
        """Take out of running the request preempted when blocks run out, among those not served
        yet this step (running[idx:]): the newest (priority policy: least important, then
        newest) of the owner holding the most slots; running[-1] while one owner runs."""
        running = self.running
        if len(self._running_owners) < 2:
            return running.pop()
        is_priority = self.policy == "priority"
        owners = self.owners
        best, best_key = len(running) - 1, None
        for j in range(len(running) - 1, idx - 1, -1):
            r = running[j]
            key = (r.priority if is_priority else 0, *owners[r.owner].load())
            if best_key is None or key > best_key:
                best, best_key = j, key
        return running.pop(best)

    # ---- after the runner -----------------------------------------------------------------

    def update_from_output(self, sched_out: SchedulerOutput, results: list,
                           spec_token_ids: dict[str, list[int]] | None = None
                           ) -> list[tuple[Request, SampleResult]]:
        """Advance computed tokens, append sampled tokens, apply token stops (freeing finished
        requests). Returns the requests that got a token with their sample, in chunk order.
        A chunk with drafts has a list of SampleResults (accepted drafts, then one more):
        they are appended one at a time, each checked for stops, and tokens after a stop
        are dropped. spec_token_ids: the runner's drafts for the next step, by request id."""
        assert len(results) == len(sched_out.chunks), "runner results must align with chunks"
        sampled: list[tuple[Request, SampleResult]] = []
        append = sampled.append
        running, waiting = RequestStatus.RUNNING, RequestStatus.WAITING
        for chunk, result in zip(sched_out.chunks, results):
            request = chunk.request
            status = request.status
            if status is not running and status is not waiting:     # finished (is_finished, inlined)
                continue
            if chunk.spec_token_ids:
                # the last real token and the accepted drafts now have their KV
                request.num_computed_tokens = chunk.start + len(result)
                for one in result:
                    request.append_output_token(one.token_id)
                    sampled.append((request, one))
                    status = self.check_token_stop(request)
                    if status is not None:
                        self.finish_requests(request.request_id, status)
                        break
                continue
            request.num_computed_tokens = chunk.start + chunk.num_new_tokens
            if not chunk.sample:
                continue
            assert result is not None, f"no sample for {request}"
            token_id = result.token_id
            request.output_token_ids.append(token_id)       # append_output_token, inlined
            request.all_token_ids.append(token_id)
            append((request, result))
            stop_ids, limit = request.stop_check
            if token_id in stop_ids or len(request.output_token_ids) >= limit:
                status = self.check_token_stop(request)
                if status is not None:
                    self.finish_requests(request.request_id, status)
        if spec_token_ids is not None:
            for chunk in sched_out.chunks:
                request = chunk.request
                if chunk.sample and not request.is_finished:
                    request.spec_token_ids = spec_token_ids.get(request.request_id, [])
        return sampled

    def check_token_stop(self, request: Request) -> RequestStatus | None:
        params = request.sampling_params
        outputs = request.output_token_ids      # read directly: once per sequence per step
        num_outputs = len(outputs)
        if num_outputs >= params.min_tokens:
            token_id = outputs[-1]
            if token_id in request.eos_token_ids and not params.ignore_eos:
                return RequestStatus.FINISHED_STOPPED
            if params.stop_token_ids and token_id in params.stop_token_ids:
                request.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
        if num_outputs >= request.max_tokens or len(request.all_token_ids) >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, request: Request, status: RequestStatus) -> None:
        self.kv_cache_manager.free(request)
        request.status = status
        request.finish_reason = status.finish_reason
        request.metrics.finished_time = time.monotonic()
        del self.requests[request.request_id]
        self._finished_req_ids.append(request.request_id)


def _priority_key(request: Request) -> tuple[int, float]:
    return request.priority, request.arrival_time
