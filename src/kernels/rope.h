/* Rotary position embedding, rotate-half ("neox") form as in HF transformers, on one head:
 *   x[i], x[i + D/2]  ->  x[i] cos_i - x[i + D/2] sin_i,  x[i + D/2] cos_i + x[i] sin_i
 * cos/sin come from a table row [D/2] built at load (scaling and yarn factors included).
 * GGUF llama weights are un-permuted at load, so interleaved rope is never needed here. */
#ifndef LL_ROPE_H
#define LL_ROPE_H
#include "../simd/vec.h"
LL_HOT_BEGIN

static inline void ll_rope_neox_f32(float *x, const float *cos, const float *sin, ptrdiff_t head_dim) {
    const ptrdiff_t half = head_dim / 2;
    ptrdiff_t i = 0;
    for (; i + 16 <= half; i += 16) {
        ll_vf32 a = ll_load(x + i), b = ll_load(x + half + i), c = ll_load(cos + i), s = ll_load(sin + i);
        ll_store(x + i, ll_sub(ll_mul(a, c), ll_mul(b, s)));
        ll_store(x + half + i, ll_fma(a, s, ll_mul(b, c)));
    }
    for (; i < half; i++) {
        float a = x[i], b = x[half + i];
        x[i] = a * cos[i] - b * sin[i];
        x[half + i] = b * cos[i] + a * sin[i];
    }
}
LL_HOT_END
#endif
