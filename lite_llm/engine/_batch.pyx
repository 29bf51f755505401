"""Compiled helpers of the persistent step batch (input_batch.py): a step's flat forward()
arrays gathered from the per-slot rows, and sampled tokens appended to them, in one call
each. A step has a few dozen to a few hundred sequences: numpy would spend more time starting
its dozen small operations (after a forward pass has flushed every cache) than doing them.

Bounds are checked here once per call, with the GIL; the loops trust them.
What does not live here: which requests hold which slot (input_batch.py).
"""
from libc.stdint cimport int32_t, int64_t


def gather_step(const int32_t[:, ::1] token_rows,    # IN  [max_num_seqs, L] token ids per slot
                const int32_t[:, ::1] block_table,   # IN  [max_num_seqs, max_blocks]
                list slots,                          # IN  [S] slot of each chunk
                list starts,                         # IN  [S] first position of each chunk
                list counts,                         # IN  [S] tokens of each chunk
                list samples,                        # IN  [S] whether the chunk samples
                int block_size,
                int32_t[::1] token_ids,              # OUT [>= T]
                int32_t[::1] positions,              # OUT [>= T]
                int64_t[::1] slot_mapping,           # OUT [>= T] KV slot of each token
                int32_t[::1] tok_seq,                # OUT [>= T] slot of each token
                int32_t[::1] logits_rows,            # OUT [>= R] last token of each sampling chunk
                int32_t[::1] sample_slots):          # OUT [>= R] slot of each sampling chunk
    """Fill the step arrays; returns (T tokens, R sampling chunks, keys read by attention)."""
    cdef Py_ssize_t num_seqs = len(slots), seq, i
    cdef Py_ssize_t t = 0, r = 0, context = 0, slot, start, count, pos, blk
    if len(starts) != num_seqs or len(counts) != num_seqs or len(samples) != num_seqs:
        raise ValueError("gather_step: per-chunk lists differ in length")
    for seq in range(num_seqs):
        slot = slots[seq]          # typed lists, no wraparound: direct item reads
        start = starts[seq]
        count = counts[seq]
        if slot < 0 or slot >= token_rows.shape[0] or slot >= block_table.shape[0] or count < 1 \
                or start < 0 or start + count > token_rows.shape[1] \
                or (start + count - 1) // block_size >= block_table.shape[1]:
            raise ValueError(f"gather_step: chunk {seq} (slot {slot}, tokens {start}..{start + count}) "
                             "outside the batch arrays")
        if t + count > token_ids.shape[0] or t + count > positions.shape[0] \
                or t + count > slot_mapping.shape[0] or t + count > tok_seq.shape[0]:
            raise ValueError("gather_step: step arrays too small")
        for i in range(count):
            pos = start + i
            blk = block_table[slot, pos // block_size]
            token_ids[t] = token_rows[slot, pos]
            positions[t] = <int32_t>pos
            slot_mapping[t] = <int64_t>blk * block_size + pos % block_size
            tok_seq[t] = <int32_t>slot
            t += 1
        context += start + count
        if samples[seq]:
            if r >= logits_rows.shape[0] or r >= sample_slots.shape[0]:
                raise ValueError("gather_step: row arrays too small")
            logits_rows[r] = <int32_t>(t - 1)
            sample_slots[r] = <int32_t>slot
            r += 1
    return t, r, context


def append_sampled(int32_t[:, ::1] token_rows,        # IN/OUT [max_num_seqs, L]
                   int32_t[::1] num_tokens,           # IN/OUT [max_num_seqs]
                   int64_t[:, ::1] iparams,           # IN/OUT [max_num_seqs, NUM_I] sampler rows
                   const int64_t[::1] ctx_outputs,    # IN  [max_num_seqs] 1: outputs are penalty context
                   const int32_t[::1] slots,          # IN  [R]
                   const int32_t[::1] tokens,         # IN  [R]
                   int step_col, int end_col):
    """Append tokens[r] to slot slots[r]'s row; advance its sampler step (iparams[:, step_col])
    and penalty-context end (iparams[:, end_col], when outputs are context)."""
    cdef Py_ssize_t r, slot, n
    if tokens.shape[0] != slots.shape[0] or not (0 <= step_col < iparams.shape[1]) \
            or not (0 <= end_col < iparams.shape[1]):
        raise ValueError("append_sampled: bad arguments")
    for r in range(slots.shape[0]):
        slot = slots[r]
        if slot < 0 or slot >= token_rows.shape[0] or slot >= num_tokens.shape[0] \
                or slot >= iparams.shape[0] or slot >= ctx_outputs.shape[0]:
            raise ValueError(f"append_sampled: slot {slot} outside the batch")
        n = num_tokens[slot]
        if n >= token_rows.shape[1]:
            raise ValueError(f"append_sampled: slot {slot}'s row is full")
        token_rows[slot, n] = tokens[r]
        num_tokens[slot] = <int32_t>(n + 1)
        iparams[slot, step_col] += 1
        iparams[slot, end_col] += ctx_outputs[slot]


ctypedef fused param_t:   # the sampler's float and integer parameter rows
    float
    int64_t


def gather_rows(const param_t[:, ::1] src, const int32_t[::1] rows, param_t[:, ::1] out):
    """out[i] = src[rows[i]] for i < len(rows)."""
    cdef Py_ssize_t i, j, row
    if out.shape[0] < rows.shape[0] or out.shape[1] != src.shape[1]:
        raise ValueError("gather_rows: out too small")
    for i in range(rows.shape[0]):
        row = rows[i]
        if row < 0 or row >= src.shape[0]:
            raise ValueError(f"gather_rows: row {row} outside {src.shape[0]}")
        for j in range(src.shape[1]):
            out[i, j] = src[row, j]


def ngram_propose(const int32_t[:, ::1] token_rows,   # IN  [max_num_seqs, L] token ids per slot
                  const int32_t[::1] num_tokens,      # IN  [max_num_seqs] tokens in each row
                  const int32_t[::1] slots,           # IN  [S] rows to propose for
                  const int32_t[::1] max_drafts,      # IN  [S] at most this many drafts per row
                  int min_n, int max_n,
                  int32_t[:, ::1] drafts,             # OUT [>= S, >= max(max_drafts)]
                  int32_t[::1] num_drafts):           # OUT [>= S]
    """Prompt lookup (vLLM's "ngram" method): for n from max_n down to min_n, find the latest
    earlier occurrence of the row's last n tokens; the tokens that followed it are the drafts
    (up to max_drafts[s], never past the row's end). No match: no drafts."""
    cdef Py_ssize_t s, slot, n, g, i, j, k, found
    if min_n < 1 or max_n < min_n:
        raise ValueError(f"ngram_propose: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
    if max_drafts.shape[0] != slots.shape[0] or drafts.shape[0] < slots.shape[0] \
            or num_drafts.shape[0] < slots.shape[0]:
        raise ValueError("ngram_propose: per-row arrays differ in length")
    for s in range(slots.shape[0]):
        slot = slots[s]
        if slot < 0 or slot >= token_rows.shape[0] or slot >= num_tokens.shape[0] \
                or num_tokens[slot] > token_rows.shape[1] or max_drafts[s] > drafts.shape[1]:
            raise ValueError(f"ngram_propose: slot {slot} outside the batch")
    with nogil:
        for s in range(slots.shape[0]):
            slot = slots[s]
            n = num_tokens[slot]
            num_drafts[s] = 0
            if max_drafts[s] <= 0:
                continue
            found = -1
            g = max_n if max_n < n else n - 1
            while g >= min_n and found < 0:
                i = n - g - 1              # latest start of an earlier occurrence
                while i >= 0:
                    j = 0
                    while j < g and token_rows[slot, i + j] == token_rows[slot, n - g + j]:
                        j += 1
                    if j == g:
                        found = i + g      # the token after the occurrence
                        break
                    i -= 1
                g -= 1
            if found < 0:
                continue
            k = 0
            while k < max_drafts[s] and found + k < n:
                drafts[s, k] = token_rows[slot, found + k]
                k += 1
            num_drafts[s] = <int32_t>k
