/* The gated delta rule (Gated DeltaNet, Qwen3-Next's linear-attention layers) for one value head
 * of one sequence's run of tokens, on one thread, in the chunked form: within a chunk of up to
 * LL_GDN_CHUNK tokens the delta rule's corrections are one lower-triangular solve and the outputs
 * a masked, decayed q . k product (like causal attention over the chunk) plus the incoming
 * state's share; the state passes from chunk to chunk; a single token (decode) is the recurrence
 * itself. What is not here: the projections, the convolution, the L2 norms of q and k, beta's
 * sigmoid and g's softplus, the gated norm, and the loops over sequences and heads (forward.pxi). */
#ifndef LL_DELTA_H
#define LL_DELTA_H
#include <math.h>
#include "../simd/vec.h"
#include "moe.h"   /* ll_dot_f32, ll_axpy_f32 */
LL_HOT_BEGIN

#define LL_GDN_CHUNK 64     /* tokens per chunk, as transformers' and FLA's chunked kernels */

/* Scratch floats one call needs (per thread) for value heads of Dv channels. */
static inline ptrdiff_t ll_gdn_scratch(ptrdiff_t Dv) {
    return 2 * LL_GDN_CHUNK * LL_GDN_CHUNK + LL_GDN_CHUNK * Dv + LL_GDN_CHUNK;
}

/* With the head's state S [Dk, Dv] (k: key channel, v: value channel), for t in 0..n-1:
 *   S = exp(g_t) S;   S += k_t (beta_t (v_t - S^T k_t))^T;   o_t = S^T q_t
 * (q_t already L2-normalised and scaled by Dk^-1/2, k_t L2-normalised, g_t <= 0 the log decay),
 * computed a chunk at a time: c_t = the sum of g over the chunk up to t,
 *   u   = (I + A)^-1 (beta (v - exp(c) k S))        A[i, j] = beta_i (k_i . k_j) exp(c_i - c_j), j < i
 *   o_i = exp(c_i) S^T q_i + sum_{j <= i} (q_i . k_j) exp(c_i - c_j) u_j
 *   S   = exp(c_last) S + sum_j exp(c_last - c_j) k_j u_j^T
 * reset: the incoming S is zeros (the run starts the sequence). o must not alias the inputs. */
static inline void ll_gated_delta_f32(const float *q, ptrdiff_t ldq,       /* [n, ldq] the head's Dk query values */
                                      const float *k, ptrdiff_t ldk,       /* [n, ldk] its Dk key values */
                                      const float *v, ptrdiff_t ldv,       /* [n, ldv] its Dv values */
                                      const float *g, ptrdiff_t ldg,       /* [n, ldg] its log decay */
                                      const float *beta, ptrdiff_t ldbeta, /* [n, ldbeta] its beta */
                                      float *o, ptrdiff_t ldo,             /* [n, ldo] its Dv outputs */
                                      float *state,                        /* [Dk, Dv] updated */
                                      ptrdiff_t n, ptrdiff_t Dk, ptrdiff_t Dv, int reset,
                                      float *scratch) {                    /* [ll_gdn_scratch(Dv)] */
    const ptrdiff_t Q = LL_GDN_CHUNK;
    float *A = scratch;                /* [Q, Q] strictly lower: beta_i (k_i . k_j) exp(c_i - c_j) */
    float *M = A + Q * Q;              /* [Q, Q] lower with the diagonal: (q_i . k_j) exp(c_i - c_j) */
    float *U = M + Q * Q;              /* [Q, Dv] the chunk's corrected values u */
    float *cum = U + Q * Dv;           /* [Q] */
    if (reset)
        for (ptrdiff_t i = 0; i < Dk * Dv; i++) state[i] = 0.0f;
    for (ptrdiff_t c0 = 0; c0 < n; c0 += Q) {
        const ptrdiff_t m = n - c0 < Q ? n - c0 : Q;
        float run = 0.0f;
        for (ptrdiff_t t = 0; t < m; t++) { run += g[(c0 + t) * ldg]; cum[t] = run; }
        for (ptrdiff_t i = 0; i < m; i++) {
            const float *ki = k + (c0 + i) * ldk, *qi = q + (c0 + i) * ldq;
            const float bi = beta[(c0 + i) * ldbeta];
            for (ptrdiff_t j = 0; j < i; j++) {
                const float *kj = k + (c0 + j) * ldk;
                const float d = expf(cum[i] - cum[j]);
                A[i * Q + j] = bi * ll_dot_f32(ki, kj, Dk) * d;
                M[i * Q + j] = ll_dot_f32(qi, kj, Dk) * d;
            }
            M[i * Q + i] = ll_dot_f32(qi, ki, Dk);
        }
        for (ptrdiff_t i = 0; i < m; i++) {      /* u by forward substitution, row by row */
            const float *ki = k + (c0 + i) * ldk, *vi = v + (c0 + i) * ldv;
            float *ui = U + i * Dv;
            for (ptrdiff_t x = 0; x < Dv; x++) ui[x] = 0.0f;
            for (ptrdiff_t c = 0; c < Dk; c++) ll_axpy_f32(ki[c], state + c * Dv, ui, Dv);   /* S^T k_i */
            const float e = expf(cum[i]), bi = beta[(c0 + i) * ldbeta];
            for (ptrdiff_t x = 0; x < Dv; x++) ui[x] = bi * (vi[x] - e * ui[x]);
            for (ptrdiff_t j = 0; j < i; j++) ll_axpy_f32(-A[i * Q + j], U + j * Dv, ui, Dv);
        }
        for (ptrdiff_t i = 0; i < m; i++) {      /* outputs: the incoming state's share, the chunk's */
            const float *qi = q + (c0 + i) * ldq;
            float *oi = o + (c0 + i) * ldo;
            for (ptrdiff_t x = 0; x < Dv; x++) oi[x] = 0.0f;
            for (ptrdiff_t c = 0; c < Dk; c++) ll_axpy_f32(qi[c], state + c * Dv, oi, Dv);
            const float e = expf(cum[i]);
            for (ptrdiff_t x = 0; x < Dv; x++) oi[x] *= e;
            for (ptrdiff_t j = 0; j <= i; j++) ll_axpy_f32(M[i * Q + j], U + j * Dv, oi, Dv);
        }
        const float last = cum[m - 1];           /* the state after the chunk */
        const float keep = expf(last);
        for (ptrdiff_t i = 0; i < Dk * Dv; i++) state[i] *= keep;
        for (ptrdiff_t j = 0; j < m; j++) {
            const float w = expf(last - cum[j]);
            const float *kj = k + (c0 + j) * ldk;
            for (ptrdiff_t c = 0; c < Dk; c++) ll_axpy_f32(w * kj[c], U + j * Dv, state + c * Dv, Dv);
        }
    }
}
LL_HOT_END
#endif
