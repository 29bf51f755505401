"""`lite-llm generate` (one prompt -> text on stdout) and `lite-llm chat` (an interactive,
streaming conversation in the terminal)."""
from __future__ import annotations

import argparse
import logging
import sys
import uuid

from lite_llm.config import KV_CACHE_DTYPES, speculative_config_arg
from lite_llm.sampling_params import SamplingParams


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=None, help="HF directory, .gguf file or cached hub id "
                   "(default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    p.add_argument("--quantization", "-q", default=None, choices=["none", "q8_0", "q4_0"],
                   help="weights as stored (none), or float weights quantized at load to q8_0 / q4_0 (ggml block types)")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="ranks of tensor parallelism, one process each (default 1): one per CPU list of LITE_LLM_CPU_OMP_THREADS_BIND (0-47|48-95), or per NUMA node under auto")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=None, help="default: the model's generation_config")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--kv-cache-space", type=float, default=None, help="GiB")
    p.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                   help="KV cache element type: auto (the model's: fp32, else bf16), bfloat16, int8, fp8 (= fp8_e4m3), "
                   "fp8_e5m2 (8-bit: a byte per value and a scale per row, ~2x the tokens per GiB)")
    p.add_argument("--speculative-config", default=None, type=speculative_config_arg, help='speculative decoding, as vLLM spells it: \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}\' (drafts looked up in the sequence) or \'{"method": "draft_model", "model": PATH, "num_speculative_tokens": 4}\' (a small model of the same vocabulary)')
    p.add_argument("--verbose", "-v", action="store_true", help="log what the engine decided")


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--prompt", "-p", required=True)
    p.add_argument("--chat-format", action="store_true", help="wrap the prompt in the chat template")


def add_chat_arguments(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--system", default=None, help="system message")


def _start(args):
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from lite_llm.llm import EngineArgs, build_engine, default_sampling_params
    built = build_engine(EngineArgs(args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                                    kv_cache_space=args.kv_cache_space, serving=False,
                                    quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
                                    speculative_config=args.speculative_config,
                                    tensor_parallel_size=args.tensor_parallel_size))
    engine, loaded = built.engine, built.loaded
    params = default_sampling_params(loaded.generation_config)
    overrides = {k: v for k, v in (("temperature", args.temperature), ("top_p", args.top_p),
                                   ("top_k", args.top_k), ("seed", args.seed)) if v is not None}
    params = params.replace(max_tokens=args.max_tokens, **overrides)
    return engine, loaded.tokenizer, params


def _stream(engine, ids: list[int], params: SamplingParams, out=sys.stdout) -> str:
    text = []
    for delta in engine.add_request(uuid.uuid4().hex, ids, params):
        for c in delta.outputs:
            out.write(c.text)
            out.flush()
            text.append(c.text)
    return "".join(text)


def run_generate(args) -> int:
    engine, tok, params = _start(args)
    try:
        if args.chat_format:
            prompt = tok.apply_chat_template([{"role": "user", "content": args.prompt}])
            ids = tok.encode(prompt, add_special_tokens=False)
        else:
            ids = tok.encode(args.prompt)
        _stream(engine, ids, params)
        sys.stdout.write("\n")
    finally:
        engine.shutdown()
    return 0


def run_chat(args) -> int:
    engine, tok, params = _start(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print("Chat with the model; an empty line or Ctrl-D ends.", file=sys.stderr)
    try:
        while True:
            try:
                user = input("> ")
            except EOFError:
                break
            if not user.strip():
                break
            messages.append({"role": "user", "content": user})
            ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
            answer = _stream(engine, ids, params)
            sys.stdout.write("\n")
            messages.append({"role": "assistant", "content": answer})
    except KeyboardInterrupt:
        pass
    finally:
        engine.shutdown()
    return 0
