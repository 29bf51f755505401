/* The vector API every kernel is written on: ll_vf32 is always 16 float lanes, whatever
 * the ISA (one zmm, two ymm, four NEON q registers, or a plain array), so kernels and the
 * packed weight layout (16-row panels) are the same everywhere.
 *
 * Exactly one backend is included, chosen by the compiler flags of this build variant:
 *   vec_avx512.h (AVX-512F/BW/VL/DQ, + BF16 dot products when __AVX512BF16__)
 *   vec_avx2.h   (AVX2 + FMA + F16C)
 *   vec_neon.h   (aarch64 ASIMD; + sdot with dotprod, + bfdot/usdot with bf16 and i8mm)
 *   vec_vxe.h    (s390x z14 vector facility with VXE: -march=z14 -mzvector; big-endian)
 *   vec_scalar.h (plain C; also the spec of every op)
 * Intrinsics live in these headers only: kernels use the ll_ ops (tests/test_simd_isolation.py).
 *
 * Each backend also sets its GEMM register tiles (tokens x 16-row panels), sized to its
 * register file: LL_TT_FMA x LL_NP_FMA for the fp32-FMA tiles, LL_TT_DOT x LL_NP_DOT for the
 * bf16 dot-product tiles; LL_I8DOT_NAME names the instruction under ll_dpbusd.
 *
 * Ops: ll_zero ll_set1 ll_load ll_store ll_add ll_sub ll_mul ll_div ll_fma ll_max ll_hsum ll_hmax
 *      ll_exp ll_load_bf16 ll_load_f16 ll_load_bf16_even ll_load_bf16_odd
 *      ll_bcast_bf16x2 ll_load_bf16x2 ll_dot2_bf16 ll_dot2_bf16_at ll_store_bf16
 *      ll_store_bf16_pairs ll_fma_row (defaults below, on top of the backend, where it has no better one)
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
#include "hot.h"
LL_HOT_BEGIN

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

LL_HOT_END
#if defined(__AVX512F__)
#include "vec_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__)
#include "vec_avx2.h"
#elif defined(__aarch64__) && defined(__ARM_NEON) && !defined(LL_FORCE_SCALAR)
#include "vec_neon.h"
#elif defined(__s390x__) && defined(__VEC__) && defined(__ARCH__) && __ARCH__ >= 12 && !defined(LL_FORCE_SCALAR)
#include "vec_vxe.h"
#else
#include "vec_scalar.h"
#endif
LL_HOT_BEGIN

/* ---- defaults for ops a backend may implement natively --------------------------------- */

/* bf16 pairs. A pair is two bf16 in element order (the first at the lower address) whatever
 * the machine's byte order, so a pair is never read as one uint32; 16 pairs are 32 uint16.
 *   ll_bf16x2   one pair, broadcast to every lane        ll_bcast_bf16x2(const void *p)
 *   ll_vbf16x2  16 pairs, one per lane                    ll_load_bf16x2(const uint16_t *p)
 *   ll_dot2_bf16(acc, x, w): lane i of acc + first(x) * first(w_i) + second(x) * second(w_i)
 *   (vdpbf16ps / bfdot where the backend has them: LL_HAVE_BF16_DOT; two FMAs elsewhere).
 * ll_store_bf16 rounds 16 lanes to bf16, nearest even (ll_f32_to_bf16 is its spec);
 * ll_store_bf16_pairs(p, a, b) rounds a into p[0, 2, .., 30] and b into p[1, 3, .., 31]. */
#ifndef LL_HAVE_BF16_DOT
typedef struct { ll_vf32 first, second; } ll_bf16x2;
typedef struct { ll_vf32 even, odd; } ll_vbf16x2;
LL_INLINE ll_bf16x2 ll_bcast_bf16x2(const void *p) {
    uint16_t h[2]; memcpy(h, p, 4);
    ll_bf16x2 r; r.first = ll_set1(ll_bf16_to_f32(h[0])); r.second = ll_set1(ll_bf16_to_f32(h[1])); return r;
}
LL_INLINE ll_vbf16x2 ll_load_bf16x2(const uint16_t *p) {
    ll_vbf16x2 r; r.even = ll_load_bf16_even(p); r.odd = ll_load_bf16_odd(p); return r;
}
LL_INLINE ll_vf32 ll_dot2_bf16(ll_vf32 acc, ll_bf16x2 x, ll_vbf16x2 w) {
    return ll_fma(x.second, w.odd, ll_fma(x.first, w.even, acc));
}
#endif
#ifndef LL_HAVE_BF16_STORE
LL_INLINE void ll_store_bf16(uint16_t *p, ll_vf32 a) {
    float t[16];
    ll_store(t, a);
    for (int i = 0; i < 16; i++) p[i] = ll_f32_to_bf16(t[i]);
}
#endif
#ifndef LL_HAVE_BF16_STORE_PAIRS
LL_INLINE void ll_store_bf16_pairs(uint16_t *p, ll_vf32 a, ll_vf32 b) {
    uint16_t ta[16], tb[16];
    ll_store_bf16(ta, a);
    ll_store_bf16(tb, b);
    for (int i = 0; i < 16; i++) { p[2 * i] = ta[i]; p[2 * i + 1] = tb[i]; }
}
#endif
/* acc + (x at pair pointer) . (16 pairs at p): attention's form, straight from memory */
LL_INLINE ll_vf32 ll_dot2_bf16_at(ll_vf32 acc, const void *pair, const uint16_t *p) {
    return ll_dot2_bf16(acc, ll_bcast_bf16x2(pair), ll_load_bf16x2(p));
}

/* acc + x[row t][off] * w for row t (0..7) of a GEMM token tile: rows 0-3 at b, b + s, b + 2 s,
 * b + s3 (bytes; s3 = 3 s), rows 4-7 the same from b4 (a backend may fold the broadcast into
 * its FMA: LL_HAVE_FMA_ROW). */
#ifndef LL_HAVE_FMA_ROW
LL_INLINE ll_vf32 ll_fma_row(ll_vf32 acc, ll_vf32 w, const float *b, const float *b4, ptrdiff_t s, ptrdiff_t s3,
                             const int t, const int off) {
    (void)s3;
    const char *row = (const char *)(t < 4 ? b : b4) + (t & 3) * s;
    return ll_fma(ll_set1(((const float *)row)[off]), w, acc);
}
#endif

LL_HOT_END
#endif
