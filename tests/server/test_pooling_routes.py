"""Pooling routes (lite_llm/server/pooling.py) on live servers over real pooling engines: a tiny
random BERT embedder and a tiny random cross-encoder built by the tests, and the generative
fake engine for the wrong-runner answers."""
from __future__ import annotations

import base64
import sys
from pathlib import Path

import numpy as np
import pytest

from lite_llm.engine.assemble import build_async_engine
from lite_llm.server.app import create_server

from .conftest import error_of, request, start_server, stop_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import tiny_checkpoint_path  # noqa: E402

KEY = "sekret"
ROUTES = ["/v1/embeddings", "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"]
AUTH = {"Authorization": f"Bearer {KEY}"}


def _serve(arch: str):
    engine, tokenizer, info = build_async_engine(str(tiny_checkpoint_path(arch)), dtype="float32", runner="pooling")
    server = create_server(engine, tokenizer, arch, info["max_model_len"], api_key=KEY, kernel_info=info,
                           vocab_size=info["vocab_size"], request_timeout=2.0)
    server.start()
    return server, engine


@pytest.fixture(scope="module")
def embedder():
    server, engine = _serve("bert")
    yield server, engine
    server.drain(2.0)


@pytest.fixture(scope="module")
def reranker():
    server, engine = _serve("bert_cls")
    yield server, engine
    server.drain(2.0)


def _post(server, path, body, auth=True):
    import json
    status, _, data = request(server.port, "POST", path, body, headers=AUTH if auth else None)
    return status, json.loads(data) if data else None


@pytest.mark.parametrize("route", ROUTES)
def test_every_pooling_route_needs_the_api_key(embedder, route):
    server, _ = embedder
    status, body = _post(server, route, {"input": "hi", "text_1": "a", "text_2": "b", "query": "q",
                                         "documents": ["d"]}, auth=False)
    assert status == 401 and body["error"]["type"] == "authentication_error"


def test_openai_client_float_and_base64(embedder):
    import openai
    server, engine = embedder
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    texts = ["the cat sat on the mat", "hello world", "café"]
    want = np.stack([r / np.linalg.norm(r) for r in engine.pool(
        [_item(engine, t) for t in texts])])
    as_float = client.embeddings.create(model="bert", input=texts, encoding_format="float")
    got = np.array([d.embedding for d in as_float.data])
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert [d.index for d in as_float.data] == [0, 1, 2]
    n_tokens = sum(len(engine.tokenizer.encode(t)) for t in texts)
    assert as_float.usage.prompt_tokens == n_tokens == as_float.usage.total_tokens
    as_b64 = client.embeddings.create(model="bert", input=texts, encoding_format="base64")
    # asked for explicitly, the client hands the base64 text over as it came
    got64 = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in as_b64.data])
    np.testing.assert_allclose(got64, want, atol=1e-6)
    # the client leaves encoding_format out -> asks for base64 and decodes it
    default = client.embeddings.create(model="bert", input=texts[0])
    np.testing.assert_allclose(default.data[0].embedding, want[0], atol=1e-6)


def _item(engine, text):
    from lite_llm.engine.pooling import make_item
    return make_item(engine.tokenizer.encode(text), None, vocab_size=engine.spec.config.vocab_size,
                     max_model_len=engine.spec.max_model_len)


def test_token_id_inputs_and_raw_base64(embedder):
    server, engine = embedder
    status, body = _post(server, "/v1/embeddings", {"input": [[5, 6, 7], [8, 9]], "encoding_format": "base64"})
    assert status == 200
    from lite_llm.engine.pooling import PoolItem
    rows = engine.pool([PoolItem(np.array([5, 6, 7], np.int32)), PoolItem(np.array([8, 9], np.int32))])
    for d, r in zip(body["data"], rows):
        v = np.frombuffer(base64.b64decode(d["embedding"]), "<f4")
        np.testing.assert_allclose(v, r / np.linalg.norm(r), atol=1e-6)
    assert body["usage"]["prompt_tokens"] == 5
    status, body = _post(server, "/v1/embeddings", {"input": [5, 6, 7]})
    assert status == 200 and len(body["data"]) == 1
    status, body = _post(server, "/pooling", {"input": "hello"})
    assert status == 200 and len(body["data"][0]["data"]) == 64


BAD = [
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": ""}, "empty"),
    ("/v1/embeddings", {"input": ["ok", ""]}, "empty"),
    ("/v1/embeddings", {"input": [[1, 2, 100000]]}, "outside the vocabulary"),
    ("/v1/embeddings", {"input": [5] * 131}, "131 tokens, more than the model's maximum of 130"),
    ("/v1/embeddings", {"input": "hi", "dimensions": 16}, "Matryoshka"),
    ("/v1/embeddings", {"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ("/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q"}, "documents"),
    ("/score", {"text_1": "a"}, "text_2"),
]


@pytest.mark.parametrize("path,body,words", BAD)
def test_bad_input_is_a_400_and_the_server_keeps_serving(embedder, path, body, words):
    server, _ = embedder
    status, answer = _post(server, path, body)
    assert status == 400, answer
    err = answer["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert words in err["message"]
    status, _ = _post(server, "/v1/embeddings", {"input": "still here"})
    assert status == 200


def test_truncate_prompt_tokens(embedder):
    server, _ = embedder
    status, body = _post(server, "/v1/embeddings", {"input": [5] * 131, "truncate_prompt_tokens": 100})
    assert status == 200 and body["usage"]["prompt_tokens"] == 100


def test_rerank_and_score_on_a_cross_encoder(reranker):
    from sentence_transformers import CrossEncoder
    server, _ = reranker
    query, docs = "the cat sat on the mat", ["the dog ate the bone", "hello world", "the quick brown fox"]
    want = CrossEncoder(str(tiny_checkpoint_path("bert_cls")), device="cpu").predict([(query, d) for d in docs])
    for route in ("/rerank", "/v1/rerank", "/v2/rerank"):
        status, body = _post(server, route, {"query": query, "documents": docs, "top_n": 2})
        assert status == 200
        assert [r["index"] for r in body["results"]] == list(np.argsort(-want)[:2])
        for r in body["results"]:
            assert abs(r["relevance_score"] - want[r["index"]]) < 1e-4
            assert r["document"]["text"] == docs[r["index"]]
    status, body = _post(server, "/v1/score", {"text_1": query, "text_2": docs})
    assert status == 200
    np.testing.assert_allclose([d["score"] for d in body["data"]], want, atol=1e-4)
    status, body = _post(server, "/score", {"text_1": [query, query], "text_2": docs[:2]})
    assert status == 200 and len(body["data"]) == 2


def test_a_pooling_model_asked_to_generate(embedder):
    server, _ = embedder
    status, body = _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    assert status == 400 and "'pooling' runner" in body["error"]["message"]
    status, body = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and "'pooling' runner" in body["error"]["message"]


def test_a_generative_model_asked_to_embed():
    served = start_server(api_key=KEY)
    try:
        for route, body in (("/v1/embeddings", {"input": "hi"}), ("/rerank", {"query": "q", "documents": ["d"]})):
            status, _, data = request(served.port, "POST", route, body, headers=AUTH)
            assert status == 400 and "'generate' runner" in error_of(data)["message"]
    finally:
        stop_server(served)


def test_metrics_count_pooling_requests(embedder):
    server, _ = embedder
    _post(server, "/v1/embeddings", {"input": ["a b c", "d"]})
    status, _, data = request(server.port, "GET", "/metrics", headers=AUTH)
    text = data.decode()
    assert status == 200
    prompt = [line for line in text.splitlines() if line.startswith("lite_llm:prompt_tokens_total")]
    assert prompt and float(prompt[0].split()[-1]) > 0
    assert "lite_llm:request_queue_time_seconds_count" in text


def _validator(doc: dict, name: str):
    """A JSON Schema validator of one of the document's component schemas ($refs resolved in it)."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012
    registry = Registry().with_resource("urn:doc", Resource(contents=doc, specification=DRAFT202012))
    return Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{name}"}, registry=registry)


def test_openapi_documents_every_route_and_the_pooling_bodies(embedder, reranker):
    """/openapi.json lists every route the server answers (pooling, LoRA, the rest) with its
    methods; the pooling schemas name exactly the fields the handlers read, and real answers
    (and the bodies that produced them) validate against them."""
    import json

    from openapi_spec_validator import validate

    from lite_llm.server import pooling as pooling_routes
    from lite_llm.server import webui
    from lite_llm.server.openapi import AUDIO_ROUTES, SCHEMAS
    from lite_llm.server.routes import route_table
    server, _ = embedder
    status, _, data = request(server.port, "GET", "/openapi.json", headers=AUTH)
    assert status == 200
    doc = json.loads(data)
    validate(doc)
    paths = doc["paths"]
    for group in route_table(web_ui=True).paths():
        if webui.is_page_route(group.label):
            continue
        route = group.label.replace(":path}", "}")
        if route in AUDIO_ROUTES:           # listed for a Whisper model only (test_whisper_server.py)
            continue
        assert route in paths, f"{route} is served but not in /openapi.json"
        assert {m.lower() for m in group.methods} <= set(paths[route]), route
    for route in pooling_routes.ROUTES:
        op = paths[route]["post"]
        assert op["security"] == [{"bearer": []}] and {"200", "400", "401"} <= set(op["responses"])
    kinds = {"embeddings": "EmbeddingRequest", "pooling": "PoolingRequest", "score": "ScoreRequest",
             "rerank": "RerankRequest"}
    for kind, schema in kinds.items():
        assert set(SCHEMAS[schema]["properties"]) == pooling_routes.FIELDS[kind], kind
    image = SCHEMAS["ChatMessage"]["properties"]["content"]["oneOf"][2]["items"]["oneOf"]
    assert {p["properties"]["type"]["enum"][0] for p in image} == {"text", "image_url"}

    asks = [(embedder[0], "/v1/embeddings", {"input": ["a b", "c"], "encoding_format": "float"},
             "EmbeddingRequest", "EmbeddingResponse"),
            (embedder[0], "/v1/embeddings", {"input": [[5, 6, 7]], "encoding_format": "base64"},
             "EmbeddingRequest", "EmbeddingResponse"),
            (embedder[0], "/pooling", {"input": "a b"}, "PoolingRequest", "PoolingResponse"),
            (reranker[0], "/score", {"text_1": "q", "text_2": ["a", "b"]}, "ScoreRequest", "ScoreResponse"),
            (reranker[0], "/v2/rerank", {"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1},
             "RerankRequest", "RerankResponse")]
    for srv, route, body, req_schema, resp_schema in asks:
        _validator(doc, req_schema).validate(body)
        status, answer = _post(srv, route, body)
        assert status == 200, (route, answer)
        _validator(doc, resp_schema).validate(answer)
    for bad_body, schema in (({"input": []}, "EmbeddingRequest"), ({"query": "q", "documents": []}, "RerankRequest"),
                             ({"input": "x", "truncate_prompt_tokens": 0}, "EmbeddingRequest")):
        assert not _validator(doc, schema).is_valid(bad_body), bad_body


def _serve_args(*argv: str):
    import argparse
    from lite_llm.server import app
    p = argparse.ArgumentParser()
    app.add_arguments(p)
    return p.parse_args(list(argv))


def test_tensor_parallel_is_refused_for_pooling_models_by_name():
    from lite_llm import LLM
    from lite_llm.server.app import start_engine
    path = str(tiny_checkpoint_path("bert"))
    with pytest.raises(SystemExit, match="tensor parallelism is not supported for pooling models.*--data-parallel-size"):
        start_engine(_serve_args(path, "--tensor-parallel-size", "2"))
    with pytest.raises(ValueError, match="--tensor-parallel-size 2: tensor parallelism is not supported for pooling"):
        LLM(path, tensor_parallel_size=2)


def test_data_parallel_pooling_replicas(embedder):
    """serve --data-parallel-size 2 on a pooling model: two replica processes, one core each;
    requests alternate between them (and run concurrently), every answer equal to one engine's,
    /metrics the replicas' sum, bad input still a 400."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from lite_llm.server.app import start_engine

    from .conftest import serving
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("data parallel over 1 core per replica needs 2 CPUs")
    old = os.environ.get("LITE_LLM_CPU_OMP_THREADS_BIND")
    os.environ["LITE_LLM_CPU_OMP_THREADS_BIND"] = "|".join(map(str, cpus))
    try:
        engine, tokenizer, info = start_engine(_serve_args(str(tiny_checkpoint_path("bert")), "--dtype", "float32",
                                                           "--data-parallel-size", "2"))
    finally:
        if old is None:
            del os.environ["LITE_LLM_CPU_OMP_THREADS_BIND"]
        else:
            os.environ["LITE_LLM_CPU_OMP_THREADS_BIND"] = old
    for replica, want in zip(info["replicas"], cpus):
        assert os.sched_getaffinity(replica["pid"]) == {want}
    single, _ = embedder
    texts = [f"sentence number {i} " + "word " * (i % 7) for i in range(12)]
    with serving(engine, tokenizer, info, "bert", api_key=KEY) as server:
        def ask(text):
            return _post(server, "/v1/embeddings", {"input": text})
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(ask, texts))
        for text, (status, body) in zip(texts, answers):
            assert status == 200
            _, want = _post(single, "/v1/embeddings", {"input": text})
            np.testing.assert_allclose(body["data"][0]["embedding"], want["data"][0]["embedding"], atol=1e-5)
        status, body = _post(server, "/v1/embeddings", {"input": texts[:5]})      # one request, several inputs
        assert status == 200 and [d["index"] for d in body["data"]] == list(range(5))
        _, want = _post(single, "/v1/embeddings", {"input": texts[:5]})
        np.testing.assert_allclose([d["embedding"] for d in body["data"]], [d["embedding"] for d in want["data"]],
                                   atol=1e-5)
        status, body = _post(server, "/v1/embeddings", {"input": []})
        assert status == 400 and body["error"]["param"] == "input"
        status, body = _post(server, "/v1/embeddings", {"input": [[1] * 5000]})
        assert status == 400
        per_replica = [s.request_success_total.get("stop", 0) for s in engine.engine.replica_stats()]
        assert sum(per_replica) == len(texts) + 5 and min(per_replica) > 0, per_replica
        status, _, data = request(server.port, "GET", "/metrics", headers=AUTH)
        assert status == 200 and "lite_llm:prompt_tokens_total" in data.decode()
    assert all(not r.process.is_alive() for r in engine.engine.replicas)     # shut down with the server
