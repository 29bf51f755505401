/* AVX2 + FMA + F16C backend of vec.h: a 16-lane vector is two ymm registers. */
#ifndef LL_VEC_AVX2_H
#define LL_VEC_AVX2_H
#include <immintrin.h>
LL_HOT_BEGIN
#define LL_ISA_NAME "avx2"

typedef struct { __m256 lo, hi; } ll_vf32;

/* GEMM register tiles (gemm.h), sized to the 16 ymm registers, a vector being two of them:
 * fp32 FMA 2 tokens x 2 panels = 8 accumulators + 4 weight registers (bf16 weights: the even
 * and odd columns widened) + 1 broadcast; the gated MLP's tile is the same 2 x (gate, up).
 * 3 x 2 spills with bf16 weights, the 4 x 4 of AVX-512 spills 60-70 registers a step
 * (tests/kernels/test_register_tiles.py reads the compiled tiles). No bf16 dot products. */
#define LL_TT_FMA 2
#define LL_NP_FMA 2
#define LL_TT_DOT 2
#define LL_NP_DOT 2

#define LL_PAIR(e_lo, e_hi) do { ll_vf32 r_; r_.lo = (e_lo); r_.hi = (e_hi); return r_; } while (0)
LL_INLINE ll_vf32 ll_zero(void) { LL_PAIR(_mm256_setzero_ps(), _mm256_setzero_ps()); }
LL_INLINE ll_vf32 ll_set1(float x) { LL_PAIR(_mm256_set1_ps(x), _mm256_set1_ps(x)); }
LL_INLINE ll_vf32 ll_load(const float *p) { LL_PAIR(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
LL_INLINE void ll_store(float *p, ll_vf32 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
LL_INLINE ll_vf32 ll_add(ll_vf32 a, ll_vf32 b) { LL_PAIR(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
LL_INLINE ll_vf32 ll_sub(ll_vf32 a, ll_vf32 b) { LL_PAIR(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
LL_INLINE ll_vf32 ll_mul(ll_vf32 a, ll_vf32 b) { LL_PAIR(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
LL_INLINE ll_vf32 ll_div(ll_vf32 a, ll_vf32 b) { LL_PAIR(_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)); }
LL_INLINE ll_vf32 ll_max(ll_vf32 a, ll_vf32 b) { LL_PAIR(_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)); }
LL_INLINE ll_vf32 ll_fma(ll_vf32 a, ll_vf32 b, ll_vf32 c) {
    LL_PAIR(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
LL_INLINE float ll_hsum(ll_vf32 a) {
    __m256 h = _mm256_add_ps(a.lo, a.hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
LL_INLINE float ll_hmax(ll_vf32 a) {
    __m256 h = _mm256_max_ps(a.lo, a.hi);
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
LL_INLINE __m256 ll_exp8(__m256 x) {  /* same method as the AVX-512 ll_exp */
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-87.3365447505531f));
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
LL_INLINE ll_vf32 ll_exp(ll_vf32 a) { LL_PAIR(ll_exp8(a.lo), ll_exp8(a.hi)); }

LL_INLINE float ll_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
LL_INLINE __m256 ll_bf16x8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
LL_INLINE ll_vf32 ll_load_bf16(const uint16_t *p) {
    LL_PAIR(ll_bf16x8(_mm_loadu_si128((const __m128i *)p)), ll_bf16x8(_mm_loadu_si128((const __m128i *)(p + 8))));
}
LL_INLINE ll_vf32 ll_load_f16(const uint16_t *p) {
    LL_PAIR(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8))));
}
LL_INLINE ll_vf32 ll_load_bf16_even(const uint16_t *p) {
    LL_PAIR(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)p), 16)),
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(p + 16)), 16)));
}
LL_INLINE ll_vf32 ll_load_bf16_odd(const uint16_t *p) {
    const __m256i m = _mm256_set1_epi32((int)0xffff0000u);
    LL_PAIR(_mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)p), m)),
            _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 16)), m)));
}
/* int8 blocks: 64 bytes = 16 int32 lanes as two ymm (see vec_avx512.h). */
typedef struct { __m256i lo, hi; } ll_vi8;
typedef ll_vi8 ll_vi32;
#define LL_IPAIR(e_lo, e_hi) do { ll_vi8 r_; r_.lo = (e_lo); r_.hi = (e_hi); return r_; } while (0)
LL_INLINE ll_vi8 ll_i8_load(const void *p) {
    LL_IPAIR(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)((const char *)p + 32)));
}
LL_INLINE ll_vi8 ll_i8_bcast4(const void *p) { int v; memcpy(&v, p, 4); LL_IPAIR(_mm256_set1_epi32(v), _mm256_set1_epi32(v)); }
LL_INLINE ll_vi8 ll_i8_lo4(ll_vi8 a) {
    const __m256i m = _mm256_set1_epi8(0x0f);
    LL_IPAIR(_mm256_and_si256(a.lo, m), _mm256_and_si256(a.hi, m));
}
LL_INLINE ll_vi8 ll_i8_hi4(ll_vi8 a) {
    const __m256i m = _mm256_set1_epi8(0x0f);
    LL_IPAIR(_mm256_and_si256(_mm256_srli_epi16(a.lo, 4), m), _mm256_and_si256(_mm256_srli_epi16(a.hi, 4), m));
}
LL_INLINE __m256i ll_hi2_256(__m256i a, int c) {
    const __m256i m = _mm256_set1_epi8(0x30);
    return c == 0 ? _mm256_and_si256(_mm256_slli_epi16(a, 4), m) : c == 1 ? _mm256_and_si256(_mm256_slli_epi16(a, 2), m)
         : c == 2 ? _mm256_and_si256(a, m) : _mm256_and_si256(_mm256_srli_epi16(a, 2), m);
}
LL_INLINE ll_vi8 ll_i8_hi2(ll_vi8 a, int c) { LL_IPAIR(ll_hi2_256(a.lo, c), ll_hi2_256(a.hi, c)); }
LL_INLINE __m256i ll_hi1_256(__m256i a, int g) {
    const __m256i m = _mm256_set1_epi8(0x10);
    return g < 4 ? _mm256_and_si256(_mm256_slli_epi16(a, 4 - g), m) : _mm256_and_si256(_mm256_srli_epi16(a, g - 4), m);
}
LL_INLINE ll_vi8 ll_i8_hi1(ll_vi8 a, int g) { LL_IPAIR(ll_hi1_256(a.lo, g), ll_hi1_256(a.hi, g)); }
LL_INLINE ll_vi8 ll_i8_or(ll_vi8 a, ll_vi8 b) { LL_IPAIR(_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)); }
/* bits pos..pos+width-1 of every byte moved to bits to..to+width-1 (vec_scalar.h) */
LL_INLINE __m256i ll_bits_256(__m256i a, int pos, int width, int to) {
    const __m256i m = _mm256_set1_epi8((char)(((1 << width) - 1) << to));
    return _mm256_and_si256(to >= pos ? _mm256_slli_epi16(a, to - pos) : _mm256_srli_epi16(a, pos - to), m);
}
LL_INLINE ll_vi8 ll_i8_bits(ll_vi8 a, int pos, int width, int to) {
    LL_IPAIR(ll_bits_256(a.lo, pos, width, to), ll_bits_256(a.hi, pos, width, to));
}
LL_INLINE void ll_i8_store(void *p, ll_vi8 a) {
    _mm256_storeu_si256((__m256i *)p, a.lo);
    _mm256_storeu_si256((__m256i *)((char *)p + 32), a.hi);
}
LL_INLINE ll_vi8 ll_i8_lut16(ll_vi8 a, const int8_t *table) {
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    LL_IPAIR(_mm256_shuffle_epi8(t, a.lo), _mm256_shuffle_epi8(t, a.hi));
}
LL_INLINE ll_vi32 ll_i32_zero(void) { LL_IPAIR(_mm256_setzero_si256(), _mm256_setzero_si256()); }
LL_INLINE ll_vi32 ll_i32_add(ll_vi32 a, ll_vi32 b) { LL_IPAIR(_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)); }
LL_INLINE ll_vf32 ll_i32_to_f32(ll_vi32 a) { LL_PAIR(_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)); }
/* codebook lookups (vec.h): integer lanes, bytes, gathers of 4- and 8-byte table rows */
#define LL_IOP(f, a, b) LL_IPAIR(f((a).lo, (b).lo), f((a).hi, (b).hi))
LL_INLINE ll_vi32 ll_i32_set1(int32_t v) { LL_IPAIR(_mm256_set1_epi32(v), _mm256_set1_epi32(v)); }
LL_INLINE ll_vi32 ll_i32_load(const int32_t *p) { return ll_i8_load(p); }
LL_INLINE void ll_i32_store(int32_t *p, ll_vi32 a) { ll_i8_store(p, a); }
LL_INLINE ll_vi32 ll_i32_and(ll_vi32 a, ll_vi32 b) { LL_IOP(_mm256_and_si256, a, b); }
LL_INLINE ll_vi32 ll_i32_or(ll_vi32 a, ll_vi32 b) { LL_IOP(_mm256_or_si256, a, b); }
LL_INLINE ll_vi32 ll_i32_xor(ll_vi32 a, ll_vi32 b) { LL_IOP(_mm256_xor_si256, a, b); }
LL_INLINE ll_vi32 ll_i32_sub(ll_vi32 a, ll_vi32 b) { LL_IOP(_mm256_sub_epi32, a, b); }
LL_INLINE ll_vi32 ll_i32_mul(ll_vi32 a, ll_vi32 b) { LL_IOP(_mm256_mullo_epi32, a, b); }
LL_INLINE ll_vi32 ll_i32_load_s8(const int8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    LL_IPAIR(_mm256_cvtepi8_epi32(v), _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
}
LL_INLINE ll_vi32 ll_i32_shl(ll_vi32 a, int n) { LL_IPAIR(_mm256_slli_epi32(a.lo, n), _mm256_slli_epi32(a.hi, n)); }
LL_INLINE ll_vi32 ll_i32_shr(ll_vi32 a, int n) { LL_IPAIR(_mm256_srli_epi32(a.lo, n), _mm256_srli_epi32(a.hi, n)); }
LL_INLINE ll_vi8 ll_i8_and(ll_vi8 a, ll_vi8 b) { LL_IOP(_mm256_and_si256, a, b); }
LL_INLINE ll_vi8 ll_i8_xor(ll_vi8 a, ll_vi8 b) { LL_IOP(_mm256_xor_si256, a, b); }
LL_INLINE ll_vi8 ll_i8_add(ll_vi8 a, ll_vi8 b) { LL_IOP(_mm256_add_epi8, a, b); }
LL_INLINE ll_vi8 ll_i8_sub(ll_vi8 a, ll_vi8 b) { LL_IOP(_mm256_sub_epi8, a, b); }
#undef LL_IOP
LL_INLINE ll_vf32 ll_f32_of_i32(ll_vi32 a) { LL_PAIR(_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)); }
#define LL_HAVE_I32_LE 1
LL_INLINE ll_vi32 ll_i32_le(ll_vi8 a) { return a; }
LL_INLINE ll_vi8 ll_i8_of_i32(ll_vi32 a) { return a; }
#define LL_HAVE_I8_GATHER 1
LL_INLINE ll_vi8 ll_i8_gather4(const void *base, ll_vi32 off) {
    LL_IPAIR(_mm256_i32gather_epi32((const int *)base, off.lo, 1), _mm256_i32gather_epi32((const int *)base, off.hi, 1));
}
/* 8 rows of 8 bytes: their first (second) 4 bytes in row order */
LL_INLINE void ll_gather8_256(const void *base, __m256i off, __m256i *lo, __m256i *hi) {
    const __m256 a = _mm256_castsi256_ps(_mm256_i32gather_epi64((const long long *)base, _mm256_castsi256_si128(off), 1));
    const __m256 b = _mm256_castsi256_ps(_mm256_i32gather_epi64((const long long *)base, _mm256_extracti128_si256(off, 1), 1));
    *lo = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0));
    *hi = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0));
}
LL_INLINE void ll_i8_gather8(const void *base, ll_vi32 off, ll_vi8 *lo, ll_vi8 *hi) {
    ll_gather8_256(base, off.lo, &lo->lo, &hi->lo);
    ll_gather8_256(base, off.hi, &lo->hi, &hi->hi);
}
/* byte g / 2 of each lane to all four, then one bit of it per byte */
#define LL_HAVE_I8_SIGNS 1
LL_INLINE __m256i ll_signs_256(__m256i s, int g) {
    const int c = 0x01010101 * (g / 2);
    const __m256i idx = _mm256_setr_epi32(c, 0x04040404 + c, 0x08080808 + c, 0x0c0c0c0c + c,
                                          c, 0x04040404 + c, 0x08080808 + c, 0x0c0c0c0c + c);
    const __m256i bits = _mm256_set1_epi32(g & 1 ? (int)0x80402010 : 0x08040201);
    return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(s, idx), bits), bits);
}
LL_INLINE ll_vi8 ll_i8_signs(ll_vi32 s, int g) { LL_IPAIR(ll_signs_256(s.lo, g), ll_signs_256(s.hi, g)); }
/* u < 128 (pairwise int16 sums of vpmaddubsw saturate otherwise) */
LL_INLINE __m256i ll_dpbusd_256(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#define LL_HAVE_I8DOT 1
#define LL_I8DOT_NAME "vpmaddubsw"
LL_INLINE void ll_i8_opaque(ll_vi8 *a) { __asm__("" : "+x"(a->lo), "+x"(a->hi)); }
LL_INLINE ll_vi32 ll_dpbusd(ll_vi32 acc, ll_vi8 u, ll_vi8 s) {
    LL_IPAIR(ll_dpbusd_256(acc.lo, u.lo, s.lo), ll_dpbusd_256(acc.hi, u.hi, s.hi));
}
LL_INLINE ll_vi32 ll_dpbssd(ll_vi32 acc, ll_vi8 a, ll_vi8 b) {
    LL_IPAIR(ll_dpbusd_256(acc.lo, _mm256_abs_epi8(a.lo), _mm256_sign_epi8(b.lo, a.lo)),
             ll_dpbusd_256(acc.hi, _mm256_abs_epi8(a.hi), _mm256_sign_epi8(b.hi, a.hi)));
}
/* 16 uint8 values widened to int32 lanes */
#define LL_HAVE_I32_LOAD_U8 1
LL_INLINE ll_vi32 ll_i32_load_u8(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    LL_IPAIR(_mm256_cvtepu8_epi32(v), _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
}
LL_INLINE ll_vf32 ll_load_u8(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    LL_PAIR(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))));
}
LL_INLINE ll_vf32 ll_load_s8(const int8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);
    LL_PAIR(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))));
}
/* 16 fp8 values as floats through the half converter (spec: vec_scalar.h) */
LL_INLINE ll_vf32 ll_load_e5m2(const uint8_t *p) {
    const __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    LL_PAIR(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
}
LL_INLINE ll_vf32 ll_load_e4m3(const uint8_t *p) {   /* value x 2^-8 */
    /* sign-extended and shifted by 7: the sign lands in bits 15 and 14; clearing 14 leaves the half */
    const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(b, 7), _mm256_set1_epi16((short)0xbf80));
    LL_PAIR(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
}
#undef LL_IPAIR
#undef LL_PAIR
LL_HOT_END
#endif
