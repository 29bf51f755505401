"""Several models behind one server (server/models.py) over real HTTP: three tiny random
checkpoints (two generative, one embedder) served by `serve --models-dir`, `--model` repeated and
`--models-config`, each built as `serve` builds it (the parsed flags -> start_models -> build_server).

Each model's answers equal a one-model server's; a model is loaded on its first request and
unloaded after --keep-alive; under --models-memory the least recently used idle model makes room;
a model that cannot fit is a 503; an unknown one a 404; a slow load leaves the loaded models
serving (the watchdog probes one while another loads)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from lite_llm.engine.memory import plan_memory
from lite_llm.server import models
from lite_llm.server.args import add_arguments
from lite_llm.server.startup import build_server, start_engine, start_models

from .conftest import error_of, request
from .watchdog import Watchdog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import cache_dir, tiny_checkpoint_path, wait_until_serving

COMMON = ["--port", "0", "--max-model-len", "128", "--kv-cache-space", "0.02", "--dtype", "float32",
          "--disable-log-requests", "--disable-web-ui"]
PROMPT = "The quick brown fox"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def checkpoints() -> dict[str, Path]:
    """alpha (llama), beta (qwen2), embed (bert) side by side in one directory, as --models-dir takes them."""
    root = cache_dir("models-dir-")
    for name, arch in (("alpha", "llama"), ("beta", "qwen2"), ("embed", "bert")):
        os.symlink(tiny_checkpoint_path(arch), root / name)
    (root / "notes.txt").write_text("not a model")
    return {"root": root, **{n: root / n for n in ("alpha", "beta", "embed")}}


def _start(argv: list[str]):
    args = parse(argv)
    pool, first = start_models(args)
    server = build_server(args, pool, first.ctx.tokenizer, first.info, pool=pool)
    server.start()
    return server, pool


def _stop(server) -> None:
    server.drain(2.0)


def _complete(port: int, model: str, max_tokens: int = 8) -> tuple[int, dict]:
    status, _, data = request(port, "POST", "/v1/completions", {"model": model, "prompt": PROMPT,
                                                                "max_tokens": max_tokens, "temperature": 0})
    return status, json.loads(data)


def _embed(port: int, model: str) -> tuple[int, dict]:
    status, _, data = request(port, "POST", "/v1/embeddings", {"model": model, "input": [PROMPT, "hello"]})
    return status, json.loads(data)


def _statuses(port: int) -> dict[str, str]:
    status, _, data = request(port, "GET", "/v1/models")
    assert status == 200
    return {m["id"]: m["status"] for m in json.loads(data)["data"]}


def _engine_threads() -> int:
    return sum(t.name == "lite-llm-engine" and t.is_alive() for t in threading.enumerate())


@pytest.fixture(scope="module")
def reference(checkpoints) -> dict[str, object]:
    """Each model's answer from a one-model server of it (the server of old)."""
    out = {}
    for name in ("alpha", "beta", "embed"):
        args = parse([str(checkpoints[name]), "--served-model-name", name, *COMMON])
        engine, tokenizer, info = start_engine(args)
        server = build_server(args, engine, tokenizer, info)
        server.start()
        try:
            if name == "embed":
                status, body = _embed(server.port, name)
                out[name] = np.array([d["embedding"] for d in body["data"]])
            else:
                status, body = _complete(server.port, name)
                out[name] = body["choices"][0]["text"]
            assert status == 200, body
        finally:
            _stop(server)
    return out


def test_three_models_answer_concurrently_as_each_alone(checkpoints, reference):
    server, pool = _start(["--models-dir", str(checkpoints["root"]), *COMMON])
    try:
        port = server.port
        status, _, data = request(port, "GET", "/v1/models")
        listed = {m["id"]: m for m in json.loads(data)["data"]}
        assert sorted(listed) == ["alpha", "beta", "embed"]       # notes.txt is no model
        assert listed["alpha"]["status"] == "loaded"               # the default: loaded at start
        assert listed["beta"]["status"] == listed["embed"]["status"] == "unloaded"
        assert listed["alpha"]["memory"]["bytes"] > 0 and listed["alpha"]["object"] == "model"
        assert listed["alpha"]["load_seconds"] > 0 and 0 < listed["alpha"]["expires_in"] <= 300
        threads_before = _engine_threads()

        def ask(name: str):
            return _embed(port, name) if name == "embed" else _complete(port, name)

        with ThreadPoolExecutor(6) as ex:       # each model twice, all at once; two of them not loaded yet
            answers = list(ex.map(ask, ["alpha", "beta", "embed"] * 2))
        for name, (status, body) in zip(["alpha", "beta", "embed"] * 2, answers):
            assert status == 200, body
            if name == "embed":
                np.testing.assert_allclose([d["embedding"] for d in body["data"]], reference["embed"], atol=1e-6)
            else:
                assert body["model"] == name and body["choices"][0]["text"] == reference[name]
        assert set(_statuses(port).values()) == {"loaded"}
        assert _engine_threads() == threads_before + 2
        listed = {m["id"]: m for m in json.loads(request(port, "GET", "/v1/models")[2])["data"]}
        for m in listed.values():
            plan = m["memory"]["planned"]
            assert plan["total"] == plan["weights"] + plan["kv_cache"] + plan["activations"] > 0
        # a request naming no model is the default's
        status, _, data = request(port, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
        assert status == 200 and json.loads(data)["choices"][0]["text"] == reference["alpha"]
        # the embedder refuses to generate, the generator to embed: each model's own runner answers
        status, _, data = request(port, "POST", "/v1/completions", {"model": "embed", "prompt": "x"})
        assert status == 400 and "pooling" in error_of(data)["message"]
        status, body = _embed(port, "beta")
        assert status == 400 and "generate" in body["error"]["message"]
    finally:
        _stop(server)
    assert not pool.loaded_names() or not pool.is_alive()


def test_unknown_model_is_openai_404(checkpoints):
    server, _ = _start(["--model", str(checkpoints["alpha"]), "--model", str(checkpoints["beta"]), *COMMON])
    try:
        for path, body in (("/v1/completions", {"model": "gpt-4o", "prompt": "hi"}),
                           ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}),
                           ("/v1/embeddings", {"model": "gpt-4o", "input": "x"})):
            status, _, data = request(server.port, "POST", path, body)
            err = error_of(data)
            assert status == 404 and err["code"] == "model_not_found" and err["param"] == "model"
            assert err["message"] == "The model 'gpt-4o' does not exist."
        status, _, data = request(server.port, "GET", "/v1/models/gpt-4o")
        assert status == 404
        status, _, data = request(server.port, "GET", "/v1/models/beta")
        assert status == 200 and json.loads(data)["status"] == "unloaded"
        assert _statuses(server.port) == {"alpha": "loaded", "beta": "unloaded"}     # a 404 loads nothing
        status, _, data = request(server.port, "POST", "/v1/chat/completions",
                                  {"model": "beta", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert status == 200 and json.loads(data)["model"] == "beta"
    finally:
        _stop(server)


def test_idle_models_unload_after_keep_alive(checkpoints):
    server, pool = _start(["--model", str(checkpoints["alpha"]), "--model", str(checkpoints["beta"]),
                           "--keep-alive", "1s", *COMMON])
    try:
        port = server.port
        threads = _engine_threads()
        with pool.use("alpha"):        # held: an idle second would unload it while beta loads
            assert _complete(port, "beta")[0] == 200
            with pool.use("beta"):     # beta's engine beside alpha's (reloaded if its second passed)
                assert _engine_threads() == threads + 1
        rss_loaded = models.rss_bytes()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and set(_statuses(port).values()) != {"unloaded"}:
            time.sleep(0.2)
        assert _statuses(port) == {"alpha": "unloaded", "beta": "unloaded"}
        assert _engine_threads() == threads - 1             # alpha's and beta's engine threads both ended
        print(f"RSS with both loaded {rss_loaded / 2**20:.1f} MiB, after unloading {models.rss_bytes() / 2**20:.1f} MiB")
        status, body = _complete(port, "alpha")             # loaded again on demand
        assert status == 200 and body["model"] == "alpha"
        with pool.use("beta", keep_alive=0):                # Ollama's keep_alive 0: unload once idle
            assert _statuses(port)["beta"] == "loaded"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _statuses(port)["beta"] != "unloaded":
            time.sleep(0.1)
        assert _statuses(port)["beta"] == "unloaded"
        with pytest.raises(Exception) as bad:
            with pool.use("alpha", keep_alive="soon"):
                pass
        assert getattr(bad.value, "status", None) == 400 and bad.value.param == "keep_alive"
    finally:
        _stop(server)


def test_least_recently_used_idle_model_makes_room(checkpoints):
    plans = {n: plan_memory(str(checkpoints[n]), dtype="float32", max_model_len=128, kv_cache_space=0.02,
                            pooling=n == "embed").total for n in ("alpha", "beta", "embed")}
    # room for alpha and beta together, not for all three
    cap = plans["alpha"] + plans["beta"] + plans["embed"] // 2
    server, _ = _start(["--models-dir", str(checkpoints["root"]), "--models-memory", str(cap), *COMMON])
    try:
        port = server.port
        assert _complete(port, "beta")[0] == 200
        assert _complete(port, "alpha")[0] == 200           # alpha now the more recently used
        assert _statuses(port) == {"alpha": "loaded", "beta": "loaded", "embed": "unloaded"}
        assert _embed(port, "embed")[0] == 200
        assert _statuses(port) == {"alpha": "loaded", "beta": "unloaded", "embed": "loaded"}
        status, body = _complete(port, "beta")
        assert status == 200 and body["model"] == "beta"
        assert _statuses(port) == {"alpha": "unloaded", "beta": "loaded", "embed": "loaded"}
        status, _, data = request(port, "GET", "/v1/engine/stats")       # what the dashboard shows
        memory = json.loads(data)["memory"]
        assert memory["models_memory_bytes"] == cap and memory["machine"]["total_bytes"] > 0
        rows = {r["id"]: r for r in memory["models"]}
        assert {n: r["status"] for n, r in rows.items()} == {"alpha": "unloaded", "beta": "loaded", "embed": "loaded"}
        assert rows["alpha"]["bytes"] == 0 and rows["alpha"]["planned"]["total"] == plans["alpha"]
        assert sum(r["bytes"] for r in rows.values()) <= cap
    finally:
        _stop(server)


def test_a_model_that_cannot_fit_is_a_503(checkpoints, tmp_path):
    config = tmp_path / "models.toml"
    config.write_text(f'''
[[models]]
name = "small"
model = "{checkpoints['alpha']}"

[[models]]
name = "huge"
model = "{checkpoints['beta']}"
kv-cache-space = 2
''')
    cap = plan_memory(str(checkpoints["alpha"]), dtype="float32", max_model_len=128, kv_cache_space=0.02).total * 3
    server, _ = _start(["--models-config", str(config), "--models-memory", str(cap), *COMMON])
    try:
        status, _, data = request(server.port, "POST", "/v1/completions", {"model": "huge", "prompt": "hi"})
        err = error_of(data)
        assert status == 503 and err["code"] == "insufficient_memory"
        assert "'huge' needs" in err["message"] and "--models-memory" in err["message"]
        assert _complete(server.port, "small")[0] == 200           # the server keeps serving
        assert _statuses(server.port) == {"small": "loaded", "huge": "unloaded"}
    finally:
        _stop(server)
    # no cap: the machine's memory (and its cgroup's) is the bound; a KV cache of 64 TiB is refused
    # before anything is allocated
    config.write_text(config.read_text().replace("kv-cache-space = 2", "kv-cache-space = 65536"))
    server, _ = _start(["--models-config", str(config), *COMMON])
    try:
        status, _, data = request(server.port, "POST", "/v1/completions", {"model": "huge", "prompt": "hi"})
        err = error_of(data)
        assert status == 503 and err["code"] == "insufficient_memory" and "this machine's memory allows" in err["message"]
        assert _complete(server.port, "small")[0] == 200
    finally:
        _stop(server)


def test_a_load_does_not_stall_a_loaded_model(checkpoints):
    server, pool = _start(["--model", str(checkpoints["alpha"]), "--model", str(checkpoints["beta"]), *COMMON])
    load_seconds = 8.0          # a slow load (a big model, a download) stood in for by a sleep before beta's build
    build = pool.build

    def slow_build(spec):
        if spec.name == "beta":
            time.sleep(load_seconds)
        return build(spec)

    pool.build = slow_build
    try:
        with Watchdog(server.port, "alpha", interval=0.25) as dog:
            time.sleep(0.5)
            t0 = time.monotonic()
            status, body = _complete(server.port, "beta")    # waits for its load
            waited = time.monotonic() - t0
        assert status == 200 and body["model"] == "beta"
        assert waited >= load_seconds
        during = [p for p in dog.of("completion")]
        assert len(during) >= 8
        dog.check(min_probes=8, stall_seconds=load_seconds / 2)   # alpha answered throughout beta's load
        print(f"beta loaded in {waited:.1f} s; alpha meanwhile: {dog.summary()}")
    finally:
        _stop(server)


def test_model_specs_from_flags_dir_and_config(checkpoints, tmp_path):
    config = tmp_path / "models.toml"
    config.write_text('[[models]]\nname = "c"\nmodel = "alpha"\nmax-model-len = 64\nkeep-alive = "10m"\n'
                      'lora-modules = ["x=/nowhere"]\n')
    (tmp_path / "alpha").symlink_to(checkpoints["alpha"])
    args = parse([str(checkpoints["alpha"]), "--model", str(checkpoints["beta"]), "--models-config", str(config)])
    specs = models.model_specs(args)
    assert [s.name for s in specs] == ["alpha", "beta", "c"]
    assert specs[2].flags == {"max_model_len": 64, "lora_modules": ["x=/nowhere"], "enable_lora": True}
    assert specs[2].model == str(tmp_path / "alpha") and specs[2].keep_alive == 600
    assert models.is_multi_model(args) and not models.is_multi_model(parse([str(checkpoints["alpha"])]))
    with pytest.raises(SystemExit, match="two models are named 'alpha'"):
        models.model_specs(parse(["--model", str(checkpoints["alpha"]), "--models-dir", str(checkpoints["root"])]))
    config.write_text('[[models]]\nname = "c"\nmodel = "x"\ncolour = "red"\n')
    with pytest.raises(SystemExit, match="unknown setting 'colour'"):
        models.model_specs(parse(["--models-config", str(config)]))
    assert [models.parse_keep_alive(v) for v in (300, "5m", "1h30m", "0", "-1", "250ms")] == \
        [300, 300, 5400, 0, float("inf"), 0.25]
    assert models.parse_memory("1.5G") == 3 << 29 and models.parse_memory("512M") == 512 << 20


def test_memory_plan_matches_what_a_load_holds(checkpoints):
    """The plan made before a load against the engine's own figures after it: the KV cache to the
    byte, the weights as packed within a quarter (norms, biases and packing padding aside)."""
    server, pool = _start(["--models-dir", str(checkpoints["root"]), *COMMON])
    try:
        for name in ("alpha", "beta", "embed"):
            with pool.use(name) as state:
                info = state.kernel_info
            plan = pool.entries[name].plan
            assert plan.kv_cache == info.get("kv_cache_bytes", 0)
            assert abs(plan.weights - info["weight_bytes"]) <= 0.25 * info["weight_bytes"], (name, plan, info["weight_bytes"])
            print(f"{name}: planned {plan.describe()}; loaded weights {info['weight_bytes']} B, "
                  f"KV {info.get('kv_cache_bytes', 0)} B")
    finally:
        _stop(server)


def test_streaming_waits_for_the_load_and_a_failed_load_is_a_503(checkpoints):
    """A stream to a model not loaded starts with its first real event once the model is up; a
    model that fails to load is a 503 naming it (each time it is asked for), the others serve on."""
    unsupported = tiny_checkpoint_path("qwen3")          # head_dim 24: the kernels refuse it at load
    server, _ = _start(["--model", str(checkpoints["alpha"]), "--model", str(checkpoints["beta"]),
                        "--model", str(unsupported), *COMMON])
    try:
        port = server.port
        body = {"model": "beta", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
        status, headers, data = request(port, "POST", "/v1/completions", body)
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all(c["model"] == "beta" and c["object"] == "text_completion" for c in chunks)
        streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        status, body = _complete(port, "beta")
        assert streamed == body["choices"][0]["text"]
        name = unsupported.name
        for _ in range(2):
            status, _, data = request(port, "POST", "/v1/completions", {"model": name, "prompt": "hi"})
            err = error_of(data)
            assert status == 503 and err["code"] == "model_load_failed" and f"'{name}' failed to load" in err["message"]
            assert str(unsupported.parent) not in err["message"]     # the cause is in the log only
        assert _statuses(port)[name] == "unloaded"
        assert _complete(port, "alpha")[0] == 200
    finally:
        _stop(server)


def test_serve_command_with_several_models(checkpoints):
    """`python -m lite_llm serve A --model B --keep-alive 2s` end to end: both answer, B unloads
    when idle (the log says so, with the process's RSS), SIGINT stops the server cleanly."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "lite_llm", "serve", str(checkpoints["alpha"]), "--model",
                             str(checkpoints["beta"]), "--keep-alive", "2s", *COMMON], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)}, stderr=subprocess.PIPE, text=True)
    try:
        url, lines = wait_until_serving(proc)
        port = int(url.rsplit(":", 1)[1])
        assert _complete(port, "beta")[0] == 200 and _complete(port, "alpha")[0] == 200
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _statuses(port)["beta"] != "unloaded":
            time.sleep(0.2)
        assert _statuses(port)["beta"] == "unloaded"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        # the rest through the same reader: readline may already hold the lines after the
        # serving line in its buffer, which communicate() (reading the pipe itself) never sees
        err = proc.stderr.read()
    log = "".join(lines) + err
    assert proc.returncode == 0, log
    assert "2 models, loaded on first request, unloaded after 2 s idle: alpha, beta" in log
    assert "model 'beta' loaded in" in log and "model 'beta' unloaded (idle for its keep-alive" in log
    print("\n".join(line for line in log.splitlines() if "model '" in line))


def test_model_state_on_a_server_of_one_model():
    """The entry other front ends use works on a server of one model too: its own state, a 404
    for another name."""
    from lite_llm.server.validation import ApiError

    from .conftest import start_server, stop_server
    served = start_server()
    try:
        state = served.server.state
        with models.model_state(state, None) as s, models.model_state(state, "tiny", keep_alive="5m") as t:
            assert s is state and t is state
        with pytest.raises(ApiError) as e, models.model_state(state, "other"):
            pass
        assert e.value.status == 404 and e.value.param == "model"
    finally:
        stop_server(served)


def test_fair_lock_serves_waiters_in_order():
    """Engines take turns: a waiter gets the lock before the holder can take it back."""
    lock, order = models.FairLock(), []

    def take(name: str) -> None:
        with lock:
            order.append(name)

    lock.__enter__()
    waiters = []
    for name in ("second", "third"):
        t = threading.Thread(target=take, args=(name,))
        t.start()
        waiters.append(t)
        deadline = time.monotonic() + 5
        while lock.num_asking < len(waiters) + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    lock.__exit__(None, None, None)
    take("first again")                 # the one that held it asks again: after both waiters
    for t in waiters:
        t.join(5)
    assert order == ["second", "third", "first again"]


def test_ollama_client_picks_loads_and_unloads_models(checkpoints, reference):
    """Ollama's API over several models (the `ollama` client): /api/tags lists every model, a
    chat loads the model it names (its ":latest" tag too) and answers as that model alone,
    /api/ps lists the loaded ones with when they unload, and keep_alive 0 unloads after the answer."""
    import ollama
    server, pool = _start(["--models-dir", str(checkpoints["root"]), *COMMON])
    try:
        client = ollama.Client(host=f"http://127.0.0.1:{server.port}")
        assert sorted(m.model for m in client.list().models) == ["alpha", "beta", "embed"]
        assert [m.model for m in client.ps().models] == ["alpha"]
        out = client.generate(model="beta:latest", prompt=PROMPT, raw=True, options={"temperature": 0, "num_predict": 8},
                              keep_alive="10m")
        assert out.response == reference["beta"]
        loaded = {m.model: m for m in client.ps().models}
        assert sorted(loaded) == ["alpha", "beta"] and loaded["beta"].expires_at is not None
        rows = client.embed(model="embed", input=[PROMPT, "hello"]).embeddings
        np.testing.assert_allclose(np.array(rows), reference["embed"], atol=1e-6)
        client.generate(model="beta", prompt=PROMPT, raw=True, options={"num_predict": 2}, keep_alive=0)
        deadline = time.monotonic() + 20
        while "beta" in _statuses(server.port) and _statuses(server.port)["beta"] != "unloaded":
            assert time.monotonic() < deadline, _statuses(server.port)
            time.sleep(0.2)
        with pytest.raises(ollama.ResponseError) as err:
            client.chat(model="gamma", messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 404
    finally:
        _stop(server)
