"""OpenAI request bodies -> validated engine inputs, and engine outputs -> OpenAI response bodies.

Everything here is pure: JSON-shaped dicts in, dicts out, no sockets and no engine calls
(app.py owns those). Validation is strict: a wrong type, an out-of-range value or a field this
server does not implement is an ApiError(400) naming the field, never silently ignored.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from lite_llm.outputs import CompletionOutput, Logprob
from lite_llm.server import harmony
from lite_llm.sampling_params import (MAX_GRAMMAR_BYTES, MAX_JSON_DEPTH, MAX_LOGPROBS, SamplingParams,
                                      StructuredOutputsParams, nested_deeper_than)

MAX_PROMPTS = 256           # prompts in one completions request (each is one engine request)
MAX_N = 128                 # completions per prompt
MAX_COMPLETIONS = 1024      # prompts x n in one request
MAX_STOP = 16               # stop strings per request
MAX_STOP_LEN = 512          # characters per stop string
MAX_REQUEST_TEMPLATE_CHARS = 128 << 10   # a request's own chat template (real ones are a few KiB); compiled ones are cached
MAX_BODY_DEPTH = 2 * MAX_JSON_DEPTH   # nesting levels of a request body: a deepest schema and its place in the body
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_LOGPROB_FLOOR = -9999.0    # JSON has no -inf; vLLM clamps the same way

# Fields accepted only while they say "not used" (null, false, empty): anything else is a 400.
_UNSUPPORTED = {"functions", "function_call",
                "suffix", "best_of", "guided_decoding_backend",
                "audio", "modalities", "prediction", "reasoning_effort", "web_search_options",
                "metadata", "store", "service_tier", "continue_final_message", "documents"}
_WHY_UNSUPPORTED = {
    "suffix": "'suffix' (fill-in-the-middle insertion) is not supported by this server; put the "
              "whole text in 'prompt'",
}
MAX_LOGIT_BIAS = 300        # entries of logit_bias (OpenAI's limit)
_SAMPLING_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p",
                    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop",
                    "stop_token_ids", "ignore_eos", "n", "stream", "stream_options", "user",
                    "min_tokens", "skip_special_tokens", "include_stop_str_in_output",
                    "parallel_tool_calls", "request_id", "logit_bias", "response_format",
                    "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                    "guided_whitespace_pattern", "structured_outputs", "prompt_logprobs"}
COMPLETION_FIELDS = _SAMPLING_FIELDS | {"prompt", "logprobs", "echo", "add_special_tokens"}
CHAT_FIELDS = _SAMPLING_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                                  "add_generation_prompt", "chat_template", "add_special_tokens",
                                  "chat_template_kwargs", "tools", "tool_choice", "reasoning_effort"}
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


class ApiError(Exception):
    """An error answered in OpenAI's shape {"error": {"message", "type", "param", "code"}}."""

    _TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
              405: "invalid_request_error", 408: "timeout_error", 411: "invalid_request_error",
              413: "invalid_request_error", 429: "rate_limit_error",
              500: "internal_server_error", 501: "invalid_request_error",
              503: "service_unavailable_error"}

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | int | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = status if code is None else code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self._TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


# ---- JSON and scalar fields ------------------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(body: bytes) -> dict:
    """The request body as a JSON object; anything else (bad UTF-8, NaN, 10^5 digits) is a 400."""
    try:
        text = body.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise bad(f"request body is nested deeper than {MAX_BODY_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as e:   # JSONDecodeError is a ValueError
        raise bad(f"request body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise bad("request body must be a JSON object")
    # fewer brackets than the limit cannot nest deeper than it: most bodies skip the walk
    if body.count(b"[") + body.count(b"{") > MAX_BODY_DEPTH and nested_deeper_than(value, MAX_BODY_DEPTH):
        raise bad(f"request body is nested deeper than {MAX_BODY_DEPTH} levels")
    if _SURROGATE_ESCAPE.search(body) and not _all_text_encodable(value):
        raise bad("request body has a string with an unpaired UTF-16 surrogate (\\uD800-\\uDFFF)")
    return value


# Unpaired surrogates can only arrive as \uD8xx-style escapes (raw UTF-8 cannot carry them); the
# tokenizer and the response encoder both reject them, so they are refused up front.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _all_text_encodable(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _is_int(x: Any) -> bool:
    """An integer as JSON Schema counts them: 3 and 3.0 alike (pydantic, under vLLM, takes both)."""
    return (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and x.is_integer())


def _is_num(x: Any) -> bool:
    return (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and math.isfinite(x))


def get_int(body: dict, name: str, lo: int, hi: int, default: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v) or not lo <= v <= hi:
        raise bad(f"'{name}' must be an integer in [{lo}, {hi}], got {_show(v)}", name)
    return int(v)


def get_float(body: dict, name: str, lo: float, hi: float, default: float | None = None,
              lo_open: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v) or not (lo < v if lo_open else lo <= v) or not v <= hi:
        left = "(" if lo_open else "["
        raise bad(f"'{name}' must be a number in {left}{lo}, {hi}], got {_show(v)}", name)
    return float(v)


def get_bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be a boolean, got {_show(v)}", name)
    return v


def _show(v: Any) -> str:
    s = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


show = _show


def check_fields(body: dict, allowed: set[str]) -> None:
    for name, value in body.items():
        if name in allowed:
            continue
        if name in _UNSUPPORTED:
            if value in (None, False, [], {}, ""):
                continue
            raise bad(_WHY_UNSUPPORTED.get(name, f"'{name}' is not supported by this server"), name)
        raise bad(f"unrecognized request argument '{_show(name)[1:-1]}'", name)


# ---- the serving context and a prepared request ----------------------------------------

class TokenizeSlots:
    """At most `limit` long texts tokenized at once (the tokenizer runs off the GIL but on a
    core): a caller waits up to `wait` seconds for a slot, then gets a 503 with Retry-After."""

    LONG_TEXT = 1 << 16      # characters; shorter texts take no slot (microseconds of work)

    def __init__(self, limit: int, retry_after: int = 1, wait: float = 5.0):
        self._sem = threading.BoundedSemaphore(max(1, limit))
        self.retry_after, self.wait = retry_after, wait

    def __enter__(self) -> "TokenizeSlots":
        if not self._sem.acquire(timeout=self.wait):
            raise ApiError(503, "the server is busy tokenizing other long prompts; retry later",
                           code="tokenizer_busy", headers={"Retry-After": str(self.retry_after)})
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sem.release()


def max_token_bytes(tokenizer: Any) -> int | None:
    """The most bytes of text one token can stand for, or None when no such bound holds
    (see Tokenizer.max_bytes_per_token)."""
    fn = getattr(tokenizer, "max_bytes_per_token", None)
    try:
        return fn() if callable(fn) else None
    except Exception:
        return None


def system_fingerprint(info: dict) -> str:
    """fp_<10 hex>: changes when the server version, model, dtype or kernel variant does."""
    from lite_llm import __version__
    key = "|".join(str(x) for x in (__version__, info.get("model_name"), info.get("dtype"),
                                    info.get("kernel_variant"), info.get("weight_bytes")))
    return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class ServingContext:
    """What validation needs to know about the model being served."""
    model_names: tuple[str, ...]          # the first is the default and the one reported
    max_model_len: int
    vocab_size: int
    tokenizer: Any                        # encode/decode/convert_ids_to_tokens/apply_chat_template
    generation_defaults: dict = field(default_factory=dict)  # SamplingParams kwargs (generation_config.json)
    chat_template: str | None = None      # --chat-template, overriding the model's
    trust_request_chat_template: bool = False   # --trust-request-chat-template: clients may send one
    max_token_bytes: int | None = None    # bytes of text one token can stand for (None: unbounded)
    tokenize_slots: Any = None            # TokenizeSlots, or None for no cap
    reasoning_parser: str | None = None   # --reasoning-parser: "deepseek_r1" | "qwen3" | None
    tool_parser: str | None = None        # --tool-call-parser: one of TOOL_PARSERS | None
    system_fingerprint: str | None = None
    loras: Any = None                     # lora.LoRAManager (`name in loras`) under --enable-lora
    mm_processor: Any = None              # multimodal.Processor of a model that takes images, else None
    media: Any = None                     # multimodal.MediaConfig: image limits and allowed hosts
    default_max_tokens: int | None = None  # --default-max-tokens: output cap of a request naming none

    def tool_parser_of(self, template: str | None = None) -> str | None:
        """The tool call parser of a chat rendered with template (a request's own, else
        --chat-template, else the model's): --tool-call-parser, else the format the template shows."""
        return self.tool_parser or tool_parser_for(template or self.chat_template
                                                   or getattr(self.tokenizer, "chat_template", None))

    def check_model(self, body: dict) -> str:
        model = body.get("model")
        if model is None:
            return self.model_names[0]
        if not isinstance(model, str):
            raise bad("'model' must be a string", "model")
        if model not in self.model_names and not (self.loras is not None and model in self.loras):
            raise ApiError(404, f"The model '{_show(model)[1:-1]}' does not exist.", "model",
                           code="model_not_found")
        return model


@dataclass(frozen=True)
class Prompt:
    text: str | None
    token_ids: list[int]
    mm: Any = None                    # the prompt's images (multimodal.MMPrompt), placeholders expanded


@dataclass(frozen=True)
class PreparedRequest:
    """A validated /v1/completions or /v1/chat/completions call, ready for engine.add_request."""
    kind: str                         # "completion" | "chat"
    id: str                           # cmpl-... / chatcmpl-...
    created: int
    model: str
    prompts: list[Prompt]
    params: SamplingParams
    stream: bool
    include_usage: bool
    continuous_usage: bool = False    # vLLM's stream_options.continuous_usage_stats: usage on every chunk
    echo: bool = False
    prompt_logprobs: int | None = None    # vLLM's prompt_logprobs field: returned beside the choices
    logprobs: int | None = None       # top logprobs asked per token; None = no logprobs in the answer
    reasoning_parser: str | None = None   # chat only: split <think>...</think> into reasoning_content
    tool_parser: str | None = None        # chat with tools: a TOOL_PARSERS name (make_tool_parser)
    max_tool_calls: int | None = None     # parallel_tool_calls false: 1 (later calls dropped)
    named_tool: bool = False              # tool_choice named a function: OpenAI finishes with "stop"
    forced_tools: bool = False            # tool_choice required or named: the whole answer is calls
    system_fingerprint: str | None = None
    # Server-made part of every engine request id: the client's request_id names the response
    # (id), never an engine request alone, so two requests naming the same one both run and
    # neither can refuse, see or abort the other (vLLM adds a random suffix the same way).
    scope: str = field(default_factory=lambda: uuid.uuid4().hex)

    def engine_request_id(self, prompt_index: int) -> str:
        return f"{self.id}-{prompt_index}-{self.scope}"


def _sampling_kwargs(body: dict, ctx: ServingContext) -> dict:
    """SamplingParams kwargs from the body, defaults from the model's generation_config."""
    kw: dict[str, Any] = {}
    defaults = ctx.generation_defaults
    vals = {
        "temperature": get_float(body, "temperature", 0.0, 1e6),
        "top_p": get_float(body, "top_p", 0.0, 1.0, lo_open=True),
        "top_k": get_int(body, "top_k", -1, 2 ** 31 - 1),
        "min_p": get_float(body, "min_p", 0.0, 1.0),
        "repetition_penalty": get_float(body, "repetition_penalty", 0.0, 1e6, lo_open=True),
    }
    for name, v in vals.items():
        v = defaults.get(name) if v is None else v
        if v is not None:
            kw[name] = v
    if kw.get("top_k") == -1:
        kw["top_k"] = 0
    for name in ("presence_penalty", "frequency_penalty"):
        v = get_float(body, name, -2.0, 2.0)
        if v is not None:
            kw[name] = v
    seed = get_int(body, "seed", _INT64_MIN, _INT64_MAX)
    if seed is not None:
        kw["seed"] = seed
    kw["n"] = get_int(body, "n", 1, MAX_N, 1)
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if (not isinstance(stop, list) or len(stop) > MAX_STOP
                or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LEN for s in stop)):
            raise bad(f"'stop' must be a non-empty string or a list of at most {MAX_STOP} "
                      f"non-empty strings of at most {MAX_STOP_LEN} characters", "stop")
        if stop:
            kw["stop"] = stop
    ids = body.get("stop_token_ids")
    if ids is not None:
        kw["stop_token_ids"] = _token_ids(ids, ctx.vocab_size, "stop_token_ids", allow_empty=True)
    kw["ignore_eos"] = get_bool(body, "ignore_eos", False)
    kw["min_tokens"] = get_int(body, "min_tokens", 0, ctx.max_model_len, 0)
    kw["skip_special_tokens"] = get_bool(body, "skip_special_tokens", True)
    kw["include_stop_str_in_output"] = get_bool(body, "include_stop_str_in_output", False)
    bias = body.get("logit_bias")
    if bias is not None:
        kw["logit_bias"] = _logit_bias(bias, ctx.vocab_size)
    prompt_logprobs = get_int(body, "prompt_logprobs", 0, MAX_LOGPROBS)
    if prompt_logprobs is not None:
        if get_bool(body, "stream", False):
            raise bad("'prompt_logprobs' is not supported when streaming; ask without 'stream'",
                      "prompt_logprobs")
        kw["prompt_logprobs"] = prompt_logprobs
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad("'user' must be a string", "user")
    if "parallel_tool_calls" in body and body["parallel_tool_calls"] is not None \
            and not isinstance(body["parallel_tool_calls"], bool):
        raise bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    structured = structured_outputs(body)
    if structured is not None:
        kw["structured_outputs"] = structured
    return kw


_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}
_STRUCTURED_KEYS = {"json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace",
                    "disable_additional_properties", "whitespace_pattern"}


def structured_outputs(body: dict) -> StructuredOutputsParams | None:
    """The output constraint of a body: OpenAI's response_format (json_object, json_schema),
    vLLM's guided_json / guided_regex / guided_choice / guided_grammar, or its
    structured_outputs object. At most one of them; the grammar itself is compiled and checked
    by the engine (a bad one is a 400 there)."""
    found: list[tuple[str, dict]] = []
    rf = body.get("response_format")
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "text" and set(rf) == {"type"}:
            pass
        elif kind == "json_object" and set(rf) == {"type"}:
            found.append(("response_format", {"json_object": True}))
        elif kind == "json_schema" and set(rf) <= {"type", "json_schema"}:
            js = rf.get("json_schema")
            if not isinstance(js, dict) or set(js) - {"name", "schema", "strict", "description"} \
                    or not isinstance(js.get("name", ""), str) \
                    or js.get("strict") not in (None, True, False):
                raise bad("'response_format.json_schema' must be {\"name\": str, \"schema\": object, "
                          "\"strict\": bool, \"description\": str}", "response_format.json_schema")
            schema = js.get("schema", {})
            if not isinstance(schema, (dict, bool)):
                raise bad("'response_format.json_schema.schema' must be a JSON schema object",
                          "response_format.json_schema.schema")
            found.append(("response_format", {"json": strict_schema(schema) if js.get("strict") else schema}))
        else:
            raise bad("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                      "{\"type\": \"json_schema\", \"json_schema\": {...}}", "response_format")
    for name, key in _GUIDED.items():
        value = body.get(name)
        if value is not None:
            found.append((name, {key: value}))
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict) or set(so) - _STRUCTURED_KEYS:
            raise bad(f"'structured_outputs' must be an object with keys among "
                      f"{', '.join(sorted(_STRUCTURED_KEYS))}", "structured_outputs")
        found.append(("structured_outputs", dict(so)))
    if not found:
        return None
    if len(found) > 1:
        raise bad(f"give at most one output constraint; got {', '.join(n for n, _ in found)}", found[1][0])
    name, kwargs = found[0]
    pattern = body.get("guided_whitespace_pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise bad("'guided_whitespace_pattern' must be a string", "guided_whitespace_pattern")
        kwargs.setdefault("whitespace_pattern", pattern)
    try:
        return StructuredOutputsParams(**kwargs)
    except (ValueError, TypeError) as e:
        raise bad(f"'{name}': {e}", name) from None


def _logit_bias(value: Any, vocab_size: int) -> dict[int, float]:
    """{"token id": bias in [-100, 100]} (JSON keys are strings) -> {id: bias}."""
    if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS:
        raise bad(f"'logit_bias' must be an object of at most {MAX_LOGIT_BIAS} token ids -> numbers",
                  "logit_bias")
    out = {}
    for key, v in value.items():
        if not (isinstance(key, str) and 0 < len(key) <= 10 and key.isascii() and key.isdigit()
                and int(key) < vocab_size):
            raise bad(f"'logit_bias' keys must be token ids in [0, {vocab_size}), got {_show(key)}",
                      "logit_bias")
        if not _is_num(v) or not -100 <= v <= 100:
            raise bad(f"'logit_bias' values must be numbers in [-100, 100], got {_show(v)}", "logit_bias")
        if v:
            out[int(key)] = float(v)
    return out


def _token_ids(value: Any, vocab_size: int, name: str, allow_empty: bool = False) -> list[int]:
    if (not isinstance(value, list) or (not value and not allow_empty)
            or not all(_is_int(t) and 0 <= t < vocab_size for t in value)):
        raise bad(f"'{name}' must be a {'' if allow_empty else 'non-empty '}list of token ids "
                  f"in [0, {vocab_size})", name)
    return [int(t) for t in value]


def _stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous usage): vLLM's continuous_usage_stats puts the usage so far on
    every chunk, and only with include_usage (alone it asks for nothing, as vLLM)."""
    opts = body.get("stream_options")
    if opts is None:
        return False, False
    if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
        raise bad("'stream_options' must be an object with 'include_usage' (and vLLM's "
                  "'continuous_usage_stats')", "stream_options")
    if not stream:
        raise bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    flags = []
    for name in ("include_usage", "continuous_usage_stats"):
        value = opts.get(name)
        if value is not None and not isinstance(value, bool):
            raise bad(f"'stream_options.{name}' must be a boolean", f"stream_options.{name}")
        flags.append(bool(value))
    include_usage, continuous = flags
    return include_usage, include_usage and continuous


def _max_tokens(requested: int | None, prompt_len: int, ctx: ServingContext,
                default: int | None) -> int:
    """max_tokens within the context window; prompt + max_tokens beyond it is a 400 (as vLLM).
    None asked: the room the prompt leaves, at most the route's default (completions: 16), the
    model's generation_config max_new_tokens and the server's --default-max-tokens."""
    room = ctx.max_model_len - prompt_len
    if requested is not None:
        if prompt_len + requested > ctx.max_model_len:
            raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens. However, "
                      f"you requested {prompt_len + requested} tokens ({prompt_len} in the prompt, "
                      f"{requested} in the completion). Please reduce the prompt or max_tokens.",
                      "max_tokens")
        return requested
    if room < 1:
        raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens; the prompt "
                  f"has {prompt_len} tokens, which leaves no room for a completion.", "prompt")
    gen_default = ctx.generation_defaults.get("max_tokens")
    candidates = [room] + [d for d in (default, gen_default, ctx.default_max_tokens) if d]
    return min(candidates)


def _new_id(prefix: str, body: dict) -> str:
    """cmpl-<hex>, or cmpl-<request_id> when the client names its request (as vLLM)."""
    rid = body.get("request_id")
    if rid is None:
        return f"{prefix}-{uuid.uuid4().hex}"
    if not isinstance(rid, str) or not 0 < len(rid) <= 128 or not rid.isprintable():
        raise bad("'request_id' must be a printable string of 1 to 128 characters", "request_id")
    return f"{prefix}-{rid}"


def _common_fields(body: dict, ctx: ServingContext, allowed) -> tuple[str, bool, tuple[bool, bool], dict]:
    """What completions and chat read alike: (model, stream, (include_usage, continuous usage),
    sampling kwargs), after checking that every field of the body is one of `allowed`."""
    check_fields(body, allowed)
    model = ctx.check_model(body)
    stream = get_bool(body, "stream", False)
    return model, stream, _stream_options(body, stream), _sampling_kwargs(body, ctx)


# ---- /v1/completions --------------------------------------------------------------------

def prepare_completion(body: dict, ctx: ServingContext) -> PreparedRequest:
    model, stream, (include_usage, continuous_usage), kw = _common_fields(body, ctx, COMPLETION_FIELDS)
    logprobs = get_int(body, "logprobs", 0, MAX_LOGPROBS)
    echo = get_bool(body, "echo", False)
    if echo and logprobs is not None:      # the prompt's tokens come with their logprobs too
        kw["prompt_logprobs"] = max(logprobs, kw.get("prompt_logprobs") or 0)
        if stream:
            raise bad("'echo' with 'logprobs' is not supported when streaming (the prompt's logprobs "
                      "come after its prefill); ask without 'stream'", "echo")
    add_special = get_bool(body, "add_special_tokens", True)
    prompts = _completion_prompts(body.get("prompt"), ctx, add_special)
    if len(prompts) * kw["n"] > MAX_COMPLETIONS:
        raise bad(f"at most {MAX_COMPLETIONS} completions (prompts x n) per request", "n")
    requested = get_int(body, "max_tokens", 1, 2 ** 31 - 1)
    # One SamplingParams for every prompt: max_tokens must fit the longest one.
    longest = max(len(p.token_ids) for p in prompts)
    kw["max_tokens"] = _max_tokens(requested, longest, ctx, default=16)
    if logprobs is not None:
        kw["logprobs"] = logprobs
    params = _sampling_params(kw)
    return PreparedRequest("completion", _new_id("cmpl", body), int(time.time()), model, prompts,
                           params, stream, include_usage, continuous_usage, echo=echo, logprobs=logprobs,
                           prompt_logprobs=get_int(body, "prompt_logprobs", 0, MAX_LOGPROBS),
                           system_fingerprint=ctx.system_fingerprint)


def _completion_prompts(prompt: Any, ctx: ServingContext, add_special: bool) -> list[Prompt]:
    """prompt: a string, a list of strings, a list of token ids or a list of lists of ids."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise bad("'prompt' must be a string, a list of strings, a list of token ids or a list "
                  "of lists of token ids (non-empty)", "prompt")
    if len(items) > MAX_PROMPTS:
        raise bad(f"at most {MAX_PROMPTS} prompts per request", "prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            ids = _encode(ctx, item, add_special_tokens=add_special)
            text = item
        elif isinstance(item, list):
            ids = _token_ids(item, ctx.vocab_size, "prompt")
            text = None
        else:
            raise bad("'prompt' list items must all be strings or all lists of token ids", "prompt")
        if not ids:
            raise bad("the prompt is empty (no tokens)", "prompt")
        if len(ids) >= ctx.max_model_len:
            raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens; the "
                      f"prompt has {len(ids)} tokens.", "prompt")
        out.append(Prompt(text, list(ids)))
    return out


def check_prompt_size(ctx: ServingContext, text: str, param: str = "prompt") -> None:
    """Refuse, before tokenizing it, a text that cannot fit the context window.

    A token stands for at most ctx.max_token_bytes bytes of text, so a text of B bytes yields
    at least ceil(B / max_token_bytes) tokens: beyond max_model_len - 1 of them (the prompt must
    leave room for one generated token) it is refused without the tokenizer seeing it. The
    character count is a free lower bound on the byte count, checked first."""
    per_token = ctx.max_token_bytes
    if not per_token:
        return
    limit = per_token * (ctx.max_model_len - 1)     # the most bytes a prompt that fits can have
    size = len(text)
    if size <= limit // 4:                          # 4 bytes a character at most: fits for sure
        return
    if size <= limit:
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        at_least = -(-size // per_token)
        raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens; the "
                  f"{'prompt' if param == 'prompt' else 'rendered messages'} of {size} bytes has at "
                  f"least {at_least} tokens (a token is at most {per_token} bytes).", param)


def _encode(ctx: ServingContext, text: str, add_special_tokens: bool, param: str = "prompt") -> list[int]:
    check_prompt_size(ctx, text, param)
    slots = ctx.tokenize_slots if len(text) >= TokenizeSlots.LONG_TEXT else None
    try:
        if slots is None:
            return list(ctx.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        with slots:
            return list(ctx.tokenizer.encode(text, add_special_tokens=add_special_tokens))
    except ApiError:
        raise
    except Exception as e:        # the tokenizer refusing a text is the text's fault
        raise bad(f"cannot tokenize the prompt: {e}", param) from None


def _sampling_params(kw: dict) -> SamplingParams:
    try:
        return SamplingParams(**kw)
    except (ValueError, TypeError) as e:
        raise bad(str(e), str(e).split(" ", 1)[0] if str(e) else None) from None


# ---- /v1/chat/completions ---------------------------------------------------------------

def prepare_chat(body: dict, ctx: ServingContext, pixels: list[int] | None = None) -> PreparedRequest:
    """pixels: the decoded pixels of each image the request holds, filled as its images are
    decoded (a batch passes one list for all its conversations: its images share one bound)."""
    model, stream, (include_usage, continuous_usage), kw = _common_fields(body, ctx, CHAT_FIELDS)
    want_logprobs = get_bool(body, "logprobs", False)
    top = get_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and top > 0 and not want_logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    logprobs = (top or 0) if want_logprobs else None
    images: list = []
    messages = parse_messages(body.get("messages"), images, ctx, pixels)
    add_generation_prompt = get_bool(body, "add_generation_prompt", True)
    template = _request_template(body, ctx)
    template_kwargs = _template_kwargs(body)
    tools, tool_choice = _tools(body)
    tool_parser = None
    parallel = body.get("parallel_tool_calls") is not False
    forced = tool_choice == "required" or isinstance(tool_choice, dict)
    if tools and tool_choice != "none":
        tool_parser = ctx.tool_parser_of(template)
        if tool_parser is None and not forced:
            raise bad("'tools' with tool_choice \"auto\" need a tool call parser: start the server with "
                      "--tool-call-parser (this model's chat template shows no known tool call format)", "tools")
        # a forced answer follows the server's own grammar, so needs no parser: without one it is
        # vLLM's JSON list of calls
        tool_parser = tool_parser or "forced_json"
        template_kwargs = {**template_kwargs, "tools": tools}
        if forced:
            if "structured_outputs" in kw:
                raise bad("'tool_choice' \"required\" or a named function cannot be combined with an "
                          "output constraint (response_format, guided_*)", "tool_choice")
            try:
                kw["structured_outputs"] = forced_tool_calls(tool_parser, tools, tool_choice, parallel, ctx.tokenizer)
            except ValueError:      # the grammar holding every tool's schema is over its size cap
                raise bad(f"'tools' are too large for a forced tool call (their grammar would be longer than "
                          f"{MAX_GRAMMAR_BYTES} bytes)", "tools") from None
    if harmony.in_use(ctx.reasoning_parser, tool_parser):   # the parsers read harmony's special tokens
        kw["skip_special_tokens"] = False
    text = render_chat(ctx, messages, add_generation_prompt, template, template_kwargs)
    # The template already places BOS and friends: no second BOS (vLLM's default for chat).
    ids = _encode(ctx, text, add_special_tokens=get_bool(body, "add_special_tokens", False),
                  param="messages")
    if not ids:
        raise bad("the rendered chat prompt is empty (no tokens)", "messages")
    mm = None
    if images:   # each image's placeholder becomes its encoder output's length of tokens
        from lite_llm.multimodal import MediaError
        try:
            ids, mm = ctx.mm_processor.process(list(ids), images, ctx.media)
        except (MediaError, ValueError) as e:
            raise bad(str(e), "messages") from None
    if len(ids) >= ctx.max_model_len:
        raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens; the "
                  f"messages have {len(ids)} tokens.", "messages")
    requested = get_int(body, "max_completion_tokens", 1, 2 ** 31 - 1)
    if requested is None:
        requested = get_int(body, "max_tokens", 1, 2 ** 31 - 1)
    kw["max_tokens"] = _max_tokens(requested, len(ids), ctx, default=None)
    if logprobs is not None:
        kw["logprobs"] = logprobs
    params = _sampling_params(kw)
    return PreparedRequest("chat", _new_id("chatcmpl", body), int(time.time()), model,
                           [Prompt(text, list(ids), mm)], params, stream, include_usage, continuous_usage,
                           logprobs=logprobs, reasoning_parser=ctx.reasoning_parser,
                           tool_parser=tool_parser, max_tool_calls=None if parallel else 1,
                           named_tool=isinstance(tool_choice, dict) and tool_parser is not None,
                           forced_tools=forced and tool_parser is not None,
                           prompt_logprobs=get_int(body, "prompt_logprobs", 0, MAX_LOGPROBS),
                           system_fingerprint=ctx.system_fingerprint)


def _tools(body: dict) -> tuple[list[dict] | None, str | dict]:
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
            raise bad(f"'tool_choice' names the function '{_show(fn['name'])[1:-1]}', which is not in 'tools'",
                      "tool_choice")
        return out, {"name": fn["name"]}
    if choice not in ("auto", "none", "required"):
        raise bad("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                  "\"function\": {\"name\": ...}}", "tool_choice")
    return out, choice


TOOL_PARSERS = ("hermes", "llama3_json", "mistral", "openai")
# parsers of their own modules, by name: --reasoning-parser's beside <think> (ReasoningSplitter),
# --tool-call-parser's beside make_tool_parser's own
REASONING_PARSER_CLASSES = {"openai_gptoss": harmony.HarmonyReasoningSplitter}
TOOL_PARSER_CLASSES = {"openai": harmony.HarmonyToolParser}
MAX_FORCED_CALLS = 8        # calls a forced answer may hold: a model repeating calls ends there


def tool_parser_for(template: str | None) -> str | None:
    """The tool call format a chat template teaches its model, where unambiguous."""
    if not template:
        return None
    found = [name for name, marks in (("hermes", ("<tool_call>",)),              # Hermes, Qwen2.5, Qwen3
                                      ("mistral", ("[TOOL_CALLS]",)),            # Mistral
                                      ("llama3_json", ("<|python_tag|>", "ipython")),   # Llama 3.1-3.3
                                      ("openai", ("<|channel|>",)))                # gpt-oss's harmony
             if any(m in template for m in marks)]
    return found[0] if len(found) == 1 else None


# keywords whose value is a schema, a list of schemas, or a mapping of names to schemas
_SUBSCHEMA = ("items", "additionalItems", "additionalProperties", "not", "if", "then", "else", "contains",
              "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def strict_schema(schema: Any) -> Any:
    """schema as OpenAI's strict mode reads it: every object closed ("additionalProperties":
    false) with all its properties required, at any depth."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = strict_schema(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strict_schema(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: strict_schema(s) for name, s in out[key].items()}
    kind = out.get("type")
    if kind == "object" or (isinstance(kind, list) and "object" in kind) or isinstance(out.get("properties"), dict):
        out["additionalProperties"] = False
        if isinstance(out.get("properties"), dict):
            out["required"] = list(out["properties"])
    return out


_DATA_KEYS = ("const", "enum", "default", "examples")      # values there are data, not schemas


def _hoist_defs(params: Any, prefix: str, defs: dict) -> Any:
    """params with its "$defs" / "definitions" moved into defs under prefix + their name, and its
    local references ("#/$defs/...", "#/definitions/...", "#") rewritten to point there: inside a
    call's schema the parameters are no longer the root a "#/..." reference is resolved from
    (Pydantic models with nested models give such schemas)."""
    refs_root = isinstance(params, dict) and '"#"' in json.dumps(params)
    if not isinstance(params, dict) or not (refs_root or any(k in params for k in ("$defs", "definitions"))):
        return params

    def move(node: Any) -> Any:
        if isinstance(node, list):
            return [move(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                for head in ("#/$defs/", "#/definitions/"):
                    if value.startswith(head):
                        value = "#/$defs/" + prefix + value[len(head):]
                if value == "#":
                    value = "#/$defs/" + prefix.rstrip("_")
            out[key] = value if key in _DATA_KEYS else move(value)
        return out

    root = move(params)
    for key in ("$defs", "definitions"):
        for name, sub in (root.pop(key, None) or {}).items():
            defs[prefix + name] = sub
    if refs_root:
        defs[prefix.rstrip("_")] = root
    return root


def _call_schema(fn: dict, arguments_key: str, defs: dict | None = None, prefix: str = "") -> dict:
    params = fn.get("parameters") or {"type": "object"}
    params = strict_schema(params) if fn.get("strict") else params
    if defs is not None:
        params = _hoist_defs(params, prefix, defs)
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, arguments_key: params},
            "required": ["name", arguments_key], "additionalProperties": False}


def forced_tool_calls(parser: str, tools: list[dict], choice: str | dict, parallel: bool,
                      tokenizer: Any = None) -> StructuredOutputsParams:
    """A grammar whose every output is one call of the named tool, or (tool_choice "required")
    one or, if parallel, 1 to MAX_FORCED_CALLS calls of the tools, in the parser's format
    ("forced_json": vLLM's [{"name", "parameters"}, ...]), arguments valid against the
    function's parameters schema (as strict mode reads it for a tool with "strict": true)."""
    named = isinstance(choice, dict)
    fns = [t["function"] for t in tools if not named or t["function"]["name"] == choice["name"]]
    key = "parameters" if parser in ("llama3_json", "forced_json") else "arguments"
    defs: dict = {}         # the tools' own definitions, at the root where references resolve
    schemas = [_call_schema(fn, key, defs, f"tool{i}_") for i, fn in enumerate(fns)]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    many = parallel and not named
    if parser == "openai":      # harmony: one message to the function, its arguments the body
        return StructuredOutputsParams(grammar=harmony.forced_call_grammar(fns, schemas, defs, tokenizer))
    if parser == "forced_json":
        return StructuredOutputsParams(json={"type": "array", "items": schema, "minItems": 1,
                                             "maxItems": MAX_FORCED_CALLS if many else 1,
                                             **({"$defs": defs} if defs else {})})
    schema = {**schema, "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False},
              **({"$defs": defs} if defs else {})}
    body = "%json " + json.dumps(schema)

    def calls(one: str, sep: str) -> str:
        return f'{one} ({sep} {one}){{0,{MAX_FORCED_CALLS - 1}}}' if many else one

    if parser == "hermes":
        rules = ["start: " + calls("call", '"\\n"'),
                 'call: "<tool_call>\\n" body "\\n</tool_call>"']
    elif parser == "llama3_json":
        rules = ["start: " + calls("body", '"; "')]
    else:
        # [TOOL_CALLS] is a special token in Mistral's vocabularies: named by id, text cannot make it
        tid = tokenizer.token_to_id("[TOOL_CALLS]") if tokenizer is not None else None
        head = f"<[{tid}]>" if tid is not None else '"[TOOL_CALLS]"'
        rules = [f'start: {head} "[" ' + calls("body", '", "') + ' "]"']
    return StructuredOutputsParams(grammar="\n".join(rules + ["body: " + body]) + "\n")


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
                raise bad(f"'{where}.{_show(key)[1:-1]}' is not supported", f"{where}.{key}"[:80])
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
                    what = f"content part type '{_show(kind)[1:-1]}' is not supported" \
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
    from lite_llm.multimodal import MediaError, image_of_part
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


def _request_template(body: dict, ctx: ServingContext) -> str | None:
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


def _template_kwargs(body: dict) -> dict:
    """chat_template_kwargs: extra variables for the chat template (Qwen3's enable_thinking...);
    a chat's reasoning_effort reaches it as reasoning_effort (gpt-oss's template reads it; "none"
    also turns Qwen3-style thinking off), as the Responses API's reasoning.effort does."""
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}", "reasoning_effort")
    kw = body.get("chat_template_kwargs")
    if effort is not None:
        return {"reasoning_effort": effort, **({"enable_thinking": False} if effort == "none" else {}),
                **(_template_kwargs({"chat_template_kwargs": kw}) if kw is not None else {})}
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


# ---- engine outputs -> response bodies ----------------------------------------------------

class ReasoningSplitter:
    """Splits a chat answer's text, delta by delta, into (reasoning, content) at <think> tags.

    deepseek_r1: the template opened the thinking, so the output starts inside it (an opening
    <think> is dropped) until </think>; without a </think> it is all reasoning. qwen3: the
    output is thinking only when it opens with <think> (Qwen3 with enable_thinking=False
    answers directly). A tag split across deltas is held back until it is whole.
    """
    START, END = "<think>", "</think>"

    def __new__(cls, parser: str):
        other = REASONING_PARSER_CLASSES.get(parser)
        return object.__new__(cls) if other is None else other(parser)

    def __init__(self, parser: str):
        self.starts_inside = parser == "deepseek_r1"
        self.state = "start"      # -> "reasoning" -> "content"
        self.buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        self.buf += text
        reasoning = content = ""
        if self.state == "start":
            head = self.buf.lstrip()
            if head.startswith(self.START):
                self.buf, self.state = head[len(self.START):], "reasoning"
            elif self.START.startswith(head) and not final:
                return "", ""       # may still become <think>
            else:
                self.state = "reasoning" if self.starts_inside else "content"
        if self.state == "reasoning":
            end = self.buf.find(self.END)
            if end >= 0:
                reasoning, self.buf = self.buf[:end], self.buf[end + len(self.END):]
                self.state = "content"
            else:
                keep = 0 if final else _partial_suffix(self.buf, self.END)
                reasoning, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        if self.state == "content":
            content, self.buf = self.buf, ""
        return reasoning, content


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of text that begins tag (and so may complete it later)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class HermesToolParser:
    """<tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Hermes, Qwen2.5, Qwen3)
    -> OpenAI tool calls, delta by delta: text outside the blocks is content as written (the text
    before a call keeps its trailing whitespace, as vLLM's hermes parser), except a stretch of
    whitespace alone before, between or after calls: it is held back until text follows it and
    dropped if a call does or the answer ends after one, so the same answer gives the same
    content whatever its deltas, streamed or whole. A tag split across deltas is held back, a
    closed block that is not a JSON call stays content as it was written. A block still open at
    the end is a call if its JSON is whole, else dropped (cut off by max_tokens: markup that
    opened a call is never content). forced: the answer is calls only (a forced tool_choice),
    so nothing in it is content."""
    START, END = "<tool_call>", "</tool_call>"

    def __init__(self, forced: bool = False) -> None:
        self.buf = ""
        self.inside = False
        self.num_calls = 0
        self.forced = forced
        self.blank = ""         # whitespace since the start or the last call, no text after it yet
        self.spoke = False      # text since the start or the last call

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        self.buf += text
        content, calls = "", []

        def say(piece: str) -> None:
            nonlocal content
            if self.forced:
                return
            if not self.spoke:
                self.blank += piece
                if not self.blank.strip():
                    return
                piece, self.blank, self.spoke = self.blank, "", True
            content += piece

        while True:
            if not self.inside:
                at = self.buf.find(self.START)
                if at >= 0:
                    say(self.buf[:at])
                    self.buf, self.inside = self.buf[at + len(self.START):], True
                    continue
                keep = 0 if final else _partial_suffix(self.buf, self.START)
                say(self.buf[:len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                break
            end = self.buf.find(self.END)
            if end < 0 and not final:
                break
            block = self.buf if end < 0 else self.buf[:end]
            self.buf = "" if end < 0 else self.buf[end + len(self.END):]
            self.inside = False
            call = _parse_tool_call(block)
            if call is None:
                if end >= 0:
                    say(self.START + block + self.END)
            else:
                call["index"] = self.num_calls + len(calls)
                calls.append(call)
                self.blank, self.spoke = "", False
            if end < 0:
                break
        self.num_calls += len(calls)
        if final and self.blank and not self.num_calls:     # an answer of whitespace alone, no call
            content, self.blank = content + self.blank, ""
        return content, calls


class JsonToolParser:
    """Tool calls written as bare JSON at the start of the answer, delta by delta:
    llama3_json: [<|python_tag|>]{"name": ..., "parameters": {...}} (several joined by "; ");
    mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (the special token is dropped
    from the text unless skip_special_tokens is false, so a leading JSON list counts too);
    forced_json: [{"name": ..., "parameters": {...}}, ...], what a forced tool_choice writes
    when no parser is set (vLLM's format).
    An answer that opens that way is held back until it ends and then parsed; if it is not
    valid calls it is content as written, unless its markup (<|python_tag|>, [TOOL_CALLS]) or a
    forced tool_choice says it is calls: then the whole calls before the first broken one are
    kept (cut off by max_tokens) and the rest dropped. Any other answer streams as content."""
    PREFIXES = {"llama3_json": ("<|python_tag|>",), "mistral": ("[TOOL_CALLS]",), "forced_json": ()}

    def __init__(self, parser: str, forced: bool = False) -> None:
        self.parser = parser
        self.buf = ""
        self.forced = forced or parser == "forced_json"
        self.mode: str | None = "calls" if self.forced else None   # None: undecided, "calls": held, "content": streaming
        self.num_calls = 0

    def _opens_calls(self, text: str) -> bool | None:
        """Whether text (stripped of leading whitespace) opens tool calls; None: too short to tell."""
        for prefix in self.PREFIXES[self.parser] + (("{",) if self.parser == "llama3_json" else ("[",)):
            if text.startswith(prefix):
                return True
            if prefix.startswith(text):
                return None
        return False

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        if self.mode == "content":
            return text, []
        self.buf += text
        if self.mode is None:
            opens = self._opens_calls(self.buf.lstrip())
            if opens is None and not final:
                return "", []
            self.mode = "calls" if opens else "content"
            if self.mode == "content":
                out, self.buf = self.buf, ""
                return out, []
        if not final:
            return "", []
        text = self.buf.strip()
        marked = any(text.startswith(p) for p in self.PREFIXES[self.parser])
        calls, whole = self._parse(text)
        if not whole and not (self.forced or marked):
            return self.buf, []
        for i, call in enumerate(calls):
            call["index"] = i
        self.num_calls = len(calls)
        return "", calls

    def _parse(self, text: str) -> tuple[list[dict], bool]:
        """The calls text holds, up to the first that is not one, and whether that was all of it."""
        for prefix in self.PREFIXES[self.parser]:
            if text.startswith(prefix):
                text = text[len(prefix):].strip()
        is_list = self.parser != "llama3_json" and text.startswith("[")
        body, sep = (text[1:], ",") if is_list else (text, ";")
        decoder = json.JSONDecoder()
        calls: list[dict] = []
        at = 0
        while True:
            rest = body[at:].lstrip()
            at = len(body) - len(rest)
            if not rest or (is_list and rest == "]"):       # a list must be closed to be whole
                return calls, bool(calls) and (rest == "]") == is_list
            try:
                value, at = decoder.raw_decode(body, at)
            except (ValueError, RecursionError):     # a model's text: invalid, or nested past the stack
                return calls, False
            call = _call_from(value)
            if call is None:
                return calls, False
            calls.append(call)
            rest = body[at:].lstrip()
            if rest.startswith(sep):
                at = len(body) - len(rest) + 1
            elif rest and not (is_list and rest == "]"):
                return calls, False


class _MaxCalls:
    """Keeps the first max_calls calls of a parser's output (parallel_tool_calls false)."""

    def __init__(self, parser: Any, max_calls: int) -> None:
        self.parser, self.max_calls = parser, max_calls

    @property
    def num_calls(self) -> int:
        return min(self.parser.num_calls, self.max_calls)

    def feed(self, text: str, final: bool = False) -> tuple[str, list[dict]]:
        content, calls = self.parser.feed(text, final)
        return content, [c for c in calls if c["index"] < self.max_calls]


def make_tool_parser(prep: PreparedRequest):
    """The streaming tool call parser of a prepared chat request."""
    parser = HermesToolParser(prep.forced_tools) if prep.tool_parser == "hermes" else \
        TOOL_PARSER_CLASSES[prep.tool_parser](prep.forced_tools) if prep.tool_parser in TOOL_PARSER_CLASSES else \
        JsonToolParser(prep.tool_parser, prep.forced_tools)
    return parser if prep.max_tool_calls is None else _MaxCalls(parser, prep.max_tool_calls)


def _call_from(value: Any) -> dict | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": value["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}


def _parse_tool_call(block: str) -> dict | None:
    try:
        value = json.loads(block.strip())
    except (ValueError, RecursionError):
        return None
    return _call_from(value)


def tool_finish_reason(reason: str | None, num_calls: int, named: bool = False) -> str | None:
    """"tool_calls" when the model stopped after calling tools, except under a named tool_choice,
    where OpenAI answers "stop"."""
    return "tool_calls" if num_calls and reason == "stop" and not named else reason


def wire_finish_reason(reason: str | None) -> str | None:
    """OpenAI's finish reasons only: an aborted request is answered with an error instead."""
    return None if reason == "abort" else reason


@dataclass
class Choice:
    """One completion accumulated from deltas."""
    text: list[str] = field(default_factory=list)
    num_tokens: int = 0
    logprobs: list = field(default_factory=list)     # entries as formatted for this API kind
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list | None = None   # the engine's, for its prompt (RequestOutput.prompt_logprobs)


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE's printable stand-in character -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer: Any, token_id: int, text: str) -> list[int]:
    """The token's raw bytes: a token holding part of a UTF-8 character decodes to U+FFFD, so
    its bytes come from the vocabulary piece (byte-level BPE or sentencepiece <0xNN>)."""
    if "\ufffd" not in text:
        return list(text.encode("utf-8"))
    try:
        piece = tokenizer.convert_ids_to_tokens([token_id])[0]
    except Exception:
        piece = None
    if piece:
        m = _SP_BYTE.fullmatch(piece)
        if m:
            return [int(m.group(1), 16)]
        dec = _byte_level_decoder()
        if all(ch in dec for ch in piece):
            return [dec[ch] for ch in piece]
    return list(text.encode("utf-8"))


def token_text(tokenizer: Any, token_id: int, lp: Logprob | None) -> str:
    if lp is not None and lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _lp(value: float) -> float:
    return max(float(value), _LOGPROB_FLOOR) if not math.isnan(value) else _LOGPROB_FLOOR


def format_logprobs(prep: PreparedRequest, tokenizer: Any, out: CompletionOutput,
                    text_offset: int) -> tuple[Any, int]:
    """Logprobs of one delta in this API's shape; returns (value, text offset after it)."""
    if prep.logprobs is None or out.logprobs is None:
        return None, text_offset
    top_n = prep.logprobs
    if prep.kind == "chat":
        content = []
        for tid, lps in zip(out.token_ids, out.logprobs):
            chosen = lps.get(tid)
            tok = token_text(tokenizer, tid, chosen)
            tops = sorted(lps.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
            content.append({
                "token": tok, "logprob": _lp(chosen.logprob if chosen else -math.inf),
                "bytes": token_bytes(tokenizer, tid, tok),
                "top_logprobs": [{"token": (t := token_text(tokenizer, i, lp)), "logprob": _lp(lp.logprob),
                                  "bytes": token_bytes(tokenizer, i, t)} for i, lp in tops[:top_n]],
            })
        return {"content": content}, text_offset
    tokens, token_lps, tops_out, offsets = [], [], [], []
    for tid, lps in zip(out.token_ids, out.logprobs):
        chosen = lps.get(tid)
        tok = token_text(tokenizer, tid, chosen)
        tokens.append(tok)
        token_lps.append(_lp(chosen.logprob if chosen else -math.inf))
        ranked = sorted(lps.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
        top = {token_text(tokenizer, i, lp): _lp(lp.logprob) for i, lp in ranked[:top_n]}
        if top_n > 0:
            top.setdefault(tok, token_lps[-1])
        tops_out.append(top)
        offsets.append(text_offset)
        text_offset += len(tok)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops_out,
            "text_offset": offsets}, text_offset


def merge_logprobs(kind: str, parts: list) -> Any:
    if not parts:
        return None
    if kind == "chat":
        return {"content": [c for p in parts for c in p["content"]]}
    return {k: [x for p in parts for x in p[k]] for k in ("tokens", "token_logprobs",
                                                          "top_logprobs", "text_offset")}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def final_response(prep: PreparedRequest, choices: dict[int, Choice], tokenizer: Any = None) -> dict:
    """The non-streaming body; choices keyed by the response index (prompt * n + i)."""
    num_gen = sum(c.num_tokens for c in choices.values())
    num_prompt = sum(len(p.token_ids) for p in prep.prompts)
    items = []
    for index in sorted(choices):
        c = choices[index]
        text = "".join(c.text)
        lps = merge_logprobs(prep.kind, c.logprobs) if prep.logprobs is not None else None
        if prep.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            finish = c.finish_reason
            if prep.reasoning_parser:
                reasoning, text = ReasoningSplitter(prep.reasoning_parser).feed(text, final=True)
                message = {"role": "assistant", "content": text, "reasoning_content": reasoning or None}
            if prep.tool_parser:
                content, calls = make_tool_parser(prep).feed(text, final=True)
                for call in calls:
                    del call["index"]
                message["content"] = content or None if calls or prep.forced_tools else content
                if calls:
                    message["tool_calls"] = calls
                finish = tool_finish_reason(finish, len(calls), prep.named_tool)
            items.append({"index": index, "message": message,
                          "logprobs": lps, "finish_reason": finish,
                          "stop_reason": c.stop_reason})
        else:
            if prep.echo:
                prompt = _prompt_text(prep, index)
                if lps is not None and c.prompt_logprobs is not None:
                    lps = _echo_logprobs(prep, tokenizer, index, c.prompt_logprobs, lps, len(prompt))
                text = prompt + text
            item = {"index": index, "text": text, "logprobs": lps,
                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            if prep.prompt_logprobs is not None:
                item["prompt_logprobs"] = wire_prompt_logprobs(c.prompt_logprobs)
            items.append(item)
    body = {"id": prep.id, "object": "chat.completion" if prep.kind == "chat" else "text_completion",
            "created": prep.created, "model": prep.model, "system_fingerprint": prep.system_fingerprint,
            "choices": items, "usage": usage(num_prompt, num_gen)}
    if prep.kind == "chat" and prep.prompt_logprobs is not None:     # vLLM: beside the choices
        body["prompt_logprobs"] = wire_prompt_logprobs(choices[min(choices)].prompt_logprobs if choices else None)
    return body


def wire_prompt_logprobs(entries: list | None) -> list | None:
    """vLLM's prompt_logprobs: per prompt token null (the first) or {"<id>": {"logprob", "rank",
    "decoded_token"}}."""
    if entries is None:
        return None
    return [None if e is None else {str(t): {"logprob": _lp(lp.logprob), "rank": lp.rank,
                                             "decoded_token": lp.decoded_token} for t, lp in e.items()}
            for e in entries]


def _echo_logprobs(prep: PreparedRequest, tokenizer: Any, index: int, entries: list, generated: dict,
                   prompt_chars: int) -> dict:
    """Completions' logprobs with echo: the prompt's tokens first (the first has no logprob),
    then the generated ones, text offsets running over the whole echoed text."""
    ids = prep.prompts[index // prep.params.n].token_ids
    tokens, token_lps, tops, offsets, at = [], [], [], [], 0
    for tid, entry in zip(ids, entries):
        chosen = entry.get(tid) if entry else None
        tok = token_text(tokenizer, tid, chosen)
        tokens.append(tok)
        offsets.append(at)
        at += len(tok)
        if entry is None:
            token_lps.append(None)
            tops.append(None)
            continue
        token_lps.append(_lp(chosen.logprob))
        ranked = sorted(entry.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
        top = {token_text(tokenizer, i, lp): _lp(lp.logprob) for i, lp in ranked[:prep.logprobs]}
        if prep.logprobs:
            top.setdefault(tok, token_lps[-1])
        tops.append(top)
    return {"tokens": tokens + generated["tokens"], "token_logprobs": token_lps + generated["token_logprobs"],
            "top_logprobs": tops + generated["top_logprobs"],
            "text_offset": offsets + [prompt_chars + o for o in generated["text_offset"]]}


def _prompt_text(prep: PreparedRequest, index: int) -> str:
    p = prep.prompts[index // prep.params.n]
    return p.text if p.text is not None else ""


def chunk(prep: PreparedRequest, choices: list[dict], usage_value: dict | None = None) -> dict:
    body = {"id": prep.id,
            "object": "chat.completion.chunk" if prep.kind == "chat" else "text_completion",
            "created": prep.created, "model": prep.model, "system_fingerprint": prep.system_fingerprint,
            "choices": choices}
    if prep.include_usage:
        body["usage"] = usage_value
    return body


def chunk_choice(prep: PreparedRequest, index: int, text: str, logprobs: Any,
                 finish_reason: str | None, stop_reason: Any = None, role: bool = False,
                 reasoning: str = "", tool_calls: list[dict] | None = None) -> dict:
    if prep.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
        if reasoning or tool_calls:
            delta = {**({"reasoning_content": reasoning} if reasoning else {}),
                     **({"content": text} if text else {}),
                     **({"tool_calls": tool_calls} if tool_calls else {})}
        elif finish_reason is not None and not text and not role:
            delta = {}
        return {"index": index, "delta": delta, "logprobs": logprobs,
                "finish_reason": finish_reason, "stop_reason": stop_reason}
    return {"index": index, "text": text, "logprobs": logprobs,
            "finish_reason": finish_reason, "stop_reason": stop_reason}


@dataclass
class StreamTally:
    """What a stream of chunks has counted so far (the access log and usage read it)."""
    num_prompt: int
    num_tokens: int = 0
    aborted: bool = False       # an engine request ended with "abort": the caller says why


def iter_deltas(submitted: list[tuple[str, Any]]) -> Any:
    """(prompt index, delta RequestOutput) over every submitted engine request, in order."""
    for k, (_, stream) in enumerate(submitted):
        for out in stream:
            yield k, out


def stream_chunks(prep: PreparedRequest, deltas: Any, tokenizer: Any, tally: StreamTally) -> Any:
    """The chat.completion.chunk / text_completion chunks (dicts) of a prepared request, from
    its engine deltas: the role (or echo) chunks, a chunk per delta with reasoning split off and
    tool calls parsed, the usage chunk when asked for (with continuous usage, the usage so far
    on every chunk as well). Every API that answers from the chat
    machinery (Responses, Anthropic Messages) reads these chunks; an aborted engine request
    sets tally.aborted and ends the chunks without usage."""
    n = prep.params.n
    num_choices = len(prep.prompts) * n
    generated: dict[int, int] = {}      # response index -> its completion tokens so far

    def so_far(index: int) -> dict | None:
        """vLLM's continuous usage: the choice's prompt and its completion tokens until now."""
        if not prep.continuous_usage:
            return None
        return usage(len(prep.prompts[index // n].token_ids), generated.get(index, 0))

    if prep.kind == "chat":
        for index in range(num_choices):
            yield chunk(prep, [chunk_choice(prep, index, "", None, None, role=True)], so_far(index))
    elif prep.echo:
        for index in range(num_choices):
            yield chunk(prep, [chunk_choice(prep, index, prep.prompts[index // n].text or "", None, None)],
                        so_far(index))
    offsets: dict[int, int] = {}
    splitters: dict[int, ReasoningSplitter] = {}
    tool_parsers: dict[int, Any] = {}
    for k, out in deltas:
        for o in out.outputs:
            if not o.text and not o.token_ids and o.finish_reason is None:
                continue
            index = k * n + o.index
            tally.num_tokens += len(o.token_ids)
            generated[index] = generated.get(index, 0) + len(o.token_ids)
            lps, offsets[index] = format_logprobs(prep, tokenizer, o, offsets.get(index, 0))
            text, reasoning, calls = o.text, "", None
            final = o.finish_reason is not None
            finish = wire_finish_reason(o.finish_reason)
            if prep.reasoning_parser:
                splitter = splitters.setdefault(index, ReasoningSplitter(prep.reasoning_parser))
                reasoning, text = splitter.feed(o.text, final=final)
            if prep.tool_parser:
                parser = tool_parsers.get(index) or tool_parsers.setdefault(index, make_tool_parser(prep))
                text, calls = parser.feed(text, final=final)
                finish = tool_finish_reason(finish, parser.num_calls, prep.named_tool)
            if text or reasoning or calls or lps is not None or finish is not None:
                yield chunk(prep, [chunk_choice(prep, index, text, lps, finish, o.stop_reason,
                                                reasoning=reasoning, tool_calls=calls)], so_far(index))
            if o.finish_reason == "abort":
                tally.aborted = True
    if prep.include_usage and not tally.aborted:
        yield chunk(prep, [], usage(tally.num_prompt, tally.num_tokens))


def sse(value: dict | str) -> bytes:
    data = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                            separators=(",", ":"))
    return f"data: {data}\n\n".encode("utf-8")


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# ---- /tokenize and /detokenize ---------------------------------------------------------------

def tokenize(body: dict, ctx: ServingContext) -> dict:
    check_fields(body, {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                        "return_token_strs", "chat_template", "chat_template_kwargs", "tools"})
    ctx.check_model(body)
    if ("prompt" in body) == ("messages" in body):
        raise bad("give exactly one of 'prompt' or 'messages'", "prompt")
    if "messages" in body:
        template = _request_template(body, ctx)
        tools, _ = _tools({"tools": body.get("tools")})
        kwargs = {**_template_kwargs(body), **({"tools": tools} if tools else {})}
        text = render_chat(ctx, parse_messages(body["messages"]),
                           get_bool(body, "add_generation_prompt", True), template, kwargs)
        param = "messages"
        ids = _encode(ctx, text, add_special_tokens=get_bool(body, "add_special_tokens", False), param=param)
    else:
        if not isinstance(body["prompt"], str):
            raise bad("'prompt' must be a string", "prompt")
        param = "prompt"
        ids = _encode(ctx, body["prompt"],
                                   add_special_tokens=get_bool(body, "add_special_tokens", True))
    # As the generation routes: no more tokens than the context holds (the byte bound of
    # check_prompt_size came first, so the tokenizer never saw a text far beyond it).
    if len(ids) > ctx.max_model_len:
        raise bad(f"This model's maximum context length is {ctx.max_model_len} tokens; the "
                  f"{param} {'have' if param == 'messages' else 'has'} {len(ids)} tokens.", param)
    strs = ctx.tokenizer.convert_ids_to_tokens(ids) if get_bool(body, "return_token_strs", False) else None
    return {"count": len(ids), "max_model_len": ctx.max_model_len, "tokens": list(ids),
            "token_strs": strs}


def detokenize(body: dict, ctx: ServingContext) -> dict:
    check_fields(body, {"model", "tokens"})
    ctx.check_model(body)
    ids = _token_ids(body.get("tokens"), ctx.vocab_size, "tokens", allow_empty=True)
    return {"prompt": ctx.tokenizer.decode(ids, skip_special_tokens=False)}

