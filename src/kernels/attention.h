/* Paged attention on one thread: online softmax over the KV blocks of one sequence, for a
 * tile of its query tokens and the query heads sharing one KV head. The same kernel serves
 * decode (one query per sequence) and prefill chunks (each query attends to the cached
 * context plus the chunk up to itself, within the sliding window if any).
 *
 * KV cache of one layer, fp32 or bf16 (kv_bf16); position p of a sequence lives in block
 * block_table[p / B] at offset p % B:
 *   V [num_blocks][num_kv_heads][block_size][head_dim]   one row per key
 *   K [num_blocks][num_kv_heads][head_dim][block_size]   transposed: one vector load gives
 *                                                        component d of 16 consecutive keys
 * head_dim and block_size must be multiples of 16.
 */
#ifndef LL_ATTENTION_H
#define LL_ATTENTION_H
#include "../simd/vec.h"

#define LL_MAX_HEAD_DIM 512

LL_INLINE ll_vf32 ll_kv_load(const void *base, ptrdiff_t off, int kv_bf16) {
    return kv_bf16 ? ll_load_bf16((const uint16_t *)base + off) : ll_load((const float *)base + off);
}

/* Write one token's K or V head rows [num_kv_heads][D] (contiguous, fp32) at `slot`;
 * transposed: the K layout (the token's D values go down a column of the block). */
static inline void ll_write_kv_row(const float *src, void *cache, int kv_bf16, ptrdiff_t slot,
                                   ptrdiff_t block_size, ptrdiff_t num_kv_heads, ptrdiff_t head_dim,
                                   int transposed) {
    const ptrdiff_t blk = slot / block_size, row = slot % block_size;
    if (transposed) {
        for (ptrdiff_t h = 0; h < num_kv_heads; h++) {
            const ptrdiff_t base = (blk * num_kv_heads + h) * head_dim * block_size + row;
            const float *s = src + h * head_dim;
            for (ptrdiff_t i = 0; i < head_dim; i++) {
                if (kv_bf16) ((uint16_t *)cache)[base + i * block_size] = ll_f32_to_bf16(s[i]);
                else ((float *)cache)[base + i * block_size] = s[i];
            }
        }
        return;
    }
    for (ptrdiff_t h = 0; h < num_kv_heads; h++) {
        const ptrdiff_t off = ((blk * num_kv_heads + h) * block_size + row) * head_dim;
        const float *s = src + h * head_dim;
        if (kv_bf16) {
            uint16_t *d = (uint16_t *)cache + off;
            for (ptrdiff_t i = 0; i < head_dim; i++) d[i] = ll_f32_to_bf16(s[i]);
        } else {
            memcpy((float *)cache + off, s, (size_t)head_dim * sizeof(float));
        }
    }
}
/* Per 16-key chunk: a row's 16 scores are D broadcast-FMAs on K's transposed layout (no
 * horizontal sums), four rows at a time sharing each K load; softmax is vectorised over the
 * chunk; V is widened once into Vf [16][D] for all rows of the tile.
 * Row r = qi * G + g is query token qi, head h0 + g.
 */
#define LL_ATTN_QTILE 8

/* Floats of scratch one call needs. */
static inline ptrdiff_t ll_attention_scratch(ptrdiff_t head_dim, ptrdiff_t group) {
    return 16 * head_dim + LL_ATTN_QTILE * group * (head_dim + 2) + 16;
}

static inline void ll_paged_attention_tile(const float *q, ptrdiff_t ldq, float *out, ptrdiff_t ldo,
                                           int nq, int group, ptrdiff_t h0, const int32_t *pos, int window,
                                           const void *k_cache, const void *v_cache, int kv_bf16,
                                           const int32_t *block_table, ptrdiff_t block_size,
                                           ptrdiff_t kv_head, ptrdiff_t num_kv_heads, ptrdiff_t head_dim,
                                           float scale, float *scratch) {
    const ptrdiff_t D = head_dim, nv = head_dim / 16, rows = (ptrdiff_t)nq * group;
    float *Vf = scratch, *acc = scratch + 16 * D;
    float *m = acc + rows * D, *l = m + rows, *sc = l + rows;
    ptrdiff_t kmin = -1, kmax = -1;
    for (int qi = 0; qi < nq; qi++) {
        const ptrdiff_t first = window > 0 && pos[qi] - window + 1 > 0 ? pos[qi] - window + 1 : 0;
        if (kmin < 0 || first < kmin) kmin = first;
        if (pos[qi] > kmax) kmax = pos[qi];
    }
    for (ptrdiff_t r = 0; r < rows; r++) {
        m[r] = -INFINITY; l[r] = 0.f;
        for (ptrdiff_t i = 0; i < D; i++) acc[r * D + i] = 0.f;
    }
    const ptrdiff_t head_stride = block_size * D;
    const ll_vf32 sv = ll_set1(scale);
    for (ptrdiff_t c = kmin - kmin % 16; c <= kmax; c += 16) {
        const ptrdiff_t j0 = c < kmin ? kmin - c : 0;                  /* first valid key of the chunk */
        const ptrdiff_t nj = (kmax - c + 1 < 16 ? kmax - c + 1 : 16);  /* keys c .. c + nj - 1 exist */
        /* the chunk lies in one block (block_size % 16 == 0) */
        const ptrdiff_t blk = block_table[c / block_size];
        const ptrdiff_t kbase = (blk * num_kv_heads + kv_head) * D * block_size + c % block_size;
        const ptrdiff_t vbase = (blk * num_kv_heads + kv_head) * head_stride + (c % block_size) * D;
        /* V of the chunk widened once for all rows; keys outside [j0, nj) may hold anything
         * (NaN included): their V rows are zeroed and their scores masked */
        for (ptrdiff_t j = 0; j < 16 && rows > 1; j++) {   /* one row reads V from the cache directly */
            const int valid = j >= j0 && j < nj;
            for (ptrdiff_t i = 0; i < nv; i++)
                ll_store(Vf + j * D + 16 * i, valid ? ll_kv_load(v_cache, vbase + j * D + 16 * i, kv_bf16) : ll_zero());
        }
        /* rows in fours: four independent FMA chains share each K load */
        for (ptrdiff_t r0 = 0; r0 < rows; r0 += 4) {
            const int nr = rows - r0 < 4 ? (int)(rows - r0) : 4;
            const float *qp[4];
            for (int k = 0; k < 4; k++) {
                const ptrdiff_t r = r0 + (k < nr ? k : 0);
                qp[k] = q + (r / group) * ldq + (h0 + r % group) * D;
            }
            ll_vf32 s4[4] = {ll_zero(), ll_zero(), ll_zero(), ll_zero()};
            if (nr == 1) {   /* one row (decode, one head): four partial sums over d instead */
                for (ptrdiff_t d = 0; d < D; d += 4)
                    for (int e = 0; e < 4; e++)
                        s4[e] = ll_fma(ll_set1(qp[0][d + e]), ll_kv_load(k_cache, kbase + (d + e) * block_size, kv_bf16), s4[e]);
                s4[0] = ll_add(ll_add(s4[0], s4[1]), ll_add(s4[2], s4[3]));
            } else {
                for (ptrdiff_t d = 0; d < D; d++) {
                    const ll_vf32 kv = ll_kv_load(k_cache, kbase + d * block_size, kv_bf16);
                    s4[0] = ll_fma(ll_set1(qp[0][d]), kv, s4[0]);
                    s4[1] = ll_fma(ll_set1(qp[1][d]), kv, s4[1]);
                    s4[2] = ll_fma(ll_set1(qp[2][d]), kv, s4[2]);
                    s4[3] = ll_fma(ll_set1(qp[3][d]), kv, s4[3]);
                }
            }
            /* online softmax per row; a row that sees nothing of the chunk gets p = 0, corr = 1 */
            float pk[4][16], corr[4] = {1.f, 1.f, 1.f, 1.f};
            for (int k = 0; k < 4; k++) {
                const ptrdiff_t r = r0 + k, p = k < nr ? pos[r / group] : -1;
                const ptrdiff_t first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
                if (k >= nr || c > p || c + nj - 1 < first) {
                    ll_store(pk[k], ll_zero());
                    continue;
                }
                ll_vf32 sr = ll_mul(s4[k], sv);
                if (!(c >= first && c + 15 <= p && j0 == 0 && nj == 16)) {
                    ll_store(sc, sr);   /* the diagonal / window edge: hide keys outside [first, p] */
                    for (int j = 0; j < 16; j++)
                        if (c + j > p || c + j < first || j < j0 || j >= nj) sc[j] = -INFINITY;
                    sr = ll_load(sc);
                }
                const float cmax = ll_hmax(sr);
                const float m_new = m[r] > cmax ? m[r] : cmax;
                const ll_vf32 pv = ll_exp(ll_sub(sr, ll_set1(m_new)));
                corr[k] = expf(m[r] - m_new);
                l[r] = l[r] * corr[k] + ll_hsum(pv);
                m[r] = m_new;
                ll_store(pk[k], pv);
            }
            if (nr == 1) {   /* one row: four accumulators across D; V straight from the cache
                              * (rows == 1) or from Vf, keys j0 .. nj - 1 only (others may be NaN) */
                float *a1 = acc + r0 * D;
                const ll_vf32 cv = ll_set1(corr[0]);
                ptrdiff_t i = 0;
                for (; i + 4 <= nv; i += 4) {
                    ll_vf32 b0 = ll_mul(ll_load(a1 + 16 * i), cv), b1 = ll_mul(ll_load(a1 + 16 * i + 16), cv);
                    ll_vf32 b2 = ll_mul(ll_load(a1 + 16 * i + 32), cv), b3 = ll_mul(ll_load(a1 + 16 * i + 48), cv);
                    for (ptrdiff_t j = j0; j < nj; j++) {
                        const ll_vf32 p = ll_set1(pk[0][j]);
                        if (rows == 1) {
                            const ptrdiff_t off = vbase + j * D + 16 * i;
                            b0 = ll_fma(p, ll_kv_load(v_cache, off, kv_bf16), b0);
                            b1 = ll_fma(p, ll_kv_load(v_cache, off + 16, kv_bf16), b1);
                            b2 = ll_fma(p, ll_kv_load(v_cache, off + 32, kv_bf16), b2);
                            b3 = ll_fma(p, ll_kv_load(v_cache, off + 48, kv_bf16), b3);
                        } else {
                            const float *vj = Vf + j * D + 16 * i;
                            b0 = ll_fma(p, ll_load(vj), b0);
                            b1 = ll_fma(p, ll_load(vj + 16), b1);
                            b2 = ll_fma(p, ll_load(vj + 32), b2);
                            b3 = ll_fma(p, ll_load(vj + 48), b3);
                        }
                    }
                    ll_store(a1 + 16 * i, b0); ll_store(a1 + 16 * i + 16, b1);
                    ll_store(a1 + 16 * i + 32, b2); ll_store(a1 + 16 * i + 48, b3);
                }
                for (; i < nv; i++) {
                    ll_vf32 b = ll_mul(ll_load(a1 + 16 * i), cv);
                    for (ptrdiff_t j = j0; j < nj; j++)
                        b = ll_fma(ll_set1(pk[0][j]), rows == 1 ? ll_kv_load(v_cache, vbase + j * D + 16 * i, kv_bf16)
                                                                : ll_load(Vf + j * D + 16 * i), b);
                    ll_store(a1 + 16 * i, b);
                }
                continue;
            }
            /* acc[r] = acc[r] * corr + p @ V for the four rows at once: each Vf load feeds 4 FMAs */
            float *ar[4];
            for (int k = 0; k < 4; k++) ar[k] = acc + (r0 + (k < nr ? k : 0)) * D;
            for (ptrdiff_t i = 0; i < nv; i += 2) {
                const int two = i + 1 < nv;
                ll_vf32 a[4][2];
                for (int k = 0; k < 4; k++) {
                    a[k][0] = ll_mul(ll_load(ar[k] + 16 * i), ll_set1(corr[k]));
                    a[k][1] = two ? ll_mul(ll_load(ar[k] + 16 * i + 16), ll_set1(corr[k])) : ll_zero();
                }
                for (int j = 0; j < 16; j++) {
                    const ll_vf32 v0 = ll_load(Vf + j * D + 16 * i);
                    const ll_vf32 v1 = two ? ll_load(Vf + j * D + 16 * i + 16) : ll_zero();
                    for (int k = 0; k < 4; k++) {
                        const ll_vf32 p = ll_set1(pk[k][j]);
                        a[k][0] = ll_fma(p, v0, a[k][0]);
                        a[k][1] = ll_fma(p, v1, a[k][1]);
                    }
                }
                for (int k = 0; k < nr; k++) {   /* rows past nr alias row r0: never stored */
                    ll_store(ar[k] + 16 * i, a[k][0]);
                    if (two) ll_store(ar[k] + 16 * i + 16, a[k][1]);
                }
            }
        }
    }
    for (int qi = 0; qi < nq; qi++)
        for (int g = 0; g < group; g++) {
            const ptrdiff_t r = (ptrdiff_t)qi * group + g;
            const ll_vf32 inv = ll_set1(l[r] > 0.f ? 1.0f / l[r] : 0.f);
            float *o = out + qi * ldo + (h0 + g) * D;
            for (ptrdiff_t i = 0; i < nv; i++) ll_store(o + 16 * i, ll_mul(ll_load(acc + r * D + 16 * i), inv));
        }
}

#endif
