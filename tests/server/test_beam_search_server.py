"""use_beam_search over HTTP (vLLM's extra field, sent with the openai client's extra_body) on
the real engine with a tiny random llama in fp32: the n best beams in transformers' order, the
beam width best_of where given, and the combinations a beam search cannot honour refused with
OpenAI's 400."""
from __future__ import annotations

import numpy as np
import openai
import pytest

from beam_ref import eos_checkpoint, hf_beams

from .conftest import error_of, request, serving

K, MAX_NEW = 4, 8


@pytest.fixture(scope="module")
def served():
    from lite_llm.llm import build_async_engine
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 300, n).tolist() for n in (4, 13)]
    path, ref, eos = eos_checkpoint("llama", prompts, K, MAX_NEW, max_position_embeddings=256)
    engine, tokenizer, info = build_async_engine(model=str(path), max_model_len=256, kv_cache_space=0.05,
                                                 max_num_seqs=8, dtype="float32", block_size=16)
    with serving(engine, tokenizer, info, "tiny") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        yield server, client, tokenizer, ref, prompts, eos


def _texts(tokenizer, beams, eos) -> list[str]:
    """The answer's text of each of transformers' beams: its EOS dropped."""
    return [tokenizer.decode(ids[:-1] if ids and ids[-1] == eos else ids, skip_special_tokens=True)
            for ids, _ in beams]


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_completions_return_transformers_beams_in_order(served, length_penalty):
    server, client, tok, ref, prompts, eos = served
    out = client.completions.create(model="tiny", prompt=prompts, n=K, max_tokens=MAX_NEW,
                                    extra_body={"use_beam_search": True, "length_penalty": length_penalty})
    assert len(out.choices) == K * len(prompts)
    for k, p in enumerate(prompts):
        want = hf_beams(ref, p, K, MAX_NEW, eos, length_penalty)
        choices = [c for c in out.choices if k * K <= c.index < (k + 1) * K]
        assert [c.text for c in sorted(choices, key=lambda c: c.index)] == _texts(tok, want, eos)
        assert [c.finish_reason for c in sorted(choices, key=lambda c: c.index)] == \
               ["stop" if ids[-1] == eos else "length" for ids, _ in want]
    assert out.usage.completion_tokens == sum(len(ids) for p in prompts
                                              for ids, _ in hf_beams(ref, p, K, MAX_NEW, eos, length_penalty))


def test_best_of_is_the_beam_width_and_n_the_beams_returned(served):
    server, client, tok, ref, prompts, eos = served
    out = client.completions.create(model="tiny", prompt=prompts[0], n=2, max_tokens=MAX_NEW,
                                    extra_body={"use_beam_search": True, "best_of": K})
    want = hf_beams(ref, prompts[0], K, MAX_NEW, eos, 1.0)[:2]
    assert [c.text for c in out.choices] == _texts(tok, want, eos)


def test_chat_returns_n_beams(served):
    server, client, tok, ref, prompts, eos = served
    messages = [{"role": "user", "content": "hello there"}]
    status, _, data = request(server.port, "POST", "/tokenize", {"model": "tiny", "messages": messages})
    assert status == 200
    import json
    ids = json.loads(data)["tokens"]
    out = client.chat.completions.create(model="tiny", messages=messages, n=3, max_tokens=MAX_NEW,
                                         extra_body={"use_beam_search": True})
    want = hf_beams(ref, ids, 3, MAX_NEW, eos, 1.0)
    assert [c.message.content for c in out.choices] == _texts(tok, want, eos)
    assert [c.index for c in out.choices] == [0, 1, 2]


@pytest.mark.parametrize("extra,param", [
    ({"stream": True}, "stream"),
    ({"logprobs": 2}, "logprobs"),
    ({"stop": ["x"]}, "stop"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"best_of": 1, "n": 2}, "best_of"),
    ({"best_of": 129}, "best_of"),
    ({"n": 129}, "n"),
    ({"length_penalty": "long"}, "length_penalty"),
])
def test_what_beams_cannot_honour_is_a_400(served, extra, param):
    server, client, tok, ref, prompts, eos = served
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "use_beam_search": True, **extra}
    status, _, data = request(server.port, "POST", "/v1/completions", body)
    assert status == 400
    err = error_of(data)
    assert err["type"] == "invalid_request_error" and err["param"] == param
    # the server keeps serving
    status, _, _ = request(server.port, "POST", "/v1/completions",
                           {"model": "tiny", "prompt": "hello", "max_tokens": 2})
    assert status == 200


def test_chat_stream_with_beams_is_a_400_and_best_of_without_beams_still_refused(served):
    server, client, *_ = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2,
                                       stream=True, extra_body={"use_beam_search": True})
    assert e.value.status_code == 400 and e.value.body["param"] == "stream"
    status, _, data = request(server.port, "POST", "/v1/completions",
                              {"model": "tiny", "prompt": "hello", "max_tokens": 2, "best_of": 2})
    assert status == 400 and error_of(data)["param"] == "best_of"


def test_a_wide_beam_search_shares_the_engine_and_a_client_leaving_ends_it():
    """Beams are counted in fair admission like n: while one request's 4 prompts x 16 beams keep
    every slot busy step after step, other clients' 4-token completions finish; the client
    resetting its connection aborts the step in flight and no further beams are submitted."""
    import json as _json
    import select
    import socket
    import struct
    import time

    from .conftest import metric_value, start_server, stop_server
    from .watchdog import Watchdog
    served = start_server(engine_overrides={"max_num_seqs": 8, "step_seconds": 0.005}, request_timeout=120)
    try:
        body = _json.dumps({"model": served.model, "prompt": [f"Prompt {i}: a story" for i in range(4)],
                            "n": 16, "max_tokens": 400, "ignore_eos": True, "use_beam_search": True}).encode()
        big = socket.create_connection(("127.0.0.1", served.port), timeout=120)
        big.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        # a step's one-token beam requests finish in the step that admits them: queued is what shows
        end = time.monotonic() + 20.0
        while metric_value(served.port, "lite_llm:num_requests_waiting") < 8 and time.monotonic() < end:
            time.sleep(0.01)
        assert metric_value(served.port, "lite_llm:num_requests_waiting") >= 8   # more beams than slots
        with Watchdog(served.port, served.model) as dog:
            end = time.monotonic() + 20.0     # liveness bound
            while time.monotonic() < end and sum(p.status == 200 for p in dog.of("completion")) < 4:
                time.sleep(0.05)
        print(f"\nwatchdog under a 4 x 16 beam search: {dog.summary()}")
        dog.check()
        assert sum(p.status == 200 for p in dog.of("completion")) >= 4
        assert not select.select([big], [], [], 0)[0], "the beam search ended before the probes: nothing shared"
        big.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        big.close()
        end = time.monotonic() + 10.0
        while time.monotonic() < end and (metric_value(served.port, "lite_llm:num_requests_running")
                                          + metric_value(served.port, "lite_llm:num_requests_waiting")):
            time.sleep(0.05)
        # no further step submitted: nothing is prefilled any more
        before = metric_value(served.port, "lite_llm:prompt_tokens_total")
        time.sleep(0.5)
        assert metric_value(served.port, "lite_llm:prompt_tokens_total") == before
        assert metric_value(served.port, "lite_llm:num_requests_running") == 0
        assert metric_value(served.port, "lite_llm:num_requests_waiting") == 0
    finally:
        stop_server(served)


def test_chat_batch_returns_each_conversations_best_beam(served):
    """vLLM's /v1/chat/completions/batch: n = 1, best_of the beam width, one best beam each."""
    import json
    server, client, tok, ref, prompts, eos = served
    conversations = [[{"role": "user", "content": "hello there"}], [{"role": "user", "content": "a story"}]]
    want = []
    for conv in conversations:
        status, _, data = request(server.port, "POST", "/tokenize", {"model": "tiny", "messages": conv})
        want.append(_texts(tok, hf_beams(ref, json.loads(data)["tokens"], K, MAX_NEW, eos, 1.0)[:1], eos)[0])
    status, _, data = request(server.port, "POST", "/v1/chat/completions/batch",
                              {"model": "tiny", "messages": conversations, "max_tokens": MAX_NEW,
                               "use_beam_search": True, "best_of": K})
    assert status == 200, data
    choices = sorted(json.loads(data)["choices"], key=lambda c: c["index"])
    assert [c["message"]["content"] for c in choices] == want
