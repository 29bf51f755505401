"""Prompt logprobs over HTTP on the real engine (a tiny random llama in fp32): completions'
echo + logprobs and vLLM's prompt_logprobs field, against transformers' log_softmax."""
from __future__ import annotations

import numpy as np
import openai
import pytest
import torch


from .conftest import error_of, request, serving


@pytest.fixture(scope="module")
def served(tiny_checkpoint):
    from lite_llm.llm import build_async_engine
    from transformers import AutoModelForCausalLM
    path = tiny_checkpoint("llama", max_position_embeddings=256)
    engine, tokenizer, info = build_async_engine(model=str(path), max_model_len=256, kv_cache_space=0.05,
                                                 max_num_seqs=8, dtype="float32", max_num_batched_tokens=16)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with serving(engine, tokenizer, info, "tiny") as server:
        yield server, tokenizer, ref


def _ref_logprobs(ref, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return torch.log_softmax(ref(torch.tensor([ids])).logits[0].double(), -1).numpy()


def test_echo_with_logprobs_gives_the_prompt_tokens_logprobs(served):
    server, tok, ref = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    prompt = "The quick brown fox jumps over the lazy dog and keeps running"
    ids = tok.encode(prompt)
    out = client.completions.create(model="tiny", prompt=prompt, echo=True, logprobs=3, max_tokens=4,
                                    temperature=0)
    choice = out.choices[0]
    lp = choice.logprobs
    n = len(ids)
    assert choice.text.startswith(prompt) and len(lp.tokens) == n + 4
    assert "".join(lp.tokens[:n]) == tok.decode(ids, skip_special_tokens=False)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    want = _ref_logprobs(ref, ids)
    np.testing.assert_allclose(lp.token_logprobs[1:n], [want[i - 1, ids[i]] for i in range(1, n)], atol=2e-4)
    for i in range(1, n):      # keyed by text: ids decoding alike (byte pieces) share one key
        allowed = np.append(np.sort(want[i - 1])[::-1][:3], want[i - 1, ids[i]])
        for value in lp.top_logprobs[i].values():
            assert np.abs(allowed - value).min() < 2e-4


def test_vllm_prompt_logprobs_field_on_completions_and_chat(served):
    server, tok, ref = served
    ids = tok.encode("Hello world! How are you today?")
    status, _, data = request(server.port, "POST", "/v1/completions",
                              {"prompt": ids, "max_tokens": 2, "prompt_logprobs": 2, "temperature": 0})
    assert status == 200
    import json
    body = json.loads(data)
    plp = body["choices"][0]["prompt_logprobs"]
    want = _ref_logprobs(ref, ids)
    assert plp[0] is None and len(plp) == len(ids)
    for i in range(1, len(ids)):
        entry = plp[i][str(ids[i])]
        assert entry["logprob"] == pytest.approx(want[i - 1, ids[i]], abs=2e-4)
        assert entry["rank"] == int((want[i - 1] > want[i - 1, ids[i]] + 1e-5).sum()) + 1
        top = np.argsort(-want[i - 1], kind="stable")[:2]
        assert {str(t) for t in top} <= set(plp[i]) and len(plp[i]) <= 3   # the top 2 and the token itself
    status, _, data = request(server.port, "POST", "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                               "prompt_logprobs": 0})
    chat = json.loads(data)
    assert status == 200 and chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) == \
        chat["usage"]["prompt_tokens"]


@pytest.mark.parametrize("body,param", [
    ({"prompt": "a", "echo": True, "logprobs": 1, "stream": True}, "echo"),
    ({"prompt": "a", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"prompt": "a", "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt": "a", "suffix": "b"}, "suffix"),
])
def test_refused_clearly(served, body, param):
    server, _, _ = served
    status, _, data = request(server.port, "POST", "/v1/completions", body)
    assert status == 400 and error_of(data)["param"] == param
