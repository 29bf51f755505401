"""`python -m lite_llm` / `lite-llm`: serve, generate, chat, transcribe, bench, info, pull, list, rm.

Each command lives in its own module, imported only when that command runs (start-up
time matters): the module has `add_arguments(parser)` and `run(args) -> int | None`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# command -> (module, help)
COMMANDS = {
    "serve": ("lite_llm.server.app", "OpenAI-compatible HTTP server"),
    "serve-ray": ("lite_llm.serve_ray", "the OpenAI server as a Ray Serve application of engine replicas "
                                        "(pip install \"lite-llm[ray]\")"),
    "generate": ("lite_llm.interactive", "complete one prompt and print the text"),
    "chat": ("lite_llm.interactive", "chat with the model in the terminal"),
    "transcribe": ("lite_llm.transcribe_cmd", "speech to text with a Whisper model: text, json, srt, vtt"),
    "info": ("lite_llm.info", "CPU features, kernel variant, core/NUMA plan, thread binding"),
    "pull": ("lite_llm.model.hub", "download a model from the Hugging Face Hub into its cache (ORG/NAME, ORG/NAME:QUANT)"),
    "list": ("lite_llm.model.hub", "the models in the Hugging Face cache: name, size, format, quant, last used"),
    "rm": ("lite_llm.model.hub", "delete a model (ORG/NAME, or one GGUF quant ORG/NAME:QUANT) from the Hugging Face cache"),
}
BENCH_COMMANDS = {
    "latency": ("lite_llm.bench.latency", "prefill/decode speed of one batch"),
    "throughput": ("lite_llm.bench.throughput", "offline throughput of many requests"),
    "serve": ("lite_llm.bench.serve", "load a running server: TTFT, TPOT, ITL, throughput"),
    "hostile": ("lite_llm.bench.hostile", "attack a running server in turn while a watchdog times /health "
                                          "and a small completion: stalls, 5xx, echoes, leaked KV, RSS"),
    "embed": ("lite_llm.bench.embed", "embedding throughput vs sentence-transformers and llama.cpp (all-MiniLM-L6-v2)"),
    "prefix": ("lite_llm.bench.prefix", "TTFT of a request whose long prefix is already cached"),
    "allreduce": ("lite_llm.bench.allreduce", "microseconds per tensor-parallel all-reduce (shared memory)"),
    "qgemm": ("lite_llm.bench.qgemm", "one GGUF block type's GEMM kernel alone: ms and GB/s of weight bytes per call"),
    "lora": ("lite_llm.bench.lora", "LoRA adapters against the bare base model: prefill, decode, mixed batches"),
    "make-gguf": ("lite_llm.bench.models", "write a random-weight GGUF of a real model shape, quantized by llama.cpp"),
    "vision": ("lite_llm.bench.vision", "Qwen2.5-VL image encode, TTFT, decode vs transformers, llama.cpp (GGUF + mmproj)"),
    "llava": ("lite_llm.bench.llava", "LLaVA-1.5 GGUF + mmproj: image encode and TTFT vs llama.cpp and transformers"),
    "transcribe": ("lite_llm.bench.transcribe", "Whisper: real-time factor, encoder time, decode tok/s, peak RSS, "
                                                "1 and N streams vs faster-whisper and whisper.cpp"),
}


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: the mistake and where to look, not the whole usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add(subparsers, name: str, module: str, help: str) -> None:
    mod = importlib.import_module(module)
    p = subparsers.add_parser(name, help=help, description=help)
    adder = getattr(mod, f"add_{name}_arguments", None) or mod.add_arguments
    adder(p)
    p.add_argument("--debug", action="store_true",
                   help="print the full traceback of an error (also LITE_LLM_DEBUG=1)")
    p.set_defaults(_run=getattr(mod, f"run_{name}", None) or mod.run)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = Parser(prog="lite-llm", description="CPU-only LLM inference and serving")
    from lite_llm import __version__
    parser.add_argument("--version", action="version", version=f"lite-llm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    # Import only the module of the command asked for; `--help` lists them all.
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help) in COMMANDS.items():
        if wanted in (None, name):
            _add(sub, name, module, help)
        else:
            sub.add_parser(name, help=help)
    bench = sub.add_parser("bench", help=f"benchmarks ({', '.join(BENCH_COMMANDS)})")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    # the same for bench's subcommands (bench serve's HTTP client alone loads OpenSSL: ~5 MiB resident)
    rest = argv[argv.index("bench") + 1:] if wanted == "bench" else []
    wanted_bench = next((a for a in rest if not a.startswith("-")), None)
    for name, (module, help) in BENCH_COMMANDS.items():
        if wanted is None or (wanted == "bench" and wanted_bench in (None, name)):
            _add(bench_sub, name, module, help)
        else:
            bench_sub.add_parser(name, help=help)
    return parser


def user_error(e: BaseException) -> str | None:
    """The one-line message of an error a user made (a model that cannot be loaded, an address
    that cannot be bound), or None for anything else: a bug keeps its traceback."""
    from lite_llm.model.loader import ModelLoadError
    if isinstance(e, ModelLoadError):
        return str(e)
    if isinstance(e, OSError) and getattr(e, "lite_llm_user_error", False):
        return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False) or os.environ.get("LITE_LLM_DEBUG", "") not in ("", "0")
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        message = None if debug else user_error(e)
        if message is None:
            raise
        command = " ".join(a for a in (args.command, getattr(args, "bench_command", None)) if a)
        print(f"lite-llm {command}: error: {message}", file=sys.stderr)
        print("(run with --debug or LITE_LLM_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
