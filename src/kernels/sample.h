/* The sampler's scalar helpers (lite_llm/engine/_sampler.pyx owns the loops): a counter-based
 * uniform draw, a vectorisable exp, and order-preserving buckets of probabilities. Plain C on
 * purpose: the compiler vectorises ll_exp_shift_f32 for the baseline ISA of the one build. */
#ifndef LL_SAMPLE_H
#define LL_SAMPLE_H
#include <stddef.h>
#include <stdint.h>
#include "../simd/hot.h"
LL_HOT_BEGIN

/* splitmix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mixer. */
static inline uint64_t ll_splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
/* exp(x) for the sampler's x <= 0 (any x works): Cody-Waite reduction by ln 2 and Cephes'
   degree-6 polynomial, within 2 ulp of expf; 0 below -87 instead of denormals. Plain C
   that the compiler vectorises, unlike a libm call. */
static inline float ll_exp_f32(float x) {
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float y = xc * 1.44269504088896341f;
    int32_t n = (int32_t)(y + (y >= 0.0f ? 0.5f : -0.5f));
    float fn = (float)n;
    float r = xc - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float q = 1.9875691500e-4f;
    q = q * r + 1.3981999507e-3f;
    q = q * r + 8.3334519073e-3f;
    q = q * r + 4.1665795894e-2f;
    q = q * r + 1.6666665459e-1f;
    q = q * r + 5.0000001201e-1f;
    q = q * r * r + r + 1.0f;
    union { uint32_t u; float f; } scale;
    scale.u = (uint32_t)(n + 127) << 23;
    return x < -87.0f ? 0.0f : q * scale.f;
}
/* x[i] = exp((x[i] - m) * inv_t) over a row: the sampler's heaviest loop. */
static inline void ll_exp_shift_f32(float *x, ptrdiff_t n, float m, float inv_t) {
    for (ptrdiff_t i = 0; i < n; i++) x[i] = ll_exp_f32((x[i] - m) * inv_t);
}
/* Buckets of a value in [0, 1] by its top 12 bits (exponent + 3 mantissa bits): order-
   preserving, so a bucket's floor bounds every value in it from below. */
static inline int ll_bucket(float v) {
    union { float f; uint32_t u; } b; b.f = v; return (int)(b.u >> 20);
}
static inline float ll_bucket_floor(int bucket) {
    union { uint32_t u; float f; } b; b.u = (uint32_t)bucket << 20; return b.f;
}
/* u in [0, 1) with 53 random bits, a pure function of (seed, step). */
static inline double ll_uniform(uint64_t seed, uint64_t step) {
    uint64_t h = ll_splitmix64(seed ^ ll_splitmix64(step ^ 0xD1B54A32D192ED03ULL));
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}
LL_HOT_END
#endif
