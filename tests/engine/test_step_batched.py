"""The compiled plain decode step (_step.pyx) against the Python reference path it replaces
(Scheduler.update_from_output + LLMEngine.process_plain, run with batched_decode = False).

Both engines get the same requests over the KV-checking FakeRunner and a byte-level BPE
tokenizer whose small vocabulary splits multi-byte characters across tokens, and abort the
same requests at the same steps; every step's outputs (text, token ids, finish and stop
reasons, logprobs), the ITL and token counts and the freed KV must be identical.
"""
from __future__ import annotations

from dataclasses import astuple

import numpy as np
import pytest
from fake_runner import FakeRunner
from test_detokenizer import CORPUS, MULTIBYTE, byte_bpe  # noqa: F401  (byte_bpe: a fixture)

from lite_llm.engine import _step
from lite_llm.engine.async_engine import AsyncEngine, RequestStream
from lite_llm.engine.engine import EngineConfig, LLMEngine
from lite_llm.engine.scheduler import Scheduler
from lite_llm.model.tokenizer import Tokenizer as ProjectTokenizer
from lite_llm.outputs import RequestOutput
from lite_llm.sampling_params import RequestOutputKind, SamplingParams

EOS = (7, 8, 9)            # several ids, so the fake's hashed tokens hit EOS now and then


def make_engine(tokenizer, batched: bool, **overrides) -> LLMEngine:
    cfg = dict(max_num_seqs=48, max_num_batched_tokens=256, block_size=4, num_blocks=512, max_model_len=256,
               seed=3, eos_token_ids=EOS)
    cfg.update(overrides)
    config = EngineConfig(**cfg)
    runner = FakeRunner(config.num_blocks, config.block_size, tokenizer.vocab_size + 4,   # some ids past it
                        config.max_num_batched_tokens, config.max_num_seqs)
    engine = LLMEngine(runner, tokenizer, config)
    engine.batched_decode = batched
    return engine


def mixed_requests(tokenizer, num: int, seed: int):
    """Every finish the plain step handles (max_tokens, EOS, stop token ids, max_model_len) mixed
    with requests it hands to the Python path (stop strings, logprobs, n > 1 fan-out, FINAL_ONLY)."""
    rng = np.random.default_rng(seed)
    texts = [*CORPUS[:5], MULTIBYTE, "東京 🍣 and 😀🙂"]
    out = []
    for i in range(num):
        prompt = tokenizer.encode(texts[i % len(texts)])[: int(rng.integers(1, 12))] or [1]
        kind = i % 8
        params = dict(max_tokens=int(rng.integers(1, 40)), temperature=0.0 if i % 2 else 0.9, seed=100 + i)
        if kind == 1:
            params.update(stop_token_ids=[11, 12, 13, 14, 15], ignore_eos=bool(i % 3 == 0))
        elif kind == 2:
            params.update(stop=["e", "th"], include_stop_str_in_output=bool(i % 3 == 0))
        elif kind == 3:
            params.update(logprobs=2)
        elif kind == 4:
            params.update(n=3)
        elif kind == 5:
            params.update(output_kind=RequestOutputKind.FINAL_ONLY)
        elif kind == 6:
            params.update(skip_special_tokens=False, min_tokens=3, max_tokens=200)   # to max_model_len
        out.append((f"r{i}", prompt, SamplingParams(**params)))
    return out


def run(tokenizer, batched: bool, requests, abort_at: dict[int, list[str]], max_steps: int = 10_000,
        lazy: bool = False, pending: list | None = None, **overrides):
    """Every step's outputs as plain values, then the stats both paths must agree on (None when
    max_steps ended the run first). lazy: step(lazy=True), its PendingOutputs materialized only
    after the whole run (they must hold their step's values), counted in pending."""
    engine = make_engine(tokenizer, batched, **overrides)
    waiting = list(requests)
    steps, counts = [], []
    scheduled = []           # every step's chunks and removals: the compiled scheduling must match too
    schedule = engine.scheduler.schedule

    def recording_schedule():
        out = schedule()
        scheduled.append(([(c.request.request_id, c.start, c.num_new_tokens, list(c.new_block_ids), c.sample, c.is_new,
                            list(c.spec_token_ids)) for c in out.chunks], out.num_tokens, list(out.preempted_req_ids),
                          list(out.finished_req_ids)))
        return out
    engine.scheduler.schedule = recording_schedule
    for step in range(max_steps):
        while waiting and len(waiting) > len(requests) - 4 * (step + 1):   # arrivals over the first steps
            rid, prompt, params = waiting.pop(0)
            engine.add_request(rid, prompt, params)
        outs = engine.step(lazy=lazy) if lazy else engine.step()
        if step in abort_at:
            outs += engine.abort_request(abort_at[step])
        steps.append(outs)
        if not waiting and not engine.has_unfinished_requests():
            break
    else:
        return [plain_outputs(outs, counts) for outs in steps], None
    steps = [plain_outputs(outs, counts) for outs in steps]
    if pending is not None:
        pending.append(sum(counts))
    kv = engine.kv_cache_manager
    kv.block_pool.check()
    assert kv.num_free_blocks == kv.num_blocks
    s = engine.stats()
    return steps, (s.generation_tokens_total, s.prompt_tokens_total, s.itl.count, dict(s.request_success_total),
                   engine.runner.num_steps, scheduled)


def plain_outputs(outs: list, counts: list) -> list:
    """A step's outputs as plain values (PendingOutputs materialized first, counted in counts)."""
    counts.append(sum(isinstance(o, _step.PendingOutput) for o in outs))
    outs = [o.materialize() if isinstance(o, _step.PendingOutput) else o for o in outs]
    assert all(type(o) is RequestOutput for o in outs)
    return [(o.request_id, o.finished, [(c.index, c.text, list(c.token_ids), c.finish_reason, c.stop_reason,
                                         c.cumulative_logprob,
                                         None if c.logprobs is None else
                                         [{t: (lp.logprob, lp.rank, lp.decoded_token) for t, lp in d.items()}
                                          for d in c.logprobs])
                                        for c in o.outputs], o.num_cached_tokens, o.prompt, o.prompt_token_ids,
             None if o.metrics is None else [v is None for v in astuple(o.metrics)]) for o in outs]


@pytest.mark.parametrize("seed,config", [(0, {}), (1, {}), (2, {}),
                                         (3, dict(num_blocks=48)),                # preemptions
                                         (4, dict(max_num_batched_tokens=24)),    # budget cuts decodes
                                         (5, dict(num_blocks=40, max_num_batched_tokens=16))])   # both
def test_batched_step_gives_the_reference_outputs(byte_bpe, seed, config):
    tok = ProjectTokenizer(byte_bpe)
    requests = mixed_requests(tok, 40, seed)
    abort_at = {3: ["r2", "r9"], 7: ["r4", "r17", "r20"], 12: ["r30"]}
    ref_steps, ref_stats = run(tok, False, requests, abort_at, **config)
    steps, stats = run(tok, True, requests, abort_at, **config)
    finishes = {c[3] for step in ref_steps for o in step for c in o[2] if c[3]}
    assert finishes == {"stop", "length", "abort"}, "the workload must finish requests every way"
    assert any("\ufffd" not in c[1] and len(c[1].encode()) > len(c[1]) for step in ref_steps for o in step
               for c in o[2]), "the workload must produce multi-byte characters"
    assert stats == ref_stats
    assert steps == ref_steps


def test_batched_step_replaces_the_python_loops(byte_bpe, monkeypatch):
    """Plain decode steps never run the Python references (nor make_output for their one-child
    groups), and the compiled call does the work: stubbed out, the outputs differ."""
    tok = ProjectTokenizer(byte_bpe)
    requests = [(f"p{i}", tok.encode("The quick brown fox")[: 2 + i], SamplingParams(max_tokens=12, temperature=0.0))
                for i in range(6)]
    ref_steps, _ = run(tok, True, requests, {}, block_size=16)

    def forbidden(*args, **kwargs):
        raise AssertionError("the Python reference ran on a plain step")
    monkeypatch.setattr(Scheduler, "update_from_output", forbidden)
    monkeypatch.setattr(LLMEngine, "process_plain", forbidden)
    monkeypatch.setattr(LLMEngine, "make_output", forbidden)
    calls, scheduled = [], []
    real, real_schedule = _step.finish_plain, _step.schedule_decodes
    monkeypatch.setattr(_step, "finish_plain", lambda *a: (calls.append(len(a[2])), real(*a))[1])

    def schedule_decodes(running, room, chunks, budget, idx, chunk_type, allocate):
        got = real_schedule(running, room, chunks, budget, idx, chunk_type, allocate)
        scheduled.append(got[0] - idx)
        return got
    monkeypatch.setattr(_step, "schedule_decodes", schedule_decodes)
    steps, _ = run(tok, True, requests, {}, block_size=16)
    assert steps == ref_steps and len(calls) == len(steps)
    assert sum(scheduled) >= len(requests) * 5, "decodes were scheduled by the Python loop"
    monkeypatch.setattr(_step, "finish_plain", lambda *a: [])
    stubbed, _ = run(tok, True, requests, {}, max_steps=len(ref_steps), block_size=16)
    assert stubbed != ref_steps


def test_byte_detokenizer_fast_path_matches_add(byte_bpe):
    """The compiled ByteDetokenizer step (cached token texts, held partial characters) gives
    add()'s deltas on random ids that often split characters, ids past the table included."""
    from lite_llm.engine.detokenizer import ByteDetokenizer
    tok = ProjectTokenizer(byte_bpe)
    rng = np.random.default_rng(0)
    for skip in (True, False):
        table = tok.byte_table(skip)
        ids = [int(t) for t in rng.integers(0, len(table) + 3, 3000)] + tok.encode(MULTIBYTE * 3)
        ref, fast = ByteDetokenizer(table, skip), ByteDetokenizer(table, skip)   # fast: its state only
        assert [_step.byte_add(fast, t) for t in ids] == [ref.add(t) for t in ids]
        assert fast.text == ref.text and fast.token_ids == ref.token_ids and fast.pending == ref.pending


@pytest.mark.parametrize("seed,config", [(0, {}), (3, dict(num_blocks=48))])
def test_lazy_outputs_materialize_to_the_eager_ones(byte_bpe, seed, config):
    """step(lazy=True) leaves the deltas of one-sequence plain requests as PendingOutputs; each,
    materialized after the whole run, is the RequestOutput step() gives for that step. Built
    eagerly (make_outputs' lazy flag ignored), no PendingOutput appears and the test fails."""
    tok = ProjectTokenizer(byte_bpe)
    requests = mixed_requests(tok, 40, seed)
    abort_at = {3: ["r2", "r9"], 7: ["r4", "r17", "r20"], 12: ["r30"]}
    eager, eager_stats = run(tok, True, requests, abort_at, **config)
    pending = []
    lazy, lazy_stats = run(tok, True, requests, abort_at, lazy=True, pending=pending, **config)
    assert lazy == eager and lazy_stats == eager_stats
    assert pending[0] >= 40, "the plain requests' deltas were not left pending"


def test_lazy_outputs_keep_their_step_values(byte_bpe):
    """A PendingOutput holds its step's values: materialized late, a request's deltas still
    carry one new token each and last_token_time values that grow step by step."""
    tok = ProjectTokenizer(byte_bpe)
    engine = make_engine(tok, True)
    engine.add_request("a", tok.encode("The quick brown fox"), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step(lazy=True)
    assert len(outs) == 8 and all(isinstance(o, _step.PendingOutput) for o in outs)
    assert [o.finished for o in outs] == [False] * 7 + [True] and [o.request_id for o in outs] == ["a"] * 8
    done = [o.materialize() for o in outs]
    assert [len(o.outputs[0].token_ids) for o in done] == [1] * 8
    times = [o.metrics.last_token_time for o in done]
    assert times == sorted(times) and len(set(times)) == 8
    assert [o.outputs[0].finish_reason for o in done] == [None] * 7 + ["length"]


def test_async_engine_streams_materialized_outputs(byte_bpe, monkeypatch):
    """AsyncEngine steps lazily: PendingOutputs reach the streams and readers get the
    RequestOutputs a synchronous step() gives, folded to the same texts and token ids."""
    from lite_llm.outputs import fold
    tok = ProjectTokenizer(byte_bpe)
    requests = [(f"s{i}", tok.encode(CORPUS[i % 5])[: 3 + i], SamplingParams(max_tokens=6 + i, temperature=0.0))
                for i in range(5)]
    put, seen = RequestStream.put, []
    monkeypatch.setattr(RequestStream, "put", lambda self, item: (seen.append(type(item)), put(self, item))[1])
    ae = AsyncEngine(make_engine(tok, True))
    ae.start()
    try:
        streams = [ae.add_request(rid, prompt, params) for rid, prompt, params in requests]
        for stream in streams:
            stream.timeout = 30
        got = {s.request_id: list(s) for s in streams}
    finally:
        ae.shutdown()
    assert _step.PendingOutput in seen
    assert all(type(o) is RequestOutput for deltas in got.values() for o in deltas)
    sync = make_engine(tok, True)
    for rid, prompt, params in requests:
        sync.add_request(rid, prompt, params)
    deltas = {}
    while sync.has_unfinished_requests():
        for o in sync.step():
            deltas.setdefault(o.request_id, []).append(o)
    for rid, _, _ in requests:
        a, b = fold(got[rid]), fold(deltas[rid])
        assert [(c.text, c.token_ids, c.finish_reason) for c in a.outputs] == \
            [(c.text, c.token_ids, c.finish_reason) for c in b.outputs]
        assert len(got[rid]) == len(deltas[rid])
