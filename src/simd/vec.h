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
 *      ll_i32_load_u8 (where LL_HAVE_I32_LOAD_U8: the x86 backends): 16 bytes widened to int32 lanes
 *      ll_i32_load_s8: 16 int8 values widened to int32 lanes; ll_i32_add ll_i32_mul (the low 32 bits)
 *      codebook lookups (qgemm.h's IQ types), on ll_vi32 lanes as integers and ll_vi8 bytes:
 *      ll_i32_set1 ll_i32_load ll_i32_store ll_i32_and ll_i32_or ll_i32_xor ll_i32_sub
 *      ll_i32_shl ll_i32_shr (logical) ll_f32_of_i32 (the lanes' bits as floats) ll_i8_and ll_i8_xor ll_i8_add ll_i8_sub (wrapping);
 *      ll_i32_le (each lane's 4 bytes read as a little-endian uint32) and its inverse ll_i8_of_i32,
 *      ll_i8_gather4 ll_i8_gather8 (table rows at byte offsets), ll_i8_signs, ll_i8_neg_where,
 *      ll_i32_lut256_u16 ll_i8_expand2 ll_i8_expand4 (codebook rows as 16-bit codes)
 *      (defaults below where a backend has no better one)
 *      where LL_HAVE_I8_BITS (AVX-512 with VBMI and BITALG; no default): ll_m64, one bit a byte;
 *      ll_i8_fields(a, ctl): byte j of each 8-byte word w of a = bits c .. c + 7 of w (c = byte j
 *      of ctl, counted round the word); ll_i8_bitmask(a, ctl): bit 8 q + j = bit (byte j of ctl,
 *      mod 64) of word q; ll_i8_lut64 (t[idx & 63]) ll_i8_lut128 (t[idx & 127]) ll_i8_lut256
 *      (t[idx]) byte tables; ll_i8_pick2(a, b, idx): byte idx & 63 of a, or of b where idx & 64;
 *      ll_i8_neg_mask(a, m): a with its bytes negated where m has their bit; ll_i8_blend(a, m, b):
 *      the bytes of b where m has their bit, else a's
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

/* LL_VEC_PLAIN: the plain-C backend (the generic variants), where every op is a 16-element loop.
 * Kernels keep their one-row form there where a 16-row vector form (and LL_UNROLL's unrolling)
 * would multiply the compiler's work for code no vector unit runs: qgemm.h's codebook decode
 * (LL_IQ_ONE_ROW below), whose 16-row form made the x86 generic module's link-time build run
 * past 40 minutes of CPU, and MXFP4's scales. Both forms give the same bits
 * (tests/kernels/test_qgemm.py). */
#ifdef LL_VEC_SCALAR_H
#define LL_VEC_PLAIN 1
#define LL_UNROLL(n)
#else
#define LL_PRAGMA_(x) _Pragma(#x)
#define LL_UNROLL(n) LL_PRAGMA_(GCC unroll n)
#endif
/* LL_IQ_ONE_ROW: qgemm.h's codebook types decoded a row at a time (ll_iq_decode32) rather than 16
 * rows at once. The 16-row form gathers table rows per lane; NEON and VXE have no such gathers
 * (vec.h's defaults go through memory), and there it tripled the aarch64 modules' build time. */
#if defined(LL_VEC_PLAIN) || defined(LL_VEC_NEON_H) || defined(LL_VEC_VXE_H)
#define LL_IQ_ONE_ROW 1
#endif

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

#ifndef LL_VEC_PLAIN   /* the codebook lookups of qgemm.h's 16-row decode */
/* Codebook lookups. ll_i32_le(a): lane r = bytes 4r..4r+3 of a as a little-endian uint32
 * (ll_i8_of_i32 the inverse); the default goes through memory, a little-endian backend casts. */
#ifndef LL_HAVE_I32_LE
LL_INLINE ll_vi32 ll_i32_le(ll_vi8 a) {
    uint8_t b[64]; int32_t v[16];
    ll_i8_store(b, a);
    for (int r = 0; r < 16; r++)
        v[r] = (int32_t)((uint32_t)b[4 * r] | ((uint32_t)b[4 * r + 1] << 8) | ((uint32_t)b[4 * r + 2] << 16)
                         | ((uint32_t)b[4 * r + 3] << 24));
    return ll_i32_load(v);
}
LL_INLINE ll_vi8 ll_i8_of_i32(ll_vi32 a) {
    uint8_t b[64]; int32_t v[16];
    ll_i32_store(v, a);
    for (int r = 0; r < 16; r++)
        for (int i = 0; i < 4; i++) b[4 * r + i] = (uint8_t)((uint32_t)v[r] >> (8 * i));
    return ll_i8_load(b);
}
#endif
/* ll_i8_gather4(base, off): lane r = the 4 bytes at base + off[r] (bytes, memory order);
 * ll_i8_gather8(base, off, lo, hi): the 8 bytes at base + off[r], the first 4 in lane r of lo and
 * the last 4 in lane r of hi (the bytes layout of qgemm.h: one 8-value table row per lane). */
#ifndef LL_HAVE_I8_GATHER
LL_INLINE ll_vi8 ll_i8_gather4(const void *base, ll_vi32 off) {
    int32_t o[16]; uint8_t b[64];
    ll_i32_store(o, off);
    for (int r = 0; r < 16; r++) memcpy(b + 4 * r, (const uint8_t *)base + o[r], 4);
    return ll_i8_load(b);
}
LL_INLINE void ll_i8_gather8(const void *base, ll_vi32 off, ll_vi8 *lo, ll_vi8 *hi) {
    int32_t o[16]; uint8_t b0[64], b1[64];
    ll_i32_store(o, off);
    for (int r = 0; r < 16; r++) {
        const uint8_t *p = (const uint8_t *)base + o[r];
        memcpy(b0 + 4 * r, p, 4);
        memcpy(b1 + 4 * r, p + 4, 4);
    }
    *lo = ll_i8_load(b0);
    *hi = ll_i8_load(b1);
}
#endif
/* ll_i8_signs(s, g): byte i of lane r = 0xff where bit 4 g + i of lane r of s is set, else 0
 * (g = 0..7: eight sign bits of each lane's 32 to bytes, four at a time). The default: the
 * nibble copied into each byte, one bit kept per byte, nonzero bytes to 0xff, all within bytes. */
#ifndef LL_HAVE_I8_SIGNS
LL_INLINE ll_vi8 ll_i8_signs(ll_vi32 s, int g) {
    ll_vi32 t = ll_i32_and(ll_i32_shr(s, 4 * g), ll_i32_set1(15));
    t = ll_i32_or(ll_i32_or(t, ll_i32_shl(t, 8)), ll_i32_or(ll_i32_shl(t, 16), ll_i32_shl(t, 24)));
    t = ll_i32_and(t, ll_i32_set1(0x08040201));                                      /* byte i: bit i */
    const ll_vi32 y = ll_i32_and(ll_i32_add(t, ll_i32_set1(0x7f7f7f7f)), ll_i32_set1((int32_t)0x80808080u)); /* bit 7 */
    t = ll_i32_or(ll_i32_sub(y, ll_i32_shr(y, 7)), y);                                /* 0x80 -> 0xff */
    return ll_i8_of_i32(t);
}
#endif
/* ll_i32_lut256_u16(idx, t): each 16-bit half of each lane (0..255) replaced by t[half] (a codebook
 * row's code, 256 entries); LL_HAVE_U16_LUT256 where it runs in registers. */
#ifndef LL_HAVE_U16_LUT256
LL_INLINE ll_vi32 ll_i32_lut256_u16(ll_vi32 idx, const uint16_t *t) {
    int32_t v[16];
    ll_i32_store(v, idx);
    for (int r = 0; r < 16; r++) {
        const uint32_t u = (uint32_t)v[r];
        v[r] = (int32_t)((uint32_t)t[u & 255] | ((uint32_t)t[(u >> 16) & 255] << 16));
    }
    return ll_i32_load(v);
}
/* codes to bytes: ll_i8_expand2(c, b, lut): byte i of lane r = lut[k << 2 (i & 1)], k = bits
 * 8 b + 2 i, 8 b + 2 i + 1 of lane r (a lut holding level k at k and 4 k); ll_i8_expand4(c, h,
 * lut): byte i of lane r = lut[nibble (0, 2, 1, 3)[i] of the 16-bit half h of lane r] */
LL_INLINE ll_vi8 ll_i8_expand2(ll_vi32 c, int b, const int8_t *lut) {
    const ll_vi32 t = ll_i32_and(ll_i32_shr(c, 8 * b), ll_i32_set1(255));
    const ll_vi32 v = ll_i32_or(ll_i32_or(ll_i32_and(t, ll_i32_set1(3)), ll_i32_and(ll_i32_shl(t, 8), ll_i32_set1(0xc00))),
                                ll_i32_or(ll_i32_and(ll_i32_shl(t, 12), ll_i32_set1(0x30000)),
                                          ll_i32_and(ll_i32_shl(t, 20), ll_i32_set1(0x0c000000))));
    return ll_i8_lut16(ll_i8_of_i32(v), lut);
}
LL_INLINE ll_vi8 ll_i8_expand4(ll_vi32 c, int h, const int8_t *lut) {
    const ll_vi32 t = ll_i32_and(ll_i32_shr(c, 16 * h), ll_i32_set1(0xffff));
    const ll_vi32 v = ll_i32_or(ll_i32_or(ll_i32_and(t, ll_i32_set1(15)), ll_i32_and(t, ll_i32_set1(0xf00))),
                                ll_i32_or(ll_i32_and(ll_i32_shl(t, 12), ll_i32_set1(0xf0000)), ll_i32_shl(ll_i32_shr(t, 12), 24)));
    return ll_i8_lut16(ll_i8_of_i32(v), lut);
}
#endif
/* a with its bytes negated where m is 0xff (m bytes 0 or 0xff) */
LL_INLINE ll_vi8 ll_i8_neg_where(ll_vi8 a, ll_vi8 m) { return ll_i8_sub(ll_i8_xor(a, m), m); }
#endif

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
