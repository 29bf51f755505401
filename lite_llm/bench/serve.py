"""`lite-llm bench serve`: load a running OpenAI-compatible server, report TTFT, TPOT, ITL, throughput.

Like `vllm bench serve --dataset-name random`: N prompts of exactly --input-len tokens (random
words, tokenized by the server's own /tokenize and sent as token ids), each asking for exactly
--output-len tokens (ignore_eos), streamed so every token's arrival is timed, at most
--max-concurrency in flight. Only the stdlib (http.client, threads): it runs anywhere the
server's clients do. Works against any server with /v1/completions streaming and /tokenize
(vLLM included). Deliberately not here: request-rate schedules, datasets, chat endpoints.
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
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


def run(args: argparse.Namespace) -> int:
    for name in ("num_prompts", "max_concurrency", "input_len", "output_len"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    try:
        result = benchmark(args.base_url, args.num_prompts, args.max_concurrency, args.input_len,
                           args.output_len, model=args.model, api_key=args.api_key or env("API_KEY"),
                           seed=args.seed, timeout=args.timeout)
    except (OSError, RuntimeError) as e:
        print(f"bench serve: cannot reach {args.base_url}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0 if result["failed"] == 0 else 1
