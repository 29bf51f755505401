"""Work a client controls is bounded, and errors say no more than the field and the limit.

Chat templates sent with a request are refused unless the server trusts them; every template
renders in a bounded sandbox (a template bomb is a 400 that costs neither memory that stays
nor other clients' latency). JSON nested past the limits is a 400 before anything recurses on
it. Constraint sizes are capped before the grammar engine compiles them, and its own error text
never reaches the client. Figures (RSS growth, the watchdog's worst latencies) are printed for
the record: run with -s to see them.
"""
from __future__ import annotations

import ctypes
import gc
import json
import logging
import time

import pytest

from lite_llm.model import tokenizer as tokenizer_module
from lite_llm.model.tokenizer import TEMPLATE_MAX_ITERATIONS
from lite_llm.sampling_params import MAX_CHOICES, MAX_JSON_DEPTH, MAX_REGEX_BYTES
from lite_llm.server.chat import MAX_REQUEST_TEMPLATE_CHARS

from .conftest import CHATML, error_of, request, start_server, stop_server
from .watchdog import Watchdog

MSGS = [{"role": "user", "content": "Hi"}]
BOMBS = {
    "repeat": "{{ 'a' * 500000000 }}",
    "loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "doubling": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                "{% endfor %}{{ ns.s }}",
    "width": "{{ 'x'.ljust(900000000) }}",
    "nested lists": "{% set a = ['y' * 100000] %}{% set b = [a, a, a, a, a, a, a, a, a, a] %}"
                    "{% set c = [b, b, b, b, b, b, b, b, b, b] %}{% set d = [c, c, c, c, c, c, c, c, c, c] %}{{ d }}",
}


def rss_mb() -> float:
    """This process's resident memory (the test server runs in it)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def trim_malloc() -> None:
    """Return the allocator's free pages to the system (glibc's malloc_trim), so that resident
    memory counts what is still held, not the heap fragments freed compilations leave."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):      # not glibc: resident memory as it is
        pass


@pytest.fixture(scope="module")
def trusting():
    # bodies up to 16 MiB: the bombs below must reach the checks they test, not the body limit
    s = start_server(engine_overrides={"step_seconds": 0.001}, trust_request_chat_template=True,
                     max_body_bytes=16 << 20)
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def untrusting():
    s = start_server(engine_overrides={"step_seconds": 0.001})
    yield s
    stop_server(s)


def _no_tracebacks(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()], \
        [r.getMessage()[:200] for r in caplog.records]


# ---- chat templates ---------------------------------------------------------------------------

def test_a_request_chat_template_is_refused_unless_the_server_trusts_them(untrusting, trusting):
    template = "{% for m in messages %}SECRET-{{ m['content'] }}{% endfor %}"
    for path, body in (("/v1/chat/completions", {"messages": MSGS, "max_tokens": 2, "chat_template": template}),
                       ("/tokenize", {"messages": MSGS, "chat_template": template})):
        status, _, data = request(untrusting.port, "POST", path, body)
        assert status == 400, data
        err = error_of(data)
        assert err["param"] == "chat_template" and "--trust-request-chat-template" in err["message"]
        assert "SECRET" not in data.decode()
        status, _, data = request(trusting.port, "POST", path, body)
        assert status == 200, data
    # the trusted template is the one rendered
    tokens = json.loads(request(trusting.port, "POST", "/tokenize", {"messages": MSGS, "chat_template": template,
                                                                     "return_token_strs": True})[2])
    assert "".join(tokens["token_strs"]).startswith("SECRET")
    assert request(untrusting.port, "POST", "/tokenize", {"messages": MSGS})[0] == 200   # the model's own
    huge = "{# padding #}" * (MAX_REQUEST_TEMPLATE_CHARS // 13 + 1) + CHATML     # compiled templates are cached
    status, _, data = request(trusting.port, "POST", "/tokenize", {"messages": MSGS, "chat_template": huge})
    assert status == 400 and error_of(data)["param"] == "chat_template" and b"padding" not in data


def test_template_bombs_are_400s_that_cost_no_memory_and_no_other_clients_latency(trusting, caplog):
    for _ in range(2):      # warm: the server's own first-use allocations are not the bomb's
        assert request(trusting.port, "POST", "/tokenize", {"messages": MSGS, "chat_template": CHATML})[0] == 200
    gc.collect()
    before = rss_mb()
    peak_seconds = 0.0
    with caplog.at_level(logging.INFO), Watchdog(trusting.port, trusting.model) as dog:
        for _ in range(2):
            for name, bomb in BOMBS.items():
                for path in ("/tokenize", "/v1/chat/completions"):
                    started = time.monotonic()
                    body = {"messages": MSGS, "chat_template": bomb}
                    status, _, data = request(trusting.port, "POST", path,
                                              body if path == "/tokenize" else {**body, "max_tokens": 2})
                    peak_seconds = max(peak_seconds, time.monotonic() - started)
                    assert status == 400, (name, path, data[:300])
                    err = error_of(data)
                    assert "exceed" in err["message"], (name, err)
                    assert bomb not in err["message"] and "range(" not in err["message"]
        for k in range(4):  # a branch never taken, but jinja folds constants while compiling (then cached)
            folding = "{% if messages|length > 100 %}{{ 'x'|center(1000000) }}{% endif %}" * 30 + f"{k}"
            status, _, data = request(trusting.port, "POST", "/tokenize", {"messages": MSGS, "chat_template": folding})
            assert status == 200, data[:300]
        time.sleep(1.0)     # probes during the quiet after the last bomb too
    gc.collect()
    grown = rss_mb() - before
    dog.check()
    print(f"\ntemplate bombs: RSS +{grown:.1f} MB after {2 * len(BOMBS) * 2 + 4} bombs, slowest answer "
          f"{peak_seconds * 1000:.0f} ms; watchdog: {dog.summary()}")
    assert grown < 50, f"RSS grew {grown:.1f} MB"
    _no_tracebacks(caplog)
    assert request(trusting.port, "POST", "/tokenize", {"messages": MSGS, "chat_template": CHATML})[0] == 200


def test_template_limits_name_themselves(trusting, monkeypatch):
    # each bound on its own: the CPU-time bound (a loaded machine can reach it before a million
    # iterations) is lifted here; the bomb test above runs under it
    monkeypatch.setattr(tokenizer_module, "TEMPLATE_MAX_SECONDS", 60.0)
    cases = {"{{ 'a' * 500000000 }}": "chat template output exceeds",
             "{% for i in range(100000) %}{% for j in range(100) %}{% endfor %}{% endfor %}":
                 f"chat template loops exceed {TEMPLATE_MAX_ITERATIONS} iterations",
             "{{ 10 ** 100000000 }}": "chat template number exceeds",
             "{{ raise_exception('not for this model') }}": "not for this model"}
    for template, message in cases.items():
        status, _, data = request(trusting.port, "POST", "/tokenize", {"messages": MSGS, "chat_template": template})
        assert status == 400 and message in error_of(data)["message"], data


# Llama 3.1's template, as it ships: a system preamble with a date, tools in the first user message
LLAMA31 = """{{- bos_token }}
{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions.\\n\\n" }}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}{{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}{{- message.content | tojson }}
        {%- else %}{{- message.content }}{%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"Tool number {i}",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                               "days": {"type": "integer"}}, "required": ["city"]}}}
         for i in range(5)]
CONVERSATION = [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                    "name": "tool_1", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "{\"temp\": 21}"}] + [
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * (i % 7)} for i in range(60)]


@pytest.mark.parametrize("template", [CHATML, LLAMA31], ids=["chatml", "llama3.1"])
def test_real_templates_render_as_the_plain_sandbox_renders_them(template):
    """Bounds change nothing for a real template: the same text as jinja2's own sandbox."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from .conftest import make_tokenizer
    tok = make_tokenizer()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(ValueError(m))
    for tools in (None, TOOLS):
        for gen in (True, False):
            ours = tok.apply_chat_template(CONVERSATION, add_generation_prompt=gen, chat_template=template,
                                           tools=tools)
            ref = env.from_string(template).render(messages=CONVERSATION, tools=tools, documents=None,
                                                   add_generation_prompt=gen, bos_token=tok.bos_token,
                                                   eos_token=tok.eos_token)
            assert ours == ref and len(ours) > 500


# ---- deep JSON ----------------------------------------------------------------------------------

def _deep_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for i in range(levels):
        schema = {"anyOf": [schema, {"type": "null"}]} if i % 2 else \
            {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _deep_array(levels: int) -> dict:
    """levels + 1 levels of JSON nesting."""
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def _bodies(schema: dict) -> list[tuple[str, dict]]:
    chat = {"messages": MSGS, "max_tokens": 2}
    return [
        ("/v1/chat/completions", {**chat, "response_format": {"type": "json_schema",
                                                              "json_schema": {"name": "x", "schema": schema}}}),
        ("/v1/chat/completions", {**chat, "guided_json": schema}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2, "guided_json": json.dumps(schema)}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2, "structured_outputs": {"json": schema}}),
        ("/v1/chat/completions", {**chat, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": schema}}], "tool_choice": "required"}),
        ("/v1/responses", {"input": "x", "max_output_tokens": 2, "text": {"format": {
            "type": "json_schema", "name": "x", "schema": schema}}}),
        ("/v1/messages", {"model": "tiny", "max_tokens": 2, "messages": MSGS,
                          "output_config": {"format": {"type": "json_schema", "schema": schema}}}),
        ("/v1/chat/completions/batch", {"messages": [MSGS, MSGS], "max_tokens": 2, "guided_json": schema}),
    ]


@pytest.mark.parametrize("schema", [_deep_schema(450), _deep_array(900), _deep_array(MAX_JSON_DEPTH)],
                         ids=["object-anyOf-450", "array-900", "just-past-the-limit"])
def test_deep_schemas_are_400s_on_every_route(trusting, caplog, schema):
    with caplog.at_level(logging.INFO):
        for path, body in _bodies(schema):
            status, _, data = request(trusting.port, "POST", path, body)
            assert status == 400, (path, data[:300])
            answer = json.loads(data)
            message = answer["error"]["message"]
            if path == "/v1/messages":
                assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
            else:
                error_of(data)
            assert "nested deeper than" in message, (path, message)
    _no_tracebacks(caplog)


def test_schemas_within_the_limit_still_work(trusting):
    schema = _deep_array(MAX_JSON_DEPTH - 1)      # MAX_JSON_DEPTH levels: the innermost {} is one
    status, _, data = request(trusting.port, "POST", "/v1/completions",
                              {"prompt": "x", "max_tokens": 2, "guided_json": schema})
    assert status == 200, data


def test_deeply_nested_bodies_are_400s(trusting, caplog):
    with caplog.at_level(logging.INFO):
        for depth in (200, 100_000):
            for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/v1/responses"):
                raw = b'{"prompt": "x", "chat_template_kwargs": {"x": ' + b"[" * depth + b"]" * depth + b"}}"
                status, _, data = request(trusting.port, "POST", path, raw=raw)
                assert status == 400, (path, depth, data[:300])
                assert "nested deeper than" in error_of(data)["message"]
            raw = b'{"model": "tiny", "max_tokens": 2, "messages": ' + b"[" * depth + b"]" * depth + b"}"
            status, _, data = request(trusting.port, "POST", "/v1/messages", raw=raw)
            assert status == 400 and json.loads(data)["type"] == "error", data[:300]
        # a tool call's arguments sent as a JSON string
        args = "[" * 5000 + "]" * 5000
        status, _, data = request(trusting.port, "POST", "/v1/chat/completions", {"max_tokens": 2, "messages": [
            MSGS[0], {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": "f", "arguments": args}}]}]})
        assert status == 400 and error_of(data)["param"] == "messages[1].tool_calls[0].function.arguments", data
    _no_tracebacks(caplog)


# ---- constraint sizes and the grammar engine's words ------------------------------------------------

def test_tools_too_large_to_force_are_a_400(caplog):
    served = start_server(engine_overrides={"step_seconds": 0.001}, tool_call_parser="hermes",
                          max_body_bytes=16 << 20)
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": "string", "description": "d" * 200} for j in range(40)}}}}
        for i in range(40)]          # ~350 KB of schemas in one forced-call grammar
    try:
        with caplog.at_level(logging.INFO):
            status, _, data = request(served.port, "POST", "/v1/chat/completions",
                                      {"messages": MSGS, "max_tokens": 2, "tools": tools, "tool_choice": "required"})
            assert status == 400 and "too large for a forced tool call" in error_of(data)["message"], data[:300]
            status, _, data = request(served.port, "POST", "/v1/chat/completions",     # a few tools still work
                                      {"messages": MSGS, "max_tokens": 2, "tools": tools[:2], "tool_choice": "required"})
            assert status == 200, data[:300]
    finally:
        stop_server(served)
    _no_tracebacks(caplog)


def test_guided_choice_and_grammar_sizes_are_capped_before_compiling(trusting, caplog):
    choices = [f"choice number {i}" for i in range(100_000)]
    bombs = [({"guided_choice": choices}, f"more than {MAX_CHOICES} choices"),
             ({"guided_choice": ["x" * 70_000]}, "bytes in all"),
             ({"guided_regex": "(a|b)*" * (MAX_REGEX_BYTES // 6 + 1)}, f"longer than {MAX_REGEX_BYTES} bytes"),
             ({"guided_grammar": "start: " + " | ".join(f'"{c}"' for c in choices)}, "bytes")]
    # warm: the grammar engine's token trie is built on first use
    assert request(trusting.port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2,
                                                               "guided_choice": ["a", "b"]})[0] == 200
    gc.collect()
    before = rss_mb()
    with caplog.at_level(logging.INFO), Watchdog(trusting.port, trusting.model) as dog:
        for _ in range(2):
            for extra, message in bombs:
                started = time.monotonic()
                status, _, data = request(trusting.port, "POST", "/v1/completions",
                                          {"prompt": "x", "max_tokens": 2, **extra})
                assert status == 400, data[:300]
                assert message in error_of(data)["message"], error_of(data)
                assert time.monotonic() - started < 10
                assert b"choice number" not in data
        gc.collect()
        bombs_grown = rss_mb() - before
        for k in range(10):     # within the caps, but each compiled grammar is ~10 MB: the cache must not keep them all
            enum = {"enum": [f"value {k} {i:06d}" for i in range(12_000)]}
            status, _, data = request(trusting.port, "POST", "/v1/completions",
                                      {"prompt": "x", "max_tokens": 2, "guided_json": enum})
            assert status == 200, data[:300]
        time.sleep(1.0)
    gc.collect()
    trim_malloc()
    grown = rss_mb() - before
    dog.check()
    print(f"\ngrammar bombs: RSS +{bombs_grown:.1f} MB, then 10 large grammars within the caps: +{grown:.1f} MB "
          f"in all; watchdog: {dog.summary()}")
    assert bombs_grown < 50, f"RSS grew {bombs_grown:.1f} MB after the bombs"
    assert grown < 50, f"RSS grew {grown:.1f} MB"
    _no_tracebacks(caplog)


@pytest.mark.parametrize("extra,kind", [
    ({"guided_grammar": "start: never_defined_rule_xyz"}, "grammar"),
    ({"guided_regex": "(unclosed_group_xyz"}, "regex"),
    ({"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/nowhere_xyz"}}}}, "JSON schema"),
])
def test_grammar_engine_errors_are_a_fixed_message(trusting, extra, kind):
    status, _, data = request(trusting.port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2, **extra})
    assert status == 400, data
    assert error_of(data)["message"] == f"invalid {kind}: the grammar engine cannot compile it"
    assert b"xyz" not in data and b"panic" not in data
