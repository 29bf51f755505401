"""Request validation shared by every API: ApiError and its 400s, the JSON body parser with its
nesting bound, typed field readers (get_int, get_float, get_bool), the accepted field sets, and
the checks of sampling-related fields (stop, logit_bias, token ids, stream_options, output
constraints).

Everything here is pure: JSON-shaped values in, values or an ApiError naming the field out.
Validation is strict: a wrong type, an out-of-range value or a field this server does not
implement is an ApiError(400) naming the field, never silently ignored. What is not here: the
model-dependent checks (prompt length, templates: openai.py, chat.py).
"""
from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

from lite_llm.sampling_params import MAX_JSON_DEPTH, SamplingParams, StructuredOutputsParams, nested_deeper_than

MAX_PROMPTS = 256           # prompts in one completions request (each is one engine request)
MAX_N = 128                 # completions per prompt
MAX_COMPLETIONS = 1024      # prompts x n in one request
MAX_STOP = 16               # stop strings per request
MAX_STOP_LEN = 512          # characters per stop string
MAX_BODY_DEPTH = 2 * MAX_JSON_DEPTH   # nesting levels of a request body: a deepest schema and its place in the body
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1

# Fields accepted only while they say "not used" (null, false, empty): anything else is a 400.
_UNSUPPORTED = {"functions", "function_call",
                "suffix", "best_of", "guided_decoding_backend",
                "audio", "modalities", "prediction", "reasoning_effort", "web_search_options",
                "metadata", "store", "service_tier", "continue_final_message", "documents"}
_WHY_UNSUPPORTED = {
    "suffix": "'suffix' (fill-in-the-middle insertion) is not supported by this server; put the "
              "whole text in 'prompt'",
}
# Fields a beam search does not honour (its beams end on EOS and max_tokens only, scored by the
# raw model's logprobs): given with use_beam_search, each is a 400 rather than silently ignored.
NOT_WITH_BEAMS = ("stream", "logprobs", "top_logprobs", "prompt_logprobs", "stop", "stop_token_ids",
                  "min_tokens", "logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty",
                  "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                  "structured_outputs", "tools")
BEAM_NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "min_tokens": 0, "stop": [],
                "stop_token_ids": [], "tools": [], "logit_bias": {}, "response_format": {"type": "text"}}
MAX_LOGIT_BIAS = 300        # entries of logit_bias (OpenAI's limit)
_SAMPLING_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p",
                    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop",
                    "stop_token_ids", "ignore_eos", "n", "stream", "stream_options", "user",
                    "min_tokens", "skip_special_tokens", "include_stop_str_in_output",
                    "parallel_tool_calls", "request_id", "logit_bias", "response_format",
                    "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                    "guided_whitespace_pattern", "structured_outputs", "prompt_logprobs",
                    "use_beam_search", "length_penalty"}
COMPLETION_FIELDS = _SAMPLING_FIELDS | {"prompt", "logprobs", "echo", "add_special_tokens"}
CHAT_FIELDS = _SAMPLING_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                                  "add_generation_prompt", "chat_template", "add_special_tokens",
                                  "chat_template_kwargs", "tools", "tool_choice", "reasoning_effort"}


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


def is_int(x: Any) -> bool:
    """An integer as JSON Schema counts them: 3 and 3.0 alike (pydantic, under vLLM, takes both)."""
    return (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and x.is_integer())


def is_num(x: Any) -> bool:
    return (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and math.isfinite(x))


def get_int(body: dict, name: str, lo: int, hi: int, default: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if not is_int(v) or not lo <= v <= hi:
        raise bad(f"'{name}' must be an integer in [{lo}, {hi}], got {show(v)}", name)
    return int(v)


def get_float(body: dict, name: str, lo: float, hi: float, default: float | None = None,
              lo_open: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return default
    if not is_num(v) or not (lo < v if lo_open else lo <= v) or not v <= hi:
        left = "(" if lo_open else "["
        raise bad(f"'{name}' must be a number in {left}{lo}, {hi}], got {show(v)}", name)
    return float(v)


def get_bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be a boolean, got {show(v)}", name)
    return v


def show(v: Any) -> str:
    s = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def check_fields(body: dict, allowed: set[str]) -> None:
    for name, value in body.items():
        if name in allowed:
            continue
        if name in _UNSUPPORTED:
            if value in (None, False, [], {}, ""):
                continue
            raise bad(_WHY_UNSUPPORTED.get(name, f"'{name}' is not supported by this server"), name)
        raise bad(f"unrecognized request argument '{show(name)[1:-1]}'", name)


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


def check_logit_bias(value: Any, vocab_size: int) -> dict[int, float]:
    """{"token id": bias in [-100, 100]} (JSON keys are strings) -> {id: bias}."""
    if not isinstance(value, dict) or len(value) > MAX_LOGIT_BIAS:
        raise bad(f"'logit_bias' must be an object of at most {MAX_LOGIT_BIAS} token ids -> numbers",
                  "logit_bias")
    out = {}
    for key, v in value.items():
        if not (isinstance(key, str) and 0 < len(key) <= 10 and key.isascii() and key.isdigit()
                and int(key) < vocab_size):
            raise bad(f"'logit_bias' keys must be token ids in [0, {vocab_size}), got {show(key)}",
                      "logit_bias")
        if not is_num(v) or not -100 <= v <= 100:
            raise bad(f"'logit_bias' values must be numbers in [-100, 100], got {show(v)}", "logit_bias")
        if v:
            out[int(key)] = float(v)
    return out


def check_token_ids(value: Any, vocab_size: int, name: str, allow_empty: bool = False) -> list[int]:
    if (not isinstance(value, list) or (not value and not allow_empty)
            or not all(is_int(t) and 0 <= t < vocab_size for t in value)):
        raise bad(f"'{name}' must be a {'' if allow_empty else 'non-empty '}list of token ids "
                  f"in [0, {vocab_size})", name)
    return [int(t) for t in value]


def stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
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


def new_id(prefix: str, body: dict) -> str:
    """cmpl-<hex>, or cmpl-<request_id> when the client names its request (as vLLM)."""
    rid = body.get("request_id")
    if rid is None:
        return f"{prefix}-{uuid.uuid4().hex}"
    if not isinstance(rid, str) or not 0 < len(rid) <= 128 or not rid.isprintable():
        raise bad("'request_id' must be a printable string of 1 to 128 characters", "request_id")
    return f"{prefix}-{rid}"


def sampling_params(kw: dict) -> SamplingParams:
    try:
        return SamplingParams(**kw)
    except (ValueError, TypeError) as e:
        raise bad(str(e), str(e).split(" ", 1)[0] if str(e) else None) from None


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


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
