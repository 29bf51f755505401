# LoRA adapters served per row inside the one forward call (vLLM's punica ops, on the CPU).
# Each sequence of a step carries an adapter slot (-1: the base model alone); the step's rows
# are grouped by slot once, then after each targeted projection
#
#     shrink   tmp[t, j]  = A[slot, j] . x[t]           (adapter, 4 rank rows) items over threads
#     expand   out[t, c] += tmp[t, :] . Bt[slot, :, c]   column slices over threads
#
# run over the rows of each adapter only: the base weights are never merged with an adapter,
# so a quantized base stays quantized and shared, and rows without an adapter pay nothing.
# Adapter weights are fp32, stacked per slot up to max_loras, zero past each slot's rank.
# What is not here: reading PEFT / GGUF adapters and choosing slots (lite_llm/lora.py); where
# the phases sit in a layer (forward.pxi _step).

cdef extern from "kernels/lora.h" nogil:
    void ll_lora_shrink_f32(const float *a, Py_ssize_t lda, int nrows, const float *x, Py_ssize_t k, float *out)
    void ll_lora_shrink2_f32(const float *a, Py_ssize_t lda, int nrows, const float *x0, const float *x1,
                             Py_ssize_t k, float *out0, float *out1)
    void ll_lora_expand_f32(const float *t, const float *bt, Py_ssize_t ldb, int r, float *y, Py_ssize_t n)

cdef enum:
    LORA_QKV = 0       # targets q, k, v: input the normed rows, output the qkv rows
    LORA_O = 1         # o: input the attention rows
    LORA_GATE_UP = 2   # gate, up: input the normed rows, output the raw gate / up rows
    LORA_DOWN = 3      # down: input the activation rows
    LORA_GROUPS = 4

# target name -> (group, index within the group)
LORA_TARGETS = {"q": (LORA_QKV, 0), "k": (LORA_QKV, 1), "v": (LORA_QKV, 2), "o": (LORA_O, 0),
                "gate": (LORA_GATE_UP, 0), "up": (LORA_GATE_UP, 1), "down": (LORA_DOWN, 0)}


cdef struct LoraG:
    # one layer's targets that share an input
    const float *a          # [S, nt r, K] shrink rows of each slot; target i's at i r, zero past its rank
    const float *bt[3]      # target i: [S, r, n[i]] expand rows, the adapter's scale folded in
    const int32_t *rank     # [S, nt] rank of slot s's target i (0: not adapted in this layer)
    int nt, k, r
    int n[3]
    int col[3]              # target i adds into output columns col[i] .. col[i] + n[i]


cdef struct LoraStep:
    const LoraG *groups     # [num_layers, LORA_GROUPS]
    Py_ssize_t nl           # adapters with rows in this step (0: the base model alone)
    const int32_t *lslot    # [nl] their slots
    const int32_t *loff     # [nl + 1] each one's first entry in lrows
    const int32_t *lrows    # [rows with an adapter] token indices grouped by adapter
    float *tmp              # [T, ldt] shrink results
    Py_ssize_t ldt


cdef class LoraWeights:
    """Stacked adapter weights of max_loras slots for a model of KernelConfig cfg, in place:
    set_target() writes one slot's target of one layer, clear_slot() empties a slot. The
    forward pass reads these arrays through pointers taken once here."""
    cdef LoraG *g
    cdef readonly int num_layers, max_loras, max_rank, dim, ffn_dim
    cdef readonly list arrays     # [num_layers * LORA_GROUPS] (a, [bt...], rank)
    cdef object count             # [max_loras + 1] int32 grouping scratch

    def __cinit__(self):
        self.g = NULL

    def __init__(self, cfg, int max_loras, int max_rank):
        cdef int l, grp, i
        cdef LoraG *G
        if max_loras < 1 or max_rank < 1:
            raise ValueError(f"max_loras {max_loras} and max_lora_rank {max_rank} must be at least 1")
        if cfg.num_experts or not cfg.gated_mlp:
            raise ValueError("LoRA adapters run on dense models with a gated MLP (Llama-like); "
                             f"{cfg.architecture if hasattr(cfg, 'architecture') else 'this model'} is not one")
        if cfg.ffn_dim % 16:
            raise ValueError(f"LoRA on a gated MLP needs ffn_dim a multiple of 16, not {cfg.ffn_dim}")
        E, F, HD, KD = cfg.dim, cfg.ffn_dim, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        shapes = {LORA_QKV: (E, (HD, KD, KD)), LORA_O: (HD, (E,)), LORA_GATE_UP: (E, (F, F)), LORA_DOWN: (F, (E,))}
        self.num_layers, self.max_loras, self.max_rank, self.dim, self.ffn_dim = cfg.num_layers, max_loras, max_rank, E, F
        self.g = <LoraG *>calloc(cfg.num_layers * LORA_GROUPS, sizeof(LoraG))
        if self.g == NULL:
            raise MemoryError()
        self.arrays = []
        self.count = np.zeros(max_loras + 1, np.int32)
        for l in range(cfg.num_layers):
            for grp in range(LORA_GROUPS):
                k, ns = shapes[grp]
                a = np.zeros((max_loras, len(ns) * max_rank, k), np.float32)
                bts = [np.zeros((max_loras, max_rank, n), np.float32) for n in ns]
                rank = np.zeros((max_loras, len(ns)), np.int32)
                self.arrays.append((a, bts, rank))
                G = &self.g[l * LORA_GROUPS + grp]
                G.a, G.rank, G.nt, G.k, G.r = <const float *>_ptr(a), <const int32_t *>_ptr(rank), len(ns), k, max_rank
                col = 0
                for i in range(len(ns)):
                    G.bt[i], G.n[i], G.col[i] = <const float *>_ptr(bts[i]), ns[i], col
                    col += ns[i]

    def __dealloc__(self):
        free(self.g)

    def set_target(self, int slot, int layer, str target, a, bt):
        """Slot `slot`'s adapter on `target` (LORA_TARGETS) of layer `layer`: a [r, K] its A,
        bt [r, N] its B transposed with the scale folded in; r <= max_rank."""
        if target not in LORA_TARGETS:
            raise ValueError(f"LoRA target {target!r}: expected one of {', '.join(LORA_TARGETS)}")
        if not 0 <= slot < self.max_loras or not 0 <= layer < self.num_layers:
            raise ValueError(f"slot {slot} / layer {layer} outside {self.max_loras} slots / {self.num_layers} layers")
        grp, i = LORA_TARGETS[target]
        A, bts, rank = self.arrays[layer * LORA_GROUPS + grp]
        r = a.shape[0]
        if r > self.max_rank or a.shape != (r, A.shape[2]) or bt.shape != (r, bts[i].shape[2]):
            raise ValueError(f"layer {layer} {target}: A {a.shape} / B^T {bt.shape}; expected [r, {A.shape[2]}] / "
                             f"[r, {bts[i].shape[2]}] with r <= {self.max_rank}")
        A[slot, i * self.max_rank:(i + 1) * self.max_rank] = 0
        bts[i][slot] = 0
        A[slot, i * self.max_rank:i * self.max_rank + r] = a
        bts[i][slot, :r] = bt
        rank[slot, i] = r

    def clear_slot(self, int slot):
        """Slot `slot` adapts nothing (its rows would run the base model alone)."""
        for A, bts, rank in self.arrays:
            A[slot] = 0
            for b in bts:
                b[slot] = 0
            rank[slot] = 0

    @property
    def nbytes(self):
        return sum(A.nbytes + rank.nbytes + sum(b.nbytes for b in bts) for A, bts, rank in self.arrays)


cdef Py_ssize_t _lora_group(LoraWeights lw, const int32_t *seq_lora, const int32_t *tok_seq, Py_ssize_t T,
                            int32_t *lslot, int32_t *loff, int32_t *lrows) noexcept:
    """Group the step's rows by adapter slot (slot order, rows in order within a slot; rows
    whose sequence has slot -1 left out); returns the number of adapters with rows."""
    cdef int32_t[::1] count = lw.count
    cdef Py_ssize_t t, nl = 0, S = lw.max_loras
    cdef int32_t slot
    count[:] = 0
    for t in range(T):
        slot = seq_lora[tok_seq[t]]
        if slot >= 0:
            count[slot + 1] += 1
    loff[0] = 0
    for slot in range(S):
        if count[slot + 1]:
            lslot[nl] = slot
            loff[nl + 1] = loff[nl] + count[slot + 1]
            nl += 1
        count[slot + 1] += count[slot]      # count[slot]: first row of slot in lrows
    for t in range(T):
        slot = seq_lora[tok_seq[t]]
        if slot >= 0:
            lrows[count[slot]] = <int32_t>t
            count[slot] += 1
    return nl


cdef enum:
    LORA_COLS = 256    # expand: columns of Bt per pass over an adapter's rows (r x 256 fp32 stay in L1)


cdef void _lora_shrink(const LoraStep *s, const LoraG *g, const float *x, Py_ssize_t ldx,
                       ll_team *tm) noexcept nogil:
    """s.tmp[t, i r + j] = A_i[slot(t), j] . x[t] for each row t with an adapter (vLLM's punica
    shrink). An adapter with many rows splits them across threads, each row (two at a time)
    against all of the adapter's rank rows (A stays in cache); one with few rows (decode)
    splits its (target, 4 rank rows) items instead, so every thread has work."""
    cdef Py_ssize_t nb = (g.r + 3) // 4, per = g.nt * nb, R = g.nt * g.r, item, gi, j0, i, t, t1, n, lo, hi
    cdef int slot, ti, rk, nrows
    cdef const float *a
    for gi in range(s.nl):
        slot = s.lslot[gi]
        n = s.loff[gi + 1] - s.loff[gi]
        if n >= 4 * tm.nth:
            ll_work_static(tm, n, 1, &lo, &hi)
            lo, hi = s.loff[gi] + lo, s.loff[gi] + hi
            i = lo
            while i < hi:   # two rows at a time against every rank row: A from cache, x rows from L1
                t = s.lrows[i]
                t1 = s.lrows[i + 1] if i + 1 < hi else -1
                for ti in range(g.nt):
                    rk = g.rank[slot * g.nt + ti]
                    j0 = 0
                    while j0 < rk:
                        nrows = <int>min(4, rk - j0)
                        a = g.a + (slot * R + ti * g.r + j0) * g.k
                        if t1 >= 0:
                            ll_lora_shrink2_f32(a, g.k, nrows, x + t * ldx, x + t1 * ldx, g.k,
                                                s.tmp + t * s.ldt + ti * g.r + j0, s.tmp + t1 * s.ldt + ti * g.r + j0)
                        else:
                            ll_lora_shrink_f32(a, g.k, nrows, x + t * ldx, g.k, s.tmp + t * s.ldt + ti * g.r + j0)
                        j0 += 4
                i += 2
            continue
        ll_work_static(tm, per, 1, &lo, &hi)
        for item in range(lo, hi):
            ti = <int>(item // nb)
            j0 = (item % nb) * 4
            rk = g.rank[slot * g.nt + ti]
            if j0 >= rk:
                continue
            nrows = <int>min(4, rk - j0)
            for i in range(s.loff[gi], s.loff[gi + 1]):
                t = s.lrows[i]
                ll_lora_shrink_f32(g.a + (slot * R + ti * g.r + j0) * g.k, g.k, nrows, x + t * ldx, g.k,
                                   s.tmp + t * s.ldt + ti * g.r + j0)


cdef void _lora_expand(const LoraStep *s, const LoraG *g, float *out, Py_ssize_t ldo, ll_team *tm) noexcept nogil:
    """out[t, col_i + c] += s.tmp[t, i r:(i + 1) r] . Bt_i[slot(t), :, c] for each row t with an
    adapter (vLLM's punica expand): each thread a slice of every target's columns, LORA_COLS at
    a time over all adapters' rows."""
    cdef Py_ssize_t n, c0, c1, cb, w, gi, i, t
    cdef int slot, ti, rk
    cdef const float *b
    for ti in range(g.nt):
        n = g.n[ti]
        ll_work_static(tm, n, 16, &c0, &c1)
        cb = c0
        while cb < c1:
            w = min(LORA_COLS, c1 - cb)
            for gi in range(s.nl):
                slot = s.lslot[gi]
                rk = g.rank[slot * g.nt + ti]
                if rk == 0:
                    continue
                b = g.bt[ti] + slot * g.r * n + cb
                for i in range(s.loff[gi], s.loff[gi + 1]):
                    t = s.lrows[i]
                    ll_lora_expand_f32(s.tmp + t * s.ldt + ti * g.r, b, n, rk, out + t * ldo + g.col[ti] + cb, w)
            cb += LORA_COLS


def lora_apply(LoraWeights lw, int layer, int group,
               const float[:, ::1] x,        # IN [T, K] the group's input rows
               const int32_t[::1] slots,     # IN [T] adapter slot of each row, -1: none
               float[:, ::1] out,            # IN/OUT [T, N] the group's output rows (targets side by side)
               int num_threads):
    """out[t] += each target's (x[t] @ A^T) @ B^T of row t's adapter, through the grouped
    shrink / expand phases forward() runs (tests compare it with NumPy)."""
    cdef Py_ssize_t T = x.shape[0], t
    cdef LoraStep s
    cdef const LoraG *g
    if not 0 <= layer < lw.num_layers or not 0 <= group < LORA_GROUPS:
        raise ValueError(f"layer {layer} / group {group} outside the adapter weights")
    g = &lw.g[layer * LORA_GROUPS + group]
    if x.shape[1] != g.k or slots.shape[0] != T or out.shape[0] != T or out.shape[1] != g.col[g.nt - 1] + g.n[g.nt - 1]:
        raise ValueError(f"lora_apply: x {tuple(x.shape)}, slots [{slots.shape[0]}], out {tuple(out.shape)}")
    for t in range(T):
        if slots[t] < -1 or slots[t] >= lw.max_loras:
            raise ValueError(f"slot {slots[t]} outside -1..{lw.max_loras - 1}")
    if T == 0:
        return
    grp = np.zeros(3 * T + 1, np.int32)
    seq = np.arange(T, dtype=np.int32)
    tmp = np.zeros((T, 3 * lw.max_rank), np.float32)
    cdef int32_t[::1] gv = grp, sv = seq
    cdef float[:, ::1] tv = tmp
    s.groups, s.tmp, s.ldt = lw.g, &tv[0, 0], tmp.shape[1]
    s.lslot, s.loff, s.lrows = &gv[0], &gv[T], &gv[2 * T + 1]
    s.nl = _lora_group(lw, &slots[0], &sv[0], T, &gv[0], &gv[T], &gv[2 * T + 1])
    with nogil, parallel(num_threads=num_threads):
        _lora_apply_thread(&s, g, &x[0, 0], x.shape[1], &out[0, 0], out.shape[1], openmp.omp_get_thread_num(),
                           openmp.omp_get_num_threads())


cdef void _lora_apply_thread(const LoraStep *s, const LoraG *g, const float *x, Py_ssize_t ldx, float *out,
                             Py_ssize_t ldo, int tid, int nth) noexcept nogil:
    """One thread of lora_apply's region: the shrink and expand phases as forward() runs them."""
    cdef ll_team tm = ll_team_make(NULL, tid, nth)   # static phases only
    _lora_shrink(s, g, x, ldx, &tm)
    ll_omp_barrier()
    _lora_expand(s, g, out, ldo, &tm)
