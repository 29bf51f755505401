"""`bench serve` and guidellm: its report (benchmarks.json) read into this report's terms, the
guidellm command built from bench serve's flags, and the tokenizer it is handed offline.

The fixtures are two recorded guidellm 0.8.1 runs against `serve` on the default model (chat,
64 prompt tokens asking for 32, 30 s each: synchronous, and concurrent with 4 streams), kept
small: per-request records, and distributions the summary does not read, dropped."""
from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from lite_llm.bench import serve as bench_serve

FIXTURES = Path(__file__).parent / "fixtures" / "guidellm"


def _raw(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_serve.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("name,strategy,streams", [("synchronous.json", "synchronous", 1),
                                                   ("concurrent_4.json", "concurrent", 4)])
def test_report_in_this_reports_terms(name, strategy, streams):
    raw = _raw(name)
    (r,) = bench_serve.read_guidellm_report(str(FIXTURES / name))
    bench = raw["benchmarks"][0]
    m = bench["metrics"]
    assert r["source"] == "guidellm 0.8.1" and (r["strategy"], r["max_concurrency"]) == (strategy, streams)
    assert r["model"] == bench["config"]["backend"]["model"] and r["duration_s"] == bench["duration"]
    totals = m["request_totals"]
    assert (r["completed"], r["failed"], r["incomplete"]) == (totals["successful"], 0, totals["incomplete"])
    assert r["completed"] > 10
    # guidellm asked for exactly 32 tokens a request (ignore_eos): every completed one has them
    assert r["total_output_tokens"] == 32 * r["completed"]
    assert r["total_input_tokens"] == m["prompt_token_count"]["successful"]["total_sum"]
    ttft = m["time_to_first_token_ms"]["successful"]
    assert r["ttft_ms"] == {"mean": ttft["mean"], "p50": ttft["percentiles"]["p50"],
                            "p90": ttft["percentiles"]["p90"], "p99": ttft["percentiles"]["p99"]}
    # its ITL is (e2e - ttft) / (tokens - 1) per request, this report's TPOT; its TPOT counts the first token
    assert r["tpot_ms"]["p50"] == m["inter_token_latency_ms"]["successful"]["percentiles"]["p50"]
    assert r["guidellm_tpot_ms"]["mean"] == m["time_per_output_token_ms"]["successful"]["mean"]
    assert r["e2el_ms"]["p50"] == pytest.approx(1000 * m["request_latency"]["successful"]["percentiles"]["p50"])
    for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
        assert 0 < r[key]["p50"] <= r[key]["p90"] <= r[key]["p99"]
    # a request's latency is its first token plus 31 gaps: the medians agree within the spread
    assert r["ttft_ms"]["mean"] + 31 * r["tpot_ms"]["mean"] == pytest.approx(r["e2el_ms"]["mean"], rel=0.25)
    assert r["request_throughput"] == m["requests_per_second"]["successful"]["mean"] > 0
    assert r["output_throughput"] == m["output_tokens_per_second"]["total"]["mean"] > 0


def test_cli_summarizes_a_report(capsys):
    code = bench_serve.run(_args("--guidellm-report", str(FIXTURES / "concurrent_4.json")))
    out = capsys.readouterr().out
    assert code == 0 and "guidellm 0.8.1: concurrent, 4 stream(s)" in out
    assert "Serving Benchmark Result" in out and "Failed requests:" in out
    code = bench_serve.run(_args("--guidellm-report", str(FIXTURES / "synchronous.json"), "--json"))
    (r,) = json.loads(capsys.readouterr().out)
    assert code == 0 and r["strategy"] == "synchronous" and r["failed"] == 0


def test_errored_requests_fail_the_run(tmp_path, capsys):
    raw = _raw("synchronous.json")
    raw["benchmarks"][0]["metrics"]["request_totals"]["errored"] = 3
    path = tmp_path / "errored.json"
    path.write_text(json.dumps(raw))
    assert bench_serve.run(_args("--guidellm-report", str(path))) == 1
    assert "Failed requests:                                           3" in capsys.readouterr().out


@pytest.mark.parametrize("content", ["{}", "[1, 2]", "{not json", '{"benchmarks": 5}'])
def test_not_a_report_is_one_line(tmp_path, capsys, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert bench_serve.run(_args("--guidellm-report", str(path))) == 1
    err = capsys.readouterr().err
    assert err.startswith("bench serve: ") and "Traceback" not in err and len(err.splitlines()) == 1


def test_guidellm_command_from_bench_flags():
    args = _args("--base-url", "http://127.0.0.1:9", "--max-concurrency", "1", "--input-len", "64",
                 "--output-len", "32", "--num-prompts", "7")
    cmd = bench_serve.guidellm_command(["guidellm"], args, "/tok", "/out/b.json", None)
    assert cmd[:2] == ["guidellm", "run"] and cmd[-1] == "--disable-console-interactive"
    assert dict(zip(cmd[2:-1:2], cmd[3:-1:2])) == {
        "--backend": "kind=openai_http,target=http://127.0.0.1:9", "--profile": "kind=synchronous",
        "--constraint": "kind=max_requests,count=7", "--data": "kind=synthetic_text,prompt_tokens=64,output_tokens=32",
        "--tokenizer": "kind=hf_auto,model=/tok", "--output": "kind=json,path=/out/b.json"}
    args = _args("--max-concurrency", "4", "--guidellm-max-seconds", "20", "--model", "m")
    cmd = bench_serve.guidellm_command(["g"], args, "/tok", "/o.json", "k")
    assert "kind=concurrent,streams=4" in cmd and "kind=max_duration,seconds=20" in cmd
    assert "kind=openai_http,target=http://127.0.0.1:8000,model=m,api_key=k" in cmd


def test_default_models_tokenizer_written_for_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    from lite_llm.model.loader import load_model
    path = bench_serve.guidellm_tokenizer(None, str(tmp_path))
    assert path == str(tmp_path) and {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(tmp_path))
    theirs = transformers.AutoTokenizer.from_pretrained(path)
    ours = load_model(None).tokenizer
    text = "The quick brown fox, café and 🙂: 1234 tokens."
    assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text, add_special_tokens=False)
    assert theirs.eos_token == ours.eos_token
    # a directory that already has a tokenizer.json is handed over as it is
    assert bench_serve.guidellm_tokenizer(path, str(tmp_path / "unused")) == path


def test_bench_serve_runs_guidellm_and_reads_its_report(tmp_path, capsys):
    """A stand-in guidellm: records its arguments and writes a recorded report where told."""
    fake = tmp_path / "guidellm"
    log = tmp_path / "argv.json"
    fake.write_text(f"#!{sys.executable}\n"
                    "import json, shutil, sys\n"
                    f"json.dump(sys.argv[1:], open({str(log)!r}, 'w'))\n"
                    "out = [a for a in sys.argv if a.startswith('kind=json,path=')][0].split('=', 2)[2]\n"
                    f"shutil.copyfile({str(FIXTURES / 'concurrent_4.json')!r}, out)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    kept = tmp_path / "kept.json"
    code = bench_serve.run(_args("--guidellm", "--guidellm-bin", str(fake), "--guidellm-tokenizer", str(tok),
                                 "--max-concurrency", "4", "--guidellm-max-seconds", "5", "--json",
                                 "--guidellm-keep-report", str(kept)))
    (r,) = json.loads(capsys.readouterr().out)
    assert code == 0 and r["max_concurrency"] == 4 and r["completed"] == 24
    argv = json.loads(log.read_text())
    assert argv[0] == "run" and f"kind=hf_auto,model={tok}" in argv and "kind=concurrent,streams=4" in argv
    assert json.loads(kept.read_text()) == _raw("concurrent_4.json")


def test_missing_guidellm_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit, match="pip install guidellm"):
        bench_serve.run(_args("--guidellm"))
