"""Prometheus text exposition for GET /metrics: vLLM's metric names under a `lite_llm:` prefix.

Every figure is the engine's (engine/stats.py, read from `engine.stats()` at scrape time):
queue gauges, token and request counters, request latency histograms (TTFT, ITL, time per
output token, queue time, end to end), per-step Python vs kernel time and the bandwidth the
kernels achieved. This module only renders them, with the server's labels and CPU facts; it
observes nothing itself. No prometheus_client at run time: the text format is small enough to
write by hand.
"""
from __future__ import annotations

from typing import Any

from lite_llm.engine.stats import EngineStats

PREFIX = "lite_llm:"

# (EngineStats field, metric name, help): histograms, on vLLM's bucket bounds where vLLM has them
HISTOGRAMS = (
    ("ttft", "time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    ("itl", "inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    ("tpot", "request_time_per_output_token_seconds", "Histogram of time per output token in seconds."),
    ("e2e", "e2e_request_latency_seconds", "Histogram of end to end request latency in seconds."),
    ("queue_time", "request_queue_time_seconds", "Histogram of time spent waiting in the queue in seconds."),
    ("step_python", "step_python_seconds",
     "Histogram of Python time per engine step (scheduler, step arrays, outputs, text) in seconds."),
    ("step_kernel", "step_kernel_seconds",
     "Histogram of compiled forward pass + sampler time per engine step in seconds."),
)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    esc = (lambda v: str(v).replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"'))
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def _num(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v)) if isinstance(v, float) else str(v)


def render_histogram(name: str, help: str, bounds: tuple[float, ...], cumulative: list[int],
                     total: float, count: int, labels: dict[str, str]) -> list[str]:
    name = PREFIX + name
    lines = [f"# HELP {name} {help}", f"# TYPE {name} histogram"]
    for bound, c in zip(bounds, cumulative):
        lines.append(f"{name}_bucket{_labels({**labels, 'le': _num(float(bound))})} {c}")
    lines.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {count}")
    lines.append(f"{name}_sum{_labels(labels)} {_num(float(total))}")
    lines.append(f"{name}_count{_labels(labels)} {count}")
    return lines


class ServerMetrics:
    """Renders GET /metrics from the engine's stats, with this server's labels and CPU facts."""

    def __init__(self, model_name: str, kernel_info: dict | None = None):
        self.model_name = model_name
        self.kernel_info = dict(kernel_info or {})

    def render(self, stats: EngineStats | None) -> str:
        """stats None (the engine failed): only the CPU facts, so a scrape still succeeds."""
        labels = {"model_name": self.model_name}
        lines: list[str] = []

        def metric(name: str, kind: str, help: str, value: float | None,
                   extra: dict[str, str] | None = None) -> None:
            if value is None:
                return
            full = PREFIX + name
            family = full[:-len("_total")] if kind == "counter" and full.endswith("_total") else full
            lines.append(f"# HELP {family} {help}")
            lines.append(f"# TYPE {family} {kind}")
            sample = family + "_total" if kind == "counter" else family
            lines.append(f"{sample}{_labels({**labels, **(extra or {})})} {_num(value)}")

        if stats is not None:
            metric("num_requests_running", "gauge", "Number of requests in model execution batches.",
                   stats.num_running)
            metric("num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                   stats.num_waiting)
            metric("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                   float(stats.kv_cache_usage))
            metric("num_preemptions_total", "counter", "Cumulative number of preemptions.",
                   stats.num_preempted_total)
            metric("prefix_cache_queries_total", "counter",
                   "Prefix cache queries, in terms of number of queried tokens.", stats.prefix_cache_queries)
            metric("prefix_cache_hits_total", "counter",
                   "Prefix cache hits, in terms of number of cached tokens.", stats.prefix_cache_hits)
            metric("prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                   stats.prompt_tokens_total)
            metric("generation_tokens_total", "counter", "Number of generation tokens processed.",
                   stats.generation_tokens_total)
            name = PREFIX + "request_success"
            lines += [f"# HELP {name} Count of successfully processed requests.", f"# TYPE {name} counter"]
            success = {"stop": 0, "length": 0, "abort": 0, **stats.request_success_total}
            for reason, count in sorted(success.items()):
                lines.append(f"{name}_total{_labels({**labels, 'finished_reason': reason})} {count}")
            for attr, hname, help in HISTOGRAMS:
                h = getattr(stats, attr)
                lines += render_histogram(hname, help, tuple(h.bounds), list(h.counts), h.sum, h.count, labels)
            if stats.spec_decode_num_drafts:
                metric("spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.",
                       stats.spec_decode_num_drafts)
                metric("spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
                       stats.spec_decode_num_draft_tokens)
                metric("spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
                       stats.spec_decode_num_accepted_tokens)
                name = PREFIX + "spec_decode_num_accepted_tokens_per_pos"
                lines += [f"# HELP {name} Accepted tokens per draft position.", f"# TYPE {name} counter"]
                for pos, count in enumerate(stats.spec_decode_num_accepted_tokens_per_pos):
                    lines.append(f"{name}_total{_labels({**labels, 'position': str(pos)})} {count}")
            metric("num_steps_total", "counter", "Engine steps run.", stats.num_steps_total)
            metric("step_bytes_read_total", "counter",
                   "Bytes the kernels read (weights once per step + KV cache read by attention).",
                   stats.step_bytes_read_total)
            metric("decode_memory_bandwidth_bytes_per_second", "gauge",
                   "Achieved read bandwidth of recent decode steps (bytes read / kernel time).",
                   stats.achieved_bandwidth)
        # CPU facts nobody else exports
        info = {k: str(v) for k, v in self.kernel_info.items()
                if k in ("kernel_variant", "num_threads", "isa", "cpu")}
        metric("kernel_info", "gauge", "Kernel build and thread plan of this server (value is 1).", 1,
               info)
        threads = self.kernel_info.get("num_threads")
        metric("num_threads", "gauge", "OpenMP threads the forward pass runs on.",
               int(threads) if threads is not None else None)
        return "\n".join(lines) + "\n"
