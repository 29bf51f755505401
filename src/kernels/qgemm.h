/* Quantized weights kept quantized: ggml block formats repacked into interleaved 16-row panels,
 * int8 activations quantized on the fly, and the GEMM of the two on int8 dot products
 * (vpdpbusd where the CPU has it). One panel, one token tile, one thread per call; the caller
 * splits panels across threads (matmul.h).
 *
 * Packed panel layouts (built once at load by ll_qpack_panels; lite_llm/_kernels/layout.py
 * names them). A panel holds 16 rows r of the [N, K] weight, K in blocks of 32 (b) and, for
 * the K-quants, super-blocks of 256 (8 sub-blocks j of 32). Quants of a 32-block for 16 rows:
 *   nibbles  [4][16][4] bytes = 256 B: byte (v, r, i) = u[r][4v + i] | u[r][16 + 4v + i] << 4
 *   bytes    [8][16][4] bytes = 512 B: byte (g, r, i) = u[r][4g + i]
 *   2 bits   [2][16][4] bytes = 128 B: bits 2c..2c+1 of byte (h, r, i) = u[r][4(4h + c) + i] >> 4
 *   1 bit    [16][4] bytes = 64 B:     bit g of byte (r, i) = u[r][4g + i] >> 4
 * so one 64-byte vector holds 4 consecutive values of each of the 16 rows: vpdpbusd sums them
 * against 4 broadcast activation bytes into 16 int32 lanes, one per row.
 *   Q8_0  block 544 B:  int8 bytes, f16 d[16]                       w = d q
 *   Q4_0  block 288 B:  nibbles, f16 d[16]                          w = d (u - 8)
 *   Q4_1  block 320 B:  nibbles, f16 d[16], f16 m[16]               w = d u + m
 *   Q4_K  super 2368 B: f16 d[16], f16 dmin[16], u8 sc[8][16], u8 mn[8][16], 8 x nibbles
 *                                                                   w = d sc[j] u - dmin mn[j]
 *   Q6_K  super 3360 B: f16 d[16], i8 sc[16][16] (one per 16 values), 8 x (nibbles, 2 bits)
 *                                                                   w = d sc[k / 16] (u - 32)
 *   Q5_0  block 352 B:  nibbles, 1 bit, f16 d[16]                   w = d (u - 16)
 *   Q5_1  block 384 B:  nibbles, 1 bit, f16 d[16], f16 m[16]        w = d u + m
 *   Q5_K  super 2880 B: as Q4_K, with 8 x (nibbles, 1 bit)          w = d sc[j] u - dmin mn[j]
 *   IQ4_NL block 288 B: nibbles, f16 d[16]                          w = d kv[u]
 *   IQ4_XS super 2208 B: f16 d[16], i8 sc[8][16], 8 x nibbles        w = d sc[j] kv[u]
 *   Q2_K  super 1344 B: f16 d[16], f16 dmin[16], u8 sm[16][16] (scale | min << 4, one per 16
 *                       values, as stored), 8 x 2 bits               w = d (sm & 15) u - dmin (sm >> 4)
 *   Q3_K  super 1824 B: f16 d[16], i8 sc[16][16] (one per 16 values), 8 x (2 bits, 1 bit)
 *                                                                   w = d sc[k / 16] (u - 4)
 *   TQ2_0 super 1056 B: f16 d[16], 8 x 2 bits                       w = d (u - 1)
 *   TQ1_0 super 1056 B: as TQ2_0 (its base-3 trits, 5 to a byte, become 2 bits at load)
 *   MXFP4 block 272 B:  nibbles, u8 e[16] (e8m0)                    w = 2^(e - 128) kv4[u]
 *   IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M (the codebook types): the 16 rows'
 *       stored blocks interleaved, their f16 d side by side, then each 4-byte word of the
 *       blocks side by side (ll_iq_row_block), 16 ggml blocks per super-block of 256; each
 *       32-value sub-block is looked up per row into the int8 bytes layout (grid rows of 8 or
 *       4 values, signs applied 8 at a time) with the two scales of its halves, then multiplied
 *       like Q8_0 (ll_iq_decode32; IQ1's +-1/8 offsets become 8 g +- 1 at an eighth the scale).
 * (kv: the 16-value non-linear codebook of IQ4_NL/IQ4_XS; kv4: MXFP4's e2m1 values, doubled.)
 * The 2-bit and 1-bit planes hold the value bits themselves here (ll_i8_bits moves them to
 * bits 0..1 and 2), not the high bits of a nibble as in Q5/Q6.
 * Every byte of the ggml file is kept (sizes equal ggml's, Q4_K's and Q5_K's 6-bit scales
 * widened to bytes: 2.8 % and 2.3 % more, Q3_K's 3.6 %; TQ1_0 is 22 % larger as 2 bits);
 * f16 values stay in the machine's byte order.
 *
 * Activations (ll_qact): each row of K values in blocks of 32 quantized symmetrically,
 * q = rint(x / d), d = max|x| / 127, with s = d * (sum of q) over each half-block of 16 (the
 * offset and min terms: d_w (u - 8) . x = d_w (d_x sum u q - 8 s)) and n = sum of q over each
 * block, an integer: signed weights run as w + 128 where the dot product takes unsigned bytes
 * (ll_signed_block_dot), and 128 n comes off the int32 sum before it becomes float, so the
 * result is the signed product's, bit for bit.
 */
#ifndef LL_QGEMM_H
#define LL_QGEMM_H
#include "../simd/vec.h"
#include "iq_grids.h"
LL_HOT_BEGIN

enum { LL_W_Q8_0 = 3, LL_W_Q4_0 = 4, LL_W_Q4_1 = 5, LL_W_Q4_K = 6, LL_W_Q6_K = 7, LL_W_Q5_0 = 8,
       LL_W_Q5_1 = 9, LL_W_Q5_K = 10, LL_W_IQ4_NL = 11, LL_W_IQ4_XS = 12, LL_W_Q2_K = 13, LL_W_Q3_K = 14,
       LL_W_TQ2_0 = 15, LL_W_TQ1_0 = 16, LL_W_MXFP4 = 17, LL_W_IQ2_XXS = 18, LL_W_IQ2_XS = 19, LL_W_IQ2_S = 20,
       LL_W_IQ3_XXS = 21, LL_W_IQ3_S = 22, LL_W_IQ1_S = 23, LL_W_IQ1_M = 24 };
/* IQ4_NL / IQ4_XS's 16 values and MXFP4's (e2m1, doubled), each list once: the tables below as
 * stored, and as the dot products take them: where those take unsigned bytes (VNNI), each value
 * + 128 (ll_signed_block_dot's bias, looked up instead of applied). */
#define LL_IQ4_VALUES(F) F(-127) F(-104) F(-83) F(-65) F(-49) F(-35) F(-22) F(-10) F(1) F(13) F(25) F(38) F(53) \
                         F(69) F(89) F(113)
#define LL_MXFP4_VALUES(F) F(0) F(1) F(2) F(3) F(4) F(6) F(8) F(12) F(0) F(-1) F(-2) F(-3) F(-4) F(-6) F(-8) F(-12)
#define LL_AS_IS(v) (v),
static const int8_t ll_iq4_values[16] = {LL_IQ4_VALUES(LL_AS_IS)};
static const int8_t ll_mxfp4_values[16] = {LL_MXFP4_VALUES(LL_AS_IS)};
#undef LL_AS_IS
#ifdef LL_I8DOT_FULL_U8
#define LL_BIASED(v) (int8_t)(uint8_t)((v) + 128),
static const int8_t ll_iq4_dot_values[16] = {LL_IQ4_VALUES(LL_BIASED)};
static const int8_t ll_mxfp4_dot_values[16] = {LL_MXFP4_VALUES(LL_BIASED)};
#undef LL_BIASED
#define LL_DOT_VALUES_BIASED 1
#else
#define ll_iq4_dot_values ll_iq4_values
#define ll_mxfp4_dot_values ll_mxfp4_values
#define LL_DOT_VALUES_BIASED 0
#endif
#define LL_QT 8   /* tokens per register tile */

LL_INLINE int ll_wtype_is_quant(int wtype) { return wtype >= LL_W_Q8_0 && wtype <= LL_W_IQ1_M; }
LL_INLINE int ll_wtype_is_codebook(int wtype) { return wtype >= LL_W_IQ2_XXS && wtype <= LL_W_IQ1_M; }
/* the codebook types whose sub-blocks have one scale (both 16-value halves the same) */
LL_INLINE int ll_iq_one_scale(int wtype) {
    return wtype == LL_W_IQ2_XXS || wtype == LL_W_IQ3_XXS || wtype == LL_W_IQ3_S || wtype == LL_W_IQ1_S;
}

/* MXFP4's block scale: e8m0 (2^(e - 127)) halved, as ggml_e8m0_to_fp32_half (the values are doubled) */
LL_INLINE float ll_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f; memcpy(&f, &bits, 4); return f;
}

#ifndef LL_VEC_PLAIN
/* ll_e8m0_half of the 16 bytes at e, in lanes: 2^(e - 1) as float bits (e - 1) << 23, and the two
 * subnormals (e + 1) << 21 below e = 2. off: r - 3 in lane r (each lane reads the 4 bytes ending
 * at its own, so no read passes e + 16). */
LL_INLINE ll_vf32 ll_e8m0_half16(const uint8_t *e, ll_vi32 off) {
#ifdef LL_HAVE_I32_LOAD_U8   /* the bytes widened in one load where the backend has it */
    (void)off;
    const ll_vi32 v = ll_i32_load_u8(e);
#else
    const ll_vi32 v = ll_i32_shr(ll_i32_le(ll_i8_gather4(e, off)), 24);
#endif
    const ll_vi32 big = ll_i32_shl(ll_i32_sub(v, ll_i32_set1(1)), 23);
    const ll_vi32 small = ll_i32_shl(ll_i32_add(v, ll_i32_set1(1)), 21);
    const ll_vi32 below2 = ll_i32_sub(ll_i32_set1(0), ll_i32_shr(ll_i32_sub(v, ll_i32_set1(2)), 31));   /* all ones where e < 2 */
    return ll_f32_of_i32(ll_i32_xor(big, ll_i32_and(ll_i32_xor(big, small), below2)));
}
#endif

/* Elements per (super-)block and bytes of one packed (super-)block of a panel. */
LL_INLINE ptrdiff_t ll_qblock(int wtype) {
    return wtype == LL_W_Q8_0 || wtype == LL_W_Q4_0 || wtype == LL_W_Q4_1 || wtype == LL_W_Q5_0 || wtype == LL_W_Q5_1
        || wtype == LL_W_IQ4_NL || wtype == LL_W_MXFP4 ? 32 : 256;
}
LL_INLINE ptrdiff_t ll_qblock_bytes(int wtype) {
    switch (wtype) {
    case LL_W_Q8_0: return 544;
    case LL_W_Q4_0: return 288;
    case LL_W_Q4_1: return 320;
    case LL_W_Q4_K: return 2368;
    case LL_W_Q5_0: return 352;
    case LL_W_Q5_1: return 384;
    case LL_W_Q5_K: return 2880;
    case LL_W_IQ4_NL: return 288;
    case LL_W_IQ4_XS: return 2208;
    case LL_W_Q2_K: return 1344;
    case LL_W_Q3_K: return 1824;
    case LL_W_TQ2_0: case LL_W_TQ1_0: return 1056;
    case LL_W_MXFP4: return 272;
    case LL_W_IQ2_XXS: return 16 * 66;
    case LL_W_IQ2_XS: return 16 * 74;
    case LL_W_IQ2_S: return 16 * 82;
    case LL_W_IQ3_XXS: return 16 * 98;
    case LL_W_IQ3_S: return 16 * 110;
    case LL_W_IQ1_S: return 16 * 50;
    case LL_W_IQ1_M: return 16 * 56;
    default: return 3360;
    }
}
LL_INLINE ptrdiff_t ll_qpanel_bytes(int wtype, ptrdiff_t k) { return k / ll_qblock(wtype) * ll_qblock_bytes(wtype); }

/* bytes of one ggml block of wtype, and its elements */
LL_INLINE ptrdiff_t ll_ggml_block_bytes(int wtype) {
    switch (wtype) {
    case LL_W_Q8_0: return 34;
    case LL_W_Q4_0: return 18;
    case LL_W_Q4_1: return 20;
    case LL_W_Q4_K: return 144;
    case LL_W_Q5_0: return 22;
    case LL_W_Q5_1: return 24;
    case LL_W_Q5_K: return 176;
    case LL_W_IQ4_NL: return 18;
    case LL_W_IQ4_XS: return 136;
    case LL_W_Q2_K: return 84;
    case LL_W_Q3_K: return 110;
    case LL_W_TQ2_0: return 66;
    case LL_W_TQ1_0: return 54;
    case LL_W_MXFP4: return 17;
    case LL_W_IQ2_XXS: return 66;
    case LL_W_IQ2_XS: return 74;
    case LL_W_IQ2_S: return 82;
    case LL_W_IQ3_XXS: return 98;
    case LL_W_IQ3_S: return 110;
    case LL_W_IQ1_S: return 50;
    case LL_W_IQ1_M: return 56;
    default: return 210;
    }
}

typedef struct {
    const int8_t *q;   /* [T][ld] quantized values */
    const float *d;    /* [T][ld / 32] scale of each block */
    const float *s;    /* [T][ld / 16] d x sum of q over each half-block */
    const int32_t *n;  /* [T][ld / 16] sum of q over each half-block */
    ptrdiff_t ld;      /* K */
} ll_qact;

/* x advanced by t tokens (every array by t of its rows) */
LL_INLINE ll_qact ll_qact_rows(const ll_qact *x, ptrdiff_t t) {
    ll_qact a = *x;
    a.q += t * x->ld; a.d += t * (x->ld / 32); a.s += t * (x->ld / 16); a.n += t * (x->ld / 16);
    return a;
}

/* ---- activations --------------------------------------------------------------------- */

static inline void ll_quantize_block_q8(const float *x, int8_t *q, float *d, float *s, int32_t *n) {
    float amax = 0.f;
    for (int i = 0; i < 32; i++) { const float a = fabsf(x[i]); amax = a > amax ? a : amax; }
    const float dd = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    int s0 = 0, s1 = 0;
    for (int i = 0; i < 16; i++) { const int v = (int)nearbyintf(x[i] * id); q[i] = (int8_t)v; s0 += v; }
    for (int i = 16; i < 32; i++) { const int v = (int)nearbyintf(x[i] * id); q[i] = (int8_t)v; s1 += v; }
    *d = dd;
    s[0] = dd * (float)s0;
    s[1] = dd * (float)s1;
    n[0] = s0;
    n[1] = s1;
}

/* Rows t0..t1 of fp32 x [T][ldx] (k values each, k % 32 == 0) into the int8 rows of `a`. */
static inline void ll_quantize_rows_q8(const float *x, ptrdiff_t ldx, ptrdiff_t t0, ptrdiff_t t1, ptrdiff_t k,
                                       int8_t *q, float *d, float *s, int32_t *n) {
    for (ptrdiff_t t = t0; t < t1; t++)
        for (ptrdiff_t b = 0; b < k / 32; b++)
            ll_quantize_block_q8(x + t * ldx + 32 * b, q + t * k + 32 * b, d + t * (k / 32) + b,
                                 s + t * (k / 16) + 2 * b, n + t * (k / 16) + 2 * b);
}

/* ---- the codebook types: one 32-value sub-block of one stored block ---------------------- */

LL_INLINE uint64_t ll_ld64(const void *p) { uint64_t v; memcpy(&v, p, 8); return v; }
LL_INLINE uint32_t ll_le32_at(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
#define LL_LE16_AT(p) ((uint16_t)((p)[0] | ((p)[1] << 8)))

/* A packed super-block of a codebook type holds its 16 rows' stored blocks interleaved: the
 * f16 d at the front of each block (all types but IQ1_M) as 16 u16 (row r's at 2 r), then each
 * 4-byte word of the blocks as 16 words (row r's at 4 r); the bytes at offset o of a block
 * (o >= the head's 2 bytes) start at 16 o, so one vector load reads a field of all 16 rows. */
LL_INLINE int ll_iq_head_bytes(int wtype) { return wtype == LL_W_IQ1_M ? 0 : 2; }
/* row r's stored block back into blk, from its place in the packed super-block wp */
LL_INLINE void ll_iq_row_block(const uint8_t *wp, int wtype, int r, uint8_t *blk) {
    const int hb = ll_iq_head_bytes(wtype), gb = (int)ll_ggml_block_bytes(wtype);
    memcpy(blk, wp + hb * r, (size_t)hb);
    for (int o = hb; o < gb; o += 4) memcpy(blk + o, wp + 16 * o + 4 * r, 4);
}
/* the inverse: row r's stored block blk into the packed super-block wp */
LL_INLINE void ll_iq_put_row_block(const uint8_t *blk, int wtype, int r, uint8_t *wp) {
    const int hb = ll_iq_head_bytes(wtype), gb = (int)ll_ggml_block_bytes(wtype);
    memcpy(wp + hb * r, blk, (size_t)hb);
    for (int o = hb; o < gb; o += 4) memcpy(wp + 16 * o + 4 * r, blk + o, 4);
}

/* 8 grid values (bytes, memory order) with the minus signs of sign byte sgn, into values
 * 8 q .. 8 q + 7 of lane r of a bytes layout: (v ^ m) + (m & 1) negates the bytes of mask m
 * (no carry leaves a byte: grid values are never 0). */
LL_INLINE void ll_iq_put8(uint8_t *dst, int r, int q, const uint8_t *grid8, int sgn) {
    const uint64_t m = ll_ld64(ll_iq_sign_mask[sgn]);
    const uint64_t v = (ll_ld64(grid8) ^ m) + (m & 0x0101010101010101ull);
    memcpy(dst + 64 * (2 * q) + 4 * r, &v, 4);
    memcpy(dst + 64 * (2 * q + 1) + 4 * r, (const uint8_t *)&v + 4, 4);
}

/* IQ1: 8 grid values g (-1, 0, 1) as 8 g + delta (delta +-1), values 8 q .. 8 q + 7 of lane r */
LL_INLINE void ll_iq1_put8(uint8_t *dst, int r, int q, const int8_t *grid8, int delta) {
    for (int i = 0; i < 8; i++) dst[64 * (2 * q + i / 4) + 4 * r + i % 4] = (uint8_t)(int8_t)(8 * grid8[i] + delta);
}

/* Values 32 j .. 32 j + 31 of the stored block blk (wtype a codebook type) as int8 into lane r
 * of dst, a bytes layout [8][16][4] (value 4 g + i at 64 g + 4 r + i), and s[0], s[1]: the
 * scales of its first and second 16 values (value = s * int8, gguf.quants' floats exactly). */
LL_INLINE void ll_iq_decode32(const uint8_t *blk, int wtype, int j, uint8_t *dst, int r, float *s) {
    switch (wtype) {
    case LL_W_IQ2_XXS: {   /* f16 d, 8 bytes a sub-block: 4 grid indices, then 4 x 7 sign bits + 4-bit scale */
        const float d = ll_f16_to_f32(LL_LE16_AT(blk));
        const uint8_t *q = blk + 2 + 8 * j;
        const uint32_t aux = ll_le32_at(q + 4);
        s[0] = s[1] = d * (0.5f + (float)(aux >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) ll_iq_put8(dst, r, l, ll_iq2xxs_grid[q[l]], ll_iq_ksigns[(aux >> (7 * l)) & 127]);
        return;
    }
    case LL_W_IQ2_XS: {    /* f16 d, u16 qs[32] (9-bit index | 7 sign bits), u8 scales[8] (two 4-bit) */
        const float d = ll_f16_to_f32(LL_LE16_AT(blk));
        const uint8_t sc = blk[66 + j];
        s[0] = d * (0.5f + (float)(sc & 15)) * 0.25f;
        s[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            const uint16_t v = LL_LE16_AT(blk + 2 + 2 * (4 * j + l));
            ll_iq_put8(dst, r, l, ll_iq2xs_grid[v & 511], ll_iq_ksigns[v >> 9]);
        }
        return;
    }
    case LL_W_IQ2_S: {     /* f16 d, qs[32], signs[32], qh[8] (2 high index bits each), scales[8] */
        const float d = ll_f16_to_f32(LL_LE16_AT(blk));
        const uint8_t sc = blk[74 + j];
        s[0] = d * (0.5f + (float)(sc & 15)) * 0.25f;
        s[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            const int idx = blk[2 + 4 * j + l] | (((blk[66 + j] >> (2 * l)) & 3) << 8);
            ll_iq_put8(dst, r, l, ll_iq2s_grid[idx], blk[34 + 4 * j + l]);
        }
        return;
    }
    case LL_W_IQ3_XXS: {   /* f16 d, qs[64] (one grid row of 4 each), u32 per sub-block: 4 x 7 sign bits + scale */
        const float d = ll_f16_to_f32(LL_LE16_AT(blk));
        const uint32_t aux = ll_le32_at(blk + 66 + 4 * j);
        s[0] = s[1] = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        for (int l = 0; l < 4; l++) {
            uint8_t g[8];
            memcpy(g, ll_iq3xxs_grid[blk[2 + 8 * j + 2 * l]], 4);
            memcpy(g + 4, ll_iq3xxs_grid[blk[2 + 8 * j + 2 * l + 1]], 4);
            ll_iq_put8(dst, r, l, g, ll_iq_ksigns[(aux >> (7 * l)) & 127]);
        }
        return;
    }
    case LL_W_IQ3_S: {     /* f16 d, qs[64], qh[8] (high index bit each), signs[32], scales[4] (two 4-bit) */
        const float d = ll_f16_to_f32(LL_LE16_AT(blk));
        s[0] = s[1] = d * (float)(1 + 2 * ((blk[106 + j / 2] >> (4 * (j % 2))) & 15));
        for (int l = 0; l < 4; l++) {
            uint8_t g[8];
            for (int h = 0; h < 2; h++) {
                const int qi = 8 * j + 2 * l + h;
                memcpy(g + 4 * h, ll_iq3s_grid[blk[2 + qi] | (((blk[66 + qi / 8] >> (qi % 8)) & 1) << 8)], 4);
            }
            ll_iq_put8(dst, r, l, g, blk[74 + 4 * j + l]);
        }
        return;
    }
    case LL_W_IQ1_S: {     /* f16 d, qs[32], u16 qh[8]: 4 x 3 high index bits, 3-bit scale, delta sign */
        const float d = ll_f16_to_f32(LL_LE16_AT(blk));
        const uint16_t qh = LL_LE16_AT(blk + 34 + 2 * j);
        s[0] = s[1] = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
        for (int l = 0; l < 4; l++)
            ll_iq1_put8(dst, r, l, ll_iq1s_grid[blk[2 + 4 * j + l] | (((qh >> (3 * l)) & 7) << 8)], qh & 0x8000 ? -1 : 1);
        return;
    }
    default: {             /* IQ1_M: qs[32], qh[16] (a nibble per group: 3 index bits, delta sign), u16 scales[4]
                            * (3-bit scales, and the f16 d in their top nibbles) */
        const uint8_t *sp = blk + 48;
        const uint16_t dh = (uint16_t)((LL_LE16_AT(sp) >> 12) | ((LL_LE16_AT(sp + 2) >> 8) & 0xf0)
                                       | ((LL_LE16_AT(sp + 4) >> 4) & 0xf00) | (LL_LE16_AT(sp + 6) & 0xf000));
        const float d = ll_f16_to_f32(dh);
        for (int h = 0; h < 2; h++) {
            const int si = 2 * j + h;
            s[h] = d * (float)(2 * ((LL_LE16_AT(sp + 2 * (si / 4)) >> (3 * (si % 4))) & 7) + 1) * 0.125f;
        }
        for (int l = 0; l < 4; l++) {
            const int gi = 4 * j + l, nib = (blk[32 + gi / 2] >> (4 * (gi % 2))) & 15;
            ll_iq1_put8(dst, r, l, ll_iq1s_grid[blk[gi] | ((nib & 7) << 8)], nib & 8 ? -1 : 1);
        }
        return;
    }
    }
}

#ifndef LL_IQ_ONE_ROW
/* ---- the codebook types, 16 rows at once: table rows gathered into the bytes layout ---------
 * The same values as ll_iq_decode32 (its spec), for the 16 stored blocks of a panel's super-block
 * (ll_iq_row_block's layout): w[g] lane r = values 4 g .. 4 g + 3 of row r's sub-block j. The IQ2 and
 * IQ3 grids hold magnitudes (< 64) and their minus signs come as masks neg[g] (returns 1: bytes
 * 0xff, or one bit a byte where LL_HAVE_I8_BITS);
 * IQ1's values are signed in w (returns 0). s0, s1: the scales of the two halves, from the rows'
 * d (dv) in ll_iq_decode32's order of float operations. */

/* the 4 bytes at offset o of each of the 16 rows' stored blocks, row r's in lane r */
LL_INLINE ll_vi8 ll_iq_lanes(const uint8_t *wp, int o) { return ll_i8_load(wp + 16 * o); }

/* 7 sign bits per byte -> 8: bit 7 of each byte the parity of the other 7 (ll_iq_ksigns) */
LL_INLINE ll_vi32 ll_iq_ksigns4(ll_vi32 b) {
    ll_vi32 p = ll_i32_xor(b, ll_i32_shr(b, 4));
    p = ll_i32_xor(p, ll_i32_shr(p, 2));
    p = ll_i32_xor(p, ll_i32_shr(p, 1));
    return ll_i32_or(b, ll_i32_shl(ll_i32_and(p, ll_i32_set1(0x01010101)), 7));
}
/* byte (field) of each lane of the little-endian words a */
LL_INLINE ll_vi32 ll_i32_field(ll_vi32 a, int shift, int32_t mask) { return ll_i32_and(ll_i32_shr(a, shift), ll_i32_set1(mask)); }
/* bytes k, k + 1 of each lane of the little-endian words q as its two 16-bit halves */
LL_INLINE ll_vi32 ll_iq_index_pair(ll_vi32 q, int k) {
    return ll_i32_or(ll_i32_field(q, 8 * k, 255), ll_i32_and(ll_i32_shl(ll_i32_shr(q, 8 * (k + 1)), 16), ll_i32_set1(0xff0000)));
}
/* the rows' scales: dv (0.5 + u) x by, as (d (0.5 + u)) by */
LL_INLINE ll_vf32 ll_iq_half_scale(ll_vf32 dv, ll_vi32 u, float by) {
    return ll_mul(ll_mul(dv, ll_add(ll_set1(0.5f), ll_i32_to_f32(u))), ll_set1(by));
}
/* 8 g + 1 for g = -1, 0, 1 in a nibble (IQ1's grid values, before the delta) */
static const int8_t ll_iq1_plus1[16] = {1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -7};

#ifdef LL_HAVE_I8_BITS
/* The minus signs of group g as one bit a byte (vec.h's ll_m64), straight from the 32 sign bits
 * of each lane (ll_i8_bitmask); the codes of IQ2_XXS and IQ3_XXS rows from byte tables, their
 * values as bytes picked from them (ll_i8_fields) and looked up (ll_i8_lut64). */
typedef ll_m64 ll_iq_negs;
/* an ll_i8_fields / ll_i8_bitmask control: bytes 0..3 (the even lane of each word) o0..o3,
 * bytes 4..7 (the odd lane) 32 + o0..o3; ll_iq_ctl: o_i = e + s i */
LL_INLINE uint64_t ll_iq_ctl4(int o0, int o1, int o2, int o3) {
    const int o[4] = {o0, o1, o2, o3};
    uint64_t c = 0;
    for (int i = 0; i < 4; i++) c |= (uint64_t)(o[i] & 63) << (8 * i) | (uint64_t)((32 + o[i]) & 63) << (8 * (4 + i));
    return c;
}
LL_INLINE uint64_t ll_iq_ctl(int e, int s) { return ll_iq_ctl4(e, e + s, e + 2 * s, e + 3 * s); }
/* each lane's code bytes of IQ3_XXS grid rows 2 m and 2 m + 1 (m = 0, 1): low, high, low, high
 * (byte 2 m + h of the lane in ll_i8_pick2's first table, then in its second) */
#define LL_IQ3_PICK_LANE(r, m) 4 * (r) + 2 * (m), 64 + 4 * (r) + 2 * (m), 4 * (r) + 2 * (m) + 1, 64 + 4 * (r) + 2 * (m) + 1
#define LL_IQ3_PICK(m) {LL_IQ3_PICK_LANE(0, m), LL_IQ3_PICK_LANE(1, m), LL_IQ3_PICK_LANE(2, m), LL_IQ3_PICK_LANE(3, m), \
    LL_IQ3_PICK_LANE(4, m), LL_IQ3_PICK_LANE(5, m), LL_IQ3_PICK_LANE(6, m), LL_IQ3_PICK_LANE(7, m), \
    LL_IQ3_PICK_LANE(8, m), LL_IQ3_PICK_LANE(9, m), LL_IQ3_PICK_LANE(10, m), LL_IQ3_PICK_LANE(11, m), \
    LL_IQ3_PICK_LANE(12, m), LL_IQ3_PICK_LANE(13, m), LL_IQ3_PICK_LANE(14, m), LL_IQ3_PICK_LANE(15, m)}
static const uint8_t ll_iq3_pick[2][64] __attribute__((aligned(64))) = {LL_IQ3_PICK(0), LL_IQ3_PICK(1)};
#else
typedef ll_vi8 ll_iq_negs;   /* minus signs as 0xff bytes */
#endif
/* each lane's 32 sign bits from its word of four 7-bit sign fields (IQ2_XXS, IQ3_XXS): byte l
 * the 8 sign bits of field l (ll_iq_ksigns) */
LL_INLINE ll_vi32 ll_iq_signs7x4(ll_vi32 aux) {
#ifdef LL_HAVE_I8_BITS
    return ll_i8_lut128(ll_i8_fields(aux, ll_iq_ctl(0, 7)), ll_iq_ksigns);
#else
    return ll_iq_ksigns4(ll_i32_or(ll_i32_or(ll_i32_and(aux, ll_i32_set1(0x7f)), ll_i32_and(ll_i32_shl(aux, 1), ll_i32_set1(0x7f00))),
                                   ll_i32_or(ll_i32_and(ll_i32_shl(aux, 2), ll_i32_set1(0x7f0000)),
                                             ll_i32_and(ll_i32_shl(aux, 3), ll_i32_set1(0x7f000000)))));
#endif
}
LL_INLINE ll_vi8 ll_iq_neg(ll_vi8 x, ll_iq_negs m) {
#ifdef LL_HAVE_I8_BITS
    return ll_i8_neg_mask(x, m);
#else
    return ll_i8_neg_where(x, m);
#endif
}

LL_INLINE int ll_iq_decode16(const uint8_t *wp, int wtype, int j, ll_vf32 dv, ll_vi8 w[8],
                             ll_iq_negs neg[8], ll_vf32 *s0, ll_vf32 *s1) {
    ll_vi32 full;   /* the 32 sign bits of each row's sub-block: bit 4 g + i for value 4 g + i */
    switch (wtype) {
    case LL_W_IQ2_XXS: {   /* 4 grid indices, then 4 x 7 sign bits + 4-bit scale */
        ll_vi8 a, b;
        a = ll_iq_lanes(wp, 2 + 8 * j); b = ll_iq_lanes(wp, 6 + 8 * j);
        const ll_vi32 q = ll_i32_le(a), aux = ll_i32_le(b);
#ifdef LL_HAVE_I8_BITS   /* group g: 2-bit fields of row g / 2's code byte g % 2 */
        const ll_vi8 clo = ll_i8_lut256(a, ll_iq2xxs_code8), chi = ll_i8_lut256(a, ll_iq2xxs_code8 + 256);
        LL_UNROLL(8)
        for (int g = 0; g < 8; g++) w[g] = ll_i8_lut64(ll_i8_fields(g & 1 ? chi : clo, ll_iq_ctl(8 * (g / 2), 2)), ll_iq2_levels64);
        (void)q;
#elif defined(LL_HAVE_U16_LUT256)   /* the rows' 2-bit codes, two groups a lane, from tables in registers */
        LL_UNROLL(2)
        for (int p = 0; p < 2; p++) {
            const ll_vi32 c = ll_i32_lut256_u16(ll_iq_index_pair(q, 2 * p), ll_iq2xxs_code);
            LL_UNROLL(4)
            for (int b = 0; b < 4; b++) w[4 * p + b] = ll_i8_expand2(c, b, ll_iq2_levels);
        }
#else
        LL_UNROLL(4)
        for (int l = 0; l < 4; l++)
            ll_i8_gather8(ll_iq2xxs_grid, ll_i32_shl(ll_i32_field(q, 8 * l, 255), 3), &w[2 * l], &w[2 * l + 1]);
#endif
        full = ll_iq_signs7x4(aux);
        *s0 = *s1 = ll_iq_half_scale(dv, ll_i32_shr(aux, 28), 0.25f);
        break;
    }
    case LL_W_IQ2_XS: {    /* u16 qs (9-bit index | 7 sign bits), scales[8] at 66 (two 4-bit) */
        ll_vi8 a, b;
        a = ll_iq_lanes(wp, 2 + 8 * j); b = ll_iq_lanes(wp, 6 + 8 * j);
        const ll_vi32 lo = ll_i32_le(a), hi = ll_i32_le(b);
        ll_i8_gather8(ll_iq2xs_grid, ll_i32_shl(ll_i32_field(lo, 0, 511), 3), &w[0], &w[1]);
        ll_i8_gather8(ll_iq2xs_grid, ll_i32_shl(ll_i32_field(lo, 16, 511), 3), &w[2], &w[3]);
        ll_i8_gather8(ll_iq2xs_grid, ll_i32_shl(ll_i32_field(hi, 0, 511), 3), &w[4], &w[5]);
        ll_i8_gather8(ll_iq2xs_grid, ll_i32_shl(ll_i32_field(hi, 16, 511), 3), &w[6], &w[7]);
        full = ll_iq_ksigns4(ll_i32_or(ll_i32_or(ll_i32_field(lo, 9, 0x7f), ll_i32_field(lo, 17, 0x7f00)),
                                       ll_i32_or(ll_i32_and(ll_i32_shl(hi, 7), ll_i32_set1(0x7f0000)),
                                                 ll_i32_field(hi, 1, 0x7f000000))));
        const ll_vi32 sc = ll_i32_field(ll_i32_le(ll_iq_lanes(wp, 66 + 4 * (j / 4))), 8 * (j % 4), 255);
        *s0 = ll_iq_half_scale(dv, ll_i32_and(sc, ll_i32_set1(15)), 0.25f);
        *s1 = ll_iq_half_scale(dv, ll_i32_shr(sc, 4), 0.25f);
        break;
    }
    case LL_W_IQ2_S: {     /* qs[32], signs[32] at 34, qh[8] at 66 (2 high index bits each), scales[8] at 74 */
        const ll_vi32 q = ll_i32_le(ll_iq_lanes(wp, 2 + 4 * j));
        const ll_vi32 qh = ll_i32_field(ll_i32_le(ll_iq_lanes(wp, 66 + 4 * (j / 4))), 8 * (j % 4), 255);
        LL_UNROLL(4)
        for (int l = 0; l < 4; l++) {
            const ll_vi32 idx = ll_i32_or(ll_i32_field(q, 8 * l, 255), ll_i32_shl(ll_i32_field(qh, 2 * l, 3), 8));
            ll_i8_gather8(ll_iq2s_grid, ll_i32_shl(idx, 3), &w[2 * l], &w[2 * l + 1]);
        }
        full = ll_i32_le(ll_iq_lanes(wp, 34 + 4 * j));
        const ll_vi32 sc = ll_i32_field(ll_i32_le(ll_iq_lanes(wp, 74 + 4 * (j / 4))), 8 * (j % 4), 255);
        *s0 = ll_iq_half_scale(dv, ll_i32_and(sc, ll_i32_set1(15)), 0.25f);
        *s1 = ll_iq_half_scale(dv, ll_i32_shr(sc, 4), 0.25f);
        break;
    }
    case LL_W_IQ3_XXS: {   /* qs[64] (two grid rows of 4 per 8 values), u32 at 66 + 4 j: 4 x 7 sign bits + scale */
        ll_vi8 a, b;
        a = ll_iq_lanes(wp, 2 + 8 * j); b = ll_iq_lanes(wp, 6 + 8 * j);
        const ll_vi32 qa = ll_i32_le(a), qb = ll_i32_le(b);
#ifdef LL_HAVE_I8_BITS   /* group h: row h's two code bytes side by side in each lane, a nibble of each */
        LL_UNROLL(2)
        for (int p = 0; p < 2; p++) {
            const ll_vi8 idx = p ? b : a;
            const ll_vi8 clo = ll_i8_lut256(idx, ll_iq3xxs_code8), chi = ll_i8_lut256(idx, ll_iq3xxs_code8 + 256);
            const ll_vi8 c01 = ll_i8_pick2(clo, chi, ll_i8_load(ll_iq3_pick[0])), c23 = ll_i8_pick2(clo, chi, ll_i8_load(ll_iq3_pick[1]));
            LL_UNROLL(4)
            for (int m = 0; m < 4; m++) {
                const int o = 16 * (m % 2);
                w[4 * p + m] = ll_i8_lut64(ll_i8_fields(m < 2 ? c01 : c23, ll_iq_ctl4(o, o + 8, o + 4, o + 12)), ll_iq3_levels64);
            }
        }
        (void)qa; (void)qb;
#elif defined(LL_HAVE_U16_LUT256)   /* the rows' nibble codes, two grid rows a lane */
        LL_UNROLL(4)
        for (int p = 0; p < 4; p++) {
            const ll_vi32 c = ll_i32_lut256_u16(ll_iq_index_pair(p < 2 ? qa : qb, 2 * (p % 2)), ll_iq3xxs_code);
            w[2 * p] = ll_i8_expand4(c, 0, ll_iq3_levels);
            w[2 * p + 1] = ll_i8_expand4(c, 1, ll_iq3_levels);
        }
#else
        LL_UNROLL(8)
        for (int h = 0; h < 8; h++)
            w[h] = ll_i8_gather4(ll_iq3xxs_grid, ll_i32_shl(ll_i32_field(h < 4 ? qa : qb, 8 * (h % 4), 255), 2));
#endif
        const ll_vi32 aux = ll_i32_le(ll_iq_lanes(wp, 66 + 4 * j));
        full = ll_iq_signs7x4(aux);
        *s0 = *s1 = ll_iq_half_scale(dv, ll_i32_shr(aux, 28), 0.5f);
        break;
    }
    case LL_W_IQ3_S: {     /* qs[64], qh[8] at 66 (high index bit each), signs[32] at 74, scales[4] at 106 */
        ll_vi8 a, b;
        a = ll_iq_lanes(wp, 2 + 8 * j); b = ll_iq_lanes(wp, 6 + 8 * j);
        const ll_vi32 qa = ll_i32_le(a), qb = ll_i32_le(b);
        const ll_vi32 qh = ll_i32_field(ll_i32_le(ll_iq_lanes(wp, 66 + 4 * (j / 4))), 8 * (j % 4), 255);
        LL_UNROLL(8)
        for (int h = 0; h < 8; h++) {
            const ll_vi32 idx = ll_i32_or(ll_i32_field(h < 4 ? qa : qb, 8 * (h % 4), 255), ll_i32_shl(ll_i32_field(qh, h, 1), 8));
            w[h] = ll_i8_gather4(ll_iq3s_grid, ll_i32_shl(idx, 2));
        }
        full = ll_i32_le(ll_iq_lanes(wp, 74 + 4 * j));
        const ll_vi32 nib = ll_i32_field(ll_i32_le(ll_iq_lanes(wp, 106)), 8 * (j / 2) + 4 * (j % 2), 15);
        *s0 = *s1 = ll_mul(dv, ll_i32_to_f32(ll_i32_or(ll_i32_shl(nib, 1), ll_i32_set1(1))));
        break;
    }
    case LL_W_IQ1_S: {     /* qs[32], u16 qh[8] at 34: 4 x 3 high index bits, 3-bit scale, delta sign */
        const ll_vi32 q = ll_i32_le(ll_iq_lanes(wp, 2 + 4 * j));
        const ll_vi32 qh = ll_i32_field(ll_i32_le(ll_iq_lanes(wp, 34 + 4 * (j / 2))), 16 * (j % 2), 0xffff);
        const ll_vi8 minus2 = ll_i8_of_i32(ll_i32_and(ll_i32_sub(ll_i32_set1(0), ll_i32_shr(qh, 15)), ll_i32_set1(0x02020202)));
        LL_UNROLL(4)
        for (int l = 0; l < 4; l++) {
            const ll_vi32 idx = ll_i32_or(ll_i32_field(q, 8 * l, 255), ll_i32_shl(ll_i32_field(qh, 3 * l, 7), 8));
            ll_i8_gather8(ll_iq1s_grid, ll_i32_shl(idx, 3), &w[2 * l], &w[2 * l + 1]);
            LL_UNROLL(2)
            for (int h = 0; h < 2; h++) w[2 * l + h] = ll_i8_sub(ll_i8_lut16(ll_i8_lo4(w[2 * l + h]), ll_iq1_plus1), minus2);
        }
        *s0 = *s1 = ll_mul(ll_mul(dv, ll_i32_to_f32(ll_i32_or(ll_i32_shl(ll_i32_field(qh, 12, 7), 1), ll_i32_set1(1)))),
                           ll_set1(0.125f));
        return 0;
    }
    default: {             /* IQ1_M: qs[32], qh[16] at 32 (a nibble per group: 3 index bits, delta sign), u16 scales[4] at 48 */
        const ll_vi32 q = ll_i32_le(ll_iq_lanes(wp, 4 * j));
        const ll_vi32 qh = ll_i32_field(ll_i32_le(ll_iq_lanes(wp, 32 + 4 * (j / 2))), 16 * (j % 2), 0xffff);
        LL_UNROLL(4)
        for (int l = 0; l < 4; l++) {
            const ll_vi32 idx = ll_i32_or(ll_i32_field(q, 8 * l, 255), ll_i32_shl(ll_i32_field(qh, 4 * l, 7), 8));
            const ll_vi8 minus2 = ll_i8_of_i32(ll_i32_and(ll_i32_sub(ll_i32_set1(0), ll_i32_field(qh, 4 * l + 3, 1)),
                                                          ll_i32_set1(0x02020202)));
            ll_i8_gather8(ll_iq1s_grid, ll_i32_shl(idx, 3), &w[2 * l], &w[2 * l + 1]);
            LL_UNROLL(2)
            for (int h = 0; h < 2; h++) w[2 * l + h] = ll_i8_sub(ll_i8_lut16(ll_i8_lo4(w[2 * l + h]), ll_iq1_plus1), minus2);
        }
        const ll_vi32 sc = ll_i32_field(ll_i32_le(ll_iq_lanes(wp, 48 + 4 * (j / 4))), 16 * ((j / 2) % 2), 0xffff);
        const ll_vi32 u0 = ll_i32_field(sc, 6 * (j % 2), 7), u1 = ll_i32_field(sc, 6 * (j % 2) + 3, 7);
        *s0 = ll_mul(ll_mul(dv, ll_i32_to_f32(ll_i32_or(ll_i32_shl(u0, 1), ll_i32_set1(1)))), ll_set1(0.125f));
        *s1 = ll_mul(ll_mul(dv, ll_i32_to_f32(ll_i32_or(ll_i32_shl(u1, 1), ll_i32_set1(1)))), ll_set1(0.125f));
        return 0;
    }
    }
    LL_UNROLL(8)
#ifdef LL_HAVE_I8_BITS
    for (int g = 0; g < 8; g++) neg[g] = ll_i8_bitmask(full, ll_iq_ctl(4 * g, 1));
#else
    for (int g = 0; g < 8; g++) neg[g] = ll_i8_signs(full, g);
#endif
    return 1;
}

/* the f16 d of each of the 16 stored blocks of a packed super-block */
LL_INLINE ll_vf32 ll_iq_row_d(const uint8_t *wp, int wtype) {
    if (wtype == LL_W_IQ1_M) {   /* d in the top nibbles of the four u16 scales, words 12 and 13 */
        int32_t s01[16], s23[16];
        uint16_t h[16];
        ll_i32_store(s01, ll_i32_le(ll_iq_lanes(wp, 48)));
        ll_i32_store(s23, ll_i32_le(ll_iq_lanes(wp, 52)));
        for (int r = 0; r < 16; r++) {
            const uint32_t a = (uint32_t)s01[r], b = (uint32_t)s23[r];
            h[r] = (uint16_t)(((a >> 12) & 0xf) | ((a >> 24) & 0xf0) | ((b >> 4) & 0xf00) | ((b >> 16) & 0xf000));
        }
        return ll_load_f16(h);
    }
    return ll_load_f16((const uint16_t *)wp);   /* the stored little-endian f16 (x86 only: LL_IQ_ONE_ROW elsewhere) */
}
#endif

/* ---- the dot products of one panel ----------------------------------------------------- */

LL_INLINE void ll_unpack_nibbles(const uint8_t *p, ll_vi8 w[8]) {
    LL_UNROLL(4)
    for (int v = 0; v < 4; v++) {
        const ll_vi8 a = ll_i8_load(p + 64 * v);
        w[v] = ll_i8_lo4(a);
        w[v + 4] = ll_i8_hi4(a);
    }
}

/* nibbles and the 1-bit plane after them: 5-bit values */
LL_INLINE void ll_unpack_5bit(const uint8_t *p, ll_vi8 w[8]) {
    ll_unpack_nibbles(p, w);
    const ll_vi8 h = ll_i8_load(p + 256);
    LL_UNROLL(8)
    for (int g = 0; g < 8; g++) w[g] = ll_i8_or(w[g], ll_i8_hi1(h, g));
}

#ifdef LL_I8DOT_FULL_U8
/* Signed weights w[8] as the bytes w + 128, for ll_dot_block's unsigned products (the caller
 * takes 128 sum(q) off in int32: ll_qact.n). */
LL_INLINE void ll_i8_bias(ll_vi8 w[8]) {
    const ll_vi8 k80 = ll_i8_of_i32(ll_i32_set1((int32_t)0x80808080u));
    for (int g = 0; g < 8; g++) w[g] = ll_i8_xor(w[g], k80);
}
#endif

/* Sums over the 8 groups of 4 values of one 32-block: lo = groups 0..3, hi = groups 4..7.
 * is_signed: the weights are signed bytes (Q8_0, the IQ4 codebook values), else unsigned. */
LL_INLINE void ll_dot_block(const ll_vi8 w[8], const int8_t *x, const int is_signed, ll_vi32 *lo, ll_vi32 *hi) {
    ll_vi32 a = ll_i32_zero(), b = ll_i32_zero();
    LL_UNROLL(4)
    for (int g = 0; g < 4; g++) {
        const ll_vi8 x0 = ll_i8_bcast4(x + 4 * g), x1 = ll_i8_bcast4(x + 16 + 4 * g);
        a = is_signed ? ll_dpbssd(a, w[g], x0) : ll_dpbusd(a, w[g], x0);
        b = is_signed ? ll_dpbssd(b, w[g + 4], x1) : ll_dpbusd(b, w[g + 4], x1);
    }
    *lo = a; *hi = b;
}

/* acc[t] += scale (16 rows) x the signed weight bytes w[8] of block b . token t's 32 int8 values,
 * for t < tt (Q8_0, IQ4_NL, IQ4_XS, MXFP4; codebook and Q3_K weights made signed bytes): where the
 * build's dot product takes any u8 (VNNI) as w + 128 less 128 sum(q) (ll_qact.n, its two
 * half-blocks), in int32, else signed products (ll_dpbssd). Both give the same int32 sum, so the
 * same float result. */
LL_INLINE void ll_signed_block_dot(const ll_qact *x, int tt, ll_vi8 w[8], ll_vf32 scale, ptrdiff_t b, ll_vf32 *acc,
                                    const int biased) {
    const ptrdiff_t ldd = x->ld / 32;
#ifdef LL_I8DOT_FULL_U8
    const ptrdiff_t lds = x->ld / 16;
    if (!biased) ll_i8_bias(w);
#else
    (void)biased;
#endif
    for (int t = 0; t < tt; t++) {
        ll_vi32 lo, hi;
#ifdef LL_I8DOT_FULL_U8
        ll_dot_block(w, x->q + t * x->ld + 32 * b, 0, &lo, &hi);
        const ll_vi32 sum = ll_i32_sub(ll_i32_add(lo, hi), ll_i32_set1(128 * (x->n[t * lds + 2 * b] + x->n[t * lds + 2 * b + 1])));
#else
        ll_dot_block(w, x->q + t * x->ld + 32 * b, 1, &lo, &hi);
        const ll_vi32 sum = ll_i32_add(lo, hi);
#endif
        acc[t] = ll_fma(scale, ll_mul(ll_i32_to_f32(sum), ll_set1(x->d[t * ldd + b])), acc[t]);
    }
}

#ifndef LL_IQ_ONE_ROW
/* ll_dot_block's sums for weights given as magnitudes w (< 128) and minus signs neg (ll_iq_negs):
 * each broadcast activation negated where its weight is (|w| x (x with w's sign)). */
LL_INLINE void ll_dot_block_neg(const ll_vi8 w[8], const ll_iq_negs neg[8], const int8_t *x, ll_vi32 *lo, ll_vi32 *hi) {
    ll_vi32 a = ll_i32_zero(), b = ll_i32_zero();
    LL_UNROLL(4)
    for (int g = 0; g < 4; g++) {
        const ll_vi8 x0 = ll_i8_bcast4(x + 4 * g), x1 = ll_i8_bcast4(x + 16 + 4 * g);
        a = ll_dpbusd(a, w[g], ll_iq_neg(x0, neg[g]));
        b = ll_dpbusd(b, w[g + 4], ll_iq_neg(x1, neg[g + 4]));
    }
    *lo = a; *hi = b;
}

/* acc[t] += the 16 rows' sub-block j (of the super-block at wp; b its block index in x) . token
 * t's 32 values, for t < nt: the sub-block decoded once for all of them (ll_iq_decode16). With
 * nt a literal (ll_qpanel_dot's tile) the token loop unrolls and acc stays in registers.
 * Types with one scale a sub-block (ll_iq_one_scale) add the halves' int sums before the float
 * step; where the dot product takes any u8 (VNNI), a step of more than 2 tokens gives the
 * weights their signs once, as w + 128, and takes 128 x the block's int sum off each token's
 * (ll_qact.n): the same int32 sum as the signs put on each token's activations, so the same
 * bits for a token alone or in any tile. */
/* a decoded sub-block's int sums with one token's 32 values xq */
LL_INLINE void ll_iq_block_dot(const ll_vi8 w[8], const ll_iq_negs neg[8], int with_neg, const int8_t *xq, ll_vi32 *lo,
                               ll_vi32 *hi) {
    if (with_neg) ll_dot_block_neg(w, neg, xq, lo, hi);
    else ll_dot_block(w, xq, 1, lo, hi);
}
LL_INLINE void ll_iq_subblock_dot(const ll_qact *x, ptrdiff_t nt, const uint8_t *wp, int wtype, int j,
                                  ll_vf32 dv, ptrdiff_t b, ll_vf32 *acc) {
    const ptrdiff_t ldd = x->ld / 32;
    ll_vi8 w[8];
    ll_iq_negs neg[8];
    ll_vf32 a0, a1;
    const int with_neg = ll_iq_decode16(wp, wtype, j, dv, w, neg, &a0, &a1);
    if (ll_iq_one_scale(wtype)) {
#ifdef LL_I8DOT_FULL_U8
        if (nt > 2) {   /* the weights with their signs, then as the signed blocks (w + 128 there) */
            ll_vi8 ws[8];
            LL_UNROLL(8)
            for (int g = 0; g < 8; g++) ws[g] = with_neg ? ll_iq_neg(w[g], neg[g]) : w[g];
            ll_signed_block_dot(x, (int)nt, ws, a0, b, acc, 0);
            return;
        }
#endif
        for (ptrdiff_t t = 0; t < nt; t++) {
            ll_vi32 lo, hi;
            ll_iq_block_dot(w, neg, with_neg, x->q + t * x->ld + 32 * b, &lo, &hi);
            acc[t] = ll_fma(a0, ll_mul(ll_i32_to_f32(ll_i32_add(lo, hi)), ll_set1(x->d[t * ldd + b])), acc[t]);
        }
        return;
    }
    for (ptrdiff_t t = 0; t < nt; t++) {
        ll_vi32 lo, hi;
        ll_iq_block_dot(w, neg, with_neg, x->q + t * x->ld + 32 * b, &lo, &hi);
        const ll_vf32 dx = ll_set1(x->d[t * ldd + b]);
        acc[t] = ll_fma(a1, ll_mul(ll_i32_to_f32(hi), dx), ll_fma(a0, ll_mul(ll_i32_to_f32(lo), dx), acc[t]));
    }
}
#endif

/* Q3_K: the 3-bit values u (0..7, w = d sc (u - 4)) of the 16 rows' sub-block at qp: 2 bits and
 * the high bit, 4 values a row in each of w[8] */
LL_INLINE void ll_q3k_values(const uint8_t *qp, ll_vi8 w[8]) {
    const ll_vi8 h0 = ll_i8_load(qp), h1 = ll_i8_load(qp + 64), hb = ll_i8_load(qp + 128);
    for (int g = 0; g < 4; g++) {
        w[g] = ll_i8_or(ll_i8_bits(h0, 2 * g, 2, 0), ll_i8_bits(hb, g, 1, 2));
        w[g + 4] = ll_i8_or(ll_i8_bits(h1, 2 * g, 2, 0), ll_i8_bits(hb, g + 4, 1, 2));
    }
}

/* Q2_K: a super-block's 4-bit scales and mins, [16 groups of 16 values][16 rows] each */
LL_INLINE void ll_q2k_scales(const uint8_t *wp, uint8_t *sc, uint8_t *mn) {
    for (int q = 0; q < 4; q++) {
        const ll_vi8 a = ll_i8_load(wp + 64 + 64 * q);
        ll_i8_store(sc + 64 * q, ll_i8_lo4(a));
        ll_i8_store(mn + 64 * q, ll_i8_hi4(a));
    }
}
/* acc[t] += d (the 16 rows' f16 d) x sum x d_x, then the mins: m (= dmin x min) x the half-blocks' s */
LL_INLINE void ll_q2k_step(const ll_qact *x, int t, ptrdiff_t b, ll_vi32 sum, ll_vf32 dv, ll_vf32 m0, ll_vf32 m1,
                           ll_vf32 *acc) {
    const ptrdiff_t ldd = x->ld / 32, lds = x->ld / 16;
    const float s0 = x->s[t * lds + 2 * b], s1 = x->s[t * lds + 2 * b + 1];
    acc[t] = ll_fma(dv, ll_mul(ll_i32_to_f32(sum), ll_set1(x->d[t * ldd + b])), acc[t]);
    acc[t] = ll_fma(m1, ll_set1(-s1), ll_fma(m0, ll_set1(-s0), acc[t]));
}

/* Decode streams each panel once: ask for the bytes LL_QPF ahead of those being read. */
#ifndef LL_QPF
#define LL_QPF 4096
#endif
#define LL_QPREFETCH(p, n) do { for (int pf_ = 0; pf_ < (n); pf_ += 64) __builtin_prefetch((p) + LL_QPF + pf_, 0, 0); } while (0)

/* out[t] = the 16 rows of panel wp . activation row t, for t < tt (a literal after inlining).
 * The sums build in a local array, written out at the end: accumulators behind the caller's
 * pointer may alias the activation scales (both float), which would make each step store them. */
LL_INLINE void ll_qpanel_dot(const ll_qact *x, const int tt, const uint8_t *wp, int wtype, ptrdiff_t k,
                             ll_vf32 out[LL_QT]) {
    const ptrdiff_t ldd = x->ld / 32, lds = x->ld / 16;
    ll_vf32 acc[LL_QT];
    for (int t = 0; t < tt; t++) acc[t] = ll_zero();
    if (wtype == LL_W_Q8_0 || wtype == LL_W_Q4_0 || wtype == LL_W_Q4_1 || wtype == LL_W_Q5_0 || wtype == LL_W_Q5_1
            || wtype == LL_W_IQ4_NL) {
        const int five = wtype == LL_W_Q5_0 || wtype == LL_W_Q5_1;
        const int signed_w = wtype == LL_W_Q8_0 || wtype == LL_W_IQ4_NL;   /* ll_signed_block_dot */
        const ptrdiff_t bb = ll_qblock_bytes(wtype), qb = wtype == LL_W_Q8_0 ? 512 : five ? 320 : 256;
        const float offset = wtype == LL_W_Q4_0 ? 8.f : 16.f;   /* Q4_0, Q5_0: w = d (u - offset) */
        for (ptrdiff_t b = 0; b < k / 32; b++, wp += bb) {
            if (tt == 1) LL_QPREFETCH(wp, bb);
            ll_vi8 w[8];
            if (wtype == LL_W_Q8_0) for (int g = 0; g < 8; g++) w[g] = ll_i8_load(wp + 64 * g);
            else if (five) ll_unpack_5bit(wp, w);
            else ll_unpack_nibbles(wp, w);
            if (wtype == LL_W_IQ4_NL) for (int g = 0; g < 8; g++) w[g] = ll_i8_lut16(w[g], ll_iq4_dot_values);
            const ll_vf32 d = ll_load_f16((const uint16_t *)(wp + qb));
            if (signed_w) {
                ll_signed_block_dot(x, tt, w, d, b, acc, wtype == LL_W_IQ4_NL && LL_DOT_VALUES_BIASED);
                continue;
            }
            for (int t = 0; t < tt; t++) {
                const int8_t *xq = x->q + t * x->ld + 32 * b;
                const float dx = x->d[t * ldd + b];
                ll_vi32 lo, hi;
                ll_dot_block(w, xq, 0, &lo, &hi);
                const ll_vf32 f = ll_mul(ll_i32_to_f32(ll_i32_add(lo, hi)), ll_set1(dx));
                if (wtype == LL_W_Q4_0 || wtype == LL_W_Q5_0) {
                    const float sx = x->s[t * lds + 2 * b] + x->s[t * lds + 2 * b + 1];
                    acc[t] = ll_fma(d, ll_sub(f, ll_set1(offset * sx)), acc[t]);
                } else {   /* Q4_1, Q5_1: the mins follow the scales */
                    const float sx = x->s[t * lds + 2 * b] + x->s[t * lds + 2 * b + 1];
                    acc[t] = ll_fma(ll_load_f16((const uint16_t *)(wp + qb + 32)), ll_set1(sx), ll_fma(d, f, acc[t]));
                }
            }
        }
    } else if (wtype == LL_W_Q4_K || wtype == LL_W_Q5_K) {
        const int five = wtype == LL_W_Q5_K;
        const ptrdiff_t sbb = five ? 320 : 256;   /* bytes of a sub-block's quants */
        for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += ll_qblock_bytes(wtype)) {
            const ll_vf32 dv = ll_load_f16((const uint16_t *)wp), dm = ll_load_f16((const uint16_t *)(wp + 32));
            for (int j = 0; j < 8; j++) {
                if (tt == 1) LL_QPREFETCH(wp + 320 + sbb * j, sbb);
                const ll_vf32 a = ll_mul(dv, ll_load_u8(wp + 64 + 16 * j));
                const ll_vf32 mn = ll_mul(dm, ll_load_u8(wp + 192 + 16 * j));
                ll_vi8 w[8];
                if (five) ll_unpack_5bit(wp + 320 + sbb * j, w);
                else ll_unpack_nibbles(wp + 320 + sbb * j, w);
                const ptrdiff_t b = 8 * sb + j;
                for (int t = 0; t < tt; t++) {
                    ll_vi32 lo, hi;
                    ll_dot_block(w, x->q + t * x->ld + 32 * b, 0, &lo, &hi);
                    const float dx = x->d[t * ldd + b], sx = x->s[t * lds + 2 * b] + x->s[t * lds + 2 * b + 1];
                    const ll_vf32 f = ll_mul(ll_i32_to_f32(ll_i32_add(lo, hi)), ll_set1(dx));
                    acc[t] = ll_fma(mn, ll_set1(-sx), ll_fma(a, f, acc[t]));
                }
            }
        }
    } else if (wtype == LL_W_IQ4_XS) {
        for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += 2208) {
            const ll_vf32 dv = ll_load_f16((const uint16_t *)wp);
            for (int j = 0; j < 8; j++) {
                if (tt == 1) LL_QPREFETCH(wp + 160 + 256 * j, 256);
                const ll_vf32 a = ll_mul(dv, ll_load_s8((const int8_t *)(wp + 32 + 16 * j)));
                ll_vi8 w[8];
                ll_unpack_nibbles(wp + 160 + 256 * j, w);
                for (int g = 0; g < 8; g++) w[g] = ll_i8_lut16(w[g], ll_iq4_dot_values);
                const ptrdiff_t b = 8 * sb + j;
                ll_signed_block_dot(x, tt, w, a, b, acc, LL_DOT_VALUES_BIASED);
            }
        }
    } else if (wtype == LL_W_MXFP4) {
#ifndef LL_VEC_PLAIN
        int32_t offs[16];
        for (int r = 0; r < 16; r++) offs[r] = r - 3;
        const ll_vi32 mx_off = ll_i32_load(offs);
#endif
        for (ptrdiff_t b = 0; b < k / 32; b++, wp += 272) {
            if (tt == 1) LL_QPREFETCH(wp, 272);
            ll_vi8 w[8];
            ll_unpack_nibbles(wp, w);
            for (int g = 0; g < 8; g++) w[g] = ll_i8_lut16(w[g], ll_mxfp4_dot_values);
#ifdef LL_VEC_PLAIN
            float ds[16];
            for (int r = 0; r < 16; r++) ds[r] = ll_e8m0_half(wp[256 + r]);
            const ll_vf32 d = ll_load(ds);
#else
            const ll_vf32 d = ll_e8m0_half16(wp + 256, mx_off);
#endif
            ll_signed_block_dot(x, tt, w, d, b, acc, LL_DOT_VALUES_BIASED);
        }
    } else if (ll_wtype_is_codebook(wtype)) {
        const ptrdiff_t gb = ll_ggml_block_bytes(wtype);
#ifdef LL_IQ_ONE_ROW   /* one row at a time (ll_iq_decode32), then the bytes layout */
        uint8_t blks[16][112];
        for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += 16 * gb) {
            if (tt == 1) LL_QPREFETCH(wp, 16 * gb);
            for (int r = 0; r < 16; r++) ll_iq_row_block(wp, wtype, r, blks[r]);
            for (int j = 0; j < 8; j++) {
                uint8_t vals[512] __attribute__((aligned(64)));
                float s[2][16];
                for (int r = 0; r < 16; r++) {
                    float sr[2];
                    ll_iq_decode32(blks[r], wtype, j, vals, r, sr);
                    s[0][r] = sr[0]; s[1][r] = sr[1];
                }
                ll_vi8 w[8];
                for (int g = 0; g < 8; g++) w[g] = ll_i8_load(vals + 64 * g);
                const ll_vf32 a0 = ll_load(s[0]), a1 = ll_load(s[1]);
                const ptrdiff_t b = 8 * sb + j;
                if (ll_iq_one_scale(wtype)) {   /* the halves' sums added first, as ll_iq_subblock_dot */
                    for (int t = 0; t < tt; t++) {
                        ll_vi32 lo, hi;
                        ll_dot_block(w, x->q + t * x->ld + 32 * b, 1, &lo, &hi);
                        acc[t] = ll_fma(a0, ll_mul(ll_i32_to_f32(ll_i32_add(lo, hi)), ll_set1(x->d[t * ldd + b])), acc[t]);
                    }
                    continue;
                }
                for (int t = 0; t < tt; t++) {
                    ll_vi32 lo, hi;
                    ll_dot_block(w, x->q + t * x->ld + 32 * b, 1, &lo, &hi);
                    const ll_vf32 dx = ll_set1(x->d[t * ldd + b]);
                    acc[t] = ll_fma(a1, ll_mul(ll_i32_to_f32(hi), dx), ll_fma(a0, ll_mul(ll_i32_to_f32(lo), dx), acc[t]));
                }
            }
        }
#else
        for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += 16 * gb) {
            if (tt == 1) LL_QPREFETCH(wp, 16 * gb);
            const ll_vf32 dv = ll_iq_row_d(wp, wtype);
            for (int j = 0; j < 8; j++) ll_iq_subblock_dot(x, tt, wp, wtype, j, dv, 8 * sb + j, acc);
        }
#endif
    } else if (wtype == LL_W_Q2_K) {
        for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += 1344) {
            const ll_vf32 dv = ll_load_f16((const uint16_t *)wp), mv = ll_load_f16((const uint16_t *)(wp + 32));
            uint8_t sc[256], mn[256];
            ll_q2k_scales(wp, sc, mn);
            for (int j = 0; j < 8; j++) {
                const uint8_t *qp = wp + 320 + 128 * j;
                if (tt == 1) LL_QPREFETCH(qp, 128);
                const ll_vi32 c0 = ll_i32_load_s8((const int8_t *)(sc + 32 * j)), c1 = ll_i32_load_s8((const int8_t *)(sc + 32 * j + 16));
                const ll_vf32 m0 = ll_mul(mv, ll_load_u8(mn + 32 * j)), m1 = ll_mul(mv, ll_load_u8(mn + 32 * j + 16));
                const ll_vi8 h0 = ll_i8_load(qp), h1 = ll_i8_load(qp + 64);
                ll_vi8 w[8];
                for (int g = 0; g < 4; g++) { w[g] = ll_i8_bits(h0, 2 * g, 2, 0); w[g + 4] = ll_i8_bits(h1, 2 * g, 2, 0); }
                const ptrdiff_t b = 8 * sb + j;
                for (int t = 0; t < tt; t++) {   /* the block's exact int sum sc0 lo + sc1 hi, then the mins */
                    ll_vi32 lo, hi;
                    ll_dot_block(w, x->q + t * x->ld + 32 * b, 0, &lo, &hi);
                    ll_q2k_step(x, t, b, ll_i32_add(ll_i32_mul(c0, lo), ll_i32_mul(c1, hi)), dv, m0, m1, acc);
                }
            }
        }
    } else if (wtype == LL_W_Q3_K) {
        for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += 1824) {
            const ll_vf32 dv = ll_load_f16((const uint16_t *)wp);
            for (int j = 0; j < 8; j++) {
                const uint8_t *qp = wp + 288 + 192 * j;
                if (tt == 1) LL_QPREFETCH(qp, 192);
                const ll_vi32 c0 = ll_i32_load_s8((const int8_t *)(wp + 32 + 32 * j));
                const ll_vi32 c1 = ll_i32_load_s8((const int8_t *)(wp + 48 + 32 * j));
                ll_vi8 w[8];
                ll_q3k_values(qp, w);
                const ptrdiff_t b = 8 * sb + j;
                for (int t = 0; t < tt; t++) {   /* the block's exact int sum: sc0 (lo - 4 n0) + sc1 (hi - 4 n1) */
                    ll_vi32 lo, hi;
                    ll_dot_block(w, x->q + t * x->ld + 32 * b, 0, &lo, &hi);
                    const int32_t *n = x->n + t * lds + 2 * b;
                    const ll_vi32 sum = ll_i32_add(ll_i32_mul(c0, ll_i32_sub(lo, ll_i32_set1(4 * n[0]))),
                                                   ll_i32_mul(c1, ll_i32_sub(hi, ll_i32_set1(4 * n[1]))));
                    acc[t] = ll_fma(dv, ll_mul(ll_i32_to_f32(sum), ll_set1(x->d[t * ldd + b])), acc[t]);
                }
            }
        }
    } else if (wtype == LL_W_TQ2_0 || wtype == LL_W_TQ1_0) {
        for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += 1056) {
            const ll_vf32 dv = ll_load_f16((const uint16_t *)wp);
            for (int j = 0; j < 8; j++) {
                const uint8_t *qp = wp + 32 + 128 * j;
                if (tt == 1) LL_QPREFETCH(qp, 128);
                const ll_vi8 h0 = ll_i8_load(qp), h1 = ll_i8_load(qp + 64);
                ll_vi8 w[8];
                for (int g = 0; g < 4; g++) { w[g] = ll_i8_bits(h0, 2 * g, 2, 0); w[g + 4] = ll_i8_bits(h1, 2 * g, 2, 0); }
                const ptrdiff_t b = 8 * sb + j;
                for (int t = 0; t < tt; t++) {
                    ll_vi32 lo, hi;
                    ll_dot_block(w, x->q + t * x->ld + 32 * b, 0, &lo, &hi);
                    const float sx = x->s[t * lds + 2 * b] + x->s[t * lds + 2 * b + 1];
                    const ll_vf32 f = ll_sub(ll_mul(ll_i32_to_f32(ll_i32_add(lo, hi)), ll_set1(x->d[t * ldd + b])), ll_set1(sx));
                    acc[t] = ll_fma(dv, f, acc[t]);
                }
            }
        }
    } else {   /* Q6_K */
        for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += 3360) {
            const ll_vf32 dv = ll_load_f16((const uint16_t *)wp);
            for (int j = 0; j < 8; j++) {
                if (tt == 1) LL_QPREFETCH(wp + 288 + 384 * j, 384);
                const ll_vf32 a0 = ll_mul(dv, ll_load_s8((const int8_t *)(wp + 32 + 32 * j)));
                const ll_vf32 a1 = ll_mul(dv, ll_load_s8((const int8_t *)(wp + 48 + 32 * j)));
                const uint8_t *qp = wp + 288 + 384 * j;
                ll_vi8 w[8];
                ll_unpack_nibbles(qp, w);
                const ll_vi8 h0 = ll_i8_load(qp + 256), h1 = ll_i8_load(qp + 320);
                for (int g = 0; g < 4; g++) {
                    w[g] = ll_i8_or(w[g], ll_i8_hi2(h0, g));
                    w[g + 4] = ll_i8_or(w[g + 4], ll_i8_hi2(h1, g));
                }
                const ptrdiff_t b = 8 * sb + j;
                for (int t = 0; t < tt; t++) {
                    ll_vi32 lo, hi;
                    ll_dot_block(w, x->q + t * x->ld + 32 * b, 0, &lo, &hi);
                    const float dx = x->d[t * ldd + b];
                    const float s0 = 32.f * x->s[t * lds + 2 * b], s1 = 32.f * x->s[t * lds + 2 * b + 1];
                    const ll_vf32 f0 = ll_sub(ll_mul(ll_i32_to_f32(lo), ll_set1(dx)), ll_set1(s0));
                    const ll_vf32 f1 = ll_sub(ll_mul(ll_i32_to_f32(hi), ll_set1(dx)), ll_set1(s1));
                    acc[t] = ll_fma(a1, f1, ll_fma(a0, f0, acc[t]));
                }
            }
        }
    }
    for (int t = 0; t < tt; t++) out[t] = acc[t];
}

/* ll_qpanel_dot of one token (decode) with the block type a literal: each type's own loop,
 * its branches and prefetch counts fixed at compile time, whatever the caller's context. */
LL_INLINE void ll_qpanel_dot1(const ll_qact *x, const uint8_t *wp, int wtype, ptrdiff_t k, ll_vf32 out[LL_QT]) {
    switch (wtype) {
#define LL_QDOT1(W) case W: ll_qpanel_dot(x, 1, wp, W, k, out); break;
    LL_QDOT1(LL_W_Q8_0) LL_QDOT1(LL_W_Q4_0) LL_QDOT1(LL_W_Q4_1) LL_QDOT1(LL_W_Q4_K) LL_QDOT1(LL_W_Q6_K)
    LL_QDOT1(LL_W_Q5_0) LL_QDOT1(LL_W_Q5_1) LL_QDOT1(LL_W_Q5_K) LL_QDOT1(LL_W_IQ4_NL) LL_QDOT1(LL_W_IQ4_XS)
    LL_QDOT1(LL_W_Q2_K) LL_QDOT1(LL_W_Q3_K) LL_QDOT1(LL_W_TQ2_0) LL_QDOT1(LL_W_TQ1_0) LL_QDOT1(LL_W_MXFP4)
    LL_QDOT1(LL_W_IQ2_XXS) LL_QDOT1(LL_W_IQ2_XS) LL_QDOT1(LL_W_IQ2_S) LL_QDOT1(LL_W_IQ3_XXS)
    LL_QDOT1(LL_W_IQ3_S) LL_QDOT1(LL_W_IQ1_S) LL_QDOT1(LL_W_IQ1_M)
#undef LL_QDOT1
    default: ll_qpanel_dot(x, 1, wp, wtype, k, out);
    }
}

#ifndef LL_IQ_ONE_ROW
/* acc[t] = ll_qpanel_dot's sums for nt tokens at once (any nt, acc in memory), for the codebook
 * types: each sub-block is decoded once for all the tokens, not once per token tile (prefill);
 * the same float operations in the same order per token. */
static inline void ll_iq_panel_dot_many(const ll_qact *x, ptrdiff_t nt, const uint8_t *wp, int wtype, ptrdiff_t k,
                                        ll_vf32 *acc) {
    const ptrdiff_t gb = ll_ggml_block_bytes(wtype);
    for (ptrdiff_t t = 0; t < nt; t++) acc[t] = ll_zero();
    for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += 16 * gb) {
        const ll_vf32 dv = ll_iq_row_d(wp, wtype);
        for (int j = 0; j < 8; j++) ll_iq_subblock_dot(x, nt, wp, wtype, j, dv, 8 * sb + j, acc);
    }
}
#endif

#if defined(LL_HAVE_I8_BITS) && defined(LL_I8DOT_FULL_U8)
/* Q3_K for many tokens (VBMI and VNNI): each sub-block's 16 rows turned once into the signed bytes
 * w = sc (4 - u) of their 3-bit values u and 16-value scales sc (|w| <= 128: sc is -32..31, 4 - u
 * is -3..4), as w + 128 for ll_signed_block_dot, whose int sums are then minus the tile path's
 * sc0 (lo - 4 n0) + sc1 (hi - 4 n1), exactly; with -d as the scale, the same float steps give the
 * same bits. Each half's w comes from a 128-entry table of its 16 rows x 8 values (two registers:
 * row r's sc times 4 - u at 8 r + u), picked by 8 r + u. */
#define LL_HAVE_Q3K_MANY 1
LL_INLINE void ll_q3k_tables(const int8_t *sc, ll_vi8 *ta, ll_vi8 *tb) {
    static const int8_t rows[2][64] __attribute__((aligned(64))) = {
#define LL_ROW8(r) r, r, r, r, r, r, r, r
        {LL_ROW8(0), LL_ROW8(1), LL_ROW8(2), LL_ROW8(3), LL_ROW8(4), LL_ROW8(5), LL_ROW8(6), LL_ROW8(7)},
        {LL_ROW8(8), LL_ROW8(9), LL_ROW8(10), LL_ROW8(11), LL_ROW8(12), LL_ROW8(13), LL_ROW8(14), LL_ROW8(15)}};
#undef LL_ROW8
    const ll_vi8 k80 = ll_i8_of_i32(ll_i32_set1((int32_t)0x80808080u));
    for (int h = 0; h < 2; h++) {   /* the byte at 8 r + u: sc[r] x (4 - u) + 128 */
        const ll_vi8 s1 = ll_i8_lut64(ll_i8_load(rows[h]), sc);
        const ll_vi8 s2 = ll_i8_add(s1, s1), s3 = ll_i8_add(s2, s1), s4 = ll_i8_add(s2, s2);
        ll_vi8 v = ll_i8_blend(ll_i8_blend(ll_i8_blend(ll_i8_blend(ll_i8_xor(s1, s1), 0x0101010101010101ull, s4),
                                                       0x8282828282828282ull, s3), 0x4444444444444444ull, s2),
                               0x2828282828282828ull, s1);
        v = ll_i8_xor(ll_i8_neg_mask(v, 0xe0e0e0e0e0e0e0e0ull), k80);   /* u = 5, 6, 7: minus */
        if (h) *tb = v; else *ta = v;
    }
}
static inline void ll_q3k_panel_dot_many(const ll_qact *x, ptrdiff_t nt, const uint8_t *wp, ptrdiff_t k, ll_vf32 *acc) {
    static const int8_t rowoff[64] __attribute__((aligned(64))) = {
#define LL_ROW4(r) 8 * (r), 8 * (r), 8 * (r), 8 * (r)
        LL_ROW4(0), LL_ROW4(1), LL_ROW4(2), LL_ROW4(3), LL_ROW4(4), LL_ROW4(5), LL_ROW4(6), LL_ROW4(7),
        LL_ROW4(8), LL_ROW4(9), LL_ROW4(10), LL_ROW4(11), LL_ROW4(12), LL_ROW4(13), LL_ROW4(14), LL_ROW4(15)};
#undef LL_ROW4
    const ll_vi8 ro = ll_i8_load(rowoff);
    for (ptrdiff_t t = 0; t < nt; t++) acc[t] = ll_zero();
    for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += 1824) {
        const ll_vf32 nd = ll_sub(ll_zero(), ll_load_f16((const uint16_t *)wp));
        for (int j = 0; j < 8; j++) {
            ll_vi8 t0a, t0b, t1a, t1b, w[8];
            ll_q3k_tables((const int8_t *)(wp + 32 + 32 * j), &t0a, &t0b);
            ll_q3k_tables((const int8_t *)(wp + 48 + 32 * j), &t1a, &t1b);
            ll_q3k_values(wp + 288 + 192 * j, w);
            for (int g = 0; g < 4; g++) {
                w[g] = ll_i8_pick2(t0a, t0b, ll_i8_add(w[g], ro));
                w[g + 4] = ll_i8_pick2(t1a, t1b, ll_i8_add(w[g + 4], ro));
            }
            ll_signed_block_dot(x, (int)nt, w, nd, 8 * sb + j, acc, 1);
        }
    }
}

/* Q2_K for many tokens (VBMI): each sub-block's 16 rows turned once into the bytes sc q (0..45) of
 * their 2-bit values q and 4-bit scales sc, whose dot products are the tile path's sc0 lo + sc1
 * hi exactly: the same float steps after them, the same bits. Each half's bytes come from a
 * 64-entry table (row r's sc times q at 4 r + q) picked by 4 r + q. */
#define LL_HAVE_Q2K_MANY 1
static inline void ll_q2k_panel_dot_many(const ll_qact *x, ptrdiff_t nt, const uint8_t *wp, ptrdiff_t k, ll_vf32 *acc) {
    static const int8_t rows[64] __attribute__((aligned(64))) = {
#define LL_ROW4(r) r, r, r, r
        LL_ROW4(0), LL_ROW4(1), LL_ROW4(2), LL_ROW4(3), LL_ROW4(4), LL_ROW4(5), LL_ROW4(6), LL_ROW4(7),
        LL_ROW4(8), LL_ROW4(9), LL_ROW4(10), LL_ROW4(11), LL_ROW4(12), LL_ROW4(13), LL_ROW4(14), LL_ROW4(15)};
#undef LL_ROW4
    const ll_vi8 ri = ll_i8_load(rows), base = ll_i8_add(ll_i8_add(ri, ri), ll_i8_add(ri, ri));   /* 4 r */
    uint8_t sc[256 + 48], mn[256];   /* room for a 64-byte read from the last group's 16 scales */
    memset(sc + 256, 0, 48);
    for (ptrdiff_t t = 0; t < nt; t++) acc[t] = ll_zero();
    for (ptrdiff_t sb = 0; sb < k / 256; sb++, wp += 1344) {
        const ll_vf32 dv = ll_load_f16((const uint16_t *)wp), mv = ll_load_f16((const uint16_t *)(wp + 32));
        ll_q2k_scales(wp, sc, mn);
        for (int j = 0; j < 8; j++) {
            const uint8_t *qp = wp + 320 + 128 * j;
            const ll_vf32 m0 = ll_mul(mv, ll_load_u8(mn + 32 * j)), m1 = ll_mul(mv, ll_load_u8(mn + 32 * j + 16));
            ll_vi8 tab[2], w[8];
            for (int h = 0; h < 2; h++) {   /* the byte at 4 r + q: sc[r] x q */
                const ll_vi8 s1 = ll_i8_lut64(ri, (const int8_t *)(sc + 32 * j + 16 * h));
                const ll_vi8 s2 = ll_i8_add(s1, s1), s3 = ll_i8_add(s2, s1);
                tab[h] = ll_i8_blend(ll_i8_blend(ll_i8_blend(ll_i8_xor(s1, s1), 0x2222222222222222ull, s1),
                                                 0x4444444444444444ull, s2), 0x8888888888888888ull, s3);
            }
            const ll_vi8 h0 = ll_i8_load(qp), h1 = ll_i8_load(qp + 64);
            for (int g = 0; g < 4; g++) {
                w[g] = ll_i8_pick2(tab[0], tab[0], ll_i8_or(ll_i8_bits(h0, 2 * g, 2, 0), base));
                w[g + 4] = ll_i8_pick2(tab[1], tab[1], ll_i8_or(ll_i8_bits(h1, 2 * g, 2, 0), base));
            }
            const ptrdiff_t b = 8 * sb + j;
            for (ptrdiff_t t = 0; t < nt; t++) {
                ll_vi32 lo, hi;
                ll_dot_block(w, x->q + t * x->ld + 32 * b, 0, &lo, &hi);
                ll_q2k_step(x, (int)t, b, ll_i32_add(lo, hi), dv, m0, m1, acc);
            }
        }
    }
}
#endif

/* ---- packing and unpacking ------------------------------------------------------------- */


#define LL_LE16(p) ((uint16_t)((p)[0] | ((p)[1] << 8)))

/* One ggml (super-)block -> its quant values u (the packed layout's, 0..15, 0..63, or int8
 * bits for Q8_0) and scale fields: f16 bits h[0..1], 8-bit scales sc[0..15], mins mn[0..7]. */
/* IQ4_XS: the signed 6-bit scale of sub-block j (low 4 bits in scales_l, high 2 in scales_h). */
LL_INLINE uint8_t ll_iq4xs_scale(const uint8_t *blk, int j) {
    const int ls = ((blk[4 + j / 2] >> (4 * (j % 2))) & 15) | (((LL_LE16(blk + 2) >> (2 * j)) & 3) << 4);
    return (uint8_t)(int8_t)(ls - 32);
}

/* Q3_K: signed scale g (0..15) of the 6-bit scales packed in 12 bytes s (low 4 bits in s[0..7],
 * high 2 bits in s[8..11]), minus 32. */
LL_INLINE uint8_t ll_q3k_scale(const uint8_t *s, int g) {
    const int lo = g < 8 ? s[g] & 15 : s[g - 8] >> 4, hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (uint8_t)(int8_t)((lo | (hi << 4)) - 32);
}

/* TQ1_0: the 256 trits (0..2) of a block: 5 per byte of qs[48] (the k-th of byte b is
 * (b 3^k mod 256) 3 >> 8; bytes 0..31 give values 32 k + m, 32..47 give 160 + 16 k + m),
 * 4 per byte of qh[4] (values 240 + 4 k + m). */
LL_INLINE void ll_tq1_trits(const uint8_t *blk, uint8_t *u) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (int k = 0; k < 5; k++) {
        for (int m = 0; m < 32; m++) u[32 * k + m] = (uint8_t)(((uint8_t)(blk[m] * pow3[k]) * 3) >> 8);
        for (int m = 0; m < 16; m++) u[160 + 16 * k + m] = (uint8_t)(((uint8_t)(blk[32 + m] * pow3[k]) * 3) >> 8);
        if (k < 4) for (int m = 0; m < 4; m++) u[240 + 4 * k + m] = (uint8_t)(((uint8_t)(blk[48 + m] * pow3[k]) * 3) >> 8);
    }
}

/* Q4_K / Q5_K: the 8 six-bit scales and mins packed in 12 bytes s. */
LL_INLINE void ll_qk_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) { sc[j] = s[j] & 63; mn[j] = s[j + 4] & 63; }
        else { sc[j] = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4); mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
    }
}

static inline void ll_ggml_unpack_block(const uint8_t *blk, int wtype, uint8_t *u, uint16_t *h, uint8_t *sc,
                                        uint8_t *mn) {
    int i;
    switch (wtype) {
    case LL_W_Q8_0:
        h[0] = LL_LE16(blk);
        memcpy(u, blk + 2, 32);
        break;
    case LL_W_IQ4_XS: {   /* f16 d, u16 scales_h, u8 scales_l[4], qs[128] (16 per 32-value sub-block) */
        h[0] = LL_LE16(blk);
        for (int j = 0; j < 8; j++) {
            sc[j] = ll_iq4xs_scale(blk, j);
            for (i = 0; i < 16; i++) { u[32 * j + i] = blk[8 + 16 * j + i] & 15; u[32 * j + i + 16] = blk[8 + 16 * j + i] >> 4; }
        }
        break;
    }
    case LL_W_Q4_0:
    case LL_W_IQ4_NL:
    case LL_W_Q4_1: {
        const uint8_t *qs = blk + (wtype == LL_W_Q4_1 ? 4 : 2);
        h[0] = LL_LE16(blk);
        if (wtype == LL_W_Q4_1) h[1] = LL_LE16(blk + 2);
        for (i = 0; i < 16; i++) { u[i] = qs[i] & 15; u[i + 16] = qs[i] >> 4; }
        break;
    }
    case LL_W_Q5_0:
    case LL_W_Q5_1: {   /* f16 d, (f16 m,) u32 qh (bit i: high bit of value i), u8 qs[16] */
        const uint8_t *q = blk + (wtype == LL_W_Q5_0 ? 2 : 4);
        const uint32_t qh = (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 24);
        h[0] = LL_LE16(blk);
        if (wtype == LL_W_Q5_1) h[1] = LL_LE16(blk + 2);
        for (i = 0; i < 16; i++) {
            u[i] = (uint8_t)((q[4 + i] & 15) | (((qh >> i) & 1) << 4));
            u[i + 16] = (uint8_t)((q[4 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
        }
        break;
    }
    case LL_W_Q4_K:
    case LL_W_Q5_K: {   /* f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, (qh[32],) qs[128] */
        const uint8_t *s = blk + 4, *qh = blk + 16, *qs = blk + (wtype == LL_W_Q5_K ? 48 : 16);
        h[0] = LL_LE16(blk);
        h[1] = LL_LE16(blk + 2);
        ll_qk_scales(s, sc, mn);
        for (int j = 0; j < 8; j++) {
            for (i = 0; i < 32; i++) {
                u[32 * j + i] = (j & 1) ? qs[(j / 2) * 32 + i] >> 4 : qs[(j / 2) * 32 + i] & 15;
                if (wtype == LL_W_Q5_K) u[32 * j + i] |= (uint8_t)(((qh[i] >> j) & 1) << 4);
            }
        }
        break;
    }
    case LL_W_Q2_K:   /* scales[16] (scale | min << 4), qs[64], f16 d, f16 dmin */
        h[0] = LL_LE16(blk + 80);
        h[1] = LL_LE16(blk + 82);
        memcpy(sc, blk, 16);
        for (i = 0; i < 256; i++) u[i] = (blk[16 + 32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3;
        break;
    case LL_W_Q3_K:   /* hmask[32], qs[64], 12 bytes of 6-bit scales, f16 d */
        h[0] = LL_LE16(blk + 108);
        for (i = 0; i < 16; i++) sc[i] = ll_q3k_scale(blk + 96, i);
        for (i = 0; i < 256; i++)
            u[i] = (uint8_t)(((blk[32 + 32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3)
                             | (((blk[i % 32] >> (i / 32)) & 1) << 2));
        break;
    case LL_W_TQ2_0:   /* qs[64], f16 d */
        h[0] = LL_LE16(blk + 64);
        for (i = 0; i < 256; i++) u[i] = (blk[32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3;
        break;
    case LL_W_TQ1_0:   /* qs[48] and qh[4] of base-3 trits, f16 d */
        h[0] = LL_LE16(blk + 52);
        ll_tq1_trits(blk, u);
        break;
    case LL_W_MXFP4:   /* u8 e (e8m0), qs[16] */
        sc[0] = blk[0];
        for (i = 0; i < 16; i++) { u[i] = blk[1 + i] & 15; u[i + 16] = blk[1 + i] >> 4; }
        break;
    default: {   /* Q6_K: two halves of 128, each 64 bytes of low nibbles and 32 of 2-bit highs */
        const uint8_t *ql = blk, *qh = blk + 128;
        h[0] = LL_LE16(blk + 208);
        memcpy(sc, blk + 192, 16);
        for (int half = 0; half < 2; half++) {
            const uint8_t *l = ql + 64 * half, *hh = qh + 32 * half;
            uint8_t *o = u + 128 * half;
            for (i = 0; i < 32; i++) {
                o[i] = (uint8_t)((l[i] & 15) | ((hh[i] & 3) << 4));
                o[i + 32] = (uint8_t)((l[i + 32] & 15) | (((hh[i] >> 2) & 3) << 4));
                o[i + 64] = (uint8_t)((l[i] >> 4) | (((hh[i] >> 4) & 3) << 4));
                o[i + 96] = (uint8_t)((l[i + 32] >> 4) | (((hh[i] >> 6) & 3) << 4));
            }
        }
    }
    }
}

/* Blocks b0..b1 of raw ggml data of wtype dequantized into dst (block b at b * elements), in
 * gguf.quants' order of operations (the same floats). */
static inline void ll_dequant_ggml(const uint8_t *src, int wtype, float *dst, ptrdiff_t b0, ptrdiff_t b1) {
    const ptrdiff_t per = ll_qblock(wtype), gb = ll_ggml_block_bytes(wtype);
    uint8_t u[256], sc[16], mn[8];
    uint16_t h[2] = {0, 0};
    for (ptrdiff_t b = b0; b < b1; b++) {
        float *o = dst + b * per;
        if (ll_wtype_is_codebook(wtype)) {
            for (int j = 0; j < 8; j++) {
                uint8_t vals[512];
                float s[2];
                ll_iq_decode32(src + b * gb, wtype, j, vals, 0, s);
                for (int e = 0; e < 32; e++) o[32 * j + e] = s[e / 16] * (float)(int8_t)vals[64 * (e / 4) + e % 4];
            }
            continue;
        }
        ll_ggml_unpack_block(src + b * gb, wtype, u, h, sc, mn);
        const float d = ll_f16_to_f32(h[0]), m = ll_f16_to_f32(h[1]);
        for (ptrdiff_t e = 0; e < per; e++) {
            switch (wtype) {
            case LL_W_Q8_0: o[e] = d * (float)(int8_t)u[e]; break;
            case LL_W_Q4_0: o[e] = d * (float)(u[e] - 8); break;
            case LL_W_Q5_0: o[e] = d * (float)(u[e] - 16); break;
            case LL_W_Q4_1: case LL_W_Q5_1: o[e] = d * (float)u[e] + m; break;
            case LL_W_Q4_K: case LL_W_Q5_K:
                o[e] = d * (float)sc[e / 32] * (float)u[e] - m * (float)mn[e / 32]; break;
            case LL_W_IQ4_NL: o[e] = d * (float)ll_iq4_values[u[e]]; break;
            case LL_W_IQ4_XS: o[e] = d * (float)(int8_t)sc[e / 32] * (float)ll_iq4_values[u[e]]; break;
            case LL_W_Q2_K:
                o[e] = d * (float)(sc[e / 16] & 15) * (float)u[e] - m * (float)(sc[e / 16] >> 4); break;
            case LL_W_Q3_K: o[e] = d * (float)(int8_t)sc[e / 16] * (float)((int)u[e] - 4); break;
            case LL_W_TQ2_0: case LL_W_TQ1_0: o[e] = d * (float)((int)u[e] - 1); break;
            case LL_W_MXFP4: o[e] = ll_e8m0_half(sc[0]) * (float)ll_mxfp4_values[u[e]]; break;
            default: o[e] = d * (float)(int8_t)sc[e / 16] * (float)(u[e] - 32);
            }
        }
    }
}

LL_INLINE uint32_t ll_ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
LL_INLINE uint32_t ll_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Lane r's nibble quants of a 32-value sub-block whose values are the low (hi = 0) or high
 * (hi = 1) nibbles of the 32 stored bytes q: byte (v, r, i) = u[4v + i] | u[16 + 4v + i] << 4. */
LL_INLINE void ll_put_nibble_words(uint8_t *dst, int r, const uint8_t *q, int hi) {
    for (int v = 0; v < 4; v++) {
        const uint32_t a = ll_ld32(q + 4 * v), b = ll_ld32(q + 16 + 4 * v);
        const uint32_t w = hi ? ((a >> 4) & 0x0f0f0f0fu) | (b & 0xf0f0f0f0u) : (a & 0x0f0f0f0fu) | ((b & 0x0f0f0f0fu) << 4);
        memcpy(dst + 64 * v + 4 * r, &w, 4);
    }
}

/* Lane r's 2-bit plane of a 32-value sub-block whose values are bits shift..shift+1 of the 32
 * stored bytes q: bits 2c..2c+1 of byte (h, r, i) = value 16 h + 4 c + i. */
LL_INLINE void ll_put_2bit_words(uint8_t *dst, int r, const uint8_t *q, int shift) {
    for (int hv = 0; hv < 2; hv++) {
        uint32_t w = 0;
        for (int c = 0; c < 4; c++) w |= ((ll_ld32(q + 16 * hv + 4 * c) >> shift) & 0x03030303u) << (2 * c);
        memcpy(dst + 64 * hv + 4 * r, &w, 4);
    }
}

/* Lane r of a packed block (the layouts at the top) from one stored ggml block, a word (4 values
 * of a row) at a time: the packed quants are the stored bytes (Q8_0, Q4_0, Q4_1, IQ4_NL, IQ4_XS,
 * and the nibbles of Q5_0/Q5_1), or word-wide nibble and bit shuffles of them (the K-quants: a
 * byte's low and high nibbles belong to two sub-blocks). No value is unpacked; the masks act
 * within bytes, so any byte order. The tests hold the result to gguf's dequantizer. */
LL_INLINE void ll_qpack_lane(const uint8_t *blk, int wtype, uint8_t *o, int r) {
    switch (wtype) {
    case LL_W_Q8_0:
        for (int g = 0; g < 8; g++) memcpy(o + 64 * g + 4 * r, blk + 2 + 4 * g, 4);
        ((uint16_t *)(o + 512))[r] = LL_LE16(blk);
        return;
    case LL_W_Q4_0:
    case LL_W_IQ4_NL:
    case LL_W_Q4_1: {
        const int q1 = wtype == LL_W_Q4_1;
        for (int v = 0; v < 4; v++) memcpy(o + 64 * v + 4 * r, blk + (q1 ? 4 : 2) + 4 * v, 4);
        ((uint16_t *)(o + 256))[r] = LL_LE16(blk);
        if (q1) ((uint16_t *)(o + 288))[r] = LL_LE16(blk + 2);
        return;
    }
    case LL_W_IQ4_XS:
        ((uint16_t *)o)[r] = LL_LE16(blk);
        for (int j = 0; j < 8; j++) {
            o[32 + 16 * j + r] = ll_iq4xs_scale(blk, j);
            for (int v = 0; v < 4; v++) memcpy(o + 160 + 256 * j + 64 * v + 4 * r, blk + 8 + 16 * j + 4 * v, 4);
        }
        return;
    case LL_W_Q5_0:
    case LL_W_Q5_1: {
        const uint8_t *q = blk + (wtype == LL_W_Q5_0 ? 2 : 4);
        const uint32_t qh = ll_le32(q);
        for (int v = 0; v < 4; v++) memcpy(o + 64 * v + 4 * r, q + 4 + 4 * v, 4);
        for (int i = 0; i < 4; i++) {
            uint8_t b = 0;
            for (int g = 0; g < 8; g++) b |= (uint8_t)(((qh >> (4 * g + i)) & 1) << g);
            o[256 + 4 * r + i] = b;
        }
        ((uint16_t *)(o + 320))[r] = LL_LE16(blk);
        if (wtype == LL_W_Q5_1) ((uint16_t *)(o + 352))[r] = LL_LE16(blk + 2);
        return;
    }
    case LL_W_Q4_K:
    case LL_W_Q5_K: {
        const int k5 = wtype == LL_W_Q5_K;
        const ptrdiff_t sbb = k5 ? 320 : 256;
        uint8_t sc[8], mn[8];
        ll_qk_scales(blk + 4, sc, mn);
        ((uint16_t *)o)[r] = LL_LE16(blk);
        ((uint16_t *)(o + 32))[r] = LL_LE16(blk + 2);
        for (int j = 0; j < 8; j++) {
            uint8_t *d = o + 320 + sbb * j;
            o[64 + 16 * j + r] = sc[j];
            o[192 + 16 * j + r] = mn[j];
            ll_put_nibble_words(d, r, blk + (k5 ? 48 : 16) + 32 * (j / 2), j & 1);
            if (k5) {   /* bit j of qh[i] is value i's high bit */
                uint32_t w = 0;
                for (int g = 0; g < 8; g++) w |= ((ll_ld32(blk + 16 + 4 * g) >> j) & 0x01010101u) << g;
                memcpy(d + 256 + 4 * r, &w, 4);
            }
        }
        return;
    }
    case LL_W_Q2_K:   /* sub-block j = 4 half + l: bits 2l of qs[32 half + i] */
        ((uint16_t *)o)[r] = LL_LE16(blk + 80);
        ((uint16_t *)(o + 32))[r] = LL_LE16(blk + 82);
        for (int g = 0; g < 16; g++) o[64 + 16 * g + r] = blk[g];
        for (int j = 0; j < 8; j++) ll_put_2bit_words(o + 320 + 128 * j, r, blk + 16 + 32 * (j / 4), 2 * (j % 4));
        return;
    case LL_W_Q3_K:   /* as Q2_K's 2 bits, and bit j of hmask[i] the third */
        ((uint16_t *)o)[r] = LL_LE16(blk + 108);
        for (int g = 0; g < 16; g++) o[32 + 16 * g + r] = ll_q3k_scale(blk + 96, g);
        for (int j = 0; j < 8; j++) {
            uint8_t *d = o + 288 + 192 * j;
            ll_put_2bit_words(d, r, blk + 32 + 32 * (j / 4), 2 * (j % 4));
            uint32_t w = 0;
            for (int g = 0; g < 8; g++) w |= ((ll_ld32(blk + 4 * g) >> j) & 0x01010101u) << g;
            memcpy(d + 128 + 4 * r, &w, 4);
        }
        return;
    case LL_W_TQ2_0:
        ((uint16_t *)o)[r] = LL_LE16(blk + 64);
        for (int j = 0; j < 8; j++) ll_put_2bit_words(o + 32 + 128 * j, r, blk + 32 * (j / 4), 2 * (j % 4));
        return;
    case LL_W_TQ1_0: {   /* trits decoded once, then TQ2_0's planes */
        uint8_t u[256];
        ll_tq1_trits(blk, u);
        ((uint16_t *)o)[r] = LL_LE16(blk + 52);
        for (int j = 0; j < 8; j++)
            for (int hv = 0; hv < 2; hv++)
                for (int i = 0; i < 4; i++) {
                    uint8_t b = 0;
                    for (int c = 0; c < 4; c++) b |= (uint8_t)(u[32 * j + 16 * hv + 4 * c + i] << (2 * c));
                    o[32 + 128 * j + 64 * hv + 4 * r + i] = b;
                }
        return;
    }
    case LL_W_MXFP4:
        for (int v = 0; v < 4; v++) memcpy(o + 64 * v + 4 * r, blk + 1 + 4 * v, 4);
        o[256 + r] = blk[0];
        return;
    default:   /* the codebook types: the stored block, interleaved with the other rows' (ll_iq_row_block) */
        if (ll_wtype_is_codebook(wtype)) ll_iq_put_row_block(blk, wtype, r, o);
        return;
    case LL_W_Q6_K:   /* sub-block j = 4 half + q: nibbles of ql, 2 bits of qh at shift 2q */
        ((uint16_t *)o)[r] = LL_LE16(blk + 208);
        for (int j = 0; j < 16; j++) o[32 + 16 * j + r] = blk[192 + j];
        for (int j = 0; j < 8; j++) {
            const int half = j / 4, q = j % 4;
            const uint8_t *hh = blk + 128 + 32 * half;
            uint8_t *d = o + 288 + 384 * j;
            ll_put_nibble_words(d, r, blk + 64 * half + 32 * (q & 1), q >> 1);
            for (int hv = 0; hv < 2; hv++) {
                uint32_t w = 0;
                for (int c = 0; c < 4; c++) w |= ((ll_ld32(hh + 16 * hv + 4 * c) >> (2 * q)) & 0x03030303u) << (2 * c);
                memcpy(d + 256 + 64 * hv + 4 * r, &w, 4);
            }
        }
        return;
    }
}

/* One packed panel pd from up to 16 raw ggml rows of k values (rows[r] for r < nrows; rows
 * past them are zero). */
static inline void ll_qpack_panel(const uint8_t *const *rows, int nrows, ptrdiff_t k, int wtype, uint8_t *pd) {
    const ptrdiff_t nblk = k / ll_qblock(wtype), bb = ll_qblock_bytes(wtype), gb = ll_ggml_block_bytes(wtype);
    const ptrdiff_t span = bb >= 16384 ? 1 : 16384 / bb;   /* blocks of ~16 KB of panel: it stays in L1 */
    memset(pd, 0, (size_t)(nblk * bb));
    for (ptrdiff_t b0 = 0; b0 < nblk; b0 += span)
        for (int r = 0; r < nrows; r++)
            for (ptrdiff_t b = b0; b < b0 + span && b < nblk; b++)
                ll_qpack_lane(rows[r] + b * gb, wtype, pd + b * bb, r);
}

/* Panels p0..p1 of raw ggml rows src [rows][k / block * block bytes] into dst (panel 0 first);
 * rows past `rows` are zero. */
static inline void ll_qpack_panels(const uint8_t *src, ptrdiff_t rows, ptrdiff_t k, int wtype, uint8_t *dst,
                                   ptrdiff_t p0, ptrdiff_t p1) {
    const ptrdiff_t row_bytes = k / ll_qblock(wtype) * ll_ggml_block_bytes(wtype);
    const ptrdiff_t pb = k / ll_qblock(wtype) * ll_qblock_bytes(wtype);
    for (ptrdiff_t p = p0; p < p1; p++) {
        const uint8_t *rp[16];
        const int nrows = (int)(rows - p * 16 < 16 ? rows - p * 16 : 16);
        for (int r = 0; r < nrows; r++) rp[r] = src + (p * 16 + r) * row_bytes;
        ll_qpack_panel(rp, nrows, k, wtype, dst + p * pb);
    }
}

/* ---- quantize at load: fp32 rows -> ggml blocks (ggml's reference quantizers) --------------
 * Q8_0: d = max|x| / 127, q = round(x / d) (half away from zero);
 * Q4_0: m = the value of largest magnitude, d = m / -8, q = min(15, (int)(x / d + 8.5)). */

LL_INLINE void ll_put_f16_le(uint8_t *p, float f) {
    const uint16_t h = ll_f32_to_f16(f);
    p[0] = (uint8_t)(h & 0xff); p[1] = (uint8_t)(h >> 8);
}

static inline void ll_quantize_row_ggml(const float *x, ptrdiff_t k, int wtype, uint8_t *dst) {
    for (ptrdiff_t b = 0; b < k / 32; b++) {
        const float *v = x + 32 * b;
        if (wtype == LL_W_Q8_0) {
            uint8_t *blk = dst + 34 * b;
            float amax = 0.f;
            for (int i = 0; i < 32; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
            const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
            ll_put_f16_le(blk, d);
            for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)roundf(v[i] * id);
        } else {   /* Q4_0 */
            uint8_t *blk = dst + 18 * b;
            float amax = 0.f, m = 0.f;
            for (int i = 0; i < 32; i++)
                if (fabsf(v[i]) > amax) { amax = fabsf(v[i]); m = v[i]; }
            const float d = m / -8.f, id = d != 0.f ? 1.f / d : 0.f;
            ll_put_f16_le(blk, d);
            for (int i = 0; i < 16; i++) {
                const int q0 = (int)(v[i] * id + 8.5f), q1 = (int)(v[i + 16] * id + 8.5f);
                blk[2 + i] = (uint8_t)((q0 < 15 ? q0 : 15) | ((q1 < 15 ? q1 : 15) << 4));
            }
        }
    }
}

/* Value e (0..31) of row `lane` in a packed 32-block of nibbles (the layout above). */
LL_INLINE int ll_lane_nibble(const uint8_t *q, int lane, int e) {
    return (q[64 * ((e % 16) / 4) + 4 * lane + e % 4] >> (e < 16 ? 0 : 4)) & 15;
}

/* Row `lane` (0..15) of one packed panel, dequantized: out [k]. */
static inline void ll_qdequant_lane(const uint8_t *wp, int wtype, ptrdiff_t k, int lane, float *out) {
    const ptrdiff_t bb = ll_qblock_bytes(wtype);
    for (ptrdiff_t b = 0; b < k / ll_qblock(wtype); b++, wp += bb) {
        float *o = out + b * ll_qblock(wtype);
        if (wtype == LL_W_Q8_0) {
            const float d = ll_f16_to_f32(((const uint16_t *)(wp + 512))[lane]);
            for (int e = 0; e < 32; e++) o[e] = d * (float)(int8_t)wp[64 * (e / 4) + 4 * lane + e % 4];
        } else if (wtype == LL_W_IQ4_NL || wtype == LL_W_IQ4_XS) {
            const int xs = wtype == LL_W_IQ4_XS;
            const float d = ll_f16_to_f32(((const uint16_t *)(wp + (xs ? 0 : 256)))[lane]);
            for (int j = 0; j < (xs ? 8 : 1); j++) {
                const uint8_t *q = wp + (xs ? 160 + 256 * j : 0);
                const float ds = xs ? d * (float)(int8_t)wp[32 + 16 * j + lane] : d;
                for (int e = 0; e < 32; e++)
                    o[32 * j + e] = ds * (float)ll_iq4_values[ll_lane_nibble(q, lane, e)];
            }
        } else if (wtype == LL_W_Q4_0 || wtype == LL_W_Q4_1 || wtype == LL_W_Q5_0 || wtype == LL_W_Q5_1) {
            const int five = wtype == LL_W_Q5_0 || wtype == LL_W_Q5_1, qb = five ? 320 : 256;
            const float d = ll_f16_to_f32(((const uint16_t *)(wp + qb))[lane]);
            const float m = wtype == LL_W_Q4_1 || wtype == LL_W_Q5_1 ? ll_f16_to_f32(((const uint16_t *)(wp + qb + 32))[lane]) : 0.f;
            for (int e = 0; e < 32; e++) {
                int v = ll_lane_nibble(wp, lane, e);
                if (five) v |= ((wp[256 + 4 * lane + e % 4] >> (e / 4)) & 1) << 4;
                o[e] = wtype == LL_W_Q4_0 ? d * (float)(v - 8) : wtype == LL_W_Q5_0 ? d * (float)(v - 16) : d * (float)v + m;
            }
        } else if (wtype == LL_W_Q4_K || wtype == LL_W_Q5_K) {
            const ptrdiff_t sbb = wtype == LL_W_Q5_K ? 320 : 256;
            const float d = ll_f16_to_f32(((const uint16_t *)wp)[lane]);
            const float dmin = ll_f16_to_f32(((const uint16_t *)(wp + 32))[lane]);
            for (int j = 0; j < 8; j++) {
                const float ds = d * (float)wp[64 + 16 * j + lane], dm = dmin * (float)wp[192 + 16 * j + lane];
                const uint8_t *q = wp + 320 + sbb * j;
                for (int e = 0; e < 32; e++) {
                    int v = ll_lane_nibble(q, lane, e);
                    if (wtype == LL_W_Q5_K) v |= ((q[256 + 4 * lane + e % 4] >> (e / 4)) & 1) << 4;
                    o[32 * j + e] = ds * (float)v - dm;
                }
            }
        } else if (ll_wtype_is_codebook(wtype)) {
            uint8_t blk[112];
            ll_iq_row_block(wp, wtype, lane, blk);
            for (int j = 0; j < 8; j++) {
                uint8_t vals[512];
                float s[2];
                ll_iq_decode32(blk, wtype, j, vals, lane, s);
                for (int e = 0; e < 32; e++) o[32 * j + e] = s[e / 16] * (float)(int8_t)vals[64 * (e / 4) + 4 * lane + e % 4];
            }
        } else if (wtype == LL_W_MXFP4) {
            const float d = ll_e8m0_half(wp[256 + lane]);
            for (int e = 0; e < 32; e++) o[e] = d * (float)ll_mxfp4_values[ll_lane_nibble(wp, lane, e)];
        } else if (wtype == LL_W_Q2_K || wtype == LL_W_Q3_K || wtype == LL_W_TQ2_0 || wtype == LL_W_TQ1_0) {
            const int q2 = wtype == LL_W_Q2_K, q3 = wtype == LL_W_Q3_K;
            const float d = ll_f16_to_f32(((const uint16_t *)wp)[lane]);
            const float dmin = q2 ? ll_f16_to_f32(((const uint16_t *)(wp + 32))[lane]) : 0.f;
            for (int j = 0; j < 8; j++) {
                const uint8_t *q = wp + (q2 ? 320 + 128 * j : q3 ? 288 + 192 * j : 32 + 128 * j);
                for (int e = 0; e < 32; e++) {
                    const int g = e / 4, i = e % 4, grp = 2 * j + e / 16;
                    int v = (q[64 * (g / 4) + 4 * lane + i] >> (2 * (g % 4))) & 3;
                    if (q3) v |= ((q[128 + 4 * lane + i] >> g) & 1) << 2;
                    if (q2) {
                        const uint8_t sm = wp[64 + 16 * grp + lane];
                        o[32 * j + e] = d * (float)(sm & 15) * (float)v - dmin * (float)(sm >> 4);
                    } else if (q3) {
                        o[32 * j + e] = d * (float)(int8_t)wp[32 + 16 * grp + lane] * (float)(v - 4);
                    } else {
                        o[32 * j + e] = d * (float)(v - 1);
                    }
                }
            }
        } else {
            const float d = ll_f16_to_f32(((const uint16_t *)wp)[lane]);
            for (int j = 0; j < 8; j++) {
                const uint8_t *q = wp + 288 + 384 * j, *hb = q + 256;
                for (int e = 0; e < 32; e++) {
                    const int g = e / 4, i = e % 4;
                    const int lo = ll_lane_nibble(q, lane, e);
                    const int hi = (hb[64 * (g / 4) + 4 * lane + i] >> (2 * (g % 4))) & 3;
                    o[32 * j + e] = d * (float)(int8_t)wp[32 + 16 * (2 * j + e / 16) + lane] * (float)((lo | (hi << 4)) - 32);
                }
            }
        }
    }
}
LL_HOT_END
#endif
