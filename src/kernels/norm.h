/* RMSNorm and LayerNorm of one row, on one thread. */
#ifndef LL_NORM_H
#define LL_NORM_H
#include "../simd/vec.h"
LL_HOT_BEGIN

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; out may alias x. */
static inline void ll_rmsnorm_f32(const float *x, const float *w, float *out, ptrdiff_t n, float eps) {
    ll_vf32 acc = ll_zero();
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) { ll_vf32 v = ll_load(x + i); acc = ll_fma(v, v, acc); }
    float ss = ll_hsum(acc);
    for (; i < n; i++) ss += x[i] * x[i];
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    const ll_vf32 s = ll_set1(scale);
    for (i = 0; i + 16 <= n; i += 16) ll_store(out + i, ll_mul(ll_mul(ll_load(x + i), s), ll_load(w + i)));
    for (; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* out[i] = (x[i] - mean) / sqrt(var + eps) * w[i] + b[i]; out may alias x. */
static inline void ll_layernorm_f32(const float *x, const float *w, const float *b, float *out,
                                    ptrdiff_t n, float eps) {
    ll_vf32 acc = ll_zero();
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) acc = ll_add(acc, ll_load(x + i));
    float sum = ll_hsum(acc);
    for (; i < n; i++) sum += x[i];
    const float mean = sum / (float)n;
    const ll_vf32 m = ll_set1(mean);
    acc = ll_zero();
    for (i = 0; i + 16 <= n; i += 16) { ll_vf32 d = ll_sub(ll_load(x + i), m); acc = ll_fma(d, d, acc); }
    float var = ll_hsum(acc);
    for (; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    const float scale = 1.0f / sqrtf(var / (float)n + eps);
    const ll_vf32 s = ll_set1(scale);
    for (i = 0; i + 16 <= n; i += 16)
        ll_store(out + i, ll_fma(ll_mul(ll_sub(ll_load(x + i), m), s), ll_load(w + i), ll_load(b + i)));
    for (; i < n; i++) out[i] = (x[i] - mean) * scale * w[i] + b[i];
}
LL_HOT_END
#endif
