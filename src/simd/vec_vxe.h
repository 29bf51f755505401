/* s390x vector backend of vec.h (z14: vector facility + VXE for single precision; built with
 * -march=z14 -mzvector): a 16-lane vector is four 128-bit registers.
 *
 * s390x is big-endian. Element i of a vector is the i-th in memory order whatever its width,
 * so loads and stores of uint16 / float arrays need no care; what changes is any reading of
 * narrower elements through a wider word: a bf16 pair read as a uint32 holds its FIRST element
 * in the HIGH half here (ll_load_bf16_even / _odd below), and the weight files (little-endian)
 * are byte-swapped when loaded (src/kernels/quant.h). No f16 or int<->float vector conversions
 * before z15: those go through integer tricks or scalar code. */
#ifndef LL_VEC_VXE_H
#define LL_VEC_VXE_H
#include <vecintrin.h>
LL_HOT_BEGIN
#define LL_ISA_NAME "vxe"

typedef __vector float ll_v4f;
typedef __vector unsigned int ll_v4u;
typedef __vector signed int ll_v4i;
typedef __vector unsigned char ll_v16u8;
typedef __vector signed char ll_v16i8;
typedef __vector signed short ll_v8i16;
typedef __vector unsigned short ll_v8u16;

typedef struct { ll_v4f v[4]; } ll_vf32;

/* GEMM register tiles (gemm.h), sized to the 32 vector registers, a vector being four:
 * fp32 FMA 2 tokens x 2 panels = 16 accumulators + 8 weights (bf16: even and odd columns) + 1. */
#define LL_TT_FMA 2
#define LL_NP_FMA 2
#define LL_TT_DOT 2
#define LL_NP_DOT 2

#define LL_VXE_MAP1(r, e) do { for (int i_ = 0; i_ < 4; i_++) (r).v[i_] = (e); } while (0)
LL_INLINE ll_vf32 ll_zero(void) { ll_vf32 r; LL_VXE_MAP1(r, vec_splats(0.f)); return r; }
LL_INLINE ll_vf32 ll_set1(float x) { ll_vf32 r; LL_VXE_MAP1(r, vec_splats(x)); return r; }
LL_INLINE ll_vf32 ll_load(const float *p) { ll_vf32 r; LL_VXE_MAP1(r, vec_xl(0, p + 4 * i_)); return r; }
LL_INLINE void ll_store(float *p, ll_vf32 a) { for (int i = 0; i < 4; i++) vec_xst(a.v[i], 0, p + 4 * i); }
LL_INLINE ll_vf32 ll_add(ll_vf32 a, ll_vf32 b) { ll_vf32 r; LL_VXE_MAP1(r, a.v[i_] + b.v[i_]); return r; }
LL_INLINE ll_vf32 ll_sub(ll_vf32 a, ll_vf32 b) { ll_vf32 r; LL_VXE_MAP1(r, a.v[i_] - b.v[i_]); return r; }
LL_INLINE ll_vf32 ll_mul(ll_vf32 a, ll_vf32 b) { ll_vf32 r; LL_VXE_MAP1(r, a.v[i_] * b.v[i_]); return r; }
LL_INLINE ll_vf32 ll_div(ll_vf32 a, ll_vf32 b) { ll_vf32 r; LL_VXE_MAP1(r, a.v[i_] / b.v[i_]); return r; }
LL_INLINE ll_vf32 ll_max(ll_vf32 a, ll_vf32 b) { ll_vf32 r; LL_VXE_MAP1(r, vec_max(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vf32 ll_fma(ll_vf32 a, ll_vf32 b, ll_vf32 c) {
    ll_vf32 r; LL_VXE_MAP1(r, vec_madd(a.v[i_], b.v[i_], c.v[i_])); return r;
}
LL_INLINE float ll_hsum(ll_vf32 a) {   /* pairwise, like the other backends */
    const ll_v4f s = (a.v[0] + a.v[2]) + (a.v[1] + a.v[3]);
    return (s[0] + s[2]) + (s[1] + s[3]);
}
LL_INLINE float ll_hmax(ll_vf32 a) {
    const ll_v4f m = vec_max(vec_max(a.v[0], a.v[1]), vec_max(a.v[2], a.v[3]));
    const float x = m[0] > m[1] ? m[0] : m[1], y = m[2] > m[3] ? m[2] : m[3];
    return x > y ? x : y;
}
/* integer-valued floats |n| < 2^22 to int32: n + 1.5 * 2^23 holds n in its low mantissa bits */
LL_INLINE ll_v4i ll_vxe_f2i_small(ll_v4f n) {
    const ll_v4f magic = vec_splats(12582912.0f);
    return (ll_v4i)(n + magic) - (ll_v4i)magic;
}
/* int32 to float, rounded once (no vector conversion before z15): high and low 16 bits apart */
LL_INLINE ll_v4f ll_vxe_i2f(ll_v4i x) {
    const ll_v4f magic = vec_splats(12582912.0f);
    const ll_v4i hi = x >> 16, lo = x & vec_splats(0xffff);
    const ll_v4f fhi = (ll_v4f)(hi + (ll_v4i)magic) - magic, flo = (ll_v4f)(lo + (ll_v4i)magic) - magic;
    return vec_madd(fhi, vec_splats(65536.0f), flo);
}
LL_INLINE ll_v4f ll_exp4(ll_v4f x) {   /* same method as the AVX-512 ll_exp */
    x = vec_max(vec_min(x, vec_splats(88.3762626647949f)), vec_splats(-87.3365447505531f));
    const ll_v4f t = x * vec_splats(1.44269504088896341f);
    const ll_v4f n = vec_round(t);
    const ll_v4f f = t - n;
    ll_v4f p = vec_splats(1.535336188319500e-4f);
    p = vec_madd(p, f, vec_splats(1.339887440266574e-3f));
    p = vec_madd(p, f, vec_splats(9.618437357674640e-3f));
    p = vec_madd(p, f, vec_splats(5.550332471162809e-2f));
    p = vec_madd(p, f, vec_splats(2.402264791363012e-1f));
    p = vec_madd(p, f, vec_splats(6.931472028550421e-1f));
    p = vec_madd(p, f, vec_splats(1.0f));
    const ll_v4i e = (ll_vxe_f2i_small(n) + vec_splats(127)) << 23;
    return p * (ll_v4f)e;
}
LL_INLINE ll_vf32 ll_exp(ll_vf32 a) { ll_vf32 r; LL_VXE_MAP1(r, ll_exp4(a.v[i_])); return r; }

LL_INLINE float ll_f16_to_f32(uint16_t h) {   /* the plain-C spec (vec_scalar.h): no f16 unit */
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else {
            int e = -1; do { e++; man <<= 1; } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f; memcpy(&f, &u, 4); return f;
}
LL_INLINE ll_vf32 ll_load_bf16(const uint16_t *p) {
    ll_vf32 r;
    for (int i = 0; i < 2; i++) {
        const ll_v8u16 h = vec_xl(0, p + 8 * i);
        r.v[2 * i] = (ll_v4f)((ll_v4u)vec_unpackh(h) << 16);
        r.v[2 * i + 1] = (ll_v4f)((ll_v4u)vec_unpackl(h) << 16);
    }
    return r;
}
LL_INLINE ll_vf32 ll_load_f16(const uint16_t *p) {
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = ll_f16_to_f32(p[i]);
    return ll_load(t);
}
/* p holds 16 pairs (32 bf16): even -> the first of each pair, odd -> the second. A pair read
 * as a big-endian word has its first element in the high half. */
LL_INLINE ll_vf32 ll_load_bf16_even(const uint16_t *p) {
    ll_vf32 r; LL_VXE_MAP1(r, (ll_v4f)((ll_v4u)vec_xl(0, (const unsigned int *)p + 4 * i_) & vec_splats(0xffff0000u))); return r;
}
LL_INLINE ll_vf32 ll_load_bf16_odd(const uint16_t *p) {
    ll_vf32 r; LL_VXE_MAP1(r, (ll_v4f)((ll_v4u)vec_xl(0, (const unsigned int *)p + 4 * i_) << 16)); return r;
}

/* int8 blocks: 64 bytes = 16 int32 lanes of 4 bytes, four registers (see vec_scalar.h). */
typedef struct { ll_v16u8 v[4]; } ll_vi8;
typedef struct { ll_v4i v[4]; } ll_vi32;
LL_INLINE ll_vi8 ll_i8_load(const void *p) { ll_vi8 r; LL_VXE_MAP1(r, vec_xl(0, (const unsigned char *)p + 16 * i_)); return r; }
LL_INLINE ll_vi8 ll_i8_bcast4(const void *p) {
    unsigned int v; memcpy(&v, p, 4); ll_vi8 r; LL_VXE_MAP1(r, (ll_v16u8)vec_splats(v)); return r;
}
LL_INLINE ll_vi8 ll_i8_lo4(ll_vi8 a) { ll_vi8 r; LL_VXE_MAP1(r, a.v[i_] & vec_splats((unsigned char)15)); return r; }
LL_INLINE ll_vi8 ll_i8_hi4(ll_vi8 a) { ll_vi8 r; LL_VXE_MAP1(r, a.v[i_] >> 4); return r; }
/* bits 2c..2c+1 of every byte moved to bits 4..5 (the high bits of a 6-bit value) */
LL_INLINE ll_vi8 ll_i8_hi2(ll_vi8 a, int c) {
    const ll_v16u8 sh = vec_splats((unsigned char)(2 * c));
    ll_vi8 r; LL_VXE_MAP1(r, ((a.v[i_] >> sh) & vec_splats((unsigned char)3)) << 4); return r;
}
/* bit g of every byte moved to bit 4 (the high bit of a 5-bit value) */
LL_INLINE ll_vi8 ll_i8_hi1(ll_vi8 a, int g) {
    const ll_v16u8 sh = vec_splats((unsigned char)g);
    ll_vi8 r; LL_VXE_MAP1(r, ((a.v[i_] >> sh) & vec_splats((unsigned char)1)) << 4); return r;
}
LL_INLINE ll_vi8 ll_i8_or(ll_vi8 a, ll_vi8 b) { ll_vi8 r; LL_VXE_MAP1(r, a.v[i_] | b.v[i_]); return r; }
/* bits pos..pos+width-1 of every byte moved to bits to..to+width-1 (vec_scalar.h) */
LL_INLINE ll_vi8 ll_i8_bits(ll_vi8 a, int pos, int width, int to) {
    const ll_v16u8 p = vec_splats((unsigned char)pos), t = vec_splats((unsigned char)to);
    const ll_v16u8 m = vec_splats((unsigned char)((1 << width) - 1));
    ll_vi8 r; LL_VXE_MAP1(r, ((a.v[i_] >> p) & m) << t); return r;
}
LL_INLINE void ll_i8_store(void *p, ll_vi8 a) { for (int i = 0; i < 4; i++) vec_xst(a.v[i], 0, (unsigned char *)p + 16 * i); }
/* table[a] for every byte a in 0..15: a byte permutation indexes memory order */
LL_INLINE ll_vi8 ll_i8_lut16(ll_vi8 a, const int8_t *table) {
    const ll_v16u8 t = vec_xl(0, (const unsigned char *)table);
    ll_vi8 r; LL_VXE_MAP1(r, vec_perm(t, t, a.v[i_])); return r;
}
LL_INLINE void ll_i8_opaque(ll_vi8 *a) { __asm__("" : "+v"(a->v[0]), "+v"(a->v[1]), "+v"(a->v[2]), "+v"(a->v[3])); }
/* codebook lookups (vec.h): integer lanes and bytes (the gathers, and the little-endian
 * reading of a lane's bytes, are vec.h's) */
LL_INLINE ll_vi32 ll_i32_set1(int32_t v) { ll_vi32 r; LL_VXE_MAP1(r, vec_splats((int)v)); return r; }
LL_INLINE ll_vi32 ll_i32_load(const int32_t *p) { ll_vi32 r; LL_VXE_MAP1(r, vec_xl(0, (const int *)p + 4 * i_)); return r; }
LL_INLINE void ll_i32_store(int32_t *p, ll_vi32 a) { for (int i = 0; i < 4; i++) vec_xst(a.v[i], 0, (int *)p + 4 * i); }
LL_INLINE ll_vi32 ll_i32_and(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_VXE_MAP1(r, a.v[i_] & b.v[i_]); return r; }
LL_INLINE ll_vi32 ll_i32_or(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_VXE_MAP1(r, a.v[i_] | b.v[i_]); return r; }
LL_INLINE ll_vi32 ll_i32_xor(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_VXE_MAP1(r, a.v[i_] ^ b.v[i_]); return r; }
LL_INLINE ll_vi32 ll_i32_sub(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_VXE_MAP1(r, a.v[i_] - b.v[i_]); return r; }
LL_INLINE ll_vi32 ll_i32_mul(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_VXE_MAP1(r, a.v[i_] * b.v[i_]); return r; }
LL_INLINE ll_vi32 ll_i32_load_s8(const int8_t *p) {
    const ll_v16i8 b = vec_xl(0, p);
    const ll_v8i16 lo = vec_unpackh(b), hi = vec_unpackl(b);
    ll_vi32 r;
    r.v[0] = vec_unpackh(lo); r.v[1] = vec_unpackl(lo); r.v[2] = vec_unpackh(hi); r.v[3] = vec_unpackl(hi);
    return r;
}
LL_INLINE ll_vi32 ll_i32_shl(ll_vi32 a, int n) {
    const ll_v4u sh = vec_splats((unsigned int)n);
    ll_vi32 r; LL_VXE_MAP1(r, (ll_v4i)((ll_v4u)a.v[i_] << sh)); return r;
}
LL_INLINE ll_vi32 ll_i32_shr(ll_vi32 a, int n) {
    const ll_v4u sh = vec_splats((unsigned int)n);
    ll_vi32 r; LL_VXE_MAP1(r, (ll_v4i)((ll_v4u)a.v[i_] >> sh)); return r;
}
LL_INLINE ll_vf32 ll_f32_of_i32(ll_vi32 a) { ll_vf32 r; LL_VXE_MAP1(r, (ll_v4f)a.v[i_]); return r; }
LL_INLINE ll_vi8 ll_i8_and(ll_vi8 a, ll_vi8 b) { ll_vi8 r; LL_VXE_MAP1(r, a.v[i_] & b.v[i_]); return r; }
LL_INLINE ll_vi8 ll_i8_xor(ll_vi8 a, ll_vi8 b) { ll_vi8 r; LL_VXE_MAP1(r, a.v[i_] ^ b.v[i_]); return r; }
LL_INLINE ll_vi8 ll_i8_add(ll_vi8 a, ll_vi8 b) { ll_vi8 r; LL_VXE_MAP1(r, a.v[i_] + b.v[i_]); return r; }
LL_INLINE ll_vi8 ll_i8_sub(ll_vi8 a, ll_vi8 b) { ll_vi8 r; LL_VXE_MAP1(r, a.v[i_] - b.v[i_]); return r; }
LL_INLINE ll_vi32 ll_i32_zero(void) { ll_vi32 r; LL_VXE_MAP1(r, vec_splats(0)); return r; }
LL_INLINE ll_vi32 ll_i32_add(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_VXE_MAP1(r, a.v[i_] + b.v[i_]); return r; }
LL_INLINE ll_vf32 ll_i32_to_f32(ll_vi32 a) { ll_vf32 r; LL_VXE_MAP1(r, ll_vxe_i2f(a.v[i_])); return r; }

/* Sums of 4 signed byte products per int32 lane: even and odd byte products (int16; |a| <= 128,
 * |b| <= 127 keeps each pair sum in range), then even and odd halfword sums into int32. */
LL_INLINE ll_v4i ll_vxe_dot4(ll_v4i acc, ll_v16i8 a, ll_v16i8 b) {
    const ll_v8i16 s = vec_mule(a, b) + vec_mulo(a, b);
    const ll_v8i16 one = vec_splats((short)1);
    return acc + vec_mule(s, one) + vec_mulo(s, one);
}
#define LL_HAVE_I8DOT 1
#define LL_I8DOT_NAME "vxe"
/* acc + sum over 4 bytes of u (unsigned, < 128: the kernels' 4-, 5- and 6-bit values) x s (signed) */
LL_INLINE ll_vi32 ll_dpbusd(ll_vi32 acc, ll_vi8 u, ll_vi8 s) {
    ll_vi32 r; LL_VXE_MAP1(r, ll_vxe_dot4(acc.v[i_], (ll_v16i8)u.v[i_], (ll_v16i8)s.v[i_])); return r;
}
/* acc + sum over 4 bytes of a x b, both signed (a >= -128, b > -128) */
LL_INLINE ll_vi32 ll_dpbssd(ll_vi32 acc, ll_vi8 a, ll_vi8 b) {
    ll_vi32 r; LL_VXE_MAP1(r, ll_vxe_dot4(acc.v[i_], (ll_v16i8)a.v[i_], (ll_v16i8)b.v[i_])); return r;
}
LL_INLINE ll_vf32 ll_load_u8(const uint8_t *p) {
    const ll_v16u8 b = vec_xl(0, p);
    const ll_v8u16 lo = vec_unpackh(b), hi = vec_unpackl(b);
    ll_vf32 r;
    r.v[0] = ll_vxe_i2f((ll_v4i)vec_unpackh(lo)); r.v[1] = ll_vxe_i2f((ll_v4i)vec_unpackl(lo));
    r.v[2] = ll_vxe_i2f((ll_v4i)vec_unpackh(hi)); r.v[3] = ll_vxe_i2f((ll_v4i)vec_unpackl(hi));
    return r;
}
LL_INLINE ll_vf32 ll_load_s8(const int8_t *p) {
    const ll_v16i8 b = vec_xl(0, p);
    const ll_v8i16 lo = vec_unpackh(b), hi = vec_unpackl(b);
    ll_vf32 r;
    r.v[0] = ll_vxe_i2f(vec_unpackh(lo)); r.v[1] = ll_vxe_i2f(vec_unpackl(lo));
    r.v[2] = ll_vxe_i2f(vec_unpackh(hi)); r.v[3] = ll_vxe_i2f(vec_unpackl(hi));
    return r;
}
/* 16 fp8 values as floats through the half conversion (spec: vec_scalar.h) */
LL_INLINE ll_vf32 ll_load_e5m2(const uint8_t *p) {
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = ll_f16_to_f32((uint16_t)(p[i] << 8));
    return ll_load(t);
}
LL_INLINE ll_vf32 ll_load_e4m3(const uint8_t *p) {   /* value x 2^-8 */
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = ll_f16_to_f32((uint16_t)(((p[i] & 0x80) << 8) | ((p[i] & 0x7f) << 7)));
    return ll_load(t);
}
#undef LL_VXE_MAP1
LL_HOT_END
#endif
