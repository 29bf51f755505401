"""The whole product end to end: `python -m lite_llm serve` on the embedded default model in
a subprocess (real engine, real kernels), the official openai client over 127.0.0.1."""
from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import wait_until_serving
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-m", "lite_llm", "serve", "--port", "0", "--max-model-len", "1024",
                             "--kv-cache-space", "0.25"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        url, lines = wait_until_serving(proc)
        yield url, "".join(lines)
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_chat_streaming_and_metrics_on_the_real_engine(server):
    url, log = server
    assert "kernel variant" in log and "KV cache" in log
    client = OpenAI(base_url=url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Tell me the capital of France."}]   # see test_llm.py
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
    assert "Paris" in whole.choices[0].message.content
    assert 0 < whole.usage.completion_tokens <= 24
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0, stream=True) if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    samples = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples["lite_llm:num_requests_running"] == 0
    assert samples["lite_llm:generation_tokens_total"] >= 2 * whole.usage.completion_tokens
