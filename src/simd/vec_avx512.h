/* AVX-512 backend of vec.h (F, BW, VL, DQ; BF16 dot products when __AVX512BF16__). */
#ifndef LL_VEC_AVX512_H
#define LL_VEC_AVX512_H
#include <immintrin.h>
LL_HOT_BEGIN

typedef __m512 ll_vf32;
#ifdef __AVX512BF16__
#define LL_ISA_NAME "avx512bf16"
#define LL_HAVE_BF16_DOT 1
#define LL_HAVE_BF16_STORE 1
#else
#define LL_ISA_NAME "avx512"
#endif

/* GEMM register tiles (gemm.h). fp32 FMA: 8 tokens x 3 panels, 24 of the 32 zmm registers
 * accumulate, the activations are broadcast straight from memory into the FMA (ll_fma_row),
 * and each widened bf16 weight register feeds 8 FMAs, so the two widening ops (shift, mask)
 * per pair of bf16 columns cost 2 / 16 of the FMA slots instead of 2 / 8 with 4 tokens.
 * vdpbf16ps: 4 tokens x 4 panels, 16 accumulators + 4 weights + 1 broadcast pair. */
#define LL_TT_FMA 8
#define LL_NP_FMA 3
#define LL_TT_DOT 4
#define LL_NP_DOT 4

LL_INLINE ll_vf32 ll_zero(void) { return _mm512_setzero_ps(); }
LL_INLINE ll_vf32 ll_set1(float x) { return _mm512_set1_ps(x); }
LL_INLINE ll_vf32 ll_load(const float *p) { return _mm512_loadu_ps(p); }
LL_INLINE void ll_store(float *p, ll_vf32 a) { _mm512_storeu_ps(p, a); }
LL_INLINE ll_vf32 ll_add(ll_vf32 a, ll_vf32 b) { return _mm512_add_ps(a, b); }
LL_INLINE ll_vf32 ll_sub(ll_vf32 a, ll_vf32 b) { return _mm512_sub_ps(a, b); }
LL_INLINE ll_vf32 ll_mul(ll_vf32 a, ll_vf32 b) { return _mm512_mul_ps(a, b); }
LL_INLINE ll_vf32 ll_div(ll_vf32 a, ll_vf32 b) { return _mm512_div_ps(a, b); }
LL_INLINE ll_vf32 ll_max(ll_vf32 a, ll_vf32 b) { return _mm512_max_ps(a, b); }
LL_INLINE ll_vf32 ll_fma(ll_vf32 a, ll_vf32 b, ll_vf32 c) { return _mm512_fmadd_ps(a, b, c); }
LL_INLINE float ll_hsum(ll_vf32 a) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
LL_INLINE float ll_hmax(ll_vf32 a) { return _mm512_reduce_max_ps(a); }

/* exp(x) by 2^(x log2 e) = 2^n * 2^f, f in [-0.5, 0.5], degree-6 polynomial (rel. err ~2e-7). */
LL_INLINE ll_vf32 ll_exp(ll_vf32 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-87.3365447505531f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

LL_INLINE float ll_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
LL_INLINE ll_vf32 ll_load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
LL_INLINE ll_vf32 ll_load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
LL_INLINE ll_vf32 ll_load_bf16_even(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16));
}
LL_INLINE ll_vf32 ll_load_bf16_odd(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32((int)0xffff0000u)));
}
/* int8 blocks (quantized weights x int8 activations): ll_vi8 is 64 bytes = 16 int32 lanes of
 * 4 bytes each; ll_vi32 the 16 int32 sums. */
typedef __m512i ll_vi8;
typedef __m512i ll_vi32;
LL_INLINE ll_vi8 ll_i8_load(const void *p) { return _mm512_loadu_si512(p); }
LL_INLINE ll_vi8 ll_i8_bcast4(const void *p) { int v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }
LL_INLINE ll_vi8 ll_i8_lo4(ll_vi8 a) { return _mm512_and_si512(a, _mm512_set1_epi8(0x0f)); }
LL_INLINE ll_vi8 ll_i8_hi4(ll_vi8 a) { return _mm512_and_si512(_mm512_srli_epi16(a, 4), _mm512_set1_epi8(0x0f)); }
/* bits 2c..2c+1 of every byte moved to bits 4..5 (the high bits of a 6-bit value) */
LL_INLINE ll_vi8 ll_i8_hi2(ll_vi8 a, int c) {
    const __m512i m = _mm512_set1_epi8(0x30);
    return c == 0 ? _mm512_and_si512(_mm512_slli_epi16(a, 4), m) : c == 1 ? _mm512_and_si512(_mm512_slli_epi16(a, 2), m)
         : c == 2 ? _mm512_and_si512(a, m) : _mm512_and_si512(_mm512_srli_epi16(a, 2), m);
}
/* bit g of every byte moved to bit 4 (the high bit of a 5-bit value) */
LL_INLINE ll_vi8 ll_i8_hi1(ll_vi8 a, int g) {
    const __m512i m = _mm512_set1_epi8(0x10);
    return g < 4 ? _mm512_and_si512(_mm512_slli_epi16(a, 4 - g), m)
                 : _mm512_and_si512(_mm512_srli_epi16(a, g - 4), m);
}
LL_INLINE ll_vi8 ll_i8_or(ll_vi8 a, ll_vi8 b) { return _mm512_or_si512(a, b); }
/* bits pos..pos+width-1 of every byte moved to bits to..to+width-1 (vec_scalar.h): one 16-bit
 * shift, then the mask drops what crossed from the neighbouring byte */
LL_INLINE ll_vi8 ll_i8_bits(ll_vi8 a, int pos, int width, int to) {
    const __m512i m = _mm512_set1_epi8((char)(((1 << width) - 1) << to));
    return _mm512_and_si512(to >= pos ? _mm512_slli_epi16(a, to - pos) : _mm512_srli_epi16(a, pos - to), m);
}
LL_INLINE void ll_i8_store(void *p, ll_vi8 a) { _mm512_storeu_si512(p, a); }
/* table[a] for every byte a in 0..15 (a 16-entry lookup: non-linear 4-bit codebooks) */
LL_INLINE ll_vi8 ll_i8_lut16(ll_vi8 a, const int8_t *table) {
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)table)), a);
}
LL_INLINE ll_vi32 ll_i32_zero(void) { return _mm512_setzero_si512(); }
LL_INLINE ll_vi32 ll_i32_add(ll_vi32 a, ll_vi32 b) { return _mm512_add_epi32(a, b); }
LL_INLINE ll_vf32 ll_i32_to_f32(ll_vi32 a) { return _mm512_cvtepi32_ps(a); }
/* acc + sum of 4 products u8 x s8 per lane; u must be < 128 where there are no VNNI dot products
 * (the pairwise int16 sums would saturate otherwise) */
LL_INLINE ll_vi32 ll_dpbusd_pairwise(ll_vi32 acc, ll_vi8 u, ll_vi8 s) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}
#define LL_HAVE_I8DOT 1
#ifdef __AVX512VNNI__
#define LL_I8DOT_NAME "vpdpbusd"
#define LL_HAVE_I8_PAIRWISE 1            /* the other path, for the start-up peak measurement */
#define LL_I8_PAIRWISE_NAME "vpmaddubsw"
LL_INLINE ll_vi32 ll_dpbusd(ll_vi32 acc, ll_vi8 u, ll_vi8 s) { return _mm512_dpbusd_epi32(acc, u, s); }
/* ll_dpbusd is exact for every u8 (no int16 pair sums to saturate): signed weights can run as
 * w + 128 with 128 x the activations' int sum taken off the int32 result (qgemm.h), one
 * instruction a vector instead of ll_dpbssd's four */
#define LL_I8DOT_FULL_U8 1
#else
#define LL_I8DOT_NAME "vpmaddubsw"
LL_INLINE ll_vi32 ll_dpbusd(ll_vi32 acc, ll_vi8 u, ll_vi8 s) { return ll_dpbusd_pairwise(acc, u, s); }
#endif
/* a register the compiler must treat as changed (peak timing: no hoisting of products) */
LL_INLINE void ll_i8_opaque(ll_vi8 *a) { __asm__("" : "+v"(*a)); }

/* codebook lookups (vec.h): integer lanes, bytes, gathers of 4- and 8-byte table rows */
LL_INLINE ll_vi32 ll_i32_set1(int32_t v) { return _mm512_set1_epi32(v); }
LL_INLINE ll_vi32 ll_i32_load(const int32_t *p) { return _mm512_loadu_si512(p); }
LL_INLINE void ll_i32_store(int32_t *p, ll_vi32 a) { _mm512_storeu_si512(p, a); }
LL_INLINE ll_vi32 ll_i32_and(ll_vi32 a, ll_vi32 b) { return _mm512_and_si512(a, b); }
LL_INLINE ll_vi32 ll_i32_or(ll_vi32 a, ll_vi32 b) { return _mm512_or_si512(a, b); }
LL_INLINE ll_vi32 ll_i32_xor(ll_vi32 a, ll_vi32 b) { return _mm512_xor_si512(a, b); }
LL_INLINE ll_vi32 ll_i32_sub(ll_vi32 a, ll_vi32 b) { return _mm512_sub_epi32(a, b); }
LL_INLINE ll_vi32 ll_i32_mul(ll_vi32 a, ll_vi32 b) { return _mm512_mullo_epi32(a, b); }
LL_INLINE ll_vi32 ll_i32_load_s8(const int8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }
LL_INLINE ll_vi32 ll_i32_shl(ll_vi32 a, int n) { return _mm512_slli_epi32(a, (unsigned)n); }
LL_INLINE ll_vi32 ll_i32_shr(ll_vi32 a, int n) { return _mm512_srli_epi32(a, (unsigned)n); }
LL_INLINE ll_vi8 ll_i8_and(ll_vi8 a, ll_vi8 b) { return _mm512_and_si512(a, b); }
LL_INLINE ll_vi8 ll_i8_xor(ll_vi8 a, ll_vi8 b) { return _mm512_xor_si512(a, b); }
LL_INLINE ll_vi8 ll_i8_add(ll_vi8 a, ll_vi8 b) { return _mm512_add_epi8(a, b); }
LL_INLINE ll_vi8 ll_i8_sub(ll_vi8 a, ll_vi8 b) { return _mm512_sub_epi8(a, b); }
LL_INLINE ll_vf32 ll_f32_of_i32(ll_vi32 a) { return _mm512_castsi512_ps(a); }
#define LL_HAVE_I32_LE 1
LL_INLINE ll_vi32 ll_i32_le(ll_vi8 a) { return a; }
LL_INLINE ll_vi8 ll_i8_of_i32(ll_vi32 a) { return a; }
#define LL_HAVE_I8_GATHER 1
LL_INLINE ll_vi8 ll_i8_gather4(const void *base, ll_vi32 off) { return _mm512_i32gather_epi32(off, base, 1); }
LL_INLINE void ll_i8_gather8(const void *base, ll_vi32 off, ll_vi8 *lo, ll_vi8 *hi) {
    const __m512i a = _mm512_i32gather_epi64(_mm512_castsi512_si256(off), base, 1);
    const __m512i b = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(off, 1), base, 1);
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    *lo = _mm512_permutex2var_epi32(a, even, b);
    *hi = _mm512_permutex2var_epi32(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
}
/* byte g / 2 of each lane to all four, then one bit of it per byte */
#define LL_HAVE_I8_SIGNS 1
LL_INLINE ll_vi8 ll_i8_signs(ll_vi32 s, int g) {
    const int c = 0x01010101 * (g / 2);
    const __m512i b = _mm512_shuffle_epi8(s, _mm512_set4_epi32(0x0c0c0c0c + c, 0x08080808 + c, 0x04040404 + c, c));
    return _mm512_movm_epi8(_mm512_test_epi8_mask(b, _mm512_set1_epi32(g & 1 ? (int)0x80402010 : 0x08040201)));
}
/* 16-bit table lookups in registers: 4 two-table word permutes, bits 6 and 7 of the index choose */
#define LL_HAVE_U16_LUT256 1
LL_INLINE ll_vi32 ll_i32_lut256_u16(ll_vi32 idx, const uint16_t *t) {
    const __m512i r0 = _mm512_permutex2var_epi16(_mm512_loadu_si512(t), idx, _mm512_loadu_si512(t + 32));
    const __m512i r1 = _mm512_permutex2var_epi16(_mm512_loadu_si512(t + 64), idx, _mm512_loadu_si512(t + 96));
    const __m512i r2 = _mm512_permutex2var_epi16(_mm512_loadu_si512(t + 128), idx, _mm512_loadu_si512(t + 160));
    const __m512i r3 = _mm512_permutex2var_epi16(_mm512_loadu_si512(t + 192), idx, _mm512_loadu_si512(t + 224));
    const __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64));
    const __mmask32 b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(128));
    return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1), _mm512_mask_blend_epi16(b6, r2, r3));
}
/* ll_i8_expand2 / ll_i8_expand4 (vec.h): the code byte (word) copied through the lane, the
 * second word shifted by 4, the fields masked, looked up */
LL_INLINE ll_vi8 ll_i8_expand2(ll_vi32 c, int b, const int8_t *lut) {
    const __m512i x = _mm512_shuffle_epi8(c, _mm512_set4_epi32(0x0c0c0c0c + 0x01010101 * b, 0x08080808 + 0x01010101 * b,
                                                               0x04040404 + 0x01010101 * b, 0x01010101 * b));
    const __m512i y = _mm512_and_si512(_mm512_srlv_epi16(x, _mm512_set1_epi32(4 << 16)), _mm512_set1_epi32(0x0c030c03));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut)), y);
}
LL_INLINE ll_vi8 ll_i8_expand4(ll_vi32 c, int h, const int8_t *lut) {
    const int w = 0x0100 * (2 * h + 1) + 2 * h, p = w | w << 16;
    const __m512i x = _mm512_shuffle_epi8(c, _mm512_set4_epi32(0x0c0c0c0c + p, 0x08080808 + p, 0x04040404 + p, p));
    const __m512i y = _mm512_and_si512(_mm512_srlv_epi16(x, _mm512_set1_epi32(4 << 16)), _mm512_set1_epi8(0x0f));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut)), y);
}
/* Byte fields, bit masks and in-register byte tables (vec.h, LL_HAVE_I8_BITS): VBMI's
 * multishift and byte permutes, BITALG's bit shuffle. */
#if defined(__AVX512VBMI__) && defined(__AVX512BITALG__)
#define LL_HAVE_I8_BITS 1
typedef __mmask64 ll_m64;
LL_INLINE ll_vi8 ll_i8_fields(ll_vi8 a, uint64_t ctl) {
    return _mm512_multishift_epi64_epi8(_mm512_set1_epi64((long long)ctl), a);
}
LL_INLINE ll_m64 ll_i8_bitmask(ll_vi8 a, uint64_t ctl) {
    return _mm512_bitshuffle_epi64_mask(a, _mm512_set1_epi64((long long)ctl));
}
LL_INLINE ll_vi8 ll_i8_lut64(ll_vi8 idx, const int8_t *t) { return _mm512_permutexvar_epi8(idx, _mm512_loadu_si512(t)); }
LL_INLINE ll_vi8 ll_i8_lut128(ll_vi8 idx, const uint8_t *t) {
    return _mm512_permutex2var_epi8(_mm512_loadu_si512(t), idx, _mm512_loadu_si512(t + 64));
}
LL_INLINE ll_vi8 ll_i8_lut256(ll_vi8 idx, const uint8_t *t) {
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), ll_i8_lut128(idx, t), ll_i8_lut128(idx, t + 128));
}
LL_INLINE ll_vi8 ll_i8_pick2(ll_vi8 a, ll_vi8 b, ll_vi8 idx) { return _mm512_permutex2var_epi8(a, idx, b); }
LL_INLINE ll_vi8 ll_i8_neg_mask(ll_vi8 a, ll_m64 m) { return _mm512_mask_sub_epi8(a, m, _mm512_setzero_si512(), a); }
LL_INLINE ll_vi8 ll_i8_blend(ll_vi8 a, ll_m64 m, ll_vi8 b) { return _mm512_mask_blend_epi8(m, a, b); }
#endif
/* acc + sum of 4 products s8 x s8 per lane (a >= -128, b > -128): |a| x (b with a's sign) */
LL_INLINE ll_vi32 ll_dpbssd(ll_vi32 acc, ll_vi8 a, ll_vi8 b) {
    const __m512i zero = _mm512_setzero_si512();
    return ll_dpbusd(acc, _mm512_abs_epi8(a), _mm512_mask_sub_epi8(b, _mm512_movepi8_mask(a), zero, b));
}
/* 16 uint8 values widened to int32 lanes */
#define LL_HAVE_I32_LOAD_U8 1
LL_INLINE ll_vi32 ll_i32_load_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
/* 16 uint8 / int8 values widened to float lanes */
LL_INLINE ll_vf32 ll_load_u8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
LL_INLINE ll_vf32 ll_load_s8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* 16 fp8 values as floats through the half converter (spec: vec_scalar.h) */
LL_INLINE ll_vf32 ll_load_e5m2(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8));
}
LL_INLINE ll_vf32 ll_load_e4m3(const uint8_t *p) {   /* value x 2^-8 */
    /* sign-extended and shifted by 7: the sign lands in bits 15 and 14, exponent and mantissa
     * in 13..7; clearing bit 14 leaves the half s 0eeee mmm0000000 */
    const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16((short)0xbf80)));
}
/* bf16 pairs (vec.h): vdpbf16ps on a broadcast pair; the pair is read as a 32-bit word, which
 * holds the first element in its low half on this little-endian machine */
#ifdef LL_HAVE_BF16_DOT
typedef __m512bh ll_bf16x2;
typedef __m512bh ll_vbf16x2;
LL_INLINE ll_bf16x2 ll_bcast_bf16x2(const void *p) { int v; memcpy(&v, p, 4); return (__m512bh)_mm512_set1_epi32(v); }
LL_INLINE ll_vbf16x2 ll_load_bf16x2(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }
LL_INLINE ll_vf32 ll_dot2_bf16(ll_vf32 acc, ll_bf16x2 x, ll_vbf16x2 w) { return _mm512_dpbf16_ps(acc, x, w); }
LL_INLINE void ll_store_bf16(uint16_t *p, ll_vf32 a) {
    _mm256_storeu_si256((__m256i *)p, (__m256i)_mm512_cvtneps_pbh(a));
}
/* a into the first of each pair (the low half of a little-endian word), b into the second */
#define LL_HAVE_BF16_STORE_PAIRS 1
LL_INLINE void ll_store_bf16_pairs(uint16_t *p, ll_vf32 a, ll_vf32 b) {
    const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(a));
    const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(b));
    _mm512_storeu_si512(p, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
}
#endif

/* acc + x[row t][off] * w (vec.h). The broadcast is folded into the FMA as a memory operand,
 * written as asm: compilers otherwise either hoist the 16 broadcasts of a tile into registers
 * of their own or keep a pointer per row, and spill accumulators either way (35-50 instead of
 * ~55 GMAC/s per Zen 4 core). */
#define LL_HAVE_FMA_ROW 1
LL_INLINE ll_vf32 ll_fma_row(ll_vf32 acc, ll_vf32 w, const float *b, const float *b4, ptrdiff_t s, ptrdiff_t s3,
                             const int t, const int off) {
    const float *base = t < 4 ? b : b4;
    switch (t & 3) {
    case 0: __asm__("vfmadd231ps %c[o](%[p])%{1to16%}, %[w], %[a]" : [a] "+v"(acc) : [w] "v"(w), [p] "r"(base), [o] "i"(4 * off)); break;
    case 1: __asm__("vfmadd231ps %c[o](%[p],%[s],1)%{1to16%}, %[w], %[a]" : [a] "+v"(acc) : [w] "v"(w), [p] "r"(base), [s] "r"(s), [o] "i"(4 * off)); break;
    case 2: __asm__("vfmadd231ps %c[o](%[p],%[s],2)%{1to16%}, %[w], %[a]" : [a] "+v"(acc) : [w] "v"(w), [p] "r"(base), [s] "r"(s), [o] "i"(4 * off)); break;
    default: __asm__("vfmadd231ps %c[o](%[p],%[s],1)%{1to16%}, %[w], %[a]" : [a] "+v"(acc) : [w] "v"(w), [p] "r"(base), [s] "r"(s3), [o] "i"(4 * off));
    }
    return acc;
}
LL_HOT_END
#endif
