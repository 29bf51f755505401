"""NumPy references: the spec of every kernel in lite_llm/_kernels (ops.pxi), in float64.

Each function states in one or two lines what the compiled kernel must compute; the
kernel tests compare every ISA variant against these. Low-precision helpers (bf16 as
uint16 bits, round to nearest even) live here too so tests can build the exact inputs a
kernel sees (e.g. bf16-rounded weights).
"""
from __future__ import annotations

import numpy as np

# ---- low-precision numbers -------------------------------------------------------------


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even; NaN stays a (quiet) NaN."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32 (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16, as float32."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


# fp8 (OCP): (mantissa bits, exponent bias, largest finite value); e4m3 is the "fn" variant
FP8 = {"fp8_e4m3": (3, 7, 448.0), "fp8_e5m2": (2, 15, 57344.0)}


def fp8_round(x: np.ndarray, fmt: str) -> np.ndarray:
    """float values rounded to the nearest fp8 value (ties to even), saturating at the largest
    finite one, as float64 (exact)."""
    mant, bias, top = FP8[fmt]
    x = np.asarray(x, np.float64)
    _, e = np.frexp(np.abs(x))                            # |x| = m 2^e, m in [0.5, 1)
    exp = np.maximum(e - 1, 1 - bias)                     # subnormals share the smallest normal's quantum
    quantum = np.ldexp(1.0, exp - mant)
    return np.copysign(np.minimum(np.rint(np.abs(x) / quantum) * quantum, top), x)


def f32_to_fp8_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    """float -> fp8 bits (uint8), rounded by fp8_round."""
    mant, bias, _ = FP8[fmt]
    r = fp8_round(x, fmt)
    a = np.abs(r)
    _, e = np.frexp(a)
    normal = (e - 1 >= 1 - bias) & (a > 0)
    field = np.where(normal, e - 1 + bias, 0)
    m = np.where(normal, a / np.ldexp(1.0, e - 1 - mant) - (1 << mant), a / np.ldexp(1.0, 1 - bias - mant))
    sign = np.signbit(r).astype(np.int64) << 7
    return (sign | (field.astype(np.int64) << mant) | m.astype(np.int64)).astype(np.uint8)


def fp8_bits_to_f32(bits: np.ndarray, fmt: str) -> np.ndarray:
    """fp8 bits (uint8) -> float64 (exact; NaN / infinity codes are never written)."""
    mant, bias, _ = FP8[fmt]
    b = np.asarray(bits, np.uint8).astype(np.int64)
    field, m = (b >> mant) & ((1 << (7 - mant)) - 1), b & ((1 << mant) - 1)
    mag = np.where(field == 0, np.ldexp(m.astype(np.float64), 1 - bias - mant),
                   np.ldexp(1.0 + m / (1 << mant), field - bias))
    return np.where(b & 0x80, -mag, mag)


KV8_MAX = {"int8": 127.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


def quantize_kv(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows x [..., D] float32 -> (codes [..., D], scales [...] float32) of an 8-bit KV cache:
    scale = max |x| / KV8_MAX (float32), code = x / scale (float32) rounded to nearest even,
    int8 clamped to +-127, fp8 by f32_to_fp8_bits; a zero row has scale 0 and codes 0."""
    x = np.asarray(x, np.float32)
    scale = (np.abs(x).max(axis=-1) / np.float32(KV8_MAX[fmt])).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))[..., None]
    y = np.where(scale[..., None] > 0, x / safe, np.float32(0)).astype(np.float32)
    if fmt == "int8":
        return np.clip(np.rint(y), -127, 127).astype(np.int8), scale
    return f32_to_fp8_bits(y, fmt), scale


def dequantize_kv(codes: np.ndarray, scales: np.ndarray, fmt: str) -> np.ndarray:
    """(codes [..., D], scales [...]) -> values [..., D] float64."""
    vals = codes.astype(np.float64) if fmt == "int8" else fp8_bits_to_f32(codes, fmt)
    return vals * scales[..., None].astype(np.float64)


# ---- kernels ---------------------------------------------------------------------------


def gemm(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x [T, K] @ w [N, K].T (+ bias [N]) -> [T, N]."""
    out = x.astype(np.float64) @ w.astype(np.float64).T
    return out if bias is None else out + bias


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x [T, E] / sqrt(mean(x^2) + eps) * w [E]."""
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """(x [T, E] - mean) / sqrt(var + eps) * w [E] + b [E] (biased variance, like torch)."""
    x = x.astype(np.float64)
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def rope_tables(max_positions: int, head_dim: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [P, D/2] float32 for inv_freq_i = theta^(-2i/D), as transformers builds them."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rope_neox(x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE of x [T, H, D] at positions [T]: (a, b) -> (a c - b s, b c + a s)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def _erf(x: np.ndarray) -> np.ndarray:
    from math import erf
    return np.vectorize(erf, otypes=[np.float64])(x)


ACTIVATIONS = {
    "silu": lambda g: g / (1.0 + np.exp(-g)),
    "gelu": lambda g: 0.5 * g * (1.0 + _erf(g / np.sqrt(2.0))),
    "gelu_tanh": lambda g: 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3))),
    "relu": lambda g: np.maximum(g, 0.0),
    "quick_gelu": lambda g: g / (1.0 + np.exp(-1.702 * g)),      # OpenAI CLIP's
    "relu2": lambda g: np.maximum(g, 0.0) ** 2,                  # Nemotron-H's
}


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """Soft-capped logits (Gemma 2): cap * tanh(x / cap)."""
    return cap * np.tanh(x.astype(np.float64) / cap)


def act_mul(gate: np.ndarray, up: np.ndarray | None, act: str) -> np.ndarray:
    """act(gate [T, F]) * up [T, F], or act(gate) when up is None."""
    with np.errstate(over="ignore"):
        r = ACTIVATIONS[act](gate.astype(np.float64))
    return r if up is None else r * up


def write_kv(cache: np.ndarray, src: np.ndarray, slot_mapping: np.ndarray) -> np.ndarray:
    """A copy of cache [num_blocks, Hkv, B, D] with src [T, Hkv, D] stored at each token's slot
    (block slot // B, row slot % B); a uint16 cache stores bf16 bits rounded to nearest even."""
    out = cache.copy()
    block_size = cache.shape[2]
    rows = f32_to_bf16_bits(src) if cache.dtype == np.uint16 else src
    for tok, slot in enumerate(slot_mapping):
        out[slot // block_size, :, slot % block_size, :] = rows[tok]
    return out


def write_kv8(codes: np.ndarray, scales: np.ndarray, src: np.ndarray, slot_mapping: np.ndarray,
              fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """write_kv for an 8-bit cache (codes [num_blocks, Hkv, B, D], scales [num_blocks, Hkv, B]):
    each written row quantized by quantize_kv."""
    codes, scales = codes.copy(), scales.copy()
    block_size = codes.shape[2]
    q, d = quantize_kv(src, fmt)
    for tok, slot in enumerate(slot_mapping):
        codes[slot // block_size, :, slot % block_size, :] = q[tok]
        scales[slot // block_size, :, slot % block_size] = d[tok]
    return codes, scales


def kv_values(cache: np.ndarray) -> np.ndarray:
    """A KV cache as float64 values (bf16 bits decoded)."""
    return (bf16_bits_to_f32(cache) if cache.dtype == np.uint16 else cache).astype(np.float64)


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, block_tables: np.ndarray,
                    tok_seq: np.ndarray, positions: np.ndarray, scale: float,
                    sliding_window: int = 0, softcap: float = 0.0, round_q: bool | None = None,
                    last_positions: np.ndarray | None = None, sinks: np.ndarray | None = None) -> np.ndarray:
    """out [T, H, D]: query token t (of sequence tok_seq[t], at positions[t]) attends, per head h,
    to kv head h // (H / Hkv) at its sequence's positions first..last, where last is
    last_positions[t] (default positions[t]: causal) and first is positions[t] - sliding_window + 1
    (clamped at 0) with a window, else 0: softmax(q.K * scale) @ V,
    the scaled scores soft-capped first (softcap(s) = softcap * tanh(s / softcap)) when softcap > 0;
    sinks [H]: head h's logit joins the softmax's denominator (gpt-oss), no value beside it.
    Caches are logical [num_blocks, Hkv, B, D]. round_q (default: with a bf16 cache): q * scale
    is rounded to bf16 first, as the kernel's bf16 dot products take it (its probabilities are
    rounded too: tolerance)."""
    if round_q is None:
        round_q = k_cache.dtype == np.uint16
    num_tokens, num_heads, _ = q.shape
    num_kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    kv, vv = kv_values(k_cache), kv_values(v_cache)
    out = np.empty(q.shape, np.float64)
    for t in range(num_tokens):
        last = int(positions[t] if last_positions is None else last_positions[t])
        first = max(int(positions[t]) - sliding_window + 1, 0) if sliding_window > 0 else 0
        pos = np.arange(first, last + 1)
        blocks = block_tables[tok_seq[t]][pos // block_size]
        rows = pos % block_size
        for h in range(num_heads):
            keys = kv[blocks, h // group, rows]          # [L, D]
            vals = vv[blocks, h // group, rows]          # [L, D]
            if round_q:
                qs = bf16_bits_to_f32(f32_to_bf16_bits(q[t, h] * np.float32(scale))).astype(np.float64)
                s = keys @ qs
            else:
                s = keys @ q[t, h].astype(np.float64) * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            top = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            p = np.exp(s - top)
            out[t, h] = p @ vals / (p.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - top)))
    return out


# ---- int8 activations of block-quantized GEMMs (src/kernels/qgemm.h) ----------------------


def quantize_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x [T, K] float32 in blocks of 32 -> (q int8 [T, K], d [T, K/32], s [T, K/16], n int32 [T, K/16]),
    in float32 arithmetic as the kernel does it: d = max|x| / 127, q = rint(x * (127 / max|x|)) (0
    for an all-zero block), s = d * (sum of q over each half-block of 16), n = sum of q over each
    half-block."""
    t, k = x.shape
    xb = np.ascontiguousarray(x, np.float32).reshape(t, k // 32, 32)
    amax = np.abs(xb).max(-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int8)
    n = q.reshape(t, k // 32, 2, 16).astype(np.int32).sum(-1, dtype=np.int32)
    s = (d[..., None] * n.astype(np.float32)).astype(np.float32)
    return q.reshape(t, k), d, s.reshape(t, k // 16), n.reshape(t, k // 16)


def dequantize_q8(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The values int8 blocks stand for: q [T, K] * d [T, K/32] per block, float64."""
    t, k = q.shape
    return (q.reshape(t, k // 32, 32).astype(np.float64) * d[..., None]).reshape(t, k)


def qgemm(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """A block-quantized GEMM: x [T, K] quantized to int8 blocks (quantize_q8), times the
    dequantized weight w [N, K] (+ bias), in float64."""
    return gemm(dequantize_q8(*quantize_q8(x)[:2]), w, bias)


def lora(x: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    """A LoRA adapter's addition to a projection: (x [T, K] @ A [r, K]^T) @ B [N, r]^T * scale,
    in float64."""
    return (x.astype(np.float64) @ a.astype(np.float64).T) @ b.astype(np.float64).T * scale


def nomic_bert(w: dict, ids: np.ndarray, num_heads: int, eps: float, theta: float) -> np.ndarray:
    """NomicBert's (nomic-embed-text) final hidden states [T, E] of one sequence ids [T], from
    nomic's state dict w (token type 0): embeddings -> LayerNorm; per layer, bidirectional
    attention with rotate-half RoPE on q and k (fused Wqkv, no biases), + residual, LayerNorm
    (norm1); SwiGLU silu(fc12 x) * fc11 x, fc2, + residual, LayerNorm (norm2)."""
    T = len(ids)
    E = w["emb_ln.weight"].shape[0]
    D = E // num_heads
    x = w["embeddings.word_embeddings.weight"][ids].astype(np.float64)
    if "embeddings.token_type_embeddings.weight" in w:
        x = x + w["embeddings.token_type_embeddings.weight"][0]
    x = layernorm(x, w["emb_ln.weight"], w["emb_ln.bias"], eps)
    cos, sin = rope_tables(T, D, theta)
    pos = np.arange(T)
    num_layers = len({k.split(".")[2] for k in w if k.startswith("encoder.layers.")})
    for i in range(num_layers):
        p = f"encoder.layers.{i}."
        q, k, v = np.split(gemm(x, w[p + "attn.Wqkv.weight"]), 3, axis=-1)
        q = rope_neox(q.reshape(T, num_heads, D), pos, cos, sin)
        k = rope_neox(k.reshape(T, num_heads, D), pos, cos, sin)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", s, v.reshape(T, num_heads, D)).reshape(T, E)
        x = layernorm(x + gemm(attn, w[p + "attn.out_proj.weight"]), w[p + "norm1.weight"], w[p + "norm1.bias"], eps)
        h = act_mul(gemm(x, w[p + "mlp.fc12.weight"]), gemm(x, w[p + "mlp.fc11.weight"]), "silu")
        x = layernorm(x + gemm(h, w[p + "mlp.fc2.weight"]), w[p + "norm2.weight"], w[p + "norm2.bias"], eps)
    return x


def short_conv(bcx: np.ndarray, state: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
               reset: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """LFM2's gated short convolution of one sequence's tokens: bcx [n, 3E] (B | C | x), state
    [L - 1, E] (the previous gated inputs, oldest first), w [L, E] (tap L - 1 the token's own)
    -> (out [n, E] = C * causal_conv(B * x), the new state [L - 1, E])."""
    n, E = bcx.shape[0], bcx.shape[1] // 3
    L = w.shape[0]
    b, c, x = bcx[:, :E].astype(np.float64), bcx[:, E:2 * E].astype(np.float64), bcx[:, 2 * E:].astype(np.float64)
    prev = np.zeros((L - 1, E)) if reset else state.astype(np.float64)
    ext = np.concatenate([prev, b * x])                                   # [L - 1 + n, E]
    y = sum(w[k].astype(np.float64) * ext[k:k + n] for k in range(L))
    if bias is not None:
        y = y + bias
    return (c * y).astype(np.float32), ext[n:].astype(np.float32)


def ssd_scan(x: np.ndarray, dt: np.ndarray, A: np.ndarray, D: np.ndarray, B: np.ndarray, C: np.ndarray,
             state: np.ndarray, reset: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Mamba2's state-space recurrence token by token (the plain definition): x [n, H P], dt
    [n, H] (after softplus), A, D [H], B, C [n, G N], state [H, P, N]; head h reads group
    h // (H / G). Per token: S = exp(dt A) S + dt x B^T, y = S C + D x. -> (y [n, H P], state)."""
    H, P, N = state.shape
    per = H // (B.shape[1] // N)
    S = np.zeros((H, P, N)) if reset else state.astype(np.float64)
    y = np.zeros(x.shape)
    for t in range(x.shape[0]):
        for h in range(H):
            g = h // per
            xh, b, c = x[t, h * P:(h + 1) * P].astype(np.float64), B[t, g * N:(g + 1) * N], C[t, g * N:(g + 1) * N]
            S[h] = np.exp(dt[t, h] * A[h]) * S[h] + dt[t, h] * np.outer(xh, b)
            y[t, h * P:(h + 1) * P] = S[h] @ c + D[h] * xh
    return y.astype(np.float32), S.astype(np.float32)


def causal_conv_silu(x: np.ndarray, state: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
                     reset: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Mamba2's causal depthwise convolution with SiLU: x [n, E], state [L - 1, E] (the previous
    inputs, oldest first), w [L, E] (tap L - 1 the token's own) -> (out [n, E], new state)."""
    n, L = x.shape[0], w.shape[0]
    prev = np.zeros((L - 1, x.shape[1])) if reset else state.astype(np.float64)
    ext = np.concatenate([prev, x.astype(np.float64)])
    y = sum(w[k].astype(np.float64) * ext[k:k + n] for k in range(L))
    if bias is not None:
        y = y + bias
    return (y / (1.0 + np.exp(-y))).astype(np.float32), ext[n:].astype(np.float32)


def gated_delta(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                state: np.ndarray, reset: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule token by token (the plain definition, as transformers'
    torch_recurrent_gated_delta_rule): q, k [n, Hk Dk] (q L2-normalised and scaled, k
    L2-normalised), v [n, Hv Dv], g (log decay) and beta [n, Hv], state [Hv, Dk, Dv]; value head h
    reads query / key head h // (Hv / Hk). Per token: S = exp(g) S, S += k (beta (v - S^T k))^T,
    o = S^T q. -> (o [n, Hv Dv], state)."""
    Hv, Dk, Dv = state.shape
    per = Hv // (q.shape[1] // Dk)
    S = np.zeros((Hv, Dk, Dv)) if reset else state.astype(np.float64)
    o = np.zeros((q.shape[0], Hv * Dv))
    for t in range(q.shape[0]):
        for h in range(Hv):
            kh = h // per
            qt, kt = q[t, kh * Dk:(kh + 1) * Dk].astype(np.float64), k[t, kh * Dk:(kh + 1) * Dk].astype(np.float64)
            S[h] *= np.exp(np.float64(g[t, h]))
            S[h] += np.outer(kt, beta[t, h] * (v[t, h * Dv:(h + 1) * Dv] - S[h].T @ kt))
            o[t, h * Dv:(h + 1) * Dv] = S[h].T @ qt
    return o.astype(np.float32), S.astype(np.float32)


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum x^2 + eps) along the last axis (FLA's and transformers' l2norm)."""
    x = x.astype(np.float64)
    return (x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)).astype(np.float32)
