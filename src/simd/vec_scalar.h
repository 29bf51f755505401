/* Plain-C backend of vec.h: the specification of every op, and the generic variant.
 * With -O3 the compiler vectorises these 16-wide loops for the baseline ISA. */
#ifndef LL_VEC_SCALAR_H
#define LL_VEC_SCALAR_H
#define LL_ISA_NAME "scalar"

typedef struct { float v[16]; } ll_vf32;

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
#endif
