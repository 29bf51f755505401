"""Speculative decoding behind the HTTP server (a tiny random llama in fp32, n-gram drafts):
streamed and plain completions equal a non-speculative engine's greedy ones, /metrics shows
vLLM's spec_decode_* counters, and a structured-output request (never drafted) still
follows its schema."""
from __future__ import annotations

import json

import openai
import pytest

from .conftest import metric_value, serving

NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}'


def _engine(path, spec):
    from lite_llm.llm import build_async_engine
    return build_async_engine(model=str(path), max_model_len=256, kv_cache_space=0.05, max_num_seqs=8,
                              dtype="float32", speculative_config=spec)


@pytest.fixture(scope="module")
def path(tiny_checkpoint):
    return tiny_checkpoint("llama", max_position_embeddings=256)


PROMPTS = ["one two three one two three one two", "the cat and the dog and the cat and the"]


def _completions(server, stream: bool) -> list[str]:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    texts = []
    for prompt in PROMPTS:
        kw = dict(model="tiny", prompt=prompt, max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
        if stream:
            texts.append("".join(c.choices[0].text for c in client.completions.create(stream=True, **kw)))
        else:
            texts.append(client.completions.create(**kw).choices[0].text)
    return texts


def test_speculative_server_answers_as_the_plain_one(path):
    engine, tokenizer, info = _engine(path, None)
    with serving(engine, tokenizer, info, "tiny") as server:
        want = _completions(server, stream=False)
    engine, tokenizer, info = _engine(path, NGRAM)
    with serving(engine, tokenizer, info, "tiny") as server:
        assert _completions(server, stream=False) == want
        assert _completions(server, stream=True) == want
        drafted = metric_value(server.port, "lite_llm:spec_decode_num_draft_tokens_total")
        accepted = metric_value(server.port, "lite_llm:spec_decode_num_accepted_tokens_total")
        first = metric_value(server.port, "lite_llm:spec_decode_num_accepted_tokens_per_pos_total", {"position": "0"})
        assert drafted >= accepted >= first > 0
        assert metric_value(server.port, "lite_llm:spec_decode_num_drafts_total") > 0

        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
        schema = {"type": "object", "properties": {"c": {"enum": ["red", "green"]}}, "required": ["c"],
                  "additionalProperties": False}
        out = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=60, temperature=0,
                                        extra_body={"structured_outputs": {"json": schema}})
        assert json.loads(out.choices[0].text)["c"] in ("red", "green")
