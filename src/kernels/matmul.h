/* A weight matrix as the forward pass sees it: one or more parts, each its own packed format
 * (a Q4_K_M file stores q and k in Q4_K and v in Q6_K; fused at load, they stay separate
 * parts of one [N, K] matrix), and the activation form its kernels take. One range of panels
 * per call, one thread; the caller splits panels across threads.
 *
 *   ll_mat  part[i]: panels p0..p1 of the matrix, output columns n0..n1, packed as wtype
 *           (float formats: gemm.h, a single part; ggml block formats: qgemm.h, any mix)
 *   input   LL_IN_F32 fp32 rows | LL_IN_BF16 bf16 pairs (vdpbf16ps) | LL_IN_Q8 int8 blocks
 *   fma     bf16 weights where the build has vdpbf16ps: steps of more than one token widen the
 *           weights to fp32 in registers and FMA on fp32 rows instead (chosen per machine by
 *           measurement, lite_llm/_kernels/gemm_path.py); one token keeps vdpbf16ps, the
 *           fastest stream (decode is bound by bandwidth, not by the instruction)
 */
#ifndef LL_MATMUL_H
#define LL_MATMUL_H
#include "gemm.h"
#include "qgemm.h"
LL_HOT_BEGIN

enum { LL_IN_F32 = 0, LL_IN_BF16 = 1, LL_IN_Q8 = 2 };
#define LL_MAX_PARTS 3

typedef struct {
    const void *w;          /* packed panels of this part */
    int wtype;
    ptrdiff_t p0, p1;       /* its panels in the matrix */
    ptrdiff_t n0, n1;       /* its output columns */
} ll_part;

typedef struct {
    ll_part part[LL_MAX_PARTS];
    int num_parts;
    int input;              /* LL_IN_*: the input form of a one-token step (decode) */
    int fma;                /* bf16 weights: bigger steps run the fp32-FMA path on fp32 rows */
    int stream;             /* 1: a one-token step of bf16 or FP8 weights streams each panel
                             * (gemm.h); 0: batch-invariant, every step through the tiles */
    ptrdiff_t n, k, num_panels;
    const float *bias;      /* [n] or NULL */
} ll_mat;

/* The activation form a matrix's kernels take. */
LL_INLINE int ll_mat_input(const ll_mat *m) {
    if (ll_wtype_is_quant(m->part[0].wtype)) return LL_IN_Q8;
    return ll_gemm_wants_xb(m->part[0].wtype) ? LL_IN_BF16 : LL_IN_F32;
}

/* The activation form matrix m takes in a step of num_tokens rows: what the producer of its
 * input writes for that step. */
LL_INLINE int ll_mat_form(const ll_mat *m, ptrdiff_t num_tokens) {
    return m->input == LL_IN_BF16 && m->fma && num_tokens > 1 ? LL_IN_F32 : m->input;
}

LL_INLINE ptrdiff_t ll_part_panel_bytes(const ll_part *pt, ptrdiff_t k) {
    return ll_wtype_is_quant(pt->wtype) ? ll_qpanel_bytes(pt->wtype, k) : ll_panel_bytes(pt->wtype, k);
}

/* ll_qpanel_dot for a tile of tt <= LL_QT tokens known only at run time: one literal height each
 * (the accumulators stay in registers). */
LL_INLINE void ll_qpanel_dot_tt(const ll_qact *x, int tt, const uint8_t *wp, int wtype, ptrdiff_t k,
                                ll_vf32 acc[LL_QT]) {
    switch (tt) {
    case 8: ll_qpanel_dot(x, 8, wp, wtype, k, acc); break;
    case 7: ll_qpanel_dot(x, 7, wp, wtype, k, acc); break;
    case 6: ll_qpanel_dot(x, 6, wp, wtype, k, acc); break;
    case 5: ll_qpanel_dot(x, 5, wp, wtype, k, acc); break;
    case 4: ll_qpanel_dot(x, 4, wp, wtype, k, acc); break;
    case 3: ll_qpanel_dot(x, 3, wp, wtype, k, acc); break;
    case 2: ll_qpanel_dot(x, 2, wp, wtype, k, acc); break;
    default: ll_qpanel_dot1(x, wp, wtype, k, acc);
    }
}

/* acc[t] for the nt tokens of x (nt <= LL_QT_MANY): a codebook panel decoded once for all of
 * them, any other type a token tile at a time. One tile a call where codebook panels are
 * decoded a row at a time (vec.h's LL_IQ_ONE_ROW): the same loops as before the 16-row form,
 * and the same build time. */
#ifdef LL_IQ_ONE_ROW
#define LL_QT_MANY LL_QT
LL_INLINE void ll_qpanel_dot_many(const ll_qact *x, ptrdiff_t nt, const uint8_t *wp, int wtype, ptrdiff_t k,
                                  ll_vf32 acc[LL_QT_MANY]) {
    ll_qpanel_dot_tt(x, (int)nt, wp, wtype, k, acc);
}
#else
#define LL_QT_MANY 64
LL_INLINE void ll_qpanel_dot_many(const ll_qact *x, ptrdiff_t nt, const uint8_t *wp, int wtype, ptrdiff_t k,
                                  ll_vf32 acc[LL_QT_MANY]) {
    if (ll_wtype_is_codebook(wtype) && nt > LL_QT) {
        ll_iq_panel_dot_many(x, nt, wp, wtype, k, acc);
        return;
    }
#ifdef LL_HAVE_Q3K_MANY   /* Q3_K and Q2_K: their sub-blocks turned once into scaled bytes (VBMI) */
    if (wtype == LL_W_Q3_K && nt > LL_QT) {
        ll_q3k_panel_dot_many(x, nt, wp, k, acc);
        return;
    }
    if (wtype == LL_W_Q2_K && nt > LL_QT) {
        ll_q2k_panel_dot_many(x, nt, wp, k, acc);
        return;
    }
#endif
    for (ptrdiff_t t = 0; t < nt; t += LL_QT) {
        const ll_qact xt = ll_qact_rows(x, t);
        ll_qpanel_dot_tt(&xt, (int)(nt - t < LL_QT ? nt - t : LL_QT), wp, wtype, k, acc + t);
    }
}
#endif

/* out[t, columns of panels p0..p1 of quantized part pt] (+)= x[t] . W + bias, for all T tokens. */
static inline void ll_qgemm_panels(const ll_qact *x, ptrdiff_t num_tokens, const ll_part *pt, ptrdiff_t k,
                                   const float *bias, float *out, ptrdiff_t ldo, int accumulate,
                                   ptrdiff_t p0, ptrdiff_t p1) {
    const ptrdiff_t pb = ll_qpanel_bytes(pt->wtype, k);
    for (ptrdiff_t p = p0; p < p1; p++) {
        const uint8_t *wp = (const uint8_t *)pt->w + (p - pt->p0) * pb;
        const ptrdiff_t col = pt->n0 + (p - pt->p0) * 16;
        for (ptrdiff_t t = 0; t < num_tokens; t += LL_QT_MANY) {
            const ptrdiff_t tt = num_tokens - t < LL_QT_MANY ? num_tokens - t : LL_QT_MANY;
            const ll_qact xt = ll_qact_rows(x, t);
            ll_vf32 acc[LL_QT_MANY];
            ll_qpanel_dot_many(&xt, tt, wp, pt->wtype, k, acc);
            for (ptrdiff_t i = 0; i < tt; i++) ll_store_out(out + (t + i) * ldo, acc[i], bias, col, pt->n1, accumulate);
        }
    }
}

/* out[T, columns of panels p0..p1] (+)= x @ W.T + bias; x in the matrix's input form:
 * fp32 x [T][ldx], bf16 pairs xb [T][ceil(K/2)], or int8 blocks xq. */
static inline void ll_mat_gemm(const float *x, const uint32_t *xb, const ll_qact *xq, ptrdiff_t ldx,
                               ptrdiff_t num_tokens, const ll_mat *m, float *out, ptrdiff_t ldo, int accumulate,
                               ptrdiff_t p0, ptrdiff_t p1) {
    for (int i = 0; i < m->num_parts; i++) {
        const ll_part *pt = &m->part[i];
        const ptrdiff_t a = p0 > pt->p0 ? p0 : pt->p0, b = p1 < pt->p1 ? p1 : pt->p1;
        if (a >= b) continue;
        if (ll_wtype_is_quant(pt->wtype))
            ll_qgemm_panels(xq, num_tokens, pt, m->k, m->bias, out, ldo, accumulate, a, b);
        else   /* a float matrix is one part from panel 0 */
            ll_gemm_panels(x, ll_mat_form(m, num_tokens) == LL_IN_BF16 ? xb : 0, ldx, num_tokens, pt->w, pt->wtype, m->k, m->n,
                           m->bias, out, ldo, accumulate, a, b, m->stream);
    }
}

/* Pull panels p0..p1 towards this core (see ll_prefetch_panels). */
static inline void ll_mat_prefetch(const ll_mat *m, ptrdiff_t p0, ptrdiff_t p1) {
    for (int i = 0; i < m->num_parts; i++) {
        const ll_part *pt = &m->part[i];
        const ptrdiff_t a = p0 > pt->p0 ? p0 : pt->p0, b = p1 < pt->p1 ? p1 : pt->p1;
        const ptrdiff_t pb = ll_part_panel_bytes(pt, m->k);
        for (const char *c = (const char *)pt->w + (a - pt->p0) * pb, *e = (const char *)pt->w + (b - pt->p0) * pb;
             c < e; c += 64)
            __builtin_prefetch(c, 0, 2);
    }
}

/* Gated MLP, feature panels q0..q1 (see ll_gemm_gated): a float matrix is one part of 2 ng
 * panels; a quantized one has the gate part (panels 0..ng) and the up part (ng..2 ng). With
 * ao_q the result also goes out as int8 blocks for a quantized down projection: q0 must then
 * be even and q1 even or ng, so each 32-feature block is whole within the range. */
static inline void ll_mat_gated(const float *x, const uint32_t *xb, const ll_qact *xq, ptrdiff_t ldx,
                                ptrdiff_t num_tokens, const ll_mat *m, ptrdiff_t F, int act,
                                float *ao, ptrdiff_t lda, uint32_t *ao_b, int8_t *aq, float *aqd, float *aqs,
                                int32_t *aqn, ptrdiff_t q0, ptrdiff_t q1) {
    const ll_part *gp = &m->part[0];
    if (!ll_wtype_is_quant(gp->wtype)) {
        ll_gemm_gated(x, ll_mat_form(m, num_tokens) == LL_IN_BF16 ? xb : 0, ldx, num_tokens, gp->w, gp->wtype, m->k, F, m->bias, act,
                      ao, lda, aq ? 0 : ao_b, q0, q1, m->stream);
    } else {
        const ll_part *up = &m->part[1];
        const ptrdiff_t pbg = ll_qpanel_bytes(gp->wtype, m->k), pbu = ll_qpanel_bytes(up->wtype, m->k);
        if (num_tokens <= LL_QT) {
            /* One token tile (decode): runs of LL_GATED_RUN feature panels (gemm.h), gate panels
             * then up panels, the gate results kept on the stack meanwhile: the same values. */
            ll_vf32 gbuf[LL_GATED_RUN][LL_QT];
            for (ptrdiff_t r0 = q0; r0 < q1; r0 += LL_GATED_RUN) {
                const ptrdiff_t r1 = r0 + LL_GATED_RUN < q1 ? r0 + LL_GATED_RUN : q1;
                for (ptrdiff_t q = r0; q < r1; q++)
                    ll_qpanel_dot_tt(xq, (int)num_tokens, (const uint8_t *)gp->w + q * pbg, gp->wtype, m->k, gbuf[q - r0]);
                for (ptrdiff_t q = r0; q < r1; q++) {
                    ll_vf32 u[LL_QT];
                    ll_qpanel_dot_tt(xq, (int)num_tokens, (const uint8_t *)up->w + q * pbu, up->wtype, m->k, u);
                    for (int i = 0; i < (int)num_tokens; i++)
                        ll_gated_store(gbuf[q - r0][i], u[i], m->bias, q * 16, F, act, ao + i * lda,
                                       aq ? 0 : (ao_b ? ao_b + i * ((F + 1) / 2) : 0));
                }
            }
        } else {
            for (ptrdiff_t q = q0; q < q1; q++) {
                const uint8_t *wg = (const uint8_t *)gp->w + q * pbg, *wu = (const uint8_t *)up->w + q * pbu;
                for (ptrdiff_t t = 0; t < num_tokens; t += LL_QT_MANY) {
                    const ptrdiff_t tt = num_tokens - t < LL_QT_MANY ? num_tokens - t : LL_QT_MANY;
                    const ll_qact xt = ll_qact_rows(xq, t);
                    ll_vf32 g[LL_QT_MANY], u[LL_QT_MANY];
                    ll_qpanel_dot_many(&xt, tt, wg, gp->wtype, m->k, g);
                    ll_qpanel_dot_many(&xt, tt, wu, up->wtype, m->k, u);
                    for (ptrdiff_t i = 0; i < tt; i++)
                        ll_gated_store(g[i], u[i], m->bias, q * 16, F, act, ao + (t + i) * lda,
                                       aq ? 0 : (ao_b ? ao_b + (t + i) * ((F + 1) / 2) : 0));
                }
            }
        }
    }
    if (aq)   /* the range's whole 32-feature blocks, from the fp32 rows just written */
        for (ptrdiff_t t = 0; t < num_tokens; t++)
            for (ptrdiff_t b = q0 / 2; b < (q1 + 1) / 2; b++)
                ll_quantize_block_q8(ao + t * lda + 32 * b, aq + t * F + 32 * b, aqd + t * (F / 32) + b,
                                     aqs + t * (F / 16) + 2 * b, aqn + t * (F / 16) + 2 * b);
}
LL_HOT_END
#endif
