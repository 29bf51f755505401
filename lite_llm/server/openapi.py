"""GET /openapi.json: an OpenAPI 3.1 document of the routes and bodies this server accepts.

The paths are the route table's (routes.py: each route carries its operation, built by the
*_op helpers here); the body schemas are written by hand from the same field lists
validation.py and the other APIs validate against, so a field added there without a schema
here is caught by tests/server/test_openai_api.py.
"""
from __future__ import annotations

from typing import Any

from lite_llm.sampling_params import MAX_CHOICES
from lite_llm.server.validation import NOT_WITH_BEAMS
from lite_llm.server.pooling import ROUTES as POOLING_ROUTES

_NUM = {"type": "number"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_STR = {"type": "string"}
_NULLABLE_STR = {"type": ["string", "null"]}
_TOKEN_ID = {"type": "integer", "minimum": 0}
_LOGIT_BIAS_KEY = {"pattern": "^[0-9]{1,10}$"}     # a token id: openapi_document bounds it too     # below the vocabulary's size: openapi_document says so
_IDS = {"type": "array", "items": _TOKEN_ID}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


_STOP = {"type": "string", "minLength": 1, "maxLength": 512}
# tokens a request may ask for; beyond what its prompt leaves of the context, a 400 (no JSON Schema
# can say so: the prompt's length is counted in tokens)
_MAX_TOKENS = {"type": "integer", "minimum": 1, "maximum": 2 ** 31 - 1}
_MIN_TOKENS = {"type": "integer", "minimum": 0, "description": "at most max_tokens"}   # and max_model_len
_SAMPLING = {
    "model": _STR,
    "max_tokens": _MAX_TOKENS,
    "temperature": {"type": "number", "minimum": 0, "maximum": 1e6},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "maximum": 2 ** 31 - 1},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e6},
    "seed": {"type": "integer", "minimum": -(2 ** 63), "maximum": 2 ** 63 - 1},
    "stop": {"oneOf": [_STOP, {"type": "array", "maxItems": 16, "items": _STOP}]},
    "stop_token_ids": _IDS,
    "ignore_eos": _BOOL,
    "n": {"type": "integer", "minimum": 1, "maximum": 128},
    "stream": _BOOL,
    "stream_options": {"type": "object", "additionalProperties": False, "properties": {
        "include_usage": {**_BOOL, "description": "a last chunk with no choices and the request's usage"},
        "continuous_usage_stats": {**_BOOL, "description": "vLLM's: with include_usage, every chunk also "
                                   "carries the usage so far (its prompt, its choice's tokens until then)"}},
                       "description": "with stream only"},
    "user": _STR,
    "min_tokens": _MIN_TOKENS,
    "skip_special_tokens": _BOOL,
    "include_stop_str_in_output": _BOOL,
    "use_beam_search": {**_BOOL, "description": "vLLM's: the n best beams of a beam search of width best_of "
                        "(accepted with it), else n"},
    "length_penalty": {"type": "number", "minimum": -1e6, "maximum": 1e6,
                       "description": "with use_beam_search: a beam scores its logprob / length ** length_penalty"},
    "parallel_tool_calls": _BOOL,
    "request_id": {"type": "string", "pattern": "^[ -~]{1,128}$",
                   "description": "names the response (cmpl-<request_id>); 1 to 128 printable characters"},
    "add_special_tokens": _BOOL,
    "logit_bias": {"type": "object", "maxProperties": 300,
                   "propertyNames": _LOGIT_BIAS_KEY,
                   "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
    "response_format": {"oneOf": [
        {"type": "object", "required": ["type"], "additionalProperties": False,
         "properties": {"type": {"type": "string", "enum": ["text", "json_object"]}}},
        {"type": "object", "required": ["type", "json_schema"], "additionalProperties": False,
         "properties": {"type": {"type": "string", "enum": ["json_schema"]},
                        "json_schema": {"type": "object", "additionalProperties": False, "properties": {
                            "name": _STR, "description": _STR, "strict": _BOOL,
                            "schema": {"type": ["object", "boolean"]}}}}}],
        "description": "the output follows a JSON schema (or is any JSON object), enforced token by token"},
    "guided_json": {"type": "object", "description": "a JSON schema the output follows (or its JSON text)"},
    "guided_regex": {**_STR, "minLength": 1, "description": "a regular expression the output matches"},
    "guided_choice": {"type": "array", "items": {**_STR, "minLength": 1}, "minItems": 1, "maxItems": MAX_CHOICES,
                      "description": "the output is one of these strings"},
    "guided_grammar": {**_STR, "minLength": 1, "description": "a Lark (or GBNF) grammar the output follows"},
    "guided_whitespace_pattern": {**_STR, "description": "regex of the whitespace JSON output may use"},
    "structured_outputs": {"type": "object", "additionalProperties": False, "oneOf": [
        *({"required": [key]} for key in ("json", "regex", "choice", "grammar")),
        {"required": ["json_object"], "properties": {"json_object": {"const": True}}}], "properties": {
        "json": {"type": ["object", "boolean"], "description": "a JSON schema (or its JSON text)"},
        "regex": {**_STR, "minLength": 1},
        "choice": {"type": "array", "items": {**_STR, "minLength": 1}, "minItems": 1, "maxItems": MAX_CHOICES}, "grammar": {**_STR, "minLength": 1},
        "json_object": _BOOL, "disable_any_whitespace": _BOOL,
        "disable_additional_properties": _BOOL, "whitespace_pattern": _STR},
        "description": "vLLM's structured outputs: exactly one of json, json_object, regex, choice, grammar"},
    "prompt_logprobs": {"type": "integer", "minimum": 0, "maximum": 20,
                        "description": "vLLM's: per prompt token, its logprob and the top ones (not with stream)"},
}

_CONSTRAINTS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                "structured_outputs")
# at most one output constraint in a body (the server names the second with a 400)
_ONE_CONSTRAINT = {"not": {"anyOf": [{"required": [a, b]} for i, a in enumerate(_CONSTRAINTS)
                                     for b in _CONSTRAINTS[i + 1:]]}}
# rules between fields the server enforces with a 400
# streamed: no prompt_logprobs; not streamed: no stream_options (one rule: schemathesis draws
# from fewer conditionals)
_STREAM_RULES = {"if": {"required": ["stream"], "properties": {"stream": {"const": True}}},
                 "then": {"properties": {"prompt_logprobs": {"type": "null"}}},
                 "else": {"properties": {"stream_options": {"type": "null"}}}}
# use_beam_search: the fields a beam search does not honour are left out
_BEAM_RULES = {"if": {"required": ["use_beam_search"], "properties": {"use_beam_search": {"const": True}}},
               "then": {"properties": {name: {"type": "null"} for name in NOT_WITH_BEAMS}}}
_LOGPROBS_FOR_TOP = {"if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"minimum": 1}}},
                     "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}
_USAGE = {"type": "object", "properties": {"prompt_tokens": _INT, "completion_tokens": _INT,
                                           "total_tokens": _INT}}
_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": _STR, "type": _STR, "param": _NULLABLE_STR,
                   "code": {"type": ["string", "integer", "null"]}}}}}
_TOOL_CALL = {"type": "object", "required": ["function"], "properties": {
    "id": _STR, "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name", "arguments"], "properties": {
        "name": _STR, "arguments": {"oneOf": [_STR, {"type": "object"}],
                                    "description": "JSON text (or an object) of the arguments"}}}}}
_TEXT_PART = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
              "properties": {"type": {"type": "string", "enum": ["text"]}, "text": _STR}}
_IMAGE_PART = {"type": "object", "required": ["type", "image_url"], "additionalProperties": False,
               "description": "models that take images only (a vision checkpoint); --limit-mm-per-prompt caps them",
               "properties": {"type": {"type": "string", "enum": ["image_url"]},
                              "image_url": {"oneOf": [_STR, {"type": "object", "required": ["url"], "properties": {
                                  "url": {**_STR, "description": "a data: URL (base64), or http(s) from "
                                          "--allowed-media-domains"}, "detail": _STR}}]}}}
_TOOL_CALL_IN = {"type": "object", "required": ["function"], "additionalProperties": False, "properties": {
    "id": _STR, "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name", "arguments"], "additionalProperties": False, "properties": {
        "name": _STR, "arguments": {"type": "object", "description": "the arguments (or JSON text of them)"}}}}}
_CONTENT = {"oneOf": [_STR, {"type": "array", "items": {"oneOf": [_TEXT_PART, _IMAGE_PART]}}]}
# Which keys each role takes, and that every role but assistant needs content (the server says so
# with a 400): one branch per role.
_MESSAGE = {"type": "object", "required": ["role"], "additionalProperties": False, "properties": {
    "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
    "content": {"oneOf": [_CONTENT["oneOf"][0], {"type": "null"}, _CONTENT["oneOf"][1]]},
    "name": _STR,
    "tool_calls": {"type": "array", "minItems": 1, "items": _TOOL_CALL_IN, "description": "assistant messages only"},
    "tool_call_id": {**_STR, "description": "tool messages only"},
    "reasoning_content": {**_STR, "description": "assistant messages only"}},
    "oneOf": [
        {"required": ["content"], "properties": {"role": {"enum": ["system", "developer", "user"]}, "content": _CONTENT},
         "propertyNames": {"enum": ["role", "content", "name"]}},
        {"properties": {"role": {"const": "assistant"}},
         "propertyNames": {"enum": ["role", "content", "name", "tool_calls", "reasoning_content"]}},
        {"required": ["content"], "properties": {"role": {"const": "tool"}, "content": _CONTENT},
         "propertyNames": {"enum": ["role", "content", "tool_call_id", "name"]}}]}
_ANSWER = {"type": "object", "properties": {
    "role": {"type": "string", "enum": ["assistant"]}, "content": _NULLABLE_STR,
    "reasoning_content": {**_NULLABLE_STR, "description": "the <think> part, with --reasoning-parser"},
    "tool_calls": {"type": "array", "items": _TOOL_CALL}}}
_FINISH = {"type": ["string", "null"], "enum": ["stop", "length", "tool_calls", None]}
_TOOL_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_.\\-]{1,64}$"}
_TOOL = {"type": "object", "required": ["type", "function"], "additionalProperties": False, "properties": {
    "type": {"type": "string", "enum": ["function"]},
    "function": {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
        "name": _TOOL_NAME, "description": _STR, "parameters": {"type": "object"}, "strict": _BOOL}}}}


def _R_PART(kind: str) -> dict:
    """A Responses text content part of the given type."""
    return {"type": "object", "required": ["type", "text"], "additionalProperties": False,
            "properties": {"type": {"const": kind}, "text": _STR}}
_TEMPLATE_KWARGS = {"type": "object", "propertyNames": {
    "pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "not": {"enum": ["messages", "tools", "documents", "add_generation_prompt",
                                                        "chat_template", "bos_token", "eos_token", "pad_token",
                                                        "unk_token"]}},
                    "description": "extra chat template variables, e.g. "
                    "{\"enable_thinking\": false} for Qwen3", "additionalProperties": True}
_MODEL = {"type": "object", "properties": {"id": _STR, "object": _STR, "created": _INT,
                                           "owned_by": _STR, "root": _STR, "max_model_len": _INT}}

# Anthropic's Messages input (shared by count_tokens): text, image and tool blocks as this server reads them
_A_TEXT = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
           "properties": {"type": {"const": "text"}, "text": _STR}}
_A_TOOL_USE = {"type": "object", "required": ["type", "id", "name", "input"], "additionalProperties": False,
               "properties": {"type": {"const": "tool_use"}, "id": _STR, "name": _STR, "input": {"type": "object"}}}
_A_TOOL_RESULT = {"type": "object", "required": ["type", "tool_use_id"], "additionalProperties": False,
                  "properties": {"type": {"const": "tool_result"}, "tool_use_id": _STR, "is_error": _BOOL,
                                 "content": {"oneOf": [_STR, {"type": "array", "items": _A_TEXT}]}}}
_A_THINKING = {"type": "object", "required": ["type", "thinking"], "additionalProperties": False,
               "properties": {"type": {"const": "thinking"}, "thinking": _STR, "signature": _STR}}
_A_IMAGE = {"type": "object", "required": ["type", "source"], "description": "models that take images only",
            "properties": {"type": {"const": "image"}, "source": {"type": "object"}}}
_A_INPUT = {
    "model": _STR,
    "messages": {"type": "array", "minItems": 1, "items": {"oneOf": [
        {"type": "object", "required": ["role", "content"], "additionalProperties": False, "properties": {
            "role": {"const": "user"},
            "content": {"oneOf": [_STR, {"type": "array", "items": {"oneOf": [_A_TEXT, _A_TOOL_RESULT, _A_IMAGE]}}]}}},
        {"type": "object", "required": ["role", "content"], "additionalProperties": False, "properties": {
            "role": {"const": "assistant"},
            "content": {"oneOf": [_STR, {"type": "array", "items": {"oneOf": [_A_TEXT, _A_TOOL_USE, _A_THINKING]}}]}}}]}},
    "system": {"oneOf": [_STR, {"type": "array", "items": _A_TEXT}]},
    "tools": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["name", "input_schema"], "additionalProperties": False, "properties": {
            "type": {"const": "custom"}, "name": {"type": "string", "pattern": "^[A-Za-z0-9_.\\-]{1,64}$"},
            "description": _STR, "input_schema": {"type": "object", "description": "a JSON schema of an object"}}}},
    "tool_choice": {"oneOf": [
        {"type": "object", "required": ["type"], "additionalProperties": False, "properties": {
            "type": {"enum": ["auto", "any", "none"]}, "disable_parallel_tool_use": _BOOL}},
        {"type": "object", "required": ["type", "name"], "additionalProperties": False, "properties": {
            "type": {"const": "tool"}, "name": _STR, "disable_parallel_tool_use": _BOOL}}]},
    "thinking": {"oneOf": [
        {"type": "object", "required": ["type"], "additionalProperties": False, "properties": {"type": {"const": "disabled"}}},
        {"type": "object", "required": ["type"], "additionalProperties": False, "properties": {
            "type": {"enum": ["enabled", "adaptive", "between_tools"]}, "budget_tokens": _MAX_TOKENS,
            "display": {"enum": ["summarized", "omitted"]}}}]},
    "output_config": {"type": "object", "additionalProperties": False, "properties": {
        "effort": {"enum": ["low", "medium", "high", "xhigh", "max"]},
        "format": {"type": "object", "required": ["type", "schema"], "additionalProperties": False, "properties": {
            "type": {"const": "json_schema"}, "schema": {"type": "object"}}}}},
    "cache_control": {"type": "object", "required": ["type"], "properties": {"type": {"const": "ephemeral"}},
                      "description": "a hint: prefix caching is automatic"},
}

_POOL_INPUT = {"oneOf": [{**_STR, "minLength": 1}, {"type": "array", "minItems": 1, "items": {**_STR, "minLength": 1}},
                         {**_IDS, "minItems": 1}, {"type": "array", "minItems": 1, "items": {**_IDS, "minItems": 1}}],
               "description": "a string, a list of strings, token ids, or a list of lists of token ids"}
_TRUNCATE = {"type": "integer", "minimum": -1, "not": {"const": 0},
             "description": "keep the last N tokens of each input (-1: the model's limit); without it a "
                            "longer input is a 400"}
_ENCODING = {"type": "string", "enum": ["float", "base64"], "description": "base64: little-endian float32 bytes"}
_TEXTS = {"oneOf": [{**_STR, "minLength": 1}, {"type": "array", "minItems": 1, "items": {**_STR, "minLength": 1}}]}
_POOL_USAGE = {"type": "object", "properties": {"prompt_tokens": _INT, "total_tokens": _INT}}
_VECTOR = {"oneOf": [{"type": "array", "items": _NUM}, _STR], "description": "floats, or base64 text"}


def _completion(kind: str, answer: dict) -> dict:
    """A (chat) completion response whose choices carry `answer` (text, or a message)."""
    choice = {"type": "object", "properties": {"index": _INT, **answer, "finish_reason": _FINISH,
                                               "logprobs": {"type": ["object", "null"]}}}
    return {"type": "object", "properties": {
        "id": _STR, "object": {"type": "string", "enum": [kind]}, "created": _INT, "model": _STR,
        "usage": _USAGE, "choices": {"type": "array", "items": choice}, "system_fingerprint": _STR}}


def _pool_list(item: dict) -> dict:
    return {"type": "object", "properties": {"id": _STR, "object": {"type": "string", "enum": ["list"]},
                                             "created": _INT, "model": _STR, "usage": _POOL_USAGE,
                                             "data": {"type": "array", "items": item}}}


_POOL_SCHEMAS: dict[str, Any] = {
    "EmbeddingRequest": {"type": "object", "required": ["input"], "properties": {
        "model": _STR, "input": _POOL_INPUT, "encoding_format": _ENCODING,
        "dimensions": {"type": "integer", "minimum": 1,
                       "description": "Matryoshka models only: the first N components, renormalized"},
        "normalize": {**_BOOL, "description": "vLLM's: override the model's own normalization"},
        "truncate_prompt_tokens": _TRUNCATE, "user": _STR}},
    "EmbeddingResponse": _pool_list({"type": "object", "properties": {
        "object": {"type": "string", "enum": ["embedding"]}, "index": _INT, "embedding": _VECTOR}}),
    "PoolingRequest": {"type": "object", "properties": {
        "model": _STR, "input": _POOL_INPUT, "prompt": {**_POOL_INPUT, "description": "as input"},
        "encoding_format": _ENCODING, "truncate_prompt_tokens": _TRUNCATE}},
    "PoolingResponse": _pool_list({"type": "object", "properties": {
        "object": {"type": "string", "enum": ["pooling"]}, "index": _INT, "data": _VECTOR}}),
    "ScoreRequest": {"type": "object", "required": ["text_1", "text_2"], "properties": {
        "model": _STR, "text_1": {**_TEXTS, "description": "one text, or as many as text_2 (pairwise)"},
        "text_2": _TEXTS, "truncate_prompt_tokens": _TRUNCATE}},
    "ScoreResponse": _pool_list({"type": "object", "properties": {
        "object": {"type": "string", "enum": ["score"]}, "index": _INT, "score": _NUM}}),
    "RerankRequest": {"type": "object", "required": ["query", "documents"], "properties": {
        "model": _STR, "query": {**_STR, "minLength": 1},
        "documents": {"type": "array", "minItems": 1, "items": {"oneOf": [
            {**_STR, "minLength": 1},
            {"type": "object", "required": ["text"], "properties": {"text": {**_STR, "minLength": 1}}}]}},
        "top_n": {"type": "integer", "minimum": 0, "description": "0 or absent: every document"},
        "return_documents": _BOOL, "truncate_prompt_tokens": _TRUNCATE}},
    "RerankResponse": {"type": "object", "properties": {
        "id": _STR, "model": _STR, "usage": _POOL_USAGE, "results": {"type": "array", "items": {
            "type": "object", "properties": {"index": _INT, "relevance_score": _NUM,
                                             "document": {"type": "object", "properties": {"text": _STR}}}}}}},
    "LoadLoraAdapterRequest": {"type": "object", "required": ["lora_name", "lora_path"], "properties": {
        "lora_name": {**_STR, "minLength": 1},
        "lora_path": {**_STR, "minLength": 1, "description": "a PEFT directory or a llama.cpp GGUF LoRA file"}}},
    "UnloadLoraAdapterRequest": {"type": "object", "required": ["lora_name"], "properties": {
        "lora_name": {**_STR, "minLength": 1}}},
    "LoraAdapterResponse": {"type": "object", "properties": {
        "object": _STR, "id": _STR, "status": {"type": "string", "enum": ["loaded", "unloaded"]}, "message": _STR}},
}

SCHEMAS: dict[str, Any] = {
    **_POOL_SCHEMAS,
    "CompletionRequest": {"type": "object", "required": ["prompt"], "additionalProperties": False, **_ONE_CONSTRAINT,
                          "allOf": [_STREAM_RULES,
                                    {"if": {"required": ["stream", "echo", "logprobs"],
                                            "properties": {"stream": {"const": True}, "echo": {"const": True}}},
                                     "then": {"properties": {"logprobs": {"type": "null"}}}}, _BEAM_RULES],
                          "properties": {
        **_SAMPLING,
        "prompt": {"oneOf": [{**_STR, "minLength": 1}, {"type": "array", "minItems": 1, "items": {**_STR, "minLength": 1}},
                             {**_IDS, "minItems": 1}, {"type": "array", "minItems": 1, "items": {**_IDS, "minItems": 1}}],
                   "description": "a text, texts, token ids or lists of token ids; none empty"},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "echo": _BOOL}},
    "ChatCompletionRequest": {"type": "object", "required": ["messages"], "additionalProperties": False,
                              **_ONE_CONSTRAINT, "dependentRequired": {"tool_choice": ["tools"]},
                              "allOf": [_STREAM_RULES,
                                        _LOGPROBS_FOR_TOP, _BEAM_RULES],
                              "properties": {
        **_SAMPLING,
        "messages": {"type": "array", "items": _ref("ChatMessage"), "minItems": 1},
        "max_completion_tokens": _MAX_TOKENS,
        "logprobs": _BOOL,
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "add_generation_prompt": _BOOL,
        "chat_template": _STR,
        "chat_template_kwargs": _TEMPLATE_KWARGS,
        "reasoning_effort": {"enum": ["none", "minimal", "low", "medium", "high", "xhigh", None]},
        "tools": {"type": "array", "items": _TOOL, "maxItems": 128,
                  "description": "rendered through the chat template; calls parsed with --tool-call-parser"},
        "tool_choice": {"oneOf": [
            {"type": "string", "enum": ["auto", "none", "required"]},
            {"type": "object", "required": ["type", "function"], "additionalProperties": False,
             "properties": {"type": {"type": "string", "enum": ["function"]},
                            "function": {"type": "object", "required": ["name"], "additionalProperties": False,
                                         "properties": {"name": _STR}}}}],
            "description": "\"required\" and a named function are forced with a grammar"}}},
    "ChatMessage": _MESSAGE,
    "CompletionResponse": _completion("text_completion", {"text": _STR}),
    "ChatCompletionResponse": _completion("chat.completion", {"message": _ANSWER}),
    "Model": _MODEL,
    "ModelList": {"type": "object", "properties": {"object": _STR, "data": {"type": "array",
                                                                            "items": _ref("Model")}}},
    "TokenizeRequest": {"type": "object", "additionalProperties": False,
                        "description": "exactly one of prompt and messages",
                        "oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}], "properties": {
        "model": _STR, "prompt": _STR, "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
        "add_special_tokens": _BOOL, "add_generation_prompt": _BOOL, "return_token_strs": _BOOL,
        "chat_template": _STR, "chat_template_kwargs": _TEMPLATE_KWARGS,
        "tools": {"type": "array", "items": _TOOL, "maxItems": 128}}},
    "TokenizeResponse": {"type": "object", "properties": {
        "count": _INT, "max_model_len": _INT, "tokens": _IDS,
        "token_strs": {"type": ["array", "null"], "items": _STR}}},
    "DetokenizeRequest": {"type": "object", "required": ["tokens"], "additionalProperties": False,
                          "properties": {"model": _STR, "tokens": _IDS}},
    "DetokenizeResponse": {"type": "object", "properties": {"prompt": _STR}},
    "Version": {"type": "object", "properties": {"version": _STR, "kernel_variant": _STR}},
    "Error": _ERROR,
    "ChatCompletionBatchRequest": {"type": "object", "required": ["messages"], "additionalProperties": False,
                                   **_ONE_CONSTRAINT, "allOf": [_LOGPROBS_FOR_TOP, _BEAM_RULES], "properties": {
        **{k: v for k, v in _SAMPLING.items() if k not in ("stream", "stream_options", "n", "parallel_tool_calls")},
        "messages": {"type": "array", "minItems": 1, "description": "one conversation per choice",
                     "items": {"type": "array", "items": _ref("ChatMessage"), "minItems": 1}},
        "max_completion_tokens": _MAX_TOKENS, "logprobs": _BOOL,
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20}, "add_generation_prompt": _BOOL,
        "chat_template": _STR, "chat_template_kwargs": _TEMPLATE_KWARGS}},
    # A chat body here; a batch (a list of conversations) or a completion body ('prompt') is taken
    # too, as at its own route (three alternatives this rich are more than schemathesis draws from).
    "InvocationsRequest": {"allOf": [_ref("ChatCompletionRequest")],
                           "description": "a chat body ('messages'; a list of conversations for a batch, as "
                                          "ChatCompletionBatchRequest) or a completion body ('prompt', as "
                                          "CompletionRequest)"},
    "ResponsesRequest": {"type": "object", "required": ["input"], "additionalProperties": False,
                         "dependentRequired": {"tool_choice": ["tools"]}, "allOf": [
        {"if": {"required": ["stream_options"]}, "then": {"required": ["stream"], "properties": {"stream": {"const": True}}}},
        {"if": {"required": ["background"], "properties": {"background": {"const": True}}},
         "then": {"properties": {"store": {"const": True}, "stream": {"const": False}}}}], "properties": {
        "model": _STR,
        "input": {"oneOf": [_STR, {"type": "array", "minItems": 1, "items": {"oneOf": [
            {"type": "object", "required": ["role", "content"], "additionalProperties": False, "properties": {
                "type": {"const": "message"}, "role": {"enum": ["user", "system", "developer"]},
                "content": {"oneOf": [_STR, {"type": "array", "items": _R_PART("input_text")}]}}},
            {"type": "object", "required": ["role", "content"], "additionalProperties": False, "properties": {
                "type": {"const": "message"}, "role": {"const": "assistant"},
                "content": {"oneOf": [_STR, {"type": "array", "items": _R_PART("output_text")}]}}},
            {"type": "object", "required": ["type", "call_id", "output"], "additionalProperties": False, "properties": {
                "type": {"const": "function_call_output"}, "call_id": _STR, "output": _STR}}]}}],
                  "description": "a string, or message / function_call / function_call_output / reasoning items "
                                 "(input_image parts too, for a model that takes images)"},
        "instructions": _STR, "max_output_tokens": _MAX_TOKENS,
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "tools": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["type", "name"], "additionalProperties": False, "properties": {
                "type": {"type": "string", "enum": ["function"]}, "name": _TOOL_NAME, "description": _STR,
                "parameters": {"type": "object"}, "strict": _BOOL}}},
        "tool_choice": {"oneOf": [{"type": "string", "enum": ["auto", "none", "required"]},
                                  {"type": "object", "required": ["type", "name"], "additionalProperties": False,
                                   "properties": {"type": {"type": "string", "enum": ["function"]}, "name": _STR}}]},
        "parallel_tool_calls": _BOOL,
        "text": {"type": "object", "additionalProperties": False, "properties": {
            "format": {"oneOf": [
                {"type": "object", "required": ["type"], "additionalProperties": False,
                 "properties": {"type": {"enum": ["text", "json_object"]}}},
                {"type": "object", "required": ["type", "name", "schema"], "additionalProperties": False,
                 "properties": {"type": {"const": "json_schema"}, "name": _STR, "schema": {"type": "object"},
                                "description": _STR, "strict": _BOOL}}]},
            "verbosity": {"enum": ["low", "medium", "high"]}},
                 "description": "format json_schema is enforced token by token"},
        "reasoning": {"type": "object", "additionalProperties": False, "properties": {
            "effort": {"enum": ["none", "minimal", "low", "medium", "high", "xhigh", None]},
            "summary": {"enum": ["auto", "concise", "detailed", None]}}},
        "store": {**_BOOL, "description": "keep the response (default true) for GET and previous_response_id"},
        "previous_response_id": _STR, "background": _BOOL, "stream": _BOOL,
        "metadata": {"type": "object", "maxProperties": 16, "propertyNames": {"maxLength": 64},
                     "additionalProperties": {**_STR, "maxLength": 512}}, "user": _STR,
        "truncation": {"type": "string", "enum": ["disabled"]}, "safety_identifier": _STR,
        "prompt_cache_key": _STR, "service_tier": {"type": "string", "enum": ["auto", "default"]},
        "stream_options": {"type": "object", "additionalProperties": False,
                           "properties": {"include_obfuscation": _BOOL}}}},
    "Response": {"type": "object", "required": ["id", "object", "status", "output"], "properties": {
        "id": _STR, "object": {"type": "string", "enum": ["response"]}, "created_at": _INT,
        "status": {"type": "string", "enum": ["queued", "in_progress", "completed", "incomplete", "failed",
                                              "cancelled"]},
        "model": _STR, "output": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": ["object", "null"]}, "error": {"type": ["object", "null"]},
        "incomplete_details": {"type": ["object", "null"]}}},
    "DeletedResponse": {"type": "object", "properties": {"id": _STR, "object": _STR, "deleted": _BOOL}},
    "MessagesRequest": {"type": "object", "required": ["model", "messages", "max_tokens"], "additionalProperties": False,
                        "dependentRequired": {"tool_choice": ["tools"]}, "properties": {
        **_A_INPUT, "max_tokens": _MAX_TOKENS,
        "stop_sequences": {"type": "array", "items": {**_STR, "minLength": 1}},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0, "maximum": 2 ** 31 - 1},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "stream": _BOOL,
        "metadata": {"type": "object", "additionalProperties": False, "properties": {"user_id": _NULLABLE_STR}},
        "service_tier": {"type": "string", "enum": ["auto", "standard_only"]}}},
    "CountTokensRequest": {"type": "object", "required": ["model", "messages"], "additionalProperties": False,
                           "dependentRequired": {"tool_choice": ["tools"]}, "properties": _A_INPUT},
    "Message": {"type": "object", "required": ["id", "type", "role", "content"], "properties": {
        "id": _STR, "type": {"type": "string", "enum": ["message"]}, "role": {"type": "string", "enum": ["assistant"]},
        "content": {"type": "array", "items": {"type": "object"}}, "model": _STR,
        "stop_reason": {"type": ["string", "null"], "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", None]},
        "stop_sequence": _NULLABLE_STR, "usage": {"type": "object"}}},
    "TokenCount": {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": _INT}},
    "AnthropicError": {"type": "object", "required": ["type", "error"], "properties": {
        "type": {"type": "string", "enum": ["error"]},
        "error": {"type": "object", "required": ["type", "message"], "properties": {"type": _STR, "message": _STR}}}},
}

# Ollama's API (server/ollama.py): its bodies as Ollama's clients send them; errors {"error": str}
_O_OPTIONS = {"type": "object", "properties": {      # other options are ignored, as Ollama ignores them
    "temperature": {"type": "number", "minimum": 0, "maximum": 1e6},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "maximum": 2 ** 31 - 1},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "seed": {"type": "integer", "minimum": -2 ** 63, "maximum": 2 ** 63 - 1},
    "num_predict": {"type": "integer", "minimum": -2, "maximum": 2 ** 31 - 1, "not": {"const": 0},
                    "description": "-1: no limit (the room the prompt leaves)"},
    "stop": {"type": "array", "items": _STR},
    "repeat_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e6},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "num_ctx": {"type": "integer", "minimum": 1, "description": "at most the model's maximum context length"},
    **{name: {"description": "accepted, no effect here"} for name in (
        "num_keep", "typical_p", "repeat_last_n", "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta",
        "penalize_newline", "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
        "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread")}}}
_O_COMMON = {"model": {**_STR, "minLength": 1}, "stream": {**_BOOL, "description": "default true: NDJSON lines"},
             "options": _O_OPTIONS, "keep_alive": {"type": ["number", "string"], "pattern": "^-?[0-9]+[a-z]*"},
             "format": {"oneOf": [{"type": "string", "enum": ["", "json"]}, {"type": "object"}]},
             "think": {"oneOf": [_BOOL, {"type": "string", "enum": ["low", "medium", "high"]}]}}
_O_MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]}, "content": _STR,
    "images": {"type": "array", "items": _STR}, "thinking": _STR, "tool_name": _STR, "tool_call_id": _STR,
    "tool_calls": {"type": "array", "items": {"type": "object", "required": ["function"], "properties": {
        "function": {"type": "object", "required": ["name"], "properties": {"name": _STR,
                                                                             "arguments": {"type": "object"}}}}}}}}
_O_DONE = {"done": _BOOL, "done_reason": _STR, "total_duration": _INT, "load_duration": _INT,
           "prompt_eval_count": _INT, "prompt_eval_duration": _INT, "eval_count": _INT, "eval_duration": _INT}
_O_DETAILS = {"type": "object", "properties": {"format": _STR, "family": _STR, "parameter_size": _STR,
                                               "quantization_level": _STR}}
SCHEMAS.update({
    "OllamaChatRequest": {"type": "object", "required": ["model"], "properties": {
        **_O_COMMON, "messages": {"type": "array", "items": _O_MESSAGE},
        "tools": {"type": "array", "items": {"type": "object"}}}},
    "OllamaGenerateRequest": {"type": "object", "required": ["model"], "properties": {
        **_O_COMMON, "prompt": _STR, "system": _STR, "raw": _BOOL, "images": {"type": "array", "items": _STR}}},
    "OllamaChatResponse": {"type": "object", "required": ["model", "created_at", "done"], "properties": {
        "model": _STR, "created_at": _STR, "message": {"type": "object"}, **_O_DONE}},
    "OllamaGenerateResponse": {"type": "object", "required": ["model", "created_at", "done"], "properties": {
        "model": _STR, "created_at": _STR, "response": _STR, "thinking": _STR, **_O_DONE}},
    "OllamaEmbedRequest": {"type": "object", "required": ["model"], "properties": {
        "model": {**_STR, "minLength": 1}, "input": {"oneOf": [_STR, {"type": "array", "items": _STR}]},
        "truncate": _BOOL, "dimensions": {"type": "integer", "minimum": 1}, "options": _O_OPTIONS,
        "keep_alive": _O_COMMON["keep_alive"]}},
    "OllamaEmbedResponse": {"type": "object", "required": ["embeddings"], "properties": {
        "model": _STR, "embeddings": {"type": "array", "items": {"type": "array", "items": _NUM}}}},
    "OllamaEmbeddingsRequest": {"type": "object", "required": ["model"], "properties": {
        "model": {**_STR, "minLength": 1}, "prompt": _STR, "options": _O_OPTIONS,
        "keep_alive": _O_COMMON["keep_alive"]}},
    "OllamaEmbeddingsResponse": {"type": "object", "required": ["embedding"], "properties": {
        "embedding": {"type": "array", "items": _NUM}}},
    "OllamaShowRequest": {"type": "object", "required": ["model"], "properties": {"model": {**_STR, "minLength": 1}}},
    "OllamaShowResponse": {"type": "object", "properties": {
        "template": _STR, "details": _O_DETAILS, "model_info": {"type": "object"},
        "capabilities": {"type": "array", "items": _STR}}},
    "OllamaPullRequest": {"type": "object", "required": ["model"], "properties": {
        "model": {**_STR, "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$",
                  "maxLength": 256, "description": "a Hugging Face model name, or the served model's"},
        "stream": _BOOL}},
    "OllamaProgress": {"type": "object", "properties": {"status": _STR, "digest": _STR, "total": _INT,
                                                        "completed": _INT}},
    "OllamaModels": {"type": "object", "required": ["models"], "properties": {"models": {"type": "array", "items": {
        "type": "object", "properties": {"name": _STR, "model": _STR, "size": _INT, "digest": _STR,
                                         "details": _O_DETAILS}}}}},
    "OllamaVersion": {"type": "object", "required": ["version"], "properties": {"version": _STR}},
    "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": _STR}},
})


def _errors(*statuses: int, shape: str = "Error") -> dict:
    why = {400: "Invalid request", 401: "Missing or wrong API key", 404: "Unknown model, response or route",
           413: "Request body too large", 429: "Queue full (see Retry-After)",
           503: "Server draining, engine stopped, or at capacity (see Retry-After)"}
    return {str(s): {"description": why[s], "content": {"application/json": {"schema": _ref(shape)}}}
            for s in statuses}


# ---- operations: the route table (routes.py) gives each route its own -------------------------
# Without `security` and the 401 answer: openapi_document adds both to the routes that take the key.

def post_op(summary: str, request: str, response: str, stream: bool, shape: str = "Error",
            events: str = "`data: {chunk}` per delta, then `data: [DONE]`") -> dict:
    content = {"application/json": {"schema": _ref(response)}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "object", "properties": {"event": _STR, "data": _STR},
                                                   "description":
                                        "Server-sent events: " + events}}
    return {"summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": {"description": "OK", "content": content},
                          **_errors(400, 404, 413, 429, 503, shape=shape)}}


AUDIO_ROUTES = ("/v1/audio/transcriptions", "/v1/audio/translations")
_AUDIO_FORM = {"type": "object", "required": ["file"], "properties": {
    "file": {"type": "string", "contentMediaType": "application/octet-stream",
             "description": "WAV, FLAC, MP3, OGG, WebM or M4A, up to 25 MiB and 30 minutes"},
    "model": _STR, "language": _STR, "prompt": _STR,
    "response_format": {"type": "string", "enum": ["json", "text", "srt", "verbose_json", "vtt"]},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": ["segment", "word"]}},
    "stream": _BOOL, "stream_include_usage": _BOOL}}


def audio_op(summary: str) -> dict:
    """An audio route: a multipart/form-data body, an answer in the response_format asked for."""
    text = {"schema": _STR}
    return {"summary": summary,
            "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": _AUDIO_FORM}}},
            "responses": {"200": {"description": "OK", "content": {
                "application/json": {"schema": {"type": "object", "required": ["text"], "properties": {
                    "text": _STR, "language": _STR, "duration": _NUM, "segments": {"type": "array"},
                    "words": {"type": "array", "items": {"type": "object", "required": ["word", "start", "end"],
                                                         "properties": {"word": _STR, "start": _NUM, "end": _NUM}}}}}},
                "text/plain": text, "text/vtt": text,
                "text/event-stream": {"schema": {**_STR, "description": "`transcription.chunk` deltas, then [DONE]"}}}},
                **_errors(400, 404, 413, 429, 503)}}


def get_op(summary: str, schema: dict | str | None, media: str = "application/json") -> dict:
    ok: dict[str, Any] = {"description": "OK"}
    if schema is not None:
        ok["content"] = {media: {"schema": _ref(schema) if isinstance(schema, str) else schema}}
    return {"summary": summary, "responses": {"200": ok}}


def ollama_op(summary: str, request: str | None, response: str, stream: bool = False) -> dict:
    """An operation of Ollama's API: NDJSON lines when streaming (its default), errors {"error": str}."""
    ok = {"application/json": {"schema": _ref(response)}}
    if stream:
        ok["application/x-ndjson"] = {"schema": {"type": "string", "description": "one JSON object a line; "
                                                 "the last has done: true (or an {\"error\"} line)"}}
    op: dict[str, Any] = {"summary": summary, "responses": {"200": {"description": "OK", "content": ok}}}
    if request is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(request)}}}
        op["responses"].update(_errors(400, 404, 413, 429, 503, shape="OllamaError"))
    else:
        op["responses"].update(_errors(503, shape="OllamaError"))
    return op


def model_op() -> dict:
    op = get_op("One served model", "Model")
    op["parameters"] = [{"name": "model", "in": "path", "required": True, "schema": _STR}]
    op["responses"].update(_errors(404))
    return op


def health_op(summary: str) -> dict:
    return {"summary": summary, "responses": {"200": {"description": "Serving"}, **_errors(503)}}


def invocations_op() -> dict:
    op = post_op("SageMaker: a chat or completion body, told apart by its shape", "InvocationsRequest",
                 "ChatCompletionResponse", stream=True)
    op["responses"]["200"]["content"]["application/json"]["schema"] = {
        "oneOf": [_ref("ChatCompletionResponse"), _ref("CompletionResponse")]}
    return op


def response_op(summary: str, schema: str, errors: tuple[int, ...]) -> dict:
    return {"summary": summary,
            "parameters": [{"name": "response_id", "in": "path", "required": True, "schema": _STR}],
            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": _ref(schema)}}},
                          **_errors(*errors)}}


def _with_auth(op: dict) -> dict:
    """op as a route that takes the API key answers: `security` and the 401 (in the shape of the
    op's other errors)."""
    responses = dict(op["responses"])
    other = next((r for status, r in responses.items() if status.startswith(("4", "5"))), None)
    shape = other["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1] if other else "Error"
    responses["401"] = _errors(401, shape=shape)["401"]
    return {**op, "security": [{"bearer": []}],
            "responses": dict(sorted(responses.items(), key=lambda kv: kv[0]))}


def _below(n: int) -> str:
    """A regular expression of the decimal integers in [0, n), n >= 1, without leading zeros."""
    top = str(n - 1)
    alts = ["0"] + ([f"[1-9][0-9]{{0,{len(top) - 2}}}"] if len(top) > 1 else [])
    for i, digit in enumerate(top):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            alts.append(f"{top[:i]}[{low}-{int(digit) - 1}][0-9]{{{len(top) - i - 1}}}")
    alts.append(top)
    return "^(" + "|".join(alts) + ")$"


def _fitted(value: Any, vocab_size: int | None, max_model_len: int | None, images: bool) -> Any:
    """A copy of value with every token id bounded by the vocabulary (_TOKEN_ID gets its maximum),
    min_tokens by the context and, for a model that takes no images, no image part among the
    alternatives."""
    if value is _TOKEN_ID:
        return value if vocab_size is None else {**value, "maximum": vocab_size - 1}
    if value is _LOGIT_BIAS_KEY:
        return value if vocab_size is None else {"pattern": _below(vocab_size)}
    if value is _MIN_TOKENS:
        return value if max_model_len is None else {**value, "maximum": max_model_len}
    if isinstance(value, dict):
        return {k: _fitted(v, vocab_size, max_model_len, images) for k, v in value.items()}
    if isinstance(value, list):
        return [_fitted(v, vocab_size, max_model_len, images) for v in value
                if images or (v is not _IMAGE_PART and v is not _A_IMAGE)]
    return value


# bodies whose tools are parsed out of the answer: with no tool call parser, a 400
_TOOL_BODIES = ("ChatCompletionRequest", "ResponsesRequest", "MessagesRequest", "CountTokensRequest")


def openapi_document(version: str, routes: Any, *, api_key: bool = True, pooling: bool = True, audio: bool = False,
                     vocab_size: int | None = None, max_model_len: int | None = None, images: bool = True,
                     tools: bool = True, request_templates: bool = True) -> dict:
    """The document of this server, which accepts what it calls valid: one path per route of the
    table (routing.RouteTable) that has an operation. A route that takes the API key asks for it
    (`security`) when the server has one (api_key); a server without one asks for none.
    The pooling routes are listed when the model pools, the audio routes for a Whisper model; token ids are bounded by vocab_size,
    min_tokens by max_model_len; image parts are offered when the model takes images, tools
    when the server can parse tool calls (--tool-call-parser, or a chat template that shows a
    known format). A request's own `chat_template` is listed only when the server takes one
    (--trust-request-chat-template: request_templates)."""
    paths: dict[str, dict] = {}
    for group in routes.paths():
        path = group.label.replace(":path}", "}")
        if (not pooling and path in POOLING_ROUTES) or (not audio and path in AUDIO_ROUTES):
            continue
        for method, route in group.methods.items():
            if route.doc is not None:
                op = _with_auth(route.doc) if api_key and route.auth else route.doc
                paths.setdefault(path, {})[method.lower()] = op
    doc = _fitted({"openapi": "3.1.0", "info": {"title": "lite-llm OpenAI-compatible server", "version": version},
                   "paths": paths,
                   "components": {"schemas": SCHEMAS,
                                  "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}},
                  vocab_size, max_model_len, images)
    if not tools:
        for name in _TOOL_BODIES:
            props = doc["components"]["schemas"][name]["properties"]
            props["tools"] = {"type": "array", "maxItems": 0,
                              "description": "none: this server parses no tool calls (see --tool-call-parser)"}
            del props["tool_choice"]            # only with tools
            doc["components"]["schemas"][name].pop("dependentRequired", None)
    if not request_templates:
        for body in doc["components"]["schemas"].values():
            body.get("properties", {}).pop("chat_template", None)
    return doc
