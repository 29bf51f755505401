/* Load-time conversions, one range of blocks or rows per call (the caller splits the work):
 * ggml block formats -> fp32, fp32 -> bf16, and [N, K] rows -> the packed panels of gemm.h.
 * ggml blocks (little-endian):
 *   Q8_0 [34 B / 32]:  f16 d, int8 q[32]                 x = d q
 *   Q4_0 [18 B / 32]:  f16 d, u8 qs[16]                  x = d (q - 8); q[i] = qs[i] & 15, q[i+16] = qs[i] >> 4
 *   Q4_1 [20 B / 32]:  f16 d, f16 m, u8 qs[16]           x = d q + m
 *   Q4_K [144 B / 256]: f16 d, f16 dmin, u8 scales[12], u8 qs[128]   8 sub-blocks of 32, 6-bit scale/min
 *   Q6_K [210 B / 256]: u8 ql[128], u8 qh[64], i8 scales[16], f16 d  16 sub-blocks of 16
 */
#ifndef LL_QUANT_H
#define LL_QUANT_H
#include "../simd/vec.h"

/* a little-endian fp16 at byte pointer p (assembled bytewise: also right on big-endian) */
#define LL_F16(p) ll_f16_to_f32((uint16_t)((p)[0] | ((p)[1] << 8)))

static inline void ll_dequant_q8_0(const uint8_t *src, float *dst, ptrdiff_t b0, ptrdiff_t b1) {
    for (ptrdiff_t b = b0; b < b1; b++) {
        const uint8_t *blk = src + b * 34;
        const float d = LL_F16(blk);
        const int8_t *q = (const int8_t *)(blk + 2);
        for (int i = 0; i < 32; i++) dst[b * 32 + i] = d * (float)q[i];
    }
}

static inline void ll_dequant_q4_0(const uint8_t *src, float *dst, ptrdiff_t b0, ptrdiff_t b1) {
    for (ptrdiff_t b = b0; b < b1; b++) {
        const uint8_t *blk = src + b * 18;
        const float d = LL_F16(blk);
        for (int i = 0; i < 16; i++) {
            dst[b * 32 + i] = d * (float)((blk[2 + i] & 15) - 8);
            dst[b * 32 + i + 16] = d * (float)((blk[2 + i] >> 4) - 8);
        }
    }
}

static inline void ll_dequant_q4_1(const uint8_t *src, float *dst, ptrdiff_t b0, ptrdiff_t b1) {
    for (ptrdiff_t b = b0; b < b1; b++) {
        const uint8_t *blk = src + b * 20;
        const float d = LL_F16(blk), m = LL_F16(blk + 2);
        for (int i = 0; i < 16; i++) {
            dst[b * 32 + i] = d * (float)(blk[4 + i] & 15) + m;
            dst[b * 32 + i + 16] = d * (float)(blk[4 + i] >> 4) + m;
        }
    }
}

static inline void ll_dequant_q4_k(const uint8_t *src, float *dst, ptrdiff_t b0, ptrdiff_t b1) {
    for (ptrdiff_t b = b0; b < b1; b++) {
        const uint8_t *blk = src + b * 144, *sc = blk + 4, *qs = blk + 16;
        const float d = LL_F16(blk), dmin = LL_F16(blk + 2);
        float *out = dst + b * 256;
        for (int j = 0; j < 8; j++) {
            int s, m;
            if (j < 4) { s = sc[j] & 63; m = sc[j + 4] & 63; }
            else { s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4); m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4); }
            const float ds = d * (float)s, dm = dmin * (float)m;
            const uint8_t *q = qs + (j / 2) * 32;   /* sub-blocks 2c and 2c+1 share 32 bytes */
            for (int i = 0; i < 32; i++) {
                const int v = (j % 2) ? (q[i] >> 4) : (q[i] & 15);
                out[j * 32 + i] = ds * (float)v - dm;
            }
        }
    }
}

static inline void ll_dequant_q6_k(const uint8_t *src, float *dst, ptrdiff_t b0, ptrdiff_t b1) {
    for (ptrdiff_t b = b0; b < b1; b++) {
        const uint8_t *blk = src + b * 210;
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *scales = (const int8_t *)(blk + 192);
        const float d = LL_F16(blk + 208);
        float *out = dst + b * 256;
        for (int half = 0; half < 2; half++) {
            const uint8_t *l = ql + half * 64, *h = qh + half * 32;
            float *o = out + half * 128;
            const int8_t *s = scales + half * 8;
            for (int i = 0; i < 32; i++) {
                const int q1 = (int)((l[i] & 15) | (((h[i] >> 0) & 3) << 4)) - 32;
                const int q2 = (int)((l[i + 32] & 15) | (((h[i] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((l[i] >> 4) | (((h[i] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((l[i + 32] >> 4) | (((h[i] >> 6) & 3) << 4)) - 32;
                o[i] = d * (float)s[i / 16] * (float)q1;
                o[i + 32] = d * (float)s[2 + i / 16] * (float)q2;
                o[i + 64] = d * (float)s[4 + i / 16] * (float)q3;
                o[i + 96] = d * (float)s[6 + i / 16] * (float)q4;
            }
        }
    }
}

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
