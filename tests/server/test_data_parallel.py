"""`--data-parallel-size 2` on the default model, 1 core per replica, over real HTTP on
127.0.0.1: every concurrent request answered once with both replicas busy, a repeated long prefix
routed back to the replica that cached it (per-replica prefix-cache hits in /metrics), the
server's features through the front end, and a killed replica stopping `serve` with its name."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lite_llm.engine.args import EngineArgs

from .conftest import request, serving

ROOT = Path(__file__).resolve().parents[2]
NAME = "smollm2"
CPUS = sorted(os.sched_getaffinity(0))[:2]         # one per replica
BIND = "|".join(map(str, CPUS))
pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="data parallel over 1 core per replica needs 2 CPUs")


@pytest.fixture(scope="module")
def dp_server():
    from lite_llm.engine.data_parallel import build_data_parallel_engine
    old = os.environ.get("LITE_LLM_CPU_OMP_THREADS_BIND")
    os.environ["LITE_LLM_CPU_OMP_THREADS_BIND"] = BIND
    try:
        engine, tokenizer, info = build_data_parallel_engine(
            EngineArgs(None, max_model_len=1024, kv_cache_space=0.25, max_num_seqs=16, serving=True), 2)
    finally:
        if old is None:
            del os.environ["LITE_LLM_CPU_OMP_THREADS_BIND"]
        else:
            os.environ["LITE_LLM_CPU_OMP_THREADS_BIND"] = old
    assert [r["cpus"] for r in info["replicas"]] == [str(c) for c in CPUS]
    for replica, want in zip(info["replicas"], CPUS):       # each process on its own core
        assert os.sched_getaffinity(replica["pid"]) == {want}
        assert replica["num_threads"] == 1
    with serving(engine, tokenizer, info, NAME, tool_call_parser="hermes") as server:
        yield server


def per_replica(port: int) -> dict[tuple[str, str], float]:
    """(sample name, engine) -> value, request_success summed over finish reasons."""
    status, _, data = request(port, "GET", "/metrics")
    assert status == 200
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(data.decode()):
        for s in fam.samples:
            if "engine" in s.labels and "le" not in s.labels:
                key = (s.name, s.labels["engine"])
                out[key] = out.get(key, 0) + s.value
    return out


def delta(after: dict, before: dict, name: str) -> list[float]:
    return [after[(name, e)] - before.get((name, e), 0) for e in ("0", "1")]


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def test_32_concurrent_requests_answered_once_each_on_both_replicas(dp_server):
    before = per_replica(dp_server.port)
    c = client(dp_server)
    prompts = [f"Request number {i}: write one sentence about the number {i * 7}." for i in range(32)]

    def ask(p: str):
        return c.completions.create(model=NAME, prompt=p, max_tokens=8, temperature=0, echo=True)

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, prompts))
    for p, a in zip(prompts, answers):
        assert len(a.choices) == 1 and a.choices[0].text.startswith(p)      # its own answer
        assert a.choices[0].finish_reason in ("stop", "length")
    assert len({a.id for a in answers}) == 32
    after = per_replica(dp_server.port)
    done = delta(after, before, "lite_llm:request_success_total")
    assert sum(done) == 32                              # each request ran exactly once
    assert all(n > 0 for n in done), done               # and both replicas worked
    assert all(n > 0 for n in delta(after, before, "lite_llm:generation_tokens_total"))
    assert sum(after[("lite_llm:num_requests_running", e)] for e in ("0", "1")) == 0


def document(topic: str) -> str:
    words = " ".join(f"{topic}-{i}" for i in range(110))
    return f"Notes on {topic}. {words}\n"


def test_a_repeated_long_prefix_lands_on_the_replica_that_cached_it(dp_server):
    c = client(dp_server)
    docs = {"a": document("apple"), "b": document("banana")}
    served, hits = [], []
    for doc, question in (("a", "Q1"), ("b", "Q1"), ("b", "Q2"), ("a", "Q2")):
        before = per_replica(dp_server.port)
        a = c.completions.create(model=NAME, prompt=docs[doc] + question, max_tokens=2, temperature=0)
        assert a.usage.prompt_tokens > 3 * 128          # several full KV blocks of 128 tokens
        after = per_replica(dp_server.port)
        prompt_tokens = delta(after, before, "lite_llm:prompt_tokens_total")
        assert sorted(prompt_tokens) == [0, a.usage.prompt_tokens]
        served.append(prompt_tokens.index(a.usage.prompt_tokens))
        hits.append(delta(after, before, "lite_llm:prefix_cache_hits_total")[served[-1]])
    assert served[0] != served[1]                       # idle replicas: taken in turn
    assert served[2] == served[1] and served[3] == served[0]   # turn order would swap these
    assert hits[2] >= 2 * 128 and hits[3] >= 2 * 128


def test_streaming_structured_outputs_and_tools_through_the_front_end(dp_server):
    c = client(dp_server)
    messages = [{"role": "user", "content": "Tell me the capital of France."}]
    whole = c.chat.completions.create(model=NAME, messages=messages, max_tokens=24, temperature=0)
    assert "Paris" in whole.choices[0].message.content
    pieces = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=NAME, messages=messages, max_tokens=24, temperature=0, stream=True) if ch.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    answer = c.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Is Paris in France?"}], max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "yn", "schema": schema}})
    assert json.loads(answer.choices[0].message.content)["answer"] in ("yes", "no")
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    called = c.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Weather in Rome?"}], max_tokens=100, tools=[tool],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0)
    call = called.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    several = c.completions.create(model=NAME, prompt="The sky is", max_tokens=4, n=2, logprobs=2, seed=3,
                                   temperature=1.0)
    assert sorted(ch.index for ch in several.choices) == [0, 1]
    assert all(len(ch.logprobs.tokens) == len(ch.logprobs.top_logprobs) == 4 for ch in several.choices)
    with pytest.raises(openai.BadRequestError, match="n=17 is more than max_num_seqs=16"):   # before routing
        c.completions.create(model=NAME, prompt="Hi", max_tokens=1, n=17)


def test_a_client_that_disconnects_aborts_its_request_on_its_replica(dp_server):
    before = per_replica(dp_server.port)
    conn = http.client.HTTPConnection("127.0.0.1", dp_server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"model": NAME, "prompt": "Once upon a time", "max_tokens": 1000, "stream": True,
         "ignore_eos": True}), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.fp.readline()    # the stream has begun
    conn.sock.shutdown(2)
    conn.close()
    deadline = time.monotonic() + 60
    while True:
        after = per_replica(dp_server.port)
        running = sum(after[("lite_llm:num_requests_running", e)] for e in ("0", "1"))
        aborted = sum(v for (name, _), v in after.items() if name == "lite_llm:request_success_total") - \
            sum(v for (name, _), v in before.items() if name == "lite_llm:request_success_total")
        if running == 0 and aborted == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert running == 0 and aborted == 1
    assert sum(delta(after, before, "lite_llm:generation_tokens_total")) < 1000


# ---- a killed replica ---------------------------------------------------------------------------

def test_a_killed_replica_stops_the_server_with_its_name():
    env = {**os.environ, "LITE_LLM_CPU_OMP_THREADS_BIND": BIND}
    proc = subprocess.Popen([sys.executable, "-m", "lite_llm", "serve", "-dp", "2", "--port", "0",
                             "--max-model-len", "1024", "--kv-cache-space", "0.25"],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if " on http://127.0.0.1:" in line:
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        ready.wait(300)
        log = "".join(lines)
        m = re.search(r" on http://127\.0\.0\.1:(\d+)", log)
        assert m, "the server did not start:\n" + log
        port = int(m.group(1))
        pids = {int(i): int(p) for i, p in re.findall(r"data parallel replica (\d): pid (\d+)", log)}
        assert sorted(pids) == [0, 1]
        status, _, data = request(port, "GET", "/v1/models")
        model = json.loads(data)["data"][0]["id"]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"model": model, "prompt": "Once upon a time", "max_tokens": 1000, "stream": True, "ignore_eos": True}),
            headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        head = resp.read(10).decode()                   # the stream has begun
        running = per_replica(port)
        victim = next(e for e in ("0", "1") if running[("lite_llm:num_requests_running", e)] == 1)
        os.kill(pids[int(victim)], signal.SIGKILL)
        rest = head + resp.read().decode()               # ends: no hang
        assert f"replica {victim} (pid {pids[int(victim)]}, CPUs {CPUS[int(victim)]}) was killed by signal 9" in rest
        assert rest.rstrip().endswith("data: [DONE]")
        assert proc.wait(timeout=120) == 1
        log = "".join(lines)
        assert f"stopping: the engine is not running (data-parallel replica {victim}" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def test_two_replicas_of_two_tensor_parallel_ranks_answer_as_one_engine(monkeypatch):
    """-dp 2 -tp 2: each replica is a tensor-parallel group of its own (a worker process beside
    it), and every greedy answer is the one engine's."""
    from conftest import tiny_checkpoint_path
    from lite_llm import LLM, SamplingParams
    from lite_llm.engine.data_parallel import build_data_parallel_engine
    path = str(tiny_checkpoint_path("llama"))
    prompts = [[5, 17, 200, 33], [8, 1, 99, 4, 71, 12], [3] * 9, [250, 251]]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    monkeypatch.setenv("LITE_LLM_CPU_OMP_THREADS_BIND", "nobind")     # 4 ranks on 2 CPUs
    with LLM(path, dtype="float32", kv_cache_space=0.01) as llm:
        want = [o.outputs[0].text for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    engine, tokenizer, info = build_data_parallel_engine(
        EngineArgs(path, dtype="float32", kv_cache_space=0.01, max_num_seqs=8, tensor_parallel_size=2), 2)
    assert info["tensor_parallel_size"] == 2
    for replica in info["replicas"]:       # its rank-1 worker: python -m lite_llm.engine.tp
        cmdlines = [Path(f"/proc/{c}/cmdline").read_bytes() for c in _children(replica["pid"])]
        assert sum(b"lite_llm.engine.tp" in c for c in cmdlines) == 1, cmdlines
    with serving(engine, tokenizer, info, "tiny") as server:
        c = client(server)
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda p: c.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0,
                                                               extra_body={"ignore_eos": True}).choices[0].text,
                                prompts * 2))
    assert got == want * 2
