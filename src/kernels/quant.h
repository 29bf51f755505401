/* Load-time conversions, one range of rows per call (the caller splits the work): fp32 ->
 * bf16, and [N, K] rows -> the packed panels of gemm.h. (ggml blocks: qgemm.h.) */
#ifndef LL_QUANT_H
#define LL_QUANT_H
#include "../simd/vec.h"
LL_HOT_BEGIN

static inline void ll_f32_to_bf16_n(const float *src, uint16_t *dst, ptrdiff_t i0, ptrdiff_t i1) {
    for (ptrdiff_t i = i0; i < i1; i++) dst[i] = ll_f32_to_bf16(src[i]);
}

/* A stored type | LL_STORED_LE: the row's bytes are little-endian, as in every weight file
 * (safetensors, GGUF); a big-endian machine (s390x) swaps them as it reads them. */
#define LL_STORED_LE 0x100
#define LL_BIG_ENDIAN (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)

/* n values of one stored row from column k0 (type stype: LL_W_F32 / BF16 / F16, | LL_STORED_LE
 * for file bytes) in the element type of wtype (float, or bf16 / f16 bits; rounding to nearest
 * even), into out. n <= LL_PACK_KC where the bytes need swapping. */
#define LL_PACK_KC 64   /* columns converted per row before they are interleaved (even: bf16 pairs) */
static inline void ll_convert_row(const void *row, int stype, ptrdiff_t k0, ptrdiff_t n, int wtype, void *out) {
    const int le = stype & LL_STORED_LE;
    stype &= ~LL_STORED_LE;
    uint32_t swapped[LL_PACK_KC];
    if (LL_BIG_ENDIAN && le) {   /* native copies of the n values, read from k0 */
        if (stype == 0) {
            const uint32_t *s = (const uint32_t *)row + k0;
            for (ptrdiff_t i = 0; i < n; i++) swapped[i] = __builtin_bswap32(s[i]);
        } else {
            const uint16_t *s = (const uint16_t *)row + k0;
            for (ptrdiff_t i = 0; i < n; i++) ((uint16_t *)swapped)[i] = __builtin_bswap16(s[i]);
        }
        row = swapped;
        k0 = 0;
    }
    const float *sf = (const float *)row + k0;
    const uint16_t *sh = (const uint16_t *)row + k0;
    if (stype == wtype) { memcpy(out, (const char *)row + k0 * (stype == 0 ? 4 : 2), (size_t)n * (stype == 0 ? 4 : 2)); return; }
    if (wtype == 0) {              /* fp32 */
        float *o = (float *)out;
        ptrdiff_t i = 0;
        if (stype == 1) for (; i < n; i++) o[i] = ll_bf16_to_f32(sh[i]);
        else {
            for (; i + LL_VF32_LANES <= n; i += LL_VF32_LANES) ll_store(o + i, ll_load_f16(sh + i));
            for (; i < n; i++) o[i] = ll_f16_to_f32(sh[i]);
        }
    } else if (wtype == 1) {       /* bf16 */
        uint16_t *o = (uint16_t *)out;
        ptrdiff_t i = 0;
        if (stype == 0) for (; i < n; i++) o[i] = ll_f32_to_bf16(sf[i]);
        else {   /* a half is never an fp32 denormal, which a vector rounding may flush: 16 at a time */
            for (; i + LL_VF32_LANES <= n; i += LL_VF32_LANES) ll_store_bf16(o + i, ll_load_f16(sh + i));
            for (; i < n; i++) o[i] = ll_f32_to_bf16(ll_f16_to_f32(sh[i]));
        }
    } else {                       /* fp16 */
        uint16_t *o = (uint16_t *)out;
        if (stype == 0) for (ptrdiff_t i = 0; i < n; i++) o[i] = ll_f32_to_f16(sf[i]);
        else            for (ptrdiff_t i = 0; i < n; i++) o[i] = ll_f32_to_f16(ll_bf16_to_f32(sh[i]));
    }
}

/* One packed panel (gemm.h layouts) of type wtype from up to 16 stored rows of k values of type
 * stype: rows[r] for r < nrows, zeros past them (and past k in the last bf16 pair). */
static inline void ll_pack_panel_rows(const void *const *rows, int nrows, int stype, ptrdiff_t k, int wtype,
                                      void *dst) {
    float tf[16][LL_PACK_KC];
    uint16_t th[16][LL_PACK_KC];
    for (ptrdiff_t k0 = 0; k0 < k; k0 += LL_PACK_KC) {
        const ptrdiff_t n = k - k0 < LL_PACK_KC ? k - k0 : LL_PACK_KC;
        for (int r = 0; r < 16; r++) {
            void *t = wtype == 0 ? (void *)tf[r] : (void *)th[r];
            if (r < nrows) ll_convert_row(rows[r], stype, k0, n, wtype, t);
            else memset(t, 0, (size_t)n * (wtype == 0 ? 4 : 2));
            if (wtype == 1 && (n & 1)) th[r][n] = 0;
        }
        if (wtype == 1) {          /* bf16 pairs: [k/2][16][2] */
            uint16_t *d = (uint16_t *)dst + k0 * 16;
            for (ptrdiff_t kp = 0; kp < (n + 1) / 2; kp++, d += 32)
                for (int lane = 0; lane < 16; lane++) {
                    d[2 * lane] = th[lane][2 * kp];
                    d[2 * lane + 1] = th[lane][2 * kp + 1];
                }
        } else if (wtype == 0) {   /* fp32 [k][16] */
            float *d = (float *)dst + k0 * 16;
            for (ptrdiff_t kk = 0; kk < n; kk++, d += 16)
                for (int lane = 0; lane < 16; lane++) d[lane] = tf[lane][kk];
        } else {                   /* fp16 [k][16] */
            uint16_t *d = (uint16_t *)dst + k0 * 16;
            for (ptrdiff_t kk = 0; kk < n; kk++, d += 16)
                for (int lane = 0; lane < 16; lane++) d[lane] = th[lane][kk];
        }
    }
}

/* Rows [N, K] of 2- or 4-byte elements of type wtype -> packed panels p0..p1 (gemm.h layouts). */
static inline void ll_pack_panels(const void *src, void *dst, ptrdiff_t n, ptrdiff_t k, int wtype,
                                  ptrdiff_t p0, ptrdiff_t p1) {
    const size_t es = wtype == 0 ? 4 : 2;
    const ptrdiff_t panel = 16 * (wtype == 1 ? 2 * ((k + 1) / 2) : k);   /* elements */
    for (ptrdiff_t p = p0; p < p1; p++) {
        const void *rows[16];
        const int nrows = (int)(n - p * 16 < 16 ? n - p * 16 : 16);
        for (int r = 0; r < nrows; r++) rows[r] = (const char *)src + (size_t)(p * 16 + r) * (size_t)k * es;
        ll_pack_panel_rows(rows, nrows, wtype, k, wtype, (char *)dst + (size_t)(p * panel) * es);
    }
}
LL_HOT_END
#endif
