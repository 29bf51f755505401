/* Multi-head latent attention (DeepSeek-V2/V3) over the compressed cache, in the absorbed
 * form, for one query token and a range of its heads, on one thread.
 *
 * The cache of one layer holds, per token, one row of Dk = r + dr values: the latent c
 * (kv_a_proj's first r outputs after kv_a_layernorm) then the shared RoPE key k_pe (rotated),
 * and nothing else. Within a block of B tokens the rows lie one after another, row-major:
 * element d of key row j of block b at (b B + j) Dk + d, fp32 or bf16 bits. A key never
 * becomes per-head K/V: the query arrives absorbed, q_h = [W_UK,h^T q_nope,h, q_pe,h] (Dk
 * values), so q_h . row_j = q_nope,h . k_nope,h,j + q_pe,h . k_pe,j; the output stays latent,
 * out_h = sum_j p_hj c_j (r values), and W_UV,h is applied to it afterwards (forward.pxi's
 * _mla_block: both per head, on the activations). Online softmax per head, the running sum
 * rescaled when the max grows.
 */
#ifndef LL_MLA_H
#define LL_MLA_H
#include "../simd/vec.h"
LL_HOT_BEGIN

/* Keys per tile: their scores for every head first, then one softmax update per head and
 * tile, and each head's latent output accumulated over the tile's rows in registers (the
 * output row is read and written once per tile, not once per key). */
#define LL_MLA_TILE 16

/* Floats of scratch ll_mla_attention needs for up to `heads` heads of rows of Dk values. */
static inline ptrdiff_t ll_mla_scratch(ptrdiff_t heads, ptrdiff_t dk) {
    return 2 * heads + heads * LL_MLA_TILE + LL_MLA_TILE * dk + 16;
}

/* s[k] = q_k . c over dk values for four query rows q_k (one load of c serves the four; four
 * independent accumulator chains). */
static inline void ll_mla_dot4(const float *const q[4], const float *c, ptrdiff_t dk, float s[4]) {
    ll_vf32 a0 = ll_zero(), a1 = ll_zero(), a2 = ll_zero(), a3 = ll_zero();
    ptrdiff_t d = 0;
    for (; d + LL_VF32_LANES <= dk; d += LL_VF32_LANES) {
        const ll_vf32 x = ll_load(c + d);
        a0 = ll_fma(ll_load(q[0] + d), x, a0);
        a1 = ll_fma(ll_load(q[1] + d), x, a1);
        a2 = ll_fma(ll_load(q[2] + d), x, a2);
        a3 = ll_fma(ll_load(q[3] + d), x, a3);
    }
    s[0] = ll_hsum(a0); s[1] = ll_hsum(a1); s[2] = ll_hsum(a2); s[3] = ll_hsum(a3);
    for (; d < dk; d++)
        for (int k = 0; k < 4; k++) s[k] += q[k][d] * c[d];
}

/* acc[0..r) += sum over t < nt of p[t] c[t][0..r), the accumulators in registers across the rows */
static inline void ll_mla_accumulate(float *acc, const float *const *c, const float *p, int nt, ptrdiff_t r) {
    ptrdiff_t d = 0;
    for (; d + 4 * LL_VF32_LANES <= r; d += 4 * LL_VF32_LANES) {
        ll_vf32 a0 = ll_load(acc + d), a1 = ll_load(acc + d + LL_VF32_LANES), a2 = ll_load(acc + d + 2 * LL_VF32_LANES),
                a3 = ll_load(acc + d + 3 * LL_VF32_LANES);
        for (int t = 0; t < nt; t++) {
            const ll_vf32 pv = ll_set1(p[t]);
            const float *ct = c[t] + d;
            a0 = ll_fma(pv, ll_load(ct), a0);
            a1 = ll_fma(pv, ll_load(ct + LL_VF32_LANES), a1);
            a2 = ll_fma(pv, ll_load(ct + 2 * LL_VF32_LANES), a2);
            a3 = ll_fma(pv, ll_load(ct + 3 * LL_VF32_LANES), a3);
        }
        ll_store(acc + d, a0); ll_store(acc + d + LL_VF32_LANES, a1);
        ll_store(acc + d + 2 * LL_VF32_LANES, a2); ll_store(acc + d + 3 * LL_VF32_LANES, a3);
    }
    for (; d + LL_VF32_LANES <= r; d += LL_VF32_LANES) {
        ll_vf32 a = ll_load(acc + d);
        for (int t = 0; t < nt; t++) a = ll_fma(ll_set1(p[t]), ll_load(c[t] + d), a);
        ll_store(acc + d, a);
    }
    for (; d < r; d++)
        for (int t = 0; t < nt; t++) acc[d] += p[t] * c[t][d];
}

/* out[h][0..r) for heads h0..h1 of one query token: q [H][Dk] its absorbed query rows, out
 * [H][r] its latent outputs (only heads h0..h1 written); keys at positions first..last of the
 * sequence whose blocks are block_table; bf16: the cache holds bf16 bits, else fp32. Keys go
 * LL_MLA_TILE at a time (bf16 rows widened once per tile), heads four at a time over each
 * key's row (read once per four heads). Online softmax per head and tile, the running sum
 * rescaled when the tile raises the max. */
static inline void ll_mla_attention(const float *q, ptrdiff_t dk, ptrdiff_t r, int h0, int h1, const void *cache,
                                    int bf16, const int32_t *block_table, ptrdiff_t block_size, ptrdiff_t first,
                                    ptrdiff_t last, float scale, float *out, float *scratch) {
    const int nh = h1 - h0;
    float *m = scratch, *l = m + nh, *s = l + nh, *rows = s + (ptrdiff_t)nh * LL_MLA_TILE;
    for (int h = 0; h < nh; h++) {
        m[h] = -INFINITY;
        l[h] = 0.f;
        memset(out + (ptrdiff_t)(h0 + h) * r, 0, (size_t)r * sizeof(float));
    }
    for (ptrdiff_t j0 = first; j0 <= last; j0 += LL_MLA_TILE) {
        const int nt = (int)(last - j0 + 1 < LL_MLA_TILE ? last - j0 + 1 : LL_MLA_TILE);
        const float *c[LL_MLA_TILE];
        for (int t = 0; t < nt; t++) {
            const ptrdiff_t j = j0 + t;
            const ptrdiff_t at = ((ptrdiff_t)block_table[j / block_size] * block_size + j % block_size) * dk;
            if (bf16) {
                const uint16_t *src = (const uint16_t *)cache + at;
                float *row = rows + (ptrdiff_t)t * dk;
                ptrdiff_t d = 0;
                for (; d + LL_VF32_LANES <= dk; d += LL_VF32_LANES) ll_store(row + d, ll_load_bf16(src + d));
                for (; d < dk; d++) row[d] = ll_bf16_to_f32(src[d]);
                c[t] = row;
            } else {
                c[t] = (const float *)cache + at;
            }
        }
        for (int h = 0; h < nh; h += 4) {
            const int nk = nh - h < 4 ? nh - h : 4;
            const float *qk[4];
            for (int k = 0; k < 4; k++) qk[k] = q + (ptrdiff_t)(h0 + h + (k < nk ? k : 0)) * dk;
            for (int t = 0; t < nt; t++) {
                float s4[4];
                ll_mla_dot4(qk, c[t], dk, s4);
                for (int k = 0; k < nk; k++) s[(ptrdiff_t)(h + k) * LL_MLA_TILE + t] = s4[k] * scale;
            }
        }
        for (int h = 0; h < nh; h++) {
            float *sh = s + (ptrdiff_t)h * LL_MLA_TILE, *acc = out + (ptrdiff_t)(h0 + h) * r;
            float mx = m[h];
            for (int t = 0; t < nt; t++) mx = sh[t] > mx ? sh[t] : mx;
            if (mx > m[h]) {   /* a new max: what was summed so far shrinks by e^(m - mx) */
                if (l[h] > 0.f) {
                    const float corr = expf(m[h] - mx);
                    l[h] *= corr;
                    for (ptrdiff_t d = 0; d < r; d++) acc[d] *= corr;
                }
                m[h] = mx;
            }
            for (int t = 0; t < nt; t++) {
                sh[t] = expf(sh[t] - mx);
                l[h] += sh[t];
            }
            ll_mla_accumulate(acc, c, sh, nt, r);
        }
    }
    for (int h = 0; h < nh; h++) {
        float *acc = out + (ptrdiff_t)(h0 + h) * r;
        const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
        for (ptrdiff_t d = 0; d < r; d++) acc[d] *= inv;
    }
}

/* One token's cache row (Dk fp32 values) at `slot`, as fp32 or bf16 bits. */
static inline void ll_mla_write_row(const float *src, void *cache, int bf16, ptrdiff_t slot, ptrdiff_t dk) {
    if (bf16) {
        uint16_t *dst = (uint16_t *)cache + slot * dk;
        for (ptrdiff_t d = 0; d < dk; d++) dst[d] = ll_f32_to_bf16(src[d]);
    } else {
        memcpy((float *)cache + slot * dk, src, (size_t)dk * sizeof(float));
    }
}
LL_HOT_END
#endif
