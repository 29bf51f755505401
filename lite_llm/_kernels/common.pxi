# C declarations shared by ops.pxi and forward.pxi.
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t
from libc.stdlib cimport malloc, free, calloc
from libc.string cimport memcpy, memset
from cython.parallel cimport prange, parallel
cimport openmp
import numpy as np

cdef extern from "simd/vec.h" nogil:
    const char *LL_ISA_NAME
    float ll_bf16_to_f32(uint16_t h)
    uint16_t ll_f32_to_bf16(float f)
    float ll_f16_to_f32(uint16_t h)

cdef extern from "kernels/gemm.h" nogil:
    int LL_W_F32, LL_W_BF16, LL_W_F16
    int ll_gemm_wants_xb(int wtype)
    void ll_f32_to_bf16_pairs(const float *x, Py_ssize_t ldx, uint32_t *xb, Py_ssize_t t0,
                              Py_ssize_t t1, Py_ssize_t k)
    void ll_gemm_panels(const float *x, const uint32_t *xb, Py_ssize_t ldx, Py_ssize_t num_tokens,
                        const void *w, int wtype, Py_ssize_t k, Py_ssize_t n, const float *bias,
                        float *out, Py_ssize_t ldo, int accumulate, Py_ssize_t p0, Py_ssize_t p1)
    void ll_prefetch_panels(const void *w, int wtype, Py_ssize_t k, Py_ssize_t p0, Py_ssize_t p1)
    void ll_gemm_gated(const float *x, const uint32_t *xb, Py_ssize_t ldx, Py_ssize_t num_tokens,
                       const void *w, int wtype, Py_ssize_t k, Py_ssize_t F, const float *bias, int act,
                       float *ao, Py_ssize_t lda, uint32_t *ao_b, Py_ssize_t q0, Py_ssize_t q1)

cdef extern from "kernels/norm.h" nogil:
    void ll_rmsnorm_f32(const float *x, const float *w, float *out, Py_ssize_t n, float eps)
    void ll_layernorm_f32(const float *x, const float *w, const float *b, float *out, Py_ssize_t n, float eps)

cdef extern from "kernels/rope.h" nogil:
    void ll_rope_neox_f32(float *x, const float *cos, const float *sin, Py_ssize_t head_dim)

cdef extern from "kernels/act.h" nogil:
    int LL_ACT_SILU, LL_ACT_GELU, LL_ACT_GELU_TANH, LL_ACT_RELU
    void ll_act_mul_f32(const float *gate, const float *up, float *out, Py_ssize_t n, int act)

cdef extern from "kernels/attention.h" nogil:
    int LL_MAX_HEAD_DIM, LL_ATTN_QTILE
    Py_ssize_t ll_attention_scratch(Py_ssize_t head_dim, Py_ssize_t group)
    void ll_paged_attention_tile(const float *q, Py_ssize_t ldq, float *out, Py_ssize_t ldo, int nq,
                                 int group, Py_ssize_t h0, const int32_t *pos, int window,
                                 const void *k_cache, const void *v_cache, int kv_bf16,
                                 const int32_t *block_table, Py_ssize_t block_size, Py_ssize_t kv_head,
                                 Py_ssize_t num_kv_heads, Py_ssize_t head_dim, float scale, float *scratch,
                                 int split, int nsplit, float *partial)
    void ll_attention_combine(const float *partials, int nsplit, Py_ssize_t stride, int nq, int group,
                              Py_ssize_t h0, float *out, Py_ssize_t ldo, Py_ssize_t head_dim)
    void ll_write_kv_row(const float *src, void *cache, int kv_bf16, Py_ssize_t slot,
                         Py_ssize_t block_size, Py_ssize_t num_kv_heads, Py_ssize_t head_dim, int is_k)

ISA = LL_ISA_NAME.decode()
ACTIVATIONS = {"silu": LL_ACT_SILU, "gelu": LL_ACT_GELU, "gelu_tanh": LL_ACT_GELU_TANH, "relu": LL_ACT_RELU}
WTYPES = {"float32": LL_W_F32, "bfloat16": LL_W_BF16, "float16": LL_W_F16}


cdef struct Mat:
    # A packed weight (layout.py) and its optional fp32 bias.
    const void *w
    const float *bias
    Py_ssize_t n, k, num_panels
    int wtype


cdef inline const void *_ptr(object arr) except NULL:
    """Data pointer of a C-contiguous numpy array (kept alive by the caller)."""
    if not arr.flags.c_contiguous:
        raise ValueError("array must be C-contiguous")
    return <const void *><size_t>arr.ctypes.data


cdef inline Py_ssize_t _lo(Py_ssize_t n, int tid, int nth) noexcept nogil:
    return n * tid // nth


cdef inline void _gemm_part(const float *x, Py_ssize_t ldx, const uint32_t *xb, Py_ssize_t num_tokens,
                            const Mat *w, float *out, Py_ssize_t ldo, int accumulate, int tid,
                            int nth) noexcept nogil:
    """This thread's share of out (+)= x @ W.T: a contiguous range of 16-row panels, so decode
    streams each weight byte once; xb holds x as bf16 pairs where the kernel wants them."""
    ll_gemm_panels(x, xb if ll_gemm_wants_xb(w.wtype) else NULL, ldx, num_tokens, w.w, w.wtype, w.k,
                   w.n, w.bias, out, ldo, accumulate, _lo(w.num_panels, tid, nth),
                   _lo(w.num_panels, tid + 1, nth))


cdef void _gemm(const float *x, Py_ssize_t ldx, uint32_t *xb, Py_ssize_t num_tokens, const Mat *m,
                float *out, Py_ssize_t ldo, int accumulate, int num_threads) noexcept nogil:
    """out[T, n] (+)= x[T, k] @ W.T + bias on its own: converts x to bf16 pairs first where the
    kernel wants them, then each thread runs _gemm_part (forward() fuses the conversion into
    the phase that produces x instead)."""
    cdef Py_ssize_t tid, nt = num_threads
    if ll_gemm_wants_xb(m.wtype):
        if num_tokens >= 2 * nt:
            for tid in prange(nt, schedule="static", num_threads=num_threads):
                ll_f32_to_bf16_pairs(x, ldx, xb, _lo(num_tokens, tid, nt), _lo(num_tokens, tid + 1, nt), m.k)
        else:
            ll_f32_to_bf16_pairs(x, ldx, xb, 0, num_tokens, m.k)
    if nt > m.num_panels:
        nt = m.num_panels
    for tid in prange(nt, schedule="static", num_threads=nt):
        _gemm_part(x, ldx, xb, num_tokens, m, out, ldo, accumulate, tid, nt)

cdef extern from "omp_util.h" nogil:
    void ll_omp_barrier()
    int ll_atomic_next(int *counter)

cdef extern from "kernels/quant.h" nogil:
    void ll_dequant_q8_0(const unsigned char *src, float *dst, Py_ssize_t b0, Py_ssize_t b1)
    void ll_dequant_q4_0(const unsigned char *src, float *dst, Py_ssize_t b0, Py_ssize_t b1)
    void ll_dequant_q4_1(const unsigned char *src, float *dst, Py_ssize_t b0, Py_ssize_t b1)
    void ll_dequant_q4_k(const unsigned char *src, float *dst, Py_ssize_t b0, Py_ssize_t b1)
    void ll_dequant_q6_k(const unsigned char *src, float *dst, Py_ssize_t b0, Py_ssize_t b1)
    void ll_f32_to_bf16_n(const float *src, uint16_t *dst, Py_ssize_t i0, Py_ssize_t i1)
    void ll_pack_panels(const void *src, void *dst, Py_ssize_t n, Py_ssize_t k, int wtype,
                        Py_ssize_t p0, Py_ssize_t p1)
