"""FakeRunner: a model runner without a model, that checks the KV bookkeeping it is given.

It keeps the real runner's persistent batch (InputBatch) from the scheduler's deltas and
writes/reads its fake KV through that batch's step arrays and block table rows, so every
engine and scheduler test drives the delta protocol; check_step_arrays compares those
arrays with a from-scratch rebuild from the KV manager's tables.

Its "KV cache" stores, per slot, the token id and position written there. Each step it
first writes every scheduled token into its slot (as a real runner writes a layer's new KV
before that layer's attention), then checks that every position a chunk attends to
(0 .. start + num_new_tokens - 1) holds exactly that request's token at that position:
a wrong block table, a stale prefix-cache block or a block shared while being rewritten
shows up as a mismatch. The next token is a pure function of the sequence's tokens (and
seed when sampling is random), so batching, chunking, preemption and cache hits must not
change any output.
"""
from __future__ import annotations

import hashlib

import numpy as np

from lite_llm.engine.input_batch import (I_BAN_END, I_BAN_START, I_NUM_LOGPROBS, I_SEED, I_STEP, I_TOK_END,
                                        I_TOK_PROMPT_END, I_TOK_START, I_TOP_K, InputBatch, StepArrays)
from lite_llm.engine.request import SampleResult
from lite_llm.engine.runner_output import RunnerOutput
from lite_llm.engine.sampler import Sampler
from lite_llm.engine.scheduler import SchedulerOutput


def next_token(token_ids: list[int], seed: int | None, vocab_size: int) -> int:
    h = hashlib.blake2b(np.asarray(token_ids, dtype=np.int64).tobytes(), digest_size=8)
    if seed is not None:
        h.update((seed & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))    # as the sampler: a negative seed too
    return int.from_bytes(h.digest(), "little") % vocab_size


class FakeRunner:
    steady_decode = None     # no compiled steady step (engine.Runner)

    def __init__(self, num_blocks: int, block_size: int, vocab_size: int = 50,
                 max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
                 max_model_len: int | None = None):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        # the real runner's persistent batch: its deltas and step arrays are what is checked here
        self.batch = InputBatch(max_num_seqs or 256, max_model_len or num_blocks * block_size, block_size,
                                max_num_batched_tokens=max_num_batched_tokens)
        self.last_arrays: StepArrays | None = None
        self.last_sampling: tuple | None = None
        self.kv_token = np.full(num_blocks * block_size, -1, np.int64)   # [num_blocks * B]
        self.kv_pos = np.full(num_blocks * block_size, -1, np.int64)     # [num_blocks * B]
        self.num_steps = 0
        self.num_tokens_computed = 0
        self.num_partial_prefills = 0       # chunks that did not reach the end of the sequence
        self.max_step_tokens = 0
        self.max_step_seqs = 0
        self.step_cost = (0.0, 0)           # (kernel seconds, bytes read) each step reports

    def _slots(self, slot: int, start: int, end: int) -> np.ndarray:
        """KV slots of positions start..end-1 through the batch's block table row."""
        num_blocks = self.batch.num_blocks[slot]
        table = self.batch.block_table[slot, :num_blocks].astype(np.int64)
        assert end <= num_blocks * self.block_size, "block table too short for the chunk"
        pos = np.arange(start, end)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, sched_out: SchedulerOutput) -> RunnerOutput:
        chunks = sched_out.chunks
        assert chunks, "an empty step was sent to the runner"
        assert sched_out.num_tokens == sum(c.num_new_tokens for c in chunks)
        if self.max_num_batched_tokens is not None:
            assert sched_out.num_tokens <= self.max_num_batched_tokens, "token budget exceeded"
        if self.max_num_seqs is not None:
            assert len(chunks) <= self.max_num_seqs, "max_num_seqs exceeded"
        ids = [c.request.request_id for c in chunks]
        assert len(ids) == len(set(ids)), "a request scheduled twice in one step"
        self.num_steps += 1
        self.num_tokens_computed += sched_out.num_tokens
        self.max_step_tokens = max(self.max_step_tokens, sched_out.num_tokens)
        self.max_step_seqs = max(self.max_step_seqs, len(chunks))
        a = self.last_arrays = self.batch.prepare(sched_out)

        # 1. write every new token's KV where the step arrays say
        assert len(set(a.slot_mapping.tolist())) == len(a.slot_mapping), "two tokens write the same slot"
        self.kv_token[a.slot_mapping] = a.token_ids
        self.kv_pos[a.slot_mapping] = a.positions
        # what the sampler gets (parameter copies: the batch's rows move on when tokens are
        # appended; the context ranges keep reading the same tokens)
        fp, ip, ctx, banned = self.batch.sampling_arrays(a.sample_slots, a.sample_slots_are_prefix)
        self.last_sampling = (fp.copy(), ip.copy(), ctx, banned)
        results: list[SampleResult | None] = []
        sampled_tokens = []
        for c in chunks:                                   # 2. attend over the whole context
            tokens = c.request.all_token_ids
            end = c.start + c.num_new_tokens
            assert c.num_new_tokens > 0 and end <= len(tokens)
            slot = self.batch.slot_of[c.request.request_id]
            row = self.batch.block_table[slot, :self.batch.num_blocks[slot]].tolist()
            assert all(0 <= b < self.num_blocks for b in row), "block id out of range"
            assert len(set(row)) == len(row), "block twice in one table"
            slots = self._slots(slot, 0, end)
            np.testing.assert_array_equal(self.kv_token[slots], tokens[:end],
                                          err_msg=f"KV of {c.request.request_id} is wrong")
            np.testing.assert_array_equal(self.kv_pos[slots], np.arange(end))
            if not c.sample:
                assert end < len(tokens)
                self.num_partial_prefills += 1
                results.append(None)
                continue
            assert end == len(tokens)
            results.append(self.sample(c.request, tokens, len(sampled_tokens)))
            sampled_tokens.append(results[-1].token_id)
        self.batch.append_sampled(a.sample_slots, np.array(sampled_tokens, np.int32))
        return RunnerOutput(results, kernel_seconds=self.step_cost[0], bytes_read=self.step_cost[1])


    def sample(self, request, tokens: list[int], row: int) -> SampleResult:
        """The token of request (whose tokens so far are tokens), the step's row-th sampling
        row: a pure function of the tokens (and of the seed when sampling is random)."""
        params = request.sampling_params
        token = next_token(tokens, None if params.temperature == 0 else request.seed, self.vocab_size)
        logprob = -float(token % 7) / 8
        top = [(token, logprob), ((token + 1) % self.vocab_size, logprob - 1.0)]
        return SampleResult(token, logprob, top if params.logprobs else None)


def rebuild_step_arrays(sched_out: SchedulerOutput, block_tables: dict[str, list[int]], block_size: int):
    """The step's forward() arrays built from scratch (per token, from the request's tokens and
    the KV manager's whole block table), with sequence index = chunk index: the reference the
    persistent batch's arrays are compared with."""
    chunks = sched_out.chunks
    T = sum(c.num_new_tokens for c in chunks)
    token_ids = np.empty(T, np.int32)
    positions = np.empty(T, np.int32)
    tok_seq = np.empty(T, np.int32)
    max_blocks = max((len(block_tables[c.request.request_id]) for c in chunks), default=1) or 1
    tables = np.zeros((max(len(chunks), 1), max_blocks), np.int32)
    rows = []
    t = 0
    for s, c in enumerate(chunks):
        n, start = c.num_new_tokens, c.start
        token_ids[t:t + n] = c.request.all_token_ids[start:start + n]
        positions[t:t + n] = np.arange(start, start + n, dtype=np.int32)
        tok_seq[t:t + n] = s
        table = block_tables[c.request.request_id]
        tables[s, :len(table)] = table
        t += n
        if c.sample:
            rows.append(t - 1)
    slot_mapping = tables[tok_seq, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return token_ids, positions, slot_mapping, tok_seq, tables, np.asarray(rows, np.int32)


def check_step_arrays(batch: InputBatch, a: StepArrays, sampling_arrays: tuple, sched_out: SchedulerOutput,
                      block_tables: dict[str, list[int]]) -> None:
    """The persistent batch's step arrays equal a from-scratch rebuild; its rows hold exactly
    each request's tokens and block table; its sampler arrays pick the same parameters and
    penalty contexts as Sampler.build_params does from the requests."""
    token_ids, positions, slot_mapping, tok_seq, tables, rows = rebuild_step_arrays(
        sched_out, block_tables, batch.block_size)
    np.testing.assert_array_equal(a.token_ids, token_ids)
    np.testing.assert_array_equal(a.positions, positions)
    np.testing.assert_array_equal(a.slot_mapping, slot_mapping)
    np.testing.assert_array_equal(a.logits_rows, rows)
    assert a.token_ids.dtype == np.int32 and a.positions.dtype == np.int32 and a.tok_seq.dtype == np.int32
    assert a.slot_mapping.dtype == np.int64 and a.logits_rows.dtype == np.int32
    assert a.block_tables is batch.block_table and a.block_tables.flags.c_contiguous
    chunk_slots = [batch.slot_of[c.request.request_id] for c in sched_out.chunks]
    for s, slot in enumerate(chunk_slots):          # forward() reads rows by slot, not chunk index
        np.testing.assert_array_equal(a.tok_seq[tok_seq == s], slot)
        table = block_tables[sched_out.chunks[s].request.request_id]
        np.testing.assert_array_equal(a.block_tables[slot, :len(table)], table)
    assert len(set(chunk_slots)) == len(chunk_slots)
    sampling = [c.request for c in sched_out.chunks if c.sample]
    np.testing.assert_array_equal(a.sample_slots, [batch.slot_of[r.request_id] for r in sampling])
    if a.sample_slots_are_prefix:
        np.testing.assert_array_equal(a.sample_slots, np.arange(len(sampling)))
    fp, ip, ctx, banned = sampling_arrays
    ref = Sampler(50, batch.eos_token_ids, num_threads=1).build_params(sampling)
    np.testing.assert_array_equal(fp, ref[0])
    np.testing.assert_array_equal(ip[:, [I_TOP_K, I_NUM_LOGPROBS, I_SEED, I_STEP]],
                                  ref[1][:, [I_TOP_K, I_NUM_LOGPROBS, I_SEED, I_STEP]])
    for row in range(len(sampling)):       # the same context and bans, wherever they sit
        for lo, hi in ((I_TOK_START, I_TOK_PROMPT_END), (I_TOK_PROMPT_END, I_TOK_END)):
            np.testing.assert_array_equal(ctx[ip[row, lo]:ip[row, hi]], ref[2][ref[1][row, lo]:ref[1][row, hi]])
        np.testing.assert_array_equal(banned[ip[row, I_BAN_START]:ip[row, I_BAN_END]],
                                      ref[3][ref[1][row, I_BAN_START]:ref[1][row, I_BAN_END]])


def check_batch_rows(batch: InputBatch, requests: list) -> None:
    """Between steps: the batch holds a row for each given request, equal to its tokens."""
    for req in requests:
        slot = batch.slot_of[req.request_id]
        n = batch.num_tokens[slot]
        assert n == req.num_tokens, f"{req}: batch row has {n} tokens"
        np.testing.assert_array_equal(batch.token_ids[slot, :n], req.all_token_ids)
