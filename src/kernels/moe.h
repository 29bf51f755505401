/* Mixture-of-experts pieces of one token (or one column range), one thread: the router's
 * logits and its top-k choice, and the weighted sum of the chosen experts' outputs. The expert
 * MLPs themselves are ordinary matrices (matmul.h ll_mat_gated / ll_mat_gemm over the rows
 * routed to them); grouping the step's tokens by expert and the parallel loops are the
 * caller's (lite_llm/_kernels/forward.pxi _moe_block).
 */
#ifndef LL_MOE_H
#define LL_MOE_H
#include "../simd/vec.h"
LL_HOT_BEGIN

/* a . b over n values. */
static inline float ll_dot_f32(const float *a, const float *b, ptrdiff_t n) {
    ll_vf32 acc = ll_zero();
    ptrdiff_t i = 0;
    for (; i + LL_VF32_LANES <= n; i += LL_VF32_LANES) acc = ll_fma(ll_load(a + i), ll_load(b + i), acc);
    float sum = ll_hsum(acc);
    for (; i < n; i++) sum += a[i] * b[i];   /* tail: n need not be a multiple of the lanes */
    return sum;
}

/* The k largest logits' expert ids into sel [k], the larger first, the lower expert index first
 * among equals (as a stable sort, and torch.topk of distinct values): k passes, as k and X are
 * small (8 of 128). */
static inline void ll_moe_pick(const float *logits, int num_experts, int k, int32_t *sel) {
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int e = 0; e < num_experts; e++) {
            int taken = 0;
            for (int j = 0; j < i; j++) taken |= sel[j] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        sel[i] = best;
    }
}

/* The router of one token: softmax over the X logits, the k largest probabilities (the lower
 * expert index first among equals, as a stable sort would), divided by their sum when renorm
 * (Mixtral; Qwen's norm_topk_prob). sel [k] expert ids, weight [k]. */
static inline void ll_moe_topk(const float *logits, int num_experts, int k, int renorm, int32_t *sel,
                               float *weight) {
    float mx = logits[0], total = 0.f, chosen = 0.f;
    for (int e = 1; e < num_experts; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < num_experts; e++) total += expf(logits[e] - mx);
    ll_moe_pick(logits, num_experts, k, sel);   /* the largest logits are the largest probabilities */
    for (int i = 0; i < k; i++) {
        weight[i] = expf(logits[sel[i]] - mx) / total;
        chosen += weight[i];
    }
    if (renorm)
        for (int i = 0; i < k; i++) weight[i] /= chosen;
}

/* Routing modes of ll_moe_route: softmax over all X logits then the top k (Mixtral, Qwen-MoE;
 * renormalised when asked), or the top k logits then a softmax over those k (gpt-oss). */
enum { LL_MOE_SOFTMAX_TOPK = 0, LL_MOE_TOPK_SOFTMAX = 1 };

/* The router of one token in `mode`: sel [k] expert ids (the larger logit first, the lower
 * index first among equals, as torch.topk of distinct values), weight [k]. */
static inline void ll_moe_route(const float *logits, int num_experts, int k, int renorm, int mode, int32_t *sel,
                                float *weight) {
    if (mode != LL_MOE_TOPK_SOFTMAX) {
        ll_moe_topk(logits, num_experts, k, renorm, sel, weight);
        return;
    }
    ll_moe_pick(logits, num_experts, k, sel);
    const float mx = logits[sel[0]];   /* the largest */
    float total = 0.f;
    for (int i = 0; i < k; i++) total += weight[i] = expf(logits[sel[i]] - mx);
    for (int i = 0; i < k; i++) weight[i] /= total;
}

/* DeepSeek's routing (ll_moe_route_grouped's `sigmoid`): V2 takes softmax probabilities,
 * V3 sigmoid scores chosen by score + a per-expert correction bias; both can limit the choice
 * to the topk_group best of n_group equal groups of experts. */
enum { LL_MOE_GROUPED_SOFTMAX = 2, LL_MOE_GROUPED_SIGMOID = 3 };
#define LL_MOE_MAX_EXPERTS 1024

/* The router of one token as DeepSeek-V2 / V3 (and transformers' DeepseekV2/V3TopkRouter):
 *   scores   softmax over the X logits (V2), or sigmoid of each (V3)
 *   choice   the scores, plus bias[e] where bias is not NULL (V3's e_score_correction_bias)
 *   groups   with n_group > 1: each group of X / n_group experts scored by its largest choice
 *            (V2's group_limited_greedy) or the sum of its two largest (V3); the topk_group best
 *            groups kept, the others' choices masked (V2: to 0, V3: to -inf)
 *   top k    sel [k] the k largest choices (the lower expert index first among equals)
 *   weight   V2: the chosen (masked) probabilities; V3: the chosen experts' scores without the
 *            bias; renorm: divided by their sum (+ 1e-20); then times scale (routed_scaling_factor)
 * X at most LL_MOE_MAX_EXPERTS, n_group dividing it. */
static inline void ll_moe_route_grouped(const float *logits, const float *bias, int num_experts, int k, int n_group,
                                        int topk_group, int renorm, int sigmoid, float scale, int32_t *sel,
                                        float *weight) {
    float score[LL_MOE_MAX_EXPERTS], choice[LL_MOE_MAX_EXPERTS], gscore[LL_MOE_MAX_EXPERTS];
    int32_t gsel[LL_MOE_MAX_EXPERTS];
    const int X = num_experts;
    if (sigmoid) {
        for (int e = 0; e < X; e++) {
            score[e] = 1.f / (1.f + expf(-logits[e]));
            choice[e] = score[e] + (bias ? bias[e] : 0.f);
        }
    } else {
        float mx = logits[0], total = 0.f;
        for (int e = 1; e < X; e++) mx = logits[e] > mx ? logits[e] : mx;
        for (int e = 0; e < X; e++) total += score[e] = expf(logits[e] - mx);
        for (int e = 0; e < X; e++) choice[e] = score[e] /= total;
    }
    if (n_group > 1 && topk_group < n_group) {
        const int per = X / n_group;
        for (int g = 0; g < n_group; g++) {
            const float *c = choice + g * per;
            float best = -INFINITY, second = -INFINITY;
            for (int e = 0; e < per; e++) {
                if (c[e] > best) { second = best; best = c[e]; }
                else if (c[e] > second) second = c[e];
            }
            gscore[g] = sigmoid ? best + (per > 1 ? second : 0.f) : best;
        }
        ll_moe_pick(gscore, n_group, topk_group, gsel);
        for (int g = 0; g < n_group; g++) {
            int kept = 0;
            for (int j = 0; j < topk_group; j++) kept |= gsel[j] == g;
            if (!kept)
                for (int e = g * per; e < (g + 1) * per; e++) choice[e] = sigmoid ? -INFINITY : 0.f;
        }
    }
    ll_moe_pick(choice, X, k, sel);
    float total = 0.f;
    for (int i = 0; i < k; i++) total += weight[i] = sigmoid ? score[sel[i]] : choice[sel[i]];
    const float f = renorm ? scale / (total + 1e-20f) : scale;
    for (int i = 0; i < k; i++) weight[i] *= f;
}

/* y[0..n) += a * x[0..n). */
static inline void ll_axpy_f32(float a, const float *x, float *y, ptrdiff_t n) {
    const ll_vf32 va = ll_set1(a);
    ptrdiff_t i = 0;
    for (; i + LL_VF32_LANES <= n; i += LL_VF32_LANES) ll_store(y + i, ll_fma(va, ll_load(x + i), ll_load(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}
LL_HOT_END
#endif
