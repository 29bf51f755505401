/* GEMM on packed weights: out[t, n] = sum_k x[t, k] * W[n, k] (+ bias[n]), for one range of
 * 16-row panels and all tokens, on one thread. The caller splits panels across threads.
 *
 * Packed layouts (built once at load by lite_llm/_kernels/layout.py), N padded to 16:
 *   LL_W_F32  [N/16][K][16]         float
 *   LL_W_F16  [N/16][K][16]         IEEE half
 *   LL_W_BF16 [N/16][ceil(K/2)][16][2]  bf16 pairs: element (n, k) at [n/16][k/2][n%16][k%2]
 *   LL_W_FP8  [N/16][ceil(K/128)] chunks of 128 columns (the last one K % 128 if short), each
 *             float s[16] (the 16 rows' scales for those columns, times 256), then
 *             uint8 e4m3 [kc][16]: element (n, k) = e4m3(byte) * s[n%16] / 256
 *             (FP8 checkpoints kept at one byte a weight: a [128, 128] block scale or a row's
 *             scale is a per-row scale of every 128-column chunk; ll_load_e4m3 gives the value
 *             times 2^-8, and the product with 256 s is the dequantized fp32 weight exactly as
 *             e4m3 -> fp32 times s rounds it; ll_gemm_fp8_panels runs them, not the tiles)
 * so the 16 outputs of a panel are one vector, and a panel streams contiguously: decode
 * (T = 1) reads each weight byte once, prefill reuses a panel from cache for every token tile.
 *
 * bf16 weights run one of two paths, chosen per call by the activations given: bf16 pairs
 * xb [T][ceil(K/2)] (uint32 = 2 bf16, the last pair zero-padded) run vdpbf16ps (builds with
 * bf16 dot products); fp32 x [T][K] (xb NULL) run the weights widened to fp32 in registers
 * and FMA, like fp32 and fp16 weights. Which one a matrix takes is measured per machine
 * (lite_llm/_kernels/gemm_path.py; matmul.h ll_mat_form).
 */
#ifndef LL_GEMM_H
#define LL_GEMM_H
#include "../simd/vec.h"
#include "act.h"
LL_HOT_BEGIN

enum { LL_W_F32 = 0, LL_W_BF16 = 1, LL_W_F16 = 2, LL_W_FP8 = 25 };   /* 3..24: qgemm.h's block types */
#define LL_FP8_CHUNK 128
#define LL_FP8_CHUNK_BYTES (64 + LL_FP8_CHUNK * 16)
#define LL_FP8_GROUP 64   /* tokens a widened chunk of a gated MLP's panels serves at once */

/* Register tiles (tokens x panels) come from the vec.h backend, sized to its registers:
 * LL_TT_FMA x LL_NP_FMA for the fp32-FMA paths (fp32 and fp16 weights, and bf16 weights widened
 * to fp32 in registers), LL_TT_DOT x LL_NP_DOT for bf16 dot products (LL_HAVE_BF16_DOT). */
#define LL_TT_MAX (LL_TT_FMA > LL_TT_DOT ? LL_TT_FMA : LL_TT_DOT)
#define LL_NP_MAX 4

/* Store one 16-wide accumulator to out row (n0 .. n0+15), adding bias (and the old value when
 * accumulating: residual connections), clipping at n. */
LL_INLINE void ll_store_out(float *out, ll_vf32 acc, const float *bias, ptrdiff_t n0, ptrdiff_t n,
                            int accumulate) {
    if (n0 + 16 <= n) {
        if (bias) acc = ll_add(acc, ll_load(bias + n0));
        if (accumulate) acc = ll_add(acc, ll_load(out + n0));
        ll_store(out + n0, acc);
    } else {
        float tmp[16];
        ll_store(tmp, acc);
        for (ptrdiff_t i = 0; n0 + i < n; i++)
            out[n0 + i] = tmp[i] + (bias ? bias[n0 + i] : 0.f) + (accumulate ? out[n0 + i] : 0.f);
    }
}

/* One fp32-FMA register tile's sums: tt tokens of fp32 x [tt][ldx] times np panels starting at
 * wp[0..np-1], each F32, F16 or BF16 (widened: even columns by a shift, odd ones by a mask);
 * tt, np are constants after inlining. */
LL_INLINE void ll_gemm_acc_fma(const float *x, ptrdiff_t ldx, const void *const *wp, int wtype, ptrdiff_t k,
                               const int tt, const int np, ll_vf32 acc[LL_TT_MAX][LL_NP_MAX]) {
    for (int t = 0; t < tt; t++)
        for (int p = 0; p < np; p++) acc[t][p] = ll_zero();
    const ptrdiff_t s = ldx * (ptrdiff_t)sizeof(float), s3 = 3 * s;
    /* the asm FMAs read x without telling the compiler: keep them after every earlier write
     * (they also wait on weight loads, which this orders) */
    __asm__ __volatile__("" ::: "memory");
    if (wtype == LL_W_F32 || wtype == LL_W_F16) {
        for (ptrdiff_t kk = 0; kk < k; kk++) {
            const float *b = x + kk, *b4 = b + 4 * ldx;
            for (int p = 0; p < np; p++) {
                const ll_vf32 wv = wtype == LL_W_F32 ? ll_load((const float *)wp[p] + kk * 16)
                                                     : ll_load_f16((const uint16_t *)wp[p] + kk * 16);
                for (int t = 0; t < tt; t++) acc[t][p] = ll_fma_row(acc[t][p], wv, b, b4, s, s3, t, 0);
            }
        }
    } else {
        const ptrdiff_t kfull = k / 2;   /* whole pairs; an odd K leaves one even column */
        for (ptrdiff_t kp = 0; kp < kfull; kp++) {
            const float *b = x + 2 * kp, *b4 = b + 4 * ldx;
            for (int p = 0; p < np; p++) {
                const ll_vf32 we = ll_load_bf16_even((const uint16_t *)wp[p] + kp * 32);
                const ll_vf32 wo = ll_load_bf16_odd((const uint16_t *)wp[p] + kp * 32);
                for (int t = 0; t < tt; t++)
                    acc[t][p] = ll_fma_row(ll_fma_row(acc[t][p], we, b, b4, s, s3, t, 0), wo, b, b4, s, s3, t, 1);
            }
        }
        if (k & 1) {
            const float *b = x + k - 1, *b4 = b + 4 * ldx;
            for (int p = 0; p < np; p++) {
                const ll_vf32 we = ll_load_bf16_even((const uint16_t *)wp[p] + kfull * 32);
                for (int t = 0; t < tt; t++) acc[t][p] = ll_fma_row(acc[t][p], we, b, b4, s, s3, t, 0);
            }
        }
    }
}

#ifdef LL_HAVE_BF16_DOT
/* One bf16 dot-product register tile's sums: tt tokens of bf16 pairs xb [tt][ldx] times np bf16 panels. */
LL_INLINE void ll_gemm_acc_dot(const uint32_t *xb, ptrdiff_t ldx, const void *const *wp, ptrdiff_t k,
                               const int tt, const int np, ll_vf32 acc[LL_TT_MAX][LL_NP_MAX]) {
    for (int t = 0; t < tt; t++)
        for (int p = 0; p < np; p++) acc[t][p] = ll_zero();
    const ptrdiff_t k2 = (k + 1) / 2;
    for (ptrdiff_t kp = 0; kp < k2; kp++) {
        ll_vbf16x2 wv[LL_NP_DOT];
        for (int p = 0; p < np; p++) wv[p] = ll_load_bf16x2((const uint16_t *)wp[p] + kp * 32);
        for (int t = 0; t < tt; t++) {
            const ll_bf16x2 xv = ll_bcast_bf16x2(xb + t * ldx + kp);
            for (int p = 0; p < np; p++) acc[t][p] = ll_dot2_bf16(acc[t][p], xv, wv[p]);
        }
    }
}
#endif

/* Bytes of one packed panel. */
LL_INLINE ptrdiff_t ll_panel_bytes(int wtype, ptrdiff_t k) {
    return wtype == LL_W_F32 ? k * 16 * 4 : wtype == LL_W_F16 ? k * 16 * 2
         : wtype == LL_W_FP8 ? (k + LL_FP8_CHUNK - 1) / LL_FP8_CHUNK * 64 + k * 16 : (k + 1) / 2 * 32 * 2;
}

/* Pull panels p0..p1 of a packed weight towards this core (L2): a phase that waits on latency
 * rather than bandwidth can stream the next phase's weights meanwhile. */
static inline void ll_prefetch_panels(const void *w, int wtype, ptrdiff_t k, ptrdiff_t p0, ptrdiff_t p1) {
    const char *a = (const char *)w + p0 * ll_panel_bytes(wtype, k), *b = (const char *)w + p1 * ll_panel_bytes(wtype, k);
    for (; a < b; a += 64) __builtin_prefetch(a, 0, 2);
}

/* One register tile: tt tokens x np consecutive panels from `panel`, stored to out; bf16
 * weights with bf16 pairs xb run bf16 dot products, everything else the fp32-FMA tile on x. */
LL_INLINE void ll_gemm_tile(const float *x, const uint32_t *xb, ptrdiff_t ldx, const void *w,
                            int wtype, ptrdiff_t k, ptrdiff_t panel, float *out, ptrdiff_t ldo,
                            ptrdiff_t n, const float *bias, int accumulate, const int tt, const int np) {
    const void *wp[LL_NP_MAX];
    for (int p = 0; p < np; p++) wp[p] = (const char *)w + (panel + p) * ll_panel_bytes(wtype, k);
    ll_vf32 acc[LL_TT_MAX][LL_NP_MAX];
#ifdef LL_HAVE_BF16_DOT
    if (xb) ll_gemm_acc_dot(xb, ldx, wp, k, tt, np, acc);
    else
#endif
    ll_gemm_acc_fma(x, ldx, wp, wtype, k, tt, np, acc);
    for (int t = 0; t < tt; t++)
        for (int p = 0; p < np; p++)
            ll_store_out(out + t * ldo, acc[t][p], bias, (panel + p) * 16, n, accumulate);
}

/* Every tile shape as a function of its own: call sites name a literal shape, and gcc then
 * optimises each shape alone (one function holding every shape took it several times as long to
 * build); a call per tile is nothing beside the tile's K-long loop. Accumulators stay local to
 * the shape's function (in registers) and are copied out at its end. Unused shapes are dropped. */
#define LL_SHAPES(F) F(1,1) F(1,2) F(1,3) F(1,4) F(2,1) F(2,2) F(2,3) F(2,4) F(3,1) F(3,2) F(3,3) F(3,4) F(4,1) F(4,2) F(4,3) F(4,4) F(5,1) F(5,2) F(5,3) F(5,4) F(6,1) F(6,2) F(6,3) F(6,4) F(7,1) F(7,2) F(7,3) F(7,4) F(8,1) F(8,2) F(8,3) F(8,4)
#define LL_TILE_FMA_FN(TT_, NP_) \
    static __attribute__((noinline)) void ll_tile_fma_##TT_##_##NP_(const float *x, ptrdiff_t ldx, const void *w, \
            int wtype, ptrdiff_t k, ptrdiff_t panel, float *out, ptrdiff_t ldo, ptrdiff_t n, const float *bias, \
            int accumulate) { \
        ll_gemm_tile(x, 0, ldx, w, wtype, k, panel, out, ldo, n, bias, accumulate, TT_, NP_); }
#define LL_ACC_FMA_FN(TT_, NP_) \
    static __attribute__((noinline)) void ll_acc_fma_##TT_##_##NP_(const float *x, ptrdiff_t ldx, const void *const *wp, \
            int wtype, ptrdiff_t k, ll_vf32 out[LL_TT_MAX][LL_NP_MAX]) { \
        ll_vf32 acc[LL_TT_MAX][LL_NP_MAX]; \
        ll_gemm_acc_fma(x, ldx, wp, wtype, k, TT_, NP_, acc); \
        for (int t = 0; t < TT_; t++) for (int p = 0; p < NP_; p++) out[t][p] = acc[t][p]; }
LL_SHAPES(LL_TILE_FMA_FN)
LL_SHAPES(LL_ACC_FMA_FN)
#ifdef LL_HAVE_BF16_DOT
#define LL_TILE_DOT_FN(TT_, NP_) \
    static __attribute__((noinline)) void ll_tile_dot_##TT_##_##NP_(const uint32_t *xb, ptrdiff_t ldx, const void *w, \
            ptrdiff_t k, ptrdiff_t panel, float *out, ptrdiff_t ldo, ptrdiff_t n, const float *bias, int accumulate) { \
        ll_gemm_tile(0, xb, ldx, w, LL_W_BF16, k, panel, out, ldo, n, bias, accumulate, TT_, NP_); }
#define LL_ACC_DOT_FN(TT_, NP_) \
    static __attribute__((noinline)) void ll_acc_dot_##TT_##_##NP_(const uint32_t *xb, ptrdiff_t ldx, const void *const *wp, \
            ptrdiff_t k, ll_vf32 out[LL_TT_MAX][LL_NP_MAX]) { \
        ll_vf32 acc[LL_TT_MAX][LL_NP_MAX]; \
        ll_gemm_acc_dot(xb, ldx, wp, k, TT_, NP_, acc); \
        for (int t = 0; t < TT_; t++) for (int p = 0; p < NP_; p++) out[t][p] = acc[t][p]; }
LL_SHAPES(LL_TILE_DOT_FN)
LL_SHAPES(LL_ACC_DOT_FN)
#endif

/* Whether bf16 weights can take bf16-pair activations (xb, vdpbf16ps) in this build: the form
 * decode always uses; a matrix on the FMA path takes fp32 rows in bigger steps (matmul.h). */
LL_INLINE int ll_gemm_wants_xb(int wtype) {
#ifdef LL_HAVE_BF16_DOT
    return wtype == LL_W_BF16;
#else
    (void)wtype; return 0;
#endif
}

/* Literal tile shapes, so each call is unrolled with its accumulators in registers:
 * LL_TILES_TT(F, np) calls F(tt, np) for the runtime tt in 1..LL_TT_FMA, LL_TILES_TT_DOT for
 * tt in 1..LL_TT_DOT (the backend's tile heights: 2, 3, 4 or 8). */
#define LL_TCASES_8(F, NP_) case 8: F(8, NP_); break; case 7: F(7, NP_); break; case 6: F(6, NP_); break; \
    case 5: F(5, NP_); break; LL_TCASES_4(F, NP_)
#define LL_TCASES_4(F, NP_) case 4: F(4, NP_); break; LL_TCASES_3(F, NP_)
#define LL_TCASES_3(F, NP_) case 3: F(3, NP_); break; LL_TCASES_2(F, NP_)
#define LL_TCASES_2(F, NP_) case 2: F(2, NP_); break;
#define LL_TCASES__(N) LL_TCASES_##N
#define LL_TCASES_(N) LL_TCASES__(N)
#define LL_TILES_TT(F, NP_) switch (tt) { LL_TCASES_(LL_TT_FMA)(F, NP_) default: F(1, NP_); }
#define LL_TILES_TT_DOT(F, NP_) switch (tt) { LL_TCASES_(LL_TT_DOT)(F, NP_) default: F(1, NP_); }

/* Convert fp32 rows [T][K] (row stride ldx) to bf16 pairs [T][ceil(K/2)], zero-padding. */
static inline void ll_f32_to_bf16_pairs(const float *x, ptrdiff_t ldx, uint32_t *xb, ptrdiff_t t0,
                                        ptrdiff_t t1, ptrdiff_t k) {
    const ptrdiff_t k2 = (k + 1) / 2;
    for (ptrdiff_t t = t0; t < t1; t++) {
        uint16_t *dst = (uint16_t *)(xb + t * k2);
        const float *src = x + t * ldx;
        ptrdiff_t i = 0;
#ifdef LL_HAVE_BF16_DOT
        for (; i + 32 <= k; i += 32) {
            ll_store_bf16(dst + i, ll_load(src + i));
            ll_store_bf16(dst + i + 16, ll_load(src + i + 16));
        }
#endif
        for (; i < k; i++) dst[i] = ll_f32_to_bf16(src[i]);
        if (k & 1) dst[k] = 0;
    }
}

/* Decode (one token) on bf16 weights: each panel is one sequential stream, read with four
 * independent accumulators (the dot-product latency would otherwise bound the loop), so a
 * thread's whole panel range streams from memory in order: ~42 GB/s on 2 Zen 4 cores where
 * the 4-panel register tile reaches ~33 and software prefetching only got in the way (26-30). */
LL_INLINE ll_vf32 ll_gemv_bf16_panel(const float *x, const uint32_t *xb, const uint16_t *wp, ptrdiff_t k) {
    const ptrdiff_t k2 = (k + 1) / 2;
    ll_vf32 a0 = ll_zero(), a1 = ll_zero(), a2 = ll_zero(), a3 = ll_zero();
    ptrdiff_t kp = 0;
#ifdef LL_HAVE_BF16_DOT
    if (xb) {
        for (; kp + 4 <= k2; kp += 4) {
            a0 = ll_dot2_bf16_at(a0, xb + kp, wp + kp * 32);
            a1 = ll_dot2_bf16_at(a1, xb + kp + 1, wp + (kp + 1) * 32);
            a2 = ll_dot2_bf16_at(a2, xb + kp + 2, wp + (kp + 2) * 32);
            a3 = ll_dot2_bf16_at(a3, xb + kp + 3, wp + (kp + 3) * 32);
        }
        for (; kp < k2; kp++) a0 = ll_dot2_bf16_at(a0, xb + kp, wp + kp * 32);
        return ll_add(ll_add(a0, a1), ll_add(a2, a3));
    }
#else
    (void)xb;
#endif
    for (; kp + 2 <= k2; kp += 2) {
        const float x1 = 2 * kp + 1 < k ? x[2 * kp + 1] : 0.f, x3 = 2 * kp + 3 < k ? x[2 * kp + 3] : 0.f;
        a0 = ll_fma(ll_set1(x[2 * kp]), ll_load_bf16_even(wp + kp * 32), a0);
        a1 = ll_fma(ll_set1(x1), ll_load_bf16_odd(wp + kp * 32), a1);
        a2 = ll_fma(ll_set1(x[2 * kp + 2]), ll_load_bf16_even(wp + (kp + 1) * 32), a2);
        a3 = ll_fma(ll_set1(x3), ll_load_bf16_odd(wp + (kp + 1) * 32), a3);
    }
    for (; kp < k2; kp++) {
        a0 = ll_fma(ll_set1(x[2 * kp]), ll_load_bf16_even(wp + kp * 32), a0);
        a1 = ll_fma(ll_set1(2 * kp + 1 < k ? x[2 * kp + 1] : 0.f), ll_load_bf16_odd(wp + kp * 32), a1);
    }
    return ll_add(ll_add(a0, a1), ll_add(a2, a3));
}

static inline void ll_gemv_bf16_panels(const float *x, const uint32_t *xb, const uint16_t *w, ptrdiff_t k,
                                       ptrdiff_t n, const float *bias, float *out, int accumulate,
                                       ptrdiff_t p0, ptrdiff_t p1) {
    for (ptrdiff_t p = p0; p < p1; p++)
        ll_store_out(out, ll_gemv_bf16_panel(x, xb, w + p * ((k + 1) / 2) * 32, k), bias, p * 16, n, accumulate);
}

/* Decode (one token) on FP8 weights: each panel one sequential stream, four independent
 * accumulators per 128-column chunk, scaled once per chunk by its 16 row scales (instead of
 * every widened weight: the same sums, rounded in another order). */
LL_INLINE ll_vf32 ll_gemv_fp8_panel(const float *x, const uint8_t *wp, ptrdiff_t k) {
    ll_vf32 acc = ll_zero();
    for (ptrdiff_t c0 = 0; c0 < k; c0 += LL_FP8_CHUNK) {
        const ptrdiff_t kc = k - c0 < LL_FP8_CHUNK ? k - c0 : LL_FP8_CHUNK;
        const uint8_t *wc = wp + c0 / LL_FP8_CHUNK * LL_FP8_CHUNK_BYTES, *q = wc + 64;
        const float *xc = x + c0;
        ll_vf32 a0 = ll_zero(), a1 = ll_zero(), a2 = ll_zero(), a3 = ll_zero();
        ptrdiff_t i = 0;
        for (; i + 4 <= kc; i += 4) {
            a0 = ll_fma(ll_set1(xc[i]), ll_load_e4m3(q + i * 16), a0);
            a1 = ll_fma(ll_set1(xc[i + 1]), ll_load_e4m3(q + (i + 1) * 16), a1);
            a2 = ll_fma(ll_set1(xc[i + 2]), ll_load_e4m3(q + (i + 2) * 16), a2);
            a3 = ll_fma(ll_set1(xc[i + 3]), ll_load_e4m3(q + (i + 3) * 16), a3);
        }
        for (; i < kc; i++) a0 = ll_fma(ll_set1(xc[i]), ll_load_e4m3(q + i * 16), a0);
        acc = ll_fma(ll_add(ll_add(a0, a1), ll_add(a2, a3)), ll_load((const float *)wc), acc);
    }
    return acc;
}

/* One token's 16 outputs of one panel, for the formats with a decode path of their own. */
LL_INLINE ll_vf32 ll_gemv_panel(const float *x, const uint32_t *xb, const void *wp, int wtype, ptrdiff_t k) {
    return wtype == LL_W_FP8 ? ll_gemv_fp8_panel(x, (const uint8_t *)wp, k) : ll_gemv_bf16_panel(x, xb, (const uint16_t *)wp, k);
}

/* FP8 weights, panels p0..p1, all tokens. One token streams each panel (ll_gemv_fp8_panel)
 * unless stream is 0; more (or every step with stream 0) widen LL_NP_FMA panels a 128-column chunk at a time into fp32 on the stack (exactly
 * the dequantized weights), once for every token, and run the fp32-FMA tiles on them,
 * adding each chunk's sums to out. */
static inline void ll_gemm_fp8_panels(const float *x, ptrdiff_t ldx, ptrdiff_t num_tokens, const uint8_t *w,
                                      ptrdiff_t k, ptrdiff_t n, const float *bias, float *out, ptrdiff_t ldo,
                                      int accumulate, ptrdiff_t p0, ptrdiff_t p1, int stream) {
    const ptrdiff_t pb = ll_panel_bytes(LL_W_FP8, k);
    if (num_tokens == 1 && stream) {
        for (ptrdiff_t p = p0; p < p1; p++)
            ll_store_out(out, ll_gemv_fp8_panel(x, w + p * pb, k), bias, p * 16, n, accumulate);
        return;
    }
    float buf[LL_NP_FMA * LL_FP8_CHUNK * 16] __attribute__((aligned(64)));
    for (ptrdiff_t p = p0; p < p1; p += LL_NP_FMA) {
        const int np = (int)(p1 - p < LL_NP_FMA ? p1 - p : LL_NP_FMA);
        for (ptrdiff_t c0 = 0; c0 < k; c0 += LL_FP8_CHUNK) {
            const ptrdiff_t kc = k - c0 < LL_FP8_CHUNK ? k - c0 : LL_FP8_CHUNK;
            for (int q = 0; q < np; q++) {
                const uint8_t *wc = w + (p + q) * pb + c0 / LL_FP8_CHUNK * LL_FP8_CHUNK_BYTES;
                const ll_vf32 sv = ll_load((const float *)wc);
                for (ptrdiff_t i = 0; i < kc; i++) ll_store(buf + (q * kc + i) * 16, ll_mul(ll_load_e4m3(wc + 64 + i * 16), sv));
            }
            /* the chunk's panels as fp32 panels 0..np of K = kc, their outputs from column 16 p */
            const float *bc = c0 == 0 && bias ? bias + p * 16 : 0;
            const int acc = c0 == 0 ? accumulate : 1;
            for (ptrdiff_t t = 0; t < num_tokens; t += LL_TT_FMA) {
                const int tt = (int)(num_tokens - t < LL_TT_FMA ? num_tokens - t : LL_TT_FMA);
                const float *xc = x + t * ldx + c0;
                float *oc = out + t * ldo + p * 16;
#define LL_TILE_F8(TT_, NP_) ll_tile_fma_##TT_##_##NP_(xc, ldx, buf, LL_W_F32, kc, 0, oc, ldo, n - p * 16, bc, acc)
#if LL_NP_FMA >= 4
                if (np == 4) { LL_TILES_TT(LL_TILE_F8, 4) } else
#endif
#if LL_NP_FMA >= 3
                if (np == 3) { LL_TILES_TT(LL_TILE_F8, 3) } else
#endif
                if (np == 2) { LL_TILES_TT(LL_TILE_F8, 2) } else { LL_TILES_TT(LL_TILE_F8, 1) }
#undef LL_TILE_F8
            }
        }
    }
}

/* out[t0:t1, panels p0:p1] for all tokens: bf16 weights with xb [T][ceil(K/2)] pairs run
 * bf16 dot products (LL_TT_DOT x LL_NP_DOT tiles); without xb, and every other format, the fp32-FMA tiles on
 * x [T][ldx] (LL_TT_FMA x LL_NP_FMA). One token streams each panel once (decode), with
 * accumulators of its own: another summation order than the tiles'. stream 0 (batch-invariant
 * steps, matmul.h) runs one token through the tiles too, so a row's result is the same bits
 * whatever else the step holds. */
static inline void ll_gemm_panels(const float *x, const uint32_t *xb, ptrdiff_t ldx, ptrdiff_t num_tokens,
                                  const void *w, int wtype, ptrdiff_t k, ptrdiff_t n,
                                  const float *bias, float *out, ptrdiff_t ldo, int accumulate,
                                  ptrdiff_t p0, ptrdiff_t p1, int stream) {
    if (wtype != LL_W_BF16 || !ll_gemm_wants_xb(wtype)) xb = 0;
    if (num_tokens == 1 && stream && wtype == LL_W_BF16) {
        ll_gemv_bf16_panels(x, xb, (const uint16_t *)w, k, n, bias, out, accumulate, p0, p1);
        return;
    }
    if (wtype == LL_W_FP8) {
        ll_gemm_fp8_panels(x, ldx, num_tokens, (const uint8_t *)w, k, n, bias, out, ldo, accumulate, p0, p1, stream);
        return;
    }
    const ptrdiff_t ldxx = xb ? (k + 1) / 2 : ldx;
    const int ttile = xb ? LL_TT_DOT : LL_TT_FMA, ptile = xb ? LL_NP_DOT : LL_NP_FMA;
    for (ptrdiff_t p = p0; p < p1; p += ptile) {
        const int np = (int)(p1 - p < ptile ? p1 - p : ptile);
        for (ptrdiff_t t = 0; t < num_tokens; t += ttile) {
            const int tt = (int)(num_tokens - t < ttile ? num_tokens - t : ttile);
            const float *xt = x ? x + t * ldx : 0;
            float *ot = out + t * ldo;
#define LL_TILE_D(TT_, NP_) ll_tile_dot_##TT_##_##NP_(xbt, ldxx, w, k, p, ot, ldo, n, bias, accumulate)
#define LL_TILE_F(TT_, NP_) ll_tile_fma_##TT_##_##NP_(xt, ldxx, w, wtype, k, p, ot, ldo, n, bias, accumulate)
            if (xb) {
#ifdef LL_HAVE_BF16_DOT
                const uint32_t *xbt = xb + t * ldxx;
#if LL_NP_DOT >= 4
                if (np == 4) { LL_TILES_TT_DOT(LL_TILE_D, 4) } else
#endif
#if LL_NP_DOT >= 3
                if (np == 3) { LL_TILES_TT_DOT(LL_TILE_D, 3) } else
#endif
                if (np == 2) { LL_TILES_TT_DOT(LL_TILE_D, 2) } else { LL_TILES_TT_DOT(LL_TILE_D, 1) }
#endif
            } else {
#if LL_NP_FMA >= 4
                if (np == 4) { LL_TILES_TT(LL_TILE_F, 4) } else
#endif
#if LL_NP_FMA >= 3
                if (np == 3) { LL_TILES_TT(LL_TILE_F, 3) } else
#endif
                if (np == 2) { LL_TILES_TT(LL_TILE_F, 2) } else { LL_TILES_TT(LL_TILE_F, 1) }
            }
#undef LL_TILE_D
#undef LL_TILE_F
        }
    }
}

/* Gated MLP with the activation fused: a[t, f] = act(x[t] . Wg[f] + bg[f]) * (x[t] . Wu[f] + bu[f])
 * for features of pair range q0..q1. W is packed as ng = ceil(F/16) gate panels, then ng up
 * panels (each half padded to 16 rows); feature panel q pairs gate panel q with up panel ng + q.
 * bias: [2F] (gate then up) or NULL. The result goes where the next GEMM reads it: bf16 pairs
 * ao_b [T][ceil(F/2)] (ao_b != NULL) or fp32 ao [T][lda]. */
LL_INLINE void ll_gated_store(ll_vf32 g, ll_vf32 u, const float *bias, ptrdiff_t f0, ptrdiff_t F, int act,
                              float *ao, uint32_t *ao_b) {
    float gv[16], uv[16], r[16];
    if (bias && f0 + 16 <= F) {
        g = ll_add(g, ll_load(bias + f0));
        u = ll_add(u, ll_load(bias + F + f0));
    }
    ll_store(gv, g);
    ll_store(uv, u);
    const ptrdiff_t nf = F - f0 < 16 ? F - f0 : 16;
    if (bias && nf < 16)
        for (ptrdiff_t i = 0; i < nf; i++) { gv[i] += bias[f0 + i]; uv[i] += bias[F + f0 + i]; }
    ll_act_mul_f32(gv, uv, r, 16, act);
    if (ao_b) {
        uint16_t *dst = (uint16_t *)ao_b + f0;
        if (nf == 16) ll_store_bf16(dst, ll_load(r));
        else {
            for (ptrdiff_t i = 0; i < nf; i++) dst[i] = ll_f32_to_bf16(r[i]);
            if (F & 1) dst[nf] = 0;   /* the last pair's padding */
        }
    } else {
        if (nf == 16) ll_store(ao + f0, ll_load(r));
        else for (ptrdiff_t i = 0; i < nf; i++) ao[f0 + i] = r[i];
    }
}

/* A decode step's gated MLP reads the gate panels of a run of LL_GATED_RUN feature panels, then
 * the run's up panels: each matrix is one sequential stream per run instead of switching between
 * the two every panel, which cost ~15 % of the gated phase's streaming rate (8B Q4_K, 2 cores). */
#define LL_GATED_RUN 32

static inline void ll_gemm_gated(const float *x, const uint32_t *xb, ptrdiff_t ldx, ptrdiff_t num_tokens,
                                 const void *w, int wtype, ptrdiff_t k, ptrdiff_t F, const float *bias, int act,
                                 float *ao, ptrdiff_t lda, uint32_t *ao_b, ptrdiff_t q0, ptrdiff_t q1, int stream) {
    const ptrdiff_t ng = (F + 15) / 16, pb = ll_panel_bytes(wtype, k), ldb = (F + 1) / 2;
    if (wtype != LL_W_BF16 || !ll_gemm_wants_xb(wtype)) xb = 0;
    const ptrdiff_t ldxx = xb ? (k + 1) / 2 : ldx;
    const char *wc = (const char *)w;
    if (num_tokens == 1 && stream && (wtype == LL_W_BF16 || wtype == LL_W_FP8)) {   /* decode: stream the gate and up panels, a run at a time */
        ll_vf32 g[LL_GATED_RUN];
        for (ptrdiff_t r0 = q0; r0 < q1; r0 += LL_GATED_RUN) {
            const ptrdiff_t r1 = r0 + LL_GATED_RUN < q1 ? r0 + LL_GATED_RUN : q1;
            for (ptrdiff_t q = r0; q < r1; q++) g[q - r0] = ll_gemv_panel(x, xb, wc + q * pb, wtype, k);
            for (ptrdiff_t q = r0; q < r1; q++) {
                const ll_vf32 u = ll_gemv_panel(x, xb, wc + (ng + q) * pb, wtype, k);
                ll_gated_store(g[q - r0], u, bias, q * 16, F, act, ao, ao_b);
            }
        }
        return;
    }
    if (wtype == LL_W_FP8) {
        /* several tokens: a feature panel's gate and up chunks widened to fp32 once for a group of
         * up to LL_FP8_GROUP tokens, whose sums wait on the stack until the last chunk */
        float buf[2 * LL_FP8_CHUNK * 16] __attribute__((aligned(64)));
        ll_vf32 sum[LL_FP8_GROUP][2];
        for (ptrdiff_t q = q0; q < q1; q++) {
            for (ptrdiff_t g0 = 0; g0 < num_tokens; g0 += LL_FP8_GROUP) {
                const ptrdiff_t g1 = g0 + LL_FP8_GROUP < num_tokens ? g0 + LL_FP8_GROUP : num_tokens;
                for (ptrdiff_t i = 0; i < g1 - g0; i++) sum[i][0] = sum[i][1] = ll_zero();
                for (ptrdiff_t c0 = 0; c0 < k; c0 += LL_FP8_CHUNK) {
                    const ptrdiff_t kc = k - c0 < LL_FP8_CHUNK ? k - c0 : LL_FP8_CHUNK;
                    for (int h = 0; h < 2; h++) {
                        const uint8_t *cw = (const uint8_t *)wc + (h * ng + q) * pb + c0 / LL_FP8_CHUNK * LL_FP8_CHUNK_BYTES;
                        const ll_vf32 sv = ll_load((const float *)cw);
                        for (ptrdiff_t i = 0; i < kc; i++)
                            ll_store(buf + (h * kc + i) * 16, ll_mul(ll_load_e4m3(cw + 64 + i * 16), sv));
                    }
                    const void *wp[LL_NP_MAX] = {buf, buf + kc * 16};
                    for (ptrdiff_t t = g0; t < g1; t += LL_TT_FMA) {
                        const int tt = (int)(g1 - t < LL_TT_FMA ? g1 - t : LL_TT_FMA);
                        const float *xc = x + t * ldx + c0;
                        ll_vf32 acc[LL_TT_MAX][LL_NP_MAX];
#define LL_GFMA8(TT_, NP_) ll_acc_fma_##TT_##_##NP_(xc, ldx, wp, LL_W_F32, kc, acc)
                        LL_TILES_TT(LL_GFMA8, 2)
#undef LL_GFMA8
                        for (int i = 0; i < tt; i++) {
                            sum[t - g0 + i][0] = ll_add(sum[t - g0 + i][0], acc[i][0]);
                            sum[t - g0 + i][1] = ll_add(sum[t - g0 + i][1], acc[i][1]);
                        }
                    }
                }
                for (ptrdiff_t t = g0; t < g1; t++)
                    ll_gated_store(sum[t - g0][0], sum[t - g0][1], bias, q * 16, F, act, ao ? ao + t * lda : 0,
                                   ao_b ? ao_b + t * ldb : 0);
            }
        }
        return;
    }
    /* bf16 dot products: LL_NP_DOT / 2 feature panels (LL_NP_DOT weight panels) x LL_TT_DOT
     * tokens; fp32 FMA: one feature panel (gate, up) x LL_TT_FMA tokens */
    const int qtile = xb ? LL_NP_DOT / 2 : 1, ttile = xb ? LL_TT_DOT : LL_TT_FMA;
    for (ptrdiff_t q = q0; q < q1; q += qtile) {
        const int two = qtile == 2 && q + 1 < q1;   /* two feature panels: a 4-panel tile */
        const void *wp[LL_NP_MAX] = {wc + q * pb, wc + (ng + q) * pb, wc + (q + 1) * pb, wc + (ng + q + 1) * pb};
        for (ptrdiff_t t = 0; t < num_tokens; t += ttile) {
            const int tt = (int)(num_tokens - t < ttile ? num_tokens - t : ttile);
            const float *xt = x ? x + t * ldx : 0;
            const uint32_t *xbt = xb ? xb + t * ldxx : 0;
            ll_vf32 acc[LL_TT_MAX][LL_NP_MAX];
#ifdef LL_HAVE_BF16_DOT
#define LL_GDOT(TT_, NP_) ll_acc_dot_##TT_##_##NP_(xbt, ldxx, wp, k, acc)
            if (xb) {
#if LL_NP_DOT >= 4
                if (two) { LL_TILES_TT_DOT(LL_GDOT, 4) } else
#endif
                { LL_TILES_TT_DOT(LL_GDOT, 2) }
            } else
#undef LL_GDOT
#endif
            {
                (void)xbt;
#define LL_GFMA(TT_, NP_) ll_acc_fma_##TT_##_##NP_(xt, ldxx, wp, wtype, k, acc)
                LL_TILES_TT(LL_GFMA, 2)
#undef LL_GFMA
            }
            for (int i = 0; i < tt; i++) {
                float *a = ao ? ao + (t + i) * lda : 0;
                uint32_t *ab = ao_b ? ao_b + (t + i) * ldb : 0;
                ll_gated_store(acc[i][0], acc[i][1], bias, q * 16, F, act, a, ab);
                if (two) ll_gated_store(acc[i][2], acc[i][3], bias, (q + 1) * 16, F, act, a, ab);
            }
        }
    }
}
LL_HOT_END
#endif
