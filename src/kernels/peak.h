/* Peak throughput of each inner-product instruction this build can issue, on one core: rounds
 * of LL_PEAK_ACC independent accumulators (more than latency x ports on any x86 core, so issue rate is
 * the only limit), all operands in registers. The start-up micro-benchmark
 * (lite_llm/_kernels/gemm_path.py) times these and the real GEMM tiles to choose a path.
 * What does not live here: the GEMM tiles themselves (gemm.h, qgemm.h), any timing.
 *
 *   LL_PEAK_FMA      fp32 FMA on ll_vf32 (vfmadd231ps zmm / 2 x ymm / scalar)   16 MAC each
 *   LL_PEAK_DPBF16   vdpbf16ps zmm                                             32 MAC each
 *   LL_PEAK_DPBUSD   vpdpbusd zmm (AVX512-VNNI)                                 64 MAC each
 *   LL_PEAK_MADDUBS  vpmaddubsw + vpmaddwd + vpaddd (zmm, or 2 x ymm on AVX2)   64 MAC each
 */
#ifndef LL_PEAK_H
#define LL_PEAK_H
#include "../simd/vec.h"

enum { LL_PEAK_FMA = 0, LL_PEAK_DPBF16 = 1, LL_PEAK_DPBUSD = 2, LL_PEAK_MADDUBS = 3 };

#if defined(__AVX512F__)
#define LL_PEAK_ACC 12
#else
#define LL_PEAK_ACC 6   /* a vector is two ymm (AVX2): 12 of the 16 registers, 2 x latency 4 x 2 ports */
#endif

/* The instruction this build's int8-block kernels multiply with (ll_dpbusd in vec_*.h). */
#if defined(__AVX512VNNI__)
#define LL_INT8_PATH_NAME "vpdpbusd"
#elif defined(__AVX512BW__) || defined(__AVX2__)
#define LL_INT8_PATH_NAME "vpmaddubsw"
#else
#define LL_INT8_PATH_NAME "scalar"
#endif

/* Whether this build has instruction `kind`. */
static inline int ll_peak_has(int kind) {
    switch (kind) {
    case LL_PEAK_FMA: return 1;
#ifdef LL_HAVE_BF16_DOT
    case LL_PEAK_DPBF16: return 1;
#endif
#ifdef __AVX512VNNI__
    case LL_PEAK_DPBUSD: return 1;
#endif
#if defined(__AVX512BW__) || defined(__AVX2__)
    case LL_PEAK_MADDUBS: return 1;
#endif
    default: return 0;
    }
}

/* Run `rounds` rounds of LL_PEAK_ACC instructions `kind`; returns the multiply-adds done (0 if
 * the build lacks it). `seed` feeds the operands and *sink takes a sum of the results, so the
 * compiler can neither fold the loop nor drop it. */
static inline double ll_peak_run(int kind, ptrdiff_t rounds, float seed, float *sink) {
    float s = 0.f;
    if (kind == LL_PEAK_FMA) {
        ll_vf32 acc[LL_PEAK_ACC];
        const ll_vf32 a = ll_set1(seed), b = ll_set1(1e-7f);
        for (int i = 0; i < LL_PEAK_ACC; i++) acc[i] = ll_set1((float)i);
        for (ptrdiff_t r = 0; r < rounds; r++)
            for (int i = 0; i < LL_PEAK_ACC; i++) acc[i] = ll_fma(a, b, acc[i]);
        for (int i = 0; i < LL_PEAK_ACC; i++) s += ll_hsum(acc[i]);
        *sink = s;
        return (double)rounds * LL_PEAK_ACC * 16;
    }
#ifdef LL_HAVE_BF16_DOT
    if (kind == LL_PEAK_DPBF16) {
        __m512 acc[LL_PEAK_ACC];
        const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(seed), _mm512_set1_ps(seed));
        const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-7f), _mm512_set1_ps(1e-7f));
        for (int i = 0; i < LL_PEAK_ACC; i++) acc[i] = _mm512_set1_ps((float)i);
        for (ptrdiff_t r = 0; r < rounds; r++)
            for (int i = 0; i < LL_PEAK_ACC; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        for (int i = 0; i < LL_PEAK_ACC; i++) s += ll_hsum(acc[i]);
        *sink = s;
        return (double)rounds * LL_PEAK_ACC * 32;
    }
#endif
#ifdef __AVX512VNNI__
    if (kind == LL_PEAK_DPBUSD) {
        __m512i acc[LL_PEAK_ACC];
        const __m512i a = _mm512_set1_epi8((char)(1 + (int)seed)), b = _mm512_set1_epi8(3);
        for (int i = 0; i < LL_PEAK_ACC; i++) acc[i] = _mm512_set1_epi32(i);
        for (ptrdiff_t r = 0; r < rounds; r++)
            for (int i = 0; i < LL_PEAK_ACC; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
        for (int i = 0; i < LL_PEAK_ACC; i++) s += (float)_mm512_reduce_add_epi32(acc[i]);
        *sink = s;
        return (double)rounds * LL_PEAK_ACC * 64;
    }
#endif
#if defined(__AVX512BW__)
    if (kind == LL_PEAK_MADDUBS) {
        __m512i acc[LL_PEAK_ACC];
        __m512i a = _mm512_set1_epi8((char)(1 + (int)seed));
        const __m512i b = _mm512_set1_epi8(3), one = _mm512_set1_epi16(1);
        for (int i = 0; i < LL_PEAK_ACC; i++) acc[i] = _mm512_set1_epi32(i);
        for (ptrdiff_t r = 0; r < rounds; r++)
            for (int i = 0; i < LL_PEAK_ACC; i++) {
                __asm__("" : "+v"(a));   /* a changes for the compiler: no hoisting of the products */
                acc[i] = _mm512_add_epi32(acc[i], _mm512_madd_epi16(_mm512_maddubs_epi16(a, b), one));
            }
        for (int i = 0; i < LL_PEAK_ACC; i++) s += (float)_mm512_reduce_add_epi32(acc[i]);
        *sink = s;
        return (double)rounds * LL_PEAK_ACC * 64;
    }
#elif defined(__AVX2__)
    if (kind == LL_PEAK_MADDUBS) {
        __m256i acc[2 * LL_PEAK_ACC];
        __m256i a = _mm256_set1_epi8((char)(1 + (int)seed));
        const __m256i b = _mm256_set1_epi8(3), one = _mm256_set1_epi16(1);
        for (int i = 0; i < 2 * LL_PEAK_ACC; i++) acc[i] = _mm256_set1_epi32(i);
        for (ptrdiff_t r = 0; r < rounds; r++)
            for (int i = 0; i < 2 * LL_PEAK_ACC; i++) {
                __asm__("" : "+x"(a));
                acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), one));
            }
        for (int i = 0; i < 2 * LL_PEAK_ACC; i++) {
            int v[8];
            _mm256_storeu_si256((__m256i *)v, acc[i]);
            for (int j = 0; j < 8; j++) s += (float)v[j];
        }
        *sink = s;
        return (double)rounds * LL_PEAK_ACC * 64;
    }
#endif
    (void)rounds; (void)seed;
    *sink = s;
    return 0.0;
}
#endif
