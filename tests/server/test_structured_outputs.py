"""Structured outputs over real HTTP on 127.0.0.1: the default model (SmolLM2-135M-Instruct)
on the real engine, the official openai client; response_format (json_schema, json_object),
vLLM's guided_* fields and structured_outputs object, streaming and not, bad grammars."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from .conftest import serving


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "favourite_color": {"type": "string", "enum": ["red", "green", "blue"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16},
                    "minItems": 1, "maxItems": 3},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 24},
                                   "country": {"type": "string", "enum": ["FR", "DE", "US", "JP"]},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "country", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "favourite_color", "hobbies", "address"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Invent a person and describe them as JSON."}]


@pytest.fixture(scope="module")
def server():
    from lite_llm.llm import build_async_engine
    engine, tokenizer, info = build_async_engine(None, max_model_len=1024, kv_cache_space=0.25, max_num_seqs=32)
    with serving(engine, tokenizer, info, "smollm2") as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_json_schema_outputs_validate_in_20_of_20_requests_at_temperature_1(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}

    def one(seed: int):
        return client.chat.completions.create(model="smollm2", messages=MESSAGES, temperature=1.0,
                                              max_tokens=400, seed=seed, response_format=fmt)

    with ThreadPoolExecutor(20) as pool:       # concurrent: the engine batches them, one mask per row
        answers = list(pool.map(one, range(20)))
    texts = set()
    for answer in answers:
        choice = answer.choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)
        texts.add(choice.message.content)
    assert len(texts) > 10          # sampled, not one forced answer


def test_json_object_streamed(client):
    stream = client.chat.completions.create(model="smollm2", messages=MESSAGES, temperature=1.0, seed=1,
                                            max_tokens=300, stream=True,
                                            response_format={"type": "json_object"})
    pieces, finish = [], None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    assert isinstance(json.loads("".join(pieces)), dict)


def test_guided_regex_and_choice_on_completions_streamed_and_not(client):
    pattern = r" [A-Z][a-z]{2,8}, [0-9]{4}"
    for seed in range(4):
        out = client.completions.create(model="smollm2", prompt="Born in", max_tokens=30, temperature=1.0,
                                        seed=seed, extra_body={"guided_regex": pattern})
        assert re.fullmatch(pattern, out.choices[0].text) and out.choices[0].finish_reason == "stop"
    chunks = client.completions.create(model="smollm2", prompt="Born in", max_tokens=30, temperature=1.0,
                                       seed=9, stream=True, extra_body={"guided_regex": pattern})
    assert re.fullmatch(pattern, "".join(c.choices[0].text for c in chunks if c.choices))
    choices = ["positive", "negative", "neutral"]
    for seed in range(4):
        out = client.chat.completions.create(
            model="smollm2", temperature=1.0, seed=seed, max_tokens=10,
            messages=[{"role": "user", "content": "Sentiment of 'I love it'?"}],
            extra_body={"guided_choice": choices})
        assert out.choices[0].message.content in choices


def test_structured_outputs_object_and_guided_json(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
              "required": ["ok", "n"], "additionalProperties": False}
    out = client.completions.create(model="smollm2", prompt="JSON:", max_tokens=40, temperature=1.0, seed=2,
                                    extra_body={"structured_outputs": {"json": schema,
                                                                       "disable_any_whitespace": True}})
    jsonschema.validate(json.loads(out.choices[0].text), schema)
    assert " " not in out.choices[0].text
    out = client.completions.create(model="smollm2", prompt="JSON:", max_tokens=40, temperature=1.0, seed=3,
                                    extra_body={"guided_json": json.dumps(schema)})
    jsonschema.validate(json.loads(out.choices[0].text), schema)


@pytest.mark.parametrize("extra,problem", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "object",
                                                                  "properties": {"a": {"type": "nope"}}}}}},
     "invalid JSON schema"),
    ({"guided_regex": "(unclosed"}, "invalid regex"),
    ({"guided_grammar": "start: missing"}, "invalid grammar"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "at most one"),
    ({"guided_choice": []}, "choice"),
])
def test_bad_constraints_are_400_naming_the_problem_and_the_server_keeps_serving(client, extra, problem):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5, extra_body=extra)
    assert err.value.status_code == 400
    assert problem in err.value.body["message"]
    assert client.completions.create(model="smollm2", prompt="Hi", max_tokens=2).choices[0].text is not None
