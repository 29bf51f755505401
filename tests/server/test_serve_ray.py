"""Ray Serve: a local Ray on 127.0.0.1 with 2 CPUs, lite_llm.serve_ray.build_app deploying 2
replicas of the default model (1 CPU each), answering the official openai client through Ray's
HTTP proxy, streaming and not. Skipped only where Ray Serve is not installed (CI installs it
with the test extra)."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'lite-llm[ray]' (CI installs it)")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'lite-llm[ray]'")
import openai  # noqa: E402

from lite_llm.serve_ray import build_app, serve_options  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NAME = "smollm2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_url():
    port = free_port()
    # the replicas import this checkout's lite_llm (and its built kernels), whatever is installed
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = build_app(None, num_replicas=2, num_cpus_per_replica=1, served_model_name=[NAME],
                        max_model_len=1024, kv_cache_space=0.25, max_num_seqs=8)
        serve.run(app, name="lite-llm", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_ray_replicas_answer_the_openai_client_streaming_and_not(ray_url):
    status = serve.status().applications["lite-llm"].deployments["lite-llm"]
    assert status.replica_states.get("RUNNING") == 2
    client = openai.OpenAI(base_url=ray_url + "/v1", api_key="x", max_retries=0, timeout=300)
    assert [m.id for m in client.models.list().data] == [NAME]
    messages = [{"role": "user", "content": "Tell me the capital of France."}]
    for _ in range(2):
        whole = client.chat.completions.create(model=NAME, messages=messages, max_tokens=24, temperature=0)
        assert "Paris" in whole.choices[0].message.content
        assert 0 < whole.usage.completion_tokens <= 24
        chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=24, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
        assert len(chunks) > 3                               # streamed, not one buffered answer
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            whole.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    with pytest.raises(openai.NotFoundError, match="does not exist"):     # the server's own errors
        client.completions.create(model="nope", prompt="Hi", max_tokens=1)


def test_build_app_takes_serve_flags_by_name_and_refuses_unknown_ones():
    args = serve_options(max_model_len=512, tool_call_parser="hermes")
    assert args.max_model_len == 512 and args.tool_call_parser == "hermes" and args.port == 8000
    with pytest.raises(TypeError, match="unknown serve option"):
        serve_options(max_model_length=512)
    with pytest.raises(ValueError, match="use num_replicas"):
        serve_options(data_parallel_size=2)
