"""OpenAI's Responses API on the chat machinery: POST /v1/responses, GET /v1/responses/{id},
POST /v1/responses/{id}/cancel, DELETE /v1/responses/{id}.

A Responses body becomes a chat completions body (input items -> messages, instructions -> a
system message, flat function tools -> chat tools, text.format -> response_format, reasoning
-> chat template variables) that openai.prepare_chat validates, renders and tokenizes; the
engine runs it as any chat request (generation.run_prepared), and its answer comes back as the chat
deltas (reasoning split off, tool calls parsed) that ResponseBuilder turns into output items,
the Response object and the typed SSE events.

Stored responses (store, the default) live in ResponseStore, in memory: at most
--responses-store-max of them, each for --responses-store-ttl seconds. previous_response_id
continues from one (its conversation and its output come before the new input); a background
response runs on a thread of its own and is polled with GET or stopped with /cancel.

Not here: generation (generation.py), tool call and reasoning parsing (parsers.py).
"""
from __future__ import annotations

import copy
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from lite_llm.server import answers, generation, openai
from lite_llm.server.context import PreparedRequest
from lite_llm.server.routing import Request, Response, ServerState
from lite_llm.server.validation import ApiError, bad, get_bool, get_float, get_int, show

logger = logging.getLogger("lite_llm.server.responses")

FIELDS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools",
          "tool_choice", "parallel_tool_calls", "text", "reasoning", "store", "previous_response_id",
          "background", "stream", "metadata", "user", "truncation", "include", "safety_identifier",
          "prompt_cache_key", "service_tier", "stream_options", "top_logprobs", "max_tool_calls",
          "prompt", "conversation"}
_UNSUPPORTED = {"include", "top_logprobs", "max_tool_calls", "prompt", "conversation"}
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
_CHAT_PARAMS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
                "messages": "input", "response_format": "text.format"}
DEFAULT_STORE_MAX = 1000
DEFAULT_STORE_TTL = 3600.0


# ---- the store ---------------------------------------------------------------------------------

@dataclass
class Stored:
    """One stored response: its object (updated in place while a background one runs, under
    lock), the chat messages of its conversation before its output, and how to stop it."""
    response: dict
    history: list[dict]
    lock: threading.Lock = field(default_factory=threading.Lock)
    cancel: Callable[[], None] | None = None
    expires: float = 0.0


class ResponseStore:
    """Responses kept in memory for previous_response_id and GET: at most max_entries (the
    oldest go first), each for ttl seconds after it was stored."""

    def __init__(self, max_entries: int = DEFAULT_STORE_MAX, ttl: float = DEFAULT_STORE_TTL):
        if max_entries < 0 or not ttl > 0:
            raise ValueError(f"responses store: max entries must be >= 0 and ttl > 0, got {max_entries}, {ttl}")
        self.max_entries, self.ttl = max_entries, ttl
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, entry: Stored) -> None:
        if not self.max_entries:
            return
        with self._lock:
            self._expire(time.monotonic())
            entry.expires = time.monotonic() + self.ttl
            self._entries[rid] = entry
            self._entries.move_to_end(rid)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        with self._lock:
            self._expire(time.monotonic())
            return self._entries.get(rid)

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._entries.pop(rid, None) is not None

    def __len__(self) -> int:
        with self._lock:
            self._expire(time.monotonic())
            return len(self._entries)

    def _expire(self, now: float) -> None:
        while self._entries:
            rid, first = next(iter(self._entries.items()))
            if first.expires > now:     # stored in order, each for the same ttl
                return
            del self._entries[rid]


def _snapshot(entry: Stored) -> dict:
    with entry.lock:
        return copy.deepcopy(entry.response)


# ---- request body -> chat body -------------------------------------------------------------------

def _text_of(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    """A string, or a list of text parts of the given types, as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'{where}' must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        p = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            what = f"content part type '{show(kind)[1:-1]}' is not supported (text only)" \
                if isinstance(kind, str) and kind not in kinds else \
                f"must be {{\"type\": \"{kinds[0]}\", \"text\": str}}"
            raise bad(f"'{p}' {what}", p)
        texts.append(part["text"])
    return "".join(texts)


def _user_content(content: Any, where: str) -> str | list[dict]:
    """A user message's content: its text, or, with input_image parts, chat parts (text and
    image_url: the chat machinery decodes the image for a model that takes images, else refuses it)."""
    if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") == "input_image"
                                                for p in content):
        return _text_of(content, where, ("input_text",))
    parts: list[dict] = []
    for j, part in enumerate(content):
        p = f"{where}[{j}]"
        if isinstance(part, dict) and part.get("type") == "input_image":
            _check_keys(part, {"type", "image_url", "detail"}, p)
            if not isinstance(part.get("image_url"), str):
                raise bad(f"'{p}.image_url' must be a URL or a data: URL (file_id is not supported)", f"{p}.image_url")
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            parts.append({"type": "text", "text": _text_of([part], where, ("input_text",))})
    return parts


def _check_keys(item: dict, allowed: set[str], where: str) -> None:
    for key in item:
        if key not in allowed:
            raise bad(f"'{where}.{show(key)[1:-1]}' is not supported", f"{where}.{key}"[:80])


def messages_from_items(items: list, where: str = "input") -> list[dict]:
    """Responses input (or output) items -> chat messages. Consecutive function calls (and the
    assistant text before them) make one assistant message with tool_calls; a reasoning item
    becomes the next assistant message's reasoning_content."""
    out: list[dict] = []
    reasoning: str | None = None

    def assistant() -> dict:
        nonlocal reasoning
        msg: dict[str, Any] = {"role": "assistant", "content": ""}
        if reasoning is not None:
            msg["reasoning_content"], reasoning = reasoning, None
        out.append(msg)
        return msg

    for i, it in enumerate(items):
        w = f"{where}[{i}]"
        if not isinstance(it, dict):
            raise bad(f"'{w}' must be an object", w)
        kind = it.get("type", "message" if "role" in it else None)
        if kind == "message":
            _check_keys(it, {"type", "role", "content", "id", "status", "phase"}, w)
            role = it.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad(f"'{w}.role' must be one of user, system, developer, assistant", f"{w}.role")
            if role == "assistant":
                text: Any = _text_of(it.get("content"), f"{w}.content", ("output_text", "refusal"))
            else:
                text = _user_content(it.get("content"), f"{w}.content")
            if role == "assistant":
                assistant()["content"] = text
            else:
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            _check_keys(it, {"type", "id", "call_id", "name", "arguments", "status", "namespace"}, w)
            if not all(isinstance(it.get(k), str) for k in ("call_id", "name", "arguments")):
                raise bad(f"'{w}' must be {{\"type\": \"function_call\", \"call_id\": str, \"name\": str, "
                          f"\"arguments\": str}}", w)
            last = out[-1] if out else None
            msg = last if last is not None and last["role"] == "assistant" and reasoning is None else assistant()
            msg.setdefault("tool_calls", []).append(
                {"id": it["call_id"], "type": "function",
                 "function": {"name": it["name"], "arguments": it["arguments"]}})
        elif kind == "function_call_output":
            _check_keys(it, {"type", "id", "call_id", "output", "status"}, w)
            if not isinstance(it.get("call_id"), str):
                raise bad(f"'{w}.call_id' must be a string", f"{w}.call_id")
            out.append({"role": "tool", "tool_call_id": it["call_id"],
                        "content": _text_of(it.get("output"), f"{w}.output", ("input_text",))})
        elif kind == "reasoning":
            _check_keys(it, {"type", "id", "summary", "content", "encrypted_content", "status"}, w)
            parts = it.get("content") or it.get("summary") or []
            reasoning = _text_of(parts, f"{w}.content", ("reasoning_text", "summary_text"))
        else:
            raise bad(f"'{w}.type' {show(kind)} is not supported: give message, function_call, "
                      f"function_call_output or reasoning items", f"{w}.type")
    return out


def _tools(body: dict) -> tuple[list[dict] | None, Any, list[dict]]:
    """Flat function tools -> (chat tools, chat tool_choice, the tools as the response echoes them)."""
    tools = body.get("tools")
    if tools is None:
        return None, body.get("tool_choice"), []
    if not isinstance(tools, list):
        raise bad("'tools' must be a list of function tools", "tools")
    chat, echo = [], []
    for i, t in enumerate(tools):
        w = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise bad(f"'{w}.type' {show(kind)} is not supported: only function tools "
                      f"({{\"type\": \"function\", \"name\", \"parameters\"}})", f"{w}.type")
        _check_keys(t, {"type", "name", "description", "parameters", "strict"}, w)
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        fn["strict"] = t.get("strict") is not False     # the Responses API's default: strict
        chat.append({"type": "function", "function": fn})
        echo.append({"type": "function", "name": t.get("name"), "description": t.get("description"),
                     "parameters": t.get("parameters"), "strict": fn["strict"]})
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or set(choice) != {"type", "name"}:
            raise bad("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                      "\"name\": ...}", "tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return chat or None, choice, echo


def _text_format(body: dict) -> tuple[dict | None, dict]:
    """text.format -> (chat response_format, the text field as the response echoes it)."""
    text = body.get("text")
    if text is None:
        return None, {"format": {"type": "text"}}
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise bad("'text' must be {\"format\": {...}}", "text")
    if text.get("verbosity") not in (None, "low", "medium", "high"):
        raise bad("'text.verbosity' must be low, medium or high", "text.verbosity")
    fmt = text.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object") and set(fmt) == {"type"}:
        return ({"type": "json_object"} if kind == "json_object" else None), {"format": fmt}
    if kind == "json_schema" and isinstance(fmt.get("name"), str) and isinstance(fmt.get("schema"), dict) \
            and set(fmt) <= {"type", "name", "schema", "description", "strict"}:
        js = {k: fmt[k] for k in ("name", "schema", "description", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": js}, {"format": fmt}
    raise bad("'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
              "\"json_schema\", \"name\": str, \"schema\": object, \"strict\": bool}", "text.format")


def _reasoning(body: dict) -> tuple[dict, dict | None]:
    """reasoning -> (chat template variables, the reasoning field as the response echoes it):
    the effort reaches the template as reasoning_effort; effort "none" also turns Qwen3-style
    thinking off (enable_thinking=False)."""
    r = body.get("reasoning")
    if r is None:
        return {}, None
    if not isinstance(r, dict) or set(r) - {"effort", "summary", "generate_summary"}:
        raise bad("'reasoning' must be {\"effort\": ..., \"summary\": ...}", "reasoning")
    effort = r.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise bad(f"'reasoning.effort' must be one of {', '.join(_EFFORTS)}", "reasoning.effort")
    for key in ("summary", "generate_summary"):
        if r.get(key) not in (None, "auto", "concise", "detailed"):
            raise bad(f"'reasoning.{key}' must be auto, concise or detailed", f"reasoning.{key}")
    kwargs: dict[str, Any] = {}
    if effort is not None:
        kwargs["reasoning_effort"] = effort
        if effort == "none":
            kwargs["enable_thinking"] = False
    return kwargs, {"effort": effort, "summary": r.get("summary")}


def _metadata(body: dict) -> dict | None:
    m = body.get("metadata")
    if m is None:
        return None
    if not isinstance(m, dict) or len(m) > 16 or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in m.items()):
        raise bad("'metadata' must be an object of at most 16 string keys (64 characters) -> strings "
                  "(512 characters)", "metadata")
    return m


@dataclass
class ResponseRequest:
    """A validated Responses body: the chat body it became, what the response echoes, and its mode."""
    chat_body: dict
    history: list[dict]          # chat messages of the conversation, without the instructions
    echo: dict                   # the request fields a Response object repeats
    store: bool
    background: bool
    stream: bool


def parse_request(body: dict, store: ResponseStore) -> ResponseRequest:
    for name, value in body.items():
        if name not in FIELDS:
            raise bad(f"unrecognized request argument '{show(name)[1:-1]}'", name)
        if name in _UNSUPPORTED and value not in (None, [], {}, "", 0):
            raise bad(f"'{name}' is not supported by this server", name)
    stream = get_bool(body, "stream", False)
    do_store = get_bool(body, "store", True)
    background = get_bool(body, "background", False)
    if background and not do_store:
        raise bad("'background' responses must be stored: drop 'store': false", "background")
    if background and stream:
        raise bad("'background' with 'stream' is not supported: poll GET /v1/responses/{id} instead", "stream")
    so = body.get("stream_options")
    if so is not None and (not isinstance(so, dict) or set(so) - {"include_obfuscation"} or not stream):
        raise bad("'stream_options' must be {\"include_obfuscation\": bool}, with 'stream'", "stream_options")
    if body.get("truncation") not in (None, "disabled"):
        raise bad("'truncation' must be \"disabled\": an input longer than the context is refused", "truncation")
    if body.get("service_tier") not in (None, "auto", "default"):
        raise bad("'service_tier' must be auto or default", "service_tier")
    for name in ("user", "safety_identifier", "prompt_cache_key"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise bad(f"'{name}' must be a string", name)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("'instructions' must be a string", "instructions")
    history: list[dict] = []
    prev_id = body.get("previous_response_id")
    if prev_id is not None:
        if not isinstance(prev_id, str):
            raise bad("'previous_response_id' must be a string", "previous_response_id")
        prev = store.get(prev_id)
        if prev is None:
            raise ApiError(404, f"Previous response with id '{show(prev_id)[1:-1]}' not found.",
                           "previous_response_id", code="previous_response_not_found")
        with prev.lock:
            if prev.response["status"] in ("queued", "in_progress"):
                raise bad(f"Previous response '{prev_id}' is still {prev.response['status']}; wait until it "
                          f"completes", "previous_response_id")
            history = prev.history + messages_from_items(prev.response["output"], "previous_response.output")
    given = body.get("input")
    if isinstance(given, str):
        history = history + [{"role": "user", "content": given}]
    elif isinstance(given, list) and given:
        history = history + messages_from_items(given)
    else:
        raise bad("'input' must be a string or a non-empty list of items", "input")
    messages = ([{"role": "system", "content": instructions}] if instructions is not None else []) + history
    chat_tools, tool_choice, echo_tools = _tools(body)
    response_format, text = _text_format(body)
    template_kwargs, reasoning = _reasoning(body)
    max_output = get_int(body, "max_output_tokens", 1, 2 ** 31 - 1)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "stream": stream}
    for key, value in (("max_tokens", max_output), ("temperature", body.get("temperature")),
                       ("top_p", body.get("top_p")), ("tools", chat_tools), ("tool_choice", tool_choice),
                       ("parallel_tool_calls", body.get("parallel_tool_calls")),
                       ("response_format", response_format), ("user", body.get("user")),
                       ("chat_template_kwargs", template_kwargs or None)):
        if value is not None:
            chat[key] = value
    echo = {"instructions": instructions, "max_output_tokens": max_output,
            "temperature": get_float(body, "temperature", 0.0, 2.0),
            "top_p": get_float(body, "top_p", 0.0, 1.0, lo_open=True),
            "tools": echo_tools, "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": get_bool(body, "parallel_tool_calls", True), "text": text,
            "reasoning": reasoning, "metadata": _metadata(body), "previous_response_id": prev_id,
            "truncation": "disabled", "user": body.get("user")}
    return ResponseRequest(chat, history, echo, do_store, background, stream)


def prepare(req: ResponseRequest, ctx: Any) -> PreparedRequest:
    """The chat request of a Responses body; its errors name the Responses fields."""
    try:
        prep = openai.prepare_chat(req.chat_body, ctx)
    except ApiError as e:
        if e.param:
            head, dot, rest = e.param.partition(".")
            name, bracket, tail = head.partition("[")
            if name in _CHAT_PARAMS:
                e.param = _CHAT_PARAMS[name] + bracket + tail + dot + rest
        raise
    # streamed and background answers read the usage chunk at the end of the chat chunks
    return dataclasses.replace(prep, id="resp_" + prep.id.split("-", 1)[1], include_usage=True)


# ---- chat deltas -> output items, the Response object, SSE events -----------------------------

def _usage(chat_usage: dict | None) -> dict | None:
    if chat_usage is None:
        return None
    return {"input_tokens": chat_usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


def new_response(rid: str, model: str, echo: dict, *, store: bool, background: bool, status: str) -> dict:
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status,
            "background": background, "error": None, "incomplete_details": None, "model": model,
            "output": [], "usage": None, "store": store, "completed_at": None, **echo}


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """Chat deltas ({"content", "reasoning_content", "tool_calls"}: a streamed delta or a whole
    message) -> output items of one Response, each method returning the events (type, payload)
    that say what changed. Reasoning text and answer text are one open item each until
    something else begins; a tool call is one function_call item with its arguments in one delta."""

    def __init__(self, response: dict, lock: threading.Lock):
        self.response, self.lock = response, lock
        self.open: tuple[str, dict, int] | None = None     # (kind, item, output index)
        self.cancelled: threading.Event | None = None      # set: a failure is the cancel asked for

    def start(self) -> list[tuple[str, dict]]:
        with self.lock:
            self.response["status"] = "in_progress"
            return [("response.created", {"response": copy.deepcopy(self.response)}),
                    ("response.in_progress", {"response": copy.deepcopy(self.response)})]

    def feed(self, delta: dict) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        with self.lock:
            if delta.get("reasoning_content"):
                events += self._text("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                events += self._text("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._close() + self._call(call)
        return events

    def _text(self, kind: str, text: str) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if self.open is None or self.open[0] != kind:
            events += self._close()
            if kind == "reasoning":
                item = {"id": _item_id("rs"), "type": "reasoning", "summary": [], "content": [],
                        "status": "in_progress"}
                part = {"type": "reasoning_text", "text": ""}
            else:
                item = {"id": _item_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                        "content": []}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            output = self.response["output"]
            output.append(item)
            self.open = (kind, item, len(output) - 1)
            # as OpenAI: the item opens empty and its part with no text; every character is in a delta
            events.append(("response.output_item.added", {"output_index": len(output) - 1,
                                                          "item": copy.deepcopy(item)}))
            events.append(("response.content_part.added", {"item_id": item["id"], "output_index": len(output) - 1,
                                                           "content_index": 0, "part": dict(part)}))
            item["content"].append(part)
        _, item, index = self.open
        item["content"][0]["text"] += text
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if kind == "reasoning":
            events.append(("response.reasoning_text.delta", {**where, "delta": text}))
        else:
            events.append(("response.output_text.delta", {**where, "delta": text, "logprobs": []}))
        return events

    def _close(self, status: str = "completed") -> list[tuple[str, dict]]:
        """Ends the open text item; `status` "incomplete" for the one max_output_tokens cut."""
        if self.open is None:
            return []
        kind, item, index = self.open
        self.open = None
        part = item["content"][0]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        item["status"] = status
        done = ("response.reasoning_text.done", {**where, "text": part["text"]}) if kind == "reasoning" else \
            ("response.output_text.done", {**where, "text": part["text"], "logprobs": []})
        return [done, ("response.content_part.done", {**where, "part": dict(part)}),
                ("response.output_item.done", {"output_index": index, "item": copy.deepcopy(item)})]

    def _call(self, call: dict) -> list[tuple[str, dict]]:
        fn = call["function"]
        item = {"id": _item_id("fc"), "type": "function_call", "status": "in_progress", "call_id": call["id"],
                "name": fn["name"], "arguments": ""}
        output = self.response["output"]
        output.append(item)
        index = len(output) - 1
        events = [("response.output_item.added", {"output_index": index, "item": dict(item)}),
                  ("response.function_call_arguments.delta",
                   {"item_id": item["id"], "output_index": index, "delta": fn["arguments"]}),
                  ("response.function_call_arguments.done",
                   {"item_id": item["id"], "output_index": index, "arguments": fn["arguments"], "name": fn["name"]})]
        item["arguments"], item["status"] = fn["arguments"], "completed"
        events.append(("response.output_item.done", {"output_index": index, "item": dict(item)}))
        return events

    def finish(self, finish_reason: str | None, chat_usage: dict | None) -> list[tuple[str, dict]]:
        """The terminal event: OpenAI ends an answer cut at max_output_tokens with
        response.incomplete (status and the cut item "incomplete"), any other with response.completed."""
        with self.lock:
            cut = finish_reason == "length"
            events = self._close("incomplete" if cut else "completed")
            r = self.response
            r["usage"] = _usage(chat_usage)
            if cut:
                r["status"], r["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
                events.append(("response.incomplete", {"response": copy.deepcopy(r)}))
            else:
                r["status"], r["completed_at"] = "completed", int(time.time())
                events.append(("response.completed", {"response": copy.deepcopy(r)}))
            return events

    def fail(self, err: ApiError) -> list[tuple[str, dict]]:
        with self.lock:
            events = self._close()
            r = self.response
            r["status"] = "cancelled" if self.cancelled is not None and self.cancelled.is_set() else "failed"
            if r["status"] == "failed":
                r["error"] = {"code": "server_error", "message": err.message}
                events.append(("response.failed", {"response": copy.deepcopy(r)}))
            return events

    def consume(self, items: Any) -> Any:
        """Events of a whole chunk stream (answers.stream_chunks' dicts, an ApiError last on failure)."""
        finish, chat_usage = None, None
        for item in items:
            if isinstance(item, ApiError):
                yield from self.fail(item)
                return
            for choice in item["choices"]:
                yield from self.feed(choice["delta"])
                finish = choice.get("finish_reason") or finish
            chat_usage = item.get("usage") or chat_usage
        yield from self.finish(finish, chat_usage)


def sse_event(seq: int, kind: str, payload: dict) -> bytes:
    data = json.dumps({"type": kind, "sequence_number": seq, **payload}, ensure_ascii=False,
                      separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode("utf-8")


class _Answer:
    """generation.run_prepared's api for one Responses request: the whole Response, or its events."""

    def __init__(self, store: ResponseStore, req: ResponseRequest, response: dict):
        self.store, self.req = store, req
        self.entry = Stored(response, req.history)
        self.builder = ResponseBuilder(response, self.entry.lock)

    def _keep(self) -> None:
        if self.req.store and self.entry.response["status"] in ("completed", "incomplete"):
            self.store.put(self.entry.response["id"], self.entry)

    def answer(self, prep: PreparedRequest, chat_body: dict) -> dict:
        choice = chat_body["choices"][0]
        self.builder.start()
        self.builder.feed(choice["message"])
        self.builder.finish(choice["finish_reason"], chat_body["usage"])
        self._keep()
        return self.entry.response

    def stream(self, prep: PreparedRequest, items: Any) -> Any:
        seq = 0
        for kind, payload in self.builder.start():
            yield sse_event(seq, kind, payload)
            seq += 1
        for kind, payload in self.builder.consume(items):
            yield sse_event(seq, kind, payload)
            seq += 1
        self._keep()


# ---- routes -----------------------------------------------------------------------------------

def create(http: Request, st: ServerState) -> Response:
    """POST /v1/responses."""
    st.check_serving()
    body = http.json()
    store = st.responses
    req = parse_request(body, store)
    if req.background and not store.max_entries:
        raise bad("'background' responses need the response store: the server runs with "
                  "--responses-store-max 0", "background")
    prep = prepare(req, st.ctx)
    status = "queued" if req.background else "in_progress"
    response = new_response(prep.id, prep.model, req.echo, store=req.store, background=req.background,
                            status=status)
    if not req.background:
        return generation.run_prepared(http, st, prep, _Answer(store, req, response))
    with st.inflight():
        st.check_serving()
        submitted = generation.submit(http, st, prep)
    entry = Stored(response, req.history)
    cancelled = threading.Event()

    def cancel() -> None:
        cancelled.set()
        for rid, _ in submitted:
            st.engine.abort(rid)

    entry.cancel = cancel
    store.put(prep.id, entry)
    threading.Thread(target=_run_background, args=(st, prep, submitted, entry, cancelled),
                     name="lite-llm-response", daemon=True).start()
    return Response.json(_snapshot(entry))


def _run_background(st: Any, prep: PreparedRequest, submitted: list, entry: Stored,
                    cancelled: threading.Event) -> None:
    builder = ResponseBuilder(entry.response, entry.lock)
    builder.cancelled = cancelled
    builder.start()
    tally = answers.StreamTally(sum(len(p.token_ids) for p in prep.prompts))

    def items() -> Any:
        try:
            yield from answers.stream_chunks(prep, answers.iter_deltas(submitted), st.ctx.tokenizer, tally)
        except Exception as e:
            logger.exception("background response %s failed", prep.id)
            yield ApiError(500, f"generation failed: {e}")
            return
        if tally.aborted:
            yield ApiError(503, "the engine aborted the request")

    try:
        for _ in builder.consume(items()):
            pass
    finally:
        entry.cancel = None


def _stored(req: Request, st: ServerState) -> Stored:
    rid = req.route_arg
    entry = st.responses.get(rid)
    if entry is None:
        raise ApiError(404, f"Response with id '{show(rid)[1:-1]}' not found.", code="not_found")
    return entry


def retrieve(req: Request, st: ServerState) -> Response:
    """GET /v1/responses/{id}."""
    return Response.json(_snapshot(_stored(req, st)))


def delete(req: Request, st: ServerState) -> Response:
    """DELETE /v1/responses/{id}."""
    entry = _stored(req, st)
    if entry.cancel is not None:
        entry.cancel()
    st.responses.delete(req.route_arg)
    return Response.json({"id": req.route_arg, "object": "response", "deleted": True})


def cancel(req: Request, st: ServerState) -> Response:
    """POST /v1/responses/{id}/cancel: stops a background response (answered as it stands)."""
    entry = _stored(req, st)
    with entry.lock:
        background, status = entry.response["background"], entry.response["status"]
    if not background:
        raise bad("Only background responses can be cancelled.", "response_id")
    if status not in ("queued", "in_progress", "cancelled"):
        raise bad(f"Cannot cancel a response that is already {status}.", "response_id")
    stop = entry.cancel
    if stop is not None:
        stop()
        deadline = time.monotonic() + 5.0
        while entry.cancel is not None and time.monotonic() < deadline:    # the engine confirms the abort
            time.sleep(0.005)
    return Response.json(_snapshot(entry))
