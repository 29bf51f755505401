/* Load-time conversions, one range of rows per call (the caller splits the work): fp32 ->
 * bf16, and [N, K] rows -> the packed panels of gemm.h. (ggml blocks: qgemm.h.) */
#ifndef LL_QUANT_H
#define LL_QUANT_H
#include "../simd/vec.h"

static inline void ll_f32_to_bf16_n(const float *src, uint16_t *dst, ptrdiff_t i0, ptrdiff_t i1) {
    for (ptrdiff_t i = i0; i < i1; i++) dst[i] = ll_f32_to_bf16(src[i]);
}

/* Rows [N, K] of 2- or 4-byte elements -> packed panels p0..p1 (gemm.h layouts). Writes are
 * sequential; reads walk the panel's 16 rows side by side. */
static inline void ll_pack_panels(const void *src, void *dst, ptrdiff_t n, ptrdiff_t k, int wtype,
                                  ptrdiff_t p0, ptrdiff_t p1) {
    for (ptrdiff_t p = p0; p < p1; p++) {
        const int rows = (int)(n - p * 16 < 16 ? n - p * 16 : 16);
        if (wtype == 1) {   /* bf16 pairs: [p][k/2][16][2] */
            const ptrdiff_t k2 = (k + 1) / 2;
            const uint16_t *s = (const uint16_t *)src + p * 16 * k;
            uint16_t *d = (uint16_t *)dst + p * k2 * 32;
            for (ptrdiff_t kp = 0; kp < k2; kp++, d += 32) {
                const ptrdiff_t k0 = 2 * kp;
                int lane = 0;
                if (k0 + 1 < k)
                    for (; lane < rows; lane++) {
                        d[2 * lane] = s[lane * k + k0];
                        d[2 * lane + 1] = s[lane * k + k0 + 1];
                    }
                else
                    for (; lane < rows; lane++) { d[2 * lane] = s[lane * k + k0]; d[2 * lane + 1] = 0; }
                for (; lane < 16; lane++) d[2 * lane] = d[2 * lane + 1] = 0;
            }
        } else if (wtype == 0) {   /* fp32 [p][k][16] */
            const float *s = (const float *)src + p * 16 * k;
            float *d = (float *)dst + p * k * 16;
            for (ptrdiff_t kk = 0; kk < k; kk++, d += 16) {
                int lane = 0;
                for (; lane < rows; lane++) d[lane] = s[lane * k + kk];
                for (; lane < 16; lane++) d[lane] = 0.f;
            }
        } else {                   /* fp16 [p][k][16] */
            const uint16_t *s = (const uint16_t *)src + p * 16 * k;
            uint16_t *d = (uint16_t *)dst + p * k * 16;
            for (ptrdiff_t kk = 0; kk < k; kk++, d += 16) {
                int lane = 0;
                for (; lane < rows; lane++) d[lane] = s[lane * k + kk];
                for (; lane < 16; lane++) d[lane] = 0;
            }
        }
    }
}
#endif
