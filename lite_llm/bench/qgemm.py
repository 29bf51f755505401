"""`lite-llm bench qgemm`: one GGUF block type's GEMM kernel alone, on this machine.

Random block bytes (sane fp16 scales) of an [N, K] weight in each block type, packed into the
kernels' 16-row panels, multiplied by [T, K] float activations (quantized to int8 blocks inside
the call, as the model's layers do) on --threads threads (1 by default: repeatable on a shared
machine). Reported per type and token count: the median milliseconds of --repeats timed runs
(each the mean of as many calls as fill --min-time), and the packed weight bytes read per
millisecond as GB/s (decode reads each byte once per call).
"""
from __future__ import annotations

import argparse
import json
import time

TYPES = ("Q4_K", "Q2_K", "Q3_K", "TQ2_0", "TQ1_0", "MXFP4", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
         "IQ1_S", "IQ1_M")
# where each type's fp16 d (and Q2_K's/Q4_K's dmin after it) sits in its ggml block
_SCALE_AT = {"Q4_K": 0, "Q5_K": 0, "Q6_K": 208, "Q2_K": 80, "Q3_K": 108, "TQ2_0": 64, "TQ1_0": 52,
             "IQ2_XXS": 0, "IQ2_XS": 0, "IQ2_S": 0, "IQ3_XXS": 0, "IQ3_S": 0, "IQ1_S": 0, "IQ4_XS": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--types", default=",".join(TYPES), help="ggml block types, comma-separated")
    parser.add_argument("--n", type=int, default=2048, help="weight rows")
    parser.add_argument("--k", type=int, default=2048, help="weight columns (a multiple of 256)")
    parser.add_argument("--tokens", default="1,64", help="token counts, comma-separated")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds of calls per timed run")
    parser.add_argument("--variant", default=None, help="kernel variant (default: the dispatcher's)")
    parser.add_argument("--json", action="store_true")


def _raw(rng, qname: str, n: int, k: int):
    import gguf
    import numpy as np
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qname]]
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    d = rng.uniform(0.001, 0.05, (n, k // block, 2)).astype("<f2").view(np.uint8)
    if qname == "MXFP4":
        raw[..., 0] = rng.integers(117, 129, (n, k // block), dtype=np.uint8)
    elif qname == "IQ1_M":       # d in the top nibbles of the 4 u16 scales at 48
        h = d[..., 0:2].copy().view("<u2")[..., 0]
        for i in range(4):
            top = ((h >> (4 * i)) & 15).astype(np.uint8)
            raw[..., 48 + 2 * i + 1] = (raw[..., 48 + 2 * i + 1] & 15) | (top << 4)
    elif qname in _SCALE_AT:
        at = _SCALE_AT[qname]
        raw[..., at:at + 4 if qname in ("Q4_K", "Q5_K", "Q2_K") else at + 2] = \
            d.reshape(n, k // block, 4)[..., :4 if qname in ("Q4_K", "Q5_K", "Q2_K") else 2]
    return raw.reshape(n, -1)


def _time(fn, repeats: int, min_time: float) -> float:
    fn()
    calls = 1
    start = time.perf_counter()
    while time.perf_counter() - start < min_time:
        fn()
        calls += 1
    calls = max(1, calls - 1)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls)
    return sorted(runs)[len(runs) // 2]


def run(args: argparse.Namespace) -> int:
    import numpy as np
    from lite_llm import _kernels
    from lite_llm._kernels.layout import aligned_empty
    mod = _kernels.load(args.variant) if args.variant else _kernels.kernels
    rng = np.random.default_rng(0)
    n, k = args.n, args.k
    tokens = [int(t) for t in args.tokens.split(",")]
    results = []
    for qname in args.types.split(","):
        raw = _raw(rng, qname, n, k)
        # cache-line aligned, as the engine's packed weights are (a numpy array's data starts
        # 16 bytes into a page, and every panel load would then straddle two lines)
        packed = aligned_empty(((n + 15) // 16, mod.qpanel_bytes(qname, k)), np.uint8)
        packed[...] = 0
        mod.qpack_into(np.ascontiguousarray(raw), packed, qname, k, 1)
        for t in tokens:
            x = rng.standard_normal((t, k)).astype(np.float32)
            out = np.zeros((t, n), np.float32)
            sec = _time(lambda: mod.gemm(x, packed, qname, n, out, num_threads=args.threads), args.repeats,
                        args.min_time)
            results.append({"type": qname, "tokens": t, "ms": sec * 1e3, "gb_s": packed.nbytes / sec / 1e9,
                            "gmac_s": t * n * k / sec / 1e9})
            if not args.json:
                r = results[-1]
                print(f"{qname:8s} T={t:<4d} {r['ms']:8.3f} ms  {r['gb_s']:6.2f} GB/s  {r['gmac_s']:7.2f} GMAC/s",
                      flush=True)
    if args.json:
        print(json.dumps({"variant": getattr(mod, "VARIANT_NAME", None), "n": n, "k": k, "threads": args.threads,
                          "results": results}, indent=1))
    return 0
