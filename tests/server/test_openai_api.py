"""The official openai client against a live server: shapes, streaming, n, stop, seed, logprobs."""
from __future__ import annotations

import json

import pytest
from openapi_spec_validator import validate
from prometheus_client.parser import text_string_to_metric_families

from .conftest import metric_value, request, start_server, stop_server

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


def test_models_list(client, served):
    models = client.models.list()
    assert [m.id for m in models.data] == [served.model]
    assert models.data[0].max_model_len == served.server.state.ctx.max_model_len


def test_completion_shape_and_usage(client, served):
    r = client.completions.create(model=served.model, prompt="The quick brown fox", max_tokens=7,
                                  temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == served.model
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length" and r.choices[0].text
    prompt_len = len(served.tokenizer.encode("The quick brown fox"))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        prompt_len, 7, prompt_len + 7)


def test_chat_shape_and_usage(client, served):
    r = client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=5, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content and r.choices[0].finish_reason == "length"
    rendered = served.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    assert r.usage.prompt_tokens == len(served.tokenizer.encode(rendered, add_special_tokens=False))
    assert r.usage.completion_tokens == 5


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_streaming_equals_non_streaming_at_temperature_0(client, served, kind):
    if kind == "chat":
        whole = client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=24,
                                               temperature=0)
        chunks = list(client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=24,
                                                     temperature=0, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        expected = whole.choices[0].message.content
    else:
        whole = client.completions.create(model=served.model, prompt="Hello world", max_tokens=24,
                                          temperature=0)
        chunks = list(client.completions.create(model=served.model, prompt="Hello world",
                                                max_tokens=24, temperature=0, stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        expected = whole.choices[0].text
    assert len(chunks) > 3 and text == expected
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason]


def test_stream_usage_chunk(client, served):
    chunks = list(client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=6,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 6
    assert last.usage.total_tokens == last.usage.prompt_tokens + 6


def test_raw_sse_framing(served):
    status, headers, data = request(served.port, "POST", "/v1/completions", {
        "model": served.model, "prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = data.decode("utf-8").split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    bodies = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert sum(1 for b in bodies if b["choices"][0]["finish_reason"] == "length") == 1


def test_n_choices(client, served):
    r = client.completions.create(model=served.model, prompt="Numbers", max_tokens=6, n=3,
                                  temperature=1.0, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 18
    chunks = list(client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=4, n=2,
                                                 temperature=1.0, stream=True))
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}


def test_prompt_list_and_token_ids(client, served):
    ids = served.tokenizer.encode("Hello world")
    r = client.completions.create(model=served.model, prompt=["Hello world", "Café"], max_tokens=3,
                                  temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1]
    by_ids = client.completions.create(model=served.model, prompt=ids, max_tokens=3, temperature=0)
    first = next(c for c in r.choices if c.index == 0)
    assert by_ids.choices[0].text == first.text
    assert by_ids.usage.prompt_tokens == len(ids)


def test_echo(client, served):
    r = client.completions.create(model=served.model, prompt="Hello world", max_tokens=3, temperature=0,
                                  echo=True)
    plain = client.completions.create(model=served.model, prompt="Hello world", max_tokens=3,
                                      temperature=0)
    assert r.choices[0].text == "Hello world" + plain.choices[0].text


def test_stop_string_cuts_the_text(client, served):
    full = client.completions.create(model=served.model, prompt="The lazy dog", max_tokens=30,
                                     temperature=0).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop.strip(), full
    r = client.completions.create(model=served.model, prompt="The lazy dog", max_tokens=30,
                                  temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.index(stop)]


def test_stop_token_ids(served, client):
    ids = served.tokenizer.encode("The lazy dog")
    full = client.completions.create(model=served.model, prompt=ids, max_tokens=12, temperature=0,
                                     logprobs=0)
    tokens = full.choices[0].logprobs.tokens
    target = served.tokenizer.encode(tokens[5], add_special_tokens=False)
    assert len(target) == 1
    r = client.completions.create(model=served.model, prompt=ids, max_tokens=12, temperature=0,
                                  extra_body={"stop_token_ids": target})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == tokens.index(tokens[5]) + 1


def test_seed_reproducible(client, served):
    def sample(seed):
        return client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=16,
                                              temperature=1.0, seed=seed).choices[0].message.content
    assert sample(1234) == sample(1234)
    assert sample(1234) != sample(4321)


def test_logprobs_completion_and_chat(client, served):
    r = client.completions.create(model=served.model, prompt="Hello", max_tokens=5, temperature=0,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(t) == 3 for t in lp.top_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    c = client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 2 for t in content)
    assert "".join(t.token for t in content) == c.choices[0].message.content
    assert all(bytes(t.bytes).decode() == t.token for t in content)
    streamed = list(client.chat.completions.create(model=served.model, messages=CHAT, max_tokens=4,
                                                   temperature=0, logprobs=True, top_logprobs=2,
                                                   stream=True))
    tokens = [t.token for ch in streamed if ch.choices and ch.choices[0].logprobs
              for t in ch.choices[0].logprobs.content]
    assert tokens == [t.token for t in content]


def test_text_parts_and_developer_role(client, served):
    parts = [{"role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi"}]}]
    r = client.chat.completions.create(model=served.model, messages=parts, max_tokens=3, temperature=0)
    rendered = served.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say\nhi"}])
    assert r.usage.prompt_tokens == len(served.tokenizer.encode(rendered, add_special_tokens=False))


def test_tokenize_detokenize(served):
    status, _, data = request(served.port, "POST", "/tokenize", {"prompt": "Café 🙂", "return_token_strs": True})
    body = json.loads(data)
    assert status == 200 and body["count"] == len(body["tokens"]) == len(body["token_strs"])
    assert body["tokens"] == served.tokenizer.encode("Café 🙂")
    status, _, data = request(served.port, "POST", "/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and json.loads(data)["prompt"].endswith("Café 🙂")
    status, _, data = request(served.port, "POST", "/tokenize", {"messages": CHAT})
    rendered = served.tokenizer.apply_chat_template(CHAT)
    assert json.loads(data)["tokens"] == served.tokenizer.encode(rendered, add_special_tokens=False)


def test_health_version_openapi(served):
    assert request(served.port, "GET", "/health")[0] == 200
    status, _, data = request(served.port, "GET", "/version")
    assert status == 200 and json.loads(data)["kernel_variant"] is not None
    status, _, data = request(served.port, "GET", "/openapi.json")
    doc = json.loads(data)
    validate(doc)
    assert set(doc["paths"]) >= {"/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize",
                                 "/detokenize", "/health", "/version", "/metrics"}


def test_metrics_parse_and_count(client, served):
    before = metric_value(served.port, "lite_llm:generation_tokens_total")
    client.completions.create(model=served.model, prompt="Hello", max_tokens=5, temperature=0)
    status, headers, data = request(served.port, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(data.decode())}
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_hits", "prefix_cache_queries", "prompt_tokens", "generation_tokens",
                 "request_success", "time_to_first_token_seconds", "inter_token_latency_seconds",
                 "e2e_request_latency_seconds", "request_queue_time_seconds", "kernel_info",
                 "num_threads"):
        assert "lite_llm:" + name in families, name
    assert families["lite_llm:time_to_first_token_seconds"].type == "histogram"
    assert metric_value(served.port, "lite_llm:generation_tokens_total") >= before + 5
    assert metric_value(served.port, "lite_llm:request_success_total", {"finished_reason": "length"}) >= 1
    count = metric_value(served.port, "lite_llm:e2e_request_latency_seconds_count")
    inf = metric_value(served.port, "lite_llm:e2e_request_latency_seconds_bucket", {"le": "+Inf"})
    assert count == inf >= 1


def test_generation_config_defaults():
    s = start_server(generation_config={"max_new_tokens": 3, "temperature": 0.0})
    try:
        import openai
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        r = c.chat.completions.create(model=s.model, messages=CHAT)
        assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
        again = c.chat.completions.create(model=s.model, messages=CHAT)
        assert again.choices[0].message.content == r.choices[0].message.content   # greedy default
        longer = c.chat.completions.create(model=s.model, messages=CHAT, max_tokens=6)
        assert longer.usage.completion_tokens == 6
    finally:
        stop_server(s)


def test_api_key():
    s = start_server(api_key="sekret")
    try:
        import openai
        ok = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0)
        assert ok.models.list().data[0].id == s.model
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            status, _, data = request(s.port, "POST", "/v1/completions", {"prompt": "x"}, headers=headers)
            assert status == 401 and error_type(data) == "authentication_error"
        assert request(s.port, "GET", "/health")[0] == 200       # probes need no key
    finally:
        stop_server(s)


def error_type(data: bytes) -> str:
    return json.loads(data)["error"]["type"]


def test_token_bytes_of_partial_utf8_tokens(served):
    from lite_llm.server.logprobs import token_bytes
    tok = served.tokenizer
    ids = tok.encode("日本語", add_special_tokens=False)
    raw = b"".join(bytes(token_bytes(tok, i, tok.decode([i]))) for i in ids)
    assert raw.decode("utf-8") == "日本語"
    from lite_llm.server.logprobs import byte_level_decoder
    stand_in = {b: c for c, b in byte_level_decoder().items()}
    for byte in (0xE6, 0x97, 0xA5):           # the three bytes of 日, each a token of its own
        i = tok.token_to_id(stand_in[byte])
        assert tok.decode([i]) == "\ufffd" and token_bytes(tok, i, "\ufffd") == [byte]
    assert token_bytes(tok, ids[0], "abc") == list(b"abc")


def test_request_id_names_the_response(served):
    status, _, data = request(served.port, "POST", "/v1/completions",
                              {"prompt": "Hi", "max_tokens": 2, "request_id": "job-42"})
    assert status == 200 and json.loads(data)["id"] == "cmpl-job-42"
    status, _, data = request(served.port, "POST", "/v1/completions",
                              {"prompt": "Hi", "max_tokens": 2, "request_id": ""})
    assert status == 400 and json.loads(data)["error"]["param"] == "request_id"


def test_openapi_schemas_cover_every_accepted_field():
    from lite_llm.server.validation import CHAT_FIELDS, COMPLETION_FIELDS
    from lite_llm.server.openapi import SCHEMAS
    assert COMPLETION_FIELDS == set(SCHEMAS["CompletionRequest"]["properties"])
    assert CHAT_FIELDS == set(SCHEMAS["ChatCompletionRequest"]["properties"])
