// The engine dashboard: polls /v1/engine/stats about once a second (with the key typed in)
// and charts the last minutes as hand-drawn SVG. Figures the server computed over its live
// window (token rates, per-thread busy, bandwidth) are shown as they come: /metrics exports
// the same window. Latency percentiles and windowed hit rates are computed here from the
// cumulative counters and histograms, as Prometheus' rate() and histogram_quantile() would.
"use strict";

const Dash = (() => {
  const POLL_MS = 1000;
  const HISTORY_S = 300;          // charts show the last 5 minutes
  const LATENCY_WINDOW_S = 30;    // percentiles and hit rates over the last 30 s
  // A planned core is idle when, while requests run, its thread got under a fifth of the busiest
  // engine thread's share (and under 1 % at all): relative, because on a shared machine other
  // processes cap what every thread gets, while a thread left without work gets nothing.
  const IDLE_SHARE = 0.2, IDLE_FLOOR = 0.01;
  const MAX_THREAD_LINES = 4;     // more threads: their min / mean / max instead of a line each
  const $ = (id) => document.getElementById(id);
  const history = [];             // [{t (s), s (snapshot)}], oldest first
  let paused = false, timer = null, last = null;

  // ---- arithmetic on the counters ------------------------------------------------------------

  // Prometheus' histogram_quantile over cumulative bucket counts (counts[i]: observations <=
  // bounds[i]; count: all of them). Linear inside a bucket; the +Inf bucket answers its lower bound.
  function histogramQuantile(q, bounds, counts, count) {
    if (!count) return null;
    const rank = q * count;
    let i = 0;
    while (i < counts.length && counts[i] < rank) i++;
    if (i === counts.length) return bounds[bounds.length - 1];
    const lo = i === 0 ? 0 : bounds[i - 1], below = i === 0 ? 0 : counts[i - 1];
    const inBucket = counts[i] - below;
    if (inBucket <= 0) return bounds[i];
    return lo + (bounds[i] - lo) * ((rank - below) / inBucket);
  }

  function histDelta(a, b) {   // b - a, bucket by bucket (b newer)
    if (!a) return b;
    return {bounds: b.bounds, counts: b.counts.map((c, i) => c - (a.counts[i] || 0)), count: b.count - a.count};
  }

  function snapshotAgo(seconds) {   // the oldest snapshot within `seconds` of the newest
    const now = history[history.length - 1].t;
    for (const h of history) if (now - h.t <= seconds) return h;
    return history[history.length - 1];
  }

  function quantiles(name) {
    const newest = history[history.length - 1].s.latency[name];
    const old = history.length > 1 ? snapshotAgo(LATENCY_WINDOW_S).s.latency[name] : null;
    const d = histDelta(old, newest);
    return [0.5, 0.9, 0.99].map((q) => histogramQuantile(q, d.bounds, d.counts, d.count));
  }

  // ---- drawing -----------------------------------------------------------------------------

  const SVGNS = "http://www.w3.org/2000/svg";
  function el(name, attrs, parent) {
    const e = document.createElementNS(SVGNS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (parent) parent.appendChild(e);
    return e;
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // series: [{name, values: [number|null per history entry]}]; unit for the axis label.
  function chart(containerId, title, series, unit, fixedMax) {
    const box = $(containerId);
    // drawn at the box's own pixel size (re-drawn every poll), so text is never stretched
    const W = Math.max(200, Math.round(box.clientWidth || 320)), H = 140, L = 34, R = 6, T = 8, B = 18;
    const now = history.length ? history[history.length - 1].t : 0;
    const all = series.flatMap((s) => s.values.filter((v) => v !== null && Number.isFinite(v)));
    const yMax = fixedMax || niceMax(Math.max(0, ...all));
    const x = (t) => L + (W - L - R) * (1 - (now - t) / HISTORY_S);
    const y = (v) => T + (H - T - B) * (1 - Math.min(v, yMax) / yMax);
    const svg = el("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img"});
    const latest = series.map((s) => {
      const v = s.values[s.values.length - 1];
      return `${s.name} ${v === null || v === undefined ? "none" : LL.fmt(v, 2)} ${unit}`;
    }).join(", ");
    el("title", {}, svg).textContent = `${title}, last ${HISTORY_S / 60} minutes; now: ${latest}`;
    el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis"}, svg);
    el("line", {x1: L, y1: T, x2: L, y2: H - B, class: "axis"}, svg);
    el("text", {x: L - 3, y: T + 8, "text-anchor": "end"}, svg).textContent = LL.fmt(yMax, yMax < 10 ? 1 : 0);
    el("text", {x: L - 3, y: H - B, "text-anchor": "end"}, svg).textContent = "0";
    el("text", {x: L, y: H - 4}, svg).textContent = `-${HISTORY_S / 60} min`;
    el("text", {x: W - R, y: H - 4, "text-anchor": "end"}, svg).textContent = `now (${unit})`;
    series.forEach((s, k) => {
      let d = "", pen = "M";
      s.values.forEach((v, i) => {
        if (v === null || !Number.isFinite(v)) { pen = "M"; return; }
        d += `${pen}${x(history[i].t).toFixed(1)},${y(v).toFixed(1)}`;
        pen = "L";
      });
      el("path", {d, class: `s${k + 1} d${k + 1}`, "data-series": s.name, "data-points": s.values.filter((v) => v !== null).length}, svg);
    });
    const legend = document.createElement("ul");
    legend.className = "legend";
    series.forEach((s, k) => {
      const li = document.createElement("li");
      const key = el("svg", {viewBox: "0 0 26 10", "aria-hidden": "true"});
      el("line", {x1: 0, y1: 5, x2: 26, y2: 5, class: `s${k + 1} d${k + 1}`, "stroke-width": 2}, key);
      li.append(key, document.createTextNode(s.name));
      legend.appendChild(li);
    });
    box.replaceChildren(svg, legend);
    box.dataset.updated = String(now);
  }

  // ---- the page ----------------------------------------------------------------------------

  function put(id, text, value) {
    const e = $(id);
    e.textContent = text;
    if (value === undefined || value === null) delete e.dataset.value;
    else e.dataset.value = String(value);
  }

  const ms = (v) => (v === null ? "–" : LL.fmt(v * 1000, v < 0.01 ? 1 : 0) + " ms");
  const series = (f) => history.map((h) => { const v = f(h.s); return v === undefined ? null : v; });

  function threadLabel(t, multi) { return (multi ? `r${t.engine} ` : "") + `thread ${t.thread}`; }

  function renderCores(s) {
    const live = s.live;
    const tbody = $("cores").querySelector("tbody");
    const rows = [];
    let idle = [];
    const threads = live ? live.threads : [];
    const multi = threads.some((t) => t.engine > 0);
    const busiest = Math.max(0, ...threads.map((t) => t.busy || 0));
    const idleBelow = Math.max(IDLE_FLOOR, IDLE_SHARE * busiest);
    for (const t of threads) {
      const tr = document.createElement("tr");
      const running = s.requests.running > 0;
      const gone = t.cpu_seconds_total === null;
      const isIdle = !gone && running && t.busy !== null && t.busy < idleBelow;
      if (isIdle) idle.push(t);
      tr.className = isIdle || gone ? "idle" : "";
      tr.dataset.thread = String(t.thread);
      tr.dataset.cpu = t.cpu === null ? "" : String(t.cpu);
      tr.dataset.busy = t.busy === null ? "" : String(t.busy);
      tr.dataset.state = gone ? "gone" : isIdle ? "idle" : t.busy === null ? "unknown" : "ok";
      const pct = t.busy === null ? null : t.busy * 100;
      const cells = [threadLabel(t, multi), t.cpu === null ? "not bound" : `CPU ${t.cpu}`,
                     t.last_cpu === null ? "–" : `CPU ${t.last_cpu}` + (t.cpu !== null && t.last_cpu !== t.cpu ? " (moved!)" : ""),
                     String(t.tid)];
      for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); }
      const busyTd = document.createElement("td");
      busyTd.className = "num";
      const bar = document.createElement("span"); bar.className = "bar"; bar.setAttribute("aria-hidden", "true");
      const fill = document.createElement("span"); fill.style.width = `${Math.max(0, Math.min(100, pct || 0))}%`;
      bar.appendChild(fill);
      busyTd.append(bar, document.createTextNode(" " + (pct === null ? "–" : LL.fmt(pct, 0) + " %")));
      tr.appendChild(busyTd);
      const state = document.createElement("td");
      state.textContent = gone ? "GONE: thread exited" : isIdle ? "IDLE while requests run" : t.busy === null ? "measuring" : "working";
      tr.appendChild(state);
      rows.push(tr);
    }
    tbody.replaceChildren(...rows);
    const summary = $("cores-summary");
    if (!live) summary.textContent = "No per-thread figures from this engine.";
    else if (idle.length) summary.textContent = `⚠ ${idle.length} of ${threads.length} planned cores IDLE while requests run: ` +
      idle.map((t) => (t.cpu === null ? threadLabel(t, multi) : `CPU ${t.cpu}`)).join(", ");
    else summary.textContent = `${threads.length} engine threads; none idle.`;
    summary.dataset.idle = String(idle.length);
    if (threads.length) {
      const lines = threads.length <= MAX_THREAD_LINES
        ? threads.map((t, k) => ({name: (t.cpu === null ? threadLabel(t, multi) : `CPU ${t.cpu}`) + " busy",
                                  values: series((x) => x.live && x.live.threads[k] && x.live.threads[k].busy !== null ? x.live.threads[k].busy * 100 : null)}))
        : [["min", Math.min], ["max", Math.max]].map(([n, f]) => ({name: `${n} busy`, values: series((x) => {
            const b = x.live ? x.live.threads.map((t) => t.busy).filter((v) => v !== null) : [];
            return b.length ? f(...b) * 100 : null; })}));
      chart("c-cores", "Busy per engine thread", lines, "%", 100);
    }
  }

  const gib = (b) => (b === null || b === undefined ? "–" : LL.fmt(b / 2 ** 30, 2) + " GiB");

  // The machine's memory, and each model's: loaded or not, what it holds, what its load planned.
  function renderMemory(s) {
    const mem = s.memory;
    if (!mem) return;
    const m = mem.machine;
    put("v-mem-machine", `Machine: ${gib(m.total_bytes)} total, ${gib(m.available_bytes)} available` +
        (m.cgroup_limit_bytes ? `, cgroup limit ${gib(m.cgroup_limit_bytes)}` : "") +
        (mem.models_memory_bytes ? `; models may hold ${gib(mem.models_memory_bytes)} (--models-memory)` : ""),
        m.available_bytes);
    const rows = mem.models.map((r) => {
      const tr = document.createElement("tr");
      tr.dataset.model = r.id;
      tr.dataset.status = r.status;
      const p = r.planned;
      const cells = [r.id, r.status, r.status === "loaded" ? gib(r.bytes) : "–",
                     p ? `${gib(p.total)} = ${gib(p.weights)} + ${gib(p.kv_cache)} + ${gib(p.activations)}` : "–"];
      for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); }
      return tr;
    });
    $("models").querySelector("tbody").replaceChildren(...rows);
  }

  function render() {
    const s = history[history.length - 1].s;
    put("f-model", s.models.join(", "));
    put("f-variant", s.kernel.variant || "–");
    put("f-threads", String(s.kernel.num_threads ?? "–"));
    put("f-plan", (s.kernel.thread_plan || []).join("; ") || "–");
    put("f-updated", new Date(s.time * 1000).toLocaleTimeString(), s.time);
    put("v-running", String(s.requests.running), s.requests.running);
    put("v-waiting", String(s.requests.waiting), s.requests.waiting);
    put("v-preempt", String(s.requests.preemptions_total), s.requests.preemptions_total);
    chart("c-req", "Requests", [{name: "running", values: series((x) => x.requests.running)},
                                {name: "waiting", values: series((x) => x.requests.waiting)}], "requests");
    const live = s.live;
    put("v-gen-rate", live ? LL.fmt(live.generation_tokens_per_second, 1) + " tok/s" : "–",
        live ? live.generation_tokens_per_second : null);
    put("v-prompt-rate", live ? LL.fmt(live.prompt_tokens_per_second, 1) + " tok/s" : "–",
        live ? live.prompt_tokens_per_second : null);
    put("v-window", live ? LL.fmt(live.window_seconds, 2) + " s" : "–", live ? live.time : null);
    chart("c-tok", "Tokens per second", [
      {name: "generation", values: series((x) => x.live ? x.live.generation_tokens_per_second : null)},
      {name: "prompt", values: series((x) => x.live ? x.live.prompt_tokens_per_second : null)}], "tok/s");
    const ttft = quantiles("ttft"), itl = quantiles("itl");
    put("v-ttft", ttft.map(ms).join(" / "), ttft[0]);
    put("v-itl", itl.map(ms).join(" / "), itl[0]);
    history[history.length - 1].q = {ttft, itl};
    chart("c-lat", "Latency", [
      {name: "TTFT p50", values: history.map((h) => (h.q ? h.q.ttft[0] : null))},
      {name: "TTFT p99", values: history.map((h) => (h.q ? h.q.ttft[2] : null))},
      {name: "ITL p50", values: history.map((h) => (h.q ? h.q.itl[0] : null))},
      {name: "ITL p99", values: history.map((h) => (h.q ? h.q.itl[2] : null))}], "s");
    const kv = s.kv_cache;
    put("v-kv-used", (kv.blocks_used === null ? "" : `${kv.blocks_used} of ${kv.blocks_total} blocks, `) +
        LL.fmt(kv.usage * 100, 1) + " %", kv.usage);
    put("v-kv-free", kv.blocks_free === null ? "–" : String(kv.blocks_free), kv.blocks_free);
    const old = snapshotAgo(LATENCY_WINDOW_S).s.kv_cache;
    const dq = kv.prefix_cache_queries_total - old.prefix_cache_queries_total;
    const recentHit = dq > 0 ? (kv.prefix_cache_hits_total - old.prefix_cache_hits_total) / dq : null;
    const allHit = kv.prefix_cache_queries_total ? kv.prefix_cache_hits_total / kv.prefix_cache_queries_total : null;
    put("v-prefix", (recentHit === null ? "–" : LL.fmt(recentHit * 100, 1) + " %") + " / " +
        (allHit === null ? "–" : LL.fmt(allHit * 100, 1) + " %"), recentHit);
    chart("c-kv", "KV cache", [{name: "used %", values: series((x) => x.kv_cache.usage * 100)}], "%", 100);
    const bw = s.bandwidth;
    put("v-bw", bw.decode_bytes_per_second === null ? "–" : LL.fmt(bw.decode_bytes_per_second / 1e9, 2) + " GB/s",
        bw.decode_bytes_per_second);
    put("v-bw-max", bw.measured_bytes_per_second === null ? "–" : LL.fmt(bw.measured_bytes_per_second / 1e9, 1) + " GB/s",
        bw.measured_bytes_per_second);
    put("v-roofline", bw.roofline_ratio === null ? "–" : LL.fmt(bw.roofline_ratio * 100, 0) + " %", bw.roofline_ratio);
    chart("c-bw", "Decode bandwidth", [
      {name: "achieved", values: series((x) => (x.bandwidth.decode_bytes_per_second === null ? null : x.bandwidth.decode_bytes_per_second / 1e9))},
      {name: "measured", values: series((x) => (x.bandwidth.measured_bytes_per_second === null ? null : x.bandwidth.measured_bytes_per_second / 1e9))}],
      "GB/s");
    renderCores(s);
    renderMemory(s);
    document.body.dataset.polls = String(history.length);
    document.body.dataset.statsTime = live ? String(live.time) : "";
  }

  // One snapshot in (from the server or, in tests, given directly).
  function ingest(snapshot) {
    if (!snapshot.engine_alive) { LL.showStatus("The engine is not running.", true); return; }
    const t = snapshot.time;
    history.push({t, s: snapshot});
    while (history.length && t - history[0].t > HISTORY_S) history.shift();
    last = snapshot;
    render();
  }

  async function poll() {
    timer = null;
    if (paused) return;
    try {
      const resp = await LL.api("/v1/engine/stats");
      ingest(await resp.json());
      const st = $("status");
      if (st.classList.contains("error")) LL.showStatus("Connected.", false);
    } catch (e) {
      if (!(e instanceof LL.HttpError)) LL.showStatus("Could not reach the server: " + e.message, true);
    }
    if (!paused) timer = setTimeout(poll, POLL_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    LL.bindKeyForm(() => { if (timer) clearTimeout(timer); poll(); });
    $("pause").addEventListener("click", () => {
      paused = !paused;
      $("pause").setAttribute("aria-pressed", String(paused));
      $("pause").textContent = paused ? "Resume" : "Pause";
      if (!paused && !timer) poll();
    });
    poll();
  });

  return {histogramQuantile, ingest, history, last: () => last, IDLE_SHARE, IDLE_FLOOR};
})();
