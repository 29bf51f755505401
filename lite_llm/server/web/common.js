// lite-llm web UI, shared by the playground and the dashboard: the API key (in this page's
// memory only: never stored, never in a URL) and one fetch wrapper that sends it and turns a
// 401 into a message on the page.
"use strict";

const LL = (() => {
  let apiKey = "";

  class HttpError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  function authHeaders(extra) {
    const h = Object.assign({}, extra || {});
    if (apiKey) h["Authorization"] = "Bearer " + apiKey;
    return h;
  }

  function showStatus(text, isError) {
    const el = document.getElementById("status");
    if (!el) return;
    el.textContent = text;
    el.classList.toggle("error", !!isError);
    el.setAttribute("role", isError ? "alert" : "status");
  }

  // The server's OpenAI-shaped error message, else the status line.
  async function errorText(resp) {
    try {
      const body = await resp.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (e) { /* not JSON */ }
    return resp.statusText || "request failed";
  }

  async function api(path, options) {
    const opts = Object.assign({cache: "no-store"}, options || {});
    opts.headers = authHeaders(opts.headers);
    const resp = await fetch(path, opts);
    if (resp.status === 401) {
      const msg = "401 Unauthorized: this server needs an API key. Type it into \"API key\" and press Use key.";
      showStatus(msg, true);
      throw new HttpError(401, msg);
    }
    if (!resp.ok) {
      const msg = resp.status + " " + (await errorText(resp));
      showStatus(msg, true);
      throw new HttpError(resp.status, msg);
    }
    return resp;
  }

  // The key field and its button: the key lives in this closure only.
  function bindKeyForm(onChange) {
    const form = document.getElementById("key-form");
    const input = document.getElementById("api-key");
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      apiKey = input.value.trim();
      showStatus(apiKey ? "Using the API key you typed." : "No API key: calls go without one.", false);
      if (onChange) onChange();
    });
  }

  function fmt(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    return Number(v).toFixed(digits === undefined ? 1 : digits);
  }

  return {api, bindKeyForm, showStatus, fmt, HttpError, hasKey: () => apiKey !== ""};
})();
