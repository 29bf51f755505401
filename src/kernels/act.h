/* MLP activations of one row, on one thread. */
#ifndef LL_ACT_H
#define LL_ACT_H
#include "../simd/vec.h"

enum { LL_ACT_SILU = 0, LL_ACT_GELU = 1, LL_ACT_GELU_TANH = 2, LL_ACT_RELU = 3 };

static inline float ll_act_scalar(float x, int act) {
    switch (act) {
    case LL_ACT_SILU: return x / (1.0f + expf(-x));
    case LL_ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case LL_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    default: return x > 0.f ? x : 0.f;
    }
}

/* out[i] = act(gate[i]) * up[i] (gated) or act(gate[i]) (up == NULL); out may alias gate. */
static inline void ll_act_mul_f32(const float *gate, const float *up, float *out, ptrdiff_t n, int act) {
    ptrdiff_t i = 0;
    if (act == LL_ACT_SILU) {
        const ll_vf32 one = ll_set1(1.0f), zero = ll_zero();
        for (; i + 16 <= n; i += 16) {
            ll_vf32 g = ll_load(gate + i);
            ll_vf32 r = ll_div(g, ll_add(one, ll_exp(ll_sub(zero, g))));
            ll_store(out + i, up ? ll_mul(r, ll_load(up + i)) : r);
        }
    } else if (act == LL_ACT_RELU) {
        const ll_vf32 zero = ll_zero();
        for (; i + 16 <= n; i += 16) {
            ll_vf32 r = ll_max(ll_load(gate + i), zero);
            ll_store(out + i, up ? ll_mul(r, ll_load(up + i)) : r);
        }
    }
    for (; i < n; i++) {
        float r = ll_act_scalar(gate[i], act);
        out[i] = up ? r * up[i] : r;
    }
}
#endif
