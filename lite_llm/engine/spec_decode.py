"""Speculative decoding's proposers: the drafts each sampling sequence offers the next step.

After a step's tokens are sampled (and drafts verified), the runner asks its proposer for up
to k drafted tokens per sequence that just sampled; the scheduler then verifies them in the
next step's one forward call (k + 1 tokens per sequence, scheduler.py) and the compiled
sampler accepts or rejects them (_sampler.verify: rejection sampling, so outputs keep the
target's distribution, and greedy outputs are token-identical to decoding without drafts).

    NgramProposer       prompt lookup (vLLM's "ngram"): the tokens that followed the latest
                        earlier occurrence of the sequence's last n tokens; one compiled call
    DraftModelProposer  a small model of the same vocabulary, with its own KV cache in the
                        target's block layout (same block ids), run by the same engine thread;
                        it drafts greedily, so its proposals are point masses like the n-gram's

Requests whose sampling the verifier cannot reproduce row by row get no drafts and decode as
usual: repetition/frequency/presence penalties, logit_bias, structured outputs, and rows still
short of min_tokens.

What does not live here: scheduling the drafts (scheduler.py), verifying them (_sampler.pyx),
the config (config.SpeculativeConfig).
"""
from __future__ import annotations

import numpy as np

from lite_llm.engine import _batch
from lite_llm.engine.input_batch import step_buffers
from lite_llm.model.loader import load_model


def can_draft(request) -> bool:
    """Whether request's next tokens may be drafted (see the module docstring)."""
    p = request.sampling_params
    return (p.repetition_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0
            and not p.logit_bias and p.structured_outputs is None
            and request.num_output_tokens + 1 >= p.min_tokens)


class NgramProposer:
    def __init__(self, spec_config, max_num_seqs: int):
        self.k = spec_config.num_speculative_tokens
        self.min_n = spec_config.prompt_lookup_min
        self.max_n = spec_config.prompt_lookup_max
        self._drafts = np.zeros((max_num_seqs, self.k), np.int32)   # [S, k]
        self._num = np.zeros(max_num_seqs, np.int32)                # [S]

    def propose(self, batch, requests: list, slots: np.ndarray, sched_out=None) -> dict[str, list[int]]:
        """Drafts for requests (in batch slots `slots`, rows already holding this step's tokens)."""
        max_drafts = np.array([self.k if can_draft(r) else 0 for r in requests], np.int32)
        _batch.ngram_propose(batch.token_ids, batch.num_tokens, slots, max_drafts, self.min_n, self.max_n,
                             self._drafts, self._num)
        out = {}
        for i, (request, n) in enumerate(zip(requests, self._num[:len(requests)].tolist())):
            if n:
                out[request.request_id] = self._drafts[i, :n].tolist()
        return out


class DraftModelProposer:
    """A small model drafts greedily. Its KV cache has the target's geometry (num_blocks x
    block_size) and is addressed through the target's block tables, so the scheduler's
    allocation, prefix caching and preemption hold for both; the scheduler reserves k
    lookahead slots per sampling chunk for the drafts' KV.

    Per request it tracks how far its draft KV is written; after the target's step the
    positions below min(that, the target's computed tokens) match the real tokens. Each step first catches the draft up over the step's tokens (a prefill chunk's, or the
    verified ones: one or two per decoding sequence) in one forward call, whose last rows
    give the first drafts, then runs k - 1 one-token forward calls for the rest. Drafted
    positions become valid only as far as the target accepts them. (A prefix-cache hit
    trusts the draft KV of the cached blocks; if a block's last position was never written
    by the draft, only the acceptance rate suffers, never the output.)"""

    def __init__(self, spec_config, runner, max_num_seqs: int):
        self.k = spec_config.num_speculative_tokens
        self.runner = runner                        # the draft's ModelRunner (weights, KV, workspace)
        self.block_size = runner.block_size
        self.max_model_len = runner.max_model_len
        # request id -> the draft's KV is written below this position: the real tokens' up to
        # the newest, then the drafts' (valid as far as the target accepts them)
        self._written: dict[str, int] = {}
        (self._token_ids, self._positions, self._slot_mapping, self._tok_seq, self._logits_rows,
         self._sample_slots) = step_buffers(runner.max_num_batched_tokens, max_num_seqs)

    def propose(self, batch, requests: list, slots: np.ndarray, sched_out) -> dict[str, list[int]]:
        for rid in (*sched_out.finished_req_ids, *sched_out.preempted_req_ids):
            self._written.pop(rid, None)
        bs = self.block_size
        chunk_slots, starts, counts, samples, drafting = [], [], [], [], []
        for c in sched_out.chunks:
            req = c.request
            rid = req.request_id
            slot = batch.slot_of.get(rid)
            if slot is None:
                continue
            num_tokens = int(batch.num_tokens[slot])
            # after this step: the target's KV is computed below `computed`; the draft's is
            # valid below what it wrote that the target accepted
            computed = num_tokens - 1 if c.sample else c.start + c.num_new_tokens
            valid = c.start if c.is_new else min(self._written.get(rid, c.start), computed)
            end = num_tokens if c.sample else computed           # a sampling chunk feeds its new token
            end = min(end, batch.num_blocks[slot] * bs)          # no slot yet: catch up next time
            capacity = batch.num_blocks[slot] * bs
            self._written[rid] = max(end, valid)
            if end <= valid:
                continue
            sample = c.sample and end == num_tokens
            room = min(self.k, capacity - end + 1, self.max_model_len - end) if sample and can_draft(req) else 0
            chunk_slots.append(slot)
            starts.append(valid)
            counts.append(end - valid)
            samples.append(sample)
            if sample:
                drafting.append((rid, slot, end, room))
        if not chunk_slots:
            return {}
        num_tokens, num_rows, _ = _batch.gather_step(
            batch.token_ids, batch.block_table, chunk_slots, starts, counts, samples, bs,
            self._token_ids, self._positions, self._slot_mapping, self._tok_seq,
            self._logits_rows, self._sample_slots)
        logits = self.runner.forward(self._token_ids[:num_tokens], self._positions[:num_tokens],
                                     self._slot_mapping[:num_tokens], self._tok_seq[:num_tokens],
                                     batch.block_table, self._logits_rows[:num_rows])
        first = np.argmax(logits, axis=1).astype(np.int32)        # [R] greedy drafts
        out: dict[str, list[int]] = {}
        live = []                                                 # (rid, slot, next position, room)
        for (rid, slot, end, room), tok in zip(drafting, first.tolist()):
            if room >= 1:
                out[rid] = [tok]
                if room > 1:
                    live.append((rid, slot, end, room))
        step = 1
        while live:
            n = len(live)
            tokens = np.array([out[rid][-1] for rid, *_ in live], np.int32)
            positions = np.array([end + step - 1 for _, _, end, _ in live], np.int32)
            seqs = np.array([slot for _, slot, _, _ in live], np.int32)
            blocks = batch.block_table[seqs, positions // bs].astype(np.int64)
            slot_mapping = blocks * bs + positions % bs
            logits = self.runner.forward(tokens, positions, slot_mapping, seqs, batch.block_table,
                                         np.arange(n, dtype=np.int32))
            nxt = np.argmax(logits, axis=1).tolist()
            step += 1
            keep = []
            for (rid, slot, end, room), tok in zip(live, nxt):
                out[rid].append(tok)
                self._written[rid] = end + step - 1          # drafted KV written below here
                if room > step:
                    keep.append((rid, slot, end, room))
            live = keep
        return out


def make_proposer(spec_config, target_config, *, dtype: str, num_blocks: int, block_size: int,
                  max_num_batched_tokens: int, max_num_seqs: int, num_threads: int, max_model_len: int,
                  kv_cache_dtype: str | None = "auto"):
    """The proposer of a SpeculativeConfig. A draft model is loaded here, on the engine
    thread, and must have the target's vocabulary."""
    if spec_config.method == "ngram":
        return NgramProposer(spec_config, max_num_seqs)
    # the runner (and the kernels it imports) here, not at the top: the assembly imports this
    # module before it configures libgomp's environment (engine/assemble.py)
    from lite_llm.engine.runner import ModelRunner
    loaded = load_model(spec_config.model, dtype=dtype, max_model_len=max_model_len, skip_tokenizer_init=True,
                        progress=False)
    if loaded.config.vocab_size != target_config.vocab_size:
        raise ValueError(f"speculative_config: the draft model {spec_config.model!r} has a vocabulary of "
                         f"{loaded.config.vocab_size} tokens, the target {target_config.vocab_size}: a draft "
                         "model must share the target's tokenizer")
    if loaded.max_model_len < max_model_len:
        raise ValueError(f"speculative_config: the draft model {spec_config.model!r} takes at most "
                         f"{loaded.max_model_len} tokens, fewer than max_model_len={max_model_len}")
    runner = ModelRunner(loaded, num_blocks=num_blocks, block_size=block_size,
                         max_num_batched_tokens=max_num_batched_tokens + max_num_seqs,
                         max_num_seqs=max_num_seqs, num_threads=num_threads, kv_cache_dtype=kv_cache_dtype)
    return DraftModelProposer(spec_config, runner, max_num_seqs)
