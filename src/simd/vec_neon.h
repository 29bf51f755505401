/* NEON (aarch64 ASIMD) backend of vec.h: a 16-lane vector is four q registers.
 * Variants (lite_llm/_kernels/variants.py): `neon` (ARMv8.0), `neon_dotprod` (+ sdot: int8 dot
 * products, __ARM_FEATURE_DOTPROD), `neon_bf16_i8mm` (+ bfdot for bf16 pairs, usdot for
 * unsigned x signed int8: __ARM_FEATURE_BF16_VECTOR_ARITHMETIC, __ARM_FEATURE_MATMUL_INT8).
 * aarch64 Linux is little-endian: memory order is lane order. */
#ifndef LL_VEC_NEON_H
#define LL_VEC_NEON_H
#include <arm_neon.h>
LL_HOT_BEGIN

#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC) && defined(__ARM_FEATURE_MATMUL_INT8)
#define LL_ISA_NAME "neon_bf16_i8mm"
#define LL_HAVE_BF16_DOT 1
#elif defined(__ARM_FEATURE_DOTPROD)
#define LL_ISA_NAME "neon_dotprod"
#else
#define LL_ISA_NAME "neon"
#endif

typedef struct { float32x4_t v[4]; } ll_vf32;

/* GEMM register tiles (gemm.h), sized to the 32 q registers, a vector being four of them (the
 * same budget as AVX2's 16 ymm of two): fp32 FMA 2 tokens x 2 panels = 16 accumulators + 8
 * weight registers (bf16: even and odd columns) + 1 broadcast; bfdot 2 x 2 likewise. */
#define LL_TT_FMA 2
#define LL_NP_FMA 2
#define LL_TT_DOT 2
#define LL_NP_DOT 2

#define LL_NEON_MAP1(r, e) do { for (int i_ = 0; i_ < 4; i_++) (r).v[i_] = (e); } while (0)
LL_INLINE ll_vf32 ll_zero(void) { ll_vf32 r; LL_NEON_MAP1(r, vdupq_n_f32(0.f)); return r; }
LL_INLINE ll_vf32 ll_set1(float x) { ll_vf32 r; LL_NEON_MAP1(r, vdupq_n_f32(x)); return r; }
LL_INLINE ll_vf32 ll_load(const float *p) { ll_vf32 r; LL_NEON_MAP1(r, vld1q_f32(p + 4 * i_)); return r; }
LL_INLINE void ll_store(float *p, ll_vf32 a) { for (int i = 0; i < 4; i++) vst1q_f32(p + 4 * i, a.v[i]); }
LL_INLINE ll_vf32 ll_add(ll_vf32 a, ll_vf32 b) { ll_vf32 r; LL_NEON_MAP1(r, vaddq_f32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vf32 ll_sub(ll_vf32 a, ll_vf32 b) { ll_vf32 r; LL_NEON_MAP1(r, vsubq_f32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vf32 ll_mul(ll_vf32 a, ll_vf32 b) { ll_vf32 r; LL_NEON_MAP1(r, vmulq_f32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vf32 ll_div(ll_vf32 a, ll_vf32 b) { ll_vf32 r; LL_NEON_MAP1(r, vdivq_f32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vf32 ll_max(ll_vf32 a, ll_vf32 b) { ll_vf32 r; LL_NEON_MAP1(r, vmaxq_f32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vf32 ll_fma(ll_vf32 a, ll_vf32 b, ll_vf32 c) {
    ll_vf32 r; LL_NEON_MAP1(r, vfmaq_f32(c.v[i_], a.v[i_], b.v[i_])); return r;
}
LL_INLINE float ll_hsum(ll_vf32 a) {   /* pairwise, like the other backends */
    return vaddvq_f32(vaddq_f32(vaddq_f32(a.v[0], a.v[2]), vaddq_f32(a.v[1], a.v[3])));
}
LL_INLINE float ll_hmax(ll_vf32 a) {
    return vmaxvq_f32(vmaxq_f32(vmaxq_f32(a.v[0], a.v[1]), vmaxq_f32(a.v[2], a.v[3])));
}
LL_INLINE float32x4_t ll_exp4(float32x4_t x) {   /* same method as the AVX-512 ll_exp */
    x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(88.3762626647949f)), vdupq_n_f32(-87.3365447505531f));
    const float32x4_t t = vmulq_f32(x, vdupq_n_f32(1.44269504088896341f));
    const float32x4_t n = vrndnq_f32(t);
    const float32x4_t f = vsubq_f32(t, n);
    float32x4_t p = vdupq_n_f32(1.535336188319500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.339887440266574e-3f), p, f);
    p = vfmaq_f32(vdupq_n_f32(9.618437357674640e-3f), p, f);
    p = vfmaq_f32(vdupq_n_f32(5.550332471162809e-2f), p, f);
    p = vfmaq_f32(vdupq_n_f32(2.402264791363012e-1f), p, f);
    p = vfmaq_f32(vdupq_n_f32(6.931472028550421e-1f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}
LL_INLINE ll_vf32 ll_exp(ll_vf32 a) { ll_vf32 r; LL_NEON_MAP1(r, ll_exp4(a.v[i_])); return r; }

LL_INLINE float ll_f16_to_f32(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
LL_INLINE ll_vf32 ll_load_bf16(const uint16_t *p) {
    ll_vf32 r; LL_NEON_MAP1(r, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * i_), 16))); return r;
}
LL_INLINE ll_vf32 ll_load_f16(const uint16_t *p) {
    ll_vf32 r; LL_NEON_MAP1(r, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i_)))); return r;
}
/* p holds 16 pairs (32 bf16): even -> the first of each pair, odd -> the second. */
LL_INLINE ll_vf32 ll_load_bf16_even(const uint16_t *p) {
    ll_vf32 r; LL_NEON_MAP1(r, vreinterpretq_f32_u32(vshlq_n_u32(vld1q_u32((const uint32_t *)p + 4 * i_), 16))); return r;
}
LL_INLINE ll_vf32 ll_load_bf16_odd(const uint16_t *p) {
    ll_vf32 r;
    LL_NEON_MAP1(r, vreinterpretq_f32_u32(vandq_u32(vld1q_u32((const uint32_t *)p + 4 * i_), vdupq_n_u32(0xffff0000u))));
    return r;
}
/* 16 lanes rounded to bf16, nearest even, NaNs kept quiet: ll_f32_to_bf16 in integer lanes
 * (exact for subnormals too, which a converting instruction may flush) */
#define LL_HAVE_BF16_STORE 1
LL_INLINE void ll_store_bf16(uint16_t *p, ll_vf32 a) {
    for (int i = 0; i < 4; i++) {
        const uint32x4_t u = vreinterpretq_u32_f32(a.v[i]);
        const uint32x4_t rounded = vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fffu), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1))));
        const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffffu)), vdupq_n_u32(0x7f800000u));
        const uint32x4_t r = vbslq_u32(nan, vorrq_u32(u, vdupq_n_u32(0x400000u)), rounded);
        vst1_u16(p + 4 * i, vshrn_n_u32(r, 16));
    }
}

/* int8 blocks: 64 bytes = 16 int32 lanes of 4 bytes, four q registers (see vec_scalar.h). */
typedef struct { uint8x16_t v[4]; } ll_vi8;
typedef struct { int32x4_t v[4]; } ll_vi32;
LL_INLINE ll_vi8 ll_i8_load(const void *p) { ll_vi8 r; LL_NEON_MAP1(r, vld1q_u8((const uint8_t *)p + 16 * i_)); return r; }
LL_INLINE ll_vi8 ll_i8_bcast4(const void *p) {
    uint32_t v; memcpy(&v, p, 4); ll_vi8 r; LL_NEON_MAP1(r, vreinterpretq_u8_u32(vdupq_n_u32(v))); return r;
}
LL_INLINE ll_vi8 ll_i8_lo4(ll_vi8 a) { ll_vi8 r; LL_NEON_MAP1(r, vandq_u8(a.v[i_], vdupq_n_u8(15))); return r; }
LL_INLINE ll_vi8 ll_i8_hi4(ll_vi8 a) { ll_vi8 r; LL_NEON_MAP1(r, vshrq_n_u8(a.v[i_], 4)); return r; }
/* bits 2c..2c+1 of every byte moved to bits 4..5 (the high bits of a 6-bit value) */
LL_INLINE ll_vi8 ll_i8_hi2(ll_vi8 a, int c) {
    const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * c));
    ll_vi8 r; LL_NEON_MAP1(r, vshlq_n_u8(vandq_u8(vshlq_u8(a.v[i_], sh), vdupq_n_u8(3)), 4)); return r;
}
/* bit g of every byte moved to bit 4 (the high bit of a 5-bit value) */
LL_INLINE ll_vi8 ll_i8_hi1(ll_vi8 a, int g) {
    const int8x16_t sh = vdupq_n_s8((int8_t)(-g));
    ll_vi8 r; LL_NEON_MAP1(r, vshlq_n_u8(vandq_u8(vshlq_u8(a.v[i_], sh), vdupq_n_u8(1)), 4)); return r;
}
LL_INLINE ll_vi8 ll_i8_or(ll_vi8 a, ll_vi8 b) { ll_vi8 r; LL_NEON_MAP1(r, vorrq_u8(a.v[i_], b.v[i_])); return r; }
/* bits pos..pos+width-1 of every byte moved to bits to..to+width-1 (vec_scalar.h): a byte
 * shift (negative: right), then the mask */
LL_INLINE ll_vi8 ll_i8_bits(ll_vi8 a, int pos, int width, int to) {
    const int8x16_t sh = vdupq_n_s8((int8_t)(to - pos));
    const uint8x16_t m = vdupq_n_u8((uint8_t)(((1 << width) - 1) << to));
    ll_vi8 r; LL_NEON_MAP1(r, vandq_u8(vshlq_u8(a.v[i_], sh), m)); return r;
}
LL_INLINE void ll_i8_store(void *p, ll_vi8 a) { for (int i = 0; i < 4; i++) vst1q_u8((uint8_t *)p + 16 * i, a.v[i]); }
LL_INLINE ll_vi8 ll_i8_lut16(ll_vi8 a, const int8_t *table) {
    const uint8x16_t t = vld1q_u8((const uint8_t *)table);
    ll_vi8 r; LL_NEON_MAP1(r, vqtbl1q_u8(t, a.v[i_])); return r;
}
LL_INLINE void ll_i8_opaque(ll_vi8 *a) { __asm__("" : "+w"(a->v[0]), "+w"(a->v[1]), "+w"(a->v[2]), "+w"(a->v[3])); }
/* codebook lookups (vec.h): integer lanes and bytes (the gathers are vec.h's) */
LL_INLINE ll_vi32 ll_i32_set1(int32_t v) { ll_vi32 r; LL_NEON_MAP1(r, vdupq_n_s32(v)); return r; }
LL_INLINE ll_vi32 ll_i32_load(const int32_t *p) { ll_vi32 r; LL_NEON_MAP1(r, vld1q_s32(p + 4 * i_)); return r; }
LL_INLINE void ll_i32_store(int32_t *p, ll_vi32 a) { for (int i = 0; i < 4; i++) vst1q_s32(p + 4 * i, a.v[i]); }
LL_INLINE ll_vi32 ll_i32_and(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_NEON_MAP1(r, vandq_s32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vi32 ll_i32_or(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_NEON_MAP1(r, vorrq_s32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vi32 ll_i32_xor(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_NEON_MAP1(r, veorq_s32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vi32 ll_i32_sub(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_NEON_MAP1(r, vsubq_s32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vi32 ll_i32_mul(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_NEON_MAP1(r, vmulq_s32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vi32 ll_i32_load_s8(const int8_t *p) {
    const int8x16_t b = vld1q_s8(p);
    const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_high_s8(b);
    ll_vi32 r;
    r.v[0] = vmovl_s16(vget_low_s16(lo)); r.v[1] = vmovl_high_s16(lo);
    r.v[2] = vmovl_s16(vget_low_s16(hi)); r.v[3] = vmovl_high_s16(hi);
    return r;
}
LL_INLINE ll_vi32 ll_i32_shl(ll_vi32 a, int n) {
    const int32x4_t sh = vdupq_n_s32(n);
    ll_vi32 r; LL_NEON_MAP1(r, vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(a.v[i_]), sh))); return r;
}
LL_INLINE ll_vi32 ll_i32_shr(ll_vi32 a, int n) {
    const int32x4_t sh = vdupq_n_s32(-n);
    ll_vi32 r; LL_NEON_MAP1(r, vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s32(a.v[i_]), sh))); return r;
}
LL_INLINE ll_vi8 ll_i8_and(ll_vi8 a, ll_vi8 b) { ll_vi8 r; LL_NEON_MAP1(r, vandq_u8(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vi8 ll_i8_xor(ll_vi8 a, ll_vi8 b) { ll_vi8 r; LL_NEON_MAP1(r, veorq_u8(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vi8 ll_i8_add(ll_vi8 a, ll_vi8 b) { ll_vi8 r; LL_NEON_MAP1(r, vaddq_u8(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vi8 ll_i8_sub(ll_vi8 a, ll_vi8 b) { ll_vi8 r; LL_NEON_MAP1(r, vsubq_u8(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vf32 ll_f32_of_i32(ll_vi32 a) { ll_vf32 r; LL_NEON_MAP1(r, vreinterpretq_f32_s32(a.v[i_])); return r; }
#define LL_HAVE_I32_LE 1   /* little-endian: a lane's bytes are its int32 */
LL_INLINE ll_vi32 ll_i32_le(ll_vi8 a) { ll_vi32 r; LL_NEON_MAP1(r, vreinterpretq_s32_u8(a.v[i_])); return r; }
LL_INLINE ll_vi8 ll_i8_of_i32(ll_vi32 a) { ll_vi8 r; LL_NEON_MAP1(r, vreinterpretq_u8_s32(a.v[i_])); return r; }
LL_INLINE ll_vi32 ll_i32_zero(void) { ll_vi32 r; LL_NEON_MAP1(r, vdupq_n_s32(0)); return r; }
LL_INLINE ll_vi32 ll_i32_add(ll_vi32 a, ll_vi32 b) { ll_vi32 r; LL_NEON_MAP1(r, vaddq_s32(a.v[i_], b.v[i_])); return r; }
LL_INLINE ll_vf32 ll_i32_to_f32(ll_vi32 a) { ll_vf32 r; LL_NEON_MAP1(r, vcvtq_f32_s32(a.v[i_])); return r; }

/* Sums of 4 signed byte products per int32 lane: sdot, or widening multiplies and pairwise adds. */
LL_INLINE int32x4_t ll_sdot4(int32x4_t acc, int8x16_t a, int8x16_t b) {
#ifdef __ARM_FEATURE_DOTPROD
    return vdotq_s32(acc, a, b);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b)), hi = vmull_high_s8(a, b);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
#endif
}
#define LL_HAVE_I8DOT 1
#if defined(__ARM_FEATURE_MATMUL_INT8)
#define LL_I8DOT_NAME "usdot"
#elif defined(__ARM_FEATURE_DOTPROD)
#define LL_I8DOT_NAME "sdot"
#else
#define LL_I8DOT_NAME "smull"
#endif
/* acc + sum over 4 bytes of u (unsigned) x s (signed), per lane; without i8mm u < 128 (the
 * kernels' unsigned values are 4-, 5- and 6-bit), read as signed */
LL_INLINE ll_vi32 ll_dpbusd(ll_vi32 acc, ll_vi8 u, ll_vi8 s) {
    ll_vi32 r;
#ifdef __ARM_FEATURE_MATMUL_INT8
    LL_NEON_MAP1(r, vusdotq_s32(acc.v[i_], u.v[i_], vreinterpretq_s8_u8(s.v[i_])));
#else
    LL_NEON_MAP1(r, ll_sdot4(acc.v[i_], vreinterpretq_s8_u8(u.v[i_]), vreinterpretq_s8_u8(s.v[i_])));
#endif
    return r;
}
/* acc + sum over 4 bytes of a x b, both signed */
LL_INLINE ll_vi32 ll_dpbssd(ll_vi32 acc, ll_vi8 a, ll_vi8 b) {
    ll_vi32 r; LL_NEON_MAP1(r, ll_sdot4(acc.v[i_], vreinterpretq_s8_u8(a.v[i_]), vreinterpretq_s8_u8(b.v[i_]))); return r;
}
LL_INLINE ll_vf32 ll_load_u8(const uint8_t *p) {
    const uint8x16_t b = vld1q_u8(p);
    const uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_high_u8(b);
    ll_vf32 r;
    r.v[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))); r.v[1] = vcvtq_f32_u32(vmovl_high_u16(lo));
    r.v[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))); r.v[3] = vcvtq_f32_u32(vmovl_high_u16(hi));
    return r;
}
LL_INLINE ll_vf32 ll_load_s8(const int8_t *p) {
    const int8x16_t b = vld1q_s8(p);
    const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_high_s8(b);
    ll_vf32 r;
    r.v[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))); r.v[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    r.v[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))); r.v[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
    return r;
}
/* 16 fp8 values as floats through the half converter (spec: vec_scalar.h) */
LL_INLINE ll_vf32 ll_halves_to_f32(uint16x8_t lo, uint16x8_t hi) {
    ll_vf32 r;
    r.v[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(lo))); r.v[1] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(lo)));
    r.v[2] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(hi))); r.v[3] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(hi)));
    return r;
}
LL_INLINE ll_vf32 ll_load_e5m2(const uint8_t *p) {
    const uint8x16_t b = vld1q_u8(p);
    return ll_halves_to_f32(vshll_n_u8(vget_low_u8(b), 8), vshll_high_n_u8(b, 8));
}
LL_INLINE ll_vf32 ll_load_e4m3(const uint8_t *p) {   /* value x 2^-8 */
    const uint8x16_t b = vld1q_u8(p);
    const uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_high_u8(b);
    const uint16x8_t sign = vdupq_n_u16(0x8000), mag = vdupq_n_u16(0x3f80);
    return ll_halves_to_f32(vorrq_u16(vandq_u16(vshlq_n_u16(lo, 8), sign), vandq_u16(vshlq_n_u16(lo, 7), mag)),
                            vorrq_u16(vandq_u16(vshlq_n_u16(hi, 8), sign), vandq_u16(vshlq_n_u16(hi, 7), mag)));
}

/* bf16 pairs (vec.h): bfdot on a broadcast pair, read as a 32-bit word (first element in its
 * low half: little-endian) */
#ifdef LL_HAVE_BF16_DOT
typedef bfloat16x8_t ll_bf16x2;
typedef struct { bfloat16x8_t v[4]; } ll_vbf16x2;
LL_INLINE ll_bf16x2 ll_bcast_bf16x2(const void *p) {
    uint32_t v; memcpy(&v, p, 4); return vreinterpretq_bf16_u32(vdupq_n_u32(v));
}
LL_INLINE ll_vbf16x2 ll_load_bf16x2(const uint16_t *p) {
    ll_vbf16x2 r; LL_NEON_MAP1(r, vreinterpretq_bf16_u16(vld1q_u16(p + 8 * i_))); return r;
}
LL_INLINE ll_vf32 ll_dot2_bf16(ll_vf32 acc, ll_bf16x2 x, ll_vbf16x2 w) {
    ll_vf32 r; LL_NEON_MAP1(r, vbfdotq_f32(acc.v[i_], x, w.v[i_])); return r;
}
#endif
#undef LL_NEON_MAP1
LL_HOT_END
#endif
