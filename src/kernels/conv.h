/* The causal depthwise convolutions of hybrid models over one sequence's run of tokens and a
 * range of channels, on one thread: LFM2's gated short convolution, whose state per sequence is
 * the last L - 1 gated inputs of each channel (a fixed size, not KV blocks), and Mamba2's
 * convolution with SiLU (its state the last L - 1 inputs). What is not here:
 * the in_proj / out_proj GEMMs around it and the loop over sequences (forward.pxi). */
#ifndef LL_CONV_H
#define LL_CONV_H
#include <math.h>
#include "../simd/vec.h"
LL_HOT_BEGIN

#define LL_CONV_MAX_LEN 8   /* conv_L_cache up to this (LFM2 uses 3): the window lives in registers */

/* For t in 0..n-1 and channels c in [c0, c1):
 *   u[t, c]   = B[t, c] * x[t, c]                         (B, C, x: the in_proj row's thirds)
 *   y[t, c]   = bias[c] + sum_k w[k, c] * ext[t + k, c]   (k = 0..L-1; ext = the state's L - 1
 *                                                          rows, then u; tap L - 1 is the token's own)
 *   out[t, c] = C[t, c] * y[t, c]
 * and the state becomes the last L - 1 rows of ext. reset: the incoming state is zeros (the
 * run starts the sequence). out must not alias bcx. */
static inline void ll_short_conv_f32(const float *bcx,    /* [n, ldb] rows of B | C | x, E each */
                                     ptrdiff_t ldb,
                                     float *out,          /* [n, ldo] */
                                     ptrdiff_t ldo,
                                     float *state,        /* [L - 1, E] oldest row first; updated */
                                     const float *w,      /* [L, E] the taps, channel-minor */
                                     const float *bias,   /* [E], or NULL */
                                     ptrdiff_t n, ptrdiff_t E, int L, int reset, ptrdiff_t c0, ptrdiff_t c1) {
    const int S = L - 1;
    ptrdiff_t c = c0;
    for (; c + 16 <= c1; c += 16) {
        ll_vf32 win[LL_CONV_MAX_LEN], wk[LL_CONV_MAX_LEN];
        for (int k = 0; k < S; k++) win[k] = reset ? ll_zero() : ll_load(state + k * E + c);
        for (int k = 0; k < L; k++) wk[k] = ll_load(w + k * E + c);
        const ll_vf32 b = bias ? ll_load(bias + c) : ll_zero();
        for (ptrdiff_t t = 0; t < n; t++) {
            const float *row = bcx + t * ldb;
            const ll_vf32 u = ll_mul(ll_load(row + c), ll_load(row + 2 * E + c));
            ll_vf32 acc = ll_fma(wk[S], u, b);
            for (int k = 0; k < S; k++) acc = ll_fma(wk[k], win[k], acc);
            ll_store(out + t * ldo + c, ll_mul(ll_load(row + E + c), acc));
            for (int k = 0; k + 1 < S; k++) win[k] = win[k + 1];
            if (S > 0) win[S - 1] = u;
        }
        for (int k = 0; k < S; k++) ll_store(state + k * E + c, win[k]);
    }
    for (; c < c1; c++) {   /* the channels past the last whole vector */
        float win[LL_CONV_MAX_LEN];
        for (int k = 0; k < S; k++) win[k] = reset ? 0.0f : state[k * E + c];
        for (ptrdiff_t t = 0; t < n; t++) {
            const float *row = bcx + t * ldb;
            const float u = row[c] * row[2 * E + c];
            float acc = (bias ? bias[c] : 0.0f) + w[S * E + c] * u;
            for (int k = 0; k < S; k++) acc += w[k * E + c] * win[k];
            out[t * ldo + c] = row[E + c] * acc;
            for (int k = 0; k + 1 < S; k++) win[k] = win[k + 1];
            if (S > 0) win[S - 1] = u;
        }
        for (int k = 0; k < S; k++) state[k * E + c] = win[k];
    }
}
/* Mamba2's convolution of its x | B | C channels: out[t, c] = silu(bias[c] + sum_k w[k, c] ext[t + k, c])
 * for channels c in [c0, c1), ext = the state's L - 1 rows, then in; the state becomes the last
 * L - 1 rows of ext (the inputs, before the convolution). reset: the incoming state is zeros.
 * out must not alias in. */
static inline void ll_causal_conv_silu_f32(const float *in,      /* [n, ldi] */
                                           ptrdiff_t ldi,
                                           float *out,           /* [n, ldo] */
                                           ptrdiff_t ldo,
                                           float *state,         /* [L - 1, E] oldest row first; updated */
                                           const float *w,       /* [L, E] the taps, channel-minor */
                                           const float *bias,    /* [E], or NULL */
                                           ptrdiff_t n, ptrdiff_t E, int L, int reset, ptrdiff_t c0, ptrdiff_t c1) {
    const int S = L - 1;
    for (ptrdiff_t c = c0; c < c1; c += 16) {
        const int m = c1 - c < 16 ? (int)(c1 - c) : 16;   /* channels of this block */
        float win[LL_CONV_MAX_LEN][16], acc[16];
        for (int k = 0; k < S; k++)
            for (int i = 0; i < m; i++) win[k][i] = reset ? 0.0f : state[k * E + c + i];
        for (ptrdiff_t t = 0; t < n; t++) {
            const float *u = in + t * ldi + c;
            for (int i = 0; i < m; i++) acc[i] = (bias ? bias[c + i] : 0.0f) + w[S * E + c + i] * u[i];
            for (int k = 0; k < S; k++)
                for (int i = 0; i < m; i++) acc[i] += w[k * E + c + i] * win[k][i];
            for (int i = 0; i < m; i++) out[t * ldo + c + i] = acc[i] / (1.0f + expf(-acc[i]));
            for (int k = 0; k + 1 < S; k++)
                for (int i = 0; i < m; i++) win[k][i] = win[k + 1][i];
            if (S > 0)
                for (int i = 0; i < m; i++) win[S - 1][i] = u[i];
        }
        for (int k = 0; k < S; k++)
            for (int i = 0; i < m; i++) state[k * E + c + i] = win[k][i];
    }
}
LL_HOT_END
#endif
