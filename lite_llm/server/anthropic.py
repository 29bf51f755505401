"""Anthropic's Messages API on the chat machinery: POST /v1/messages and
POST /v1/messages/count_tokens.

A Messages body becomes a chat completions body (system -> a system message, content blocks ->
messages: tool_use blocks -> an assistant message's tool_calls, tool_result blocks -> tool
messages, thinking blocks -> reasoning_content; tools and tool_choice -> chat tools; thinking ->
the chat template's enable_thinking) that openai.prepare_chat validates, renders and tokenizes;
the engine runs it as any chat request (generation.run_prepared) and MessageBuilder turns its chat
deltas into content blocks, the Message object and Anthropic's SSE events. Errors on these
routes have Anthropic's shape ({"type": "error", "error": {"type", "message"}}; error_body),
and the API key is also read from x-api-key (routing.check_api_key).

Not here: generation (generation.py), tool call and reasoning parsing (parsers.py); decoding images (image
blocks become chat image_url parts: multimodal.py decodes them for a model that takes images).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from lite_llm.server import generation, openai
from lite_llm.server.context import PreparedRequest
from lite_llm.server.routing import Request, Response, ServerState
from lite_llm.server.validation import ApiError, bad, get_bool, get_float, get_int, show

FIELDS = {"model", "messages", "max_tokens", "system", "stop_sequences", "temperature", "top_k", "top_p",
          "tools", "tool_choice", "thinking", "stream", "metadata", "service_tier", "output_config",
          "cache_control"}
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
                "cache_control"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
                411: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
                500: "api_error", 503: "overloaded_error"}
_CHAT_PARAMS = {"messages": "messages", "max_tokens": "max_tokens", "stop": "stop_sequences",
                "response_format": "output_config.format"}


def error_body(e: ApiError) -> dict:
    """Anthropic's error shape for an ApiError."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


# ---- request body -> chat body -------------------------------------------------------------------

def _blocks(content: Any, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad(f"'{where}' must be a string or a list of content blocks", where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad(f"'{where}[{j}]' must be a content block {{\"type\": ...}}", f"{where}[{j}]")
    return content


def _keys(block: dict, allowed: set[str], where: str) -> None:
    for key in block:
        if key not in allowed | {"type", "cache_control"}:
            raise bad(f"'{where}.{show(key)[1:-1]}' is not supported", f"{where}.{key}"[:80])


def _text_blocks(content: Any, where: str) -> str:
    texts = []
    for j, block in enumerate(_blocks(content, where)):
        w = f"{where}[{j}]"
        if block["type"] != "text" or not isinstance(block.get("text"), str):
            raise bad(f"'{w}' must be a text block (images and documents are not supported)", w)
        _keys(block, {"text", "citations"}, w)
        texts.append(block["text"])
    return "".join(texts)


def messages_of(body: dict) -> list[dict]:
    """system + messages -> chat messages."""
    out: list[dict] = []
    if body.get("system") is not None:
        out.append({"role": "system", "content": _text_blocks(body["system"], "system")})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") or set(m) - {"role", "content"}:
            raise bad(f"'{where}' must be {{\"role\": \"user\" | \"assistant\", \"content\": ...}}", where)
        text: list[Any] = []          # strings, and image_url parts of a user message
        calls: list[dict] = []
        thinking: list[str] = []
        for j, block in enumerate(_blocks(m.get("content"), f"{where}.content")):
            w = f"{where}.content[{j}]"
            kind = block["type"]
            if kind == "text":
                _keys(block, {"text", "citations"}, w)
                if not isinstance(block.get("text"), str):
                    raise bad(f"'{w}.text' must be a string", f"{w}.text")
                text.append(block["text"])
            elif kind == "tool_use" and m["role"] == "assistant":
                _keys(block, {"id", "name", "input"}, w)
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
                        or not isinstance(block.get("input"), dict):
                    raise bad(f"'{w}' must be {{\"type\": \"tool_use\", \"id\": str, \"name\": str, \"input\": "
                              f"object}}", w)
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": block["input"]}})
            elif kind == "tool_result" and m["role"] == "user":
                _keys(block, {"tool_use_id", "content", "is_error"}, w)
                if not isinstance(block.get("tool_use_id"), str):
                    raise bad(f"'{w}.tool_use_id' must be a string", f"{w}.tool_use_id")
                if block.get("is_error") not in (None, True, False):
                    raise bad(f"'{w}.is_error' must be a boolean", f"{w}.is_error")
                result = _text_blocks(block.get("content", ""), f"{w}.content")
                if text:        # text before a result stays before it
                    out.append({"role": "user", "content": _content(text)})
                    text = []
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
            elif kind == "thinking" and m["role"] == "assistant":
                _keys(block, {"thinking", "signature"}, w)
                if not isinstance(block.get("thinking"), str):
                    raise bad(f"'{w}.thinking' must be a string", f"{w}.thinking")
                thinking.append(block["thinking"])
            elif kind == "image" and m["role"] == "user":
                text.append(_image(block, w))
            elif kind == "redacted_thinking" and m["role"] == "assistant":
                _keys(block, {"data"}, w)
            else:
                raise bad(f"'{w}': a {show(kind)} block is not supported in a {m['role']} message", f"{w}.type")
        if m["role"] == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = "".join(thinking)
            out.append(msg)
        elif text or not out or out[-1]["role"] != "tool":
            out.append({"role": "user", "content": _content(text)})
    return out


def _image(block: dict, where: str) -> dict:
    """An image block -> a chat image_url part (base64 -> a data: URL); the chat machinery
    decodes it for a model that takes images, else refuses it."""
    _keys(block, {"source"}, where)
    src = block.get("source")
    kind = src.get("type") if isinstance(src, dict) else None
    if kind == "base64" and isinstance(src.get("media_type"), str) and isinstance(src.get("data"), str) \
            and set(src) == {"type", "media_type", "data"}:
        url = f"data:{src['media_type']};base64,{src['data']}"
    elif kind == "url" and isinstance(src.get("url"), str) and set(src) == {"type", "url"}:
        url = src["url"]
    else:
        raise bad(f"'{where}.source' must be {{\"type\": \"base64\", \"media_type\", \"data\"}} or "
                  f"{{\"type\": \"url\", \"url\"}}", f"{where}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def _content(pieces: list[Any]) -> str | list[dict]:
    """Text pieces as one string; with images among them, chat content parts."""
    if all(isinstance(p, str) for p in pieces):
        return "".join(pieces)
    return [p if isinstance(p, dict) else {"type": "text", "text": p} for p in pieces]


def _tools(body: dict) -> tuple[list[dict] | None, Any, bool | None]:
    """tools and tool_choice -> (chat tools, chat tool_choice, parallel_tool_calls)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    chat = None
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("'tools' must be a list", "tools")
        chat = []
        for i, t in enumerate(tools):
            w = f"tools[{i}]"
            if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
                kind = t.get("type") if isinstance(t, dict) else None
                raise bad(f"'{w}.type' {show(kind)} is not supported: only client tools ({{\"name\", "
                          f"\"description\", \"input_schema\"}})", f"{w}.type")
            _keys(t, {"name", "description", "input_schema"}, w)
            if not isinstance(t.get("input_schema"), dict):
                raise bad(f"'{w}.input_schema' must be a JSON schema object", f"{w}.input_schema")
            fn = {"name": t.get("name"), "parameters": t["input_schema"]}
            if t.get("description") is not None:
                fn["description"] = t["description"]
            chat.append({"type": "function", "function": fn})
    if choice is None:
        return chat or None, None, None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none") or set(choice) - {"type", "name", "disable_parallel_tool_use"} \
            or (kind == "tool") != isinstance(choice.get("name"), str):
        raise bad("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", "
                  "\"name\": str}", "tool_choice")
    if not chat:
        raise bad("'tool_choice' needs 'tools'", "tool_choice")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel not in (None, True, False):
        raise bad("'tool_choice.disable_parallel_tool_use' must be a boolean", "tool_choice")
    chat_choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or \
        {"type": "function", "function": {"name": choice["name"]}}
    return chat, chat_choice, None if parallel is None else not parallel


def _thinking(body: dict) -> dict:
    t = body.get("thinking")
    if t is None:
        return {}
    kind = t.get("type") if isinstance(t, dict) else None
    if kind == "disabled" and set(t) == {"type"}:
        return {"enable_thinking": False}
    if kind in ("enabled", "adaptive", "between_tools") and set(t) <= {"type", "budget_tokens", "display"}:
        get_int(t, "budget_tokens", 1, 2 ** 31 - 1)
        if t.get("display") not in (None, "summarized", "omitted"):
            raise bad("thinking.display: must be summarized or omitted", "thinking.display")
        return {"enable_thinking": True}
    raise bad("thinking: must be {\"type\": \"enabled\", \"budget_tokens\": int}, {\"type\": \"adaptive\"} "
              "or {\"type\": \"disabled\"}", "thinking")


def _output_config(body: dict) -> tuple[dict | None, dict]:
    """output_config -> (chat response_format, chat template variables): format's JSON schema
    is enforced by the structured-output engine, effort reaches the template as reasoning_effort."""
    oc = body.get("output_config")
    if oc is None:
        return None, {}
    if not isinstance(oc, dict) or set(oc) - {"format", "effort"}:
        raise bad("output_config: must be {\"format\": {...}, \"effort\": ...}", "output_config")
    if oc.get("effort") not in (None, "low", "medium", "high", "xhigh", "max"):
        raise bad("output_config.effort: must be low, medium, high, xhigh or max", "output_config.effort")
    fmt = oc.get("format")
    response_format = None
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or set(fmt) != {"type", "schema"} \
                or not isinstance(fmt["schema"], dict):
            raise bad("output_config.format: must be {\"type\": \"json_schema\", \"schema\": object}",
                      "output_config.format")
        response_format = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    return response_format, ({"reasoning_effort": oc["effort"]} if oc.get("effort") else {})


def chat_body(body: dict, fields: set[str]) -> dict:
    """The chat completions body of a Messages (or count_tokens) body."""
    for name in body:
        if name not in fields:
            raise bad(f"{name}: Extra inputs are not permitted", name)
    if not isinstance(body.get("model"), str):
        raise bad("model: Field required (a string)", "model")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages_of(body)}
    tools, choice, parallel = _tools(body)
    response_format, effort = _output_config(body)
    kwargs = {**_thinking(body), **effort}
    cache = body.get("cache_control")      # a caching hint: prefix caching is automatic here
    if cache is not None and not (isinstance(cache, dict) and cache.get("type") == "ephemeral"):
        raise bad("cache_control: must be {\"type\": \"ephemeral\"}", "cache_control")
    for key, value in (("tools", tools), ("tool_choice", choice), ("parallel_tool_calls", parallel),
                       ("response_format", response_format), ("chat_template_kwargs", kwargs or None)):
        if value is not None:
            chat[key] = value
    if fields is COUNT_FIELDS:
        return chat
    if body.get("max_tokens") is None:
        raise bad("max_tokens: Field required", "max_tokens")
    chat["max_tokens"] = get_int(body, "max_tokens", 1, 2 ** 31 - 1)
    chat["stream"] = get_bool(body, "stream", False)
    for name, hi in (("temperature", 1.0), ("top_p", 1.0)):
        value = get_float(body, name, 0.0, hi)
        if value is not None:
            chat[name] = value
    top_k = get_int(body, "top_k", 0, 2 ** 31 - 1)
    if top_k:
        chat["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad("stop_sequences: must be a list of non-empty strings", "stop_sequences")
        if stops:
            chat["stop"] = stops
    meta = body.get("metadata")
    if meta is not None and (not isinstance(meta, dict) or set(meta) - {"user_id"}
                             or not isinstance(meta.get("user_id", ""), (str, type(None)))):
        raise bad("metadata: must be {\"user_id\": str}", "metadata")
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        raise bad("service_tier: must be auto or standard_only", "service_tier")
    return chat


def prepare(body: dict, ctx: Any, fields: set[str] = FIELDS) -> PreparedRequest:
    try:
        prep = openai.prepare_chat(chat_body(body, fields), ctx)
    except ApiError as e:
        if e.param:
            name = e.param.partition(".")[0].partition("[")[0]
            if name in _CHAT_PARAMS and name != _CHAT_PARAMS[name]:
                e.param = _CHAT_PARAMS[name]
        raise
    return dataclasses.replace(prep, id="msg_" + prep.id.split("-", 1)[1], include_usage=True)


# ---- chat deltas -> content blocks, the Message, SSE events ----------------------------------------

def stop_reason(finish: str | None, stop: Any, stop_sequences: list[str], has_tool_use: bool) -> tuple[str, Any]:
    """(stop_reason, stop_sequence) in Anthropic's terms for a chat finish reason: max_tokens
    whenever the budget ended the answer, even after whole tool_use blocks (an unfinished call
    is dropped by the tool parser)."""
    if finish == "length":
        return "max_tokens", None
    if has_tool_use:
        return "tool_use", None
    if isinstance(stop, str) and stop in stop_sequences:
        return "stop_sequence", stop
    return "end_turn", None


class MessageBuilder:
    """Chat deltas -> content blocks of one Message, each method returning the events
    (type, payload) that say what changed: thinking and text are one open block each until
    something else begins; a tool call is one tool_use block, its input in one JSON delta."""

    def __init__(self, prep: PreparedRequest, stop_sequences: list[str]):
        self.prep, self.stop_sequences = prep, stop_sequences
        self.content: list[dict] = []
        self.open: str | None = None
        self.input_tokens = len(prep.prompts[0].token_ids)

    def message(self, stop: tuple[str, Any] | None = None, output_tokens: int = 0) -> dict:
        return {"id": self.prep.id, "type": "message", "role": "assistant", "model": self.prep.model,
                "content": self.content, "stop_reason": stop[0] if stop else None,
                "stop_sequence": stop[1] if stop else None,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": output_tokens,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}

    def feed(self, delta: dict) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if delta.get("reasoning_content"):
            events += self._text("thinking", delta["reasoning_content"])
        if delta.get("content"):
            events += self._text("text", delta["content"])
        for call in delta.get("tool_calls") or []:
            events += self._close()
            fn = call["function"]
            try:
                args = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
            except (ValueError, RecursionError):
                args = {}
            block = {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": fn["name"],
                     "input": args if isinstance(args, dict) else {}}
            index = len(self.content)
            self.content.append(block)
            partial = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events += [("content_block_start", {"index": index, "content_block": {**block, "input": {}}}),
                       ("content_block_delta", {"index": index, "delta": partial}),
                       ("content_block_stop", {"index": index})]
        return events

    def _text(self, kind: str, text: str) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if self.open != kind:
            events += self._close()
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            self.content.append(block)
            self.open = kind
            events.append(("content_block_start", {"index": len(self.content) - 1, "content_block": dict(block)}))
        self.content[-1][kind] += text
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else \
            {"type": "text_delta", "text": text}
        events.append(("content_block_delta", {"index": len(self.content) - 1, "delta": delta}))
        return events

    def _close(self) -> list[tuple[str, dict]]:
        if self.open is None:
            return []
        self.open = None
        index = len(self.content) - 1
        events = []
        if self.content[index]["type"] == "thinking":
            events.append(("content_block_delta", {"index": index, "delta": {"type": "signature_delta",
                                                                              "signature": ""}}))
        return events + [("content_block_stop", {"index": index})]

    def stop(self, finish: str | None, stop: Any) -> tuple[str, Any]:
        return stop_reason(finish, stop, self.stop_sequences,
                           any(b["type"] == "tool_use" for b in self.content))


def _sse(kind: str, payload: dict) -> bytes:
    data = json.dumps({"type": kind, **payload}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode("utf-8")


class _Answer:
    """generation.run_prepared's api for one Messages request: the whole Message, or its events."""

    def __init__(self, stop_sequences: list[str]):
        self.stop_sequences = stop_sequences

    def answer(self, prep: PreparedRequest, chat: dict) -> dict:
        choice = chat["choices"][0]
        b = MessageBuilder(prep, self.stop_sequences)
        b.feed(choice["message"])
        return b.message(b.stop(choice["finish_reason"], choice.get("stop_reason")),
                         chat["usage"]["completion_tokens"])

    def stream(self, prep: PreparedRequest, items: Any) -> Any:
        b = MessageBuilder(prep, self.stop_sequences)
        start = b.message(output_tokens=0)
        yield _sse("message_start", {"message": {**start, "content": []}})
        yield _sse("ping", {})
        finish, stop, output_tokens = None, None, 0
        for item in items:
            if isinstance(item, ApiError):
                for kind, payload in b._close():
                    yield _sse(kind, payload)
                yield _sse("error", {"error": error_body(item)["error"]})
                return
            for choice in item["choices"]:
                for kind, payload in b.feed(choice["delta"]):
                    yield _sse(kind, payload)
                if choice.get("finish_reason"):
                    finish, stop = choice["finish_reason"], choice.get("stop_reason")
            if item.get("usage"):
                output_tokens = item["usage"]["completion_tokens"]
        for kind, payload in b._close():
            yield _sse(kind, payload)
        reason, sequence = b.stop(finish, stop)
        yield _sse("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                     "usage": {"output_tokens": output_tokens}})
        yield _sse("message_stop", {})


# ---- routes -----------------------------------------------------------------------------------

def messages(req: Request, state: ServerState) -> Response:
    """POST /v1/messages."""
    state.check_serving()
    body = req.json()
    prep = prepare(body, state.ctx)
    return generation.run_prepared(req, state, prep, _Answer(body.get("stop_sequences") or []))


def count_tokens(req: Request, state: ServerState) -> Response:
    """POST /v1/messages/count_tokens: the input_tokens a /v1/messages request of these messages
    (system, tools, thinking) would be charged, rendered and tokenized the same way."""
    prep = prepare(req.json(), state.ctx, COUNT_FIELDS)
    return Response.json({"input_tokens": len(prep.prompts[0].token_ids)})
