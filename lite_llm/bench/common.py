"""Shared by `bench latency` and `bench throughput`: engine options, prompts, timing of a set
of requests through the engine path users run (AsyncEngine streams), peak RSS, output (the
results table beside the peers' and their notes).

Every figure comes from RequestMetrics timestamps (time.monotonic, set by the engine thread
right after the step that produced the token), so Python-side queue hops add nothing.
Peers (llama.cpp, transformers) run in a child process (lite_llm.bench.peers) so their
libraries, threads and memory never mix with ours; deliberately nothing here imports them.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from lite_llm.config import KV_CACHE_DTYPES, speculative_config_arg

PEERS = ("llama.cpp", "transformers")
# peers given as a program the user built: NAME=PATH (ik_llama.cpp: its llama-bench binary)
PROGRAM_PEERS = ("ik_llama.cpp",)
ORIGINAL_ENVIRON = dict(os.environ)      # before the engine sets its OpenMP policy: peers get the user's


# ---- arguments ------------------------------------------------------------------------------


def add_engine_arguments(parser: argparse.ArgumentParser, *, max_num_batched_tokens: int | None = None) -> None:
    parser.add_argument("--model", default=None,
                        help="HF directory, .gguf file or hub id (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
    parser.add_argument("--quantization", "-q", default=None, choices=("none", "q8_0", "q4_0"),
                        help="weights as stored (none), or float weights quantized at load to q8_0 / q4_0")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                        help="ranks of tensor parallelism, one process each (default 1): one per CPU list of LITE_LLM_CPU_OMP_THREADS_BIND (0-47|48-95), or per NUMA node under auto")
    parser.add_argument("--peer-weights", default="same", choices=("same", "bf16"),
                        help="llama.cpp runs the same GGUF file (same, the default: quantized files run "
                             "quantized in both engines) or a BF16 copy of its dequantized weights (bf16)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--kv-cache-space", type=float, default=None, help="GiB")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                        help="KV cache element type: auto (the model's: fp32, else bf16), bfloat16, int8, fp8 (= fp8_e4m3), "
                        "fp8_e5m2 (8-bit: a byte per value and a scale per row, ~2x the tokens per GiB)")
    parser.add_argument("--speculative-config", default=None, type=speculative_config_arg, help='speculative decoding, as vLLM spells it: \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}\' (drafts looked up in the sequence) or \'{"method": "draft_model", "model": PATH, "num_speculative_tokens": 4}\' (a small model of the same vocabulary)')
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="most sequences in one step (default: the engine's, 256 and at most 32 per thread)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=max_num_batched_tokens)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="prompts are random and distinct, so the cache only costs its bookkeeping")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    parser.add_argument("--deterministic", action="store_true",
                        help="batch-invariant kernels (README: Deterministic mode), to time what they cost")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--profile-step", action="store_true",
                        help="report the engine's Python time per step beside its kernel time, per batch size")
    parser.add_argument("--peers", default="",
                        help=f"comma-separated peers to run on the same workload: {','.join(PEERS)} "
                             "(needs `pip install lite-llm[bench]`), and ik_llama.cpp=PATH: a llama-bench "
                             "binary built from ik_llama.cpp, run on the same GGUF file (batch size 1)")


def parse_peers(text: str) -> list[str]:
    """The peers named: "llama.cpp", "transformers", or "NAME=PATH" for a program peer."""
    peers = [p.strip() for p in (text or "").split(",") if p.strip()]
    for p in peers:
        name, has_path, path = p.partition("=")
        if name in PROGRAM_PEERS:
            if not has_path or not path:
                raise SystemExit(f"--peers: {name} takes the path of its built llama-bench: {name}=PATH")
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                raise SystemExit(f"--peers: {name}: {path} is not an executable file")
        elif p not in PEERS:
            raise SystemExit(f"--peers: unknown peer {p!r}; known: {', '.join(PEERS)}, "
                             f"{', '.join(n + '=PATH' for n in PROGRAM_PEERS)}")
    return list(dict.fromkeys(peers))


def peer_name(peer: str) -> str:
    """A peer's name without the program path of NAME=PATH."""
    return peer.partition("=")[0]


def build(args: argparse.Namespace, max_model_len: int | None = None, num_kv_blocks: int | None = None):
    """(engine, loaded, info) for the benchmark's arguments; info['build_seconds'] is the wall
    time from the call (imports of the engine included) to a started engine. max_model_len and
    num_kv_blocks apply when the user gave no --max-model-len / --kv-cache-space."""
    t0 = time.perf_counter()
    from lite_llm.engine.args import EngineArgs
    from lite_llm.engine.assemble import build_engine
    built = build_engine(EngineArgs(
        args.model, dtype=args.dtype, max_model_len=args.max_model_len or max_model_len,
        block_size=args.block_size, kv_cache_space=args.kv_cache_space, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=args.enable_prefix_caching,
        seed=args.seed, serving=False, progress=sys.stderr.isatty(),
        num_kv_blocks=num_kv_blocks if args.kv_cache_space is None else None, quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype, speculative_config=getattr(args, "speculative_config", None),
        tensor_parallel_size=args.tensor_parallel_size, deterministic=getattr(args, "deterministic", False)))
    engine, loaded, info = built.engine, built.loaded, built.info
    info = dict(info.as_dict(), build_seconds=time.perf_counter() - t0)
    packed = getattr(getattr(getattr(engine, "engine", None), "runner", None), "packed", None)
    if packed is not None and packed.kept is not None:   # a first start writes its packed weights
        progress("waiting for the packed weights to be written before timing")
        packed.kept.join()
    return engine, loaded, info


# ---- share of the measured peak -------------------------------------------------------------


def copy_gguf_keys(reader, writer, file_type: int | None = None) -> None:
    """Every key of a gguf.GGUFReader into a gguf.GGUFWriter of the same architecture: the ones the
    writer writes itself left out, the alignment as the writer's own, general.file_type replaced
    by file_type when given, empty arrays left out (gguf-py cannot write them; readers default
    them)."""
    import gguf
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue                      # the writer writes these itself
        if key == "general.alignment":
            writer.add_custom_alignment(int(field.contents()))
            continue
        if key == "general.file_type" and file_type is not None:
            writer.add_file_type(int(file_type))
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            if value:
                writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, vtype)


def request_macs(info: dict, prompt_len: int, output_len: int) -> float:
    """Multiply-adds of one request: every token through the layers' matrices, causal attention
    (q.k and p.v over the positions up to each token's own) in the attention layers (a hybrid's
    recurrent layers are in the matrices' count), and one logits row per generated token.
    output_len 1: its prefill."""
    tokens = prompt_len + output_len - 1            # the last generated token is not fed back
    layers = info.get("num_attention_layers")
    attention = (info["num_layers"] if layers is None else layers) * info["q_size"] * tokens * (tokens + 1)
    return tokens * info["layer_macs_per_token"] + attention + output_len * info["head_macs_per_row"]


def peak_share(info: dict, macs: float, seconds: float) -> dict[str, Any] | None:
    """macs done in seconds against the peak of the instruction the model's GEMMs run (measured
    at start-up, lite_llm/_kernels/gemm_path.py) times the threads: {"gmac_s", "path",
    "peak_gmac_s_per_core", "share"}; None without the figures."""
    paths = info.get("gemm_paths")
    if not paths or seconds <= 0:
        return None
    forms = [form for _, form in (info.get("weight_formats") or {}).values()]
    if any(f.startswith("int8") for f in forms):
        path = paths["chosen"]["int8"]
    elif info.get("dtype") == "bfloat16":
        path = paths["chosen"]["bf16"]
    else:
        path = "fma"
    peak = paths["peaks"].get(path)
    gmac_s = macs / seconds / 1e9
    return {"gmac_s": gmac_s, "path": path, "peak_gmac_s_per_core": peak,
            "share": gmac_s / (peak * info["num_threads"]) if peak else None}


def describe_share(what: str, share: dict[str, Any] | None, num_threads: int) -> str | None:
    if not share or share["share"] is None:
        return None
    return (f"{what}: {share['gmac_s']:.1f} GMAC/s = {share['share']:.0%} of the {share['path']} path's measured peak "
            f"({share['peak_gmac_s_per_core']:.1f} GMAC/s per core x {num_threads} threads)")


# ---- prompts --------------------------------------------------------------------------------


def random_prompts(num_prompts: int, input_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """num_prompts lists of input_len token ids, uniform over the vocabulary minus its low
    tenth (capped at 1000 ids), where tokenizers keep control and byte tokens."""
    rng = random.Random(seed)      # not numpy.random: its import alone is ~6 MiB of our peak RSS
    ids = range(min(vocab_size // 10, 1000), vocab_size)
    return [rng.choices(ids, k=input_len) for _ in range(num_prompts)]


def dataset_prompts(path: str, tokenizer, num_prompts: int, max_len: int | None = None) -> list[list[int]]:
    """Token ids of the first num_prompts {"prompt": ...} lines of a JSONL file (cycled if
    the file has fewer), truncated to max_len tokens."""
    if tokenizer is None:
        raise SystemExit("--dataset needs a model with a tokenizer")
    texts = []
    with open(path, encoding="utf-8") as fh:
        for num, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                texts.append(str(json.loads(line)["prompt"]))
            except (ValueError, KeyError, TypeError):
                raise SystemExit(f"{path}:{num}: expected a JSON object with a \"prompt\" field") from None
    if not texts:
        raise SystemExit(f"{path}: no prompts")
    prompts = []
    for i in range(num_prompts):
        ids = tokenizer.encode(texts[i % len(texts)])
        prompts.append(ids[:max_len] if max_len else ids)
    return prompts


# ---- timing requests through the engine ------------------------------------------------------


@dataclass(frozen=True)
class RequestTiming:
    """One request, times in seconds on time.monotonic()."""
    arrival: float
    first_token: float
    last_token: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int


# `bench latency --prompt-file builtin`: an edit whose answer repeats most of the prompt's code
# (what n-gram prompt lookup drafts well; a summary of a given text behaves alike)
BUILTIN_PROMPT = """Rename the function `area` to `rectangle_area` everywhere in this Python module and \
return the whole module, unchanged otherwise, in a code block.

```python
import math


def area(width, height):
    \"\"\"The area of a width x height rectangle.\"\"\"
    if width < 0 or height < 0:
        raise ValueError("width and height must not be negative")
    return width * height


def perimeter(width, height):
    \"\"\"The perimeter of a width x height rectangle.\"\"\"
    if width < 0 or height < 0:
        raise ValueError("width and height must not be negative")
    return 2 * (width + height)


def diagonal(width, height):
    \"\"\"The length of the diagonal of a width x height rectangle.\"\"\"
    return math.sqrt(width * width + height * height)


def describe(width, height):
    print("area:", area(width, height))
    print("perimeter:", perimeter(width, height))
    print("diagonal:", diagonal(width, height))


if __name__ == "__main__":
    describe(3, 4)
```
"""


def prompt_text(arg: str) -> str:
    """--prompt-file: "builtin" (BUILTIN_PROMPT) or the text of a file."""
    if arg == "builtin":
        return BUILTIN_PROMPT
    try:
        with open(arg, encoding="utf-8") as fh:
            return fh.read()
    except OSError as e:
        raise SystemExit(f"--prompt-file: {e}") from None


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """text as a user message in the model's chat template (plain text if it has none)."""
    if tokenizer is None:
        raise SystemExit("--prompt-file needs a model with a tokenizer")
    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    except (ValueError, AttributeError):
        return tokenizer.encode(text)
    return tokenizer.encode(rendered, add_special_tokens=False)


def run_requests(engine, prompts: list[list[int]], output_len: int, structured=None,
                 loras: list | None = None, stream: bool = False) -> list[RequestTiming]:
    """Submit every prompt at once (greedy, ignore_eos, exactly output_len tokens each), wait
    for all; one RequestTiming per prompt, in order. structured: a StructuredOutputsParams every
    request follows (it must not end before output_len tokens: see BENCH_JSON_SCHEMA). loras:
    each prompt's LoRA adapter name (None: the base model)."""
    from lite_llm.sampling_params import RequestOutputKind, SamplingParams
    # detokenized, as users get their text: the incremental detokenizer is part of the cost;
    # handed over once, finished, as LLM.generate and non-streaming HTTP answers ask for it;
    # stream: a delta per token, as the server's stream=true asks for it
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, structured_outputs=structured,
                            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY)
    tag = uuid.uuid4().hex[:8]
    streams = [engine.add_request(f"bench-{tag}-{i}", ids, params,
                                  **({"lora_request": loras[i]} if loras and loras[i] else {}))
               for i, ids in enumerate(prompts)]
    timings = []
    for ids, stream in zip(prompts, streams):
        num_tokens, last = 0, None
        for out in stream:
            num_tokens += sum(len(o.token_ids) for o in out.outputs)
            last = out
        m = last.metrics
        if m is None or m.first_token_time is None:
            raise RuntimeError(f"request {stream.request_id} finished without timing metrics")
        end = m.last_token_time if m.last_token_time is not None else m.finished_time
        timings.append(RequestTiming(m.arrival_time, m.first_token_time, end, len(ids), num_tokens,
                                     last.num_cached_tokens))
    return timings


# A JSON schema of nested objects, enums and arrays whose shortest instance is far longer than
# a benchmark's output (60 items of >= 10 tokens): every request decodes exactly --output-len
# tokens under it, so its decode speed compares with unconstrained decoding of the same length.
BENCH_JSON_SCHEMA = {
    "type": "object",
    "properties": {"records": {"type": "array", "minItems": 60, "items": {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0},
                       "kind": {"type": "string", "enum": ["alpha", "beta", "gamma"]},
                       "name": {"type": "string", "maxLength": 16},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
        "required": ["id", "kind", "name", "tags"], "additionalProperties": False}}},
    "required": ["records"], "additionalProperties": False}


def structured_from_arg(value: str | None):
    """--json-schema: None, "builtin" (BENCH_JSON_SCHEMA) or a path to a JSON schema file."""
    if value is None:
        return None
    from lite_llm.sampling_params import StructuredOutputsParams
    if value == "builtin":
        return StructuredOutputsParams(json=BENCH_JSON_SCHEMA)
    with open(value, encoding="utf-8") as fh:
        return StructuredOutputsParams(json=json.load(fh))


@dataclass(frozen=True)
class BatchFigures:
    """One batch of requests submitted together. Rates in tokens/s, times in seconds."""
    ttft: float            # submission -> every request has its first token (the batch's prefill)
    prefill_tok_s: float   # prompt tokens of the batch / ttft
    decode_tok_s: float    # sum over requests of (tokens after the first) / (last - first token)
    tpot: float            # mean over requests of (last - first token) / (tokens after the first)
    e2e: float             # submission -> last token of the batch
    output_tok_s: float    # generated tokens / e2e
    total_tok_s: float     # (prompt + generated tokens) / e2e
    requests_per_s: float
    num_prompt_tokens: int  # computed (prefix-cache hits left out)
    num_output_tokens: int


def batch_figures(timings: list[RequestTiming]) -> BatchFigures:
    start = min(t.arrival for t in timings)
    ttft = max(t.first_token for t in timings) - start
    e2e = max(t.last_token for t in timings) - start
    num_prompt = sum(t.num_prompt_tokens - t.num_cached_tokens for t in timings)
    num_output = sum(t.num_output_tokens for t in timings)
    decode_rates, tpots = [], []
    for t in timings:
        if t.num_output_tokens > 1:
            span = max(t.last_token - t.first_token, 1e-9)
            decode_rates.append((t.num_output_tokens - 1) / span)
            tpots.append(span / (t.num_output_tokens - 1))
    return BatchFigures(ttft=ttft, prefill_tok_s=num_prompt / ttft,
                        decode_tok_s=sum(decode_rates), tpot=statistics.fmean(tpots) if tpots else 0.0,
                        e2e=e2e, output_tok_s=num_output / e2e,
                        total_tok_s=(num_prompt + num_output) / e2e, requests_per_s=len(timings) / e2e,
                        num_prompt_tokens=num_prompt, num_output_tokens=num_output)


def describe(f: BatchFigures | dict) -> str:
    """One progress line of figures."""
    d = f if isinstance(f, dict) else asdict(f)
    return (f"prefill {d['prefill_tok_s']:.0f} tok/s, decode {d['decode_tok_s']:.1f} tok/s, "
            f"TTFT {d['ttft'] * 1e3:.0f} ms, {d['output_tok_s']:.1f} output tok/s in {d['e2e']:.2f} s")


def median_figures(runs: list[dict[str, float]]) -> dict[str, float]:
    """Field-wise median of several runs' figures."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


# ---- memory ---------------------------------------------------------------------------------


def peak_rss_bytes() -> int:
    """This process's peak resident set: VmHWM of its address space (Linux), else ru_maxrss,
    which a child started by fork+exec inherits from its parent's address space at the fork."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux


def process_age_seconds() -> float | None:
    """Seconds since this process started (Linux /proc), None elsewhere."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def read_bandwidth(num_threads: int) -> float | None:
    """Read bandwidth in GB/s (info.measure_bandwidth) measured in a child process: an OpenMP
    pool on this process's main thread would change how the engine thread's pool spins."""
    code = f"from lite_llm import info; print(info.measure_bandwidth({int(num_threads)}))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
        return float(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return None


def kv_bytes_per_token(loaded, block_size: int, kv_cache_dtype: str = "auto") -> int:
    from lite_llm.engine.runner import kv_bytes_per_block
    return kv_bytes_per_block(loaded.config, block_size, loaded.dtype, kv_cache_dtype) // block_size


# ---- peers ----------------------------------------------------------------------------------


def run_peer(peer: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one peer on spec (see lite_llm.bench.peers.main) in a child process with the
    user's original environment; its progress goes to our stderr. Returns its result dict,
    or {"error": ...} when it could not run."""
    with tempfile.TemporaryDirectory(prefix="lite-llm-bench-") as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "result.json")
        name, _, program = peer.partition("=")
        with open(spec_path, "w") as fh:
            json.dump(dict(spec, peer=name, peer_program=program or None), fh)
        cmd = [sys.executable, "-m", "lite_llm.bench.peers", spec_path, out_path]
        env = dict(ORIGINAL_ENVIRON)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL)
        if os.path.exists(out_path):
            with open(out_path) as fh:
                return json.load(fh)
        return {"error": f"the {name} peer exited with status {proc.returncode} (its stderr is above)"}


def ratios(ours: dict[str, float], theirs: dict[str, float], keys: Iterable[str],
           lower_is_better: Iterable[str] = ()) -> dict[str, float]:
    """ours / theirs for rates; theirs / ours for times (so > 1 always means we are ahead)."""
    lower = set(lower_is_better)
    out = {}
    for k in keys:
        a, b = ours.get(k), theirs.get(k)
        if a and b:
            out[k] = (b / a) if k in lower else (a / b)
    return out


# ---- output ---------------------------------------------------------------------------------


CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "lite_llm")   # peers' BF16 copies, random models


def progress(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return "-" if value is None else str(value)


def print_table(title: str, columns: list[str], rows: list[list[Any]], file=None) -> None:
    file = file or sys.stdout
    cells = [columns] + [[fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    print(title, file=file)
    for n, row in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))),
              file=file)
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths), file=file)
    print(file=file)


def print_results(result: dict[str, Any], figures, extra_columns: list[str], ours_extra: list[Any],
                  peer_extra) -> None:
    """A bench's results table: our medians of `figures` (the bench's FIGURES), each peer's, then
    lite_llm / peer ratios; extra_columns after the figures hold ours_extra for us and
    peer_extra(peer) for a peer that ran."""
    columns = ["engine"] + [title for _, title, _, _ in figures] + extra_columns

    def medians(entry: dict[str, Any]) -> list[Any]:
        return [entry["median"][k] * scale for k, _, scale, _ in figures]
    rows = [["lite_llm"] + medians(result["lite_llm"]) + ours_extra]
    for name, peer in result["peers"].items():
        rows.append([name] + (medians(peer) + peer_extra(peer) if "median" in peer else ["-"] * (len(columns) - 1)))
    for name, peer in result["peers"].items():
        if "ratio" in peer:
            rows.append([f"lite_llm / {name}"]
                        + [f"{peer['ratio'][k]:.2f}x" if k in peer["ratio"] else "-" for k, *_ in figures]
                        + [""] * len(extra_columns))
    print_table("results (ratios > 1: lite_llm ahead; for times the inverse ratio)", columns, rows)


def print_peer_notes(result: dict[str, Any]) -> None:
    """One line per peer: why it did not run, or its version, load time, configuration and notes."""
    for name, peer in result["peers"].items():
        if "error" in peer:
            print(f"{name}: not run: {peer['error']}")
        else:
            load = "" if peer.get("load_seconds") is None else f"; load {peer['load_seconds']:.2f} s"
            print(f"{name}: {peer['version']}{load}; {peer['config']}"
                  + "".join(f"; {n}" for n in peer.get("notes", [])))


def dump_json(result: dict[str, Any]) -> None:
    json.dump(result, sys.stdout, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
    sys.stdout.write("\n")


def step_profile(stats) -> list[dict[str, float]]:
    """Per batch size (number of sequences), medians over the engine's recent pure decode steps
    (one token per sequence): Python us per step (scheduler, step arrays, sampler parameters,
    outputs, text), kernel ms per step, and Python us per sequence."""
    by_seqs: dict[int, list] = {}
    for s in stats.recent_steps:
        if s.num_tokens == s.num_seqs:
            by_seqs.setdefault(s.num_seqs, []).append(s)
    rows = []
    for num_seqs, steps in sorted(by_seqs.items()):
        python_us = statistics.median(s.python_seconds for s in steps) * 1e6
        rows.append({"num_seqs": num_seqs, "num_steps": len(steps), "python_us": python_us,
                     "python_us_per_seq": python_us / num_seqs,
                     "kernel_ms": statistics.median(s.kernel_seconds for s in steps) * 1e3})
    return rows


def print_step_profile(rows: list[dict[str, float]], min_steps: int = 8) -> None:
    """The step_profile rows with at least min_steps steps (batch sizes passed through while a
    batch drains are noise)."""
    shown = [r for r in rows if r["num_steps"] >= min_steps] or rows
    print_table("Python per decode step (medians; everything in a step but the forward and sampler kernels)",
                ["seqs", "steps", "Python us/step", "Python us/seq", "kernel ms/step"],
                [[r["num_seqs"], r["num_steps"], r["python_us"], r["python_us_per_seq"], r["kernel_ms"]]
                 for r in shown])


def load_average() -> str | None:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return None


def finish(result: dict, peers: list[str], spec: dict, figures, title: str, as_json: bool, print_report) -> None:
    """Run each peer on the same spec, add its ratios to ours, then print the result."""
    for peer in peers:
        progress(f"{title}: running {peer_name(peer)} on the same prompts")
        theirs = run_peer(peer, spec)
        if "median" in theirs:
            theirs["ratio"] = ratios(result["lite_llm"]["median"], theirs["median"], [k for k, *_ in figures],
                                     [k for k, _, _, lower in figures if lower])
        result["peers"][peer_name(peer)] = theirs
    result["load_average_after"] = load_average()
    if as_json:
        dump_json(result)
    else:
        print_report(result)
