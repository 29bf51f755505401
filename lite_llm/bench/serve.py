"""`lite-llm bench serve`: load a running OpenAI-compatible server, report TTFT, TPOT, ITL, throughput.

Like `vllm bench serve --dataset-name random`: N prompts of exactly --input-len tokens (random
words, tokenized by the server's own /tokenize and sent as token ids), each asking for exactly
--output-len tokens (ignore_eos), streamed so every token's arrival is timed, at most
--max-concurrency in flight. Only the stdlib (http.client, threads): it runs anywhere the
server's clients do. Works against any server with /v1/completions streaming and /tokenize
(vLLM included). Deliberately not here: request-rate schedules, datasets, chat endpoints.

guidellm (vLLM's load generator) measures the same figures its own way: `--guidellm` runs it
on the same shape (its chat requests, synthetic prompts of --input-len tokens asking for
--output-len, --max-concurrency 1 as its synchronous profile, more as its concurrent one) and
prints its report in this report's terms; `--guidellm-report FILE` does that for a
benchmarks.json it wrote before.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from lite_llm.config import env

_WORDS = ("time person year way day thing man world life hand part child eye woman place work week "
          "case point government company number group problem fact river cloud engine kernel cache "
          "block token paper garden window silver quick brown lazy green bright ocean mountain forest "
          "music story letter answer question market energy signal memory vector matrix batch").split()


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float = 0.0                     # seconds, request sent -> first token
    e2e: float = 0.0                      # seconds, request sent -> last byte
    itl: list[float] = field(default_factory=list)   # gaps between token-bearing chunks
    error: str = ""


class _Client:
    """One keep-alive connection (per worker thread)."""

    def __init__(self, base_url: str, api_key: str | None, timeout: float):
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise SystemExit(f"--base-url must be http(s)://host:port, got {base_url!r}")
        self.prefix = u.path.rstrip("/")
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        self.conn = cls(u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80),
                        timeout=timeout)
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def send(self, method: str, path: str, body: dict | None = None) -> http.client.HTTPResponse:
        data = json.dumps(body).encode() if body is not None else None
        try:
            self.conn.request(method, self.prefix + path, body=data, headers=self.headers)
            return self.conn.getresponse()
        except (ConnectionError, http.client.HTTPException):
            self.conn.close()            # a keep-alive connection the server closed: once more
            self.conn.request(method, self.prefix + path, body=data, headers=self.headers)
            return self.conn.getresponse()

    def json(self, method: str, path: str, body: dict | None = None) -> dict:
        resp = self.send(method, path, body)
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {data[:300]!r}")
        return json.loads(data)


def make_prompts(client: _Client, model: str, num_prompts: int, input_len: int,
                 rng: random.Random) -> list[list[int]]:
    """num_prompts lists of exactly input_len token ids, from shuffled words (no shared prefixes)."""
    prompts = []
    for _ in range(num_prompts):
        num_words = max(8, input_len)
        while True:
            text = " ".join(rng.choice(_WORDS) for _ in range(num_words))
            ids = client.json("POST", "/tokenize", {"model": model, "prompt": text,
                                                   "add_special_tokens": False})["tokens"]
            if len(ids) >= input_len:
                break
            num_words *= 2
        prompts.append(ids[:input_len])
    return prompts


def _one(client: _Client, model: str, prompt: list[int], output_len: int) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    res = RequestResult(ok=False, prompt_len=len(prompt))
    start = time.perf_counter()
    try:
        resp = client.send("POST", "/v1/completions", body)
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return res
        last = None
        chunks = 0
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                resp.read()
                break
            event = json.loads(payload)
            if "error" in event:
                res.error = str(event["error"].get("message"))
                return res
            if event.get("usage"):
                res.output_tokens = event["usage"]["completion_tokens"]
            if any(c.get("text") for c in event.get("choices") or ()):
                now = time.perf_counter()
                if last is None:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
                chunks += 1
        res.e2e = time.perf_counter() - start
        res.output_tokens = res.output_tokens or chunks
        res.ok = last is not None
        if not res.ok:
            res.error = "no tokens in the stream"
    except (OSError, http.client.HTTPException, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
        client.conn.close()
    return res


def _percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    s = sorted(values)

    def pct(p: float) -> float:      # linear interpolation, as numpy.percentile
        k = (len(s) - 1) * p / 100.0
        lo = int(k)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)
    return {"mean": statistics.fmean(s) * scale, "p50": pct(50) * scale, "p90": pct(90) * scale,
            "p99": pct(99) * scale}


def benchmark(base_url: str, num_prompts: int, max_concurrency: int, input_len: int, output_len: int,
              model: str | None = None, api_key: str | None = None, seed: int = 0,
              timeout: float = 600.0) -> dict:
    """Run the load and return every figure (times in ms, throughputs per second)."""
    setup = _Client(base_url, api_key, timeout)
    if model is None:
        model = setup.json("GET", "/v1/models")["data"][0]["id"]
    prompts = make_prompts(setup, model, num_prompts, input_len, random.Random(seed))
    setup.conn.close()
    todo = list(enumerate(prompts))
    results: list[RequestResult | None] = [None] * len(prompts)
    lock = threading.Lock()

    def worker() -> None:
        client = _Client(base_url, api_key, timeout)
        while True:
            with lock:
                if not todo:
                    break
                i, prompt = todo.pop(0)
            results[i] = _one(client, model, prompt, output_len)
        client.conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(max_concurrency,
                                                                                      num_prompts)))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - t0
    done = [r for r in results if r is not None and r.ok]
    failed = [r for r in results if r is None or not r.ok]
    in_tokens = sum(r.prompt_len for r in done)
    out_tokens = sum(r.output_tokens for r in done)
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "base_url": base_url, "model": model, "num_prompts": num_prompts,
        "max_concurrency": max_concurrency, "input_len": input_len, "output_len": output_len,
        "completed": len(done), "failed": len(failed),
        "errors": sorted({r.error for r in failed if r is not None})[:5],
        "duration_s": duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": len(done) / duration if duration > 0 else 0.0,
        "output_throughput": out_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else 0.0,
        "ttft_ms": _percentiles([r.ttft for r in done]),
        "tpot_ms": _percentiles(tpots),
        "itl_ms": _percentiles([g for r in done for g in r.itl]),
        "e2el_ms": _percentiles([r.e2e for r in done]),
    }


def format_report(r: dict) -> str:
    lines = [f"{' Serving Benchmark Result ':=^60}"]

    def row(name: str, value: object) -> None:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{name:<44}{text:>16}")
    row("Model:", r["model"])
    row("Max concurrency:", r["max_concurrency"])
    row("Successful requests:", r["completed"])
    row("Failed requests:", r["failed"])
    row("Benchmark duration (s):", r["duration_s"])
    row("Total input tokens:", r["total_input_tokens"])
    row("Total generated tokens:", r["total_output_tokens"])
    row("Request throughput (req/s):", r["request_throughput"])
    row("Output token throughput (tok/s):", r["output_throughput"])
    row("Total token throughput (tok/s):", r["total_token_throughput"])
    for key, title in (("ttft_ms", "Time to First Token"), ("tpot_ms", "Time per Output Token (excl. 1st token)"),
                       ("itl_ms", "Inter-token Latency"), ("e2el_ms", "End-to-end Latency")):
        lines.append(f"{' ' + title + ' ':-^60}")
        short = key.split("_")[0].upper()
        for stat in ("mean", "p50", "p90", "p99"):
            row(f"{stat.capitalize() if stat == 'mean' else stat.upper()} {short} (ms):", r[key][stat])
    lines.append("=" * 60)
    for e in r["errors"]:
        lines.append(f"error: {e}")
    return "\n".join(lines)


# ---- guidellm ---------------------------------------------------------------------------

def _stat(metrics: dict, name: str, scale: float = 1.0) -> dict[str, float]:
    """One of guidellm's distributions (its successful requests) as {mean, p50, p90, p99}."""
    dist = (metrics.get(name) or {}).get("successful") or {}
    pct = dist.get("percentiles") or {}
    return {"mean": (dist.get("mean") or 0.0) * scale,
            **{p: (pct.get(p) or 0.0) * scale for p in ("p50", "p90", "p99")}}


def _mean(metrics: dict, name: str, which: str) -> float:
    return ((metrics.get(name) or {}).get(which) or {}).get("mean") or 0.0


def guidellm_results(report: dict) -> list[dict]:
    """Each benchmark of a guidellm report (its benchmarks.json) in this module's result terms:
    requests (its errored ones are failed, its incomplete ones were cut by the time limit),
    tokens, throughputs (guidellm's means over the run: requests completed, tokens of every
    request) and the ttft/tpot/itl/e2el distributions of the completed requests, in ms
    (itl: per-request mean gaps, as tpot; guidellm does not report single gaps)."""
    if not isinstance(report, dict) or not isinstance(report.get("benchmarks"), list):
        raise ValueError("not a guidellm report: no 'benchmarks' list")
    out = []
    for bench in report["benchmarks"]:
        cfg, m = bench.get("config") or {}, bench.get("metrics") or {}
        strategy = cfg.get("strategy") or {}
        totals = m.get("request_totals") or {}
        out.append({
            "source": "guidellm " + str((report.get("metadata") or {}).get("guidellm_version", "?")),
            "base_url": (cfg.get("backend") or {}).get("target"),
            "model": (cfg.get("backend") or {}).get("model"),
            "strategy": strategy.get("type_"),
            "max_concurrency": strategy.get("streams") or strategy.get("max_concurrency"),
            "completed": totals.get("successful", 0), "failed": totals.get("errored", 0),
            "incomplete": totals.get("incomplete", 0),
            "errors": sorted({str(r.get("info", {}).get("error") or r.get("error") or "error")
                              for r in ((bench.get("requests") or {}).get("errored") or [])})[:5],
            "duration_s": float(bench.get("duration") or 0.0),
            "total_input_tokens": int((m.get("prompt_token_count") or {}).get("successful", {}).get("total_sum") or 0),
            "total_output_tokens": int((m.get("output_token_count") or {}).get("successful", {}).get("total_sum") or 0),
            "request_throughput": _mean(m, "requests_per_second", "successful"),
            "output_throughput": _mean(m, "output_tokens_per_second", "total"),
            "total_token_throughput": _mean(m, "tokens_per_second", "total"),
            "ttft_ms": _stat(m, "time_to_first_token_ms"),
            # guidellm's ITL is a request's (e2e - ttft) / (tokens - 1): this report's TPOT. It keeps
            # no token-to-token gaps, so its ITL stands for both; its own TPOT counts the first token.
            "tpot_ms": _stat(m, "inter_token_latency_ms"),
            "itl_ms": _stat(m, "inter_token_latency_ms"),
            "e2el_ms": _stat(m, "request_latency", scale=1000.0),
            "guidellm_tpot_ms": _stat(m, "time_per_output_token_ms"),
        })
    return out


def read_guidellm_report(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return guidellm_results(json.load(fh))


def guidellm_tokenizer(model: str | None, out_dir: str) -> str:
    """What guidellm loads (transformers' AutoTokenizer) to size its synthetic prompts: a
    directory with a tokenizer.json as given; else the tokenizer of the model lite-llm loads
    for `model` (a .gguf, a directory, a name in the local Hugging Face cache; None: the
    embedded default, what `serve` serves without a model), written to out_dir as
    tokenizer.json + tokenizer_config.json. Nothing is fetched from a hub."""
    if model is not None and os.path.isfile(os.path.join(model, "tokenizer.json")):
        return model
    from lite_llm.model.loader import load_model
    loaded = load_model(model)
    tok = loaded.tokenizer
    spec = tok.backend_json() if tok is not None else None
    if spec is None:
        raise SystemExit(f"bench serve: {loaded.source}: its tokenizer cannot be written for guidellm; "
                         f"give --guidellm-tokenizer a Hugging Face tokenizer directory")
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as fh:
        fh.write(spec)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.bos_token, "eos_token": tok.eos_token,
              "pad_token": tok.pad_token, "unk_token": tok.unk_token, "chat_template": tok.chat_template,
              "model_max_length": loaded.max_model_len}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump({k: v for k, v in config.items() if v is not None}, fh)
    return out_dir


def guidellm_command(exe: list[str], args: argparse.Namespace, tokenizer: str, report_path: str,
                     api_key: str | None) -> list[str]:
    """guidellm's `run` on this benchmark's shape: its default backend (chat completions,
    streamed, its default body), synthetic prompts of --input-len tokens asking for exactly
    --output-len, one stream (synchronous) or --max-concurrency streams (concurrent), for
    --guidellm-max-seconds or --num-prompts requests."""
    backend = f"kind=openai_http,target={args.base_url}"
    if args.model:
        backend += f",model={args.model}"
    if api_key:
        backend += f",api_key={api_key}"
    profile = "kind=synchronous" if args.max_concurrency == 1 else f"kind=concurrent,streams={args.max_concurrency}"
    limit = (f"kind=max_duration,seconds={args.guidellm_max_seconds:g}" if args.guidellm_max_seconds
             else f"kind=max_requests,count={args.num_prompts}")
    return [*exe, "run", "--backend", backend, "--profile", profile, "--constraint", limit,
            "--data", f"kind=synthetic_text,prompt_tokens={args.input_len},output_tokens={args.output_len}",
            "--tokenizer", f"kind=hf_auto,model={tokenizer}", "--output", f"kind=json,path={report_path}",
            "--disable-console-interactive"]


def run_guidellm(args: argparse.Namespace, api_key: str | None) -> list[dict]:
    exe = args.guidellm_bin or shutil.which("guidellm")
    if not exe:
        raise SystemExit("bench serve --guidellm: guidellm is not installed (pip install guidellm; in a venv of "
                         "its own if its pins clash, then --guidellm-bin VENV/bin/guidellm)")
    with tempfile.TemporaryDirectory(prefix="lite-llm-guidellm-") as tmp:
        tokenizer = guidellm_tokenizer(args.guidellm_tokenizer, tmp)
        report_path = os.path.join(tmp, "benchmarks.json")
        cmd = guidellm_command([exe], args, tokenizer, report_path, api_key)
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}     # its tokenizer is on this machine
        # guidellm's own console report goes to stderr when stdout carries this one's JSON
        code = subprocess.call(cmd, env=env, stdout=2 if args.json else None)     # fd 2: stderr
        if code != 0 or not os.path.exists(report_path):
            raise SystemExit(f"bench serve: guidellm exited with {code} and no report")
        if args.guidellm_keep_report:
            shutil.copyfile(report_path, args.guidellm_keep_report)
        return read_guidellm_report(report_path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--base-url", default="http://127.0.0.1:8000", help="server address (default http://127.0.0.1:8000)")
    a("--model", default=None, help="model name (default: the first of GET /v1/models)")
    a("--num-prompts", type=int, default=100)
    a("--max-concurrency", type=int, default=8, help="requests in flight at once")
    a("--input-len", type=int, default=128, help="prompt tokens per request")
    a("--output-len", type=int, default=128, help="generated tokens per request (ignore_eos)")
    a("--seed", type=int, default=0)
    a("--api-key", default=None, help="bearer key (default: env LITE_LLM_API_KEY)")
    a("--timeout", type=float, default=600.0, help="seconds per request")
    a("--json", action="store_true", help="print the results as one JSON object")
    g = parser.add_argument_group("guidellm", "the same load from guidellm, vLLM's load generator, reported here")
    g.add_argument("--guidellm", action="store_true",
                   help="run guidellm on this shape (its chat requests; --max-concurrency 1: synchronous, "
                        "more: concurrent streams) instead of this client, and report its figures")
    g.add_argument("--guidellm-report", metavar="FILE", default=None,
                   help="only summarize a guidellm benchmarks.json (each of its benchmarks) in this report's terms")
    g.add_argument("--guidellm-bin", default=None, help="the guidellm executable (default: guidellm on PATH)")
    g.add_argument("--guidellm-tokenizer", default=None,
                   help="tokenizer guidellm sizes its prompts with: a Hugging Face directory or name, or a model "
                        "lite-llm loads (a .gguf) whose tokenizer is written for it (default: the embedded "
                        "default model's)")
    g.add_argument("--guidellm-max-seconds", type=float, default=None,
                   help="run guidellm for this long instead of --num-prompts requests")
    g.add_argument("--guidellm-keep-report", metavar="FILE", default=None, help="keep guidellm's benchmarks.json here")


def _report_all(results: list[dict], as_json: bool) -> int:
    if as_json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(f"{r['source']}: {r['strategy']}, {r['max_concurrency']} stream(s), {r['incomplete']} request(s) "
                  f"cut by its limit; ITL is its per-request mean gap (guidellm keeps no single gaps)")
            print(format_report(r))
    return 0 if results and all(r["failed"] == 0 for r in results) else 1


def run(args: argparse.Namespace) -> int:
    for name in ("num_prompts", "max_concurrency", "input_len", "output_len"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    if args.guidellm_report:
        try:
            return _report_all(read_guidellm_report(args.guidellm_report), args.json)
        except (OSError, ValueError) as e:
            print(f"bench serve: {args.guidellm_report}: {e}", file=sys.stderr)
            return 1
    if args.guidellm:
        return _report_all(run_guidellm(args, args.api_key or env("API_KEY")), args.json)
    try:
        result = benchmark(args.base_url, args.num_prompts, args.max_concurrency, args.input_len,
                           args.output_len, model=args.model, api_key=args.api_key or env("API_KEY"),
                           seed=args.seed, timeout=args.timeout)
    except (OSError, RuntimeError) as e:
        print(f"bench serve: cannot reach {args.base_url}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0 if result["failed"] == 0 else 1
