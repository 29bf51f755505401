"""One request cannot monopolise the engine: while a completions request of many prompts x n
holds every slot (max_num_seqs) and queues the rest of its sequences, other clients' 4-token
completions keep finishing (the watchdog's probes), long before the big request does.

Scaled to the fake model: 8 slots, 16 prompts x n 4 = 64 sequences of 480 tokens at 5 ms a step
(about 20 s of work when nothing else runs). The check is structural: the probes complete while
the big request is still running; their latencies are reported, not asserted.
"""
from __future__ import annotations

import json
import select
import socket
import struct
import time

from .conftest import metric_value, start_server, stop_server
from .watchdog import Watchdog

MAX_NUM_SEQS = 8
NUM_PROMPTS, N, MAX_TOKENS = 16, 4, 480
NUM_PROBES = 4                 # completion probes that must finish while the big request runs


def _wait_metric(port: int, name: str, pred, deadline: float = 20.0) -> float:
    end = time.monotonic() + deadline
    while True:
        value = metric_value(port, name)
        if pred(value) or time.monotonic() > end:
            return value
        time.sleep(0.02)


def test_small_completions_finish_while_one_request_holds_every_slot():
    served = start_server(engine_overrides={"max_num_seqs": MAX_NUM_SEQS, "step_seconds": 0.005})
    try:
        port = served.port
        body = json.dumps({"model": served.model, "prompt": [f"Prompt number {i}: tell a story" for i in
                                                             range(NUM_PROMPTS)],
                           "n": N, "max_tokens": MAX_TOKENS, "temperature": 0.7, "seed": 3}).encode()
        big = socket.create_connection(("127.0.0.1", port), timeout=120)
        big.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

        def big_done() -> bool:       # the answer's first bytes come when the whole request is done
            return bool(select.select([big], [], [], 0)[0])

        # every slot taken by it, the rest of its sequences queued
        assert _wait_metric(port, "lite_llm:num_requests_running", lambda v: v == MAX_NUM_SEQS) == MAX_NUM_SEQS
        assert metric_value(port, "lite_llm:num_requests_waiting") == NUM_PROMPTS * N - MAX_NUM_SEQS

        with Watchdog(port, served.model) as dog:
            end = time.monotonic() + 20.0     # liveness bound: unfair admission never gets there
            while time.monotonic() < end and not big_done():
                if sum(p.status == 200 for p in dog.of("completion")) >= NUM_PROBES:
                    break
                time.sleep(0.05)
            finished_probes = sum(p.status == 200 for p in dog.of("completion"))
            big_finished_first = big_done()
            # abort the big request (a reset), so a probe it still holds up ends before the watchdog
            big.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            big.close()
        print(f"\nwatchdog under the monopolising request: {dog.summary()}")
        assert not big_finished_first, "the big request finished before the probes: nothing to share"
        assert finished_probes >= NUM_PROBES, \
            f"{finished_probes} 4-token completions finished while the big request ran ({dog.summary()})"
        dog.check()
        # the abort freed everything: no sequence left running or waiting, no KV block held
        assert _wait_metric(port, "lite_llm:num_requests_running", lambda v: v == 0) == 0
        assert _wait_metric(port, "lite_llm:num_requests_waiting", lambda v: v == 0) == 0
        assert _wait_metric(port, "lite_llm:kv_cache_usage_perc", lambda v: v == 0) == 0
    finally:
        stop_server(served)


NUM_FLOOD = 24                 # one client's requests, each one long sequence: 8 run, 16 wait


def test_another_clients_completions_finish_while_one_client_floods_requests():
    """One client (127.0.0.1) sends 24 long requests of one sequence each on 24 connections: 8
    run and 16 wait. Another client's (127.0.0.2) 4-token completions keep finishing while every
    one of the flood's requests is still unanswered: fairness holds between clients, not only
    between requests (as equals, a probe would wait behind the flood's 16 queued requests)."""
    served = start_server(engine_overrides={"max_num_seqs": MAX_NUM_SEQS, "step_seconds": 0.005},
                          max_connections_per_client=0)
    flood: list[socket.socket] = []
    try:
        port = served.port
        for i in range(NUM_FLOOD):
            body = json.dumps({"model": served.model, "prompt": f"Flood {i}: tell a story",
                               "max_tokens": MAX_TOKENS, "temperature": 0.7, "seed": i}).encode()
            s = socket.create_connection(("127.0.0.1", port), timeout=120)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            flood.append(s)
        assert _wait_metric(port, "lite_llm:num_requests_waiting",
                            lambda v: v == NUM_FLOOD - MAX_NUM_SEQS) == NUM_FLOOD - MAX_NUM_SEQS

        def flood_answered() -> int:
            return sum(bool(select.select([s], [], [], 0)[0]) for s in flood)

        with Watchdog(port, served.model, source="127.0.0.2") as dog:
            end = time.monotonic() + 20.0     # liveness bound
            while time.monotonic() < end and not flood_answered():
                if sum(p.status == 200 for p in dog.of("completion")) >= NUM_PROBES:
                    break
                time.sleep(0.05)
            finished_probes = sum(p.status == 200 for p in dog.of("completion"))
            answered = flood_answered()
            for s in flood:                   # abort the flood (resets)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            flood.clear()
        print(f"\nwatchdog under one client's flood of requests: {dog.summary()}")
        assert answered == 0, f"{answered} of the flood's requests finished before the probes"
        assert finished_probes >= NUM_PROBES, \
            f"{finished_probes} 4-token completions finished while the flood ran ({dog.summary()})"
        dog.check()
        assert _wait_metric(port, "lite_llm:num_requests_running", lambda v: v == 0) == 0
        assert _wait_metric(port, "lite_llm:num_requests_waiting", lambda v: v == 0) == 0
    finally:
        for s in flood:
            s.close()
        stop_server(served)
