"""The web pages of `serve`: a chat playground at / and a live engine dashboard at /dashboard,
and the JSON the dashboard polls (GET /v1/engine/stats).

The pages are static files shipped in the package (lite_llm/server/web/: plain HTML, CSS and
JavaScript, no build step, nothing from a CDN). Each page is its body (web/<name>.body.html) in
the one shell every page shares (web/page.html: head, styles, scripts, the header and its
navigation, the API-key bar and the status line), put together when it is served. They and their files are the only routes
besides /health and /ping that answer without the API key: they hold no data; every call
they make (/v1/models, /v1/chat/completions, /v1/engine/stats) carries the key the user
typed, which the page keeps in memory only. `--disable-web-ui` turns the pages off (404);
/v1/engine/stats stays, behind the key, as any API route.

engine_stats() renders the same EngineStats /metrics renders (server/metrics.py), in JSON:
counters, gauges and histograms as they are, and the live window (engine/live.py) that
/metrics exports as named gauges, so the dashboard and a scrape never disagree. Rates over
longer spans and latency percentiles are the page's arithmetic on these counters.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any

from lite_llm.engine.stats import EngineStats, Histogram

WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")


@dataclass(frozen=True)
class Page:
    title: str        # <title>
    heading: str      # the header's <h1>
    script: str       # the page's own script in web/ (common.js comes first on every page)
    body: str         # web/<body>: the page's part of <main>, after the key bar and status line
    key_bar_extra: str = ""   # the page's own controls in the shared key bar


_PAUSE_BUTTON = '    <button type="button" id="pause" class="secondary" aria-pressed="false">Pause</button>\n'
# route -> page; the navigation lists them in this order
PAGES = {"/": Page("lite-llm playground", "lite-llm playground", "chat.js", "index.body.html"),
         "/dashboard": Page("lite-llm dashboard", "lite-llm engine dashboard", "dashboard.js",
                            "dashboard.body.html", key_bar_extra=_PAUSE_BUTTON)}
_NAV_LABELS = {"/": "Playground", "/dashboard": "Dashboard"}
STATIC_PREFIX = "/web/"
_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml", ".txt": "text/plain; charset=utf-8"}
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*\.(html|css|js|svg|txt)")
# The pages load only their own files and talk only to this server; nothing may frame them.
HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                                      "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                                      "form-action 'none'; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}


def is_page_route(path: str) -> bool:
    """/, /dashboard and /web/<file>: the routes the web UI adds, open without the key."""
    return path in PAGES or path.startswith(STATIC_PREFIX)


def _read(name: str) -> bytes | None:
    try:
        with open(os.path.join(WEB_DIR, name), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def render_page(route: str) -> bytes:
    """The page at `route`: its body in the shared shell, its own entry of the navigation marked."""
    page = PAGES[route]
    current = ' aria-current="page"'
    nav = "".join(f'<a href="{r}"{current if r == route else ""}>{_NAV_LABELS[r]}</a>' for r in PAGES)
    html = _read("page.html").decode()
    for key, value in (("title", page.title), ("heading", page.heading), ("script", page.script), ("nav", nav),
                       ("key_bar_extra", page.key_bar_extra), ("body", _read(page.body).decode())):
        html = html.replace("{{" + key + "}}", value)
    return html.encode()


def web_file(path: str) -> tuple[bytes, str] | None:
    """(content, content type) of a page or static file; None if there is no such file. Only
    plain names directly in WEB_DIR are served (no subdirectories, no dot files)."""
    if path in PAGES:
        return render_page(path), _TYPES[".html"]
    name = path[len(STATIC_PREFIX):] if path.startswith(STATIC_PREFIX) else None
    if name is None or not _NAME.fullmatch(name):
        return None
    content = _read(name)
    return None if content is None else (content, _TYPES[os.path.splitext(name)[1]])


def _hist(h: Histogram) -> dict:
    return {"bounds": list(h.bounds), "counts": list(h.counts), "sum": h.sum, "count": h.count}


def engine_stats(stats: EngineStats | None, kernel_info: dict, model_names: tuple[str, ...]) -> dict:
    """GET /v1/engine/stats: one engine snapshot (data parallel: the replicas merged, threads
    labelled by replica) with the server's kernel and plan facts."""
    info = kernel_info
    out: dict[str, Any] = {
        "object": "engine.stats", "time": time.time(), "models": list(model_names),
        "kernel": {"variant": info.get("kernel_variant"), "num_threads": info.get("num_threads"),
                   "thread_plan": list(info.get("thread_plan") or []),
                   "data_parallel_size": info.get("data_parallel_size", 1)},
        "engine_alive": stats is not None,
    }
    if stats is None:
        return out
    num_blocks = info.get("kv_cache_blocks")
    used = round(stats.kv_cache_usage * num_blocks) if num_blocks else None
    live = stats.live
    out.update({
        "requests": {"running": stats.num_running, "waiting": stats.num_waiting,
                     "preemptions_total": stats.num_preempted_total,
                     "success_total": {"stop": 0, "length": 0, "abort": 0, **stats.request_success_total}},
        "tokens": {"prompt_total": stats.prompt_tokens_total,
                   "generation_total": stats.generation_tokens_total},
        "kv_cache": {"usage": stats.kv_cache_usage, "blocks_total": num_blocks, "blocks_used": used,
                     "blocks_free": None if used is None else num_blocks - used,
                     "prefix_cache_queries_total": stats.prefix_cache_queries,
                     "prefix_cache_hits_total": stats.prefix_cache_hits},
        "latency": {name: _hist(getattr(stats, name)) for name in ("ttft", "itl", "tpot", "e2e", "queue_time")},
        "bandwidth": {"decode_bytes_per_second": stats.achieved_bandwidth,
                      "measured_bytes_per_second": None if live is None else live.measured_bandwidth,
                      "roofline_ratio": stats.roofline_ratio},
        "live": None if live is None else {
            "time": live.time, "window_seconds": live.window_seconds,
            "prompt_tokens_per_second": live.prompt_tokens_per_second,
            "generation_tokens_per_second": live.generation_tokens_per_second,
            "threads": [{"engine": t.engine, "thread": t.thread, "tid": t.tid, "cpu": t.cpu,
                         "last_cpu": t.last_cpu, "cpu_seconds_total": t.cpu_seconds, "busy": t.busy}
                        for t in live.threads]},
    })
    return out
