/* The vector API every kernel is written on: ll_vf32 is always 16 float lanes, whatever
 * the ISA (one zmm, two ymm, four NEON q registers, or a plain array), so kernels and the
 * packed weight layout (16-row panels) are the same everywhere.
 *
 * Exactly one backend is included, chosen by the compiler flags of this build variant:
 *   vec_avx512.h (AVX-512F/BW/VL/DQ, + BF16 dot products when __AVX512BF16__)
 *   vec_avx2.h   (AVX2 + FMA + F16C)
 *   vec_scalar.h (plain C; also the spec of every op)
 * A NEON or s390x VXE backend is a new vec_<isa>.h with the same ops.
 *
 * Ops: ll_zero ll_set1 ll_load ll_store ll_add ll_sub ll_mul ll_div ll_fma ll_max ll_hsum ll_hmax
 *      ll_exp ll_load_bf16 ll_load_f16 ll_load_bf16_even ll_load_bf16_odd
 *      ll_dot2_bf16 ll_store_bf16 ll_store_bf16_pairs (below, on top of the backend)
 *      ll_load_s8 ll_load_u8 ll_load_e4m3 (x 2^-8) ll_load_e5m2: 16 bytes widened to floats
 * Scalars: ll_bf16_to_f32 ll_f32_to_bf16 (round to nearest even) ll_f16_to_f32 ll_f32_to_f16
 *          ll_f32_to_e4m3 ll_f32_to_e5m2 (nearest even, saturating)
 */
#ifndef LL_VEC_H
#define LL_VEC_H
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <math.h>

#define LL_VF32_LANES 16
#define LL_INLINE static inline __attribute__((always_inline))

LL_INLINE float ll_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
LL_INLINE uint16_t ll_f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* to nearest even */
    return (uint16_t)(u >> 16);
}

/* IEEE half, round to nearest even (load-time quantizers' scales; not on a hot path). */
LL_INLINE uint16_t ll_f32_to_f16(float f) {
    uint32_t x; memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u)); /* inf, NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);             /* rounds past 65504: inf */
    if (ax < 0x38800000u) {                                                /* below 2^-14: subnormal */
        float a; memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));  /* units of 2^-24, exact scaling */
    }
    uint32_t r = ax - 0x38000000u;                                         /* exponent bias 127 -> 15 */
    r += 0x0fffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

/* fp8 (OCP): e4m3 "fn" (bias 7, max 448, no infinities, 0x7f NaN) and e5m2 (bias 15, max
 * 57344), round to nearest even; finite values beyond the largest saturate to it (the KV
 * cache writer scales rows into range, so only rounding can step past it). */
LL_INLINE uint8_t ll_f32_to_e4m3(float f) {
    uint32_t x; memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu);                   /* NaN */
    if (ax >= 0x43e00000u) return (uint8_t)(sign | 0x7eu);                  /* >= 448: saturate */
    if (ax < 0x3c800000u) {                                                 /* below 2^-6: subnormal */
        float a; memcpy(&a, &ax, 4);
        return (uint8_t)(sign | (uint32_t)nearbyintf(a * 512.0f));         /* units of 2^-9 (8 -> 2^-6) */
    }
    uint32_t r = ax - 0x3c000000u;                                          /* exponent bias 127 -> 7 */
    r += 0x7ffffu + ((r >> 20) & 1u);
    return (uint8_t)(sign | (r >> 20));
}
LL_INLINE uint8_t ll_f32_to_e5m2(float f) {
    uint32_t x; memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu);                   /* NaN */
    if (ax >= 0x47600000u) return (uint8_t)(sign | 0x7bu);                  /* >= 57344: saturate */
    if (ax < 0x38800000u) {                                                 /* below 2^-14: subnormal */
        float a; memcpy(&a, &ax, 4);
        return (uint8_t)(sign | (uint32_t)nearbyintf(a * 65536.0f));       /* units of 2^-16 */
    }
    uint32_t r = ax - 0x38000000u;                                          /* exponent bias 127 -> 15 */
    r += 0xfffffu + ((r >> 21) & 1u);
    return (uint8_t)(sign | (r >> 21));
}

#if defined(__AVX512F__)
#include "vec_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__)
#include "vec_avx2.h"
#else
#include "vec_scalar.h"
#endif

/* bf16 pairs: a uint32 holds two bf16, the first in its low half; 16 pairs are 32 uint16.
 * ll_dot2_bf16(acc, pair, p) = acc + first(pair) * p[0, 2, .., 30] + second(pair) * p[1, 3, .., 31]
 * (one vdpbf16ps where the CPU has it); ll_store_bf16 rounds 16 lanes to bf16, nearest even;
 * ll_store_bf16_pairs(p, a, b) rounds a into p[0, 2, .., 30] and b into p[1, 3, .., 31]. */
#ifdef LL_HAVE_BF16_DOT
LL_INLINE ll_vf32 ll_dot2_bf16(ll_vf32 acc, uint32_t pair, const uint16_t *p) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)pair), (__m512bh)_mm512_loadu_si512(p));
}
LL_INLINE void ll_store_bf16(uint16_t *p, ll_vf32 a) {
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(a));
}
LL_INLINE void ll_store_bf16_pairs(uint16_t *p, ll_vf32 a, ll_vf32 b) {
    const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(a));
    const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(b));
    _mm512_storeu_si512(p, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
}
#else
LL_INLINE ll_vf32 ll_dot2_bf16(ll_vf32 acc, uint32_t pair, const uint16_t *p) {
    acc = ll_fma(ll_set1(ll_bf16_to_f32((uint16_t)(pair & 0xffffu))), ll_load_bf16_even(p), acc);
    return ll_fma(ll_set1(ll_bf16_to_f32((uint16_t)(pair >> 16))), ll_load_bf16_odd(p), acc);
}
LL_INLINE void ll_store_bf16(uint16_t *p, ll_vf32 a) {
    float t[16];
    ll_store(t, a);
    for (int i = 0; i < 16; i++) p[i] = ll_f32_to_bf16(t[i]);
}
LL_INLINE void ll_store_bf16_pairs(uint16_t *p, ll_vf32 a, ll_vf32 b) {
    float ta[16], tb[16];
    ll_store(ta, a);
    ll_store(tb, b);
    for (int i = 0; i < 16; i++) { p[2 * i] = ll_f32_to_bf16(ta[i]); p[2 * i + 1] = ll_f32_to_bf16(tb[i]); }
}
#endif

#endif
