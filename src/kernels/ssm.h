/* Mamba2's selective state-space scan (SSD) for one head of one sequence's run of tokens, on one
 * thread, in the chunked form: within a chunk of up to LL_SSD_CHUNK tokens the outputs are a
 * masked, decayed product of C with B (like causal attention over the chunk) plus the incoming
 * state's share, and the state passes from chunk to chunk; a single token (decode) is the
 * recurrence itself. What is not here: the in_proj / conv / gated norm / out_proj around it,
 * dt's softplus and the loops over sequences and heads (the caller). */
#ifndef LL_SSM_H
#define LL_SSM_H
#include <math.h>
#include "../simd/vec.h"
LL_HOT_BEGIN

#define LL_SSD_CHUNK 64     /* tokens per chunk: the [Q, Q] decay-weighted C . B matrix fits in L1 */

/* Scratch floats one call needs (per thread). */
static inline ptrdiff_t ll_ssd_scratch(void) { return LL_SSD_CHUNK * LL_SSD_CHUNK + LL_SSD_CHUNK; }

/* With a = dt[t] * A (A < 0: -exp(A_log)) and the head's state S [P, N] (p: head channel, n:
 * state index), for t in 0..n-1:
 *   S = exp(a_t) S + dt_t x_t B_t^T           y_t = S C_t + D x_t
 * computed a chunk at a time: cum_t = sum of a over the chunk up to t,
 *   y_t = exp(cum_t) S_in C_t + sum_{s <= t} (C_t . B_s) exp(cum_t - cum_s) dt_s x_s + D x_t
 *   S_out = exp(cum_last) S_in + sum_s exp(cum_last - cum_s) dt_s x_s B_s^T
 * reset: S_in is zeros (the run starts the sequence). y must not alias x. */
static inline void ll_ssd_scan_f32(const float *x, ptrdiff_t ldx,     /* [n, ldx] the head's P inputs per token */
                                   const float *dt, ptrdiff_t lddt,   /* [n, lddt] the head's dt (after softplus) */
                                   float A, float D,
                                   const float *B, ptrdiff_t ldb,     /* [n, ldb] its group's N values of B */
                                   const float *C, ptrdiff_t ldc,     /* [n, ldc] and of C */
                                   float *y, ptrdiff_t ldy,           /* [n, ldy] the head's P outputs */
                                   float *state,                      /* [P, N] updated */
                                   ptrdiff_t n, ptrdiff_t P, ptrdiff_t N, int reset,
                                   float *scratch) {                  /* [ll_ssd_scratch()] */
    float *G = scratch;                          /* [Q, Q] (C_t . B_s) exp(cum_t - cum_s) dt_s, s <= t */
    float *cum = scratch + LL_SSD_CHUNK * LL_SSD_CHUNK;   /* [Q] */
    if (reset)
        for (ptrdiff_t i = 0; i < P * N; i++) state[i] = 0.0f;
    for (ptrdiff_t c0 = 0; c0 < n; c0 += LL_SSD_CHUNK) {
        const ptrdiff_t q = n - c0 < LL_SSD_CHUNK ? n - c0 : LL_SSD_CHUNK;
        float run = 0.0f;
        for (ptrdiff_t t = 0; t < q; t++) { run += dt[(c0 + t) * lddt] * A; cum[t] = run; }
        for (ptrdiff_t t = 0; t < q; t++) {
            const float *ct = C + (c0 + t) * ldc;
            for (ptrdiff_t s = 0; s <= t; s++) {
                const float *bs = B + (c0 + s) * ldb;
                float dot = 0.0f;
                for (ptrdiff_t k = 0; k < N; k++) dot += ct[k] * bs[k];
                G[t * LL_SSD_CHUNK + s] = dot * expf(cum[t] - cum[s]) * dt[(c0 + s) * lddt];
            }
        }
        for (ptrdiff_t t = 0; t < q; t++) {      /* outputs: the incoming state's share, the chunk's, D x */
            const float *ct = C + (c0 + t) * ldc, *xt = x + (c0 + t) * ldx;
            float *yt = y + (c0 + t) * ldy;
            const float decay = expf(cum[t]);
            for (ptrdiff_t p = 0; p < P; p++) {
                const float *sp = state + p * N;
                float acc = 0.0f;
                for (ptrdiff_t k = 0; k < N; k++) acc += sp[k] * ct[k];
                yt[p] = decay * acc + D * xt[p];
            }
            for (ptrdiff_t s = 0; s <= t; s++) {
                const float g = G[t * LL_SSD_CHUNK + s];
                const float *xs = x + (c0 + s) * ldx;
                for (ptrdiff_t p = 0; p < P; p++) yt[p] += g * xs[p];
            }
        }
        const float last = cum[q - 1];           /* the state after the chunk */
        const float keep = expf(last);
        for (ptrdiff_t i = 0; i < P * N; i++) state[i] *= keep;
        for (ptrdiff_t s = 0; s < q; s++) {
            const float w = expf(last - cum[s]) * dt[(c0 + s) * lddt];
            const float *xs = x + (c0 + s) * ldx, *bs = B + (c0 + s) * ldb;
            for (ptrdiff_t p = 0; p < P; p++) {
                const float wx = w * xs[p];
                float *sp = state + p * N;
                for (ptrdiff_t k = 0; k < N; k++) sp[k] += wx * bs[k];
            }
        }
    }
}
LL_HOT_END
#endif
