"""`lite-llm bench lora`: what LoRA adapters cost, in one run against the bare base model.

One engine with --num-adapters random adapters of --lora-rank on all seven targets (q, k, v, o,
gate, up, down; made in memory, A and B random normal) runs, at each --batch-sizes, batches of
random prompts three ways, interleaved iteration by iteration so a change of machine load
hits them alike:

    base      every request on the base model (its steps run no adapter code at all)
    lora      every request on adapter 0
    mixed     request i on adapter i mod --num-adapters (one batch, several adapters)

and reports prefill tok/s (prompt tokens / TTFT) and decode tok/s (common.BatchFigures), with
each LoRA figure as a ratio to the base figure of the same run: medians over --num-iters, and
the best iterations' ratio (load from other processes only ever slows an iteration down, so on a
shared machine the best of several is the steadier estimate).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from lite_llm.bench import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_engine_arguments(parser)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--num-adapters", type=int, default=4)
    parser.add_argument("--batch-sizes", default="1,32", help="comma-separated batch sizes")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)


def random_adapter(name: str, config, rank: int, seed: int):
    """A LoRAAdapter of `rank` on every target of every layer: A, B random normal (scale 1)."""
    from lite_llm.lora import LoRAAdapter, target_shapes
    rng = np.random.default_rng(seed)
    adapter = LoRAAdapter(name, "<random>", rank)
    for layer in range(config.num_layers):
        for target, (n, k) in target_shapes(config).items():
            a = rng.standard_normal((rank, k), dtype=np.float32) / np.float32(np.sqrt(k))
            bt = rng.standard_normal((rank, n), dtype=np.float32) * np.float32(0.01)
            adapter.weights[(layer, target)] = (a, bt)
    return adapter


def run(args: argparse.Namespace) -> int:
    from lite_llm.engine.args import EngineArgs
    from lite_llm.engine.assemble import build_engine
    sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    max_len = args.input_len + args.output_len
    built = build_engine(EngineArgs(
        args.model, dtype=args.dtype, max_model_len=args.max_model_len or max_len, block_size=args.block_size,
        kv_cache_space=args.kv_cache_space, max_num_seqs=max(max(sizes), 1),
        max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=args.enable_prefix_caching,
        seed=args.seed, serving=False, progress=sys.stderr.isatty(), quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype, enable_lora=True, max_loras=args.num_adapters,
        max_lora_rank=args.lora_rank,
        num_kv_blocks=None if args.kv_cache_space else max(sizes) * -(-max_len // args.block_size) + 8))
    engine, loaded, info = built.engine, built.loaded, built.info.as_dict()
    try:
        manager = engine.engine.lora
        names = [f"lora{i}" for i in range(args.num_adapters)]
        for i, name in enumerate(names):
            manager.add(random_adapter(name, loaded.config, args.lora_rank, seed=100 + i))
        lora_mb = engine.engine.runner.lora_weights.nbytes / 2**20
        rows, result = [], {"model": info["model_name"], "formats": info["weight_formats"] and
                            sorted({p for parts, _ in info["weight_formats"].values() for p in parts}),
                            "lora_rank": args.lora_rank, "num_adapters": args.num_adapters,
                            "lora_weight_mb": lora_mb, "load_average_before": common.load_average(), "runs": {}}
        seed = args.seed
        for batch in sizes:
            kinds = {"base": [None] * batch, "lora": [names[0]] * batch}
            if batch > 1:
                kinds["mixed"] = [names[i % len(names)] for i in range(batch)]
            figures = {k: [] for k in kinds}
            for it in range(args.warmup + args.num_iters):
                for kind, loras in kinds.items():
                    seed += 1
                    prompts = common.random_prompts(batch, args.input_len, loaded.config.vocab_size, seed)
                    f = common.batch_figures(common.run_requests(engine, prompts, args.output_len, loras=loras))
                    common.progress(f"batch {batch} {kind} iter {it}: {common.describe(f)}")
                    if it >= args.warmup:
                        figures[kind].append({"prefill_tok_s": f.prefill_tok_s, "decode_tok_s": f.decode_tok_s})
            med = {k: common.median_figures(v) for k, v in figures.items()}
            best = {k: {f: max(r[f] for r in v) for f in v[0]} for k, v in figures.items()}
            result["runs"][batch] = med
            result.setdefault("best", {})[batch] = best
            for kind, m in med.items():
                b = best[kind]
                rows.append([batch, kind, f"{m['prefill_tok_s']:.1f}", f"{m['decode_tok_s']:.2f}",
                             f"{m['prefill_tok_s'] / med['base']['prefill_tok_s']:.3f}",
                             f"{m['decode_tok_s'] / med['base']['decode_tok_s']:.3f}",
                             f"{b['prefill_tok_s'] / best['base']['prefill_tok_s']:.3f}",
                             f"{b['decode_tok_s'] / best['base']['decode_tok_s']:.3f}"])
        result["load_average_after"] = common.load_average()
    finally:
        engine.shutdown(0.0)
    if args.json:
        common.dump_json(result)
        return 0
    print(f"model {result['model']} ({', '.join(result['formats'] or [])}), {args.num_adapters} adapters of rank "
          f"{args.lora_rank} on q,k,v,o,gate,up,down ({lora_mb:.0f} MB fp32); input {args.input_len}, "
          f"output {args.output_len}; load {result['load_average_before']} -> {result['load_average_after']}")
    common.print_table("LoRA against the base model (same run)",
                       ["batch", "requests", "prefill tok/s", "decode tok/s", "prefill / base", "decode / base",
                        "best prefill / base", "best decode / base"],
                       rows)
    return 0
