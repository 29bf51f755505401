"""`bench hostile`: its figures (statuses, 5xx, stalls, echoes) and short attacks against a live server."""
from __future__ import annotations

import json
import os

import pytest
from .conftest import start_server, stop_server

from lite_llm import cli
from lite_llm.bench import hostile
from lite_llm.bench.hostile import AttackResult, Probe, Reply


def _report(*attacks: AttackResult, rss_start: int | None = 100 << 20, rss_end: int | None = 150 << 20) -> dict:
    return {"url": "http://127.0.0.1:1", "model": "tiny", "date": "2026-01-01 00:00 UTC",
            "machine": {"host": "h", "cpus": 2, "python": "3.11", "loadavg_before": "0.1 0.1 0.1",
                        "loadavg_after": "0.2 0.1 0.1"},
            "seconds_per_attack": 5.0, "duration_s": 12.0, "settings": {},
            "start": {"idle": True, "settle_s": 0.0, "kv_blocks_used": 0, "kv_usage": 0.0, "rss_bytes": rss_start},
            "end": {"idle": True, "settle_s": 0.0, "kv_blocks_used": 3, "kv_usage": 0.01, "rss_bytes": rss_end,
                    "rss_growth_bytes": None if rss_end is None or rss_start is None else rss_end - rss_start},
            "rss_source": "test", "attacks": [a.to_dict() for a in attacks]}


def test_result_counts_statuses_5xx_stalls_and_echoes():
    res = AttackResult("schema", hostile.TITLES["schema"])
    res.record(Reply(500, 0.1, b'{"error": {"message": "Internal error"}}'), "a")
    res.record(Reply(503, 0.1, b"{}"), "b")
    res.record(Reply(400, 0.1, b'{"error": {"message": "bad \'secret_marker\'"}}'), "c", ("secret_marker",))
    res.record(Reply(200, 0.1, b'{"text": "secret_marker"}'), "d", ("secret_marker",))  # an answer, not an error
    res.record(Reply(200, 0.1, b"Traceback (most recent call last): ..."), "e")
    res.record(Reply(0, 12.0, error="timeout"), "f")
    res.probes = [Probe("health", 200, 0.01, 0.0), Probe("health", 200, 2.5, 0.5),
                  Probe("completion", 200, 3.25, 0.5), Probe("completion", 0, 20.0, 1.0, "timeout"),
                  Probe("health", 503, 0.02, 1.5)]
    assert res.sent == 6
    assert res.statuses == {"500": 1, "503": 1, "400": 1, "200": 2, "timeout": 1}
    assert res.num_5xx == 2
    assert sorted(p.seconds for p in res.stalls()) == [2.5, 3.25, 20.0]
    assert res.echoes == ["c: 'secret_marker'", "e: 'Traceback (most recent'"]
    d = res.to_dict()
    assert d["num_5xx"] == 2 and len(d["stalls"]) == 3
    assert d["probes_summary"]["health"] == {"sent": 3, "ok": 2, "max_ms": 2500.0, "failed": {"503": 1}}
    assert d["probes_summary"]["completion"]["failed"] == {"timeout": 1}
    json.dumps(d)                                   # --json writes it as is

    text = hostile.format_report(_report(res))
    row = next(line for line in text.splitlines() if line.startswith(hostile.TITLES["schema"]))
    assert "200:2 400:1 500:1 503:1 timeout:1" in row
    assert "3: 2.5 3.2 20.0" in row or "3: 2.5 3.3 20.0" in row     # the stalls and their durations
    assert " 2500 " in row and " 20000 " in row                      # slowest health, completion (ms)
    assert " 2/5 " in row                                            # probes without a 200
    assert "KV held while idle 3 blocks" in text and "growth +50 MB" in text
    assert "c: 'secret_marker'" in text


def test_skipped_attack_and_unknown_figures_are_shown_as_such():
    res = AttackResult("fin", hostile.TITLES["fin"], skipped="the sweep's total time bound was reached")
    report = _report(res, rss_start=None, rss_end=None)
    report["end"].update(kv_blocks_used=None, kv_usage=None)
    text = hostile.format_report(report)
    assert "skipped: the sweep's total time bound was reached" in text
    assert "KV held while idle -" in text and "growth - MB" in text


def test_attack_names_and_numbers():
    assert hostile.parse_attacks("all") == list(hostile.ATTACKS)
    assert hostile.parse_attacks("1,schema,5") == ["template", "schema"]
    with pytest.raises(SystemExit):
        hostile.parse_attacks("8")


def test_deep_schemas_are_valid_json_of_the_depth_asked():
    for kind, key in (("object", "properties"), ("anyOf", "anyOf"), ("array", "items")):
        node, depth = json.loads(hostile.Sweep.deep_schema(kind, 40)), 0
        while key in node:
            node = node[key][hostile.Sweep.MARK] if kind == "object" else node[key][0] if kind == "anyOf" else node[key]
            depth += 1
        assert depth == 40


@pytest.fixture()
def slow_served():
    """A server whose steps take 20 ms: a 400-token request runs for seconds unless aborted."""
    s = start_server(engine_overrides={"step_seconds": 0.02})
    yield s
    stop_server(s)


def test_sweep_from_the_command_line_against_a_live_server(slow_served, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    argv = ["bench", "hostile", "--url", slow_served.url, "--attacks", "schema,monopoly,connections",
            "--seconds", "1.5", "--settle", "3", "--pid", str(os.getpid()), "--monopoly", "4x2x400",
            "--connections", "6", "--connection-max-tokens", "400", "--json", str(out)]
    assert cli.main(argv) == 0
    report = json.loads(out.read_text())
    table = capsys.readouterr().out
    by_name = {a["name"]: a for a in report["attacks"]}
    assert list(by_name) == ["schema", "monopoly", "connections"]
    schema = by_name["schema"]
    assert schema["sent"] >= 15 and sum(schema["statuses"].values()) == schema["sent"]   # 5 schemas x 3 routes
    for a in report["attacks"]:
        for kind in ("health", "completion"):
            assert a["probes_summary"][kind]["sent"] >= 1
            assert a["probes_summary"][kind]["ok"] == a["probes_summary"][kind]["sent"], a["probes_summary"]
        assert a["rss_before"] and a["rss_after"] and a["rss_peak"] >= a["rss_after"]
    # the long requests were the attack's own: reset at its deadline, the engine is idle and holds nothing
    for name in ("monopoly", "connections"):
        a = by_name[name]
        assert a["idle"] is True and a["kv_usage_after"] == 0 and (a["kv_blocks_after"] or 0) == 0, a
    assert by_name["monopoly"]["statuses"] == {"200": 1}
    assert by_name["connections"]["statuses"] == {"200": 6}
    assert report["end"]["kv_usage"] == 0 and report["end"]["idle"] is True
    assert report["model"] == slow_served.model
    assert hostile.TITLES["monopoly"] in table and "server RSS:" in table


def test_server_log_growth_counts_tracebacks_and_raw_nul_bytes(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"Traceback (most recent call last): before the attack\n")
    sweep = hostile.Sweep(hostile.Target("http://127.0.0.1:1"), "tiny", server_log=str(log))
    start = sweep.log_size()
    with open(log, "ab") as f:
        f.write(b'INFO "GET /he\x00lth" 404\n' + b"Traceback (most recent call last):\n  File ...\n" * 2)
    res = AttackResult("small", hostile.TITLES["small"])
    sweep.log_delta(res, start)
    assert (res.log_bytes, res.log_tracebacks, res.log_nul_bytes) == (log.stat().st_size - start, 2, 1)


def test_watchdog_is_another_client_than_the_attacks(tmp_path):
    """Against a server capping connections per address, the attack's extra connections are
    refused while the watchdog, coming from 127.0.0.2, is answered throughout."""
    s = start_server(engine_overrides={"step_seconds": 0.02}, max_connections_per_client=2)
    try:
        target = hostile.Target(s.url)
        assert hostile.default_probe_source(target) == "127.0.0.2"
        sweep = hostile.Sweep(target, s.model, seconds=1.5, settle=3, connections=6, connection_max_tokens=400,
                              probe_source="127.0.0.2")
        report = sweep.run(["connections"])
    finally:
        stop_server(s)
    a = report["attacks"][0]
    assert report["probe_source"] == "127.0.0.2"
    assert a["sent"] == 6 and sum(a["statuses"].values()) == 6
    # capped: at most 2 answered; the others refused (503) or, when they arrive while an earlier one is
    # still sending its request, that one is dropped to make room (no answer: reset at the deadline)
    assert a["statuses"].get("200", 0) <= 2, a["statuses"]
    assert sum(n for status, n in a["statuses"].items() if status != "200") >= 4, a["statuses"]
    for kind in ("health", "completion"):
        assert a["probes_summary"][kind]["sent"] >= 1
        assert a["probes_summary"][kind]["failed"] == {}, a["probes_summary"]
