/* Peak throughput of each inner-product instruction this build can issue, on one core: rounds
 * of LL_PEAK_ACC independent accumulators (more than latency x ports on any core this runs on,
 * so issue rate is the only limit), all operands in registers. The start-up micro-benchmark
 * (lite_llm/_kernels/gemm_path.py) times these and the real GEMM tiles to choose a path.
 * Written on the vec.h ops, so each backend times its own instructions.
 * What does not live here: the GEMM tiles themselves (gemm.h, qgemm.h), any timing.
 *
 *   LL_PEAK_FMA       ll_fma on ll_vf32 (vfmadd231ps zmm / 2 x ymm / NEON fmla x 4 / ...)  16 MAC each
 *   LL_PEAK_DPBF16    ll_dot2_bf16 (vdpbf16ps zmm, bfdot x 4)                                32 MAC each
 *   LL_PEAK_DPBUSD    ll_dpbusd, the build's int8 dot product (LL_I8DOT_NAME)                64 MAC each
 *   LL_PEAK_MADDUBS   ll_dpbusd_pairwise: vpmaddubsw + vpmaddwd + vpaddd where the build's
 *                     own is vpdpbusd (the other x86 int8 path)                              64 MAC each
 */
#ifndef LL_PEAK_H
#define LL_PEAK_H
#include "../simd/vec.h"
LL_HOT_BEGIN

enum { LL_PEAK_FMA = 0, LL_PEAK_DPBF16 = 1, LL_PEAK_DPBUSD = 2, LL_PEAK_MADDUBS = 3 };

#if LL_TT_FMA >= 8
#define LL_PEAK_ACC 12   /* 32 registers of a whole vector each */
#else
#define LL_PEAK_ACC 6    /* a vector is two ymm (AVX2) or four q registers: 12 / 24 registers */
#endif

/* The instruction this build's int8-block kernels multiply with (ll_dpbusd in vec_*.h). */
#define LL_INT8_PATH_NAME LL_I8DOT_NAME

/* Whether this build has instruction `kind`. */
static inline int ll_peak_has(int kind) {
    switch (kind) {
    case LL_PEAK_FMA: return 1;
#ifdef LL_HAVE_BF16_DOT
    case LL_PEAK_DPBF16: return 1;
#endif
#ifdef LL_HAVE_I8DOT
    case LL_PEAK_DPBUSD: return 1;
#endif
#ifdef LL_HAVE_I8_PAIRWISE
    case LL_PEAK_MADDUBS: return 1;
#endif
    default: return 0;
    }
}

/* The name reports and LITE_LLM_GEMM_PATH use for instruction `kind` in this build. */
static inline const char *ll_peak_name(int kind) {
    switch (kind) {
    case LL_PEAK_FMA: return "fma";
    case LL_PEAK_DPBF16: return "dpbf16";
    case LL_PEAK_DPBUSD: return LL_I8DOT_NAME;
#ifdef LL_HAVE_I8_PAIRWISE
    case LL_PEAK_MADDUBS: return LL_I8_PAIRWISE_NAME;
#endif
    default: return "";
    }
}

/* LL_PEAK_ACC int8 dot products per round, `pairwise` or the build's own. */
LL_INLINE double ll_peak_i8(const int pairwise, ptrdiff_t rounds, float seed, float *sink) {
    ll_vi32 acc[LL_PEAK_ACC];
    uint8_t ab[4], bb[4];
    memset(ab, 1 + (int)seed, 4);
    memset(bb, 3, 4);
    ll_vi8 a = ll_i8_bcast4(ab);
    const ll_vi8 b = ll_i8_bcast4(bb);
    for (int i = 0; i < LL_PEAK_ACC; i++) acc[i] = ll_i32_zero();
    for (ptrdiff_t r = 0; r < rounds; r++)
        for (int i = 0; i < LL_PEAK_ACC; i++) {
            ll_i8_opaque(&a);   /* a changes for the compiler: no hoisting of the products */
#ifdef LL_HAVE_I8_PAIRWISE
            acc[i] = pairwise ? ll_dpbusd_pairwise(acc[i], a, b) : ll_dpbusd(acc[i], a, b);
#else
            (void)pairwise;
            acc[i] = ll_dpbusd(acc[i], a, b);
#endif
        }
    float s = 0.f;
    for (int i = 0; i < LL_PEAK_ACC; i++) s += ll_hsum(ll_i32_to_f32(acc[i]));
    *sink = s;
    return (double)rounds * LL_PEAK_ACC * 64;
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
        /* operands from memory, not from bit-pattern constants (gcc 12 miscompiles those on aarch64) */
        uint16_t pa[2], pb[32];
        pa[0] = pa[1] = ll_f32_to_bf16(seed);
        for (int i = 0; i < 32; i++) pb[i] = ll_f32_to_bf16(1e-7f);
        const ll_bf16x2 a = ll_bcast_bf16x2(pa);
        const ll_vbf16x2 b = ll_load_bf16x2(pb);
        ll_vf32 acc[LL_PEAK_ACC];
        for (int i = 0; i < LL_PEAK_ACC; i++) acc[i] = ll_set1((float)i);
        for (ptrdiff_t r = 0; r < rounds; r++)
            for (int i = 0; i < LL_PEAK_ACC; i++) acc[i] = ll_dot2_bf16(acc[i], a, b);
        for (int i = 0; i < LL_PEAK_ACC; i++) s += ll_hsum(acc[i]);
        *sink = s;
        return (double)rounds * LL_PEAK_ACC * 32;
    }
#endif
#ifdef LL_HAVE_I8DOT
    if (kind == LL_PEAK_DPBUSD) return ll_peak_i8(0, rounds, seed, sink);
#endif
#ifdef LL_HAVE_I8_PAIRWISE
    if (kind == LL_PEAK_MADDUBS) return ll_peak_i8(1, rounds, seed, sink);
#endif
    (void)rounds; (void)seed;
    *sink = s;
    return 0.0;
}
LL_HOT_END
#endif
