"""`lite-llm bench prefix`: what the prefix cache saves. Request A has a long shared prefix
plus its own suffix (cold cache); request B has the same prefix and another suffix and runs
after A has finished: its TTFT should be mostly the suffix's prefill. Repeated with fresh
random prefixes; medians reported, with the same workload without prefix caching as the
reference ratio."""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from lite_llm.bench import common


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_engine_arguments(p)
    p.add_argument("--prefix-len", type=int, default=1500)
    p.add_argument("--suffix-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--num-iters", type=int, default=3)


def _ttfts(engine, vocab: int, args, seed: int) -> tuple[float, float, int]:
    prefix, sa, sb = (common.random_prompts(1, n, vocab, seed + i)[0]
                      for i, n in enumerate((args.prefix_len, args.suffix_len, args.suffix_len)))
    (a,) = common.run_requests(engine, [prefix + sa], args.output_len)
    (b,) = common.run_requests(engine, [prefix + sb], args.output_len)
    return a.first_token - a.arrival, b.first_token - b.arrival, b.num_cached_tokens


def run(args) -> int:
    engine, loaded, info = common.build(args, max_model_len=args.prefix_len + args.suffix_len + args.output_len + 1)
    try:
        vocab = loaded.config.vocab_size
        common.run_requests(engine, common.random_prompts(1, 64, vocab, 99), 2)   # warm-up
        rows = []
        for i in range(args.num_iters):
            cold, warm, cached = _ttfts(engine, vocab, args, 1000 * (i + 1))
            rows.append((cold, warm, cached))
            print(f"iteration {i + 1}/{args.num_iters}: first {cold * 1e3:.1f} ms, second {warm * 1e3:.1f} ms "
                  f"({cached} tokens from the cache)", file=sys.stderr)
        cold = statistics.median(r[0] for r in rows)
        warm = statistics.median(r[1] for r in rows)
        result = {"prefix_len": args.prefix_len, "suffix_len": args.suffix_len, "ttft_first_s": cold,
                  "ttft_second_s": warm, "ratio": warm / cold, "cached_tokens": rows[-1][2],
                  "kernel_variant": info["kernel_variant"], "num_threads": info["num_threads"]}
    finally:
        engine.shutdown()
    if args.json:
        print(json.dumps(result))
    else:
        print(f"prefix {args.prefix_len} + suffix {args.suffix_len} tokens, {info['kernel_variant']}, "
              f"{info['num_threads']} threads")
        print(f"TTFT first request (cold)   {cold * 1e3:9.1f} ms")
        print(f"TTFT second request (warm)  {warm * 1e3:9.1f} ms   ({result['cached_tokens']} prompt tokens cached)")
        print(f"ratio second / first        {result['ratio']:9.3f}")
    return 0
