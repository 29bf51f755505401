"""Compiled next-token sampler: one nogil call per engine step, OpenMP over sequences.

Per sequence, in vLLM's order:
  0. the grammar mask (structured outputs), when the row has one: every token whose bit is 0
     becomes -inf, so logprobs and everything below see only what the grammar allows;
  1. logprobs (when asked) are taken from the RAW logits, before anything below (vLLM v1's
     default "raw_logprobs"): sampled token's logprob and rank, and the top-k of the row;
  2. repetition penalty over tokens of prompt + output (logit > 0 ? logit / p : logit * p);
  3. frequency and presence penalties over output tokens (logit -= f * count + p);
  4. min_tokens: EOS and stop_token_ids set to -inf while too few tokens were generated;
  5. greedy (temperature < 1e-5): argmax, first index on ties; otherwise
  6. temperature, then top_k, top_p (over the top_k-renormalised distribution), min_p,
     then one draw.

Filtering never sorts the vocabulary: every filter is a threshold on w = exp((x - max) / T)
(so the best token has w == 1): top_k's is the k-th largest w (quickselect), top_p's the
smallest w of the shortest descending prefix holding top_p of the mass (quickselect weighted
by mass), min_p's is min_p itself. Tokens tied with a threshold are all kept. A histogram of
w over 1024 order-preserving buckets first narrows each selection to the values near its cut.

Rows are left overwritten: greedy rows hold the penalised, masked logits; sampled rows hold w.

The draw is an inverse CDF over the kept tokens in token-id order: token = first id whose
running kept mass exceeds u * (total kept mass). u in [0, 1) is counter-based:
u = splitmix64(seed ^ splitmix64(step ^ C)) >> 11 over 2^53, with step = number of output
tokens so far, so a request's tokens depend only on its seed and its own history, never on
which other requests share the step or in which order.

What does not live here: building the parameter arrays (sampler.py), SamplingParams checks.
"""
from cython.parallel cimport prange, threadid
from libc.math cimport expf, log, INFINITY
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

cimport openmp

cdef extern from "kernels/sample.h":
    uint64_t ll_splitmix64(uint64_t x) noexcept nogil
    double ll_uniform(uint64_t seed, uint64_t step) noexcept nogil
    float ll_exp_f32(float x) noexcept nogil
    void ll_exp_shift_f32(float *x, Py_ssize_t n, float m, float inv_t) noexcept nogil
    int ll_bucket(float v) noexcept nogil
    float ll_bucket_floor(int bucket) noexcept nogil

# Columns of the per-sequence parameter arrays (sampler.py builds them).
cdef enum:
    F_TEMPERATURE = 0
    F_TOP_P = 1
    F_MIN_P = 2
    F_REPETITION = 3
    F_FREQUENCY = 4
    F_PRESENCE = 5
    NUM_F = 6
cdef enum:
    I_TOP_K = 0          # 0 = off
    I_NUM_LOGPROBS = 1   # -1 = none, 0 = the sampled token only, k = also the top k
    I_SEED = 2           # uint64 bit pattern stored in an int64
    I_STEP = 3           # output tokens so far
    I_TOK_START = 4      # token_ids[start:prompt_end] prompt part, [prompt_end:end] output part
    I_TOK_PROMPT_END = 5
    I_TOK_END = 6
    I_BAN_START = 7      # banned_ids[start:end] are set to -inf (min_tokens not reached)
    I_BAN_END = 8
    NUM_I = 9
cdef enum:
    COUNT_MASK = 0x3FFFFFFF
    SEEN_FLAG = 0x40000000  # a bit of the count scratch: repetition penalty already applied

cdef enum:
    NUM_BUCKETS = 1024   # ll_bucket of a value in [0, 1] is at most 0x3F800000 >> 20 = 1016
cdef float GREEDY_EPS = 1e-5    # vLLM's threshold: below it the temperature means argmax


def max_threads() -> int:
    """OpenMP's thread count for a parallel region started by the calling thread."""
    return openmp.omp_get_max_threads()


def uniform(uint64_t seed, uint64_t step) -> float:
    """The draw the sampler uses for (seed, step); exposed for tests."""
    return ll_uniform(seed, step)


cdef _check_rows(str fn, const float[:, ::1] fparams, const int64_t[:, ::1] iparams,
                 const int32_t[::1] token_ids, const int32_t[::1] banned_ids, Py_ssize_t num_seqs,
                 Py_ssize_t vocab, Py_ssize_t top, float[:, ::1] scratch_w, int32_t[:, ::1] scratch_count,
                 float[:, ::1] scratch_raw, int num_threads, const int32_t[:, ::1] bitmask,
                 const int32_t[::1] mask_rows, bint masked, Py_ssize_t num_rows, int32_t[::1] out_token,
                 float[::1] out_logprob, int32_t[::1] out_rank, int32_t[:, ::1] out_top_ids,
                 float[:, ::1] out_top_logprobs):
    """The checks sample() and verify() share, once before their nogil parts, so those can
    trust every row: output, parameter and scratch shapes (num_rows output rows), the grammar
    mask's rows, each row's ranges of penalty tokens and bans, and that every penalty token is
    in the vocabulary."""
    cdef Py_ssize_t seq, i
    if out_token.shape[0] < num_rows or out_logprob.shape[0] < num_rows or out_rank.shape[0] < num_rows \
            or out_top_ids.shape[0] < num_rows or out_top_logprobs.shape[0] < num_rows \
            or out_top_logprobs.shape[1] != top:
        raise ValueError(f"{fn}: output arrays too small for {num_rows} rows of top {top}")
    if fparams.shape[0] != num_seqs or fparams.shape[1] != NUM_F or iparams.shape[0] != num_seqs \
            or iparams.shape[1] != NUM_I:
        raise ValueError(f"{fn}: params {fparams.shape}, {iparams.shape} for {num_seqs} rows")
    if num_threads < 1 or scratch_w.shape[0] < num_threads or scratch_count.shape[0] < num_threads \
            or scratch_raw.shape[0] < num_threads or scratch_w.shape[1] != vocab \
            or scratch_count.shape[1] != vocab or scratch_raw.shape[1] != vocab:
        raise ValueError(f"{fn}: scratch must be [>= {num_threads}, {vocab}]")
    if masked and (mask_rows.shape[0] != num_seqs or bitmask.shape[1] * 32 < vocab):
        raise ValueError(f"{fn}: bitmask {bitmask.shape} / mask_rows {mask_rows.shape[0]} "
                         f"for {num_seqs} rows of {vocab} tokens")
    for seq in range(num_seqs):
        if masked and not -1 <= mask_rows[seq] < bitmask.shape[0]:
            raise ValueError(f"{fn}: mask_rows[{seq}] = {mask_rows[seq]} outside [-1, {bitmask.shape[0]})")
        if not (0 <= iparams[seq, I_TOK_START] <= iparams[seq, I_TOK_PROMPT_END]
                <= iparams[seq, I_TOK_END] <= token_ids.shape[0]) \
                or not (0 <= iparams[seq, I_BAN_START] <= iparams[seq, I_BAN_END] <= banned_ids.shape[0]) \
                or iparams[seq, I_NUM_LOGPROBS] > top or iparams[seq, I_TOP_K] < 0:
            raise ValueError(f"{fn}: bad iparams row {seq}")
        for i in range(iparams[seq, I_TOK_START], iparams[seq, I_TOK_END]):   # penalties index x[token]
            if token_ids[i] < 0 or token_ids[i] >= vocab:
                raise ValueError(f"{fn}: token id {token_ids[i]} outside vocabulary of {vocab}")


def sample(float[:, ::1] logits,               # IN/OUT [S, V] row-wise overwritten
           const float[:, ::1] fparams,        # IN [S, NUM_F] see F_* columns
           const int64_t[:, ::1] iparams,      # IN [S, NUM_I] see I_* columns
           const int32_t[::1] token_ids,       # IN [N] penalty contexts: each row's ranges (I_TOK_*) in it
           const int32_t[::1] banned_ids,      # IN [M] min_tokens bans of every sequence, concatenated
           int32_t[::1] out_token,             # OUT [S]
           float[::1] out_logprob,             # OUT [S] raw logprob of the sampled token (if asked)
           int32_t[::1] out_rank,              # OUT [S] 1 + number of tokens with a higher raw logit
           int32_t[:, ::1] out_top_ids,        # OUT [S, K] top raw logprobs, best first
           float[:, ::1] out_top_logprobs,     # OUT [S, K]
           float[:, ::1] scratch_w,            # SCRATCH [T, V] selection copies
           int32_t[:, ::1] scratch_count,      # SCRATCH [T, V] must be all zero; left all zero
           float[:, ::1] scratch_raw,          # SCRATCH [T, V] raw logits kept for logprobs
           int num_threads,
           const int32_t[:, ::1] bitmask=None,  # IN [M, ceil(V / 32)] allowed tokens: bit t % 32 of word t // 32
           const int32_t[::1] mask_rows=None):  # IN [S] bitmask row of each row, -1 = unconstrained
    """Sample one token per row of logits; see the module docstring for the order of steps.
    With no bitmask (None, or no rows) no row is masked and nothing is spent on masks."""
    PreparedSample(logits, fparams, iparams, token_ids, banned_ids, out_token, out_logprob, out_rank, out_top_ids,
                   out_top_logprobs, scratch_w, scratch_count, scratch_raw, num_threads, bitmask, mask_rows).run()


cdef class PreparedSample:
    """sample()'s arguments, checked and held: run() samples the rows without taking a buffer
    (the engine prepares its step's sampling before forward() and runs it after: each buffer
    export right after a forward pass, which flushed the caches, costs microseconds). The
    arrays' contents may change between runs (the logits, the parameter rows' step and context
    ends): check() checks them again."""
    cdef float[:, ::1] logits
    cdef const float[:, ::1] fparams
    cdef const int64_t[:, ::1] iparams
    cdef const int32_t[::1] token_ids, banned_ids
    cdef int32_t[::1] out_token, out_rank
    cdef float[::1] out_logprob
    cdef int32_t[:, ::1] out_top_ids
    cdef float[:, ::1] out_top_logprobs, scratch_w, scratch_raw
    cdef int32_t[:, ::1] scratch_count
    cdef const int32_t[:, ::1] bitmask
    cdef const int32_t[::1] mask_rows
    cdef int num_threads
    cdef bint masked

    def __init__(self, float[:, ::1] logits, const float[:, ::1] fparams, const int64_t[:, ::1] iparams,
                 const int32_t[::1] token_ids, const int32_t[::1] banned_ids, int32_t[::1] out_token,
                 float[::1] out_logprob, int32_t[::1] out_rank, int32_t[:, ::1] out_top_ids,
                 float[:, ::1] out_top_logprobs, float[:, ::1] scratch_w, int32_t[:, ::1] scratch_count,
                 float[:, ::1] scratch_raw, int num_threads, const int32_t[:, ::1] bitmask=None,
                 const int32_t[::1] mask_rows=None):
        """The arguments of sample(), checked as it checks them."""
        self.logits, self.fparams, self.iparams, self.token_ids, self.banned_ids = \
            logits, fparams, iparams, token_ids, banned_ids
        self.out_token, self.out_logprob, self.out_rank = out_token, out_logprob, out_rank
        self.out_top_ids, self.out_top_logprobs = out_top_ids, out_top_logprobs
        self.scratch_w, self.scratch_count, self.scratch_raw = scratch_w, scratch_count, scratch_raw
        self.num_threads, self.bitmask, self.mask_rows = num_threads, bitmask, mask_rows
        self.masked = bitmask is not None and mask_rows is not None and bitmask.shape[0] > 0
        self.check()

    def check(self):
        """The checks of sample() over the arrays' current contents."""
        _check_rows("sample", self.fparams, self.iparams, self.token_ids, self.banned_ids, self.logits.shape[0],
                    self.logits.shape[1], self.out_top_ids.shape[1], self.scratch_w, self.scratch_count,
                    self.scratch_raw, self.num_threads, self.bitmask, self.mask_rows, self.masked,
                    self.logits.shape[0], self.out_token, self.out_logprob, self.out_rank, self.out_top_ids,
                    self.out_top_logprobs)

    def run(self):
        """One token per row of the logits (as they are now) into out_token (and logprobs)."""
        cdef Py_ssize_t num_seqs = self.logits.shape[0], vocab = self.logits.shape[1], seq
        cdef Py_ssize_t top = self.out_top_ids.shape[1]
        if num_seqs == 0:
            return
        cdef const int32_t *tok_ptr = &self.token_ids[0] if self.token_ids.shape[0] else NULL
        cdef const int32_t *ban_ptr = &self.banned_ids[0] if self.banned_ids.shape[0] else NULL
        cdef int nt = self.num_threads if self.num_threads < num_seqs else <int>num_seqs
        cdef int tid
        cdef const int32_t *mask
        cdef bint masked = self.masked
        cdef float *logits = &self.logits[0, 0]
        cdef const float *fparams = &self.fparams[0, 0]
        cdef const int64_t *iparams = &self.iparams[0, 0]
        cdef int32_t *out_token = &self.out_token[0]
        cdef float *out_logprob = &self.out_logprob[0]
        cdef int32_t *out_rank = &self.out_rank[0]
        cdef int32_t *out_top_ids = &self.out_top_ids[0, 0] if top else NULL
        cdef float *out_top_logprobs = &self.out_top_logprobs[0, 0] if top else NULL
        cdef float *scratch_w = &self.scratch_w[0, 0]
        cdef int32_t *scratch_count = &self.scratch_count[0, 0]
        cdef float *scratch_raw = &self.scratch_raw[0, 0]
        cdef const int32_t *bitmask = &self.bitmask[0, 0] if masked else NULL
        cdef const int32_t *mask_rows = &self.mask_rows[0] if masked else NULL
        cdef Py_ssize_t mask_words = self.bitmask.shape[1] if masked else 0
        with nogil:
            # dynamic: a greedy row costs one pass over V, a top_p row several; keep threads busy
            for seq in prange(num_seqs, schedule="dynamic", chunksize=1, num_threads=nt):
                tid = threadid()
                mask = NULL
                if masked and mask_rows[seq] >= 0:
                    mask = bitmask + mask_rows[seq] * mask_words
                _sample_one(logits + seq * vocab, vocab, mask, fparams + seq * NUM_F, iparams + seq * NUM_I,
                            tok_ptr, ban_ptr, out_token + seq, out_logprob + seq, out_rank + seq,
                            out_top_ids + seq * top if top else NULL,
                            out_top_logprobs + seq * top if top else NULL,
                            scratch_w + tid * vocab, scratch_count + tid * vocab, scratch_raw + tid * vocab)


cdef void _sample_one(float *x, Py_ssize_t vocab, const int32_t *mask, const float *fp, const int64_t *ip,
                      const int32_t *token_ids, const int32_t *banned_ids,
                      int32_t *out_token, float *out_logprob, int32_t *out_rank,
                      int32_t *top_ids, float *top_logprobs,
                      float *w, int32_t *count, float *raw) noexcept nogil:
    cdef int64_t num_logprobs = ip[I_NUM_LOGPROBS]
    cdef Py_ssize_t i, tok
    cdef int32_t t
    if mask != NULL:
        _apply_mask(x, vocab, mask)
    if num_logprobs >= 0:
        memcpy(raw, x, vocab * sizeof(float))
    _penalize(x, vocab, token_ids + ip[I_TOK_START], ip[I_TOK_PROMPT_END] - ip[I_TOK_START],
              ip[I_TOK_END] - ip[I_TOK_START], fp[F_REPETITION], fp[F_FREQUENCY], fp[F_PRESENCE], count)
    for i in range(ip[I_BAN_START], ip[I_BAN_END]):
        t = banned_ids[i]
        if 0 <= t < vocab:
            x[t] = -INFINITY
    if fp[F_TEMPERATURE] < GREEDY_EPS:
        tok = _argmax(x, vocab)
    else:
        tok = _sample_filtered(x, vocab, fp[F_TEMPERATURE], ip[I_TOP_K], fp[F_TOP_P], fp[F_MIN_P],
                               ll_uniform(<uint64_t>ip[I_SEED], <uint64_t>ip[I_STEP]), w)
    out_token[0] = <int32_t>tok
    if num_logprobs >= 0:
        _logprobs(raw, vocab, tok, num_logprobs, out_logprob, out_rank, top_ids, top_logprobs)


cdef void _apply_mask(float *x, Py_ssize_t vocab, const int32_t *mask) noexcept nogil:
    """x[t] = -inf for every token t whose bit in mask [ceil(V / 32)] is 0."""
    cdef Py_ssize_t word, i, base, end
    cdef uint32_t bits, all_ones = <uint32_t>0xFFFFFFFF
    for word in range((vocab + 31) // 32):
        bits = <uint32_t>mask[word]
        if bits == all_ones:
            continue
        base = word * 32
        end = base + 32 if base + 32 < vocab else vocab
        for i in range(base, end):
            if not (bits >> (i - base)) & 1:
                x[i] = -INFINITY


cdef void _penalize(float *x, Py_ssize_t vocab, const int32_t *ids, Py_ssize_t num_prompt,
                    Py_ssize_t num_ids, float repetition, float frequency, float presence,
                    int32_t *count) noexcept nogil:
    """ids[:num_prompt] prompt tokens, ids[num_prompt:num_ids] output tokens (caller passes an
    empty prompt part when repetition == 1). count [V] is zero on entry and on return."""
    cdef const int32_t *out = ids + num_prompt
    cdef Py_ssize_t j, num_out = num_ids - num_prompt
    cdef int32_t t, c
    cdef float v
    cdef bint has_additive = frequency != 0.0 or presence != 0.0
    if num_ids == 0:
        return
    if has_additive:
        for j in range(num_out):
            count[out[j]] += 1
    if repetition != 1.0:
        for j in range(num_ids):
            t = ids[j]
            if not (count[t] & SEEN_FLAG):
                count[t] |= SEEN_FLAG
                v = x[t]
                x[t] = v / repetition if v > 0 else v * repetition
    if has_additive:
        for j in range(num_out):
            t = out[j]
            c = count[t] & COUNT_MASK
            if c:
                x[t] -= frequency * c + presence
                count[t] &= SEEN_FLAG      # applied once per distinct token
    for j in range(num_ids):
        count[ids[j]] = 0


cdef Py_ssize_t _argmax(const float *x, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i, best = 0
    cdef float m = x[0]
    for i in range(1, n):
        if x[i] > m:
            m = x[i]
            best = i
    return best


cdef Py_ssize_t _sample_filtered(float *x, Py_ssize_t vocab, float temperature, int64_t top_k,
                                 float top_p, float min_p, double u, float *w) noexcept nogil:
    """x [V] becomes w = exp((x - max) / T); returns the drawn token id (see _filter)."""
    cdef Py_ssize_t best
    cdef double masses[NUM_BUCKETS]
    cdef float thr = _filter(x, vocab, temperature, top_k, top_p, min_p, w, masses, &best)
    if thr < 0:                 # every token banned: nothing to draw from
        return best
    return _draw(x, vocab, thr, u, masses, best)


cdef float _filter(float *x, Py_ssize_t vocab, float temperature, int64_t top_k, float top_p,
                   float min_p, float *w, double *masses, Py_ssize_t *best_out) noexcept nogil:
    """x [V] becomes w = exp((x - max) / T); returns the threshold of the kept tokens
    ({w >= thr}), -1 if every token is banned, and the best token in best_out. w [V] scratch
    holds the candidates of top_k / top_p: values above a bucket floor that is known to lie
    below the cut (from a 1024-bucket histogram of the row), so the selections run on few
    values. masses: NUM_BUCKETS doubles of scratch."""
    cdef Py_ssize_t i, n = 0, best = _argmax(x, vocab)
    cdef float m = x[best], inv_t = 1.0 / temperature, thr = 0.0, t2, floor
    cdef double total, target, acc
    cdef int bucket
    cdef bint has_candidates = False
    cdef int32_t counts[NUM_BUCKETS]
    best_out[0] = best
    if m == -INFINITY:
        return -1.0
    ll_exp_shift_f32(x, vocab, m, inv_t)
    if 0 < top_k < vocab:
        memset(counts, 0, sizeof(counts))
        for i in range(vocab):
            counts[ll_bucket(x[i])] += 1
        n = 0
        bucket = NUM_BUCKETS - 1
        while bucket > 0 and n + counts[bucket] < top_k:
            n += counts[bucket]
            bucket -= 1
        n = _gather(x, vocab, ll_bucket_floor(bucket), w)      # >= top_k values
        thr = _kth_largest(w, n, top_k)
        n = _gather(w, n, thr, w)                               # ties with the k-th stay
        has_candidates = True
    if top_p < 1.0:
        if has_candidates:
            total = 0.0
            for i in range(n):
                total += w[i]
        else:
            memset(masses, 0, NUM_BUCKETS * sizeof(double))
            for i in range(vocab):
                masses[ll_bucket(x[i])] += x[i]
            total = 0.0
            for bucket in range(NUM_BUCKETS):
                total += masses[bucket]
            acc = 0.0
            bucket = NUM_BUCKETS - 1
            while bucket > 0 and acc + masses[bucket] < top_p * total:
                acc += masses[bucket]
                bucket -= 1
            # one bucket lower than needed: a margin far above any rounding of the sums
            n = _gather(x, vocab, ll_bucket_floor(bucket - 1 if bucket > 0 else 0), w)
        t2 = _top_p_threshold(w, n, top_p * total)
        if t2 > thr:
            thr = t2
    if min_p > thr:             # w of the best token is 1, so min_p * p_max is min_p
        thr = min_p
    return thr


cdef Py_ssize_t _draw(const float *w, Py_ssize_t vocab, float thr, double u,
                      double *block_mass, Py_ssize_t fallback) noexcept nogil:
    """First id whose running mass over {w >= thr} exceeds u * total. Two passes: block
    sums (4 independent accumulators, so not one long dependent chain of adds), then a
    walk over the blocks and inside the block where the running mass crosses the target.
    block_mass holds NUM_BUCKETS doubles."""
    cdef Py_ssize_t block = 256, num_blocks, blk, i, start, end
    cdef double a0, a1, a2, a3, total = 0.0, target, acc = 0.0
    cdef float v
    while block * NUM_BUCKETS < vocab:
        block *= 2
    num_blocks = (vocab + block - 1) // block
    for blk in range(num_blocks):
        start = blk * block
        end = start + block if start + block < vocab else vocab
        a0 = a1 = a2 = a3 = 0.0
        i = start
        while i + 4 <= end:
            a0 += w[i] if w[i] >= thr else 0.0
            a1 += w[i + 1] if w[i + 1] >= thr else 0.0
            a2 += w[i + 2] if w[i + 2] >= thr else 0.0
            a3 += w[i + 3] if w[i + 3] >= thr else 0.0
            i += 4
        while i < end:
            a0 += w[i] if w[i] >= thr else 0.0
            i += 1
        block_mass[blk] = (a0 + a1) + (a2 + a3)
        total += block_mass[blk]
    target = u * total
    for blk in range(num_blocks):
        if acc + block_mass[blk] <= target:
            acc += block_mass[blk]
            continue
        start = blk * block
        end = start + block if start + block < vocab else vocab
        for i in range(start, end):
            v = w[i]
            if v >= thr:
                acc += v
                if acc > target:
                    return i
    return fallback             # only if rounding left target unreached: the mode is kept anyway


cdef inline Py_ssize_t _gather(const float *src, Py_ssize_t n, float lower, float *dst) noexcept nogil:
    """dst <- the values of src [n] that are >= lower, in order; dst may be src."""
    cdef Py_ssize_t i, k = 0
    for i in range(n):
        if src[i] >= lower:
            dst[k] = src[i]
            k += 1
    return k


cdef inline float _median3(float a, float b, float c) noexcept nogil:
    if a < b:
        if b < c:
            return b
        return c if a < c else a
    if a < c:
        return a
    return c if b < c else b


cdef inline double _partition3(float *a, Py_ssize_t lo, Py_ssize_t hi, float pivot, Py_ssize_t *lt_out,
                               Py_ssize_t *gt_out) noexcept nogil:
    """Three-way partition of a[lo:hi] around pivot: [lo, lt) > pivot, [lt, gt) == pivot,
    [gt, hi) < pivot. Returns the sum of the values above the pivot."""
    cdef Py_ssize_t lt = lo, i = lo, gt = hi
    cdef double above = 0.0
    cdef float v
    while i < gt:
        v = a[i]
        if v > pivot:
            above += v
            a[i] = a[lt]
            a[lt] = v
            lt += 1
            i += 1
        elif v < pivot:
            gt -= 1
            a[i] = a[gt]
            a[gt] = v
        else:
            i += 1
    lt_out[0] = lt
    gt_out[0] = gt
    return above


cdef float _kth_largest(float *a, Py_ssize_t n, Py_ssize_t k) noexcept nogil:
    """The value at index k - 1 of a [n] sorted descending (a is permuted). 1 <= k <= n.
    Three-way partitions keep long runs of equal values (e.g. underflowed zeros) linear."""
    cdef Py_ssize_t lo = 0, hi = n, lt, gt, want = k - 1
    cdef float pivot
    while hi - lo > 1:
        pivot = _median3(a[lo], a[lo + (hi - lo) // 2], a[hi - 1])
        _partition3(a, lo, hi, pivot, &lt, &gt)
        if want < lt:
            hi = lt
        elif want < gt:
            return pivot
        else:
            lo = gt
    return a[lo]


cdef float _top_p_threshold(float *a, Py_ssize_t n, double target) noexcept nogil:
    """Smallest value v such that the descending prefix of a [n] down to v holds >= target
    mass while the part strictly above v holds < target (a is permuted). Quickselect that
    steers by mass instead of by count: expected O(n), no sort."""
    cdef Py_ssize_t lo = 0, hi = n, lt, gt
    cdef double acc = 0.0, mass_above, mass_equal   # acc: mass of [0, lo), all above [lo, hi)
    cdef float pivot, last = 0.0
    while hi > lo:
        pivot = _median3(a[lo], a[lo + (hi - lo) // 2], a[hi - 1])
        mass_above = _partition3(a, lo, hi, pivot, &lt, &gt)
        if acc + mass_above >= target:
            hi = lt             # the cut lies among the larger values
            continue
        mass_equal = <double>pivot * (gt - lt)
        if acc + mass_above + mass_equal >= target:
            return pivot
        acc += mass_above + mass_equal
        last = pivot
        lo = gt
    return last                 # rounding: the whole range was needed, keep down to its least value


cdef void _logprobs(const float *raw, Py_ssize_t vocab, Py_ssize_t tok, int64_t k,
                    float *out_logprob, int32_t *out_rank, int32_t *top_ids,
                    float *top_logprobs) noexcept nogil:
    """log_softmax of the raw row: the sampled token's value and rank, and the k best
    (ties: lower id first), kept sorted by insertion since k <= 20."""
    cdef Py_ssize_t i, j, rank = 0, filled = 0
    cdef float m = raw[_argmax(raw, vocab)], v, mine = raw[tok]
    cdef double s = 0.0, lse
    for i in range(vocab):
        v = raw[i]
        s += expf(v - m)
        if v >= mine:           # vLLM counts >=: the token itself and any ties
            rank += 1
        if k > 0 and (filled < k or v > top_logprobs[k - 1]):
            j = filled if filled < k else k - 1
            while j > 0 and top_logprobs[j - 1] < v:
                top_logprobs[j] = top_logprobs[j - 1]
                top_ids[j] = top_ids[j - 1]
                j -= 1
            top_logprobs[j] = v
            top_ids[j] = <int32_t>i
            if filled < k:
                filled += 1
    lse = m + log(s)
    out_logprob[0] = <float>(mine - lse)
    out_rank[0] = <int32_t>rank
    for j in range(filled):
        top_logprobs[j] = <float>(top_logprobs[j] - lse)


def prompt_logprobs(const float[:, ::1] logits,        # IN [N, V] raw logits of prompt positions
                    const int32_t[::1] targets,         # IN [N] the prompt token each row predicts
                    int32_t[::1] out_rank,              # OUT [N] 1 + tokens with a higher logit
                    float[::1] out_logprob,             # OUT [N] log_softmax of the target
                    int32_t[:, ::1] out_top_ids,        # OUT [N, K] top logprobs, best first
                    float[:, ::1] out_top_logprobs,     # OUT [N, K]
                    int num_threads):
    """Logprobs of prompt tokens (vLLM's prompt_logprobs): per row, the log_softmax of the raw
    logits at the target token, its rank and the K best, exactly as the sampler reports a
    sampled token's (_logprobs)."""
    cdef Py_ssize_t n = logits.shape[0], vocab = logits.shape[1], k = out_top_ids.shape[1], row
    if targets.shape[0] != n or out_rank.shape[0] < n or out_logprob.shape[0] < n \
            or out_top_ids.shape[0] < n or out_top_logprobs.shape[0] < n or out_top_logprobs.shape[1] != k:
        raise ValueError("prompt_logprobs: output arrays do not match the logits")
    for row in range(n):
        if not 0 <= targets[row] < vocab:
            raise ValueError(f"prompt_logprobs: token id {targets[row]} outside vocabulary of {vocab}")
    if n == 0:
        return
    with nogil:
        for row in prange(n, schedule="static", num_threads=num_threads):
            _logprobs(&logits[row, 0], vocab, targets[row], k, &out_logprob[row], &out_rank[row],
                      &out_top_ids[row, 0] if k else NULL, &out_top_logprobs[row, 0] if k else NULL)


# ---- speculative decoding: verify drafted tokens --------------------------------------------
#
# A sequence with k drafted tokens d_0 .. d_{k-1} brings k + 1 rows of target logits: row j
# is the distribution p_j of the token after d_{j-1} (row 0: after the sequence's last token).
# Row j < k accepts d_j with probability min(1, p_j(d_j) / q_j(d_j)); the proposers here are
# deterministic (n-gram lookup, greedy draft model), so q_j is a point mass and the test is
# u < p_j(d_j). On rejection the token is drawn from the residual max(0, p_j - q_j),
# normalised: p_j without d_j. When every draft is accepted, row k gives a bonus token drawn
# from p_k as the sampler draws any token. Each output token is distributed exactly as the
# non-speculative sampler's (Leviathan et al. 2023); a greedy row accepts d_j iff it is the
# argmax, so greedy outputs are the non-speculative ones.
#
# Draws stay counter-based: the token at output index i uses u = uniform(seed, i) like the
# sampler, the acceptance test at index i uniform(seed ^ SPEC_SALT, i), so every decision at
# an index has its own independent draw whatever was drafted.

cdef uint64_t SPEC_SALT = 0x5BEC5BEC0DDC0FFE


def verify(float[:, ::1] logits,               # IN/OUT [R, V] each sequence's rows in turn, overwritten
           const int32_t[::1] seq_rows,        # IN [S + 1] sequence s owns rows seq_rows[s] .. seq_rows[s+1]-1
           const int32_t[::1] draft_ids,       # IN [R] the drafted token row r verifies (a sequence's last row: unused)
           const float[:, ::1] fparams,        # IN [S, NUM_F]
           const int64_t[:, ::1] iparams,      # IN [S, NUM_I] I_STEP: output tokens before row 0
           const int32_t[::1] token_ids,       # IN [N] penalty contexts (sequences without drafts only)
           const int32_t[::1] banned_ids,      # IN [M] min_tokens bans (sequences without drafts only)
           int32_t[::1] out_token,             # OUT [R] sequence s's tokens from row seq_rows[s] on
           int32_t[::1] out_num,               # OUT [S] tokens out per sequence: accepted drafts + 1
           float[::1] out_logprob,             # OUT [R] raw logprob of each output token (if asked)
           int32_t[::1] out_rank,              # OUT [R]
           int32_t[:, ::1] out_top_ids,        # OUT [R, K]
           float[:, ::1] out_top_logprobs,     # OUT [R, K]
           float[:, ::1] scratch_w,            # SCRATCH [T, V]
           int32_t[:, ::1] scratch_count,      # SCRATCH [T, V] all zero
           float[:, ::1] scratch_raw,          # SCRATCH [T, V]
           int num_threads,
           const int32_t[:, ::1] bitmask=None,  # IN [M, ceil(V / 32)] (sequences without drafts only)
           const int32_t[::1] mask_rows=None):  # IN [S] bitmask row per sequence, -1 = none
    """Accept or reject each sequence's drafted tokens (see above) and draw the token that
    follows the accepted ones: one nogil call for the whole step, OpenMP over sequences.
    A sequence with a single row is sampled exactly as sample() does; one with drafts must
    not use penalties, min_tokens bans or a grammar mask (the engine does not draft for them)."""
    cdef Py_ssize_t num_rows = logits.shape[0], vocab = logits.shape[1], seq, i, lo, hi
    cdef Py_ssize_t num_seqs = seq_rows.shape[0] - 1, top = out_top_ids.shape[1]
    cdef bint masked = bitmask is not None and mask_rows is not None and bitmask.shape[0] > 0
    if num_seqs < 0:
        raise ValueError("verify: seq_rows must hold at least one offset")
    if draft_ids.shape[0] < num_rows or out_num.shape[0] < num_seqs:
        raise ValueError(f"verify: draft_ids {draft_ids.shape[0]} / out_num {out_num.shape[0]} too small "
                         f"for {num_rows} rows of {num_seqs} sequences")
    _check_rows("verify", fparams, iparams, token_ids, banned_ids, num_seqs, vocab, top, scratch_w, scratch_count,
                scratch_raw, num_threads, bitmask, mask_rows, masked, num_rows, out_token, out_logprob, out_rank,
                out_top_ids, out_top_logprobs)
    if seq_rows[0] != 0 or seq_rows[num_seqs] != num_rows:
        raise ValueError(f"verify: seq_rows must run from 0 to {num_rows}")
    for seq in range(num_seqs):
        lo, hi = seq_rows[seq], seq_rows[seq + 1]
        if hi <= lo:
            raise ValueError(f"verify: sequence {seq} has no rows")
        if hi - lo > 1:
            if fparams[seq, F_REPETITION] != 1.0 or fparams[seq, F_FREQUENCY] != 0.0 \
                    or fparams[seq, F_PRESENCE] != 0.0 or iparams[seq, I_BAN_END] > iparams[seq, I_BAN_START] \
                    or (masked and mask_rows[seq] >= 0):
                raise ValueError(f"verify: sequence {seq} has drafts and penalties, bans or a grammar mask")
            for i in range(lo, hi - 1):
                if draft_ids[i] < 0 or draft_ids[i] >= vocab:
                    raise ValueError(f"verify: drafted token {draft_ids[i]} outside vocabulary of {vocab}")
    if num_seqs <= 0:
        return
    cdef const int32_t *tok_ptr = &token_ids[0] if token_ids.shape[0] else NULL
    cdef const int32_t *ban_ptr = &banned_ids[0] if banned_ids.shape[0] else NULL
    cdef int nt = num_threads if num_threads < num_seqs else <int>num_seqs
    cdef int tid
    cdef const int32_t *mask
    with nogil:
        # dynamic: sequences bring 1 to k + 1 rows
        for seq in prange(num_seqs, schedule="dynamic", chunksize=1, num_threads=nt):
            tid = threadid()
            mask = NULL
            if masked and mask_rows[seq] >= 0:
                mask = &bitmask[mask_rows[seq], 0]
            lo = seq_rows[seq]
            out_num[seq] = <int32_t>_verify_seq(
                &logits[lo, 0], seq_rows[seq + 1] - lo, vocab, &draft_ids[lo], mask, &fparams[seq, 0],
                &iparams[seq, 0], tok_ptr, ban_ptr, &out_token[lo], &out_logprob[lo], &out_rank[lo],
                &out_top_ids[lo, 0] if top else NULL, &out_top_logprobs[lo, 0] if top else NULL, top,
                &scratch_w[tid, 0], &scratch_count[tid, 0], &scratch_raw[tid, 0])


cdef Py_ssize_t _verify_seq(float *x, Py_ssize_t num_rows, Py_ssize_t vocab, const int32_t *drafts,
                            const int32_t *mask, const float *fp, const int64_t *ip,
                            const int32_t *token_ids, const int32_t *banned_ids,
                            int32_t *out_token, float *out_logprob, int32_t *out_rank,
                            int32_t *top_ids, float *top_logprobs, Py_ssize_t top,
                            float *w, int32_t *count, float *raw) noexcept nogil:
    """One sequence's rows x [num_rows, V]; returns how many tokens it outputs."""
    cdef int64_t ipl[NUM_I]
    cdef Py_ssize_t row
    memcpy(ipl, ip, NUM_I * sizeof(int64_t))
    for row in range(num_rows):
        ipl[I_STEP] = ip[I_STEP] + row
        if row == num_rows - 1:        # the bonus token (or a sequence without drafts)
            _sample_one(x + row * vocab, vocab, mask, fp, ipl, token_ids, banned_ids,
                        out_token + row, out_logprob + row, out_rank + row,
                        top_ids + row * top if top else NULL, top_logprobs + row * top if top else NULL,
                        w, count, raw)
            return num_rows
        if not _verify_one(x + row * vocab, vocab, drafts[row], fp, ipl, out_token + row,
                           out_logprob + row, out_rank + row,
                           top_ids + row * top if top else NULL, top_logprobs + row * top if top else NULL,
                           w, raw):
            return row + 1
    return num_rows


cdef bint _verify_one(float *x, Py_ssize_t vocab, Py_ssize_t draft, const float *fp, const int64_t *ip,
                      int32_t *out_token, float *out_logprob, int32_t *out_rank,
                      int32_t *top_ids, float *top_logprobs, float *w, float *raw) noexcept nogil:
    """Row x [V] against drafted token `draft`: writes the output token (draft if accepted,
    else the residual's draw); returns whether the draft was accepted."""
    cdef int64_t num_logprobs = ip[I_NUM_LOGPROBS]
    cdef Py_ssize_t tok, best, i
    cdef double masses[NUM_BUCKETS]
    cdef double total = 0.0, p_draft
    cdef float thr
    cdef bint accepted
    if num_logprobs >= 0:
        memcpy(raw, x, vocab * sizeof(float))
    if fp[F_TEMPERATURE] < GREEDY_EPS:
        tok = _argmax(x, vocab)
        accepted = tok == draft
    else:
        thr = _filter(x, vocab, fp[F_TEMPERATURE], ip[I_TOP_K], fp[F_TOP_P], fp[F_MIN_P], w, masses, &best)
        if thr < 0:
            tok = best
            accepted = tok == draft
        else:
            for i in range(vocab):
                if x[i] >= thr:
                    total += x[i]
            p_draft = x[draft] / total if x[draft] >= thr else 0.0
            if ll_uniform(<uint64_t>ip[I_SEED] ^ SPEC_SALT, <uint64_t>ip[I_STEP]) < p_draft:
                tok = draft
                accepted = True
            else:
                x[draft] = -1.0        # below any threshold (w >= 0): the residual is p without draft
                tok = _draw(x, vocab, thr, ll_uniform(<uint64_t>ip[I_SEED], <uint64_t>ip[I_STEP]), masses, best)
                accepted = False
    out_token[0] = <int32_t>tok
    if num_logprobs >= 0:
        _logprobs(raw, vocab, tok, num_logprobs, out_logprob, out_rank, top_ids, top_logprobs)
    return accepted
