"""`lite-llm serve` flags, SIGTERM draining of a real process, and `bench serve` against a live server."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import wait_until_serving

from lite_llm.bench import serve as bench_serve
from lite_llm.server import app

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    app.add_arguments(p)
    return p.parse_args(argv)


def test_serve_flags_defaults_and_parsing():
    a = _parse([])
    assert (a.model, a.host, a.port, a.max_num_seqs, a.max_num_batched_tokens) == (None, "127.0.0.1", 8000, None, 2048)
    assert a.enable_prefix_caching is True and a.generation_config == "auto" and a.api_key is None
    a = _parse(["/m.gguf", "--port", "9", "--no-enable-prefix-caching", "--served-model-name", "a", "b",
                "--generation-config", "vllm", "--max-queue", "3", "--dtype", "bfloat16", "--block-size", "32",
                "--max-model-len", "1024", "--seed", "5", "--kv-cache-space", "2.5", "--disable-sliding-window"])
    assert a.model == "/m.gguf" and a.port == 9 and a.enable_prefix_caching is False
    assert a.served_model_name == ["a", "b"] and a.max_queue == 3 and a.kv_cache_space == 2.5
    with pytest.raises(SystemExit):
        _parse(["--generation-config", "other"])


def test_chat_template_file_or_inline(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0]['content'] }}")
    assert app.load_chat_template(str(f)) == "{{ messages[0]['content'] }}"
    assert app.load_chat_template("{% for m in messages %}{% endfor %}").startswith("{%")
    with pytest.raises(SystemExit):
        app.load_chat_template(str(tmp_path / "missing.jinja"))


def test_generation_defaults_mapping():
    cfg = {"temperature": 0.6, "top_p": 0.9, "top_k": 50, "max_new_tokens": 77, "do_sample": True,
           "repetition_penalty": 1.1, "min_p": "bad", "bos_token_id": 1}
    assert app.generation_defaults(cfg) == {"temperature": 0.6, "top_p": 0.9, "top_k": 50,
                                            "max_tokens": 77, "repetition_penalty": 1.1}


SERVE_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from tests.server.conftest import make_tokenizer
    from tests.server.fake_model import fake_runner_engine
    def build_async_engine(engine_args):     # the EngineArgs the flags made
        print("BUILD " + ",".join(sorted(vars(engine_args))), file=sys.stderr, flush=True)
        tok = make_tokenizer()     # the command line is under test here, not the engine
        return fake_runner_engine(tok, step_seconds=0.005), tok, {{"max_model_len": 512, "kernel_variant": "fake"}}
    import argparse
    from lite_llm.server import app, startup
    startup.build_async_engine = build_async_engine     # what start_engine builds a one-engine server with
    p = argparse.ArgumentParser()
    app.add_arguments(p)
    sys.exit(app.run(p.parse_args(["--port", "0", "--served-model-name", "m", "--shutdown-grace", "20"])))
""")


def test_sigterm_drains_in_flight_and_exits_0():
    import http.client
    proc = subprocess.Popen([sys.executable, "-c", SERVE_SCRIPT.format(root=ROOT)], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        url, lines = wait_until_serving(proc)
        port = int(url.rsplit(":", 1)[1])
        log = "".join(lines)
        assert "BUILD " in log and "max_num_batched_tokens" in log and "enable_prefix_caching" in log
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hi", "max_tokens": 100, "stream": True}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        first = resp.readline()
        assert first.startswith(b"data: ")
        proc.send_signal(signal.SIGTERM)
        rest = (first + resp.read()).decode()
        events = [json.loads(e[6:]) for e in rest.split("\n\n") if e.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=30) == 0
        tail = proc.stderr.read()
        assert "draining" in tail
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bench_serve_against_live_server(served, capsys):
    r = bench_serve.benchmark(served.url, num_prompts=6, max_concurrency=3, input_len=16, output_len=8)
    assert r["completed"] == 6 and r["failed"] == 0
    assert r["total_input_tokens"] == 6 * 16 and r["total_output_tokens"] == 6 * 8
    assert r["model"] == served.model
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert 0 <= r[key]["p50"] <= r[key]["p90"] <= r[key]["p99"]
    assert r["ttft_ms"]["p50"] <= r["e2el_ms"]["p99"]
    assert r["output_throughput"] > 0 and r["request_throughput"] > 0
    p = argparse.ArgumentParser()
    bench_serve.add_arguments(p)
    code = bench_serve.run(p.parse_args(["--base-url", served.url, "--num-prompts", "2", "--input-len", "8",
                                         "--output-len", "4", "--json"]))
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["completed"] == 2 and out["total_output_tokens"] == 8
    assert "Serving Benchmark Result" in bench_serve.format_report(out)
