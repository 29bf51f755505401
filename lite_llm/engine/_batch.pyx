"""Compiled helpers of the persistent step batch (input_batch.py): a step's flat forward()
arrays gathered from the per-slot rows, and sampled tokens appended to them, in one call
each. A step has a few dozen to a few hundred sequences: numpy would spend more time starting
its dozen small operations (after a forward pass has flushed every cache) than doing them.

Bounds are checked here once per call, with the GIL; the loops trust them.
What does not live here: which requests hold which slot (input_batch.py).

StepBuffers is the engine's path: it takes the persistent arrays' pointers once, so a step's
gather and append acquire no buffer per array (each a numpy buffer export, slow right after a
forward pass has flushed the caches), and it walks the step's chunks itself. gather_step and
append_sampled below are the same arithmetic over buffers passed per call (the speculative
proposer's own steps, tests).
"""
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from libc.stdint cimport int32_t, int64_t

from time import perf_counter as _perf_counter

include "_chunk.pxi"

_new_tuple = tuple.__new__    # a NamedTuple built without its Python-level __new__ (a frame per row)


# plain samples, result_type(token, None, None, None), built once per token id and shared by
# every step that samples the token (NamedTuples: never changed); a step then allocates nothing
# per row. _PLAIN[0] is the result type they were built for.
cdef list _PLAIN = [None]


cdef object _plain_result(object result_type, Py_ssize_t token):
    global _PLAIN
    if _PLAIN[0] is not result_type:
        _PLAIN = [result_type]
    if 0 <= token < PyList_GET_SIZE(_PLAIN) - 1:
        result = <object>PyList_GET_ITEM(_PLAIN, token + 1)
        if result is not None:
            return result
    result = _new_tuple(result_type, (token, None, None, None))
    if 0 <= token < (1 << 20):          # a vocabulary's ids; anything else is built every time
        if token + 1 >= PyList_GET_SIZE(_PLAIN):
            _PLAIN.extend([None] * (token + 2 - PyList_GET_SIZE(_PLAIN)))
        _PLAIN[token + 1] = result
    return result


cdef class StepBuffers:
    """Raw pointers to one InputBatch's persistent rows and step arrays, taken once (the
    memoryviews kept here hold the arrays alive and unmoved)."""
    cdef object _views
    cdef int32_t *token_rows          # [num_slots, row_len]
    cdef int32_t *block_table         # [num_slots, max_blocks]
    cdef int32_t *num_tokens          # [num_slots]
    cdef int64_t *iparams             # [num_slots, num_i]
    cdef const int64_t *ctx_outputs   # [num_slots]
    cdef int32_t *token_ids           # [max_tokens] step arrays
    cdef int32_t *positions           # [max_tokens]
    cdef int64_t *slot_mapping        # [max_tokens]
    cdef int32_t *tok_seq             # [max_tokens]
    cdef int32_t *logits_rows         # [max_rows]
    cdef int32_t *sample_slots        # [max_rows]
    cdef Py_ssize_t num_slots, row_len, max_blocks, num_i, max_tokens, max_rows
    cdef Py_ssize_t num_rows          # sampling rows of the latest gather
    cdef int block_size, step_col, end_col

    def __init__(self, int32_t[:, ::1] token_rows, int32_t[:, ::1] block_table, int32_t[::1] num_tokens,
                 int64_t[:, ::1] iparams, const int64_t[::1] ctx_outputs, int32_t[::1] token_ids,
                 int32_t[::1] positions, int64_t[::1] slot_mapping, int32_t[::1] tok_seq,
                 int32_t[::1] logits_rows, int32_t[::1] sample_slots, int block_size, int step_col, int end_col):
        self.num_slots = token_rows.shape[0]
        if block_table.shape[0] != self.num_slots or num_tokens.shape[0] != self.num_slots \
                or iparams.shape[0] != self.num_slots or ctx_outputs.shape[0] != self.num_slots \
                or not (0 <= step_col < iparams.shape[1]) or not (0 <= end_col < iparams.shape[1]) \
                or block_size < 1 or token_rows.shape[1] < 1 or block_table.shape[1] < 1:
            raise ValueError("StepBuffers: per-slot arrays disagree")
        self.max_tokens = min(token_ids.shape[0], positions.shape[0], slot_mapping.shape[0], tok_seq.shape[0])
        self.max_rows = min(logits_rows.shape[0], sample_slots.shape[0])
        if self.max_tokens < 1 or self.max_rows < 1:
            raise ValueError("StepBuffers: empty step arrays")
        self._views = (token_rows, block_table, num_tokens, iparams, ctx_outputs, token_ids, positions,
                       slot_mapping, tok_seq, logits_rows, sample_slots)
        self.row_len, self.max_blocks, self.num_i = token_rows.shape[1], block_table.shape[1], iparams.shape[1]
        self.token_rows, self.block_table, self.num_tokens = &token_rows[0, 0], &block_table[0, 0], &num_tokens[0]
        self.iparams, self.ctx_outputs = &iparams[0, 0], &ctx_outputs[0]
        self.token_ids, self.positions, self.slot_mapping = &token_ids[0], &positions[0], &slot_mapping[0]
        self.tok_seq, self.logits_rows, self.sample_slots = &tok_seq[0], &logits_rows[0], &sample_slots[0]
        self.block_size, self.step_col, self.end_col = block_size, step_col, end_col
        self.num_rows = 0

    def gather(self, list chunks, dict slot_of, batch):
        """Apply the chunks' deltas (batch.add for a new request, batch.append_blocks for new
        block ids, batch.put_drafts for drafts: the Python rare paths), then fill the step
        arrays. chunks: ScheduledChunk tuples (request, start, num_new_tokens, new_block_ids,
        sample, is_new, spec_token_ids). Returns (T tokens, R sampling chunks, keys read by
        attention, whether the chunks sit in slots 0..S-1 and all sample)."""
        cdef Py_ssize_t num_seqs = len(chunks), seq, i
        cdef Py_ssize_t t = 0, r = 0, context = 0, slot, start, count, pos, blk
        cdef bint is_prefix = True
        cdef tuple c
        cdef int32_t *row
        cdef int32_t *table
        cdef Py_ssize_t bs = self.block_size
        for seq in range(num_seqs):
            c = <tuple>chunks[seq]           # a NamedTuple: a tuple underneath, fields by name (_chunk.pxi)
            request = c[CHUNK_REQUEST]
            start = c[CHUNK_START]
            count = c[CHUNK_NUM_NEW]
            if c[CHUNK_IS_NEW]:
                slot = batch.add(request, c[CHUNK_NEW_BLOCKS])
            else:
                slot = slot_of[request.request_id]
                if c[CHUNK_NEW_BLOCKS]:
                    batch.append_blocks(slot, c[CHUNK_NEW_BLOCKS])
                if c[CHUNK_SPEC]:
                    batch.put_drafts(slot, c[CHUNK_SPEC])
            if slot < 0 or slot >= self.num_slots or count < 1 or start < 0 or start + count > self.row_len \
                    or (start + count - 1) // bs >= self.max_blocks:
                raise ValueError(f"StepBuffers.gather: chunk {seq} (slot {slot}, tokens {start}..{start + count}) "
                                 "outside the batch arrays")
            if t + count > self.max_tokens:
                raise ValueError("StepBuffers.gather: step arrays too small")
            is_prefix = is_prefix and slot == seq
            row = self.token_rows + slot * self.row_len
            table = self.block_table + slot * self.max_blocks
            for i in range(count):
                pos = start + i
                blk = table[pos // bs]
                self.token_ids[t] = row[pos]
                self.positions[t] = <int32_t>pos
                self.slot_mapping[t] = <int64_t>blk * bs + pos % bs
                self.tok_seq[t] = <int32_t>slot
                t += 1
            context += start + count
            if c[CHUNK_SAMPLE]:
                if r >= self.max_rows:
                    raise ValueError("StepBuffers.gather: row arrays too small")
                self.logits_rows[r] = <int32_t>(t - 1)
                self.sample_slots[r] = <int32_t>slot
                r += 1
        self.num_rows = r
        return t, r, context, is_prefix and r == num_seqs

    def append_step(self, const int32_t[::1] tokens):
        """The latest gather's sampling rows each get their token (tokens [R]): appended to the
        slot's row, its sampler step and (when outputs are penalty context) context end advanced."""
        self._append(tokens)

    def finish_plain(self, run, const int32_t[::1] tokens, result_type):
        """A plain step's whole post-forward work in one call: run() (the bound sampling, which
        writes tokens [R]), append_step(tokens), and the rows' result_type(token, None, None,
        None) tuples built here, without a Python frame per row. Returns (results, seconds
        run() took)."""
        cdef Py_ssize_t r
        cdef double start = _perf_counter()
        run()
        cdef double seconds = _perf_counter() - start
        self._append(tokens)
        cdef list results = [None] * self.num_rows
        for r in range(self.num_rows):
            results[r] = _plain_result(result_type, tokens[r])
        return results, seconds

    cdef int _append(self, const int32_t[::1] tokens) except -1:
        if tokens.shape[0] != self.num_rows:
            raise ValueError(f"StepBuffers.append_step: {tokens.shape[0]} tokens for {self.num_rows} rows")
        return self._append_rows(&tokens[0] if self.num_rows else NULL)

    cdef int _append_rows(self, const int32_t *tokens) except -1:
        cdef Py_ssize_t r, slot, n
        for r in range(self.num_rows):
            slot = self.sample_slots[r]
            n = self.num_tokens[slot]
            if n >= self.row_len:
                raise ValueError(f"append_step: slot {slot}'s row is full")
            self.token_rows[slot * self.row_len + n] = tokens[r]
            self.num_tokens[slot] = <int32_t>(n + 1)
            self.iparams[slot * self.num_i + self.step_col] += 1
            self.iparams[slot * self.num_i + self.end_col] += self.ctx_outputs[slot]
        return 0

    # ---- a steady decode batch (SteadyDecode) -------------------------------------------------

    cdef Py_ssize_t gather_slots(self, const int32_t *slots, Py_ssize_t n) except -1:
        """gather() for a steady decode batch, from the slot rows alone: sequence i, in slot
        slots[i], computes its row's last token (at position num_tokens - 1) and samples.
        Returns the keys attention reads (the rows' lengths summed)."""
        cdef Py_ssize_t i, slot, pos, context = 0, bs = self.block_size
        if n > self.max_tokens or n > self.max_rows:
            raise ValueError("StepBuffers.gather_slots: step arrays too small")
        for i in range(n):
            slot = slots[i]
            pos = self.num_tokens[slot] - 1 if 0 <= slot < self.num_slots else -1
            if pos < 0 or pos // bs >= self.max_blocks:
                raise ValueError(f"StepBuffers.gather_slots: slot {slot} holds no token to compute")
            self.token_ids[i] = self.token_rows[slot * self.row_len + pos]
            self.positions[i] = <int32_t>pos
            self.slot_mapping[i] = <int64_t>self.block_table[slot * self.max_blocks + pos // bs] * bs + pos % bs
            self.tok_seq[i] = <int32_t>slot
            self.logits_rows[i] = <int32_t>i
            self.sample_slots[i] = <int32_t>slot
            context += pos + 1
        self.num_rows = n
        return context


cdef class SteadyDecode:
    """The model runner's step of a steady decode batch (SchedulerOutput.steady: the previous
    step's S sequences again, in the same order, one token each, each sampling, none gone):
    the previous plain step's step arrays, forward() call and bound sampling repeated in one
    compiled call, without prepare(), StepArrays or a Python frame per sequence.

        run(chunks): new KV blocks of the chunks into their slots' tables -> the step arrays
        from the slot rows (gather_slots) -> the slots' parameter rows (when not 0..S-1) ->
        sampling checked -> forward -> sampling -> tokens appended to the rows -> the step's
        RunnerOutput (a result_type per sequence)

    It gives what ModelRunner.execute gives for the same step (tests/engine/test_step_paths.py
    compares them step by step). Anything that would change the step's path (logprobs, biases,
    bans, grammars, drafts, LoRA, images, tensor parallel) comes only with a new request, whose
    step is not steady."""
    cdef StepBuffers buffers
    cdef object batch, call, forward, forward_args, gather_params, result_type, output_type, _keep
    cdef const int32_t *slots
    cdef const int32_t *tokens
    cdef readonly Py_ssize_t size
    cdef readonly Py_ssize_t num_runs    # steps run
    cdef long long bytes_per_token, kv_bytes_per_token

    def __init__(self, StepBuffers buffers, batch, const int32_t[::1] slots, const int32_t[::1] tokens, call,
                 gather_params, forward, tuple forward_args, long long bytes_per_token, long long kv_bytes_per_token,
                 result_type, output_type):
        """buffers: the batch's StepBuffers; batch: its InputBatch (append_blocks); slots [S] each
        sequence's slot, tokens [S] where call (a bound _sampler.PreparedSample) writes its
        tokens; gather_params: () -> None filling the step's parameter rows, None when slots
        are 0..S-1; forward(*forward_args): the kernels' forward over the bound arrays;
        result_type, output_type: SampleResult and RunnerOutput (NamedTuples, built here)."""
        cdef Py_ssize_t i, n = slots.shape[0]
        if n < 1 or tokens.shape[0] != n:
            raise ValueError(f"SteadyDecode: {n} slots, {tokens.shape[0]} tokens")
        for i in range(n):
            if slots[i] < 0 or slots[i] >= buffers.num_slots:
                raise ValueError(f"SteadyDecode: slot {slots[i]} outside the batch")
        self._keep = (slots, tokens)
        self.buffers, self.batch, self.slots, self.tokens, self.size = buffers, batch, &slots[0], &tokens[0], n
        self.call, self.gather_params, self.forward, self.forward_args = call, gather_params, forward, forward_args
        self.bytes_per_token, self.kv_bytes_per_token = bytes_per_token, kv_bytes_per_token
        self.result_type, self.output_type = result_type, output_type

    def run(self, list chunks):
        """The step of chunks (the scheduler's, steady): its RunnerOutput."""
        cdef Py_ssize_t i, n = self.size, context, slot
        cdef StepBuffers b = self.buffers
        cdef tuple c
        cdef double start, kernel
        if len(chunks) != n:
            raise ValueError(f"SteadyDecode.run: {len(chunks)} chunks for {n} sequences")
        for i in range(n):
            c = <tuple>chunks[i]
            slot = self.slots[i]
            if c[CHUNK_NEW_BLOCKS]:
                self.batch.append_blocks(slot, c[CHUNK_NEW_BLOCKS])
            if c[CHUNK_START] != b.num_tokens[slot] - 1 or c[CHUNK_NUM_NEW] != 1:
                raise ValueError(f"SteadyDecode.run: chunk {i} is not its row's next token")
        context = b.gather_slots(self.slots, n)
        if self.gather_params is not None:
            self.gather_params()
        self.call.check()
        start = _perf_counter()
        self.forward(*self.forward_args)
        self.call.run()
        kernel = _perf_counter() - start
        b._append_rows(self.tokens)
        self.num_runs += 1
        cdef list results = [None] * n
        for i in range(n):
            results[i] = _plain_result(self.result_type, self.tokens[i])
        return _new_tuple(self.output_type, (results, None, (), kernel,
                                             self.bytes_per_token + context * self.kv_bytes_per_token, None))


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
