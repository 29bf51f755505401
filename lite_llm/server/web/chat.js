// The chat playground: streams answers from this server's own /v1/chat/completions.
// The conversation stays in this browser tab (sessionStorage); the API key does not (LL).
// Stop aborts the fetch: the server sees the client go and aborts the request, freeing its
// KV blocks.
"use strict";

(() => {
  const STORE = "lite_llm.chat.v1";
  const $ = (id) => document.getElementById(id);
  let conversation = [];      // [{role, content, meta?}]
  let controller = null;      // AbortController of the answer being streamed

  function save() {
    try { sessionStorage.setItem(STORE, JSON.stringify(conversation)); } catch (e) { /* private mode */ }
  }

  function load() {
    try { conversation = JSON.parse(sessionStorage.getItem(STORE) || "[]"); } catch (e) { conversation = []; }
    if (!Array.isArray(conversation)) conversation = [];
  }

  function metaText(m) {
    if (!m) return "";
    const parts = [];
    if (m.prompt_tokens !== undefined) parts.push(m.prompt_tokens + " prompt tokens");
    parts.push((m.counted ? "~" : "") + m.completion_tokens + " tokens" + (m.counted ? " (counted from the stream)" : ""));
    if (m.tok_s !== null && m.tok_s !== undefined) parts.push(LL.fmt(m.tok_s, 1) + " tok/s");
    if (m.ttft !== null && m.ttft !== undefined) parts.push("first token " + LL.fmt(m.ttft * 1000, 0) + " ms");
    if (m.finish) parts.push(m.finish === "stopped" ? "stopped by you" : "finish: " + m.finish);
    return parts.join(" · ");
  }

  function renderMessage(msg, index) {
    const li = document.createElement("li");
    li.className = "msg " + msg.role;
    li.dataset.index = String(index);
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = msg.role === "user" ? "You" : "Assistant";
    const text = document.createElement("div");
    text.className = "text";
    text.textContent = msg.content;
    li.append(who, text);
    if (msg.role === "assistant") {
      const meta = document.createElement("div");
      meta.className = "meta";
      meta.textContent = metaText(msg.meta);
      li.append(meta);
    }
    return li;
  }

  function renderAll() {
    const list = $("messages");
    list.replaceChildren(...conversation.map(renderMessage));
  }

  async function loadModels() {
    const select = $("model");
    try {
      const resp = await LL.api("/v1/models");
      const body = await resp.json();
      const previous = select.value;
      select.replaceChildren(...body.data.map((m) => {
        const o = document.createElement("option");
        o.value = m.id; o.textContent = m.id;
        return o;
      }));
      if (previous && body.data.some((m) => m.id === previous)) select.value = previous;
      LL.showStatus("Ready: " + body.data.length + " model" + (body.data.length === 1 ? "" : "s") + " served.", false);
    } catch (e) {
      if (!(e instanceof LL.HttpError)) LL.showStatus("Could not reach the server: " + e.message, true);
    }
  }

  function numberOf(id, fallback) {
    const v = parseFloat($(id).value);
    return Number.isFinite(v) ? v : fallback;
  }

  function setStreaming(on) {
    $("send").disabled = on;
    $("stop").disabled = !on;
    document.body.dataset.streaming = on ? "1" : "0";
  }

  // Read an SSE body: `data: {chunk}` events separated by blank lines, then `data: [DONE]`.
  async function* sseEvents(resp) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (line.startsWith("data: ")) yield line.slice(6);
        }
      }
    }
  }

  async function send(text) {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({role: "system", content: system});
    conversation.push({role: "user", content: text});
    for (const m of conversation) messages.push({role: m.role, content: m.content});
    const answer = {role: "assistant", content: "", meta: {completion_tokens: 0, counted: true, tok_s: null, ttft: null}};
    conversation.push(answer);
    renderAll();
    save();
    const li = $("messages").lastElementChild;
    const textEl = li.querySelector(".text"), metaEl = li.querySelector(".meta");
    li.dataset.state = "streaming";
    const body = {
      model: $("model").value || undefined, messages, stream: true,
      stream_options: {include_usage: true},
      temperature: numberOf("temperature", undefined), top_p: numberOf("top-p", undefined),
      max_tokens: Math.max(1, Math.round(numberOf("max-tokens", 512))),
    };
    controller = new AbortController();
    setStreaming(true);
    const started = performance.now();
    let first = null, last = null, chunks = 0, usage = null, finish = null;
    try {
      const resp = await LL.api("/v1/chat/completions", {
        method: "POST", headers: {"Content-Type": "application/json"},
        body: JSON.stringify(body), signal: controller.signal,
      });
      LL.showStatus("Streaming the answer…", false);
      for await (const data of sseEvents(resp)) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "stream error");
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        if (choice.delta && choice.delta.content) {
          const now = performance.now();
          if (first === null) first = now;
          last = now;
          chunks += 1;
          answer.content += choice.delta.content;
          textEl.textContent = answer.content;
          answer.meta = {completion_tokens: chunks, counted: true,
                         tok_s: chunks > 1 ? (chunks - 1) / ((last - first) / 1000) : null,
                         ttft: (first - started) / 1000};
          metaEl.textContent = metaText(answer.meta);
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      LL.showStatus("Done.", false);
    } catch (e) {
      if (e.name === "AbortError") {
        finish = "stopped";
        LL.showStatus("Stopped: the server aborted the request.", false);
      } else if (!(e instanceof LL.HttpError)) {
        LL.showStatus("The answer failed: " + e.message, true);
      }
      if (e instanceof LL.HttpError && answer.content === "") {
        conversation.pop();   // nothing came back: keep the question, drop the empty answer
        li.remove();
      }
    } finally {
      controller = null;
      setStreaming(false);
    }
    if (usage) {
      const n = usage.completion_tokens;
      answer.meta = {prompt_tokens: usage.prompt_tokens, completion_tokens: n, counted: false,
                     tok_s: first !== null && last > first && n > 1 ? (n - 1) / ((last - first) / 1000) : null,
                     ttft: first === null ? null : (first - started) / 1000};
    }
    if (answer.meta) answer.meta.finish = finish;
    if (li.isConnected) {
      metaEl.textContent = metaText(answer.meta);
      li.dataset.state = finish || "done";
    }
    save();
  }

  function submit() {
    const text = $("prompt").value.trim();
    if (!text || controller) return;
    $("prompt").value = "";
    send(text);
  }

  document.addEventListener("DOMContentLoaded", () => {
    load();
    renderAll();
    LL.bindKeyForm(loadModels);
    $("composer").addEventListener("submit", (ev) => { ev.preventDefault(); submit(); });
    $("prompt").addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); submit(); }
    });
    $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
    $("clear").addEventListener("click", () => { conversation = []; save(); renderAll(); });
    setStreaming(false);
    loadModels();
  });
})();
