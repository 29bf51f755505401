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
#include "moe.h"   /* ll_dot_f32, ll_axpy_f32 */
LL_HOT_BEGIN

/* Floats of scratch ll_mla_attention needs for up to `heads` heads of rows of Dk values. */
static inline ptrdiff_t ll_mla_scratch(ptrdiff_t heads, ptrdiff_t dk) { return 2 * heads + dk + 16; }

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

/* out[h][0..r) for heads h0..h1 of one query token: q [H][Dk] its absorbed query rows, out
 * [H][r] its latent outputs (only heads h0..h1 written); keys at positions first..last of the
 * sequence whose blocks are block_table; bf16: the cache holds bf16 bits, else fp32. Heads go
 * four at a time over each key's row (read once per four heads). */
static inline void ll_mla_attention(const float *q, ptrdiff_t dk, ptrdiff_t r, int h0, int h1, const void *cache,
                                    int bf16, const int32_t *block_table, ptrdiff_t block_size, ptrdiff_t first,
                                    ptrdiff_t last, float scale, float *out, float *scratch) {
    const int nh = h1 - h0;
    float *m = scratch, *l = m + nh, *row = l + nh;
    for (int h = 0; h < nh; h++) {
        m[h] = -INFINITY;
        l[h] = 0.f;
        memset(out + (ptrdiff_t)(h0 + h) * r, 0, (size_t)r * sizeof(float));
    }
    for (ptrdiff_t j = first; j <= last; j++) {
        const ptrdiff_t at = ((ptrdiff_t)block_table[j / block_size] * block_size + j % block_size) * dk;
        const float *c;
        if (bf16) {
            const uint16_t *src = (const uint16_t *)cache + at;
            for (ptrdiff_t d = 0; d < dk; d++) row[d] = ll_bf16_to_f32(src[d]);
            c = row;
        } else {
            c = (const float *)cache + at;
        }
        for (int h = 0; h < nh; h += 4) {
            const int nk = nh - h < 4 ? nh - h : 4;
            const float *qk[4];
            float s[4];
            for (int k = 0; k < 4; k++) qk[k] = q + (ptrdiff_t)(h0 + h + (k < nk ? k : 0)) * dk;
            ll_mla_dot4(qk, c, dk, s);
            for (int k = 0; k < nk; k++) {
                float *acc = out + (ptrdiff_t)(h0 + h + k) * r;
                const float sk = s[k] * scale;
                if (sk > m[h + k]) {   /* a new max: what was summed so far shrinks by e^(m - s) */
                    const float corr = m[h + k] == -INFINITY ? 0.f : expf(m[h + k] - sk);
                    if (l[h + k] > 0.f) {
                        l[h + k] *= corr;
                        for (ptrdiff_t d = 0; d < r; d++) acc[d] *= corr;
                    }
                    m[h + k] = sk;
                }
                const float p = expf(sk - m[h + k]);
                l[h + k] += p;
                ll_axpy_f32(p, c, acc, r);
            }
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
