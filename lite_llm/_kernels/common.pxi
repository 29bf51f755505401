# C declarations shared by ops.pxi and forward.pxi.
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport memcpy, memset
from libc.math cimport expf, sqrt
from cython.parallel cimport prange, parallel
cimport openmp

import os

import numpy as np

from lite_llm._kernels.kv_layout import KV_DTYPES, aligned_zeros, kv_geometry, kv_type
from lite_llm.config import ATTENTION_PATHS

cdef extern from "simd/vec.h" nogil:
    const char *LL_ISA_NAME
    float ll_bf16_to_f32(uint16_t h)
    uint16_t ll_f32_to_bf16(float f)
    float ll_f16_to_f32(uint16_t h)

cdef extern from "kernels/gemm.h" nogil:
    int LL_W_F32, LL_W_BF16, LL_W_F16, LL_W_FP8, LL_FP8_CHUNK, LL_FP8_CHUNK_BYTES
    int ll_gemm_wants_xb(int wtype)
    void ll_f32_to_bf16_pairs(const float *x, Py_ssize_t ldx, uint32_t *xb, Py_ssize_t t0,
                              Py_ssize_t t1, Py_ssize_t k)
    Py_ssize_t ll_panel_bytes(int wtype, Py_ssize_t k)

cdef extern from "kernels/qgemm.h" nogil:
    int LL_W_Q8_0, LL_W_Q4_0, LL_W_Q4_1, LL_W_Q4_K, LL_W_Q6_K, LL_W_Q5_0, LL_W_Q5_1, LL_W_Q5_K, LL_W_IQ4_NL
    int LL_W_IQ4_XS, LL_W_Q2_K, LL_W_Q3_K, LL_W_TQ2_0, LL_W_TQ1_0, LL_W_MXFP4, LL_W_IQ2_XXS, LL_W_IQ2_XS
    int LL_W_IQ2_S, LL_W_IQ3_XXS, LL_W_IQ3_S, LL_W_IQ1_S, LL_W_IQ1_M
    int LL_QT            # tokens per register tile (a step of at most LL_QT tokens runs as one tile)
    ctypedef struct ll_qact:
        const int8_t *q     # [T][ld]
        const float *d      # [T][ld / 32]
        const float *s      # [T][ld / 16]
        const int32_t *n    # [T][ld / 16]
        Py_ssize_t ld
    int ll_wtype_is_quant(int wtype)
    Py_ssize_t ll_qblock(int wtype)
    Py_ssize_t ll_qpanel_bytes(int wtype, Py_ssize_t k)
    Py_ssize_t ll_ggml_block_bytes(int wtype)
    void ll_quantize_rows_q8(const float *x, Py_ssize_t ldx, Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t k,
                             int8_t *q, float *d, float *s, int32_t *n)
    void ll_quantize_block_q8(const float *x, int8_t *q, float *d, float *s, int32_t *n)
    void ll_qpack_panel(const uint8_t *const *rows, int nrows, Py_ssize_t k, int wtype, uint8_t *pd)
    void ll_qpack_panels(const uint8_t *src, Py_ssize_t rows, Py_ssize_t k, int wtype, uint8_t *dst,
                         Py_ssize_t p0, Py_ssize_t p1)
    void ll_qdequant_lane(const uint8_t *wp, int wtype, Py_ssize_t k, int lane, float *out)
    void ll_quantize_row_ggml(const float *x, Py_ssize_t k, int wtype, uint8_t *dst)
    void ll_dequant_ggml(const uint8_t *src, int wtype, float *dst, Py_ssize_t b0, Py_ssize_t b1)

cdef extern from "kernels/matmul.h" nogil:
    int LL_IN_F32, LL_IN_BF16, LL_IN_Q8, LL_MAX_PARTS
    ctypedef struct ll_part:
        const void *w
        int wtype
        Py_ssize_t p0, p1, n0, n1
    ctypedef struct ll_mat:
        ll_part part[3]
        int num_parts
        int input
        int fma
        int stream
        Py_ssize_t n, k, num_panels
        const float *bias
    int ll_mat_input(const ll_mat *m)
    int ll_mat_form(const ll_mat *m, Py_ssize_t num_tokens)
    Py_ssize_t ll_part_panel_bytes(const ll_part *pt, Py_ssize_t k)
    void ll_mat_gemm(const float *x, const uint32_t *xb, const ll_qact *xq, Py_ssize_t ldx, Py_ssize_t num_tokens,
                     const ll_mat *m, float *out, Py_ssize_t ldo, int accumulate, Py_ssize_t p0, Py_ssize_t p1)
    void ll_mat_prefetch(const ll_mat *m, Py_ssize_t p0, Py_ssize_t p1)
    void ll_mat_gated(const float *x, const uint32_t *xb, const ll_qact *xq, Py_ssize_t ldx, Py_ssize_t num_tokens,
                      const ll_mat *m, Py_ssize_t F, int act, float *ao, Py_ssize_t lda, uint32_t *ao_b,
                      int8_t *aq, float *aqd, float *aqs, int32_t *aqn, Py_ssize_t q0, Py_ssize_t q1)

cdef extern from "kernels/norm.h" nogil:
    void ll_rmsnorm_f32(const float *x, const float *w, float *out, Py_ssize_t n, float eps)
    void ll_layernorm_f32(const float *x, const float *w, const float *b, float *out, Py_ssize_t n, float eps)

cdef extern from "kernels/rope.h" nogil:
    void ll_rope_neox_f32(float *x, const float *cos, const float *sin, Py_ssize_t head_dim)

cdef extern from "kernels/act.h" nogil:
    int LL_ACT_SILU, LL_ACT_GELU, LL_ACT_GELU_TANH, LL_ACT_RELU, LL_ACT_QUICK_GELU, LL_ACT_SWIGLU_OAI, LL_ACT_RELU2
    void ll_act_mul_f32(const float *gate, const float *up, float *out, Py_ssize_t n, int act)
    void ll_softcap_f32(float *x, Py_ssize_t n, float cap)

cdef extern from "kernels/attention.h" nogil:
    int LL_MAX_HEAD_DIM, LL_ATTN_QTILE, LL_ATTN_STAGE_ROWS, LL_KV_BF16
    int LL_ATTN_AUTO, LL_ATTN_AUTO_FMA, LL_ATTN_DIRECT, LL_ATTN_BF16, LL_ATTN_F32, LL_ATTN_ROWS
    Py_ssize_t ll_attention_scratch(Py_ssize_t head_dim, Py_ssize_t group)
    void ll_paged_attention_tile(const float *q, Py_ssize_t ldq, float *out, Py_ssize_t ldo, int nq,
                                 int group, Py_ssize_t h0, const int32_t *pos, const int32_t *last, int window,
                                 const void *k_cache, const void *v_cache, int kv_type,
                                 const int32_t *block_table, Py_ssize_t block_size, Py_ssize_t kv_head,
                                 Py_ssize_t num_kv_heads, Py_ssize_t head_dim, float scale, float softcap,
                                 const float *sinks, float *scratch, int split, int nsplit, float *partial, int path)
    void ll_attention_combine(const float *partials, int nsplit, Py_ssize_t stride, int nq, int group,
                              Py_ssize_t h0, float *out, Py_ssize_t ldo, Py_ssize_t head_dim, const float *sinks)
    void ll_write_kv_row(const float *src, void *cache, int kv_type, Py_ssize_t slot,
                         Py_ssize_t block_size, Py_ssize_t num_kv_heads, Py_ssize_t head_dim, int is_k)

ISA = LL_ISA_NAME.decode()
ACTIVATIONS = {"silu": LL_ACT_SILU, "gelu": LL_ACT_GELU, "gelu_tanh": LL_ACT_GELU_TANH, "relu": LL_ACT_RELU,
               "quick_gelu": LL_ACT_QUICK_GELU, "swiglu_oai": LL_ACT_SWIGLU_OAI, "relu2": LL_ACT_RELU2}
WTYPES = {"float32": LL_W_F32, "bfloat16": LL_W_BF16, "float16": LL_W_F16, "Q8_0": LL_W_Q8_0,
          "Q4_0": LL_W_Q4_0, "Q4_1": LL_W_Q4_1, "Q5_0": LL_W_Q5_0, "Q5_1": LL_W_Q5_1, "Q4_K": LL_W_Q4_K,
          "Q5_K": LL_W_Q5_K, "Q6_K": LL_W_Q6_K, "IQ4_NL": LL_W_IQ4_NL, "IQ4_XS": LL_W_IQ4_XS,
          "Q2_K": LL_W_Q2_K, "Q3_K": LL_W_Q3_K, "TQ2_0": LL_W_TQ2_0, "TQ1_0": LL_W_TQ1_0, "MXFP4": LL_W_MXFP4,
          "IQ2_XXS": LL_W_IQ2_XXS, "IQ2_XS": LL_W_IQ2_XS, "IQ2_S": LL_W_IQ2_S, "IQ3_XXS": LL_W_IQ3_XXS,
          "IQ3_S": LL_W_IQ3_S, "IQ1_S": LL_W_IQ1_S, "IQ1_M": LL_W_IQ1_M,
          "F8_E4M3": LL_W_FP8}   # FP8 checkpoints: e4m3 bytes with per-row scales per 128 columns (gemm.h)
INPUT_FORMS = {LL_IN_F32: "float32", LL_IN_BF16: "bfloat16 pairs", LL_IN_Q8: "int8 blocks"}
# How this build can multiply bf16 weights in steps of several tokens (decode streams with the
# first): vdpbf16ps on bf16 pairs, or the weights widened to fp32 in registers and FMA.
BF16_PATHS = ("dpbf16", "fma") if ll_gemm_wants_xb(LL_W_BF16) else ("fma",)

# A packed weight (layout.py) in one or more parts of their own formats, with its optional
# fp32 bias and the activation form its kernels take (src/kernels/matmul.h).
ctypedef ll_mat Mat


cdef inline const void *_ptr(object arr) except NULL:
    """Data pointer of a C-contiguous numpy array (kept alive by the caller)."""
    if not arr.flags.c_contiguous:
        raise ValueError("array must be C-contiguous")
    return <const void *><size_t>arr.ctypes.data


cdef Mat _make_mat(object w, list parts, Py_ssize_t n, Py_ssize_t k, object bias, list keep,
                   bint fma=False, bint stream=True) except *:
    """Mat over packed buffer w: parts are (type name, first panel, end panel, first column,
    end column, byte offset in w), at most LL_MAX_PARTS; float formats are one part. fma: bf16
    weights run steps of several tokens on the fp32-FMA path (matmul.h), where the build also
    has vdpbf16ps. stream False: one-token steps through the tiles too (batch-invariant, gemm.h)."""
    cdef Mat m
    cdef int i
    cdef Py_ssize_t off
    cdef const char *base = <const char *>_ptr(w)
    if not 1 <= len(parts) <= LL_MAX_PARTS:
        raise ValueError(f"a matrix has 1..{LL_MAX_PARTS} parts, not {len(parts)}")
    for i, (tname, p0, p1, n0, n1, offset) in enumerate(parts):
        off = offset
        m.part[i].w = base + off
        m.part[i].wtype = WTYPES[tname]
        m.part[i].p0, m.part[i].p1, m.part[i].n0, m.part[i].n1 = p0, p1, n0, n1
        if ll_wtype_is_quant(m.part[i].wtype):
            if k % ll_qblock(m.part[i].wtype):
                raise ValueError(f"{tname} rows of {k} values are not whole blocks")
        elif len(parts) != 1 or p0 != 0:
            raise ValueError(f"a {tname} matrix is a single part")
        if off + (p1 - p0) * ll_part_panel_bytes(&m.part[i], k) > w.nbytes:
            raise ValueError(f"part {i} ({tname}, panels {p0}..{p1}) runs past its buffer of {w.nbytes} bytes")
    m.num_parts = len(parts)
    for i in range(1, m.num_parts):
        if ll_wtype_is_quant(m.part[i].wtype) != ll_wtype_is_quant(m.part[0].wtype):
            raise ValueError("a matrix mixes float and block-quantized parts")
    m.n, m.k, m.num_panels = n, k, parts[len(parts) - 1][2]
    m.bias = <const float *>_ptr(bias) if bias is not None else NULL
    m.input = ll_mat_input(&m)
    m.fma = fma and m.input == LL_IN_BF16
    m.stream = stream
    keep.append(w)
    keep.append(bias)
    return m


cdef inline void _to_input(int form, const float *x, Py_ssize_t ldx, Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t k,
                           uint32_t *xb, const ll_qact *xq) noexcept nogil:
    """Rows t0..t1 of fp32 x [T][ldx] (k values) into the input form a matrix takes."""
    if form == LL_IN_BF16:
        ll_f32_to_bf16_pairs(x, ldx, xb, t0, t1, k)
    elif form == LL_IN_Q8:
        ll_quantize_rows_q8(x, ldx, t0, t1, k, <int8_t *>xq.q, <float *>xq.d, <float *>xq.s, <int32_t *>xq.n)


cdef inline ll_qact _qact(int8_t *q, float *d, float *s, int32_t *n, Py_ssize_t k) noexcept nogil:
    cdef ll_qact a
    a.q, a.d, a.s, a.n, a.ld = q, d, s, n, k
    return a


cdef inline ll_qact _qact_ld(const ll_qact *xq, Py_ssize_t ld) noexcept nogil:
    """xq's buffers read as rows of ld values (one buffer sized for the widest matrix serves
    matrices of every width: the block GEMMs read the rows at a stride of their k)."""
    cdef ll_qact a = xq[0]
    a.ld = ld
    return a


cdef extern from "kernels/moe.h" nogil:
    float ll_dot_f32(const float *a, const float *b, Py_ssize_t n)
    int LL_MOE_SOFTMAX_TOPK, LL_MOE_TOPK_SOFTMAX
    void ll_moe_route(const float *logits, int num_experts, int k, int renorm, int mode, int32_t *sel,
                      float *weight)
    void ll_axpy_f32(float a, const float *x, float *y, Py_ssize_t n)
    int LL_MOE_GROUPED_SOFTMAX, LL_MOE_GROUPED_SIGMOID, LL_MOE_MAX_EXPERTS
    void ll_moe_route_grouped(const float *logits, const float *bias, int num_experts, int k, int n_group,
                              int topk_group, int renorm, int sigmoid, float scale, int32_t *sel, float *weight)

cdef extern from "kernels/conv.h" nogil:
    int LL_CONV_MAX_LEN
    void ll_short_conv_f32(const float *bcx, Py_ssize_t ldb, float *out, Py_ssize_t ldo, float *state, const float *w,
                           const float *bias, Py_ssize_t n, Py_ssize_t E, int L, int reset, Py_ssize_t c0,
                           Py_ssize_t c1)
    void ll_causal_conv_silu_f32(const float *x, Py_ssize_t ldi, float *out, Py_ssize_t ldo, float *state,
                                 const float *w, const float *bias, Py_ssize_t n, Py_ssize_t E, int L, int reset,
                                 Py_ssize_t c0, Py_ssize_t c1)

cdef extern from "kernels/ssm.h" nogil:
    int LL_SSD_CHUNK
    Py_ssize_t ll_ssd_scratch()
    void ll_ssd_scan_f32(const float *x, Py_ssize_t ldx, const float *dt, Py_ssize_t lddt, float A, float D,
                         const float *B, Py_ssize_t ldb, const float *C, Py_ssize_t ldc, float *y, Py_ssize_t ldy,
                         float *state, Py_ssize_t n, Py_ssize_t P, Py_ssize_t N, int reset, float *scratch)

cdef extern from "kernels/delta.h" nogil:
    int LL_GDN_CHUNK
    Py_ssize_t ll_gdn_scratch(Py_ssize_t Dv)
    void ll_gated_delta_f32(const float *q, Py_ssize_t ldq, const float *k, Py_ssize_t ldk, const float *v,
                            Py_ssize_t ldv, const float *g, Py_ssize_t ldg, const float *beta, Py_ssize_t ldbeta,
                            float *o, Py_ssize_t ldo, float *state, Py_ssize_t n, Py_ssize_t Dk, Py_ssize_t Dv,
                            int reset, float *scratch)

cdef extern from "kernels/mla.h" nogil:
    Py_ssize_t ll_mla_scratch(Py_ssize_t heads, Py_ssize_t dk)
    void ll_mla_attention(const float *q, Py_ssize_t dk, Py_ssize_t r, int h0, int h1, const void *cache, int bf16,
                          const int32_t *block_table, Py_ssize_t block_size, Py_ssize_t first, Py_ssize_t last,
                          float scale, float *out, float *scratch)
    void ll_mla_write_row(const float *src, void *cache, int bf16, Py_ssize_t slot, Py_ssize_t dk)

# KernelConfig.moe_routing -> LL_MOE_*
MOE_ROUTINGS = {"softmax_topk": LL_MOE_SOFTMAX_TOPK, "topk_softmax": LL_MOE_TOPK_SOFTMAX,
                "grouped_softmax": LL_MOE_GROUPED_SOFTMAX, "grouped_sigmoid": LL_MOE_GROUPED_SIGMOID}

cdef extern from "omp_util.h" nogil:
    void ll_omp_barrier()
    void ll_barrier_reset(int *count, int *sense)
    void ll_barrier_enter(int *count, int *sense, int nth)
    void ll_barrier_leave()
    void ll_set_barrier_spins(int spins)

cdef extern from "work.h" nogil:
    # the work dispenser of every parallel phase (forward() and the kernel wrappers)
    int LL_WORK_STATIC, LL_WORK_DYNAMIC
    ctypedef struct ll_team:
        long long *counter
        long long base
        int tid, nth
    ctypedef struct ll_work:
        pass
    ll_team ll_team_make(long long *counter, int tid, int nth)
    ll_work ll_work_begin(ll_team *tm, int mode, Py_ssize_t units, Py_ssize_t chunk)
    bint ll_work_take(ll_work *w, Py_ssize_t *lo, Py_ssize_t *hi)
    void ll_work_static(ll_team *tm, Py_ssize_t units, Py_ssize_t chunk, Py_ssize_t *lo, Py_ssize_t *hi)

cdef enum:
    DYN_MAX_TOKENS = 4   # steps this small stream weights: panels handed out dynamically


cdef inline int _gemm_mode(Py_ssize_t num_tokens) noexcept nogil:
    """How a GEMM phase hands out its panels (work.h): big steps statically (compute-bound,
    even); small steps stream weights, where one core's slower stream would leave the other
    waiting at the barrier: chunks from the team's counter instead."""
    return LL_WORK_STATIC if num_tokens > DYN_MAX_TOKENS else LL_WORK_DYNAMIC


cdef inline Py_ssize_t _panel_chunk(int mode, Py_ssize_t units, int nth) noexcept nogil:
    """Units per take: static runs are whole (chunk 1); dynamic ones ~8 chunks per thread of
    at least 4 units, so the counter is touched a few times per thread, not per panel."""
    cdef Py_ssize_t per = units // (8 * nth)
    if mode == LL_WORK_STATIC:
        return 1
    return per if per > 4 else 4


cdef inline void _gemm_phase(const float *x, Py_ssize_t ldx, const uint32_t *xb, const ll_qact *xq,
                             Py_ssize_t num_tokens, const Mat *w, float *out, Py_ssize_t ldo, int accumulate,
                             int mode, ll_team *tm) noexcept nogil:
    """This thread's share of out (+)= x @ W.T (+ bias), 16-row panels handed out by `mode`
    (_gemm_mode; static where a thread prefetched its own run, work.h), x also as bf16 pairs
    (xb) or int8 blocks (xq) where the matrix's kernels take those."""
    cdef Py_ssize_t p0, p1
    cdef ll_work wk = ll_work_begin(tm, mode, w.num_panels, _panel_chunk(mode, w.num_panels, tm.nth))
    while ll_work_take(&wk, &p0, &p1):
        ll_mat_gemm(x, xb, xq, ldx, num_tokens, w, out, ldo, accumulate, p0, p1)


cdef inline void _row_share(ll_team *tm, Py_ssize_t n, Py_ssize_t *t0, Py_ssize_t *t1) noexcept nogil:
    """This thread's rows [t0, t1) of a phase over n rows: a static share when there are enough
    rows to share, else all of them on thread 0 (a few rows take microseconds)."""
    if n >= 2 * tm.nth:
        ll_work_static(tm, n, 1, t0, t1)
    elif tm.tid == 0:
        t0[0], t1[0] = 0, n
    else:
        t0[0], t1[0] = 0, 0


cdef inline void _to_input_rows(int form, const float *x, Py_ssize_t ldx, Py_ssize_t num_tokens, Py_ssize_t k,
                                uint32_t *xb, const ll_qact *xq, ll_team *tm) noexcept nogil:
    """All rows of x in a matrix's input form, this thread's share (_row_share); the caller's
    barrier ends it."""
    cdef Py_ssize_t t0, t1
    _row_share(tm, num_tokens, &t0, &t1)
    _to_input(form, x, ldx, t0, t1, k, xb, xq)


cdef void _gemm(const float *x, Py_ssize_t ldx, uint32_t *xb, const ll_qact *xq, Py_ssize_t num_tokens,
                const Mat *m, float *out, Py_ssize_t ldo, int accumulate, int num_threads) noexcept nogil:
    """out[T, n] (+)= x[T, k] @ W.T + bias on its own (the kernel tests, the vision encoder): in
    one parallel region, x into the matrix's input form, then the panels handed out as forward()'s
    GEMM phases hand them (forward() fuses the conversion into the phase that produces x instead)."""
    cdef long long counter[8]   # the team's work counter (work.h): one cache line of this stack
    cdef int form = ll_mat_form(m, num_tokens)
    counter[0] = 0
    with parallel(num_threads=num_threads):
        _gemm_thread(x, ldx, xb, xq, num_tokens, m, out, ldo, accumulate, form, counter,
                     openmp.omp_get_thread_num(), openmp.omp_get_num_threads())


cdef void _gemm_thread(const float *x, Py_ssize_t ldx, uint32_t *xb, const ll_qact *xq, Py_ssize_t num_tokens,
                       const Mat *m, float *out, Py_ssize_t ldo, int accumulate, int form, long long *counter,
                       int tid, int nth) noexcept nogil:
    cdef ll_team tm = ll_team_make(counter, tid, nth)
    if form != LL_IN_F32:
        _to_input_rows(form, x, ldx, num_tokens, m.k, xb, xq, &tm)
        ll_omp_barrier()
    _gemm_phase(x, ldx, xb, xq, num_tokens, m, out, ldo, accumulate, _gemm_mode(num_tokens), &tm)

cdef extern from "kernels/quant.h" nogil:
    int LL_STORED_LE
    void ll_f32_to_bf16_n(const float *src, uint16_t *dst, Py_ssize_t i0, Py_ssize_t i1)
    void ll_pack_panel_rows(const void *const *rows, int nrows, int stype, Py_ssize_t k, int wtype, void *dst)
    void ll_pack_panels(const void *src, void *dst, Py_ssize_t n, Py_ssize_t k, int wtype,
                        Py_ssize_t p0, Py_ssize_t p1)

cdef extern from "populate.h" nogil:
    void ll_populate_read(const void *p, size_t length)

cdef extern from "kernels/peak.h" nogil:
    int LL_PEAK_FMA, LL_PEAK_DPBF16, LL_PEAK_DPBUSD, LL_PEAK_MADDUBS
    const char *LL_INT8_PATH_NAME
    int ll_peak_has(int kind)
    const char *ll_peak_name(int kind)
    double ll_peak_run(int kind, Py_ssize_t rounds, float seed, float *sink)

# Inner-product instructions the start-up micro-benchmark can time in this build (peak.h), and
# the one this build's int8-block kernels run (qgemm.h through ll_dpbusd).
PEAK_KINDS = {ll_peak_name(kind).decode(): kind
              for kind in (LL_PEAK_FMA, LL_PEAK_DPBF16, LL_PEAK_DPBUSD, LL_PEAK_MADDUBS) if ll_peak_has(kind)}
INT8_PATH = LL_INT8_PATH_NAME.decode()
