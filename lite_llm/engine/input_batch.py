"""InputBatch: the runner's persistent per-sequence arrays, changed in place by each step's
deltas (vLLM v1's InputBatch), and the flat arrays of one forward() call made from them.

A request entering the batch (SchedulerOutput chunk with is_new) takes a free slot and
keeps it until it leaves (finished_req_ids, preempted_req_ids). Its slot owns one row of
each array:

    token_ids     [max_num_seqs, max_model_len]  prompt + output ids; sampled ids are appended
                                                 here by the runner, never copied again
    block_table   [max_num_seqs, max_blocks]     the request's KV block ids (deltas appended);
                                                 forward() reads this very array
    num_tokens, num_prompt_tokens, num_blocks    [max_num_seqs]
    fparams       [max_num_seqs, NUM_F]          sampling floats (_sampler F_* columns)
    iparams       [max_num_seqs, NUM_I]          the _sampler I_* columns: top_k, num_logprobs,
                                                 seed, and the step / penalty-context offsets
                                                 into token_ids, advanced per appended token

KVCacheManager owns which blocks a request holds; block_table is the runner's copy of those
lists, grown by the ids each step appends, never rebuilt. A step's arrays are gathered from
these rows by one compiled call (_batch.pyx) into buffers kept across steps, with each
token's sequence index being its SLOT (forward() looks block tables up by it), so nothing
is rebuilt per token in Python:

    chunks            [ A (slot 2): tokens 0..3 | B (slot 0): token 9 ]
    tok_seq           [ 2 2 2 2 | 0 ]
    positions         [ 0 1 2 3 | 9 ]
    token_ids         token_ids[tok_seq, positions]
    slot_mapping      block_table[tok_seq, positions // B] * B + positions % B
    logits_rows       [ 3, 4 ]   (chunks that sample: their last token)

What does not live here: which tokens run (scheduler.py), the model (runner.py), the
sampling arithmetic (_sampler.pyx).
"""
from __future__ import annotations

import heapq
from typing import Any, NamedTuple

import numpy as np

from lite_llm.engine import _batch
from lite_llm.engine.scheduler import SchedulerOutput

# _sampler.pyx columns (kept equal there)
NUM_F, NUM_I = 6, 9
I_TOP_K, I_NUM_LOGPROBS, I_SEED, I_STEP, I_TOK_START, I_TOK_PROMPT_END, I_TOK_END, I_BAN_START, I_BAN_END = range(9)
_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63
_NO_IDS = np.zeros(0, np.int32)


class StepArrays(NamedTuple):
    """The arguments of one forward() call and what the sampler needs beside them (a NamedTuple:
    one per step, and a frozen dataclass sets each field through object.__setattr__)."""
    token_ids: np.ndarray      # [T] int32
    positions: np.ndarray      # [T] int32
    slot_mapping: np.ndarray   # [T] int64 KV slot of each token
    tok_seq: np.ndarray        # [T] int32 batch slot of each token (block_table row)
    block_tables: np.ndarray   # [max_num_seqs, max_blocks] int32, the persistent table itself
    logits_rows: np.ndarray    # [R] int32 token index of each sampling chunk's last token
    sample_slots: np.ndarray   # [R] int32 batch slot of each sampling chunk
    sample_slots_are_prefix: bool   # sample_slots == 0..R-1: parameter rows are views
    num_context_tokens: int    # keys attention reads over all sequences (bandwidth figures)


class DecodeArrays(NamedTuple):
    """The latest step's arrays as a steady decode batch repeats them (InputBatch.bind_decode):
    forward()'s step arrays, which the batch's compiled gather refills in place each step."""
    token_ids: np.ndarray      # [S] int32
    positions: np.ndarray      # [S] int32
    slot_mapping: np.ndarray   # [S] int64
    tok_seq: np.ndarray        # [S] int32
    logits_rows: np.ndarray    # [S] int32
    slots: np.ndarray          # [S] int32 each sequence's batch slot (a copy)
    buffers: Any               # _batch.StepBuffers: the gather (gather_slots) and the append


def sampling_row(params, seed: int) -> tuple[tuple[float, ...], tuple[int, int, int]]:
    """A request's fixed sampler parameters: the F_* columns and (top_k, num_logprobs, seed)."""
    seed &= _MASK64
    return ((params.temperature, params.top_p, params.min_p, params.repetition_penalty,
             params.frequency_penalty, params.presence_penalty),
            (params.top_k, -1 if params.logprobs is None else params.logprobs,
             seed - (1 << 64) if seed & _SIGN64 else seed))


def step_buffers(max_tokens: int, max_rows: int) -> tuple[np.ndarray, ...]:
    """The buffers a step's flat forward() arrays are gathered into, kept across steps: token ids,
    positions, KV slots (int64) and batch slots of up to max_tokens tokens; the logits rows and
    sampling slots of up to max_rows sequences."""
    return (np.zeros(max_tokens, np.int32), np.zeros(max_tokens, np.int32), np.zeros(max_tokens, np.int64),
            np.zeros(max_tokens, np.int32), np.zeros(max_rows, np.int32), np.zeros(max_rows, np.int32))


def ban_ids(params, eos_token_ids) -> list[int]:
    """Ids set to -inf while fewer than min_tokens tokens are generated."""
    return [*(() if params.ignore_eos else eos_token_ids), *params.stop_token_ids]


class InputBatch:
    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int,
                 eos_token_ids: tuple[int, ...] = (), max_num_batched_tokens: int | None = None):
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.eos_token_ids = tuple(eos_token_ids)
        # np.zeros: pages of rows never used are never touched (calloc). One column more than
        # max_model_len: a prompt of max_model_len tokens still gets its sampled token appended.
        row_len = max_model_len + 1
        self.token_ids = np.zeros((max_num_seqs, row_len), np.int32)
        self.num_tokens = np.zeros(max_num_seqs, np.int32)
        self.num_prompt_tokens = np.zeros(max_num_seqs, np.int32)
        self.block_table = np.zeros((max_num_seqs, self.max_blocks), np.int32)
        self.seq_lora = np.full(max_num_seqs, -1, np.int32)   # LoRA slot of each row's request, -1: none
        self.num_blocks = [0] * max_num_seqs
        # sampler rows, kept current: I_STEP and I_TOK_END advance with each appended token
        self.fparams = np.zeros((max_num_seqs, NUM_F), np.float32)
        self.iparams = np.zeros((max_num_seqs, NUM_I), np.int64)
        self.ctx_outputs = np.zeros(max_num_seqs, np.int64)    # 1: outputs are penalty context
        self.min_tokens = [0] * max_num_seqs
        self._ban_ids: list[list[int]] = [[] for _ in range(max_num_seqs)]
        self._banning: set[int] = set()          # slots still short of min_tokens
        self._biased: set[int] = set()           # slots whose request has a logit_bias
        self._logprobs: set[int] = set()         # slots whose request wants logprobs
        self._prompt_logprobs: set[int] = set()  # slots whose request wants prompt logprobs
        self.slot_of: dict[str, int] = {}        # request id -> slot
        self._free_slots = list(range(max_num_seqs))   # a heap: the lowest free slot first
        self._row_len = row_len
        # step arrays, filled in place each step (forward() and the sampler get views)
        (self._token_ids, self._positions, self._slot_mapping, self._tok_seq, self._logits_rows,
         self._sample_slots) = step_buffers(max_num_batched_tokens or max_num_seqs * row_len, max_num_seqs)
        self._fparams_step = np.zeros((max_num_seqs, NUM_F), np.float32)
        self._iparams_step = np.zeros((max_num_seqs, NUM_I), np.int64)
        self._flat_token_ids = self.token_ids.reshape(-1)      # the sampler's penalty context
        # the same arrays as pointers taken once: each step's gather and append (_batch.pyx)
        self._buffers = _batch.StepBuffers(self.token_ids, self.block_table, self.num_tokens, self.iparams,
                                           self.ctx_outputs, self._token_ids, self._positions, self._slot_mapping,
                                           self._tok_seq, self._logits_rows, self._sample_slots, block_size,
                                           I_STEP, I_TOK_END)
        # views of the step arrays for the latest (T, R), and of the parameter rows for the
        # latest R: a steady decode batch reuses them instead of slicing again every step
        self._step_views: tuple = ((-1, -1), ())
        self._param_views: tuple = (-1, ())

    @property
    def num_reqs(self) -> int:
        return len(self.slot_of)

    @property
    def any_logit_bias(self) -> bool:
        """Whether some request in the batch has a logit_bias (sampler.add_logit_bias)."""
        return bool(self._biased)

    @property
    def any_logprobs(self) -> bool:
        """Whether some request in the batch wants sample logprobs (else the sampler skips its
        reduction over the rows' num_logprobs)."""
        return bool(self._logprobs)

    @property
    def any_banning(self) -> bool:
        """Whether some slot may still be short of its min_tokens (sampling_arrays then builds
        the step's banned ids)."""
        return bool(self._banning)

    def gather_params(self, slots: np.ndarray) -> None:
        """The slots' parameter rows into the step buffers (rows 0..len(slots)-1), in place."""
        _batch.gather_rows(self.fparams, slots, self._fparams_step)
        _batch.gather_rows(self.iparams, slots, self._iparams_step)

    def finish_plain(self, run, tokens: np.ndarray, result_type) -> tuple[list, float]:
        """run() (the step's bound sampling, writing tokens [R]), append_step(tokens) and the
        rows' plain results, in one compiled call (_batch.StepBuffers.finish_plain)."""
        return self._buffers.finish_plain(run, tokens, result_type)

    @property
    def any_prompt_logprobs(self) -> bool:
        """Whether some request in the batch asked for prompt logprobs (the runner then looks
        for this step's prompt rows)."""
        return bool(self._prompt_logprobs)

    # ---- deltas ---------------------------------------------------------------------------

    def remove(self, request_id: str) -> None:
        """Free a request's slot (unknown ids are ignored: e.g. one preempted, then aborted)."""
        slot = self.slot_of.pop(request_id, None)
        if slot is not None:
            self.num_blocks[slot] = 0
            self._banning.discard(slot)
            self._biased.discard(slot)
            self._logprobs.discard(slot)
            self._prompt_logprobs.discard(slot)
            heapq.heappush(self._free_slots, slot)

    def add(self, request, block_ids: list[int]) -> int:
        """Give request the lowest free slot, holding its tokens, block table and sampling
        parameters (low slots first keep a steady batch in slots 0..S-1: see prepare)."""
        assert request.request_id not in self.slot_of, f"{request.request_id!r} is already in the batch"
        slot = heapq.heappop(self._free_slots)
        self.slot_of[request.request_id] = slot
        tokens = request.all_token_ids
        n = len(tokens)
        num_prompt = request.num_prompt_tokens
        assert n <= self.max_model_len, f"{request} is longer than max_model_len {self.max_model_len}"
        self.token_ids[slot, :n] = tokens
        self.num_tokens[slot] = n
        self.num_prompt_tokens[slot] = num_prompt
        self.seq_lora[slot] = getattr(request, "lora_slot", -1)
        self.num_blocks[slot] = 0
        self.append_blocks(slot, block_ids)
        p = request.sampling_params
        self.fparams[slot], (top_k, num_logprobs, seed) = sampling_row(p, request.seed)
        # penalty context: token_ids[slot, start:prompt_end] prompt part, [prompt_end:end] outputs
        base = slot * self._row_len
        rep = p.repetition_penalty != 1.0
        outputs = rep or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
        self.ctx_outputs[slot] = outputs
        self.iparams[slot] = (top_k, num_logprobs, seed, n - num_prompt,
                              base + (0 if rep else num_prompt), base + num_prompt,
                              base + (n if outputs else num_prompt), 0, 0)
        self.min_tokens[slot] = p.min_tokens
        if getattr(p, "logit_bias", None):
            self._biased.add(slot)
        if num_logprobs >= 0:
            self._logprobs.add(slot)
        if getattr(p, "prompt_logprobs", None) is not None:
            self._prompt_logprobs.add(slot)
        if n - num_prompt < p.min_tokens:
            self._ban_ids[slot] = ban_ids(p, getattr(request, "eos_token_ids", None) or self.eos_token_ids)
            self._banning.add(slot)
        return slot

    def append_blocks(self, slot: int, block_ids: list[int]) -> None:
        if block_ids:
            n = self.num_blocks[slot]
            self.block_table[slot, n:n + len(block_ids)] = block_ids
            self.num_blocks[slot] = n + len(block_ids)

    def put_drafts(self, slot: int, draft_ids) -> None:
        """Drafts sit past the row's tokens (the verified ones are appended over them)."""
        n = int(self.num_tokens[slot])
        self.token_ids[slot, n:n + len(draft_ids)] = draft_ids

    def append_step(self, token_ids: np.ndarray) -> None:
        """append_sampled for the latest prepare()'s sampling slots: token_ids [R] int32."""
        self._buffers.append_step(token_ids)

    def append_sampled(self, slots: np.ndarray, token_ids: np.ndarray) -> None:
        """Each slot's newly sampled token joins its row (the scheduler appends the same
        token to the request, unless the request stopped and leaves the batch)."""
        _batch.append_sampled(self.token_ids, self.num_tokens, self.iparams, self.ctx_outputs,
                              slots, token_ids, I_STEP, I_TOK_END)

    # ---- one step -------------------------------------------------------------------------

    def prepare(self, sched_out: SchedulerOutput) -> StepArrays:
        """Apply the step's deltas, then gather its flat arrays (see the module docstring)."""
        for rid in sched_out.finished_req_ids:
            self.remove(rid)
        for rid in sched_out.preempted_req_ids:
            self.remove(rid)
        chunks = sched_out.chunks
        num_tokens, num_rows, num_context, is_prefix = self._buffers.gather(chunks, self.slot_of, self)
        assert num_tokens == sched_out.num_tokens, "SchedulerOutput.num_tokens disagrees with its chunks"
        key, views = self._step_views
        if key != (num_tokens, num_rows):
            views = (self._token_ids[:num_tokens], self._positions[:num_tokens],
                     self._slot_mapping[:num_tokens], self._tok_seq[:num_tokens],
                     self._logits_rows[:num_rows], self._sample_slots[:num_rows])
            self._step_views = (num_tokens, num_rows), views
        return StepArrays(views[0], views[1], views[2], views[3], self.block_table, views[4], views[5],
                          is_prefix, num_context)

    def bind_decode(self, num_seqs: int) -> DecodeArrays | None:
        """The latest step's arrays for a steady decode batch of its num_seqs sequences, one
        token each (_batch.SteadyDecode). None unless the latest step was S tokens in S
        sampling rows."""
        key, views = self._step_views
        if key != (num_seqs, num_seqs):
            return None
        return DecodeArrays(views[0], views[1], views[2], views[3], views[4], views[5].copy(), self._buffers)

    def sampling_arrays(self, slots: np.ndarray, is_prefix: bool = False
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(fparams [R, NUM_F], iparams [R, NUM_I], context token ids, banned ids) for
        _sampler.sample over the given slots: their rows of the kept parameter arrays (views
        when is_prefix: the slots are 0..R-1), and the flat view of token_ids as the penalty
        context."""
        num_rows = len(slots)
        if is_prefix:
            rows, views = self._param_views
            if rows != num_rows:
                views = self.fparams[:num_rows], self.iparams[:num_rows]
                self._param_views = num_rows, views
            fparams, iparams = views
        else:
            fparams, iparams = self._fparams_step[:num_rows], self._iparams_step[:num_rows]
            self.gather_params(slots)
        banned_ids = _NO_IDS
        if self._banning:
            banned: list[int] = []
            bans = []
            for row, slot in enumerate(slots.tolist()):
                if slot in self._banning:
                    if self.iparams[slot, I_STEP] >= self.min_tokens[slot]:
                        self._banning.discard(slot)
                        continue
                    bans.append((row, len(banned)))
                    banned.extend(self._ban_ids[slot])
                    bans[-1] += (len(banned),)
            if bans:
                if iparams.base is self.iparams:   # the ranges are this step's, not the slot's
                    iparams = self._iparams_step[:num_rows]
                    iparams[:] = self.iparams[:num_rows]
                for row, lo, hi in bans:
                    iparams[row, I_BAN_START], iparams[row, I_BAN_END] = lo, hi
                banned_ids = np.array(banned, np.int32) if banned else _NO_IDS
        return fparams, iparams, self._flat_token_ids, banned_ids
