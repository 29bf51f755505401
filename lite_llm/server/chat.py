"""Chat messages to prompt text: the messages checked and normalised (text parts joined,
images decoded into the model's placeholders), the declared tools, a request's own chat
template and its variables, and the template rendered through the tokenizer.

What is not here: the sampling fields (validation.py), tokenizing and the context bound
(openai.py), parsing the answer (parsers.py).
"""
from __future__ import annotations

import json
import re
from typing import Any

from lite_llm.multimodal import MediaError, image_of_part
from lite_llm.sampling_params import MAX_JSON_DEPTH, nested_deeper_than
from lite_llm.server.context import ServingContext
from lite_llm.server.validation import MAX_BODY_DEPTH, bad, show

MAX_REQUEST_TEMPLATE_CHARS = 128 << 10   # a request's own chat template (real ones are a few KiB); compiled ones are cached
# Names a chat template receives from the server itself: chat_template_kwargs cannot set them.
_TEMPLATE_RESERVED = {"messages", "tools", "documents", "add_generation_prompt", "chat_template",
                      "bos_token", "eos_token", "pad_token", "unk_token"}
_ROLES = {"system", "user", "assistant", "developer", "tool"}
_MESSAGE_KEYS = {"system": {"role", "content", "name"}, "developer": {"role", "content", "name"},
                 "user": {"role", "content", "name"},
                 "assistant": {"role", "content", "name", "tool_calls", "reasoning_content"},
                 "tool": {"role", "content", "tool_call_id", "name"}}
MAX_TOOLS = 128
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def declared_tools(body: dict) -> tuple[list[dict] | None, str | dict]:
    """tools (OpenAI function tools) and tool_choice: "auto", "none", "required" or
    {"name": function} (the last two are forced by a grammar: forced_tool_calls)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice is not None:
            raise bad("'tool_choice' is only allowed when 'tools' are given", "tool_choice")
        return None, "none"
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad(f"'tools' must be a list of at most {MAX_TOOLS} tools", "tools")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) \
                or set(t) - {"type", "function"} or set(fn) - {"name", "description", "parameters", "strict"}:
            raise bad(f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\", "
                      f"\"description\", \"parameters\"}}}}", f"tools[{i}]")
        if not isinstance(fn.get("name"), str) or not _TOOL_NAME.fullmatch(fn["name"]):
            raise bad(f"'tools[{i}].function.name' must be 1 to 64 letters, digits, _ . or -",
                      f"tools[{i}].function.name")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise bad(f"'tools[{i}].function.description' must be a string", f"tools[{i}].function.description")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise bad(f"'tools[{i}].function.strict' must be a boolean", f"tools[{i}].function.strict")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise bad(f"'tools[{i}].function.parameters' must be a JSON schema object",
                      f"tools[{i}].function.parameters")
        if nested_deeper_than(fn.get("parameters"), MAX_JSON_DEPTH):
            raise bad(f"'tools[{i}].function.parameters' is nested deeper than {MAX_JSON_DEPTH} levels",
                      f"tools[{i}].function.parameters")
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    if choice is None:
        choice = "auto"
    names = [t["function"]["name"] for t in out]
    if isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) or set(fn) != {"name"} \
                or set(choice) != {"type", "function"} or not isinstance(fn.get("name"), str):
            raise bad("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}", "tool_choice")
        if fn["name"] not in names:
            raise bad(f"'tool_choice' names the function '{show(fn['name'])[1:-1]}', which is not in 'tools'",
                      "tool_choice")
        return out, {"name": fn["name"]}
    if choice not in ("auto", "none", "required"):
        raise bad("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                  "\"function\": {\"name\": ...}}", "tool_choice")
    return out, choice


def _tool_calls_in(where: str, calls: Any) -> list[dict]:
    """An assistant message's tool_calls, arguments as objects (what chat templates expect)."""
    if not isinstance(calls, list) or not calls:
        raise bad(f"'{where}.tool_calls' must be a non-empty list", f"{where}.tool_calls")
    out = []
    for j, c in enumerate(calls):
        p = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                or not isinstance(fn.get("arguments"), (str, dict)):
            raise bad(f"'{p}' must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                      f"\"arguments\"}}}}", p)
        args = fn["arguments"]
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
                if nested_deeper_than(args, MAX_BODY_DEPTH):
                    raise ValueError(args)
            except (ValueError, RecursionError):
                raise bad(f"'{p}.function.arguments' is not valid JSON (or is nested deeper than {MAX_BODY_DEPTH} "
                          "levels)", f"{p}.function.arguments") from None
        out.append({"id": c.get("id"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def parse_messages(messages: Any, images: list | None = None, ctx: ServingContext | None = None,
                   pixels: list[int] | None = None) -> list[dict]:
    """messages -> [{"role", "content": str}], text parts joined; anything else is a 400.
    images: where image_url parts' decoded images go (each part becomes the model's image
    placeholder text), for a model that takes images (ctx.mm_processor); None: refused.
    pixels: as prepare_chat's."""
    pixels = [] if pixels is None else pixels
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    if len(messages) > 4096:
        raise bad("too many messages", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"'{where}' must be an object", where)
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise bad(f"'{where}.role' must be one of system, developer, user, assistant, tool",
                      f"{where}.role")
        for key in m:
            if key not in _MESSAGE_KEYS[role]:
                raise bad(f"'{where}.{show(key)[1:-1]}' is not supported", f"{where}.{key}"[:80])
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            parts = []
            sep = "\n"
            for j, part in enumerate(content):
                p = f"{where}.content[{j}]"
                if isinstance(part, dict) and part.get("type") == "image_url":
                    parts.append(_image_part(part, p, images, ctx, pixels))
                    sep = ""       # as the models' templates put an image between texts
                    continue
                if not isinstance(part, dict) or part.get("type") != "text" \
                        or not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
                    kind = part.get("type") if isinstance(part, dict) else None
                    what = f"content part type '{show(kind)[1:-1]}' is not supported" \
                        if isinstance(kind, str) and kind != "text" else "must be {\"type\": \"text\", \"text\": str}"
                    raise bad(f"'{p}' {what}", p)
                parts.append(part["text"])
            content = sep.join(parts)
        if not isinstance(content, str):
            raise bad(f"'{where}.content' must be a string or a list of text parts", f"{where}.content")
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise bad(f"'{where}.name' must be a string", f"{where}.name")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        if name is not None:
            msg["name"] = name
        if m.get("tool_calls") is not None:
            msg["tool_calls"] = _tool_calls_in(where, m["tool_calls"])
        if role == "tool":
            if not isinstance(m.get("tool_call_id", ""), str):
                raise bad(f"'{where}.tool_call_id' must be a string", f"{where}.tool_call_id")
            if "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
        if m.get("reasoning_content") is not None:
            if not isinstance(m["reasoning_content"], str):
                raise bad(f"'{where}.reasoning_content' must be a string", f"{where}.reasoning_content")
            msg["reasoning_content"] = m["reasoning_content"]
        out.append(msg)
    return out


def _image_part(part: dict, where: str, images: list | None, ctx: ServingContext | None,
                pixels: list[int]) -> str:
    """An image_url part: its image decoded into images (its pixel count onto pixels, whose sum
    bounds what the next one may decode); the placeholder text in its place."""
    if images is None or ctx is None or ctx.mm_processor is None:
        raise bad(f"'{where}': this model does not take image inputs", where)
    if set(part) - {"type", "image_url"} or not isinstance(part.get("image_url"), (dict, str)):
        raise bad(f"'{where}' must be {{\"type\": \"image_url\", \"image_url\": {{\"url\": str}}}}", where)
    if len(images) >= ctx.media.max_images:
        raise bad(f"'{where}': more than {ctx.media.max_images} images in one request (--limit-mm-per-prompt)", where)
    try:
        image = image_of_part(part, f"image {len(images)} ('{where}')", ctx.media, sum(pixels))
    except MediaError as e:
        raise bad(str(e), where) from None
    images.append(image)
    pixels.append(image.width * image.height)
    return ctx.mm_processor.placeholder


def request_template(body: dict, ctx: ServingContext) -> str | None:
    """A request's own chat_template: refused unless the server trusts them (vLLM's
    --trust-request-chat-template), since a template is a program the server runs."""
    template = body.get("chat_template")
    if template is None:
        return None
    if not ctx.trust_request_chat_template:
        raise bad("'chat_template' is passed with the request, but the server was not started with "
                  "--trust-request-chat-template: a request-supplied chat template is refused", "chat_template")
    if not isinstance(template, str):
        raise bad("'chat_template' must be a string", "chat_template")
    if len(template) > MAX_REQUEST_TEMPLATE_CHARS:
        raise bad(f"'chat_template' is longer than {MAX_REQUEST_TEMPLATE_CHARS} characters", "chat_template")
    return template


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def read_template_kwargs(body: dict) -> dict:
    """chat_template_kwargs: extra variables for the chat template (Qwen3's enable_thinking...);
    a chat's reasoning_effort reaches it as reasoning_effort (gpt-oss's template reads it; "none"
    also turns Qwen3-style thinking off), as the Responses API's reasoning.effort does."""
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}", "reasoning_effort")
    kw = body.get("chat_template_kwargs")
    if effort is not None:
        return {"reasoning_effort": effort, **({"enable_thinking": False} if effort == "none" else {}),
                **(read_template_kwargs({"chat_template_kwargs": kw}) if kw is not None else {})}
    if kw is None:
        return {}
    if not isinstance(kw, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kw):
        raise bad("'chat_template_kwargs' must be an object whose keys are identifiers",
                  "chat_template_kwargs")
    reserved = sorted(_TEMPLATE_RESERVED & set(kw))
    if reserved:
        raise bad(f"'chat_template_kwargs' cannot set {', '.join(reserved)}", "chat_template_kwargs")
    return kw


def render_chat(ctx: ServingContext, messages: list[dict], add_generation_prompt: bool,
                template: str | None = None, template_kwargs: dict | None = None) -> str:
    try:
        return ctx.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                 chat_template=template or ctx.chat_template,
                                                 **(template_kwargs or {}))
    except RecursionError:
        raise bad("the chat template recursed too deeply", "messages") from None
    except Exception as e:   # jinja errors (raise_exception in templates), missing template
        raise bad(f"cannot render the chat template: {e}", "messages") from None
