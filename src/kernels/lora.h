/* LoRA's low-rank products for one row of one adapter, one thread (the grouping of a step's
 * rows by adapter and the loops over them are lite_llm/_kernels/lora.pxi's):
 *
 *   shrink   t [r]  = A [r, K] . x [K]           (x @ A^T: the rank-r code of the row)
 *   expand   y [n] += t [r] . Bt [r, n]          (code @ B^T, the adapter's scale folded into Bt)
 *
 * Never merged into the base weights: the base matrix stays in its own (possibly quantized)
 * format, shared by every adapter and by rows without one.
 */
#ifndef LL_LORA_H
#define LL_LORA_H
#include "../simd/vec.h"
LL_HOT_BEGIN

/* out[i] = a[i * lda] . x over k values, for nrows <= 4 rows of a (x loaded once per lane group). */
static inline void ll_lora_shrink_f32(const float *a /* [nrows][lda] */, ptrdiff_t lda, int nrows,
                                      const float *x /* [k] */, ptrdiff_t k, float *out /* [nrows] */) {
    ll_vf32 acc0 = ll_zero(), acc1 = ll_zero(), acc2 = ll_zero(), acc3 = ll_zero();
    const float *a0 = a, *a1 = a + (nrows > 1 ? lda : 0), *a2 = a + (nrows > 2 ? 2 * lda : 0),
                *a3 = a + (nrows > 3 ? 3 * lda : 0);
    ptrdiff_t i = 0;
    for (; i + LL_VF32_LANES <= k; i += LL_VF32_LANES) {
        const ll_vf32 xv = ll_load(x + i);
        acc0 = ll_fma(ll_load(a0 + i), xv, acc0);
        acc1 = ll_fma(ll_load(a1 + i), xv, acc1);
        acc2 = ll_fma(ll_load(a2 + i), xv, acc2);
        acc3 = ll_fma(ll_load(a3 + i), xv, acc3);
    }
    float s[4] = {ll_hsum(acc0), ll_hsum(acc1), ll_hsum(acc2), ll_hsum(acc3)};
    for (; i < k; i++) {   /* tail: k need not be a multiple of the lanes */
        s[0] += a0[i] * x[i]; s[1] += a1[i] * x[i]; s[2] += a2[i] * x[i]; s[3] += a3[i] * x[i];
    }
    for (int j = 0; j < nrows; j++) out[j] = s[j];
}

/* out0[j] = a[j * lda] . x0 and out1[j] = a[j * lda] . x1 over k values, for nrows <= 4 rows of a:
 * two rows of a step against the same rank rows, each A lane group loaded once for both. */
static inline void ll_lora_shrink2_f32(const float *a /* [nrows][lda] */, ptrdiff_t lda, int nrows,
                                       const float *x0 /* [k] */, const float *x1 /* [k] */, ptrdiff_t k,
                                       float *out0 /* [nrows] */, float *out1 /* [nrows] */) {
    ll_vf32 p0 = ll_zero(), p1 = ll_zero(), p2 = ll_zero(), p3 = ll_zero();
    ll_vf32 q0 = ll_zero(), q1 = ll_zero(), q2 = ll_zero(), q3 = ll_zero();
    const float *a0 = a, *a1 = a + (nrows > 1 ? lda : 0), *a2 = a + (nrows > 2 ? 2 * lda : 0),
                *a3 = a + (nrows > 3 ? 3 * lda : 0);
    ptrdiff_t i = 0;
    for (; i + LL_VF32_LANES <= k; i += LL_VF32_LANES) {
        const ll_vf32 u = ll_load(x0 + i), v = ll_load(x1 + i);
        ll_vf32 w = ll_load(a0 + i);
        p0 = ll_fma(w, u, p0); q0 = ll_fma(w, v, q0);
        w = ll_load(a1 + i);
        p1 = ll_fma(w, u, p1); q1 = ll_fma(w, v, q1);
        w = ll_load(a2 + i);
        p2 = ll_fma(w, u, p2); q2 = ll_fma(w, v, q2);
        w = ll_load(a3 + i);
        p3 = ll_fma(w, u, p3); q3 = ll_fma(w, v, q3);
    }
    float s[4] = {ll_hsum(p0), ll_hsum(p1), ll_hsum(p2), ll_hsum(p3)};
    float t[4] = {ll_hsum(q0), ll_hsum(q1), ll_hsum(q2), ll_hsum(q3)};
    for (; i < k; i++) {
        s[0] += a0[i] * x0[i]; s[1] += a1[i] * x0[i]; s[2] += a2[i] * x0[i]; s[3] += a3[i] * x0[i];
        t[0] += a0[i] * x1[i]; t[1] += a1[i] * x1[i]; t[2] += a2[i] * x1[i]; t[3] += a3[i] * x1[i];
    }
    for (int j = 0; j < nrows; j++) { out0[j] = s[j]; out1[j] = t[j]; }
}

/* y[0..n) += sum_j t[j] * bt[j * ldb + 0..n) over j < r: each lane group of y read and
 * written once, the r rows of Bt streamed. */
static inline void ll_lora_expand_f32(const float *t /* [r] */, const float *bt /* [r][ldb] */, ptrdiff_t ldb,
                                      int r, float *y /* [n] */, ptrdiff_t n) {
    ptrdiff_t i = 0;
    for (; i + LL_VF32_LANES <= n; i += LL_VF32_LANES) {
        ll_vf32 acc = ll_load(y + i);
        for (int j = 0; j < r; j++) acc = ll_fma(ll_set1(t[j]), ll_load(bt + j * ldb + i), acc);
        ll_store(y + i, acc);
    }
    for (; i < n; i++) {
        float s = y[i];
        for (int j = 0; j < r; j++) s += t[j] * bt[j * ldb + i];
        y[i] = s;
    }
}
LL_HOT_END
#endif
