"""Server test fixtures: a tiny byte-level BPE tokenizer, the engine, a live server.

`make_engine(**overrides)` is the one place an engine is built: the real AsyncEngine and
LLMEngine over a fake model runner (fake_model.py; overrides: step_seconds, max_queue,
max_num_seqs, runner_cls). Set LITE_LLM_SERVER_TEST_MODEL to a model path (or "default") to
run every server test against a real model via lite_llm.llm.build_async_engine instead.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
from dataclasses import dataclass
from typing import Any

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from lite_llm.model.tokenizer import Tokenizer
from lite_llm.server.app import LiteServer, create_server

from .fake_model import fake_runner_engine, record_aborts

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A paged KV cache keeps every sequence's keys and values in fixed-size blocks.",
    "Continuous batching admits new requests between decoding steps.",
    "Café, naïve, façade, jalapeño: a few accents; 日本語のテキスト; emoji 🙂🚀.",
    "Hello world! How are you today? I am fine, thank you.",
    "Numbers 0123456789 and symbols #$%&*()[]{}<>+-=/\\|~^_",
] * 20
MAX_MODEL_LEN = 512


def make_tokenizer() -> Tokenizer:
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  show_progress=False)
    backend.train_from_iterator(CORPUS, trainer)
    return Tokenizer(backend, bos_token="<|endoftext|>", eos_token="<|im_end|>", chat_template=CHATML,
                     extra_special_tokens=("<|im_start|>",))


@dataclass
class Served:
    server: LiteServer
    engine: Any
    tokenizer: Any
    model: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port


def make_engine(tokenizer: Any, **overrides: Any) -> tuple[Any, Any, dict]:
    model = os.environ.get("LITE_LLM_SERVER_TEST_MODEL")
    if model:
        from lite_llm.llm import build_async_engine
        real = {"kv_cache_space": 0.25, "max_model_len": 1024, "max_num_seqs": 32,
                **{k: v for k, v in overrides.items() if k in ("max_queue", "max_num_seqs")}}  # no fake knobs
        engine, tokenizer, info = build_async_engine(model=None if model == "default" else model, **real)
        record_aborts(engine)
        return engine, tokenizer, info
    info = {"max_model_len": MAX_MODEL_LEN, "kernel_variant": "fake", "num_threads": 1,
            "weight_bytes": 1 << 20, "model_name": "tiny"}
    return fake_runner_engine(tokenizer, max_model_len=MAX_MODEL_LEN, **overrides), tokenizer, info


def start_server(api_key: str | None = None, generation_config: dict | None = None,
                 engine_overrides: dict | None = None, **server_kwargs: Any) -> Served:
    engine, tokenizer, info = make_engine(make_tokenizer(), **(engine_overrides or {}))
    kwargs = {"request_timeout": 2.0, **server_kwargs}
    server = create_server(engine, tokenizer, "tiny", info["max_model_len"], api_key=api_key,
                           generation_config=generation_config, kernel_info=info, **kwargs)
    server.start()
    return Served(server, engine, tokenizer, "tiny")


@contextlib.contextmanager
def serving(engine: Any, tokenizer: Any, info: dict, name: str, **server_kwargs: Any):
    """A server over a real engine (build_async_engine's triple) for the block's duration; then
    the HTTP side stops and the engine shuts down."""
    server = create_server(engine, tokenizer, name, info["max_model_len"], kernel_info=info,
                           vocab_size=info.get("vocab_size"), **server_kwargs)
    server.start()
    try:
        yield server
    finally:
        server.state.draining = True
        server.shutdown()
        server.server_close()
        engine.shutdown(5.0)


def stop_server(served: Served) -> None:
    served.server.drain(grace_seconds=2.0)


@pytest.fixture(scope="module")
def served():
    s = start_server(engine_overrides={"step_seconds": 0.001})
    yield s
    stop_server(s)


@pytest.fixture()
def client(served):
    import openai
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def request(port: int, method: str, path: str, body: Any = None, headers: dict | None = None,
            raw: bytes | None = None, timeout: float = 60.0) -> tuple[int, dict, bytes]:
    """One raw HTTP request on its own connection: (status, headers, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def error_of(data: bytes) -> dict:
    body = json.loads(data)
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    return err


def metric_value(port: int, name: str, labels: dict | None = None) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    status, _, data = request(port, "GET", "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(data.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                return sample.value
    raise KeyError(name)
