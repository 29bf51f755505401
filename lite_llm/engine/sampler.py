"""Sampler: last-position logits of a step -> one SampleResult per sequence.

Python only hands over a few flat parameter arrays; the work (penalties, min_tokens bans,
temperature, top_k/top_p/min_p, the seeded draw and raw logprobs) is one nogil call into
lite_llm.engine._sampler, parallel over sequences. The order of operations and the random
draw are documented there.

The engine's runner takes those arrays from its persistent batch (input_batch.py, updated in
place, and run()); sample() builds them from scratch out of a list of requests: the plain
reference the persistent path is tested against, and the way tests drive the kernel.
A request's logit_bias is added to its row first (add_logit_bias), so its logprobs are those
of the biased distribution. A structured-output row's grammar bitmask (structured.py) is
applied inside the compiled call, before everything else.
"""
from __future__ import annotations

import time

import numpy as np

from lite_llm.engine import _sampler
from lite_llm.engine.input_batch import I_NUM_LOGPROBS, NUM_F, NUM_I, ban_ids, sampling_row
from lite_llm.engine.request import SampleResult

_NO_IDS = np.zeros(0, np.int32)
_F32 = np.dtype(np.float32)
_new_tuple = tuple.__new__


class Sampler:
    """Owns the per-thread scratch ([T, V] each, grown once) so steps never allocate it."""

    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...], num_threads: int | None = None):
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.num_threads = max(1, num_threads or _sampler.max_threads())
        self._rows = 0
        self._scratch_w = self._scratch_count = self._scratch_raw = None
        self.last_kernel_seconds = 0.0     # of the latest run(): the compiled part alone
        self.last_tokens = _NO_IDS         # [S] int32 tokens of the latest run()
        self._out_token, self._out_logprob, self._out_rank = _NO_IDS, np.zeros(0, np.float32), _NO_IDS
        self._no_top = (np.empty((0, 0), np.int32), np.empty((0, 0), np.float32))
        self._plain: tuple = (-1, ())      # (rows, output views) of the latest run without top logprobs
        self._bound = None                 # (arguments, their _sampler.PreparedSample) of the latest prepare()
        self._prepared = None              # (PreparedSample, output arrays, max logprobs, iparams) to run

    def _scratch(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if rows > self._rows:
            self._scratch_w = np.empty((rows, self.vocab_size), np.float32)
            self._scratch_count = np.zeros((rows, self.vocab_size), np.int32)  # kernel keeps it zero
            self._scratch_raw = np.empty((rows, self.vocab_size), np.float32)
            self._rows = rows
        return self._scratch_w, self._scratch_count, self._scratch_raw

    def _outputs(self, rows: int, k: int) -> tuple[np.ndarray, ...]:
        """Output arrays for rows sequences and k top logprobs: views of buffers kept across
        steps (the caller reads them before the next run)."""
        if rows > len(self._out_token):
            size = max(rows, 2 * len(self._out_token))
            self._out_token = np.empty(size, np.int32)
            self._out_logprob = np.empty(size, np.float32)
            self._out_rank = np.empty(size, np.int32)
            self._no_top = (np.empty((size, 0), np.int32), np.empty((size, 0), np.float32))
            self._plain = (-1, ())
        if k:
            return (self._out_token[:rows], self._out_logprob[:rows], self._out_rank[:rows],
                    np.empty((rows, k), np.int32), np.empty((rows, k), np.float32))
        # no top logprobs (most steps): the latest row count's views, kept
        num, views = self._plain
        if num != rows:
            views = (self._out_token[:rows], self._out_logprob[:rows], self._out_rank[:rows],
                     self._no_top[0][:rows], self._no_top[1][:rows])
            self._plain = rows, views
        return views

    def sample(self, logits: np.ndarray,    # IN/OUT [S, V] float32, overwritten
               requests: list,
               bitmask: np.ndarray | None = None,     # IN [M, ceil(V / 32)] int32 grammar masks
               mask_rows: np.ndarray | None = None,   # IN [S] int32 row of bitmask per request, -1 none
               ) -> list[SampleResult]:
        """One token per request; request i owns logits[i]. Each request has .sampling_params,
        .prompt_token_ids, .output_token_ids and .seed."""
        add_logit_bias(logits, requests)
        return self.run(logits, *self.build_params(requests), bitmask=bitmask, mask_rows=mask_rows)

    def build_params(self, requests: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(fparams [S, NUM_F], iparams [S, NUM_I], context token ids, banned ids) of requests,
        from scratch: contexts and bans concatenated in request order."""
        num_seqs = len(requests)
        fparams = np.empty((num_seqs, NUM_F), np.float32)   # columns: see _sampler F_*
        iparams = np.zeros((num_seqs, NUM_I), np.int64)     # columns: see _sampler I_*
        context: list[list[int]] = []                       # penalty context, concatenated below
        banned: list[int] = []
        num_context = 0
        for row, req in enumerate(requests):
            p = req.sampling_params
            out = req.output_token_ids
            fparams[row], (top_k, num_logprobs, seed) = sampling_row(p, req.seed)
            start = num_context
            if p.repetition_penalty != 1.0:
                context.append(req.prompt_token_ids)
                num_context += len(req.prompt_token_ids)
            prompt_end = num_context
            if p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
                context.append(out)
                num_context += len(out)
            ban_start = len(banned)
            if len(out) < p.min_tokens:
                banned.extend(ban_ids(p, getattr(req, "eos_token_ids", None) or self.eos_token_ids))
            iparams[row] = (top_k, num_logprobs, seed, len(out), start, prompt_end, num_context,
                            ban_start, len(banned))
        token_ids = np.fromiter((t for ids in context for t in ids), np.int32, num_context) \
            if num_context else _NO_IDS
        banned_ids = np.array(banned, np.int32) if banned else _NO_IDS
        return fparams, iparams, token_ids, banned_ids

    def run(self, logits: np.ndarray,       # IN/OUT [S, V] float32, overwritten
            fparams: np.ndarray,            # IN [S, NUM_F]
            iparams: np.ndarray,            # IN [S, NUM_I]
            token_ids: np.ndarray,          # IN [N] int32 penalty contexts (ranges in iparams)
            banned_ids: np.ndarray,         # IN [M] int32 min_tokens bans (ranges in iparams)
            bitmask: np.ndarray | None = None,     # IN [M, ceil(V / 32)] int32 allowed-token bits
            mask_rows: np.ndarray | None = None,   # IN [S] int32 bitmask row of each row, -1 = none
            any_logprobs: bool = True,      # False: the caller knows no row wants logprobs
            ) -> list[SampleResult]:
        """The compiled sampler over ready parameter arrays; one SampleResult per row."""
        self.prepare(logits, fparams, iparams, token_ids, banned_ids, bitmask, mask_rows, any_logprobs)
        return self.run_prepared()

    def prepare(self, logits: np.ndarray, fparams: np.ndarray, iparams: np.ndarray, token_ids: np.ndarray,
                banned_ids: np.ndarray, bitmask: np.ndarray | None = None, mask_rows: np.ndarray | None = None,
                any_logprobs: bool = True) -> tuple:
        """run()'s arguments (the same), checked and bound for run_prepared(): the engine binds
        them before forward() fills the logits, so that after it one call samples. A steady
        batch binds the same arrays every step: then only their contents are checked again.
        Returns (the bound _sampler.PreparedSample, its sampled tokens [R] int32)."""
        num_seqs = fparams.shape[0]
        # (C-contiguity is the compiled call's own check: its logits are a float[:, ::1])
        if logits.shape != (num_seqs, self.vocab_size) or logits.dtype != _F32:
            raise ValueError(f"Sampler.sample: logits {logits.dtype} {logits.shape}, "
                             f"want C-contiguous float32 {(num_seqs, self.vocab_size)}")
        max_logprobs = -1          # no row wants logprobs
        if num_seqs and any_logprobs:
            max_logprobs = int(iparams[:, I_NUM_LOGPROBS].max())
        k = max(max_logprobs, 0)
        outputs = self._outputs(num_seqs, k)
        threads = min(self.num_threads, max(num_seqs, 1))
        scratch = self._scratch(threads)
        args = (logits, fparams, iparams, token_ids, banned_ids, *outputs, *scratch, threads, bitmask, mask_rows)
        bound = self._bound
        if bound is not None and len(bound[0]) == len(args) and all(a is b for a, b in zip(args, bound[0])):
            bound[1].check()
        else:
            self._bound = bound = (args, _sampler.PreparedSample(*args))
        self._prepared = (bound[1], outputs, max_logprobs, iparams)
        return bound[1], outputs[0]

    def run_prepared(self) -> list[SampleResult]:
        """Sample with what prepare() bound; one SampleResult per row."""
        call, (out_token, out_logprob, out_rank, out_top_ids, out_top_logprobs), max_logprobs, iparams = \
            self._prepared
        start = time.perf_counter()
        call.run()
        self.last_kernel_seconds = time.perf_counter() - start
        self.last_tokens = out_token
        tokens = out_token.tolist()
        if max_logprobs < 0:
            # tuple.__new__ skips the NamedTuple's Python-level __new__ (a frame per row)
            return [_new_tuple(SampleResult, (t, None, None, None)) for t in tokens]
        results = []
        for row, n in enumerate(iparams[:, I_NUM_LOGPROBS].tolist()):
            if n < 0:
                results.append(SampleResult(tokens[row]))
            else:
                top = list(zip(out_top_ids[row, :n].tolist(), out_top_logprobs[row, :n].tolist()))
                results.append(SampleResult(tokens[row], float(out_logprob[row]), top, int(out_rank[row])))
        return results

    def verify(self, logits: np.ndarray,     # IN/OUT [R, V] float32, overwritten
               seq_rows: np.ndarray,         # IN [S + 1] int32 sequence s owns rows seq_rows[s]..seq_rows[s+1]-1
               draft_ids: np.ndarray,        # IN [R] int32 the drafted token each row verifies
               fparams: np.ndarray, iparams: np.ndarray, token_ids: np.ndarray, banned_ids: np.ndarray,
               bitmask: np.ndarray | None = None, mask_rows: np.ndarray | None = None) -> list:
        """Speculative decoding's compiled verifier (_sampler.verify) over ready parameter
        arrays: per sequence a SampleResult if it has one row, else a list of them (the
        accepted drafts, then the token drawn after them). last_counts [S] holds how many
        tokens each sequence got, last_tokens [R] the tokens from each sequence's first row."""
        num_rows, num_seqs = logits.shape[0], fparams.shape[0]
        if logits.dtype != np.float32 or logits.ndim != 2 or logits.shape[1] != self.vocab_size \
                or not logits.flags.c_contiguous or len(seq_rows) != num_seqs + 1:
            raise ValueError(f"Sampler.verify: logits {logits.dtype} {logits.shape} for {num_seqs} "
                             f"sequences, want C-contiguous float32 [R, {self.vocab_size}]")
        num_logprobs = iparams[:, I_NUM_LOGPROBS]
        max_logprobs = int(num_logprobs.max()) if num_seqs else -1
        k = max(max_logprobs, 0)
        out_token, out_logprob, out_rank, out_top_ids, out_top_logprobs = self._outputs(num_rows, k)
        out_num = np.zeros(num_seqs, np.int32)
        threads = min(self.num_threads, max(num_seqs, 1))
        scratch = self._scratch(threads)
        start = time.perf_counter()
        _sampler.verify(logits, seq_rows, draft_ids, fparams, iparams, token_ids, banned_ids, out_token, out_num,
                        out_logprob, out_rank, out_top_ids, out_top_logprobs, *scratch, threads, bitmask, mask_rows)
        self.last_kernel_seconds = time.perf_counter() - start
        self.last_tokens, self.last_counts = out_token, out_num
        tokens = out_token.tolist()
        results: list = []
        for seq, (lo, hi, n) in enumerate(zip(seq_rows[:-1].tolist(), seq_rows[1:].tolist(), out_num.tolist())):
            lp = int(num_logprobs[seq])
            if lp < 0:
                one = [SampleResult(t) for t in tokens[lo:lo + n]]
            else:
                one = [SampleResult(tokens[r], float(out_logprob[r]),
                                    list(zip(out_top_ids[r, :lp].tolist(), out_top_logprobs[r, :lp].tolist())),
                                    int(out_rank[r])) for r in range(lo, lo + n)]
            results.append(one if hi - lo > 1 else one[0])
        return results


def add_logit_bias(logits: np.ndarray, requests) -> None:
    """Each request's logit_bias added to its row of logits ([S, V], row i is requests[i]):
    before penalties and filters, as OpenAI and vLLM apply it; ids past the vocabulary ignored."""
    for row, req in enumerate(requests):
        bias = req.sampling_params.logit_bias
        if bias:
            ids = np.fromiter(bias.keys(), np.int64, len(bias))
            keep = ids < logits.shape[1]
            logits[row, ids[keep]] += np.fromiter(bias.values(), np.float32, len(bias))[keep]
