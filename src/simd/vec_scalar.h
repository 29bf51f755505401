/* Plain-C backend of vec.h: the specification of every op, and the generic variant.
 * With -O3 the compiler vectorises these 16-wide loops for the baseline ISA. */
#ifndef LL_VEC_SCALAR_H
#define LL_VEC_SCALAR_H
LL_HOT_BEGIN
#define LL_ISA_NAME "scalar"

typedef struct { float v[16]; } ll_vf32;

/* GEMM register tiles (gemm.h): whatever the compiler makes of 16-float arrays */
#define LL_TT_FMA 4
#define LL_NP_FMA 4
#define LL_TT_DOT 4
#define LL_NP_DOT 4
#define LL_I8DOT_NAME "scalar"

LL_INLINE ll_vf32 ll_zero(void) { ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = 0.f; return r; }
LL_INLINE ll_vf32 ll_set1(float x) { ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = x; return r; }
LL_INLINE ll_vf32 ll_load(const float *p) { ll_vf32 r; memcpy(r.v, p, sizeof r.v); return r; }
LL_INLINE void ll_store(float *p, ll_vf32 a) { memcpy(p, a.v, sizeof a.v); }
#define LL_BINOP(name, expr) \
    LL_INLINE ll_vf32 name(ll_vf32 a, ll_vf32 b) { ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = (expr); return r; }
LL_BINOP(ll_add, a.v[i] + b.v[i])
LL_BINOP(ll_sub, a.v[i] - b.v[i])
LL_BINOP(ll_mul, a.v[i] * b.v[i])
LL_BINOP(ll_div, a.v[i] / b.v[i])
LL_BINOP(ll_max, a.v[i] > b.v[i] ? a.v[i] : b.v[i])
#undef LL_BINOP
LL_INLINE ll_vf32 ll_fma(ll_vf32 a, ll_vf32 b, ll_vf32 c) {
    ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = a.v[i] * b.v[i] + c.v[i]; return r;
}
LL_INLINE float ll_hsum(ll_vf32 a) {  /* pairwise, like the SIMD backends */
    for (int w = 8; w >= 1; w /= 2) for (int i = 0; i < w; i++) a.v[i] += a.v[i + w];
    return a.v[0];
}
LL_INLINE float ll_hmax(ll_vf32 a) {
    float m = a.v[0]; for (int i = 1; i < 16; i++) m = a.v[i] > m ? a.v[i] : m; return m;
}
LL_INLINE ll_vf32 ll_exp(ll_vf32 a) { ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = expf(a.v[i]); return r; }

LL_INLINE float ll_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else {  /* subnormal: normalise */
            int e = -1; do { e++; man <<= 1; } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f; memcpy(&f, &u, 4); return f;
}
LL_INLINE ll_vf32 ll_load_bf16(const uint16_t *p) {
    ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = ll_bf16_to_f32(p[i]); return r;
}
LL_INLINE ll_vf32 ll_load_f16(const uint16_t *p) {
    ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = ll_f16_to_f32(p[i]); return r;
}
/* p holds 16 pairs (32 bf16): even -> the first of each pair, odd -> the second. */
LL_INLINE ll_vf32 ll_load_bf16_even(const uint16_t *p) {
    ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = ll_bf16_to_f32(p[2 * i]); return r;
}
LL_INLINE ll_vf32 ll_load_bf16_odd(const uint16_t *p) {
    ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = ll_bf16_to_f32(p[2 * i + 1]); return r;
}
/* int8 blocks (quantized weights x int8 activations): ll_vi8 is 64 bytes, byte 4i + j in lane
 * i; ll_vi32 the 16 int32 lane sums. */
typedef struct { uint8_t b[64]; } ll_vi8;
typedef struct { int32_t v[16]; } ll_vi32;
LL_INLINE ll_vi8 ll_i8_load(const void *p) { ll_vi8 r; memcpy(r.b, p, 64); return r; }
LL_INLINE ll_vi8 ll_i8_bcast4(const void *p) { ll_vi8 r; for (int i = 0; i < 16; i++) memcpy(r.b + 4 * i, p, 4); return r; }
LL_INLINE ll_vi8 ll_i8_lo4(ll_vi8 a) { for (int i = 0; i < 64; i++) a.b[i] &= 15; return a; }
LL_INLINE ll_vi8 ll_i8_hi4(ll_vi8 a) { for (int i = 0; i < 64; i++) a.b[i] >>= 4; return a; }
/* bits 2c..2c+1 of every byte moved to bits 4..5 (the high bits of a 6-bit value) */
LL_INLINE ll_vi8 ll_i8_hi2(ll_vi8 a, int c) {
    for (int i = 0; i < 64; i++) a.b[i] = (uint8_t)(((a.b[i] >> (2 * c)) & 3) << 4);
    return a;
}
/* bit g of every byte moved to bit 4 (the high bit of a 5-bit value) */
LL_INLINE ll_vi8 ll_i8_hi1(ll_vi8 a, int g) {
    for (int i = 0; i < 64; i++) a.b[i] = (uint8_t)(((a.b[i] >> g) & 1) << 4);
    return a;
}
LL_INLINE ll_vi8 ll_i8_or(ll_vi8 a, ll_vi8 b) { for (int i = 0; i < 64; i++) a.b[i] |= b.b[i]; return a; }
/* bits pos..pos+width-1 of every byte moved to bits to..to+width-1, the others cleared
 * (to + width <= 8; constants after inlining: 2- and 3-bit quants, their high-bit planes) */
LL_INLINE ll_vi8 ll_i8_bits(ll_vi8 a, int pos, int width, int to) {
    for (int i = 0; i < 64; i++) a.b[i] = (uint8_t)(((a.b[i] >> pos) & ((1 << width) - 1)) << to);
    return a;
}
LL_INLINE void ll_i8_store(void *p, ll_vi8 a) { memcpy(p, a.b, 64); }
/* table[a] for every byte a in 0..15 (a 16-entry lookup: non-linear 4-bit codebooks) */
LL_INLINE ll_vi8 ll_i8_lut16(ll_vi8 a, const int8_t *table) {
    for (int i = 0; i < 64; i++) a.b[i] = (uint8_t)table[a.b[i] & 15];
    return a;
}
LL_INLINE ll_vi32 ll_i32_zero(void) { ll_vi32 r; for (int i = 0; i < 16; i++) r.v[i] = 0; return r; }
LL_INLINE ll_vi32 ll_i32_add(ll_vi32 a, ll_vi32 b) { for (int i = 0; i < 16; i++) a.v[i] += b.v[i]; return a; }
LL_INLINE ll_vf32 ll_i32_to_f32(ll_vi32 a) { ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = (float)a.v[i]; return r; }
/* codebook lookups (vec.h): integer lanes and bytes (the gathers, and the little-endian
 * reading of a lane's bytes, are vec.h's) */
LL_INLINE ll_vi32 ll_i32_set1(int32_t v) { ll_vi32 r; for (int i = 0; i < 16; i++) r.v[i] = v; return r; }
LL_INLINE ll_vi32 ll_i32_load(const int32_t *p) { ll_vi32 r; memcpy(r.v, p, 64); return r; }
LL_INLINE void ll_i32_store(int32_t *p, ll_vi32 a) { memcpy(p, a.v, 64); }
LL_INLINE ll_vi32 ll_i32_and(ll_vi32 a, ll_vi32 b) { for (int i = 0; i < 16; i++) a.v[i] &= b.v[i]; return a; }
LL_INLINE ll_vi32 ll_i32_or(ll_vi32 a, ll_vi32 b) { for (int i = 0; i < 16; i++) a.v[i] |= b.v[i]; return a; }
LL_INLINE ll_vi32 ll_i32_xor(ll_vi32 a, ll_vi32 b) { for (int i = 0; i < 16; i++) a.v[i] ^= b.v[i]; return a; }
LL_INLINE ll_vi32 ll_i32_sub(ll_vi32 a, ll_vi32 b) {
    for (int i = 0; i < 16; i++) a.v[i] = (int32_t)((uint32_t)a.v[i] - (uint32_t)b.v[i]);
    return a;
}
/* the low 32 bits of each lane's product (wrapping) */
LL_INLINE ll_vi32 ll_i32_mul(ll_vi32 a, ll_vi32 b) {
    for (int i = 0; i < 16; i++) a.v[i] = (int32_t)((uint32_t)a.v[i] * (uint32_t)b.v[i]);
    return a;
}
/* 16 int8 values widened to int32 lanes */
LL_INLINE ll_vi32 ll_i32_load_s8(const int8_t *p) { ll_vi32 r; for (int i = 0; i < 16; i++) r.v[i] = p[i]; return r; }
/* logical shifts of each lane (0 <= n < 32) */
LL_INLINE ll_vi32 ll_i32_shl(ll_vi32 a, int n) { for (int i = 0; i < 16; i++) a.v[i] = (int32_t)((uint32_t)a.v[i] << n); return a; }
LL_INLINE ll_vi32 ll_i32_shr(ll_vi32 a, int n) { for (int i = 0; i < 16; i++) a.v[i] = (int32_t)((uint32_t)a.v[i] >> n); return a; }
LL_INLINE ll_vf32 ll_f32_of_i32(ll_vi32 a) { ll_vf32 r; memcpy(r.v, a.v, 64); return r; }
LL_INLINE ll_vi8 ll_i8_and(ll_vi8 a, ll_vi8 b) { for (int i = 0; i < 64; i++) a.b[i] &= b.b[i]; return a; }
LL_INLINE ll_vi8 ll_i8_xor(ll_vi8 a, ll_vi8 b) { for (int i = 0; i < 64; i++) a.b[i] ^= b.b[i]; return a; }
LL_INLINE ll_vi8 ll_i8_add(ll_vi8 a, ll_vi8 b) { for (int i = 0; i < 64; i++) a.b[i] = (uint8_t)(a.b[i] + b.b[i]); return a; }
LL_INLINE ll_vi8 ll_i8_sub(ll_vi8 a, ll_vi8 b) { for (int i = 0; i < 64; i++) a.b[i] = (uint8_t)(a.b[i] - b.b[i]); return a; }
/* acc + sum over 4 bytes of u (unsigned) x s (signed), per lane */
LL_INLINE ll_vi32 ll_dpbusd(ll_vi32 acc, ll_vi8 u, ll_vi8 s) {
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 4; j++) acc.v[i] += (int32_t)u.b[4 * i + j] * (int32_t)(int8_t)s.b[4 * i + j];
    return acc;
}
/* acc + sum over 4 bytes of a x b, both signed */
LL_INLINE ll_vi32 ll_dpbssd(ll_vi32 acc, ll_vi8 a, ll_vi8 b) {
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 4; j++) acc.v[i] += (int32_t)(int8_t)a.b[4 * i + j] * (int32_t)(int8_t)b.b[4 * i + j];
    return acc;
}
LL_INLINE void ll_i8_opaque(ll_vi8 *a) { __asm__("" : "+m"(*a)); }
LL_INLINE ll_vf32 ll_load_u8(const uint8_t *p) { ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = (float)p[i]; return r; }
LL_INLINE ll_vf32 ll_load_s8(const int8_t *p) { ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = (float)p[i]; return r; }
/* 16 fp8 values widened to float lanes. e5m2 is the top byte of an IEEE half; e4m3 (the "fn"
 * variant: no infinities) placed as half bits sign << 8 | (bits & 0x7f) << 7 reads as its value
 * times 2^-8, subnormals included: ll_load_e4m3 returns that, callers fold the 256 into a scale. */
LL_INLINE ll_vf32 ll_load_e5m2(const uint8_t *p) {
    ll_vf32 r; for (int i = 0; i < 16; i++) r.v[i] = ll_f16_to_f32((uint16_t)(p[i] << 8)); return r;
}
LL_INLINE ll_vf32 ll_load_e4m3(const uint8_t *p) {
    ll_vf32 r;
    for (int i = 0; i < 16; i++) r.v[i] = ll_f16_to_f32((uint16_t)(((p[i] & 0x80) << 8) | ((p[i] & 0x7f) << 7)));
    return r;
}
LL_HOT_END
#endif
