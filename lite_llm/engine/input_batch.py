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
    iparams       [max_num_seqs, NUM_I]          top_k, num_logprobs, seed (the _sampler
                                                 I_* columns that never change)

KVCacheManager owns which blocks a request holds; block_table is the runner's copy of those
lists, grown by the ids each step appends, never rebuilt. A step's arrays are gathered with
numpy from these rows, with each token's sequence index being its SLOT (forward() looks
block tables up by it), so nothing is rebuilt per token in Python:

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

from dataclasses import dataclass

import numpy as np

from lite_llm.engine.scheduler import SchedulerOutput

# _sampler.pyx columns (kept equal there)
NUM_F, NUM_I = 6, 9
I_TOP_K, I_NUM_LOGPROBS, I_SEED, I_STEP, I_TOK_START, I_TOK_PROMPT_END, I_TOK_END, I_BAN_START, I_BAN_END = range(9)
_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63
_NO_IDS = np.zeros(0, np.int32)


@dataclass(frozen=True)
class StepArrays:
    """The arguments of one forward() call and what the sampler needs beside them."""
    token_ids: np.ndarray      # [T] int32
    positions: np.ndarray      # [T] int32
    slot_mapping: np.ndarray   # [T] int64 KV slot of each token
    tok_seq: np.ndarray        # [T] int32 batch slot of each token (block_table row)
    block_tables: np.ndarray   # [max_num_seqs, max_blocks] int32, the persistent table itself
    logits_rows: np.ndarray    # [R] int32 token index of each sampling chunk's last token
    sample_slots: np.ndarray   # [R] int32 batch slot of each sampling chunk
    num_context_tokens: int    # keys attention reads over all sequences (bandwidth figures)


def sampling_row(params, seed: int) -> tuple[tuple[float, ...], tuple[int, int, int]]:
    """A request's fixed sampler parameters: the F_* columns and (top_k, num_logprobs, seed)."""
    seed &= _MASK64
    return ((params.temperature, params.top_p, params.min_p, params.repetition_penalty,
             params.frequency_penalty, params.presence_penalty),
            (params.top_k, -1 if params.logprobs is None else params.logprobs,
             seed - (1 << 64) if seed & _SIGN64 else seed))


def ban_ids(params, eos_token_ids) -> list[int]:
    """Ids set to -inf while fewer than min_tokens tokens are generated."""
    return [*(() if params.ignore_eos else eos_token_ids), *params.stop_token_ids]


class InputBatch:
    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int,
                 eos_token_ids: tuple[int, ...] = ()):
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.eos_token_ids = tuple(eos_token_ids)
        # np.zeros: pages of rows never used are never touched (calloc)
        self.token_ids = np.zeros((max_num_seqs, max_model_len), np.int32)
        self.num_tokens = np.zeros(max_num_seqs, np.int32)
        self.num_prompt_tokens = np.zeros(max_num_seqs, np.int32)
        self.block_table = np.zeros((max_num_seqs, self.max_blocks), np.int32)
        self.num_blocks = [0] * max_num_seqs
        self.fparams = np.zeros((max_num_seqs, NUM_F), np.float32)
        self.iparams = np.zeros((max_num_seqs, NUM_I), np.int64)
        # penalty context of a slot: token_ids[slot, ctx_start:...] (0: prompt + output, P: output only)
        self.ctx_from_prompt = np.zeros(max_num_seqs, bool)     # repetition penalty: prompt too
        self.ctx_outputs = np.zeros(max_num_seqs, bool)         # any penalty: the outputs
        self.min_tokens = np.zeros(max_num_seqs, np.int32)
        self._ban_ids: list[list[int]] = [[] for _ in range(max_num_seqs)]
        self.slot_of: dict[str, int] = {}                       # request id -> slot
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))   # pop() takes the lowest
        self._row_offsets = np.arange(max_num_seqs, dtype=np.int64) * max_model_len

    @property
    def num_reqs(self) -> int:
        return len(self.slot_of)

    # ---- deltas ---------------------------------------------------------------------------

    def remove(self, request_id: str) -> None:
        """Free a request's slot (unknown ids are ignored: e.g. one preempted, then aborted)."""
        slot = self.slot_of.pop(request_id, None)
        if slot is not None:
            self.num_blocks[slot] = 0
            self._free_slots.append(slot)

    def add(self, request, block_ids: list[int]) -> int:
        """Give request a slot holding its tokens, block table and sampling parameters."""
        assert request.request_id not in self.slot_of, f"{request.request_id!r} is already in the batch"
        slot = self._free_slots.pop()
        self.slot_of[request.request_id] = slot
        tokens = request.all_token_ids
        n = len(tokens)
        assert n <= self.max_model_len, f"{request} is longer than max_model_len {self.max_model_len}"
        self.token_ids[slot, :n] = tokens
        self.num_tokens[slot] = n
        self.num_prompt_tokens[slot] = request.num_prompt_tokens
        self.num_blocks[slot] = 0
        self.append_blocks(slot, block_ids)
        p = request.sampling_params
        self.fparams[slot], (top_k, num_logprobs, seed) = sampling_row(p, request.seed)
        self.iparams[slot, I_TOP_K], self.iparams[slot, I_NUM_LOGPROBS] = top_k, num_logprobs
        self.iparams[slot, I_SEED] = seed
        self.ctx_from_prompt[slot] = p.repetition_penalty != 1.0
        self.ctx_outputs[slot] = (p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0
                                  or p.presence_penalty != 0.0)
        self.min_tokens[slot] = p.min_tokens
        self._ban_ids[slot] = ban_ids(p, getattr(request, "eos_token_ids", None) or self.eos_token_ids)
        return slot

    def append_blocks(self, slot: int, block_ids: list[int]) -> None:
        if block_ids:
            n = self.num_blocks[slot]
            self.block_table[slot, n:n + len(block_ids)] = block_ids
            self.num_blocks[slot] = n + len(block_ids)

    def append_sampled(self, slots: np.ndarray, token_ids: np.ndarray) -> None:
        """Each slot's newly sampled token joins its row (the scheduler appends the same
        token to the request, unless the request stopped and leaves the batch)."""
        if len(slots):
            ends = self.num_tokens[slots]
            room = ends < self.max_model_len      # a request at max_model_len has finished
            self.token_ids[slots[room], ends[room]] = token_ids[room]
            self.num_tokens[slots[room]] = ends[room] + 1

    # ---- one step -------------------------------------------------------------------------

    def prepare(self, sched_out: SchedulerOutput) -> StepArrays:
        """Apply the step's deltas, then gather its flat arrays (see the module docstring)."""
        for rid in sched_out.finished_req_ids:
            self.remove(rid)
        for rid in sched_out.preempted_req_ids:
            self.remove(rid)
        slot_of = self.slot_of
        chunks = sched_out.chunks
        slots, starts, counts, samples = [], [], [], []
        for c in chunks:
            if c.is_new:
                slot = self.add(c.request, c.new_block_ids)
            else:
                slot = slot_of[c.request.request_id]
                if c.new_block_ids:
                    self.append_blocks(slot, c.new_block_ids)
            slots.append(slot)
            starts.append(c.start)
            counts.append(c.num_new_tokens)
            samples.append(c.sample)
        seq_slot = np.array(slots, np.int32)
        start = np.array(starts, np.int32)
        B = self.block_size
        num_tokens = sched_out.num_tokens
        if num_tokens == len(chunks):           # one token per sequence (decode)
            tok_seq, positions = seq_slot, start
            last = np.arange(num_tokens, dtype=np.int32)
            num_context = int(start.sum()) + num_tokens
        else:
            count = np.array(counts, np.int32)
            last = np.cumsum(count, dtype=np.int32) - 1
            tok_seq = np.repeat(seq_slot, count)
            # position of token t = start of its chunk + (t - index of the chunk's first token)
            positions = np.arange(num_tokens, dtype=np.int32) + np.repeat(start - (last + 1 - count), count)
            num_context = int(start.sum()) + num_tokens
        sample = np.array(samples, bool)
        return StepArrays(
            token_ids=self.token_ids[tok_seq, positions],
            positions=positions,
            slot_mapping=self.block_table[tok_seq, positions // B].astype(np.int64) * B + positions % B,
            tok_seq=tok_seq, block_tables=self.block_table,
            logits_rows=last[sample], sample_slots=seq_slot[sample], num_context_tokens=num_context)

    def sampling_arrays(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(fparams [R, NUM_F], iparams [R, NUM_I], context token ids, banned ids) for
        _sampler.sample over the given slots. The penalty context is the flat view of
        token_ids itself; each row's offsets pick its part of its slot's row."""
        fparams = self.fparams[slots]
        iparams = self.iparams[slots]
        n = self.num_tokens[slots]
        prompt = self.num_prompt_tokens[slots]
        base = self._row_offsets[slots]
        steps = n - prompt
        iparams[:, I_STEP] = steps
        iparams[:, I_TOK_START] = base + np.where(self.ctx_from_prompt[slots], 0, prompt)
        iparams[:, I_TOK_PROMPT_END] = base + prompt
        iparams[:, I_TOK_END] = base + np.where(self.ctx_outputs[slots], n, prompt)
        banned_ids = _NO_IDS
        banning = steps < self.min_tokens[slots]
        if banning.any():
            banned: list[int] = []
            for row in np.flatnonzero(banning).tolist():
                iparams[row, I_BAN_START] = len(banned)
                banned.extend(self._ban_ids[int(slots[row])])
                iparams[row, I_BAN_END] = len(banned)
            banned_ids = np.array(banned, np.int32) if banned else _NO_IDS
        return fparams, iparams, self.token_ids.reshape(-1), banned_ids
