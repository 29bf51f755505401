/* Paged attention on one thread: online softmax over the KV blocks of one sequence, for a
 * tile of its query tokens and the query heads sharing one KV head. The same kernel serves
 * decode (one query per sequence) and prefill chunks (each query attends to the cached
 * context plus the chunk up to itself, within the sliding window if any). A query row's keys
 * run to last[row] (its own position when causal; further for an encoder's rows, or a Gemma 3
 * image token that sees its whole image) and start at the window behind its own position.
 *
 * KV cache of one layer, of type kv_type (LL_KV_*); position p of a sequence lives in block
 * block_table[p / B] at row p % B. Within one (block, kv head), of D * B elements:
 *   fp32  K [D][B]        transposed: one vector load = component d of 16 consecutive keys
 *         V [B][D]        one row per key
 *   bf16  K [D/2][B][2]   pairs of components: one load = components d, d+1 of 16 keys,
 *                         one vdpbf16ps against a broadcast pair of q
 *         V [B/2][D][2]   pairs of keys: one load = 16 components of keys j, j+1, one
 *                         vdpbf16ps against a broadcast pair of probabilities
 *   int8, fp8 e4m3, fp8 e5m2: one byte per value, then one fp32 scale per (key, kv head):
 *         K [D][B] codes, then scale [B]     value = decode(code) * scale
 *         V [B][D] codes, then scale [B]     ((D + 4) * B bytes per (block, kv head))
 *         Each row is scaled when written: scale = max |x| / (127, 448 or 57344), codes
 *         x / scale rounded to nearest even. The tiles decode 16 codes per vector load in
 *         registers; K scales multiply the 16 scores of a chunk, V scales the probabilities.
 * Dot products run direct, on the cache's own elements, or staged: each span of K and V is
 * converted once (exactly) into fp32 or bf16 pairs and every row block of the tile reads the
 * copy (LL_ATTN_* below: prefill tiles of many rows, where the per-load conversion of 8-bit
 * codes, or vdpbf16ps on a CPU where FMA is faster, would otherwise be paid per row block).
 * Whenever the dot products are bf16 (a bf16 cache direct, or any cache staged to bf16),
 * q * scale and the probabilities are rounded to bf16 (accumulation stays fp32), as bf16
 * attention does elsewhere; in fp32 they stay fp32. head_dim and block_size must be
 * multiples of 16.
 */
#ifndef LL_ATTENTION_H
#define LL_ATTENTION_H
#include "../simd/vec.h"

#include "act.h"   /* ll_softcap_v */
LL_HOT_BEGIN

#define LL_MAX_HEAD_DIM 512

/* KV cache element types: must match KV_DTYPES in lite_llm/_kernels/layout.py */
enum { LL_KV_F32 = 0, LL_KV_BF16 = 1, LL_KV_I8 = 2, LL_KV_E4M3 = 3, LL_KV_E5M2 = 4 };
#define LL_KV_IS_8BIT(t) ((t) >= LL_KV_I8)

/* Bytes of one (block, kv head) of a K or V cache. */
LL_INLINE ptrdiff_t ll_kv_region_bytes(int kv_type, ptrdiff_t block_size, ptrdiff_t head_dim) {
    return LL_KV_IS_8BIT(kv_type) ? (head_dim + 4) * block_size
                                  : head_dim * block_size * (kv_type == LL_KV_BF16 ? 2 : 4);
}

/* Offset (in elements) of (key row, component d) within one (block, kv head) of the K or V cache. */
LL_INLINE ptrdiff_t ll_k_index(int kv_type, ptrdiff_t row, ptrdiff_t d, ptrdiff_t block_size) {
    return kv_type == LL_KV_BF16 ? ((d >> 1) * block_size + row) * 2 + (d & 1) : d * block_size + row;
}
LL_INLINE ptrdiff_t ll_v_index(int kv_type, ptrdiff_t row, ptrdiff_t d, ptrdiff_t head_dim) {
    return kv_type == LL_KV_BF16 ? ((row >> 1) * head_dim + d) * 2 + (row & 1) : row * head_dim + d;
}

/* 8-bit caches: the largest code's value, one code from x (already divided by the row's
 * scale), 16 codes as floats, and what those floats must be multiplied by besides the scale
 * (ll_load_e4m3 gives value x 2^-8). */
LL_INLINE float ll_kv8_max(int kv_type) {
    return kv_type == LL_KV_I8 ? 127.f : kv_type == LL_KV_E4M3 ? 448.f : 57344.f;
}
LL_INLINE uint8_t ll_kv8_encode(int kv_type, float x) {
    if (kv_type == LL_KV_I8) {
        const float r = nearbyintf(x);            /* nearest even */
        return (uint8_t)(int8_t)(r > 127.f ? 127 : r < -127.f ? -127 : (int)r);
    }
    return kv_type == LL_KV_E4M3 ? ll_f32_to_e4m3(x) : ll_f32_to_e5m2(x);
}
LL_INLINE ll_vf32 ll_load_kv8(const int KT, const uint8_t *p) {
    return KT == LL_KV_I8 ? ll_load_s8((const int8_t *)p) : KT == LL_KV_E4M3 ? ll_load_e4m3(p) : ll_load_e5m2(p);
}
LL_INLINE float ll_kv8_unit(const int KT) { return KT == LL_KV_E4M3 ? 256.f : 1.f; }

/* Write one token's K (is_k) or V head rows [num_kv_heads][D] (contiguous, fp32) at `slot`;
 * an 8-bit cache stores each head row's codes and its scale. */
static inline void ll_write_kv_row(const float *src, void *cache, int kv_type, ptrdiff_t slot,
                                   ptrdiff_t block_size, ptrdiff_t num_kv_heads, ptrdiff_t head_dim,
                                   int is_k) {
    const ptrdiff_t blk = slot / block_size, row = slot % block_size;
    const ptrdiff_t region = ll_kv_region_bytes(kv_type, block_size, head_dim);
    for (ptrdiff_t h = 0; h < num_kv_heads; h++) {
        char *base = (char *)cache + (blk * num_kv_heads + h) * region;
        const float *s = src + h * head_dim;
        if (LL_KV_IS_8BIT(kv_type)) {
            uint8_t *codes = (uint8_t *)base;
            float amax = 0.f;
            for (ptrdiff_t d = 0; d < head_dim; d++) amax = fabsf(s[d]) > amax ? fabsf(s[d]) : amax;
            const float scale = amax / ll_kv8_max(kv_type);     /* 0 for a zero row: codes 0 */
            ((float *)(base + head_dim * block_size))[row] = scale;
            for (ptrdiff_t d = 0; d < head_dim; d++)
                codes[is_k ? d * block_size + row : row * head_dim + d] =
                    ll_kv8_encode(kv_type, scale > 0.f ? s[d] / scale : 0.f);
            continue;
        }
        for (ptrdiff_t d = 0; d < head_dim; d++) {
            const ptrdiff_t i = is_k ? ll_k_index(kv_type, row, d, block_size) : ll_v_index(kv_type, row, d, head_dim);
            if (kv_type == LL_KV_BF16) ((uint16_t *)base)[i] = ll_f32_to_bf16(s[d]);
            else ((float *)base)[i] = s[d];
        }
    }
}

/* Query tiles: up to LL_ATTN_QTILE tokens of one sequence x the `group` heads of one KV
 * head; row r = qi * group + g is query token qi, head h0 + g. Keys go in spans of up to
 * LL_ATTN_SPAN, flash-attention style between spans, in three passes per span:
 *   1. scores S[r][j] = (q * scale) . k_j, 16 keys (one chunk, inside one block) per vector,
 *      rows in blocks of up to four sharing every K load; keys a row must not see: -inf
 *   2. per row: the span's max, the running max m, p = exp(S - m) (rounded to bf16 with a
 *      bf16 cache), l = l * corr + sum p, acc *= corr: once per span, not per chunk
 *   3. acc += P @ V, rows in blocks of up to four sharing every V load */
#define LL_ATTN_QTILE 8
#define LL_ATTN_SPAN 256

/* Floats of scratch one call needs: two edge chunks of V, q, acc, S and P rows, m, l, then a
 * span of K and of V staged in the compute type and the span's V scales. */
static inline ptrdiff_t ll_attention_scratch(ptrdiff_t head_dim, ptrdiff_t group) {
    const ptrdiff_t rows = LL_ATTN_QTILE * group;
    return 2 * 16 * head_dim + rows * (2 * head_dim + 2 * LL_ATTN_SPAN + 2) + 2 * LL_ATTN_SPAN * head_dim
           + LL_ATTN_SPAN + 16;
}

/* How a tile computes (ll_paged_attention_tile's `path`). Direct: dot products on the cache's
 * own elements (bf16: vdpbf16ps; 8-bit: codes widened to fp32 in registers, FMA). Staged: each
 * span's K and V are first converted once into the compute type (exactly: 8-bit codes and bf16
 * are bf16- and fp32-exact), then every row block of the tile runs that type's dot products on
 * the copy, so a prefill tile of many rows pays the conversion once instead of per row block.
 *   LL_ATTN_DIRECT     always direct
 *   LL_ATTN_BF16       8-bit caches staged to bf16 pairs (vdpbf16ps); a bf16 cache: direct
 *   LL_ATTN_F32        bf16 and 8-bit caches staged to fp32 (FMA)
 *   LL_ATTN_AUTO       tiles of >= LL_ATTN_STAGE_ROWS rows: as LL_ATTN_BF16, else direct
 *   LL_ATTN_AUTO_FMA   tiles of >= LL_ATTN_STAGE_ROWS rows: as LL_ATTN_F32, else direct
 *   LL_ATTN_ROWS       direct, and each row's scores summed alone (pass 1 in blocks of one row:
 *                      the accumulation chains a block uses depend on its height), so a row's
 *                      result does not depend on the tile it is in (deterministic mode)
 * (the AUTO pair follows the bf16 GEMM path measured on this CPU: lite_llm/_kernels/gemm_path.py).
 * An fp32 cache is always direct. */
enum { LL_ATTN_AUTO = 0, LL_ATTN_AUTO_FMA = 1, LL_ATTN_DIRECT = 2, LL_ATTN_BF16 = 3, LL_ATTN_F32 = 4, LL_ATTN_ROWS = 5 };
#define LL_ATTN_STAGE_ROWS 8

typedef struct {
    const void *k, *v;               /* the layer's caches */
    const void *vchunk[LL_ATTN_SPAN / 16];   /* V of each chunk of the span (cache or edge copy) */
    ptrdiff_t koff[LL_ATTN_SPAN / 16], voff[LL_ATTN_SPAN / 16];
    const float *kscale[LL_ATTN_SPAN / 16], *vscale[LL_ATTN_SPAN / 16];   /* 8-bit caches: 16 keys' scales */
    const char *pfk[LL_ATTN_SPAN / 16], *pfv[LL_ATTN_SPAN / 16];   /* the next span's chunk ch (K, V region
                                        bases; NULL: none), asked for while pass 1 / 3 computes chunk ch */
    ptrdiff_t pfrow[LL_ATTN_SPAN / 16], block_size;
    int kt;                          /* the cache's type (the prefetches read the cache, staged or not) */
    ptrdiff_t kb, D, c0;             /* K's key stride (block size, or 16 when staged), head dim,
                                        position of the span's first key */
    int nchunks;
    float softcap;                   /* > 0: scores -> softcap * tanh(scores / softcap) (Gemma 2) */
    float *S, *P;                    /* [rows][LL_ATTN_SPAN] */
} ll_attn_span;

/* Bring the K (V) of the 16-key chunk at row `row` of a (block, kv head) region towards this
 * core. A decode walk reads a 2 KB region per block and KV head, each a block apart: the
 * hardware prefetchers learn each region too late, so the walk waits on memory unless a span's
 * chunks are asked for before it is computed (a 32k-token decode over 30 layers: -15 % of the
 * time). The next span's chunks are asked for one at a time between the current span's chunks
 * (pass 1 the K, pass 3 the V): asked for all at once, they fill the core's miss buffers and
 * stall it before it computes anything (one query over 1500 int8 keys of 12 heads from memory,
 * one thread: 367 us asked for in bursts, 297 us spread; 114 us with the keys in L2). */
LL_INLINE void ll_attn_prefetch_k(const int KT, const char *k, ptrdiff_t row, ptrdiff_t block_size, ptrdiff_t D) {
    const ptrdiff_t esz = LL_KV_IS_8BIT(KT) ? 1 : KT == LL_KV_BF16 ? 2 : 4;
    /* per component (a pair for bf16) the chunk's 16 keys are one 64-byte run (8-bit: 16 bytes,
     * four components to a line when blocks are 16 keys) */
    const ptrdiff_t kstep = KT == LL_KV_BF16 ? 2 : LL_KV_IS_8BIT(KT) && block_size == 16 ? 4 : 1;
    for (ptrdiff_t d = 0; d < D; d += kstep)
        __builtin_prefetch(k + (d * block_size + (KT == LL_KV_BF16 ? 2 * row : row)) * esz, 0, 3);
    if (LL_KV_IS_8BIT(KT)) __builtin_prefetch(k + (D * block_size + 4 * row), 0, 3);   /* the 16 scales */
}

LL_INLINE void ll_attn_prefetch_v(const int KT, const char *v, ptrdiff_t row, ptrdiff_t block_size, ptrdiff_t D) {
    const ptrdiff_t esz = LL_KV_IS_8BIT(KT) ? 1 : KT == LL_KV_BF16 ? 2 : 4;
    const char *vr = v + row * D * esz;   /* the chunk's 16 keys: one contiguous run of 16 x D values */
    for (ptrdiff_t off = 0; off < 16 * D * esz; off += 64) __builtin_prefetch(vr + off, 0, 3);
    if (LL_KV_IS_8BIT(KT)) __builtin_prefetch(v + (D * block_size + 4 * row), 0, 3);
}

/* Pass 1 for rows r0 .. r0 + NR - 1 and chunk ch: raw scores (q already scaled). K is read as
 * KT (fp32, bf16 pairs or 8-bit codes); KS: 8-bit storage, the keys' scales multiply the scores. */
LL_INLINE void ll_attn_scores(const int KT, const int KS, const int NR, const ll_attn_span *sp, int ch,
                              const void *qrows, ptrdiff_t r0, ll_vf32 out[4]) {
    const ptrdiff_t D = sp->D, B = sp->kb;
    const int CH = NR == 1 ? 4 : NR == 2 ? 2 : 1;   /* independent chains per row */
    ll_vf32 s[4][4];
    for (int k = 0; k < NR; k++)
        for (int e = 0; e < CH; e++) s[k][e] = ll_zero();
    if (LL_KV_IS_8BIT(KT)) {   /* codes decoded in registers; the keys' scales applied once below */
        const uint8_t *kp = (const uint8_t *)sp->k + sp->koff[ch];
        const float *qf = (const float *)qrows + r0 * D;
        for (ptrdiff_t d = 0; d < D; d += CH)
            for (int e = 0; e < CH; e++) {
                const ll_vf32 kv = ll_load_kv8(KT, kp + (d + e) * B);
                for (int k = 0; k < NR; k++) s[k][e] = ll_fma(ll_set1(qf[k * D + d + e]), kv, s[k][e]);
            }
    } else if (KT == LL_KV_BF16) {
        const uint16_t *kp = (const uint16_t *)sp->k + sp->koff[ch];
        const uint32_t *qb = (const uint32_t *)qrows + r0 * (D / 2);
        for (ptrdiff_t dp = 0; dp < D / 2; dp += CH)
            for (int e = 0; e < CH; e++)
                for (int k = 0; k < NR; k++)
                    s[k][e] = ll_dot2_bf16_at(s[k][e], qb + k * (D / 2) + dp + e, kp + (dp + e) * 2 * B);
    } else {
        const float *kp = (const float *)sp->k + sp->koff[ch];
        const float *qf = (const float *)qrows + r0 * D;
        for (ptrdiff_t d = 0; d < D; d += CH)
            for (int e = 0; e < CH; e++) {
                const ll_vf32 kv = ll_load(kp + (d + e) * B);
                for (int k = 0; k < NR; k++) s[k][e] = ll_fma(ll_set1(qf[k * D + d + e]), kv, s[k][e]);
            }
    }
    const ll_vf32 ks = KS ? ll_mul(ll_load(sp->kscale[ch]), ll_set1(ll_kv8_unit(KT))) : ll_zero();
    for (int k = 0; k < NR; k++) {
        for (int e = 1; e < CH; e++) s[k][0] = ll_add(s[k][0], s[k][e]);
        out[k] = KS ? ll_mul(s[k][0], ks) : s[k][0];
    }
}

/* Pass 3 for rows r0 .. r0 + NR - 1, U vectors of 16 components from component 16 * i. */
LL_INLINE void ll_attn_pv(const int KT, const int NR, const int U, const ll_attn_span *sp, ptrdiff_t r0,
                          ptrdiff_t i, float *acc) {
    const ptrdiff_t D = sp->D;
    ll_vf32 a[4][4];
    for (int k = 0; k < NR; k++)
        for (int u = 0; u < U; u++) a[k][u] = ll_load(acc + (r0 + k) * D + 16 * (i + u));
    for (int ch = 0; ch < sp->nchunks; ch++) {
        if (r0 == 0 && i == 0 && sp->pfv[ch]) ll_attn_prefetch_v(sp->kt, sp->pfv[ch], sp->pfrow[ch], sp->block_size, D);
        if (LL_KV_IS_8BIT(KT)) {   /* P already holds p x the keys' V scales */
            const uint8_t *vp = (const uint8_t *)sp->vchunk[ch] + sp->voff[ch] + 16 * i;
            const float *pp = sp->P + r0 * LL_ATTN_SPAN + ch * 16;
            for (int j = 0; j < 16; j++)
                for (int u = 0; u < U; u++) {
                    const ll_vf32 vv = ll_load_kv8(KT, vp + j * D + 16 * u);
                    for (int k = 0; k < NR; k++) a[k][u] = ll_fma(ll_set1(pp[k * LL_ATTN_SPAN + j]), vv, a[k][u]);
                }
        } else if (KT == LL_KV_BF16) {
            const uint16_t *vp = (const uint16_t *)sp->vchunk[ch] + sp->voff[ch] + 32 * i;
            const uint32_t *pp = (const uint32_t *)sp->P + r0 * LL_ATTN_SPAN + ch * 8;   /* rows of SPAN floats */
            for (int jp = 0; jp < 8; jp++)
                for (int u = 0; u < U; u++)
                    for (int k = 0; k < NR; k++)
                        a[k][u] = ll_dot2_bf16_at(a[k][u], pp + k * LL_ATTN_SPAN + jp, vp + jp * 2 * D + 32 * u);
        } else {
            const float *vp = (const float *)sp->vchunk[ch] + sp->voff[ch] + 16 * i;
            const float *pp = sp->P + r0 * LL_ATTN_SPAN + ch * 16;
            for (int j = 0; j < 16; j++)
                for (int u = 0; u < U; u++) {
                    const ll_vf32 vv = ll_load(vp + j * D + 16 * u);
                    for (int k = 0; k < NR; k++) a[k][u] = ll_fma(ll_set1(pp[k * LL_ATTN_SPAN + j]), vv, a[k][u]);
                }
        }
    }
    for (int k = 0; k < NR; k++)
        for (int u = 0; u < U; u++) ll_store(acc + (r0 + k) * D + 16 * (i + u), a[k][u]);
}

/* Passes 1 and 3 for one block of NR rows (pass 2 runs between them over all rows). */
LL_INLINE void ll_attn_pass1(const int KT, const int KS, const int NR, const ll_attn_span *sp, const void *qrows,
                             ptrdiff_t r0, const int32_t *pos, const int32_t *last, int group, int window, int j0,
                             int nj_last) {
    for (int ch = 0; ch < sp->nchunks; ch++) {
        ll_vf32 s[4];
        if (r0 == 0 && sp->pfk[ch]) ll_attn_prefetch_k(sp->kt, sp->pfk[ch], sp->pfrow[ch], sp->block_size, sp->D);
        const ptrdiff_t c = sp->c0 + 16 * ch;
        const int lo = ch == 0 ? j0 : 0, hi = ch == sp->nchunks - 1 ? nj_last : 16;   /* keys in the cache */
        ll_attn_scores(KT, KS, NR, sp, ch, qrows, r0, s);
        if (sp->softcap > 0.f)
            for (int k = 0; k < NR; k++) s[k] = ll_softcap_v(s[k], sp->softcap);
        for (int k = 0; k < NR; k++) {
            const ptrdiff_t r = r0 + k, p = pos[r / group], e = last[r / group];
            const ptrdiff_t first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            float *out = sp->S + r * LL_ATTN_SPAN + 16 * ch;
            ll_store(out, s[k]);
            if (!(c >= first && c + 15 <= e && lo == 0 && hi == 16))   /* hide keys outside [first, e] */
                for (int j = 0; j < 16; j++)
                    if (c + j > e || c + j < first || j < lo || j >= hi) out[j] = -INFINITY;
        }
    }
}

LL_INLINE void ll_attn_pass3(const int KT, const int NR, const ll_attn_span *sp, ptrdiff_t r0, float *acc) {
    ptrdiff_t i = 0;
    for (; i + 4 <= sp->D / 16; i += 4) ll_attn_pv(KT, NR, 4, sp, r0, i, acc);
    for (; i < sp->D / 16; i++) ll_attn_pv(KT, NR, 1, sp, r0, i, acc);
}

/* Staging one 16-key chunk from a cache of type KT into compute type CT, chunk-local:
 *   K: src at the chunk's first key (key stride B) -> fp32 [D][16] or bf16 pairs [D/2][16][2]
 *   V: src at the chunk's first key row -> fp32 [16][D] or bf16 pairs [8][D][2]; keys outside
 *      [lo, hi) (not in the cache: anything, NaN included) become 0
 * 8-bit codes are decoded exactly (value / scale; the scales stay outside). */
LL_INLINE void ll_attn_stage_k(const int KT, const int CT, const void *src, ptrdiff_t B, ptrdiff_t D, void *dst) {
    if (KT == LL_KV_BF16) {   /* CT is fp32 */
        const uint16_t *sp = (const uint16_t *)src;
        float *d = (float *)dst;
        for (ptrdiff_t dp = 0; dp < D / 2; dp++) {
            ll_store(d + 2 * dp * 16, ll_load_bf16_even(sp + dp * 2 * B));
            ll_store(d + (2 * dp + 1) * 16, ll_load_bf16_odd(sp + dp * 2 * B));
        }
        return;
    }
    const uint8_t *sp = (const uint8_t *)src;
    const ll_vf32 u = ll_set1(ll_kv8_unit(KT));
    if (CT == LL_KV_F32)
        for (ptrdiff_t d = 0; d < D; d++) ll_store((float *)dst + d * 16, ll_mul(ll_load_kv8(KT, sp + d * B), u));
    else
        for (ptrdiff_t dp = 0; dp < D / 2; dp++)
            ll_store_bf16_pairs((uint16_t *)dst + dp * 32, ll_mul(ll_load_kv8(KT, sp + 2 * dp * B), u),
                                ll_mul(ll_load_kv8(KT, sp + (2 * dp + 1) * B), u));
}

LL_INLINE void ll_attn_stage_v(const int KT, const int CT, const void *src, ptrdiff_t D, int lo, int hi, void *dst) {
    const ll_vf32 z = ll_zero();
    if (KT == LL_KV_BF16) {   /* CT is fp32 */
        const uint16_t *sp = (const uint16_t *)src;
        float *d = (float *)dst;
        for (int jp = 0; jp < 8; jp++)
            for (ptrdiff_t i = 0; i < D / 16; i++) {
                const int j = 2 * jp;
                const uint16_t *p = sp + jp * 2 * D + 32 * i;
                ll_store(d + j * D + 16 * i, j >= lo && j < hi ? ll_load_bf16_even(p) : z);
                ll_store(d + (j + 1) * D + 16 * i, j + 1 >= lo && j + 1 < hi ? ll_load_bf16_odd(p) : z);
            }
        return;
    }
    const uint8_t *sp = (const uint8_t *)src;
    const ll_vf32 u = ll_set1(ll_kv8_unit(KT));
    if (CT == LL_KV_F32) {
        for (int j = 0; j < 16; j++)
            for (ptrdiff_t i = 0; i < D / 16; i++)
                ll_store((float *)dst + j * D + 16 * i,
                         j >= lo && j < hi ? ll_mul(ll_load_kv8(KT, sp + j * D + 16 * i), u) : z);
        return;
    }
    for (int jp = 0; jp < 8; jp++) {
        const int j = 2 * jp;
        for (ptrdiff_t i = 0; i < D / 16; i++) {
            const ll_vf32 a = j >= lo && j < hi ? ll_mul(ll_load_kv8(KT, sp + j * D + 16 * i), u) : z;
            const ll_vf32 b = j + 1 >= lo && j + 1 < hi ? ll_mul(ll_load_kv8(KT, sp + (j + 1) * D + 16 * i), u) : z;
            ll_store_bf16_pairs((uint16_t *)dst + jp * 2 * D + 32 * i, a, b);
        }
    }
}

/* Keys a tile attends to: kmin .. kmax, the union of its tokens' ranges. */
static inline void ll_attn_key_range(const int32_t *pos, const int32_t *last, int nq, int window, ptrdiff_t *kmin,
                                     ptrdiff_t *kmax) {
    *kmin = -1; *kmax = -1;
    for (int qi = 0; qi < nq; qi++) {
        const ptrdiff_t first = window > 0 && pos[qi] - window + 1 > 0 ? pos[qi] - window + 1 : 0;
        if (*kmin < 0 || first < *kmin) *kmin = first;
        if (last[qi] > *kmax) *kmax = last[qi];
    }
}

/* Offset (elements) of the (block, kv head) region that holds key position c of a sequence. */
LL_INLINE ptrdiff_t ll_kv_region_of(const int32_t *block_table, ptrdiff_t c, ptrdiff_t block_size,
                                    ptrdiff_t num_kv_heads, ptrdiff_t kv_head, ptrdiff_t region) {
    return (block_table[c / block_size] * num_kv_heads + kv_head) * region;
}

LL_INLINE void ll_attn_prefetch_chunk(const int KT, const void *k_cache, const void *v_cache,
                                      const int32_t *block_table, ptrdiff_t c, ptrdiff_t block_size,
                                      ptrdiff_t num_kv_heads, ptrdiff_t kv_head, ptrdiff_t region, ptrdiff_t D) {
    const ptrdiff_t esz = LL_KV_IS_8BIT(KT) ? 1 : KT == LL_KV_BF16 ? 2 : 4, row = c % block_size;
    const ptrdiff_t base = ll_kv_region_of(block_table, c, block_size, num_kv_heads, kv_head, region);
    ll_attn_prefetch_k(KT, (const char *)k_cache + base * esz, row, block_size, D);
    ll_attn_prefetch_v(KT, (const char *)v_cache + base * esz, row, block_size, D);
}

/* Attention sinks (gpt-oss): a learned logit per query head that joins the softmax's
 * denominator and no value: out = acc / (l + e^(sink - m)), taken with M = max(m, sink) so that
 * neither exponent overflows. The factor acc (kept relative to e^m) is multiplied by; a row
 * that saw no key (m = -inf) gives 0, as all its weight is on the sink. */
LL_INLINE float ll_attn_sink_factor(float m, float l, float sink) {
    if (m == -INFINITY) return 0.f;
    const float M = m > sink ? m : sink, em = expf(m - M);
    return em / (l * em + expf(sink - M));
}

LL_INLINE void ll_attention_tile_impl(const int KT, const int CT, const float *q, ptrdiff_t ldq, float *out,
                                      ptrdiff_t ldo, int nq, int group, ptrdiff_t h0, const int32_t *pos,
                                      const int32_t *last, int window, const void *k_cache, const void *v_cache,
                                      const int32_t *block_table, ptrdiff_t block_size, ptrdiff_t kv_head, ptrdiff_t num_kv_heads,
                                      ptrdiff_t head_dim, float scale, float softcap, const float *sinks,
                                      float *scratch, int split, int nsplit, float *partial, int rowwise) {
    /* KT: the cache's type; CT: the dot products' (== KT: direct, else staged) */
    const int ST = CT != KT, Q8 = LL_KV_IS_8BIT(KT);
    const int BFQ = CT == LL_KV_BF16;          /* q (and P) rounded to bf16 for vdpbf16ps */
    const int BFP = BFQ && !Q8;                /* pass 2 rounds P (8-bit: after the V scales) */
    const ptrdiff_t D = head_dim, nv = head_dim / 16, rows = (ptrdiff_t)nq * group;
    float *edge = scratch, *qrows = edge + 2 * 16 * D, *acc = qrows + rows * D;
    float *m = acc + rows * D, *l = m + rows;
    ll_attn_span sp;
    sp.k = k_cache; sp.v = v_cache; sp.kb = ST ? 16 : block_size; sp.D = D; sp.softcap = softcap;
    sp.kt = KT; sp.block_size = block_size;
    sp.S = l + rows; sp.P = sp.S + rows * LL_ATTN_SPAN;
    float *kst = sp.P + rows * LL_ATTN_SPAN, *vst = kst + LL_ATTN_SPAN * D, *vsc = vst + LL_ATTN_SPAN * D;
    const size_t cesz = CT == LL_KV_BF16 ? sizeof(uint16_t) : sizeof(float);   /* staged element */
    if (ST) sp.k = kst;
    ptrdiff_t kmin, kmax;
    ll_attn_key_range(pos, last, nq, window, &kmin, &kmax);
    if (nsplit > 1) {   /* this split's share of the 16-key chunks: keys kmin' .. kmax' */
        const ptrdiff_t c_first = kmin - kmin % 16, nc = (kmax - c_first) / 16 + 1;
        const ptrdiff_t lo = c_first + 16 * (nc * split / nsplit), hi = c_first + 16 * (nc * (split + 1) / nsplit) - 1;
        if (lo > kmin) kmin = lo;
        if (hi < kmax) kmax = hi;
    }
    const ll_vf32 sv = ll_set1(scale);
    for (ptrdiff_t r = 0; r < rows; r++) {   /* q * scale, in the dot products' type */
        const float *qr = q + (r / group) * ldq + (h0 + r % group) * D;
        for (ptrdiff_t i = 0; i < nv; i++) {
            const ll_vf32 x = ll_mul(ll_load(qr + 16 * i), sv);
            if (BFQ) ll_store_bf16((uint16_t *)qrows + r * D + 16 * i, x);
            else ll_store(qrows + r * D + 16 * i, x);
        }
        m[r] = -INFINITY; l[r] = 0.f;
        for (ptrdiff_t i = 0; i < D; i++) acc[r * D + i] = 0.f;
    }
    const size_t esz = Q8 ? 1 : KT == LL_KV_BF16 ? sizeof(uint16_t) : sizeof(float);
    const ptrdiff_t region = ll_kv_region_bytes(KT, block_size, D) / (ptrdiff_t)esz;   /* in elements */
    const ptrdiff_t cfirst = kmin - kmin % 16;
    for (ptrdiff_t c = cfirst; kmin <= kmax && c <= kmax && c < cfirst + LL_ATTN_SPAN; c += 16)   /* the first span */
        ll_attn_prefetch_chunk(KT, k_cache, v_cache, block_table, c, block_size, num_kv_heads, kv_head, region, D);
    for (ptrdiff_t c0 = cfirst; kmin <= kmax && c0 <= kmax; c0 += 16 * sp.nchunks) {
        /* spans end at multiples of LL_ATTN_SPAN keys, wherever the tile's first key falls (its
         * tokens' windows, a key split): a row's online softmax rescales at the same keys in any
         * tile, so its result does not depend on the step's other rows */
        const ptrdiff_t left = (kmax - c0) / 16 + 1, room = (LL_ATTN_SPAN - c0 % LL_ATTN_SPAN) / 16;
        sp.c0 = c0;
        sp.nchunks = (int)(left < room ? left : room);
        const int j0 = c0 == cfirst ? (int)(kmin - cfirst) : 0;     /* keys before kmin: not attended */
        const ptrdiff_t clast = c0 + 16 * (sp.nchunks - 1);
        const int nj_last = kmax - clast + 1 < 16 ? (int)(kmax - clast + 1) : 16;   /* keys after kmax: not written */
        int nedge = 0;
        for (int ch = 0; ch < sp.nchunks; ch++) {
            const ptrdiff_t c = c0 + 16 * ch, row = c % block_size;
            const ptrdiff_t base = ll_kv_region_of(block_table, c, block_size, num_kv_heads, kv_head, region);
            const int lo = ch == 0 ? j0 : 0, hi = ch == sp.nchunks - 1 ? nj_last : 16;
            sp.pfk[ch] = sp.pfv[ch] = NULL;   /* the next span's chunk, asked for while this one computes */
            if (c + LL_ATTN_SPAN <= kmax) {
                const ptrdiff_t nb = ll_kv_region_of(block_table, c + LL_ATTN_SPAN, block_size, num_kv_heads, kv_head,
                                                     region);
                sp.pfk[ch] = (const char *)k_cache + nb * esz;
                sp.pfv[ch] = (const char *)v_cache + nb * esz;
                sp.pfrow[ch] = (c + LL_ATTN_SPAN) % block_size;
            }
            sp.koff[ch] = base + (KT == LL_KV_BF16 ? 2 * row : row);
            sp.vchunk[ch] = v_cache;
            sp.voff[ch] = base + row * D;
            if (Q8) {   /* scales follow the block's D x B codes */
                sp.kscale[ch] = (const float *)((const uint8_t *)k_cache + base + D * block_size) + row;
                sp.vscale[ch] = (const float *)((const uint8_t *)v_cache + base + D * block_size) + row;
            }
            if (ST) {   /* this chunk converted once for every row block; V outside [lo, hi) zeroed */
                ll_attn_stage_k(KT, CT, (const char *)k_cache + sp.koff[ch] * esz, block_size, D,
                                (char *)kst + ch * 16 * D * cesz);
                ll_attn_stage_v(KT, CT, (const char *)v_cache + sp.voff[ch] * esz, D, lo, hi,
                                (char *)vst + ch * 16 * D * cesz);
                sp.koff[ch] = ch * 16 * D;
                sp.vchunk[ch] = vst;
                sp.voff[ch] = ch * 16 * D;
                if (Q8) {
                    for (int j = 0; j < 16; j++) vsc[16 * ch + j] = j >= lo && j < hi ? sp.vscale[ch][j] : 0.f;
                    sp.vscale[ch] = vsc + 16 * ch;
                }
            } else if (lo > 0 || hi < 16) {
                /* keys outside [lo, hi) may hold anything (NaN included): their scores are
                 * masked, but V is read in key pairs, so PV reads a copy with them zeroed */
                float *e = edge + (nedge++) * 16 * D;
                memcpy(e, (const char *)v_cache + sp.voff[ch] * esz, 16 * D * esz);
                float *es = (float *)((char *)e + 16 * D);   /* 8-bit: the 16 scales after the codes */
                if (Q8) memcpy(es, sp.vscale[ch], 16 * sizeof(float));
                for (int j = 0; j < 16; j++)
                    if (j < lo || j >= hi) {
                        if (Q8) es[j] = 0.f;
                        for (ptrdiff_t d = 0; d < D; d++) {
                            if (Q8) ((uint8_t *)e)[j * D + d] = 0;
                            else if (KT == LL_KV_BF16) ((uint16_t *)e)[ll_v_index(LL_KV_BF16, j, d, D)] = 0;
                            else e[j * D + d] = 0.f;
                        }
                    }
                sp.vchunk[ch] = e;
                sp.voff[ch] = 0;
                if (Q8) sp.vscale[ch] = es;
            }
        }
        /* pass 1 */
        ptrdiff_t r0 = 0;
        if (rowwise)
            for (; r0 < rows; r0++) ll_attn_pass1(CT, Q8, 1, &sp, qrows, r0, pos, last, group, window, j0, nj_last);
        for (; r0 + 4 <= rows; r0 += 4) ll_attn_pass1(CT, Q8, 4, &sp, qrows, r0, pos, last, group, window, j0, nj_last);
        switch (rows - r0) {
            case 3: ll_attn_pass1(CT, Q8, 3, &sp, qrows, r0, pos, last, group, window, j0, nj_last); break;
            case 2: ll_attn_pass1(CT, Q8, 2, &sp, qrows, r0, pos, last, group, window, j0, nj_last); break;
            case 1: ll_attn_pass1(CT, Q8, 1, &sp, qrows, r0, pos, last, group, window, j0, nj_last); break;
            default: break;
        }
        /* pass 2: a row that sees nothing of the span gets p = 0 and keeps m, l, acc */
        const ptrdiff_t n = 16 * (ptrdiff_t)sp.nchunks;
        for (ptrdiff_t r = 0; r < rows; r++) {
            const float *S = sp.S + r * LL_ATTN_SPAN;
            ll_vf32 mx = ll_load(S);
            for (ptrdiff_t j = 16; j < n; j += 16) mx = ll_max(mx, ll_load(S + j));
            const float smax = ll_hmax(mx);
            if (smax == -INFINITY) {
                memset(sp.P + r * LL_ATTN_SPAN, 0, (size_t)n * sizeof(float));
                continue;
            }
            const float m_new = m[r] > smax ? m[r] : smax;
            const ll_vf32 mv = ll_set1(m_new);
            ll_vf32 sum = ll_zero();
            for (ptrdiff_t j = 0; j < n; j += 16) {
                ll_vf32 p = ll_exp(ll_sub(ll_load(S + j), mv));
                if (BFP) {   /* l sums the probabilities PV uses: the rounded ones */
                    uint16_t *pb = (uint16_t *)(sp.P + r * LL_ATTN_SPAN) + j;
                    ll_store_bf16(pb, p);
                    p = ll_load_bf16(pb);
                } else {
                    ll_store(sp.P + r * LL_ATTN_SPAN + j, p);
                }
                sum = ll_add(sum, p);
            }
            const float corr = expf(m[r] - m_new);
            l[r] = l[r] * corr + ll_hsum(sum);
            m[r] = m_new;
            if (corr != 1.f) {
                const ll_vf32 cv = ll_set1(corr);
                for (ptrdiff_t i = 0; i < nv; i++) ll_store(acc + r * D + 16 * i, ll_mul(ll_load(acc + r * D + 16 * i), cv));
            }
        }
        if (Q8) {   /* fold the V scales into the probabilities: P @ V then reads codes only
                     * (direct: decoded e4m3 is value x 2^-8, staged: exact); staged to bf16:
                     * rounded in place, chunk ch's 16 bf16 over bytes already read */
            const ll_vf32 unit = ll_set1(ST ? 1.f : ll_kv8_unit(KT));
            for (ptrdiff_t r = 0; r < rows; r++)
                for (int ch = 0; ch < sp.nchunks; ch++) {
                    float *p = sp.P + r * LL_ATTN_SPAN + 16 * ch;
                    const ll_vf32 x = ll_mul(ll_load(p), ll_mul(ll_load(sp.vscale[ch]), unit));
                    if (BFQ) ll_store_bf16((uint16_t *)(sp.P + r * LL_ATTN_SPAN) + 16 * ch, x);
                    else ll_store(p, x);
                }
        }
        /* pass 3 */
        r0 = 0;
        for (; r0 + 4 <= rows; r0 += 4) ll_attn_pass3(CT, 4, &sp, r0, acc);
        switch (rows - r0) {
            case 3: ll_attn_pass3(CT, 3, &sp, r0, acc); break;
            case 2: ll_attn_pass3(CT, 2, &sp, r0, acc); break;
            case 1: ll_attn_pass3(CT, 1, &sp, r0, acc); break;
            default: break;
        }
    }
    if (partial) {   /* one split of several: unnormalised acc, m, l per row for ll_attention_combine */
        for (ptrdiff_t r = 0; r < rows; r++) {
            memcpy(partial + r * (D + 2), acc + r * D, (size_t)D * sizeof(float));
            partial[r * (D + 2) + D] = m[r];
            partial[r * (D + 2) + D + 1] = l[r];
        }
        return;
    }
    for (int qi = 0; qi < nq; qi++)
        for (int g = 0; g < group; g++) {
            const ptrdiff_t r = (ptrdiff_t)qi * group + g;
            float inv_l = l[r] > 0.f ? 1.0f / l[r] : 0.f;
            if (sinks) inv_l = ll_attn_sink_factor(m[r], l[r], sinks[h0 + g]);
            const ll_vf32 inv = ll_set1(inv_l);
            float *o = out + qi * ldo + (h0 + g) * D;
            for (ptrdiff_t i = 0; i < nv; i++) ll_store(o + 16 * i, ll_mul(ll_load(acc + r * D + 16 * i), inv));
        }
}

/* Merge nsplit partial results of one tile (each rows x (D + 2): acc, m, l; item stride
 * `stride` floats) into normalised out rows: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M)
 * (+ e^(sink - M) in the denominator with sinks, one per query head). */
static inline void ll_attention_combine(const float *partials, int nsplit, ptrdiff_t stride, int nq, int group,
                                        ptrdiff_t h0, float *out, ptrdiff_t ldo, ptrdiff_t head_dim,
                                        const float *sinks) {
    const ptrdiff_t D = head_dim, nv = head_dim / 16;
    for (int qi = 0; qi < nq; qi++)
        for (int g = 0; g < group; g++) {
            const ptrdiff_t r = (ptrdiff_t)qi * group + g;
            float mx = -INFINITY, lsum = 0.f;
            for (int s = 0; s < nsplit; s++) {
                const float ms = partials[s * stride + r * (D + 2) + D];
                if (ms > mx) mx = ms;
            }
            float *o = out + qi * ldo + (h0 + g) * D;
            for (ptrdiff_t i = 0; i < nv; i++) ll_store(o + 16 * i, ll_zero());
            if (mx == -INFINITY) continue;   /* saw no key at all */
            if (sinks && sinks[h0 + g] > mx) mx = sinks[h0 + g];   /* the sink's term below stays <= 1 */
            for (int s = 0; s < nsplit; s++) {
                const float *ps = partials + s * stride + r * (D + 2);
                if (ps[D] == -INFINITY) continue;
                const float w = expf(ps[D] - mx);
                lsum += w * ps[D + 1];
                const ll_vf32 wv = ll_set1(w);
                for (ptrdiff_t i = 0; i < nv; i++) ll_store(o + 16 * i, ll_fma(wv, ll_load(ps + 16 * i), ll_load(o + 16 * i)));
            }
            if (sinks) lsum += expf(sinks[h0 + g] - mx);
            const ll_vf32 inv = ll_set1(lsum > 0.f ? 1.0f / lsum : 0.f);
            for (ptrdiff_t i = 0; i < nv; i++) ll_store(o + 16 * i, ll_mul(ll_load(o + 16 * i), inv));
        }
}

/* One function per (cache type, compute type): each copy is specialised and optimised on its own
 * (one function holding all twelve took gcc three times as long to compile). */
#define LL_ATTN_PARAMS const float *q, ptrdiff_t ldq, float *out, ptrdiff_t ldo, int nq, int group, ptrdiff_t h0, \
        const int32_t *pos, const int32_t *last, int window, const void *k_cache, const void *v_cache, \
        const int32_t *block_table, ptrdiff_t block_size, ptrdiff_t kv_head, ptrdiff_t num_kv_heads, \
        ptrdiff_t head_dim, float scale, float softcap, const float *sinks, float *scratch, int split, int nsplit, \
        float *partial, int rowwise
#define LL_ATTN_ARGS q, ldq, out, ldo, nq, group, h0, pos, last, window, k_cache, v_cache, block_table, block_size, \
        kv_head, num_kv_heads, head_dim, scale, softcap, sinks, scratch, split, nsplit, partial, rowwise
#define LL_ATTN_COPY(NAME, KT, CT) \
    static __attribute__((noinline)) void NAME(LL_ATTN_PARAMS) { ll_attention_tile_impl(KT, CT, LL_ATTN_ARGS); }
LL_ATTN_COPY(ll_attn_tile_bf16_f32, LL_KV_BF16, LL_KV_F32)
LL_ATTN_COPY(ll_attn_tile_bf16, LL_KV_BF16, LL_KV_BF16)
LL_ATTN_COPY(ll_attn_tile_i8_f32, LL_KV_I8, LL_KV_F32)
LL_ATTN_COPY(ll_attn_tile_i8_bf16, LL_KV_I8, LL_KV_BF16)
LL_ATTN_COPY(ll_attn_tile_i8, LL_KV_I8, LL_KV_I8)
LL_ATTN_COPY(ll_attn_tile_e4m3_f32, LL_KV_E4M3, LL_KV_F32)
LL_ATTN_COPY(ll_attn_tile_e4m3_bf16, LL_KV_E4M3, LL_KV_BF16)
LL_ATTN_COPY(ll_attn_tile_e4m3, LL_KV_E4M3, LL_KV_E4M3)
LL_ATTN_COPY(ll_attn_tile_e5m2_f32, LL_KV_E5M2, LL_KV_F32)
LL_ATTN_COPY(ll_attn_tile_e5m2_bf16, LL_KV_E5M2, LL_KV_BF16)
LL_ATTN_COPY(ll_attn_tile_e5m2, LL_KV_E5M2, LL_KV_E5M2)
LL_ATTN_COPY(ll_attn_tile_f32, LL_KV_F32, LL_KV_F32)
#undef LL_ATTN_COPY

/* One work item: the tile's nq tokens x `group` heads from h0 (one KV head), over all its keys
 * (token i: from the window behind pos[i] to last[i]; last == pos: causal)
 * (nsplit == 1, normalised into out) or over split `split` of nsplit (raw into partial);
 * softcap > 0 caps the scaled scores at softcap * tanh(score / softcap) (Gemma 2); sinks: NULL,
 * or one logit per query head (indexed by absolute head) that joins each row's softmax
 * denominator (gpt-oss; the split path adds it in ll_attention_combine); `path` one of
 * LL_ATTN_* (above). */
static inline void ll_paged_attention_tile(const float *q, ptrdiff_t ldq, float *out, ptrdiff_t ldo,
                                           int nq, int group, ptrdiff_t h0, const int32_t *pos,
                                           const int32_t *last, int window,
                                           const void *k_cache, const void *v_cache, int kv_type,
                                           const int32_t *block_table, ptrdiff_t block_size,
                                           ptrdiff_t kv_head, ptrdiff_t num_kv_heads, ptrdiff_t head_dim,
                                           float scale, float softcap, const float *sinks, float *scratch,
                                           int split, int nsplit, float *partial, int path) {
    const int big = nq * group >= LL_ATTN_STAGE_ROWS, rowwise = path == LL_ATTN_ROWS;
    /* the compute type a staged tile would use, or -1: direct */
    const int stage = path == LL_ATTN_F32 || (path == LL_ATTN_AUTO_FMA && big) ? LL_KV_F32
                    : path == LL_ATTN_BF16 || (path == LL_ATTN_AUTO && big) ? LL_KV_BF16 : -1;
#define LL_ATTN_8BIT(T) \
    if (stage == LL_KV_F32) ll_attn_tile_##T##_f32(LL_ATTN_ARGS); \
    else if (stage == LL_KV_BF16) ll_attn_tile_##T##_bf16(LL_ATTN_ARGS); \
    else ll_attn_tile_##T(LL_ATTN_ARGS)
    switch (kv_type) {   /* one specialised copy per cache type and compute type */
        case LL_KV_BF16:
            if (stage == LL_KV_F32) ll_attn_tile_bf16_f32(LL_ATTN_ARGS);
            else ll_attn_tile_bf16(LL_ATTN_ARGS);
            break;
        case LL_KV_I8: LL_ATTN_8BIT(i8); break;
        case LL_KV_E4M3: LL_ATTN_8BIT(e4m3); break;
        case LL_KV_E5M2: LL_ATTN_8BIT(e5m2); break;
        default: ll_attn_tile_f32(LL_ATTN_ARGS); break;
    }
#undef LL_ATTN_8BIT
}
#undef LL_ATTN_ARGS
#undef LL_ATTN_PARAMS

LL_HOT_END
#endif
