"""Ollama's native API on the chat machinery: /api/chat, /api/generate, /api/embed (and the older
/api/embeddings), /api/tags, /api/show, /api/ps, /api/version and /api/pull, so tools that speak
Ollama (its Python and JS clients, Open WebUI, Continue) talk to `serve` unchanged.

A chat or generate body becomes a chat completions body (or, for generate's raw mode, a completions
body): `options` -> the sampling fields, `format` -> response_format, `think` -> the chat template's
enable_thinking, `images` -> image parts, Ollama's tool calls (arguments as an object) -> chat
tool calls; openai.prepare_chat / prepare_completion validate, render and tokenize it and
generation.run_prepared runs it, as any chat request. The deltas come back as Ollama's NDJSON
lines (stream defaults to true), or, with "stream": false, one object: message / response,
thinking, tool_calls, done, done_reason and the counts and durations (ns) of the final line.
Errors have Ollama's shape {"error": "..."} (error_body): 400 for bad input, 404 for a model
this server does not serve; a failure mid-stream is an {"error"} line.

The model a request names is looked up in served_model alone.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import threading
import time
from datetime import datetime, timezone
from typing import Any, Iterator

from lite_llm import __version__
from lite_llm.model.pooler import PoolingInputError
from lite_llm.server import generation, openai, pooling
from lite_llm.server.context import PreparedRequest, ServingContext
from lite_llm.server.routing import Request, Response, ServerState
from lite_llm.server.validation import ApiError, bad, get_bool, get_float, get_int, is_num

NDJSON = "application/x-ndjson"
# `options` read here: temperature, top_p, top_k, min_p, seed, num_predict, stop, repeat_penalty,
# presence_penalty, frequency_penalty, num_ctx. Any other option (runner and llama.cpp settings,
# mirostat, typical_p, a name Ollama does not know) is ignored, as Ollama ignores unknown ones.
_THINK_LEVELS = ("low", "medium", "high")
_DURATION = re.compile(r"^-?(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$|^-?\d+$")
_DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}
MAX_NAME_CHARS = 256
_SENT_VALUE = re.compile(r", got .{1,40}$", re.DOTALL)     # validation's echo of a refused value (show())


def error_body(e: ApiError) -> dict:
    """Ollama's error shape for an ApiError: the field and the limit, never the value sent."""
    return {"error": _SENT_VALUE.sub("", e.message)}


def _now() -> str:
    """created_at: RFC 3339 in UTC."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def _line(value: dict) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


# ---- the served model a request names ---------------------------------------------------------------

def served_model(state: ServerState, name: Any) -> str:
    """The served model (or loaded LoRA adapter) an Ollama request names, as /v1/models lists it;
    Ollama's default tag is accepted (`tiny:latest` for `tiny`). A 404 for any other name."""
    if not isinstance(name, str) or not name:
        raise bad("model is required")
    ctx = state.ctx
    names = list(state.pool.entries) if state.pool is not None else list(ctx.model_names)
    for candidate in (name, name.removesuffix(":latest")):
        if candidate in names or (ctx.loras is not None and candidate in ctx.loras):
            return candidate
    raise ApiError(404, f"model not found: this server serves {', '.join(repr(n) for n in names)} "
                        "(GET /api/tags lists them)", "model", code="model_not_found")


# ---- request fields -> a chat completions body ----------------------------------------------------

def _keep_alive(body: dict) -> None:
    """keep_alive: a duration ("5m", "1h30m", "-1") or seconds; accepted (the model stays loaded)."""
    value = body.get("keep_alive")
    if value is None or is_num(value) or (isinstance(value, str) and len(value) <= 32 and _DURATION.match(value)):
        return
    raise bad("keep_alive must be a duration such as \"5m\" or a number of seconds", "keep_alive")


def _options(body: dict, ctx: ServingContext) -> tuple[dict, ServingContext]:
    """options -> (chat sampling fields, the context to prepare against: num_ctx narrows the
    context window; more than the model's maximum is that maximum)."""
    opts = body.get("options")
    if opts is None:
        return {}, ctx
    if not isinstance(opts, dict):
        raise bad("options must be an object", "options")
    out: dict[str, Any] = {}
    for name in ("temperature", "min_p", "presence_penalty", "frequency_penalty"):
        lo, hi = (-2.0, 2.0) if name.endswith("_penalty") else (0.0, 1e6 if name == "temperature" else 1.0)
        value = get_float(opts, name, lo, hi)
        if value is not None:
            out[name] = value
    top_p = get_float(opts, "top_p", 0.0, 1.0, lo_open=True)
    if top_p is not None:
        out["top_p"] = top_p
    top_k = get_int(opts, "top_k", -1, 2 ** 31 - 1)
    if top_k is not None:
        out["top_k"] = max(top_k, 0) or -1      # Ollama: 0 or less turns top_k off
    repeat = get_float(opts, "repeat_penalty", 0.0, 1e6, lo_open=True)
    if repeat is not None:
        out["repetition_penalty"] = repeat
    seed = get_int(opts, "seed", -(2 ** 63), 2 ** 63 - 1)
    if seed is not None and seed != -1:         # -1: a random seed, as no seed
        out["seed"] = seed
    num_predict = get_int(opts, "num_predict", -2, 2 ** 31 - 1)
    if num_predict is not None and num_predict > 0:     # -1 (no limit) and -2 (fill the context): the room left
        out["max_tokens"] = num_predict
    elif num_predict == 0:
        raise bad("options.num_predict must be positive, or -1 for no limit", "options.num_predict")
    stop = opts.get("stop")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise bad("options.stop must be a list of strings", "options.stop")
        if any(stop):
            out["stop"] = [s for s in stop if s]
    num_ctx = get_int(opts, "num_ctx", 1, 2 ** 31 - 1)
    if num_ctx is not None:
        # more than the server holds is capped to it, as Ollama caps it to the model's own length
        # (clients such as Continue send their own num_ctx whatever the server's length)
        ctx = dataclasses.replace(ctx, max_model_len=min(num_ctx, ctx.max_model_len))
    return out, ctx


def _format(body: dict) -> dict | None:
    """format: "json" -> a JSON object; a JSON schema -> that schema (the structured-output engine)."""
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise bad("format must be \"json\" or a JSON schema object", "format")


def _think(body: dict, ctx: ServingContext) -> dict:
    """think -> the chat template's variables: true / false turn thinking on / off (Qwen3's
    enable_thinking); "low" | "medium" | "high" are gpt-oss's reasoning efforts."""
    think = body.get("think")
    if think is None:
        return {}
    if think is not False and ctx.reasoning_parser is None:
        raise bad("this model does not support thinking: the server splits thinking from the answer only with "
                  "--reasoning-parser", "think")
    if isinstance(think, bool):
        return {"enable_thinking": think}
    if think in _THINK_LEVELS:
        return {"enable_thinking": True, "reasoning_effort": think}
    raise bad("think must be true, false, \"low\", \"medium\" or \"high\"", "think")


def _images(value: Any, where: str) -> list[dict]:
    """Ollama's images (base64 strings) -> chat image parts (the chat machinery decodes them
    for a model that takes images, and refuses them for one that does not)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise bad(f"{where}.images must be a list of base64-encoded images", f"{where}.images")
    return [{"type": "image_url", "image_url": {"url": "data:image/*;base64," + v}} for v in value]


def _user_content(text: str, images: list[dict]) -> str | list[dict]:
    return [{"type": "text", "text": text}, *images] if images else text


def _messages(value: Any) -> list[dict]:
    """Ollama's messages -> chat messages."""
    if not isinstance(value, list):
        raise bad("messages must be a list", "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise bad(f"{where} must be {{\"role\": \"system\" | \"user\" | \"assistant\" | \"tool\", "
                      "\"content\": ...}", where)
        content = m.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad(f"{where}.content must be a string", f"{where}.content")
        images = _images(m.get("images"), where)
        if images and m["role"] != "user":
            raise bad(f"{where}: images go in user messages", f"{where}.images")
        msg: dict[str, Any] = {"role": m["role"], "content": _user_content(content, images)}
        calls = m.get("tool_calls")
        if calls is not None:
            if m["role"] != "assistant" or not isinstance(calls, list):
                raise bad(f"{where}.tool_calls must be a list, in an assistant message", f"{where}.tool_calls")
            chat_calls = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                        or not isinstance(fn.get("arguments", {}), dict):
                    raise bad(f"{where}.tool_calls[{j}] must be {{\"function\": {{\"name\": str, \"arguments\": "
                              "object}}", f"{where}.tool_calls")
                chat_calls.append({"id": c.get("id") if isinstance(c.get("id"), str) else f"call_{i}_{j}",
                                   "type": "function",
                                   "function": {"name": fn["name"], "arguments": fn.get("arguments", {})}})
            if chat_calls:
                msg["tool_calls"] = chat_calls
        thinking = m.get("thinking")
        if thinking is not None:
            if not isinstance(thinking, str):
                raise bad(f"{where}.thinking must be a string", f"{where}.thinking")
            if m["role"] == "assistant" and thinking:
                msg["reasoning_content"] = thinking
        if m["role"] == "tool":
            for key, chat_key in (("tool_name", "name"), ("tool_call_id", "tool_call_id")):
                if m.get(key) is not None:
                    if not isinstance(m[key], str):
                        raise bad(f"{where}.{key} must be a string", f"{where}.{key}")
                    msg[chat_key] = m[key]
        out.append(msg)
    return out


def _tools(body: dict) -> list | None:
    """tools: OpenAI's function tools, as Ollama takes them (the chat machinery checks each)."""
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad("tools must be a list", "tools")
    return [{k: v for k, v in t.items() if v is not None} if isinstance(t, dict) else t for t in tools]


def _prepare(chat: dict, ctx: ServingContext, raw: bool) -> PreparedRequest:
    """The chat (or completions) body prepared, streamed internally with usage: an Ollama answer
    is built from the chunks either way (its last line needs the counts and timings)."""
    if raw:
        prep = openai.prepare_completion(chat, ctx)
        if "max_tokens" not in chat:        # Ollama's num_predict -1: the room the prompt leaves
            room = openai.max_tokens_for(None, len(prep.prompts[0].token_ids), ctx, default=None)
            prep = dataclasses.replace(prep, params=prep.params.replace(max_tokens=room))
    else:
        prep = openai.prepare_chat(chat, ctx)
    return dataclasses.replace(prep, stream=True, include_usage=True)


# ---- the answer -------------------------------------------------------------------------------

class _Answer:
    """generation.run_prepared's api for one Ollama request: NDJSON lines (stream), or the one
    object of a whole answer (`whole`: an error is raised, not written)."""

    def __init__(self, kind: str, model: str, whole: bool, started: int):
        self.kind, self.model, self.whole, self.started = kind, model, whole, started   # kind: chat | generate

    def answer(self, prep: PreparedRequest, chat: dict) -> dict:   # never used: prepared requests stream
        raise NotImplementedError

    def _piece(self, text: str, thinking: str, calls: list[dict] | None) -> dict:
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            return {"model": self.model, "created_at": _now(), "message": message}
        piece = {"model": self.model, "created_at": _now(), "response": text}
        if thinking:
            piece["thinking"] = thinking
        return piece

    def stream(self, prep: PreparedRequest, items: Iterator[Any]) -> Iterator[bytes]:
        first_token = None
        done_reason, counts = "stop", (sum(len(p.token_ids) for p in prep.prompts), 0)
        text, thinking, calls = [], [], []
        for item in items:
            if isinstance(item, ApiError):
                if self.whole:
                    raise item
                yield _line(error_body(item))
                return
            if item.get("usage"):
                counts = (item["usage"]["prompt_tokens"], item["usage"]["completion_tokens"])
            for choice in item["choices"]:
                delta = choice.get("delta") or {}
                piece_text = delta.get("content") or choice.get("text") or ""
                piece_thinking = delta.get("reasoning_content") or ""
                piece_calls = [_tool_call(c) for c in delta.get("tool_calls") or []]
                if choice.get("finish_reason"):
                    done_reason = _DONE_REASONS.get(choice["finish_reason"], choice["finish_reason"])
                if not (piece_text or piece_thinking or piece_calls):
                    continue
                if first_token is None:
                    first_token = time.monotonic_ns()
                if self.whole:
                    text.append(piece_text)
                    thinking.append(piece_thinking)
                    calls += piece_calls
                else:
                    yield _line({**self._piece(piece_text, piece_thinking, piece_calls), "done": False})
        end = time.monotonic_ns()
        first_token = first_token or end
        final = self._piece("".join(text), "".join(thinking), calls) if self.whole else self._piece("", "", None)
        final.update({"done": True, "done_reason": done_reason, "total_duration": end - self.started,
                      "load_duration": 0, "prompt_eval_count": counts[0],
                      "prompt_eval_duration": first_token - self.started, "eval_count": counts[1],
                      "eval_duration": end - first_token})
        yield (json.dumps(final, ensure_ascii=False, separators=(",", ":")).encode("utf-8") if self.whole
               else _line(final))


def _tool_call(call: dict) -> dict:
    """An OpenAI tool call -> Ollama's: its arguments as an object."""
    fn = call["function"]
    try:
        args = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
    except (ValueError, RecursionError):
        args = {}
    return {"function": {"name": fn["name"], "arguments": args if isinstance(args, dict) else {}}}


def _run(req: Request, state: ServerState, prep: PreparedRequest, kind: str, model: str, stream: bool,
         started: int) -> Response:
    """Run prep; NDJSON lines, or the lines' one object as a JSON body."""
    response = generation.run_prepared(req, state, prep, _Answer(kind, model, not stream, started))
    if stream:
        response.content_type = NDJSON
        return response
    try:
        body = b"".join(response.stream)
    except BaseException:
        response.stream.close()
        response.close()
        raise
    return Response(200, body, "application/json", close=response.close, tokens=response.tokens)


def _loaded(model: str, kind: str) -> Response:
    """An empty chat or prompt: Ollama's answer that the model is loaded (done_reason "load")."""
    body: dict[str, Any] = {"model": model, "created_at": _now()}
    body.update({"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""})
    return Response.json({**body, "done": True, "done_reason": "load"})


# ---- routes -----------------------------------------------------------------------------------

def _begin(req: Request, state: ServerState) -> tuple[int, dict, str, bool]:
    """(start time in ns, body, served model, stream) of a chat or generate request."""
    started = time.monotonic_ns()
    state.check_serving()
    body = req.json()
    model = served_model(state, body.get("model"))
    pooling.refuse_generation(state.engine)
    _keep_alive(body)
    return started, body, model, get_bool(body, "stream", True)


def chat(req: Request, state: ServerState) -> Response:
    """POST /api/chat."""
    started, body, model, stream = _begin(req, state)
    sampling, ctx = _options(body, state.ctx)
    messages = _messages(body.get("messages") or [])
    if not messages:
        return _loaded(model, "chat")
    _no_logprobs(body)
    chat_body: dict[str, Any] = {"model": model, "messages": messages, **sampling}
    for key, value in (("tools", _tools(body)), ("response_format", _format(body)),
                       ("chat_template_kwargs", _think(body, ctx) or None)):
        if value is not None:
            chat_body[key] = value
    prep = _prepare(chat_body, ctx, raw=False)
    return _run(req, state, prep, "chat", model, stream, started)


def generate(req: Request, state: ServerState) -> Response:
    """POST /api/generate: the prompt as one user turn of the chat template (after `system`),
    or, with raw, the prompt as it is (a text completion)."""
    started, body, model, stream = _begin(req, state)
    raw = get_bool(body, "raw", False)
    sampling, ctx = _options(body, state.ctx)
    prompt, system = body.get("prompt") or "", body.get("system")
    if not isinstance(prompt, str):
        raise bad("prompt must be a string", "prompt")
    if system is not None and not isinstance(system, str):
        raise bad("system must be a string", "system")
    for name, what in (("suffix", "fill-in-the-middle (suffix)"), ("template", "a request's own template"),
                       ("context", "context (deprecated by Ollama; send /api/chat messages)")):
        if body.get(name) not in (None, "", []):
            raise bad(f"{what} is not supported by this server", name)
    _no_logprobs(body)
    images = _images(body.get("images"), "request")
    if not prompt and not images:
        return _loaded(model, "generate")
    fields: dict[str, Any] = {"model": model, **sampling}
    fmt = _format(body)
    if fmt is not None:
        fields["response_format"] = fmt
    if raw:
        if images or system:
            raise bad("raw prompts take no images or system message", "raw")
        if body.get("think") is not None:
            raise bad("think needs the chat template: it cannot be combined with raw", "think")
        prep = _prepare({**fields, "prompt": prompt}, ctx, raw=True)
    else:
        messages = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": _user_content(prompt, images)}]
        kwargs = _think(body, ctx)
        prep = _prepare({**fields, "messages": messages, **({"chat_template_kwargs": kwargs} if kwargs else {})},
                        ctx, raw=False)
    return _run(req, state, prep, "generate", model, stream, started)


def _no_logprobs(body: dict) -> None:
    if body.get("logprobs") or body.get("top_logprobs"):
        raise bad("logprobs are not supported on Ollama's API here: use /v1/chat/completions", "logprobs")


def embed(req: Request, state: ServerState) -> Response:
    """POST /api/embed: {"embeddings": one row per input}, L2-normalized as the pooling model's
    /v1/embeddings rows; truncate (default true) cuts inputs to the context window."""
    started = time.monotonic_ns()
    body = req.json()
    model = served_model(state, body.get("model"))
    _keep_alive(body)
    inputs = body.get("input")
    if inputs is None or inputs == []:
        return Response.json({"model": model, "embeddings": []})
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not all(isinstance(t, str) and t for t in inputs):
        raise bad("input must be a non-empty string or a list of non-empty strings", "input")
    fields: dict[str, Any] = {"input": inputs}
    if get_bool(body, "truncate", True):
        fields["truncate_prompt_tokens"] = -1
    dims = get_int(body, "dimensions", 1, 2 ** 31 - 1)
    if dims is not None:
        fields["dimensions"] = dims
    rows, tokens = _pool(state, fields)
    return Response.json({"model": model, "embeddings": rows, "total_duration": time.monotonic_ns() - started,
                          "load_duration": 0, "prompt_eval_count": tokens}, tokens=(tokens, 0))


def embeddings(req: Request, state: ServerState) -> Response:
    """POST /api/embeddings (Ollama's older route): {"embedding": the prompt's row}."""
    body = req.json()
    served_model(state, body.get("model"))
    _keep_alive(body)
    prompt = body.get("prompt")
    if prompt is None or prompt == "":
        return Response.json({"embedding": []})
    if not isinstance(prompt, str):
        raise bad("prompt must be a string", "prompt")
    rows, tokens = _pool(state, {"input": [prompt]})
    return Response.json({"embedding": rows[0]}, tokens=(tokens, 0))


def _pool(state: ServerState, fields: dict) -> tuple[list[list[float]], int]:
    """The /v1/embeddings answer's rows for fields (an OpenAI embeddings body) and its prompt tokens."""
    state.check_serving()
    if not pooling.is_pooling(state.engine):
        raise bad("this model does not support embeddings: serve an embedding model (--runner pooling)", "model")
    with state.inflight():
        try:
            answer, tokens = pooling.embeddings_answer(fields, state.engine, state.ctx)
        except PoolingInputError as e:
            raise bad(str(e), "input") from None
    return [d["embedding"] for d in answer["data"]], tokens


# ---- the model's facts: tags, show, ps, version ------------------------------------------------------

_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def _details(state: ServerState) -> dict:
    """Ollama's details: family as Ollama spells it (LlamaForCausalLM -> llama), the quant tag of a
    GGUF file's name (Q4_K_M), else the weights' dtype (BF16)."""
    from lite_llm.model.hub import quant_of
    info = state.kernel_info
    path = str(info.get("model_path") or "")
    gguf = path.lower().endswith(".gguf")
    arch = re.sub(r"For(CausalLM|ConditionalGeneration|MaskedLM|SequenceClassification)$|Model$", "",
                  str(info.get("architecture") or "")).lower()
    dtype = str(info.get("dtype") or "")
    return {"parent_model": "", "format": "gguf" if gguf else "safetensors", "family": arch,
            "families": [arch] if arch else None, "parameter_size": "",
            "quantization_level": (quant_of(path) if gguf else None) or _DTYPES.get(dtype, dtype.upper())}


def _digest(state: ServerState, name: str) -> str:
    return hashlib.sha256(f"{name}|{state.ctx.system_fingerprint}".encode()).hexdigest()


def _served(state: ServerState) -> list[tuple[str, ServerState | None, dict]]:
    """(name, its state while loaded else None, its /v1/models card of a server of several
    models) of every served model: loaded or not, in the order they were given."""
    pool = state.pool
    if pool is None:
        return [(name, state, {}) for name in state.ctx.model_names]
    return [(card["id"], pool.loaded_state(card["id"]), card) for card in pool.cards()]


def _size(model: ServerState | None, card: dict, kv: bool) -> int:
    if model is None:      # not loaded: its planned weights
        return int(((card.get("memory") or {}).get("planned") or {}).get("weights", 0) or 0)
    info = model.kernel_info
    return int(info.get("weight_bytes") or 0) + (int(info.get("kv_cache_bytes") or 0) if kv else 0)


def tags(req: Request, state: ServerState) -> Response:
    """GET /api/tags: the served models (with several, loaded or not)."""
    return Response.json({"models": [
        {"name": name, "model": name, "modified_at": _rfc3339(state.started), "size": _size(model, card, False),
         "digest": _digest(state, name), "details": _details(model) if model is not None else {}}
        for name, model, card in _served(state)]})


def ps(req: Request, state: ServerState) -> Response:
    """GET /api/ps: the loaded models, each with when it unloads (a server of one model keeps it)."""
    out = []
    for name, model, card in _served(state):
        if model is None:
            continue
        left = card.get("expires_in", math.inf) if card else math.inf
        expires = "9999-12-31T23:59:59Z" if left is None or left == math.inf else _rfc3339(time.time() + left)
        out.append({"name": name, "model": name, "size": _size(model, card, True), "digest": _digest(state, name),
                    "details": _details(model), "expires_at": expires, "size_vram": 0,
                    "context_length": model.ctx.max_model_len})
    return Response.json({"models": out})


def show(req: Request, state: ServerState) -> Response:
    """POST /api/show: details, capabilities and the chat template of a served model."""
    body = req.json()
    name = served_model(state, body.get("model", body.get("name")))
    ctx = state.ctx
    caps = ["embedding"] if pooling.is_pooling(state.engine) else ["completion"]
    if caps == ["completion"]:
        caps += (["tools"] if ctx.tool_parser_of() else []) + (["thinking"] if ctx.reasoning_parser else []) \
            + (["vision"] if ctx.mm_processor is not None else [])
    details = _details(state)
    arch = details["family"] or "model"
    template = ctx.chat_template or getattr(ctx.tokenizer, "chat_template", None) or ""
    return Response.json({
        "license": "", "modelfile": f"# served by lite-llm {__version__}\nFROM {name}\n", "parameters": "",
        "template": template if isinstance(template, str) else "", "details": details,
        "model_info": {"general.architecture": arch, "general.basename": name,
                       f"{arch}.context_length": ctx.max_model_len},
        "capabilities": caps, "modified_at": _rfc3339(state.started)})


def version(req: Request, state: ServerState) -> Response:
    """GET /api/version: this server's version."""
    return Response.json({"version": __version__})


# ---- pull ---------------------------------------------------------------------------------------------

def pull(req: Request, state: ServerState) -> Response:
    """POST /api/pull: a Hugging Face model name (org/name, org/name:QUANT) fetched into the local
    Hub cache through model/hub.py, with Ollama's progress lines; a name already served is there.
    The model is served from the cache by a server started with its name."""
    from lite_llm.model import hub
    body = req.json()
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name:
        raise bad("model is required", "model")
    if get_bool(body, "insecure", False):
        raise bad("insecure pulls are not supported", "insecure")
    stream = get_bool(body, "stream", True)
    try:
        served = bool(served_model(state, name))
    except ApiError:
        served = False
    ref = None if served else hub.parse_name(name) if len(name) <= MAX_NAME_CHARS else None
    if not served and ref is None:
        raise bad("pull takes a Hugging Face model name (org/name or org/name:QUANT, as `lite-llm pull`); "
                  "Ollama's library names are not pulled", "model")
    lines = _pull_lines(ref, stream)
    if not stream:
        return Response(200, b"".join(lines), "application/json")
    response = Response.events(lines)
    response.content_type = NDJSON
    return response


def _pull_lines(ref: Any, stream: bool) -> Iterator[bytes]:
    """The progress lines of a pull (a status line every few seconds while files download);
    not streamed: the last one alone, or an error."""
    from lite_llm.model import hub
    if stream:
        yield _line({"status": "pulling manifest"})
    if ref is not None:
        done: dict[str, Any] = {}

        def fetch() -> None:
            try:
                done["model"] = hub.resolve(ref, verify=True)
            except hub.HubError as e:      # where the server's cache sits is not the client's business
                done["error"] = str(e).replace(hub.cache_dir(), "the server's Hugging Face cache")
            except Exception as e:      # a failure of the fetch itself, told in one line
                done["error"] = f"{ref}: the pull failed ({type(e).__name__})"
        worker = threading.Thread(target=fetch, name="ollama-pull", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(5.0)
            if worker.is_alive() and stream:
                yield _line({"status": f"pulling {ref}"})
        if "error" in done:
            if not stream:
                raise ApiError(404, done["error"], "model")
            yield _line({"error": done["error"]})
            return
        model = done["model"]
        if stream:
            for f in model.files:
                size = _file_size(hub.cached_pointer(model.repo_id, model.commit, f))
                yield _line({"status": f"pulling {f}", "digest": model.commit, "total": size, "completed": size})
            yield _line({"status": "verifying sha256 digest"})
            yield _line({"status": "writing manifest"})
    yield _line({"status": "success"}) if stream else json.dumps({"status": "success"}).encode()


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
