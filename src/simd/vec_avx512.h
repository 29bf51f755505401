/* AVX-512 backend of vec.h (F, BW, VL, DQ; BF16 dot products when __AVX512BF16__). */
#ifndef LL_VEC_AVX512_H
#define LL_VEC_AVX512_H
#include <immintrin.h>

typedef __m512 ll_vf32;
#ifdef __AVX512BF16__
#define LL_ISA_NAME "avx512bf16"
#define LL_HAVE_BF16_DOT 1
#else
#define LL_ISA_NAME "avx512"
#endif

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
#endif
