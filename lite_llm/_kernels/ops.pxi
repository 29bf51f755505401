# Single-op entry points: shape checks, then the same nogil code forward() runs. Tests
# compare each against tests/ref_ops.py; forward() never goes through the def functions, but
# the attention phase (_attention_phase) is forward()'s own, run here in a team of its own.

cdef class _QBufs:
    """int8 blocks of T rows of K values, for a GEMM whose weights are block-quantized."""
    cdef object q, d, s, n
    cdef ll_qact a

    def __init__(self, Py_ssize_t t, Py_ssize_t k):
        self.q = np.zeros(t * k + 1, np.int8)      # flat: row strides are K, K / 32, K / 16 and K / 16
        self.d = np.zeros(t * (k // 32) + 1, np.float32)
        self.s = np.zeros(t * (k // 16) + 1, np.float32)
        self.n = np.zeros(t * (k // 16) + 1, np.int32)
        self.a = _qact(<int8_t *>_ptr(self.q), <float *>_ptr(self.d), <float *>_ptr(self.s), <int32_t *>_ptr(self.n), k)


def _parts_of(packed, str dtype, Py_ssize_t n, Py_ssize_t k):
    if dtype in WTYPES and ll_wtype_is_quant(WTYPES[dtype]):
        if packed.dtype != np.uint8 or packed.shape != ((n + 15) // 16, ll_qpanel_bytes(WTYPES[dtype], k)):
            raise ValueError(f"packed {dtype} weight {packed.shape} does not fit n={n}, k={k}")
    elif dtype == "F8_E4M3":
        if packed.dtype != np.uint8 or packed.shape != ((n + 15) // 16, ll_panel_bytes(LL_W_FP8, k)):
            raise ValueError(f"packed {dtype} weight {packed.shape} does not fit n={n}, k={k}")
    elif packed.shape[0] != (n + 15) // 16 or packed.shape[1] != ((k + 1) // 2 if dtype == "bfloat16" else k):
        raise ValueError(f"packed weight {packed.shape} does not fit n={n}, k={k}, {dtype}")
    return [(dtype, 0, packed.shape[0], 0, n, 0)]


def gemm(const float[:, ::1] x,          # IN  [T, K]
         packed,                         # IN  layout.pack(w [N, K], dtype), or panels of qpack_into
         str dtype, Py_ssize_t n,
         float[:, ::1] out,              # OUT [T, N]
         bias=None,                      # IN  [N] float32 or None
         bint accumulate=False, int num_threads=1, str path=None):
    """out (+)= x @ W.T (+ bias) with W given packed; dtype names W's format (a float dtype or
    a ggml block type, whose kernels quantize x to int8 blocks first). path: how bf16 weights
    run more than one token (BF16_PATHS; None: this build's default)."""
    cdef Py_ssize_t t = x.shape[0], k = x.shape[1]
    if out.shape[0] != t or out.shape[1] != n:
        raise ValueError(f"gemm: x {tuple(x.shape)}, n={n} -> out {tuple(out.shape)}")
    if bias is not None and (bias.dtype.name != "float32" or bias.shape != (n,)):
        raise ValueError(f"gemm: bias must be float32 [{n}]")
    keep = []
    cdef Mat m = _make_mat(packed, _parts_of(packed, dtype, n, k), n, k, bias, keep, _bf16_fma(path))
    xb = np.empty((t, (k + 1) // 2 + 1), np.uint32)
    cdef uint32_t[:, ::1] xbv = xb
    cdef _QBufs qb = _QBufs(t, k)
    with nogil:
        _gemm(&x[0, 0], k, &xbv[0, 0], &qb.a, t, &m, &out[0, 0], n, accumulate, num_threads)


def quantize_q8(const float[:, ::1] x):
    """x [T, K] (K a multiple of 32) -> (q int8 [T, K], d [T, K/32], s [T, K/16], n int32 [T, K/16]):
    the int8 blocks block-quantized GEMMs take (src/kernels/qgemm.h)."""
    cdef Py_ssize_t t = x.shape[0], k = x.shape[1]
    if k % 32:
        raise ValueError(f"quantize_q8: {k} values per row are not whole 32-value blocks")
    cdef _QBufs qb = _QBufs(t, k)
    if t:
        with nogil:
            ll_quantize_rows_q8(&x[0, 0], k, 0, t, k, <int8_t *>qb.a.q, <float *>qb.a.d, <float *>qb.a.s,
                                <int32_t *>qb.a.n)
    return (qb.q[:t * k].reshape(t, k), qb.d[:t * (k // 32)].reshape(t, k // 32),
            qb.s[:t * (k // 16)].reshape(t, k // 16), qb.n[:t * (k // 16)].reshape(t, k // 16))


def gated_mlp(const float[:, ::1] x,     # IN  [T, K]
              packed,                    # IN  layout.pack_gated(w [2F, K] gate then up rows, F, dtype),
                                         #     or (gate, up) panels of qpack_into and (gate type, up type)
              dtype, Py_ssize_t ffn_dim,
              float[:, ::1] out,         # OUT [T, F]
              str act, bias=None,        # IN  [2F] float32 or None
              int num_threads=1, str path=None):
    """out = act(x @ Wg.T + bg) * (x @ Wu.T + bu), one fused pass (the activation in the GEMM's
    epilogue). With bf16 dot products the result is rounded to bf16, as the next GEMM reads it;
    path as for gemm."""
    cdef Py_ssize_t t = x.shape[0], k = x.shape[1], f = ffn_dim, ng = (ffn_dim + 15) // 16
    cdef int a = ACTIVATIONS[act]
    cdef Mat m
    cdef long long counter[8]   # the team's work counter (work.h)
    keep = []
    if out.shape[0] != t or out.shape[1] != f:
        raise ValueError(f"gated_mlp: x {tuple(x.shape)}, F={f} -> out {tuple(out.shape)}")
    if bias is not None and (bias.dtype.name != "float32" or bias.shape != (2 * f,)):
        raise ValueError(f"gated_mlp: bias must be float32 [{2 * f}]")
    if isinstance(packed, tuple):     # block-quantized: a gate part and an up part
        joined = np.concatenate([packed[0].reshape(-1), packed[1].reshape(-1)])
        parts = [(dtype[0], 0, ng, 0, f, 0), (dtype[1], ng, 2 * ng, f, 2 * f, packed[0].nbytes)]
        _parts_of(packed[0], dtype[0], f, k)       # shape checks
        _parts_of(packed[1], dtype[1], f, k)
        m = _make_mat(joined, parts, 2 * f, k, bias, keep)
    else:
        if dtype == "F8_E4M3":
            _parts_of(packed, dtype, 2 * ng * 16, k)
        elif packed.shape[0] != 2 * ng or packed.shape[1] != ((k + 1) // 2 if dtype == "bfloat16" else k):
            raise ValueError(f"gated_mlp: packed weight {packed.shape} does not fit F={f}, k={k}, {dtype}")
        m = _make_mat(packed, [(dtype, 0, 2 * ng, 0, 2 * f, 0)], 2 * f, k, bias, keep, _bf16_fma(path))
    cdef int form = ll_mat_form(&m, t)
    cdef int wants = form == LL_IN_BF16
    xb = np.zeros((t, (k + 1) // 2 + 1), np.uint32)
    ob = np.zeros((t, (f + 1) // 2), np.uint32)
    cdef uint32_t[:, ::1] xbv = xb
    cdef uint32_t[:, ::1] obv = ob
    cdef _QBufs qb = _QBufs(t, k)
    counter[0] = 0
    with nogil, parallel(num_threads=num_threads):
        _gated_thread(&x[0, 0], &xbv[0, 0], &qb.a, k, t, &m, f, a, &out[0, 0], &obv[0, 0] if wants else NULL,
                      form, counter, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
    if wants:   # widen the bf16 result: the caller sees what the next GEMM would read
        out_np = np.asarray(out)
        out_np[...] = (ob.view(np.uint16)[:, :f].astype(np.uint32) << 16).view(np.float32)


cdef void _gated_thread(const float *x, uint32_t *xb, const ll_qact *xq, Py_ssize_t k, Py_ssize_t t, const Mat *m,
                        Py_ssize_t f, int act, float *out, uint32_t *out_b, int form, long long *counter,
                        int tid, int nth) noexcept nogil:
    """One thread of gated_mlp's region: x into the matrix's input form, then forward()'s gated phase."""
    cdef ll_team tm = ll_team_make(counter, tid, nth)
    if form != LL_IN_F32:
        _to_input_rows(form, x, k, t, k, xb, xq, &tm)
        ll_omp_barrier()
    _gated_phase(x, xb, xq, k, t, m, f, act, out, f, out_b, NULL, NULL, NULL, NULL, &tm)


def rmsnorm(const float[:, ::1] x, const float[::1] w, float[:, ::1] out, float eps, int num_threads=1):
    """out[t] = rmsnorm(x[t]) * w, rows in parallel."""
    cdef Py_ssize_t t, t0, t1, e = x.shape[1]
    cdef ll_team tm
    if w.shape[0] != e or out.shape[0] != x.shape[0] or out.shape[1] != e:
        raise ValueError("rmsnorm: shape mismatch")
    with nogil, parallel(num_threads=num_threads):   # rows as forward()'s row phases split them
        tm = ll_team_make(NULL, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
        t0 = t1 = 0   # assigned here: private to each thread
        ll_work_static(&tm, x.shape[0], 1, &t0, &t1)
        for t in range(t0, t1):
            ll_rmsnorm_f32(&x[t, 0], &w[0], &out[t, 0], e, eps)


def layernorm(const float[:, ::1] x, const float[::1] w, const float[::1] b, float[:, ::1] out,
              float eps, int num_threads=1):
    cdef Py_ssize_t t, t0, t1, e = x.shape[1]
    cdef ll_team tm
    if w.shape[0] != e or b.shape[0] != e or out.shape[0] != x.shape[0] or out.shape[1] != e:
        raise ValueError("layernorm: shape mismatch")
    with nogil, parallel(num_threads=num_threads):
        tm = ll_team_make(NULL, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
        t0 = t1 = 0
        ll_work_static(&tm, x.shape[0], 1, &t0, &t1)
        for t in range(t0, t1):
            ll_layernorm_f32(&x[t, 0], &w[0], &b[0], &out[t, 0], e, eps)


def rope(float[:, :, ::1] x,             # IN/OUT [T, num_heads, D]
         const int32_t[::1] positions,   # IN [T]
         const float[:, ::1] cos, const float[:, ::1] sin,   # IN [P, D/2]
         int num_threads=1):
    cdef Py_ssize_t t, t0, t1, h, d = x.shape[2]
    cdef ll_team tm
    if cos.shape[1] * 2 != d or positions.shape[0] != x.shape[0]:
        raise ValueError("rope: shape mismatch")
    for t in range(x.shape[0]):
        if positions[t] < 0 or positions[t] >= cos.shape[0]:
            raise ValueError(f"rope: position {positions[t]} outside the table of {cos.shape[0]}")
    with nogil, parallel(num_threads=num_threads):
        tm = ll_team_make(NULL, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
        t0 = t1 = 0
        ll_work_static(&tm, x.shape[0], 1, &t0, &t1)
        for t in range(t0, t1):
            for h in range(x.shape[1]):
                ll_rope_neox_f32(&x[t, h, 0], &cos[positions[t], 0], &sin[positions[t], 0], d)


def act_mul(const float[:, ::1] gate, up, float[:, ::1] out, str act, int num_threads=1):
    """out = act(gate) * up, or act(gate) when up is None."""
    cdef const float[:, ::1] upv
    cdef const float *upp = NULL
    cdef Py_ssize_t t, t0, t1, f = gate.shape[1]
    cdef int a = ACTIVATIONS[act]
    cdef ll_team tm
    if up is not None:
        upv = up
        if upv.shape[0] != gate.shape[0] or upv.shape[1] != f:
            raise ValueError("act_mul: shape mismatch")
    if up is not None:
        upp = &upv[0, 0]
    with nogil, parallel(num_threads=num_threads):
        tm = ll_team_make(NULL, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
        t0 = t1 = 0
        ll_work_static(&tm, gate.shape[0], 1, &t0, &t1)
        for t in range(t0, t1):
            ll_act_mul_f32(&gate[t, 0], upp + t * f if upp != NULL else NULL, &out[t, 0], f, a)


def softcap(float[:, ::1] x, float cap):   # IN/OUT [R, V]
    """x = cap * tanh(x / cap) in place (soft-capped logits), row by row as forward runs it."""
    cdef Py_ssize_t r
    if not cap > 0:
        raise ValueError(f"softcap: cap must be positive, got {cap}")
    for r in range(x.shape[0]):
        ll_softcap_f32(&x[r, 0], x.shape[1], cap)


def write_kv(const float[:, :, ::1] src,     # IN [T, Hkv, D]
             cache,                          # IN/OUT K or V cache in the kernel's layout (layout.py)
             const int64_t[::1] slot_mapping,   # IN [T]
             str which,                      # "k" or "v"
             str kv_dtype=None):             # layout.KV_DTYPES name; None: from the array's dtype
    cdef Py_ssize_t t, nb, hkv, bs, d
    nb, hkv, bs, d = kv_geometry(cache, which)
    cdef int kt = kv_type(cache, kv_dtype)
    cdef void *cp = <void *>_ptr(cache)
    if src.shape[1] != hkv or src.shape[2] != d or slot_mapping.shape[0] != src.shape[0]:
        raise ValueError("write_kv: shape mismatch")
    for t in range(src.shape[0]):
        if slot_mapping[t] < 0 or slot_mapping[t] >= nb * bs:
            raise ValueError(f"write_kv: slot {slot_mapping[t]} outside the cache")
        ll_write_kv_row(&src[t, 0, 0], cp, kt, slot_mapping[t], bs, hkv, d, which == "k")


def paged_attention(const float[:, :, ::1] q,          # IN  [T, H, D]
                    k_cache,                           # IN  K cache in the kernel's layout (layout.py)
                    v_cache,                           # IN  V cache
                    const int32_t[:, ::1] block_tables,  # IN  [S, max_blocks]
                    const int32_t[::1] tok_seq,        # IN  [T] sequence of each query token
                    const int32_t[::1] positions,      # IN  [T] position of each query token
                    float[:, :, ::1] out,              # OUT [T, H, D]
                    float scale, int sliding_window=0, int num_threads=1,
                    str kv_dtype=None,                # layout.KV_DTYPES name; None: from the arrays' dtype
                    str path=None,                    # ATTENTION_PATHS name; None: this build's default
                    float softcap=0.0,                # > 0: scores capped at softcap * tanh(score / softcap)
                    const int32_t[::1] last_positions=None,  # IN [T] last key of each query; None: its own
                    str o_input=None,                 # also return out as the o projection reads it
                    const float[::1] sinks=None):     # IN [H] a logit per head in the softmax's denominator
    """Attention of each query token over its sequence's cached positions from the window behind
    its own to its own (causal) or to last_positions[t]. Runs forward()'s attention phase
    (_attention_phase: its tiles, key splits and work hand-out) in a team of num_threads.
    o_input "bf16": also return out's rows as bf16 pairs [T, H D / 2] uint32; "q8": as int8
    blocks (q [T, H D], d [T, H D / 32], s [T, H D / 16], n [T, H D / 32]), made as forward() makes them."""
    geometry = kv_geometry(v_cache, "v")
    if k_cache.dtype != v_cache.dtype or kv_geometry(k_cache, "k") != geometry:
        raise ValueError(f"paged_attention: K {k_cache.shape} and V {v_cache.shape} are not one cache's layouts")
    cdef Py_ssize_t h = q.shape[1], d = q.shape[2], hkv = geometry[1], bs = geometry[2]
    cdef Py_ssize_t t
    if d % 16 or d > LL_MAX_HEAD_DIM or h % hkv or bs % 16 or geometry[3] != d:
        raise ValueError("paged_attention: shape mismatch (head_dim and block_size multiples of 16, "
                         "H a multiple of Hkv, the cache's head_dim that of q)")
    cdef const int32_t *last = &positions[0]
    if last_positions is not None:
        if last_positions.shape[0] != q.shape[0]:
            raise ValueError("paged_attention: last_positions differ in length from the queries")
        last = &last_positions[0]
    for t in range(q.shape[0]):
        if (last[t] // bs) >= block_tables.shape[1] or tok_seq[t] >= block_tables.shape[0] or last[t] < positions[t] \
                or (positions[t] // bs) >= block_tables.shape[1]:
            raise ValueError("paged_attention: position beyond the block table (or a last key before the query)")
    scratch = np.empty((max(num_threads, 1), ll_attention_scratch(d, h // hkv)), np.float32)
    tiles = np.empty(q.shape[0] + 1, np.int32)
    partials = np.empty((_max_split_items(num_threads), _partial_stride(h // hkv, d)), np.float32)
    cdef float[:, ::1] sc = scratch
    cdef float[:, ::1] pv = partials
    cdef int32_t[::1] tv = tiles
    cdef AttnC a
    a.q, a.ldq, a.out, a.ldo, a.tiles = &q[0, 0, 0], h * d, &out[0, 0, 0], h * d, &tv[0]
    a.h, a.hkv, a.d, a.bs, a.max_blocks = h, hkv, d, bs, block_tables.shape[1]
    a.k_cache, a.v_cache, a.kv_type = _ptr(k_cache), _ptr(v_cache), kv_type(k_cache, kv_dtype)
    a.block_tables, a.tok_seq, a.positions, a.last = &block_tables[0, 0], &tok_seq[0], &positions[0], last
    a.scale, a.softcap, a.window, a.path = scale, softcap, sliding_window, attention_path(path, _bf16_fma(None))
    a.sinks = NULL
    if sinks is not None:
        if sinks.shape[0] != h:
            raise ValueError(f"paged_attention: {sinks.shape[0]} sinks for {h} heads")
        a.sinks = &sinks[0]
    a.scratch, a.scratch_len, a.partials = &sc[0, 0], sc.shape[1], &pv[0, 0]
    a.form, a.xb, a.xq, a.xqd, a.xqs, a.xqn, a.prefetch = LL_IN_F32, NULL, NULL, NULL, NULL, NULL, NULL
    cdef _QBufs qb = None
    xb = None
    if o_input == "bf16":   # forward()'s o projection input: bf16 pairs of each row, made as rows become final
        xb = np.zeros((q.shape[0], h * d // 2), np.uint32)
        a.form, a.xb = LL_IN_BF16, <uint32_t *>_ptr(xb)
    elif o_input == "q8":   # ... or int8 blocks of 32 values, each within one KV head's group of query heads
        if (h // hkv) * d % 32:
            raise ValueError(f"paged_attention: a KV group's {(h // hkv) * d} values are not whole int8 blocks")
        qb = _QBufs(q.shape[0], h * d)
        a.form, a.xq, a.xqd, a.xqs, a.xqn = LL_IN_Q8, <int8_t *>qb.a.q, <float *>qb.a.d, <float *>qb.a.s, <int32_t *>qb.a.n
    elif o_input is not None:
        raise ValueError(f"paged_attention: o_input {o_input!r}, expected None, 'bf16' or 'q8'")
    with nogil:
        a.num_tiles = _build_tiles(&tok_seq[0], q.shape[0], &tv[0])
        a.max_keys = _max_keys(last, q.shape[0])
        _attention(&a, num_threads)
    if o_input == "bf16":
        return xb
    if o_input == "q8":
        t, k = q.shape[0], h * d
        return (qb.q[:t * k].reshape(t, k), qb.d[:t * (k // 32)].reshape(t, k // 32),
                qb.s[:t * (k // 16)].reshape(t, k // 16), qb.n[:t * (k // 16)].reshape(t, k // 16))


def attention_plan(const int32_t[::1] tok_seq, const int32_t[::1] last_positions, Py_ssize_t num_kv_heads,
                   int num_threads):
    """(query tiles, key splits per (tile, KV head)) of an attention phase over these tokens with
    a team of num_threads, as forward() and paged_attention hand it out: what a test must reach."""
    tiles = np.empty(tok_seq.shape[0] + 1, np.int32)
    cdef int32_t[::1] tv = tiles
    cdef Py_ssize_t n = _build_tiles(&tok_seq[0], tok_seq.shape[0], &tv[0]) if tok_seq.shape[0] else 0
    return n, _num_splits(n, num_kv_heads, num_threads, _max_keys(&last_positions[0], last_positions.shape[0])
                          if last_positions.shape[0] else 0)


# Query tiles: up to ATTENTION_QTILE consecutive tokens of one sequence; under the "auto" path a
# tile of at least ATTENTION_STAGE_ROWS rows (tokens x query heads per KV head) is staged.
ATTENTION_QTILE = LL_ATTN_QTILE
ATTENTION_STAGE_ROWS = LL_ATTN_STAGE_ROWS


def attention_path(str name, bint fma):
    """LL_ATTN_* for path `name` (config.ATTENTION_PATHS; None: "auto", which stages prefill
    tiles of bf16 and 8-bit caches into the bf16 GEMM path's type, vdpbf16ps pairs or fp32 for
    the FMA path, and runs decode direct; the others force one way for every tile). fma: the
    bf16 GEMM path is the fp32-FMA one."""
    if name is None or name == "auto":
        return LL_ATTN_AUTO_FMA if fma else LL_ATTN_AUTO
    if name not in ATTENTION_PATHS:
        raise ValueError(f"attention path {name!r}: expected one of {', '.join(ATTENTION_PATHS)}")
    return {"direct": LL_ATTN_DIRECT, "bf16": LL_ATTN_BF16, "fma": LL_ATTN_F32}[name]


cdef Py_ssize_t _max_keys(const int32_t *positions, Py_ssize_t num_tokens) noexcept nogil:
    """Longest context of the step: the largest position + 1."""
    cdef Py_ssize_t t, m = 0
    for t in range(num_tokens):
        if positions[t] + 1 > m:
            m = positions[t] + 1
    return m


cdef Py_ssize_t _build_tiles(const int32_t *tok_seq, Py_ssize_t num_tokens, int32_t *tiles) noexcept nogil:
    """Split the step's tokens into query tiles of at most LL_ATTN_QTILE consecutive tokens of
    one sequence: tile i is tokens tiles[i] .. tiles[i + 1] - 1. Returns the number of tiles."""
    cdef Py_ssize_t t, n = 0
    tiles[0] = 0
    for t in range(1, num_tokens):
        if tok_seq[t] != tok_seq[t - 1] or t - tiles[n] == LL_ATTN_QTILE:
            n += 1
            tiles[n] = t
    if num_tokens > 0:
        n += 1
        tiles[n] = num_tokens
    return n


cdef inline int _num_splits(Py_ssize_t num_tiles, Py_ssize_t hkv, int nth, Py_ssize_t max_keys) noexcept nogil:
    """Key splits per (query tile, KV head) work item: 1 when the step has enough items to keep
    every thread busy; else (decode of a few sequences) enough splits of at least 64 keys to
    give each thread about four items, merged afterwards (ll_attention_combine)."""
    cdef Py_ssize_t items = num_tiles * hkv, want, cap
    if items == 0 or items >= 4 * nth:
        return 1
    want = (4 * nth + items - 1) // items
    cap = max_keys // 64
    if want > cap:
        want = cap
    return <int>(want if want > 1 else 1)


cdef inline Py_ssize_t _partial_stride(Py_ssize_t group, Py_ssize_t d) noexcept nogil:
    """Floats of one split item's partial result: its rows' acc, m and l."""
    return LL_ATTN_QTILE * group * (d + 2)


cdef inline Py_ssize_t _max_split_items(int nth) noexcept nogil:
    """Bound on num_tiles * hkv * _num_splits(): splits only happen below 4 * nth items, and
    then add at most 4 * nth more."""
    return 8 * nth + 8


cdef inline void _attention_item(Py_ssize_t item, int nsplit, const float *q, Py_ssize_t ldq, float *out,
                                 Py_ssize_t ldo, const int32_t *tiles, Py_ssize_t h, Py_ssize_t hkv,
                                 Py_ssize_t d, const void *k_cache, const void *v_cache, int kv_type,
                                 const int32_t *block_tables, Py_ssize_t max_blocks, Py_ssize_t bs,
                                 const int32_t *tok_seq, const int32_t *positions, const int32_t *last,
                                 float scale, float softcap, const float *sinks, int window, float *scratch,
                                 float *partials, int path) noexcept nogil:
    """Work item = (query tile, KV head, key split): attention of the tile's tokens for the
    query heads sharing that KV head; with several splits, a partial result for the combine.
    Token t sees keys from the window behind positions[t] to last[t] (positions: causal)."""
    cdef Py_ssize_t group = h // hkv, s = item % nsplit, kvh = (item // nsplit) % hkv
    cdef Py_ssize_t tile = item // (nsplit * hkv), t0 = tiles[tile]
    ll_paged_attention_tile(q + t0 * ldq, ldq, out + t0 * ldo, ldo, <int>(tiles[tile + 1] - t0), <int>group,
                            kvh * group, positions + t0, last + t0, window, k_cache, v_cache, kv_type,
                            block_tables + tok_seq[t0] * max_blocks, bs, kvh, hkv, d, scale, softcap, sinks, scratch,
                            <int>s, nsplit, partials + item * _partial_stride(group, d) if nsplit > 1 else NULL, path)


cdef inline void _combine_item(Py_ssize_t pair, int nsplit, const float *partials, float *out, Py_ssize_t ldo,
                               const int32_t *tiles, Py_ssize_t h, Py_ssize_t hkv, Py_ssize_t d,
                               const float *sinks) noexcept nogil:
    """Merge the splits of (query tile, KV head) pair `pair` into out."""
    cdef Py_ssize_t group = h // hkv, tile = pair // hkv, kvh = pair % hkv, t0 = tiles[tile]
    ll_attention_combine(partials + pair * nsplit * _partial_stride(group, d), nsplit, _partial_stride(group, d),
                         <int>(tiles[tile + 1] - t0), <int>group, kvh * group, out + t0 * ldo, ldo, d, sinks)


cdef struct AttnC:
    # One attention phase: the step's query tiles over one layer's paged KV cache.
    const float *q                # [T, ldq] query rows, H heads of D from column 0
    float *out                    # [T, ldo] output rows, H heads of D (ldo = H D where form is set)
    Py_ssize_t ldq, ldo
    const int32_t *tiles          # [num_tiles + 1] query tiles (_build_tiles)
    Py_ssize_t num_tiles, max_keys   # max_keys: the step's longest context (_max_keys): key splits
    Py_ssize_t h, hkv, d, bs, max_blocks
    const void *k_cache           # this layer's caches in layout.py's layouts
    const void *v_cache
    int kv_type, window, path     # LL_KV_*, sliding window (0: none), LL_ATTN_*
    const int32_t *block_tables   # [S, max_blocks]
    const int32_t *tok_seq        # [T] sequence of each query token
    const int32_t *positions      # [T] position of each query token
    const int32_t *last           # [T] last key each token attends to (positions: causal)
    float scale, softcap
    const float *sinks            # [H] attention sinks (a logit per head in each softmax's denominator), or NULL
    float *scratch                # [team size, scratch_len] per-thread tile scratch
    Py_ssize_t scratch_len
    float *partials               # [_max_split_items(team size), _partial_stride(H / Hkv, D)] split results
    int form                      # out's rows also in the next GEMM's input form (LL_IN_F32: none):
    uint32_t *xb                  #   LL_IN_BF16: [T, ldo / 2] bf16 pairs
    int8_t *xq                    #   LL_IN_Q8: [T, ldo] int8 blocks, scales xqd [T, ldo / 32],
    float *xqd                    #   scale x sum xqs [T, ldo / 16], sums xqn [T, ldo / 16]
    float *xqs
    int32_t *xqn
    const Mat *prefetch           # weights whose static run each thread brings in while it waits, or NULL


cdef inline void _attn_to_input(const AttnC *a, Py_ssize_t pair) noexcept nogil:
    """out's rows of (query tile, KV head) pair `pair` in a.form once they are final; a KV
    group's H / Hkv x D values are whole int8 blocks (Model checks)."""
    cdef Py_ssize_t t, gd = (a.h // a.hkv) * a.d, tile = pair // a.hkv, c0 = (pair % a.hkv) * gd
    for t in range(a.tiles[tile], a.tiles[tile + 1]):
        if a.form == LL_IN_BF16:
            ll_f32_to_bf16_pairs(a.out + t * a.ldo + c0, 0, a.xb + t * (a.ldo // 2) + c0 // 2, 0, 1, gd)
        elif a.form == LL_IN_Q8:
            ll_quantize_rows_q8(a.out + t * a.ldo + c0, 0, 0, 1, gd, a.xq + t * a.ldo + c0,
                                a.xqd + t * (a.ldo // 32) + c0 // 32, a.xqs + t * (a.ldo // 16) + c0 // 16,
                                a.xqn + t * (a.ldo // 16) + c0 // 16)


cdef void _attention_phase(const AttnC *a, ll_team *tm) noexcept nogil:
    """This thread's share of one attention phase, forward()'s and paged_attention's alike,
    ending at a barrier (out final, in a.form too):
      items    (query tile, KV head, key split) handed out dynamically: a tile's work grows with
               its tokens' contexts; with one split an item's rows are final at once
      prefetch this thread's static run of a.prefetch (the o projection, which waits on this)
      combine  with several splits (decode of a few sequences), each (tile, KV head)'s splits
               merged, pairs split statically"""
    cdef int nsplit = _num_splits(a.num_tiles, a.hkv, tm.nth, a.max_keys)
    cdef Py_ssize_t item, end, p0, p1
    cdef ll_work wk = ll_work_begin(tm, LL_WORK_DYNAMIC, a.num_tiles * a.hkv * nsplit, 1)
    while ll_work_take(&wk, &item, &end):
        _attention_item(item, nsplit, a.q, a.ldq, a.out, a.ldo, a.tiles, a.h, a.hkv, a.d, a.k_cache, a.v_cache,
                        a.kv_type, a.block_tables, a.max_blocks, a.bs, a.tok_seq, a.positions, a.last, a.scale,
                        a.softcap, a.sinks, a.window, a.scratch + tm.tid * a.scratch_len, a.partials, a.path)
        if nsplit == 1 and a.form != LL_IN_F32:
            _attn_to_input(a, item)
    if a.prefetch != NULL:
        ll_work_static(tm, a.prefetch.num_panels, 1, &p0, &p1)
        ll_mat_prefetch(a.prefetch, p0, p1)
    ll_omp_barrier()
    if nsplit > 1:
        ll_work_static(tm, a.num_tiles * a.hkv, 1, &p0, &p1)
        for item in range(p0, p1):
            _combine_item(item, nsplit, a.partials, a.out, a.ldo, a.tiles, a.h, a.hkv, a.d, a.sinks)
            if a.form != LL_IN_F32:
                _attn_to_input(a, item)
        ll_omp_barrier()


cdef void _attention(const AttnC *a, int num_threads) noexcept nogil:
    """One attention phase on its own (the kernel tests): a team of num_threads with its own
    work counter runs _attention_phase."""
    cdef long long counter[8]   # the team's work counter (work.h)
    counter[0] = 0
    with parallel(num_threads=num_threads):
        _attention_thread(a, counter, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())


cdef void _attention_thread(const AttnC *a, long long *counter, int tid, int nth) noexcept nogil:
    cdef ll_team tm = ll_team_make(counter, tid, nth)
    _attention_phase(a, &tm)


def dispense(units, Py_ssize_t chunk, str mode, int num_threads):
    """The work dispenser (src/work.h) on its own, for its tests: len(units) consecutive phases
    of units[i] units in chunks of `chunk`, handed out by `mode` ("static" or "dynamic") to a
    team of num_threads on ONE counter, zeroed once, with a barrier between phases as in
    forward(). Returns taken [num_threads, phases, max(units)] int32: how many times each
    thread took each unit (every unit once over all threads, if the dispenser is right)."""
    modes = {"static": LL_WORK_STATIC, "dynamic": LL_WORK_DYNAMIC}
    if mode not in modes:
        raise ValueError(f"dispense: mode {mode!r}, expected static or dynamic")
    counts = np.ascontiguousarray(units, dtype=np.intp)
    if counts.ndim != 1 or (counts < 0).any() or num_threads < 1:
        raise ValueError("dispense: units must be counts >= 0, num_threads >= 1")
    taken = np.zeros((num_threads, len(counts), max(int(counts.max(initial=0)), 1)), np.int32)
    cdef Py_ssize_t[::1] uv = counts
    cdef int32_t[:, :, ::1] tv = taken
    cdef long long counter[8]
    cdef int md = modes[mode], nth = 0
    if len(counts) == 0:
        return taken
    counter[0] = 0
    with nogil, parallel(num_threads=num_threads):
        _dispense_thread(&uv[0], uv.shape[0], chunk, md, counter, &tv[0, 0, 0], tv.shape[2],
                         openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
    return taken


cdef void _dispense_thread(const Py_ssize_t *units, Py_ssize_t num_phases, Py_ssize_t chunk, int mode,
                           long long *counter, int32_t *taken, Py_ssize_t ld, int tid, int nth) noexcept nogil:
    cdef ll_team tm = ll_team_make(counter, tid, nth)
    cdef ll_work wk
    cdef Py_ssize_t ph, u, lo, hi
    for ph in range(num_phases):
        wk = ll_work_begin(&tm, mode, units[ph], chunk)
        while ll_work_take(&wk, &lo, &hi):
            for u in range(lo, hi):
                taken[(tid * num_phases + ph) * ld + u] += 1
        ll_omp_barrier()


# --- the start-up micro-benchmark's timed loops (lite_llm/_kernels/gemm_path.py): one core,
# the calling thread, no OpenMP

def instruction_peak(str name, Py_ssize_t rounds=16384, int repeats=5):
    """GMAC/s of instruction `name` (PEAK_KINDS) on the calling core: the best of `repeats`
    runs of `rounds` rounds of independent accumulations (src/kernels/peak.h)."""
    import time
    cdef int kind = PEAK_KINDS[name]
    cdef double macs = 0.0
    cdef float sink = 0.0
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        with nogil:
            macs = ll_peak_run(kind, rounds, 1.0, &sink)
        best = min(best, time.perf_counter() - start)
    return macs / max(best, 1e-9) / 1e9


def gemm_tile_rate(str path, Py_ssize_t num_tokens=64, Py_ssize_t k=576, Py_ssize_t n=192, int repeats=3):
    """GMAC/s of the bf16 GEMM of `path` (BF16_PATHS) on the calling core, over weights that
    stay in this core's L2 ([n, k] bf16, prefill-shaped: many tokens per panel): the rate the
    register tiles reach when memory is not the limit; the best of `repeats` calls."""
    import time
    cdef Py_ssize_t t = num_tokens
    # values in [-1, 1) from a fixed pattern (numpy.random would stay loaded for the whole run)
    w = (((np.arange(n * k, dtype=np.float32) * 0.618034) % 2 - 1).view(np.uint32) >> 16).astype(np.uint16).reshape(n, k)
    packed = np.zeros(((n + 15) // 16, (k + 1) // 2 * 32), np.uint16)   # layout.pack without its thread pool
    ll_pack_panels(_ptr(w), <void *>_ptr(packed), n, k, LL_W_BF16, 0, packed.shape[0])
    packed = packed.reshape(packed.shape[0], (k + 1) // 2, 32)
    x = ((np.arange(t * k, dtype=np.float32) * 0.381966) % 2 - 1).reshape(t, k)
    out = np.zeros((t, n), np.float32)
    keep = []
    cdef Mat m = _make_mat(packed, _parts_of(packed, "bfloat16", n, k), n, k, None, keep, _bf16_fma(path))
    cdef int form = ll_mat_form(&m, t)
    xb = np.zeros((t, (k + 1) // 2 + 1), np.uint32)
    cdef float[:, ::1] xv = x
    cdef float[:, ::1] ov = out
    cdef uint32_t[:, ::1] xbv = xb
    cdef _QBufs qb = _QBufs(1, 32)
    best = float("inf")
    for _ in range(repeats + 1):   # the first call brings the weights into cache
        start = time.perf_counter()
        with nogil:
            _to_input(form, &xv[0, 0], k, 0, t, k, &xbv[0, 0], &qb.a)
            ll_mat_gemm(&xv[0, 0], &xbv[0, 0], &qb.a, k, t, &m, &ov[0, 0], n, 0, 0, m.num_panels)
        best = min(best, time.perf_counter() - start)
    return t * k * n / best / 1e9


def moe_route_grouped(const float[:, ::1] logits,    # IN  [T, X] router logits
                      int k, int n_group, int topk_group, bint renorm, bint sigmoid, float scale,
                      const float[::1] bias=None):    # IN  [X] choice bias (sigmoid routing), or None
    """DeepSeek's router (moe.h ll_moe_route_grouped) on each row: (sel [T, k] int32, weight
    [T, k] float32)."""
    cdef Py_ssize_t t, T = logits.shape[0], X = logits.shape[1]
    if not 0 < k <= X or X > LL_MOE_MAX_EXPERTS or n_group < 1 or X % n_group or not 0 < topk_group <= n_group:
        raise ValueError(f"moe_route_grouped: top-{k} of {X} experts in {n_group} groups (best {topk_group})")
    if bias is not None and bias.shape[0] != X:
        raise ValueError("moe_route_grouped: bias must have one value per expert")
    sel = np.zeros((T, k), np.int32)
    weight = np.zeros((T, k), np.float32)
    cdef int32_t[:, ::1] sv = sel
    cdef float[:, ::1] wv = weight
    cdef const float *b = &bias[0] if bias is not None else NULL
    for t in range(T):
        ll_moe_route_grouped(&logits[t, 0], b, <int>X, k, n_group, topk_group, renorm, sigmoid, scale, &sv[t, 0],
                             &wv[t, 0])
    return sel, weight


def mla_attention(const float[:, :, ::1] q,       # IN  [T, H, Dk] absorbed queries
                  cache,                          # IN  [blocks, B, Dk] float32, or uint16 bf16 bits
                  const int32_t[:, ::1] block_tables,  # IN  [S, max_blocks]
                  const int32_t[::1] tok_seq,     # IN  [T]
                  const int32_t[::1] positions,   # IN  [T] last key of each query
                  Py_ssize_t kv_lora_rank, float scale):
    """forward()'s latent attention (mla.h) per query token: [T, H, kv_lora_rank] float32."""
    cdef Py_ssize_t t, T = q.shape[0], H = q.shape[1], dk = q.shape[2], bs = cache.shape[1]
    if cache.ndim != 3 or cache.shape[2] != dk or cache.dtype not in (np.float32, np.uint16) \
            or not 0 < kv_lora_rank <= dk:
        raise ValueError("mla_attention: cache [blocks, B, Dk] float32 or uint16, kv_lora_rank <= Dk")
    for t in range(T):
        if positions[t] // bs >= block_tables.shape[1] or tok_seq[t] >= block_tables.shape[0]:
            raise ValueError("mla_attention: position beyond the block tables")
    c = np.ascontiguousarray(cache)
    out = np.zeros((T, H, kv_lora_rank), np.float32)
    scratch = np.zeros(ll_mla_scratch(H, dk), np.float32)
    cdef float[:, :, ::1] ov = out
    cdef float[::1] sc = scratch
    cdef const void *cp = <const void *>_ptr(c)
    cdef int bf16 = c.dtype == np.uint16
    for t in range(T):
        ll_mla_attention(&q[t, 0, 0], dk, kv_lora_rank, 0, <int>H, cp, bf16, &block_tables[tok_seq[t], 0], bs, 0,
                         positions[t], scale, &ov[t, 0, 0], &sc[0])
    return out


def short_conv(const float[:, ::1] bcx,    # IN  [n, 3E] in_proj rows: B | C | x
               float[:, ::1] state,        # IN/OUT [L - 1, E] the last L - 1 gated inputs, oldest first
               const float[:, ::1] w,      # IN  [L, E] the taps, tap L - 1 the token's own
               bias,                       # IN  [E] float32, or None
               float[:, ::1] out,          # OUT [n, E]
               bint reset, int num_threads=1):
    """LFM2's gated short convolution of one sequence's n tokens (src/kernels/conv.h), channels
    split over the threads in 16-channel blocks as forward() splits them; reset: the incoming
    state is zeros."""
    cdef Py_ssize_t n = bcx.shape[0], E = out.shape[1], L = w.shape[0], c0, c1
    cdef const float[::1] b
    cdef const float *bp = NULL
    cdef ll_team tm
    if (bcx.shape[1] != 3 * E or out.shape[0] != n or w.shape[1] != E or state.shape[1] != E
            or state.shape[0] != L - 1 or not 1 <= L <= LL_CONV_MAX_LEN):
        raise ValueError(f"short_conv: {bcx.shape} / state {state.shape} / w {w.shape} -> {out.shape}")
    if bias is not None:
        b = bias
        if b.shape[0] != E:
            raise ValueError(f"short_conv: bias [{b.shape[0]}] for {E} channels")
        bp = &b[0]
    with nogil, parallel(num_threads=num_threads):
        tm = ll_team_make(NULL, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
        c0 = c1 = 0   # assigned here: private to each thread
        ll_work_static(&tm, E, 16, &c0, &c1)
        if c1 > c0:
            ll_short_conv_f32(&bcx[0, 0], 3 * E, &out[0, 0], E, &state[0, 0] if L > 1 else NULL, &w[0, 0], bp,
                              n, E, <int>L, reset, c0, c1)


def ssd_scan(const float[:, ::1] x,        # IN  [n, H P] the heads' inputs
             const float[:, ::1] dt,       # IN  [n, H] dt after softplus
             const float[::1] A,           # IN  [H] -exp(A_log)
             const float[::1] D,           # IN  [H]
             const float[:, ::1] B,        # IN  [n, G N] each group's B
             const float[:, ::1] C,        # IN  [n, G N]
             float[:, ::1] y,              # OUT [n, H P]
             float[:, :, ::1] state,       # IN/OUT [H, P, N]
             bint reset, int num_threads=1):
    """Mamba2's chunked state-space scan (src/kernels/ssm.h) of one sequence's n tokens, heads
    split over the threads; head h reads group h // (H / G)'s B and C; reset: the incoming state
    is zeros."""
    cdef Py_ssize_t n = x.shape[0], H = state.shape[0], P = state.shape[1], N = state.shape[2]
    cdef Py_ssize_t G = B.shape[1] // N if N else 0, h, h0, h1, per
    cdef ll_team tm
    if (N < 1 or P < 1 or G < 1 or H % G or x.shape[1] != H * P or dt.shape[0] != n or dt.shape[1] != H
            or A.shape[0] != H or D.shape[0] != H or B.shape[0] != n or B.shape[1] != G * N
            or C.shape[0] != n or C.shape[1] != G * N or y.shape[0] != n or y.shape[1] != H * P):
        raise ValueError(f"ssd_scan: x {x.shape} dt {dt.shape} B {B.shape} C {C.shape} state {state.shape} -> y {y.shape}")
    if n == 0:
        return
    per = H // G
    scratch = np.empty((max(num_threads, 1), ll_ssd_scratch()), np.float32)
    cdef float[:, ::1] sc = scratch
    with nogil, parallel(num_threads=num_threads):
        tm = ll_team_make(NULL, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
        h0 = h1 = 0   # assigned here: private to each thread
        ll_work_static(&tm, H, 1, &h0, &h1)
        for h in range(h0, h1):
            ll_ssd_scan_f32(&x[0, h * P], H * P, &dt[0, h], H, A[h], D[h], &B[0, (h // per) * N], G * N,
                            &C[0, (h // per) * N], G * N, &y[0, h * P], H * P, &state[h, 0, 0], n, P, N, reset,
                            &sc[tm.tid, 0])


def gated_delta(const float[:, ::1] q,        # IN  [n, Hk Dk] L2-normalised queries, scaled by Dk^-1/2
                const float[:, ::1] k,        # IN  [n, Hk Dk] L2-normalised keys
                const float[:, ::1] v,        # IN  [n, Hv Dv] values
                const float[:, ::1] g,        # IN  [n, Hv] log decay (<= 0)
                const float[:, ::1] beta,     # IN  [n, Hv]
                float[:, ::1] o,              # OUT [n, Hv Dv]
                float[:, :, ::1] state,       # IN/OUT [Hv, Dk, Dv]
                bint reset, int num_threads=1):
    """The gated delta rule in its chunked form (src/kernels/delta.h) over one sequence's n
    tokens, value heads split over the threads; value head h reads query / key head h // (Hv / Hk);
    reset: the incoming state is zeros."""
    cdef Py_ssize_t n = q.shape[0], Hv = state.shape[0], Dk = state.shape[1], Dv = state.shape[2]
    cdef Py_ssize_t Hk = q.shape[1] // Dk if Dk else 0, h, h0, h1, per
    cdef ll_team tm
    if (Dk < 1 or Dv < 1 or Hk < 1 or Hv % Hk or q.shape[1] != Hk * Dk or k.shape[0] != n or k.shape[1] != Hk * Dk
            or v.shape[0] != n or v.shape[1] != Hv * Dv or g.shape[0] != n or g.shape[1] != Hv
            or beta.shape[0] != n or beta.shape[1] != Hv or o.shape[0] != n or o.shape[1] != Hv * Dv):
        raise ValueError(f"gated_delta: q {q.shape} k {k.shape} v {v.shape} g {g.shape} beta {beta.shape} "
                         f"state {state.shape} -> o {o.shape}")
    if n == 0:
        return
    per = Hv // Hk
    scratch = np.empty((max(num_threads, 1), ll_gdn_scratch(Dv)), np.float32)
    cdef float[:, ::1] sc = scratch
    with nogil, parallel(num_threads=num_threads):
        tm = ll_team_make(NULL, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
        h0 = h1 = 0   # assigned here: private to each thread
        ll_work_static(&tm, Hv, 1, &h0, &h1)
        for h in range(h0, h1):
            ll_gated_delta_f32(&q[0, (h // per) * Dk], Hk * Dk, &k[0, (h // per) * Dk], Hk * Dk, &v[0, h * Dv], Hv * Dv,
                               &g[0, h], Hv, &beta[0, h], Hv, &o[0, h * Dv], Hv * Dv, &state[h, 0, 0], n, Dk, Dv,
                               reset, &sc[tm.tid, 0])


def causal_conv_silu(const float[:, ::1] x,    # IN  [n, E] one sequence's inputs
                     float[:, ::1] state,      # IN/OUT [L - 1, E] the last L - 1 inputs, oldest first
                     const float[:, ::1] w,    # IN  [L, E] the taps, tap L - 1 the token's own
                     bias,                     # IN  [E] float32, or None
                     float[:, ::1] out,        # OUT [n, E]
                     bint reset, int num_threads=1):
    """Mamba2's causal depthwise convolution with SiLU of one sequence's n tokens
    (src/kernels/conv.h), channels split over the threads in 16-channel blocks; reset: the
    incoming state is zeros."""
    cdef Py_ssize_t n = x.shape[0], E = x.shape[1], L = w.shape[0], c0, c1
    cdef const float[::1] b
    cdef const float *bp = NULL
    cdef ll_team tm
    if (out.shape[0] != n or out.shape[1] != E or w.shape[1] != E or state.shape[1] != E
            or state.shape[0] != L - 1 or not 1 <= L <= LL_CONV_MAX_LEN):
        raise ValueError(f"causal_conv_silu: {x.shape} / state {state.shape} / w {w.shape} -> {out.shape}")
    if bias is not None:
        b = bias
        if b.shape[0] != E:
            raise ValueError(f"causal_conv_silu: bias [{b.shape[0]}] for {E} channels")
        bp = &b[0]
    if n == 0:
        return
    with nogil, parallel(num_threads=num_threads):
        tm = ll_team_make(NULL, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
        c0 = c1 = 0   # assigned here: private to each thread
        ll_work_static(&tm, E, 16, &c0, &c1)
        if c1 > c0:
            ll_causal_conv_silu_f32(&x[0, 0], E, &out[0, 0], E, &state[0, 0] if L > 1 else NULL, &w[0, 0], bp,
                                    n, E, <int>L, reset, c0, c1)
