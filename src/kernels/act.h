/* MLP activations of one row, on one thread. */
#ifndef LL_ACT_H
#define LL_ACT_H
#include "../simd/vec.h"
LL_HOT_BEGIN

enum { LL_ACT_SILU = 0, LL_ACT_GELU = 1, LL_ACT_GELU_TANH = 2, LL_ACT_RELU = 3,
       LL_ACT_QUICK_GELU = 4 /* x sigmoid(1.702 x): OpenAI CLIP's */,
       LL_ACT_SWIGLU_OAI = 5 /* gpt-oss's clamped SwiGLU, gated only (below) */,
       LL_ACT_RELU2 = 6 /* relu(x)^2: Nemotron-H's MLP */ };

/* gpt-oss's experts: g = min(gate, limit), u = clamp(up, -limit, limit),
 * out = (u + 1) g sigmoid(alpha g), alpha 1.702, limit 7 (the released models' values, which
 * the recipe checks). */
#define LL_SWIGLU_OAI_ALPHA 1.702f
#define LL_SWIGLU_OAI_LIMIT 7.0f

static inline float ll_act_scalar(float x, int act) {
    switch (act) {
    case LL_ACT_SILU: return x / (1.0f + expf(-x));
    case LL_ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case LL_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case LL_ACT_QUICK_GELU: return x / (1.0f + expf(-1.702f * x));
    case LL_ACT_RELU2: return x > 0.f ? x * x : 0.f;
    default: return x > 0.f ? x : 0.f;
    }
}

/* out[i] = act(gate[i]) * up[i] (gated) or act(gate[i]) (up == NULL); out may alias gate. */
static inline void ll_act_mul_f32(const float *gate, const float *up, float *out, ptrdiff_t n, int act) {
    ptrdiff_t i = 0;
    if (act == LL_ACT_SWIGLU_OAI) {
        const ll_vf32 one = ll_set1(1.0f), k = ll_set1(-LL_SWIGLU_OAI_ALPHA);
        const ll_vf32 z = ll_zero(), nhi = ll_set1(-LL_SWIGLU_OAI_LIMIT);   /* min(a, L) = -max(-a, -L) */
        for (; i + 16 <= n; i += 16) {
            const ll_vf32 g = ll_sub(z, ll_max(ll_sub(z, ll_load(gate + i)), nhi));
            const ll_vf32 u = ll_sub(z, ll_max(ll_sub(z, ll_max(ll_load(up + i), nhi)), nhi));
            const ll_vf32 r = ll_div(g, ll_add(one, ll_exp(ll_mul(k, g))));
            ll_store(out + i, ll_mul(r, ll_add(u, one)));
        }
        for (; i < n; i++) {
            const float g = gate[i] < LL_SWIGLU_OAI_LIMIT ? gate[i] : LL_SWIGLU_OAI_LIMIT;
            const float u = up[i] > LL_SWIGLU_OAI_LIMIT ? LL_SWIGLU_OAI_LIMIT
                          : up[i] < -LL_SWIGLU_OAI_LIMIT ? -LL_SWIGLU_OAI_LIMIT : up[i];
            out[i] = g / (1.0f + expf(-LL_SWIGLU_OAI_ALPHA * g)) * (u + 1.0f);
        }
        return;
    }
    if (act == LL_ACT_SILU || act == LL_ACT_QUICK_GELU) {
        const ll_vf32 one = ll_set1(1.0f), k = ll_set1(act == LL_ACT_SILU ? -1.0f : -1.702f);
        for (; i + 16 <= n; i += 16) {
            ll_vf32 g = ll_load(gate + i);
            ll_vf32 r = ll_div(g, ll_add(one, ll_exp(ll_mul(k, g))));
            ll_store(out + i, up ? ll_mul(r, ll_load(up + i)) : r);
        }
    } else if (act == LL_ACT_GELU_TANH) {   /* 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)) */
        const ll_vf32 one = ll_set1(1.0f), zero = ll_zero(), c1 = ll_set1(2.0f * 0.7978845608028654f);
        const ll_vf32 c3 = ll_set1(2.0f * 0.7978845608028654f * 0.044715f);
        for (; i + 16 <= n; i += 16) {
            ll_vf32 g = ll_load(gate + i);
            ll_vf32 two_u = ll_mul(g, ll_fma(ll_mul(g, g), c3, c1));
            ll_vf32 r = ll_div(g, ll_add(one, ll_exp(ll_sub(zero, two_u))));
            ll_store(out + i, up ? ll_mul(r, ll_load(up + i)) : r);
        }
    } else if (act == LL_ACT_GELU) {
        /* x Phi(x) = (x + |x|) / 2 - |x| q with q = Phi(-|x|) = erfc(|x| / sqrt 2) / 2, erfc by
         * Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7): the sign needs no select. */
        const ll_vf32 zero = ll_zero(), one = ll_set1(1.0f), half = ll_set1(0.5f);
        const ll_vf32 p = ll_set1(0.3275911f * 0.70710678118654752f), mhalf = ll_set1(-0.5f);
        const ll_vf32 a1 = ll_set1(0.254829592f), a2 = ll_set1(-0.284496736f), a3 = ll_set1(1.421413741f);
        const ll_vf32 a4 = ll_set1(-1.453152027f), a5 = ll_set1(1.061405429f);
        for (; i + 16 <= n; i += 16) {
            ll_vf32 g = ll_load(gate + i), ax = ll_max(g, ll_sub(zero, g));
            ll_vf32 t = ll_div(one, ll_fma(p, ax, one));
            ll_vf32 poly = ll_mul(t, ll_fma(t, ll_fma(t, ll_fma(t, ll_fma(t, a5, a4), a3), a2), a1));
            ll_vf32 q = ll_mul(ll_mul(half, poly), ll_exp(ll_mul(mhalf, ll_mul(g, g))));
            ll_vf32 r = ll_sub(ll_mul(half, ll_add(g, ax)), ll_mul(ax, q));
            ll_store(out + i, up ? ll_mul(r, ll_load(up + i)) : r);
        }
    } else if (act == LL_ACT_RELU || act == LL_ACT_RELU2) {
        const ll_vf32 zero = ll_zero();
        for (; i + 16 <= n; i += 16) {
            ll_vf32 r = ll_max(ll_load(gate + i), zero);
            if (act == LL_ACT_RELU2) r = ll_mul(r, r);
            ll_store(out + i, up ? ll_mul(r, ll_load(up + i)) : r);
        }
    }
    for (; i < n; i++) {
        float r = ll_act_scalar(gate[i], act);
        out[i] = up ? r * up[i] : r;
    }
}
/* cap * tanh(x / cap) of 16 values (soft-capped scores or logits), tanh(y) = 1 - 2 / (1 + exp(2y)). */
LL_INLINE ll_vf32 ll_softcap_v(ll_vf32 x, float cap) {
    const ll_vf32 one = ll_set1(1.0f), e = ll_exp(ll_mul(x, ll_set1(2.0f / cap)));
    return ll_mul(ll_set1(cap), ll_sub(one, ll_div(ll_set1(2.0f), ll_add(one, e))));
}

/* x[i] = cap * tanh(x[i] / cap). */
static inline void ll_softcap_f32(float *x, ptrdiff_t n, float cap) {
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16) ll_store(x + i, ll_softcap_v(ll_load(x + i), cap));
    for (; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}
LL_HOT_END
#endif
