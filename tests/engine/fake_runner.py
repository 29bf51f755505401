"""FakeRunner: a model runner without a model, that checks the KV bookkeeping it is given.

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

from lite_llm.engine.request import SampleResult
from lite_llm.engine.scheduler import SchedulerOutput


def next_token(token_ids: list[int], seed: int | None, vocab_size: int) -> int:
    h = hashlib.blake2b(np.asarray(token_ids, dtype=np.int64).tobytes(), digest_size=8)
    if seed is not None:
        h.update(seed.to_bytes(8, "little", signed=False))
    return int.from_bytes(h.digest(), "little") % vocab_size


class FakeRunner:
    def __init__(self, num_blocks: int, block_size: int, vocab_size: int = 50,
                 max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.kv_token = np.full(num_blocks * block_size, -1, np.int64)   # [num_blocks * B]
        self.kv_pos = np.full(num_blocks * block_size, -1, np.int64)     # [num_blocks * B]
        self.num_steps = 0
        self.num_tokens_computed = 0
        self.num_partial_prefills = 0       # chunks that did not reach the end of the sequence
        self.max_step_tokens = 0
        self.max_step_seqs = 0

    def _slots(self, block_ids: list[int], start: int, end: int) -> np.ndarray:
        table = np.asarray(block_ids, np.int64)
        pos = np.arange(start, end)
        assert end <= len(block_ids) * self.block_size, "block table too short for the chunk"
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, sched_out: SchedulerOutput) -> list[SampleResult | None]:
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

        written: set[int] = set()
        for c in chunks:                                   # 1. write every new token's KV
            tokens = c.request.all_token_ids
            end = c.start + c.num_new_tokens
            assert c.num_new_tokens > 0 and end <= len(tokens)
            assert all(0 <= b < self.num_blocks for b in c.block_ids), "block id out of range"
            assert len(set(c.block_ids)) == len(c.block_ids), "block twice in one table"
            slots = self._slots(c.block_ids, c.start, end)
            assert written.isdisjoint(slots.tolist()), "two chunks write the same slot"
            written.update(slots.tolist())
            self.kv_token[slots] = tokens[c.start:end]
            self.kv_pos[slots] = np.arange(c.start, end)
        results: list[SampleResult | None] = []
        for c in chunks:                                   # 2. attend over the whole context
            tokens = c.request.all_token_ids
            end = c.start + c.num_new_tokens
            slots = self._slots(c.block_ids, 0, end)
            np.testing.assert_array_equal(self.kv_token[slots], tokens[:end],
                                          err_msg=f"KV of {c.request.request_id} is wrong")
            np.testing.assert_array_equal(self.kv_pos[slots], np.arange(end))
            if not c.sample:
                assert end < len(tokens)
                self.num_partial_prefills += 1
                results.append(None)
                continue
            assert end == len(tokens)
            params = c.request.sampling_params
            token = next_token(tokens, None if params.temperature == 0 else c.request.seed,
                               self.vocab_size)
            logprob = -float(token % 7) / 8
            top = [(token, logprob), ((token + 1) % self.vocab_size, logprob - 1.0)]
            results.append(SampleResult(token, logprob, top if params.logprobs else None))
        return results
