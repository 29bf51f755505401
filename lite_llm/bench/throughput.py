"""`lite-llm bench throughput`: offline throughput of many requests submitted at once, like
`vllm bench throughput`, optionally with llama.cpp's multi-sequence batching on the same prompts.

--num-prompts random-token prompts of --input-len tokens (or the first --num-prompts
{"prompt": ...} lines of a --dataset JSONL, tokenized by the model's tokenizer), each asking
for exactly --output-len tokens (greedy, ignore_eos), all submitted together through the
engine users run. Reported from submission to the last token: requests/s, total (prompt +
generated) tokens/s, output tokens/s; medians over --num-iters. One short request runs
first so the first iteration does not pay for the kernel pool start and first page faults.
"""
from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from lite_llm.bench import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_engine_arguments(parser)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=None,
                        help="prompt tokens (default 128; with --dataset: truncate prompts to this)")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--dataset", default=None, help='JSONL file of {"prompt": "..."} lines')
    parser.add_argument("--num-iters", type=int, default=1)
    parser.add_argument("--stream", action="store_true",
                        help="requests stream a delta output per token (as the server's stream=true), "
                             "not one final output: --profile-step then counts building them")


FIGURES = [  # (key, column title, scale, lower is better)
    ("requests_per_s", "requests/s", 1.0, False),
    ("total_tok_s", "total tok/s", 1.0, False),
    ("output_tok_s", "output tok/s", 1.0, False),
    ("ttft", "last TTFT s", 1.0, True),
    ("e2e", "elapsed s", 1.0, True),
]


def run(args: argparse.Namespace) -> int:
    if min(args.num_prompts, args.output_len, args.num_iters) < 1 or (args.input_len or 1) < 1:
        raise SystemExit("--num-prompts, --input-len, --output-len and --num-iters must be >= 1")
    peers = common.parse_peers(args.peers)
    if any(common.peer_name(p) in common.PROGRAM_PEERS for p in peers):
        raise SystemExit("bench throughput: ik_llama.cpp's llama-bench times one sequence at a time; "
                         "compare it with `bench latency --batch-size 1 --peers ik_llama.cpp=PATH`")
    load_before = common.load_average()
    common.progress(f"bench throughput: building the engine (load average {load_before})")
    engine, loaded, info = common.build(args)
    try:
        limit = info["max_model_len"] - args.output_len
        if args.dataset:
            batches = [common.dataset_prompts(args.dataset, loaded.tokenizer, args.num_prompts,
                                              min(args.input_len or limit, limit))] * args.num_iters
        else:
            input_len = args.input_len or 128
            if input_len > limit:
                raise SystemExit(f"--input-len + --output-len = {input_len + args.output_len} is more than "
                                 f"max_model_len {info['max_model_len']}")
            batches = [common.random_prompts(args.num_prompts, input_len, loaded.config.vocab_size,
                                             args.seed + i) for i in range(args.num_iters)]
        warm = [batches[0][0][:32]]
        common.progress("[lite_llm] warm-up: 1 request")
        common.run_requests(engine, warm, 2)
        runs = []
        for i, prompts in enumerate(batches):
            common.progress(f"[lite_llm] iteration {i + 1}/{args.num_iters}: {len(prompts)} prompts, "
                            f"{sum(map(len, prompts))} prompt tokens -> {args.output_len} tokens each")
            figures = common.batch_figures(common.run_requests(engine, prompts, args.output_len,
                                                               stream=args.stream))
            common.progress(f"[lite_llm] iteration {i + 1}/{args.num_iters}: {common.describe(figures)}")
            runs.append(asdict(figures))
        stats = engine.stats()
        profile = common.step_profile(stats) if args.profile_step else None
        peak_rss = common.peak_rss_bytes()
    finally:
        engine.shutdown()
    ours = {"median": common.median_figures(runs), "runs": runs, "peak_rss_bytes": peak_rss,
            "num_preempted": stats.num_preempted_total, "step_profile": profile,
            "prefix_cache_hit_rate": stats.prefix_cache_hits / max(stats.prefix_cache_queries, 1)}
    macs = sum(common.request_macs(info, len(p), args.output_len) for p in batches[0])
    ours["batch_peak_share"] = common.peak_share(info, macs, ours["median"]["e2e"])
    result: dict[str, Any] = {
        "benchmark": "throughput", "model": info["model_path"], "dtype": info["dtype"],
        "kernel_variant": info["kernel_variant"], "num_threads": info["num_threads"],
        "num_prompts": args.num_prompts, "prompt_tokens": sum(map(len, batches[0])),
        "output_len": args.output_len, "dataset": args.dataset, "num_iters": args.num_iters, "stream": args.stream,
        "load_average_before": load_before, "lite_llm": ours, "peers": {}}
    spec = {"model_path": info["model_path"], "num_threads": info["num_threads"],
            "output_len": args.output_len, "warmup": 1, "batches": [warm] + batches,
            "peer_weights": args.peer_weights}
    common.finish(result, peers, spec, FIGURES, "bench throughput", args.json, print_report)
    return 0


def print_report(result: dict[str, Any]) -> None:
    r = result
    source = f"dataset {r['dataset']}" if r["dataset"] else "random prompts"
    print(f"bench throughput: {r['model']}\n  {r['dtype']}, kernels {r['kernel_variant']}, {r['num_threads']} "
          f"threads; {r['num_prompts']} requests ({source}, {r['prompt_tokens']} prompt tokens) -> "
          f"{r['output_len']} tokens each{', streamed' if r.get('stream') else ''}, all submitted at once; median of {r['num_iters']}; load average "
          f"{r['load_average_before']} before, {r['load_average_after']} after\n")
    ours = r["lite_llm"]
    common.print_results(r, FIGURES, ["peak RSS MiB"], [ours["peak_rss_bytes"] / 2**20],
                         lambda peer: [peer["peak_rss_bytes"] / 2**20])
    print(f"lite_llm: {ours['num_preempted']} preemptions, prefix-cache hit rate {ours['prefix_cache_hit_rate']:.1%}")
    if ours.get("step_profile"):
        common.print_step_profile(ours["step_profile"])
    share = common.describe_share("batch (prefill and decode, start to last token)", ours.get("batch_peak_share"),
                                  r["num_threads"])
    if share:
        print(share)
    common.print_peer_notes(r)
