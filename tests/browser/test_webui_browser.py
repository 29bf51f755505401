"""The web UI in headless Chromium against `python -m lite_llm serve` on the default model.

Agreement with /metrics: the dashboard shows the server's live window (engine/live.py) and
/metrics exports the same window, so for one window (same end time) the token rates and each
thread's busy ratio must be EQUAL; the test reads the page, scrapes /metrics at once, and
retries when a new window started in between. KV-cache usage is live in both (not windowed):
/metrics is scraped the moment the page's poll is answered, and the tolerance is
KV_TOLERANCE_BLOCKS blocks, what a request starting or finishing in those milliseconds changes.
"""
from __future__ import annotations

import json
import math
import random
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lite_llm.cpu import default_plan

from .conftest import Server, load, screenshot

KEY = "sk-browser-test"
KV_TOLERANCE_BLOCKS = 2      # of 36: /metrics is scraped as the page's poll is answered (ms apart)
# A thread is busy when the page would not flag it (dashboard.js): at least a fifth of the busiest
# engine thread's share and 1 % of a CPU. Relative, because other processes on a shared machine
# cap what every thread gets (load average 11 on 2 cores here at times); an idle thread gets ~0.
IDLE_SHARE, IDLE_FLOOR = 0.2, 0.01


def scrape(server: Server, key: str | None = None) -> dict:
    text = server.get("/metrics", key).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def metric(m: dict, name: str, **labels) -> float:
    return m[(name, tuple(sorted(labels.items())))]


def wait_for(cond, timeout: float, what: str, step: float = 0.2, page=None):
    """page: wait in Playwright's own loop, so its event handlers (page.on) run meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        if page is not None:
            page.wait_for_timeout(step * 1000)
        else:
            time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def data_value(page, selector: str) -> float | None:
    v = page.get_attribute(selector, "data-value")
    return None if v in (None, "") else float(v)


# ---- playground ------------------------------------------------------------------------------

def test_playground_streams_an_answer_and_stop_aborts_it_on_the_server(server, page):
    before = scrape(server)
    # a long answer for sure: the page's own request, with ignore_eos added on its way out
    def add_ignore_eos(route):
        body = json.loads(route.request.post_data)
        route.continue_(post_data=json.dumps({**body, "ignore_eos": True}))
    page.route("**/v1/chat/completions", add_ignore_eos)
    page.goto(server.url + "/")
    wait_for(lambda: page.input_value("#model"), 10, "the model list")
    page.fill("#max-tokens", "900")
    page.fill("#system", "You are a storyteller.")
    page.focus("#prompt")
    page.keyboard.type("Tell me a very long story about a lighthouse keeper.")
    page.keyboard.press("Enter")                                   # the keyboard sends
    answer = "#messages li.assistant .text"
    lengths = []
    def grown():
        lengths.append(len(page.inner_text(answer)))
        return len(set(lengths)) >= 4
    wait_for(grown, 60, "the answer to grow in several pieces", step=0.05)
    assert lengths == sorted(lengths)                              # streamed in, never rewritten
    assert metric(scrape(server), "lite_llm:num_requests_running") == 1
    page.click("#stop")
    wait_for(lambda: page.get_attribute("#messages li.assistant", "data-state") == "stopped", 10, "the stop")
    stopped_at = len(page.inner_text(answer))
    assert "stopped by you" in page.inner_text("#messages li.assistant .meta")
    assert page.is_enabled("#send") and not page.is_enabled("#stop")
    # the server aborted the request: counted as an abort, nothing running, its KV blocks back
    def aborted():
        m = scrape(server)
        return (metric(m, "lite_llm:request_success_total", finished_reason="abort")
                == metric(before, "lite_llm:request_success_total", finished_reason="abort") + 1
                and metric(m, "lite_llm:num_requests_running") == 0
                and metric(m, "lite_llm:kv_cache_usage_perc") == 0.0) and m
    m = wait_for(aborted, 15, "the server to abort the request and free its blocks")
    generated = metric(m, "lite_llm:generation_tokens_total") - metric(before, "lite_llm:generation_tokens_total")
    assert 4 <= generated < 900                                    # stopped long before max_tokens
    time.sleep(0.5)
    assert len(page.inner_text(answer)) == stopped_at
    # the conversation stays in the browser: a reload shows it again
    page.reload()
    wait_for(lambda: page.locator("#messages li").count() == 2, 10, "the kept conversation")
    assert "lighthouse" in page.inner_text("#messages li.user")


def test_playground_shows_the_servers_token_counts_and_rate(server, page):
    before = scrape(server)
    page.goto(server.url + "/")
    wait_for(lambda: page.input_value("#model"), 10, "the model list")
    page.fill("#max-tokens", "12")
    page.fill("#temperature", "0")
    page.fill("#prompt", "Name three colours.")
    page.click("#send")
    li = "#messages li.assistant"
    wait_for(lambda: page.get_attribute(li, "data-state") not in (None, "streaming"), 60, "the answer")
    meta = page.inner_text(li + " .meta")
    m = scrape(server)
    generated = metric(m, "lite_llm:generation_tokens_total") - metric(before, "lite_llm:generation_tokens_total")
    prompt = metric(m, "lite_llm:prompt_tokens_total") - metric(before, "lite_llm:prompt_tokens_total")
    # the counts are the server's usage (stream_options.include_usage), not the page's guess
    assert f"{int(prompt)} prompt tokens" in meta and f" {int(generated)} tokens" in meta, meta
    assert "~" not in meta and "tok/s" in meta and "first token" in meta


# ---- dashboard under load --------------------------------------------------------------------

def page_numbers(page) -> dict:
    rows = page.locator("#cores tbody tr")
    return {"time": float(page.get_attribute("body", "data-stats-time") or "nan"),
            "gen": data_value(page, "#v-gen-rate"), "prompt": data_value(page, "#v-prompt-rate"),
            "kv": data_value(page, "#v-kv-used"), "running": data_value(page, "#v-running"),
            "busy": {rows.nth(i).get_attribute("data-thread"): (rows.nth(i).get_attribute("data-cpu"),
                                                                 float(rows.nth(i).get_attribute("data-busy") or "nan"))
                     for i in range(rows.count())}}


def test_dashboard_charts_update_under_load_and_agree_with_metrics(server, page):
    page.goto(server.url + "/dashboard")
    plan = default_plan(serving=True)[1].ranks[0].cpus          # what `info` prints for this machine
    with load(server.url, concurrency=16):
        wait_for(lambda: (data_value(page, "#v-running") or 0) >= 8 and (data_value(page, "#v-gen-rate") or 0) > 0,
                 60, "the dashboard to show the load")
        d1 = page.get_attribute("#c-tok path[data-series=generation]", "d")
        n1 = int(page.get_attribute("#c-tok path[data-series=generation]", "data-points"))
        kv1 = page.get_attribute("#c-kv path", "d")
        wait_for(lambda: int(page.get_attribute("#c-tok path[data-series=generation]", "data-points")) >= n1 + 3,
                 15, "three more polls")
        assert page.get_attribute("#c-tok path[data-series=generation]", "d") != d1      # the charts move
        assert page.get_attribute("#c-kv path", "d") != kv1
        matched, rates = 0, []
        for _ in range(20):
            polls = int(page.get_attribute("body", "data-polls"))
            with page.expect_response(lambda r: "/v1/engine/stats" in r.url, timeout=5000):
                pass
            m = scrape(server)               # the moment the page got its figures
            wait_for(lambda: int(page.get_attribute("body", "data-polls")) > polls, 5, "the page to draw them")
            p = page_numbers(page)
            if metric(m, "lite_llm:stats_window_end_timestamp_seconds") != p["time"]:
                continue                     # a new window began between the two reads: again
            matched += 1
            assert p["gen"] == metric(m, "lite_llm:generation_tokens_per_second")
            rates.append(p["gen"])      # a window can hold no finished step (a long prefill step)
            assert p["prompt"] == metric(m, "lite_llm:prompt_tokens_per_second")
            assert abs(p["kv"] - metric(m, "lite_llm:kv_cache_usage_perc")) <= KV_TOLERANCE_BLOCKS / 36
            assert p["kv"] > 0
            assert sorted(int(c) for c, _ in p["busy"].values()) == sorted(plan)
            for thread, (cpu, busy) in p["busy"].items():
                assert busy == metric(m, "lite_llm:engine_thread_busy_ratio", thread=thread, cpu=cpu)
            if matched >= 3:
                break
        assert matched >= 3, "the page and /metrics never showed the same window"
        assert max(rates) > 0
        screenshot(page, "webui-dashboard-under-load.png")
        play = page.context.new_page()
        play.goto(server.url + "/")
        play.fill("#prompt", "What is the capital of France?")
        play.press("#prompt", "Enter")
        wait_for(lambda: play.get_attribute("#messages li.assistant", "data-state") not in (None, "streaming"),
                 120, "the playground's answer under load")
        assert "tok/s" in play.inner_text("#messages li.assistant .meta")
        screenshot(play, "webui-playground-under-load.png")


def test_real_thread_counters_show_both_engine_threads_busy_under_load(server):
    task = f"/proc/{server.pid}/task"

    def direct(tid: int) -> float:       # the same counter, read by this test from outside
        with open(f"{task}/{tid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / 100     # utime + stime: fields 14, 15

    plan = default_plan(serving=True)[1].ranks[0].cpus
    with load(server.url, concurrency=16):
        wait_for(lambda: json.loads(server.get("/v1/engine/stats"))["requests"]["running"] >= 8, 60, "the load")
        time.sleep(1.0)
        busy: dict[int, list[float]] = {}
        for _ in range(4):
            tids = [t["tid"] for t in json.loads(server.get("/v1/engine/stats"))["live"]["threads"]]
            before = {tid: direct(tid) for tid in tids}
            time.sleep(1.0)
            doc = json.loads(server.get("/v1/engine/stats"))
            after = {tid: direct(tid) for tid in tids}
            assert doc["requests"]["running"] > 0
            threads = doc["live"]["threads"]
            assert [t["cpu"] for t in threads] == list(plan)          # thread i on the plan's i-th CPU
            for t in threads:
                assert before[t["tid"]] <= t["cpu_seconds_total"] <= after[t["tid"]]
                assert t["last_cpu"] == t["cpu"]                      # still where it was pinned
                busy.setdefault(t["thread"], []).append(t["busy"])
    assert len(busy) == len(plan) >= 2
    mean = {thread: sum(v) / len(v) for thread, v in busy.items()}
    for thread, m in mean.items():
        assert m >= max(IDLE_FLOOR, IDLE_SHARE * max(mean.values())), (thread, busy)


# ---- a planned core that idles ---------------------------------------------------------------

def test_the_page_flags_a_planned_core_that_idled_while_requests_ran(server, page):
    snap = json.loads(server.get("/v1/engine/stats"))
    threads = snap["live"]["threads"]
    assert len(threads) >= 2
    snap["requests"]["running"] = 8
    for t in threads:
        t["busy"] = 0.92
    threads[1]["busy"] = 0.0                       # one planned core did nothing while 8 ran
    idle_cpu = threads[1]["cpu"]
    page.route("**/v1/engine/stats", lambda route: route.fulfill(
        status=200, content_type="application/json", body=json.dumps(snap)))
    page.goto(server.url + "/dashboard")
    row = page.locator("#cores tbody tr[data-thread='1']")
    wait_for(lambda: row.count() == 1, 10, "the cores table")
    assert row.get_attribute("data-state") == "idle" and "idle" in row.get_attribute("class")
    assert "IDLE" in row.inner_text()                                  # not by colour alone
    assert page.locator("#cores tbody tr[data-thread='0']").get_attribute("data-state") == "ok"
    summary = page.inner_text("#cores-summary")
    assert f"CPU {idle_cpu}" in summary and "IDLE" in summary
    # red: the flagged row's colour differs from a working row's
    colour = lambda sel: page.eval_on_selector(sel, "e => getComputedStyle(e).backgroundColor")   # noqa: E731
    assert colour("#cores tbody tr[data-thread='1']") != colour("#cores tbody tr[data-thread='0']")
    # with no request running, a sleeping core is not a fault
    snap["requests"]["running"] = 0
    page.reload()
    wait_for(lambda: page.locator("#cores tbody tr[data-thread='1']").count() == 1, 10, "the table again")
    assert page.locator("#cores tbody tr[data-thread='1']").get_attribute("data-state") == "ok"


# ---- memory ----------------------------------------------------------------------------------

def test_the_page_shows_each_models_memory(server, page):
    snap = json.loads(server.get("/v1/engine/stats"))
    assert snap["memory"]["models"][0]["status"] == "loaded" and snap["memory"]["models"][0]["bytes"] > 0
    plan = {"weights": 2 << 30, "kv_cache": 1 << 30, "activations": 1 << 29, "total": (7 << 29)}
    snap["memory"] = {"machine": {"total_bytes": 64 << 30, "available_bytes": 40 << 30, "cgroup_limit_bytes": 48 << 30},
                      "models_memory_bytes": 24 << 30,
                      "models": [{"id": "chat", "status": "loaded", "bytes": 3 << 30, "planned": plan},
                                 {"id": "<b>embed</b>", "status": "unloaded", "bytes": 0, "planned": None}]}
    page.route("**/v1/engine/stats", lambda route: route.fulfill(
        status=200, content_type="application/json", body=json.dumps(snap)))
    page.goto(server.url + "/dashboard")
    rows = page.locator("#models tbody tr")
    wait_for(lambda: rows.count() == 2, 10, "the models table")
    chat = page.locator("#models tbody tr[data-model='chat']")
    assert chat.get_attribute("data-status") == "loaded"
    assert [c.strip() for c in chat.inner_text().split("\t")] == ["chat", "loaded", "3.00 GiB",
                                                                   "3.50 GiB = 2.00 GiB + 1.00 GiB + 0.50 GiB"]
    other = rows.nth(1).inner_text()
    assert "<b>embed</b>" in other and "unloaded" in other           # names are text, never markup
    machine = page.inner_text("#v-mem-machine")
    assert "64.00 GiB total" in machine and "cgroup limit 48.00 GiB" in machine and "24.00 GiB" in machine


# ---- the API key -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed():
    s = Server("--api-key", KEY)
    yield s
    s.stop()


@pytest.mark.parametrize("path,call", [("/", "/v1/models"), ("/dashboard", "/v1/engine/stats")])
def test_with_an_api_key_the_pages_say_401_until_the_key_is_typed(keyed, page, path, call):
    answers = []
    page.on("response", lambda r: answers.append((r.url.split(keyed.url)[-1], r.status,
                                                  r.request.headers.get("authorization"))))
    page.goto(keyed.url + path)                    # the page itself needs no key
    wait_for(lambda: "401" in page.inner_text("#status"), 10, "the 401 message")
    status = page.locator("#status")
    assert "error" in status.get_attribute("class") and status.get_attribute("role") == "alert"
    wait_for(lambda: (call, 401, None) in answers, 10, "the 401 answer", page=page)
    page.fill("#api-key", KEY)
    page.press("#api-key", "Enter")
    wait_for(lambda: (call, 200, f"Bearer {KEY}") in answers, 10, "the call with the key", page=page)
    wait_for(lambda: "error" not in (status.get_attribute("class") or ""), 10, "the error to clear")
    if path == "/":
        assert page.input_value("#model")
    else:
        wait_for(lambda: page.get_attribute("#v-running", "data-value") is not None, 10, "figures")
    stored = page.evaluate("() => JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage),"
                           " document.cookie, location.href])")
    assert KEY not in stored                       # the key lives in the page's memory only


# ---- small screens, keyboard, the page's arithmetic ------------------------------------------

@pytest.mark.parametrize("path", ["/", "/dashboard"])
def test_pages_fit_360_px_and_every_control_is_reachable_by_keyboard(server, browser, path):
    ctx = browser.new_context(viewport={"width": 360, "height": 740})
    page = ctx.new_page()
    try:
        page.goto(server.url + path)
        wait_for(lambda: "Ready" in page.inner_text("#status") or page.get_attribute("body", "data-polls"),
                 15, "the page to load its data")
        assert page.evaluate("document.documentElement.scrollWidth") <= 360
        controls = set(page.evaluate("""() => [...document.querySelectorAll('a,button:not([disabled]),input,select,textarea')]
                                        .map(e => e.id || e.textContent.trim())"""))
        reached = set()
        for _ in range(3 * len(controls) + 5):
            page.keyboard.press("Tab")
            reached.add(page.evaluate("() => document.activeElement.id || document.activeElement.textContent.trim()"))
        assert controls <= reached, controls - reached
    finally:
        ctx.close()


def prometheus_quantile(q: float, bounds: list[float], counts: list[int], count: int) -> float | None:
    """histogram_quantile as Prometheus computes it (cumulative buckets, +Inf -> last bound)."""
    if count == 0:
        return None
    rank = q * count
    for i, c in enumerate(counts):
        if c >= rank:
            lo, below = (0.0, 0) if i == 0 else (bounds[i - 1], counts[i - 1])
            return bounds[i] if c == below else lo + (bounds[i] - lo) * (rank - below) / (c - below)
    return bounds[-1]


def test_page_percentiles_are_prometheus_histogram_quantile(server, page):
    page.goto(server.url + "/dashboard")
    rng = random.Random(5)
    bounds = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5]
    for _ in range(50):
        per = [rng.choice([0, 0, 1, 3, 20]) for _ in range(len(bounds) + 1)]
        counts = [sum(per[:i + 1]) for i in range(len(bounds))]
        count = sum(per)
        for q in (0.5, 0.9, 0.99):
            got = page.evaluate("([q, b, c, n]) => Dash.histogramQuantile(q, b, c, n)", [q, bounds, counts, count])
            want = prometheus_quantile(q, bounds, counts, count)
            assert (got is None and want is None) or math.isclose(got, want, rel_tol=1e-12), (q, per)
