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


def _live_metrics(series, labels, family, lines, metric) -> None:
    """The latest live window (engine/live.py): the same LiveStats object /v1/engine/stats shows."""
    live = lambda f: (lambda st: None if st.live is None else f(st.live))   # noqa: E731
    metric("stats_window_end_timestamp_seconds", "gauge",
           "Unix time at which the latest live window (the rates and busy ratios below) ended.",
           live(lambda lv: lv.time))
    metric("stats_window_seconds", "gauge", "Length of the latest live window in seconds.",
           live(lambda lv: lv.window_seconds))
    metric("prompt_tokens_per_second", "gauge", "Prefill tokens per second over the latest live window.",
           live(lambda lv: lv.prompt_tokens_per_second))
    metric("generation_tokens_per_second", "gauge",
           "Generation tokens per second over the latest live window.",
           live(lambda lv: lv.generation_tokens_per_second))
    metric("memory_bandwidth_measured_bytes_per_second", "gauge",
           "Read bandwidth the engine's threads reached at start-up (the decode roofline).",
           live(lambda lv: lv.measured_bandwidth))
    metric("decode_memory_bandwidth_roofline_ratio", "gauge",
           "Achieved decode bandwidth / measured read bandwidth (1 = at the memory-bandwidth limit).",
           lambda st: st.roofline_ratio)
    for name, kind, help, value in (
            ("engine_thread_busy_ratio", "gauge",
             "Share of one CPU each engine thread ran in the latest live window "
             "(/proc/self/task/<tid>/stat), labelled with its planned CPU.", lambda t: t.busy),
            ("engine_thread_cpu_seconds_total", "counter",
             "CPU seconds (user + system) each engine thread has run.", lambda t: t.cpu_seconds)):
        rows = [(engine, t) for engine, st in series if st.live is not None for t in st.live.threads
                if value(t) is not None]
        if not rows:
            continue
        sample = family(name, kind, help)
        for engine, t in rows:
            extra = {"thread": str(t.thread), "cpu": "unbound" if t.cpu is None else str(t.cpu)}
            lines.append(f"{sample}{_labels({**labels, **engine, **extra})} {_num(float(value(t)))}")


class ServerMetrics:
    """Renders GET /metrics from the engine's stats, with this server's labels and CPU facts."""

    def __init__(self, model_name: str, kernel_info: dict | None = None):
        self.model_name = model_name
        self.kernel_info = dict(kernel_info or {})

    def render(self, stats: EngineStats | None,
               replicas: list[EngineStats | None] | None = None) -> str:
        """stats None (the engine failed): only the CPU facts, so a scrape still succeeds.
        replicas (data parallel): one series per replica, labelled engine="<index>" as vLLM
        labels its engines; a replica whose stats are None (dead) is left out."""
        labels = {"model_name": self.model_name}
        if replicas is None:
            series = [] if stats is None else [({}, stats)]
        else:
            series = [({"engine": str(i)}, s) for i, s in enumerate(replicas) if s is not None]
        lines: list[str] = []

        def family(name: str, kind: str, help: str) -> str:
            full = PREFIX + name
            fam = full[:-len("_total")] if kind == "counter" and full.endswith("_total") else full
            lines.append(f"# HELP {fam} {help}")
            lines.append(f"# TYPE {fam} {kind}")
            return fam + "_total" if kind == "counter" else fam

        def metric(name: str, kind: str, help: str, value: Any, extra: dict[str, str] | None = None) -> None:
            """value: a number (None: left out) or a function of one engine's stats."""
            if value is None:
                return
            if not callable(value):
                sample = family(name, kind, help)
                lines.append(f"{sample}{_labels({**labels, **(extra or {})})} {_num(value)}")
                return
            if not series:
                return
            sample = family(name, kind, help)
            for engine, st in series:
                v = value(st)
                if v is not None:
                    lines.append(f"{sample}{_labels({**labels, **engine, **(extra or {})})} {_num(v)}")

        metric("num_requests_running", "gauge", "Number of requests in model execution batches.",
               lambda st: st.num_running)
        metric("num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
               lambda st: st.num_waiting)
        metric("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
               lambda st: float(st.kv_cache_usage))
        metric("num_preemptions_total", "counter", "Cumulative number of preemptions.",
               lambda st: st.num_preempted_total)
        metric("prefix_cache_queries_total", "counter",
               "Prefix cache queries, in terms of number of queried tokens.", lambda st: st.prefix_cache_queries)
        metric("prefix_cache_hits_total", "counter",
               "Prefix cache hits, in terms of number of cached tokens.", lambda st: st.prefix_cache_hits)
        metric("prompt_tokens_total", "counter", "Number of prefill tokens processed.",
               lambda st: st.prompt_tokens_total)
        metric("generation_tokens_total", "counter", "Number of generation tokens processed.",
               lambda st: st.generation_tokens_total)
        if series:
            sample = family("request_success_total", "counter", "Count of successfully processed requests.")
            for engine, st in series:
                success = {"stop": 0, "length": 0, "abort": 0, **st.request_success_total}
                for reason, count in sorted(success.items()):
                    lines.append(f"{sample}{_labels({**labels, **engine, 'finished_reason': reason})} {count}")
            for attr, hname, help in HISTOGRAMS:
                first = True
                for engine, st in series:
                    h = getattr(st, attr)
                    block = render_histogram(hname, help, tuple(h.bounds), list(h.counts), h.sum, h.count,
                                             {**labels, **engine})
                    lines += block if first else block[2:]      # HELP and TYPE once per family
                    first = False
        if any(st.spec_decode_num_drafts for _, st in series):
            metric("spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.",
                   lambda st: st.spec_decode_num_drafts)
            metric("spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
                   lambda st: st.spec_decode_num_draft_tokens)
            metric("spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
                   lambda st: st.spec_decode_num_accepted_tokens)
            sample = family("spec_decode_num_accepted_tokens_per_pos_total", "counter",
                            "Accepted tokens per draft position.")
            for engine, st in series:
                for pos, count in enumerate(st.spec_decode_num_accepted_tokens_per_pos):
                    lines.append(f"{sample}{_labels({**labels, **engine, 'position': str(pos)})} {count}")
        metric("num_steps_total", "counter", "Engine steps run.", lambda st: st.num_steps_total)
        metric("step_bytes_read_total", "counter",
               "Bytes the kernels read (weights once per step + KV cache read by attention).",
               lambda st: st.step_bytes_read_total)
        if any(st.achieved_bandwidth is not None for _, st in series):
            metric("decode_memory_bandwidth_bytes_per_second", "gauge",
                   "Achieved read bandwidth of recent decode steps (bytes read / kernel time).",
                   lambda st: st.achieved_bandwidth)
        if any(st.live is not None for _, st in series):
            _live_metrics(series, labels, family, lines, metric)
        # CPU facts nobody else exports
        info = {k: str(v) for k, v in self.kernel_info.items()
                if k in ("kernel_variant", "num_threads", "isa", "cpu")}
        metric("kernel_info", "gauge", "Kernel build and thread plan of this server (value is 1).", 1,
               info)
        threads = self.kernel_info.get("num_threads")
        metric("num_threads", "gauge", "OpenMP threads the forward pass runs on.",
               int(threads) if threads is not None else None)
        return "\n".join(lines) + "\n"
