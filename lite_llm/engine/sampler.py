"""Sampler: last-position logits of a step -> one SampleResult per sequence.

Python only gathers each request's parameters and penalty context into a few flat arrays;
the work (penalties, min_tokens bans, temperature, top_k/top_p/min_p, the seeded draw and
raw logprobs) is one nogil call into lite_llm.engine._sampler, parallel over sequences.
The order of operations and the random draw are documented there. A request's logit_bias is
added to its row here, first, so its logprobs are those of the biased distribution.
"""
from __future__ import annotations

import numpy as np

from lite_llm.engine import _sampler
from lite_llm.engine.request import SampleResult

_NO_IDS = np.zeros(0, np.int32)
_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63


class Sampler:
    """Owns the per-thread scratch ([T, V] each, grown once) so steps never allocate it."""

    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...], num_threads: int | None = None):
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.num_threads = max(1, num_threads or _sampler.max_threads())
        self._rows = 0
        self._scratch_w = self._scratch_count = self._scratch_raw = None

    def _scratch(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if rows > self._rows:
            self._scratch_w = np.empty((rows, self.vocab_size), np.float32)
            self._scratch_count = np.zeros((rows, self.vocab_size), np.int32)  # kernel keeps it zero
            self._scratch_raw = np.empty((rows, self.vocab_size), np.float32)
            self._rows = rows
        return self._scratch_w, self._scratch_count, self._scratch_raw

    def sample(self, logits: np.ndarray,    # IN/OUT [S, V] float32, overwritten
               requests: list) -> list[SampleResult]:
        """One token per request; request i owns logits[i]. Each request has .sampling_params,
        .prompt_token_ids, .output_token_ids and .seed."""
        num_seqs = len(requests)
        if logits.dtype != np.float32 or logits.ndim != 2 or logits.shape != (num_seqs, self.vocab_size) \
                or not logits.flags.c_contiguous:
            raise ValueError(f"Sampler.sample: logits {logits.dtype} {logits.shape}, "
                             f"want C-contiguous float32 {(num_seqs, self.vocab_size)}")
        fparams = np.empty((num_seqs, 6), np.float32)   # columns: see _sampler F_*
        iparams = np.zeros((num_seqs, 9), np.int64)     # columns: see _sampler I_*
        context: list[list[int]] = []                   # penalty context, concatenated below
        banned: list[int] = []
        num_context = max_logprobs = 0
        for row, req in enumerate(requests):
            p = req.sampling_params
            out = req.output_token_ids
            fparams[row] = (p.temperature, p.top_p, p.min_p, p.repetition_penalty,
                            p.frequency_penalty, p.presence_penalty)
            num_logprobs = -1 if p.logprobs is None else p.logprobs
            max_logprobs = max(max_logprobs, num_logprobs)
            seed = req.seed & _MASK64
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
                eos = () if p.ignore_eos else (getattr(req, "eos_token_ids", None) or self.eos_token_ids)
                banned.extend(eos)
                banned.extend(p.stop_token_ids)
            iparams[row] = (p.top_k, num_logprobs, seed - (1 << 64) if seed & _SIGN64 else seed,
                            len(out), start, prompt_end, num_context, ban_start, len(banned))
        token_ids = np.fromiter((t for ids in context for t in ids), np.int32, num_context) \
            if num_context else _NO_IDS
        banned_ids = np.array(banned, np.int32) if banned else _NO_IDS
        k = max(max_logprobs, 0)
        out_token = np.empty(num_seqs, np.int32)
        out_logprob = np.empty(num_seqs, np.float32)
        out_rank = np.empty(num_seqs, np.int32)
        out_top_ids = np.empty((num_seqs, k), np.int32)
        out_top_logprobs = np.empty((num_seqs, k), np.float32)
        for row, req in enumerate(requests):
            bias = req.sampling_params.logit_bias
            if bias:                    # before penalties and filters, as OpenAI and vLLM apply it
                ids = np.fromiter(bias.keys(), np.int64, len(bias))
                keep = ids < self.vocab_size
                logits[row, ids[keep]] += np.fromiter(bias.values(), np.float32, len(bias))[keep]
        threads = min(self.num_threads, max(num_seqs, 1))
        _sampler.sample(logits, fparams, iparams, token_ids, banned_ids, out_token, out_logprob,
                        out_rank, out_top_ids, out_top_logprobs, *self._scratch(threads), threads)

        results = []
        tokens = out_token.tolist()
        for row, req in enumerate(requests):
            n = req.sampling_params.logprobs
            if n is None:
                results.append(SampleResult(tokens[row]))
            else:
                top = list(zip(out_top_ids[row, :n].tolist(), out_top_logprobs[row, :n].tolist()))
                results.append(SampleResult(tokens[row], float(out_logprob[row]), top, int(out_rank[row])))
        return results
