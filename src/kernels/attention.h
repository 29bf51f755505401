/* Paged attention for one query row of one head, on one thread: online softmax over the
 * KV blocks of its sequence. The same kernel serves decode (one query per sequence) and
 * prefill chunks (each query attends to the cached context plus the chunk up to itself).
 *
 * KV cache of one layer, K and V alike: [num_blocks][num_kv_heads][block_size][head_dim],
 * fp32 or bf16 (kv_bf16). Position p of a sequence lives in block block_table[p / B] at
 * row p % B. head_dim must be a multiple of 16.
 */
#ifndef LL_ATTENTION_H
#define LL_ATTENTION_H
#include "../simd/vec.h"

#define LL_MAX_HEAD_DIM 512

LL_INLINE ll_vf32 ll_kv_load(const void *base, ptrdiff_t off, int kv_bf16) {
    return kv_bf16 ? ll_load_bf16((const uint16_t *)base + off) : ll_load((const float *)base + off);
}

/* out [D] = softmax(q . K[first..last] * scale) @ V[first..last]; scores: scratch [B]. */
static inline void ll_paged_attention_row(const float *q, float *out, const void *k_cache,
                                          const void *v_cache, int kv_bf16, const int32_t *block_table,
                                          ptrdiff_t block_size, ptrdiff_t kv_head, ptrdiff_t num_kv_heads,
                                          ptrdiff_t head_dim, ptrdiff_t first, ptrdiff_t last, float scale,
                                          float *scores) {
    const ptrdiff_t nv = head_dim / 16;
    ll_vf32 qv[LL_MAX_HEAD_DIM / 16], acc[LL_MAX_HEAD_DIM / 16];
    const ll_vf32 sv = ll_set1(scale);
    for (ptrdiff_t i = 0; i < nv; i++) { qv[i] = ll_mul(ll_load(q + 16 * i), sv); acc[i] = ll_zero(); }
    float m = -INFINITY, l = 0.f;
    const ptrdiff_t head_stride = block_size * head_dim, block_stride = num_kv_heads * head_stride;
    for (ptrdiff_t blk = first / block_size; blk <= last / block_size; blk++) {
        const ptrdiff_t j0 = blk * block_size > first ? blk * block_size : first;
        const ptrdiff_t j1 = (blk + 1) * block_size - 1 < last ? (blk + 1) * block_size - 1 : last;
        const ptrdiff_t base = (ptrdiff_t)block_table[blk] * block_stride + kv_head * head_stride;
        const ptrdiff_t nj = j1 - j0 + 1;
        float bmax = -INFINITY;
        for (ptrdiff_t j = 0; j < nj; j++) {
            const ptrdiff_t off = base + (j0 - blk * block_size + j) * head_dim;
            ll_vf32 d = ll_mul(qv[0], ll_kv_load(k_cache, off, kv_bf16));
            for (ptrdiff_t i = 1; i < nv; i++) d = ll_fma(qv[i], ll_kv_load(k_cache, off + 16 * i, kv_bf16), d);
            float s = ll_hsum(d);
            scores[j] = s;
            bmax = s > bmax ? s : bmax;
        }
        const float m_new = m > bmax ? m : bmax;
        const float corr = expf(m - m_new);  /* 0 on the first block (m = -inf) */
        m = m_new;
        /* p_j = exp(s_j - m): vectorised over the block */
        const ll_vf32 mv = ll_set1(m);
        ll_vf32 lsum = ll_zero();
        ptrdiff_t j = 0;
        for (; j + 16 <= nj; j += 16) {
            ll_vf32 p = ll_exp(ll_sub(ll_load(scores + j), mv));
            ll_store(scores + j, p);
            lsum = ll_add(lsum, p);
        }
        float bsum = ll_hsum(lsum);
        for (; j < nj; j++) { scores[j] = expf(scores[j] - m); bsum += scores[j]; }
        l = l * corr + bsum;
        const ll_vf32 cv = ll_set1(corr);
        for (ptrdiff_t i = 0; i < nv; i++) acc[i] = ll_mul(acc[i], cv);
        for (j = 0; j < nj; j++) {
            const ptrdiff_t off = base + (j0 - blk * block_size + j) * head_dim;
            const ll_vf32 pv = ll_set1(scores[j]);
            for (ptrdiff_t i = 0; i < nv; i++) acc[i] = ll_fma(pv, ll_kv_load(v_cache, off + 16 * i, kv_bf16), acc[i]);
        }
    }
    const ll_vf32 inv = ll_set1(l > 0.f ? 1.0f / l : 0.f);
    for (ptrdiff_t i = 0; i < nv; i++) ll_store(out + 16 * i, ll_mul(acc[i], inv));
}

/* Write one token's K or V head rows [num_kv_heads][D] (contiguous, fp32) at `slot`. */
static inline void ll_write_kv_row(const float *src, void *cache, int kv_bf16, ptrdiff_t slot,
                                   ptrdiff_t block_size, ptrdiff_t num_kv_heads, ptrdiff_t head_dim) {
    const ptrdiff_t blk = slot / block_size, row = slot % block_size;
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
#endif
