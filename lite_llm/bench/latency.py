"""`lite-llm bench latency`: prefill and decode speed of one batch of requests, like
`vllm bench latency`, optionally with llama.cpp / transformers on the same prompts.

Each iteration submits --batch-size random-token prompts of --input-len tokens at once
(greedy, ignore_eos: exactly --output-len tokens each) through the engine users run, and
measures (common.BatchFigures): prefill tok/s = prompt tokens of the batch / TTFT, decode
tok/s = tokens after the first / (last - first token), summed over the batch, TTFT, TPOT;
medians over --num-iters after --warmup. --prompt-file gives every request one text prompt
instead (builtin: a code edit that repeats its prompt, where --speculative-config's n-gram
drafts pay; the acceptance counts are reported). Also: start to first token (engine build, imports
included, + TTFT of a first short request) and the process's peak RSS against weights + KV
cache. Each iteration uses fresh prompts, so the prefix cache never hits.

KV cache: unless the user sizes it (--kv-cache-space, LITE_LLM_CPU_KVCACHE_SPACE) or the
context (--max-model-len), it is sized to the workload, as llama.cpp's n_ctx is:
max_model_len = input + output tokens, and batch x that many tokens rounded up to whole
blocks (the start-up probe runs alone before the batches, so those blocks hold it too). An
engine-sized cache (GiBs, its pages touched only as blocks fill) would not change the speed,
but the prefix cache hands each new request never-used blocks, so every request would touch
fresh pages and the peak RSS would grow with the number of iterations. The RSS ratio divides
by weights + the KV cache allocated when the bench sized it (all of it is used), else by
weights + the KV cache the workload needs (a user-sized cache is touched only as used).
"""
from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from lite_llm.bench import common
from lite_llm.config import env

FIRST_REQUEST_LEN = 32       # the start-up probe: a short prompt, one token


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_engine_arguments(parser)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="iterations run first and not counted")
    parser.add_argument("--json-schema", default=None, metavar="builtin|PATH",
                        help="every request's output follows this JSON schema (structured outputs; "
                             "builtin: nested records that outlast the output, see common.BENCH_JSON_SCHEMA); "
                             "run once with and once without to see what the grammar costs")
    parser.add_argument("--prompt-file", default=None, metavar="builtin|PATH",
                        help="every request's prompt is this text (a user message, in the chat template when "
                             "the model has one) instead of --input-len random tokens; builtin: a code-editing "
                             "request whose answer repeats most of its prompt (the case n-gram speculative "
                             "decoding is for). Turns prefix caching off, so iterations do not hit each other")
    parser.add_argument("--peer-num-iters", type=int, default=None,
                        help="measured iterations of each peer (default: --num-iters); the first ones of ours")


FIGURES = [  # (key, column title, scale, lower is better)
    ("prefill_tok_s", "prefill tok/s", 1.0, False),
    ("decode_tok_s", "decode tok/s", 1.0, False),
    ("ttft", "TTFT ms", 1e3, True),
    ("tpot", "TPOT ms", 1e3, True),
    ("output_tok_s", "output tok/s", 1.0, False),
]


def workload_kv_cache(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """(max_model_len, KV blocks) sized to the workload (see the module docstring), or
    (None, None) when the user sized the context or the cache: then the engine's own sizing."""
    if args.max_model_len is not None or args.kv_cache_space is not None or env("CPU_KVCACHE_SPACE") is not None:
        return None, None
    seq_len = args.input_len + args.output_len
    probe_len = min(FIRST_REQUEST_LEN, args.input_len) + 1     # <= seq_len: fits in one sequence's blocks
    blocks = args.batch_size * -(-seq_len // args.block_size)
    return seq_len, max(blocks, -(-probe_len // args.block_size))


def run(args: argparse.Namespace) -> int:
    if min(args.input_len, args.output_len, args.batch_size, args.num_iters) < 1 or args.warmup < 0:
        raise SystemExit("--input-len, --output-len, --batch-size and --num-iters must be >= 1, --warmup >= 0")
    peers = common.parse_peers(args.peers)
    structured = common.structured_from_arg(args.json_schema)
    if structured is not None and peers:
        raise SystemExit("--json-schema runs lite_llm alone: the peers would decode without the grammar")
    load_before = common.load_average()
    age_at_start = common.process_age_seconds()
    common.progress(f"bench latency: building the engine (load average {load_before})")
    text_prompt = common.prompt_text(args.prompt_file) if args.prompt_file else None
    if text_prompt is not None:
        args.enable_prefix_caching = False
        args.input_len = max(args.input_len, 2048 - args.output_len)   # an upper bound until tokenized
    max_model_len, num_kv_blocks = workload_kv_cache(args)
    engine, loaded, info = common.build(args, max_model_len=max_model_len, num_kv_blocks=num_kv_blocks)
    try:
        vocab = loaded.config.vocab_size
        if text_prompt is not None:
            prompt_ids = common.chat_prompt_ids(loaded.tokenizer, text_prompt)
            args.input_len = len(prompt_ids)
        needed = args.input_len + args.output_len
        if needed > info["max_model_len"]:
            raise SystemExit(f"--input-len + --output-len = {needed} is more than max_model_len "
                             f"{info['max_model_len']}")
        probe = common.random_prompts(1, min(FIRST_REQUEST_LEN, args.input_len), vocab, args.seed + 10_000)
        (first,) = common.run_requests(engine, probe, 1)
        first_ttft = first.first_token - first.arrival
        startup = {"engine_build_seconds": info["build_seconds"], "first_request_ttft_seconds": first_ttft,
                   "start_to_first_token_seconds": info["build_seconds"] + first_ttft,
                   "process_start_to_first_token_seconds":
                       None if age_at_start is None else age_at_start + info["build_seconds"] + first_ttft}
        total = args.warmup + args.num_iters
        batches = [common.random_prompts(args.batch_size, args.input_len, vocab, args.seed + i)
                   if text_prompt is None else [list(prompt_ids)] * args.batch_size for i in range(total)]
        runs = []
        num_cached = 0
        for i, prompts in enumerate(batches):
            label = "warm-up" if i < args.warmup else f"iteration {i - args.warmup + 1}/{args.num_iters}"
            common.progress(f"[lite_llm] {label}: {args.batch_size} x {args.input_len} tokens -> {args.output_len}")
            timings = common.run_requests(engine, prompts, args.output_len, structured)
            figures = common.batch_figures(timings)
            common.progress(f"[lite_llm] {label}: {common.describe(figures)}")
            if i >= args.warmup:
                runs.append(asdict(figures))
                num_cached += sum(t.num_cached_tokens for t in timings)
        peak_rss = common.peak_rss_bytes()
        stats = engine.stats()
        profile = common.step_profile(stats) if args.profile_step else None
        speculative = None
        if info.get("speculative_config"):
            speculative = {"config": info["speculative_config"], "num_drafts": stats.spec_decode_num_drafts,
                           "num_draft_tokens": stats.spec_decode_num_draft_tokens,
                           "num_accepted_tokens": stats.spec_decode_num_accepted_tokens,
                           "num_accepted_tokens_per_pos": list(stats.spec_decode_num_accepted_tokens_per_pos),
                           "acceptance_rate": stats.spec_decode_acceptance_rate}
    finally:
        engine.shutdown()
    bandwidth = common.read_bandwidth(info["num_threads"])    # right after our runs: the same conditions
    kv_bytes = args.batch_size * needed * common.kv_bytes_per_token(loaded, args.block_size, args.kv_cache_dtype)
    sized_to_workload = num_kv_blocks is not None
    kv_counted = info["kv_cache_bytes"] if sized_to_workload else kv_bytes
    ours = {"median": common.median_figures(runs), "runs": runs, "startup": startup,
            "peak_rss_bytes": peak_rss, "weight_bytes": info["weight_bytes"], "kv_cache_bytes_needed": kv_bytes,
            "kv_cache_bytes_allocated": info["kv_cache_bytes"], "kv_cache_blocks": info["kv_cache_blocks"],
            "kv_cache_sized_to_workload": sized_to_workload,
            "peak_rss_over_weights_and_kv": peak_rss / max(info["weight_bytes"] + kv_counted, 1),
            "prefix_cache_hit_tokens": num_cached, "step_profile": profile,
            "bytes_per_token": info["bytes_per_token"], "read_bandwidth_gbs": bandwidth,
            "decode_roofline_tok_s": bandwidth * 1e9 / info["bytes_per_token"] if bandwidth else None,
            "gemm_paths": info.get("gemm_paths"), "speculative": speculative}
    med = ours["median"]
    ours["prefill_peak_share"] = common.peak_share(
        info, args.batch_size * common.request_macs(info, args.input_len, 1), med["ttft"])
    result: dict[str, Any] = {
        "benchmark": "latency", "model": info["model_path"], "dtype": info["dtype"],
        "kernel_variant": info["kernel_variant"], "num_threads": info["num_threads"],
        "max_model_len": info["max_model_len"],
        "input_len": args.input_len, "output_len": args.output_len, "batch_size": args.batch_size,
        "num_iters": args.num_iters, "warmup": args.warmup, "load_average_before": load_before,
        "json_schema": args.json_schema, "prompt_file": args.prompt_file,
        "lite_llm": ours, "peers": {}}
    peer_iters = args.num_iters if args.peer_num_iters is None else max(1, min(args.peer_num_iters, args.num_iters))
    result["peer_num_iters"] = peer_iters
    spec = {"model_path": info["model_path"], "num_threads": info["num_threads"], "output_len": args.output_len,
            "warmup": args.warmup, "batches": batches[:args.warmup + peer_iters], "probe": probe,
            "peer_weights": args.peer_weights}
    common.finish(result, peers, spec, FIGURES, "bench latency", args.json, print_report)
    return 0


def print_report(result: dict[str, Any]) -> None:
    r = result
    print(f"bench latency: {r['model']}\n  {r['dtype']}, kernels {r['kernel_variant']}, {r['num_threads']} threads; "
          f"batch {r['batch_size']} x {r['input_len']} prompt tokens -> {r['output_len']} tokens; medians of "
          f"{r['num_iters']} iterations (peers: {r.get('peer_num_iters', r['num_iters'])}) after {r['warmup']} "
          f"warm-up; load average {r['load_average_before']} "
          f"before, {r['load_average_after']} after\n"
          + (f"  every output follows the JSON schema {r['json_schema']} (structured outputs)\n"
             if r.get("json_schema") else "")
          + (f"  prompt: {r['prompt_file']} (prefix caching off)\n" if r.get("prompt_file") else ""))
    ours = r["lite_llm"]
    common.print_results(r, FIGURES, ["start->1st tok s", "peak RSS MiB"],
                         [ours["startup"]["start_to_first_token_seconds"], ours["peak_rss_bytes"] / 2**20],
                         lambda peer: [peer.get("start_to_first_token_seconds"), peer["peak_rss_bytes"] / 2**20])
    s = ours["startup"]
    print(f"start-up: engine build {s['engine_build_seconds']:.2f} s + first request TTFT "
          f"{s['first_request_ttft_seconds'] * 1e3:.0f} ms = {s['start_to_first_token_seconds']:.2f} s"
          + ("" if s["process_start_to_first_token_seconds"] is None
             else f" ({s['process_start_to_first_token_seconds']:.2f} s from process start)"))
    mib = 2**20
    if ours["kv_cache_sized_to_workload"]:
        blocks = ours["kv_cache_blocks"]
        kv = (f"KV cache {ours['kv_cache_bytes_allocated'] / mib:.0f} MiB: {blocks} block{'s' * (blocks != 1)} "
              f"sized to the workload, as llama.cpp's n_ctx; max_model_len {r['max_model_len']}")
    else:
        kv = (f"KV cache needed {ours['kv_cache_bytes_needed'] / mib:.0f} MiB; "
              f"{ours['kv_cache_bytes_allocated'] / mib:.0f} MiB allocated, its pages touched as blocks fill")
    print(f"memory: peak RSS {ours['peak_rss_bytes'] / mib:.0f} MiB = {ours['peak_rss_over_weights_and_kv']:.2f}x "
          f"(weights {ours['weight_bytes'] / mib:.0f} MiB + {kv})")
    if ours.get("decode_roofline_tok_s"):
        roof = ours["decode_roofline_tok_s"]
        print(f"decode roofline: {ours['read_bandwidth_gbs']:.1f} GB/s read (measured after the runs) / "
              f"{ours['bytes_per_token'] / mib:.0f} MiB of weights per token = {roof:.1f} tok/s; lite_llm decodes at "
              f"{ours['median']['decode_tok_s'] / roof:.0%} of it")
    if ours.get("step_profile"):
        common.print_step_profile(ours["step_profile"])
    spec = ours.get("speculative")
    if spec:
        c = spec["config"]
        rate = spec["acceptance_rate"]
        print(f"speculative decoding ({c['method']}, k={c['num_speculative_tokens']}): {spec['num_accepted_tokens']} "
              f"of {spec['num_draft_tokens']} drafted tokens accepted ({'-' if rate is None else f'{rate:.0%}'}) "
              f"over {spec['num_drafts']} drafts; accepted per position {spec['num_accepted_tokens_per_pos']} "
              "(all iterations and the start-up probe)")
    share = common.describe_share("prefill", ours.get("prefill_peak_share"), r["num_threads"])
    if share:
        print(share + " (layers' matrices, attention and the logits rows)")
    common.print_peer_notes(r)
