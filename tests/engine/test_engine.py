"""LLMEngine and AsyncEngine over the KV-checking FakeRunner.

The fake's next token is a pure function of a sequence's tokens (and seed when sampling),
so every way of scheduling the same requests (alone, in a batch of 64, under a tiny cache
that preempts, in 64-token prefill chunks, with prefix-cache hits) must give identical
outputs, while the fake checks every slot each step.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
from fake_runner import FakeRunner, next_token

from lite_llm.engine.async_engine import (AsyncEngine, EngineDeadError, EngineShutdownError,
                                          QueueFullError)
from lite_llm.engine.engine import EngineConfig, LLMEngine
from lite_llm.outputs import RequestOutput, fold
from lite_llm.sampling_params import SamplingParams

VOCAB = 50
STREAM_TIMEOUT = 60.0       # only guards against a hang; never reached when the code works


def make_engine(tokenizer=None, **overrides) -> tuple[LLMEngine, FakeRunner]:
    cfg = dict(max_num_seqs=64, max_num_batched_tokens=2048, block_size=4, num_blocks=1024,
               max_model_len=512, seed=7)
    cfg.update(overrides)
    config = EngineConfig(**cfg)
    runner = FakeRunner(config.num_blocks, config.block_size, VOCAB,
                        config.max_num_batched_tokens, config.max_num_seqs)
    return LLMEngine(runner, tokenizer, config), runner


def run_all(engine: LLMEngine, max_steps: int = 100_000) -> dict[str, RequestOutput]:
    """Step until every request finished; each request's deltas folded into its whole output."""
    deltas: dict[str, list[RequestOutput]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            deltas.setdefault(out.request_id, []).append(out)
    assert not engine.has_unfinished_requests()
    assert all(outs[-1].finished and not any(o.finished for o in outs[:-1]) for outs in deltas.values())
    final = {rid: fold(outs) for rid, outs in deltas.items()}
    kv = engine.kv_cache_manager
    kv.block_pool.check()
    assert kv.num_free_blocks == kv.num_blocks and not kv.block_tables   # nothing leaked
    return final


def workload(num: int = 64):
    """Mixed lengths, shared prefixes (prefix-cache hits), greedy and seeded sampling."""
    rng = np.random.default_rng(0)
    system = [int(t) for t in rng.integers(1, VOCAB, 24)]
    reqs = []
    for i in range(num):
        own = [int(t) for t in rng.integers(1, VOCAB, int(rng.integers(1, 60)))]
        prompt = (system + own) if i % 3 else own
        greedy = i % 2 == 0
        params = SamplingParams(max_tokens=int(rng.integers(1, 24)), temperature=0.0 if greedy else 0.8,
                                seed=None if greedy else 1000 + i, logprobs=1 if i % 5 == 0 else None,
                                ignore_eos=i % 7 == 0)
        reqs.append((f"req-{i}", prompt, params))
    return reqs


def summarize(out: RequestOutput):
    c = out.outputs[0]
    return (c.token_ids, c.finish_reason, c.stop_reason, c.cumulative_logprob,
            None if c.logprobs is None else [{t: (lp.logprob, lp.rank) for t, lp in d.items()}
                                              for d in c.logprobs])


@pytest.fixture(scope="module")
def reference():
    """Each request alone in its own engine, prefix caching off."""
    ref = {}
    for rid, prompt, params in workload():
        engine, _ = make_engine(enable_prefix_caching=False, eos_token_ids=(3,))
        engine.add_request(rid, prompt, params)
        ref[rid] = summarize(run_all(engine)[rid])
    return ref


@pytest.mark.parametrize("case", ["batch64", "tiny_cache_preempts", "chunked_budget_64",
                                  "prefix_hits", "no_prefix_cache"])
def test_same_outputs_however_scheduled(case, reference):
    overrides = {
        "batch64": {},
        "tiny_cache_preempts": {"num_blocks": 48, "max_num_seqs": 16},   # 192 slots, 16 seqs
        "chunked_budget_64": {"max_num_batched_tokens": 64},
        "prefix_hits": {"max_num_seqs": 4},
        "no_prefix_cache": {"enable_prefix_caching": False},
    }[case]
    engine, runner = make_engine(eos_token_ids=(3,), **overrides)
    for rid, prompt, params in workload():
        engine.add_request(rid, prompt, params)
    final = run_all(engine)
    assert {rid: summarize(out) for rid, out in final.items()} == reference
    stats = engine.stats()
    assert runner.max_step_seqs <= engine.config.max_num_seqs
    assert runner.max_step_tokens <= engine.config.max_num_batched_tokens
    if case == "batch64":
        assert runner.max_step_seqs == 64
    if case == "tiny_cache_preempts":
        assert stats.num_preempted_total > 0
        assert sum(out.metrics.num_preemptions for out in final.values()) == stats.num_preempted_total
    if case == "chunked_budget_64":
        assert runner.num_partial_prefills > 0
    if case == "prefix_hits":
        assert stats.prefix_cache_hits > 0
        assert sum(out.num_cached_tokens for out in final.values()) > 0
    if case == "no_prefix_cache":
        assert stats.prefix_cache_queries == 0 and stats.prefix_cache_hits == 0
    assert stats.kv_cache_usage == 0.0 and stats.num_running == 0 and stats.num_waiting == 0
    assert sum(stats.request_success_total.values()) == 64 == stats.e2e.count
    assert stats.generation_tokens_total == sum(len(out.outputs[0].token_ids) for out in final.values())
    assert stats.prompt_tokens_total == sum(len(p) for _, p, _ in workload())


def test_parallel_sampling_fans_out_with_derived_seeds_and_shares_prompt_blocks():
    prompt = list(range(1, 30))
    engine, _ = make_engine()
    engine.add_request("par", prompt, SamplingParams(n=3, temperature=1.0, seed=42, max_tokens=12,
                                                     ignore_eos=True))
    out = run_all(engine)["par"]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert engine.stats().prefix_cache_hits >= 2 * 28      # children reuse the prompt's blocks
    for i, comp in enumerate(out.outputs):
        alone, _ = make_engine(enable_prefix_caching=False)
        alone.add_request("one", prompt, SamplingParams(temperature=1.0, seed=42 + i, max_tokens=12,
                                                        ignore_eos=True))
        assert comp.token_ids == run_all(alone)["one"].outputs[0].token_ids
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3


def test_unseeded_requests_draw_seeds_from_the_engine_seed():
    def tokens(engine_seed):
        engine, _ = make_engine(seed=engine_seed)
        for i in range(3):
            engine.add_request(f"r{i}", [5, 6, 7], SamplingParams(temperature=1.0, max_tokens=8,
                                                                  ignore_eos=True))
        return [out.outputs[0].token_ids for out in sorted(run_all(engine).values(),
                                                           key=lambda o: o.request_id)]
    assert tokens(1) == tokens(1) != tokens(2)


def greedy_tokens(prompt, n):
    ids, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(ids, None, VOCAB))
        ids.append(out[-1])
    return out


def test_stop_conditions():
    prompt = [11, 12, 13]
    expected = greedy_tokens(prompt, 40)
    eos = expected[5]
    first = expected.index(eos)

    def run(params, **cfg):
        engine, _ = make_engine(eos_token_ids=(eos,), **cfg)
        engine.add_request("r", prompt, params)
        return run_all(engine)["r"].outputs[0]

    out = run(SamplingParams(temperature=0.0, max_tokens=40))
    assert out.token_ids == expected[:first + 1] and out.finish_reason == "stop"
    assert out.stop_reason is None
    out = run(SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    assert out.token_ids == expected and out.finish_reason == "length"
    later = [i for i, t in enumerate(expected) if t == eos and i >= first + 2]
    if later:      # min_tokens pushes the stop to the next EOS at or after min_tokens
        out = run(SamplingParams(temperature=0.0, max_tokens=40, min_tokens=first + 2))
        assert out.token_ids == expected[:later[0] + 1]
    stop_tok = expected[3]
    out = run(SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                             stop_token_ids=[stop_tok]))
    assert out.token_ids == expected[:expected.index(stop_tok) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_tok
    out = run(SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True), max_model_len=10)
    assert out.token_ids == expected[:7] and out.finish_reason == "length"   # 3 + 7 = 10


def test_invalid_requests_are_rejected():
    engine, _ = make_engine(max_model_len=16)
    with pytest.raises(ValueError):
        engine.add_request("long", list(range(17)), SamplingParams())
    with pytest.raises(ValueError):
        engine.add_request("empty", [], SamplingParams())
    engine.add_request("ok", [1, 2], SamplingParams())
    with pytest.raises(ValueError):
        engine.add_request("ok", [1, 2], SamplingParams())
    sized, _ = make_engine(vocab_size=VOCAB)    # ids past the embedding table never reach the kernels
    for ids in ([1, VOCAB], [-1, 2]):
        with pytest.raises(ValueError, match="outside the model's vocabulary"):
            sized.add_request("oov", ids, SamplingParams())
    sized.add_request("in", [0, VOCAB - 1], SamplingParams())
    # max_model_len is capped by the cache, so a lone request always fits
    small, _ = make_engine(num_blocks=2, block_size=4, max_model_len=100)
    with pytest.raises(ValueError):
        small.add_request("big", list(range(9)), SamplingParams())
    small.add_request("fits", list(range(1, 8)), SamplingParams(max_tokens=50, ignore_eos=True))
    assert run_all(small)["fits"].outputs[0].finish_reason == "length"


def test_abort_frees_blocks_at_once():
    engine, _ = make_engine()
    for i in range(4):
        engine.add_request(f"r{i}", list(range(1, 40)), SamplingParams(max_tokens=100, ignore_eos=True))
    deltas = []
    for _ in range(3):
        deltas += [out for out in engine.step() if out.request_id == "r2"]
    kv = engine.kv_cache_manager
    held = set(kv.block_tables["r2"]) - {b for rid, t in kv.block_tables.items() if rid != "r2" for b in t}
    free_before = kv.num_free_blocks
    (out,) = engine.abort_request("r2")
    assert out.finished and out.outputs[0].finish_reason == "abort" and out.outputs[0].token_ids == []
    whole = fold(deltas + [out])
    assert whole.finished and len(whole.outputs[0].token_ids) == 3
    assert "r2" not in kv.block_tables and kv.num_free_blocks == free_before + len(held)
    assert engine.abort_request(["r2", "unknown"]) == []
    engine.abort_request(["r0", "r1", "r3"])
    assert not engine.has_unfinished_requests() and kv.num_free_blocks == kv.num_blocks
    assert engine.stats().request_success_total == {"abort": 4}


class CharTokenizer:
    """Token t decodes to one letter; EOS (id 0) is special."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if (t == 0 and skip_special_tokens) else chr(ord("a") + t % 26) for t in ids)


def text_of(tokens):
    return CharTokenizer().decode(tokens)


def test_stop_strings_truncate_text_and_stream_never_leaks_them():
    prompt = [1, 2, 3]
    expected = greedy_tokens(prompt, 30)
    assert 0 not in expected      # one character per token: token index = character index
    full = text_of(expected)
    stop = full[8:11]                         # appears first at index <= 8
    cut = full.index(stop)
    for include in (False, True):
        engine, _ = make_engine(tokenizer=CharTokenizer())
        engine.add_request("s", prompt, SamplingParams(temperature=0.0, max_tokens=30, stop=[stop],
                                                       ignore_eos=True,
                                                       include_stop_str_in_output=include))
        streamed, final = "", None
        while engine.has_unfinished_requests():
            for out in engine.step():
                for comp in out.outputs:
                    streamed += comp.text
                    assert stop not in streamed or include
                if out.finished:
                    final = out.outputs[0]
        assert final.finish_reason == "stop" and final.stop_reason == stop
        want = full[:cut + len(stop)] if include else full[:cut]
        assert streamed == want
        assert final.text == want[len(streamed) - len(final.text):]   # last delta is a suffix
    # the token that completes the stop string is also the last one max_tokens allows
    engine, _ = make_engine(tokenizer=CharTokenizer())
    engine.add_request("s", prompt, SamplingParams(temperature=0.0, max_tokens=cut + len(stop),
                                                   stop=[stop], ignore_eos=True))
    final = run_all(engine)["s"].outputs[0]
    assert final.finish_reason == "stop" and final.text == full[:cut]
    assert engine.stats().request_success_total == {"stop": 1}


class PieceTokenizer:
    """Token t decodes to a piece of 0-3 letters from a small alphabet (empty pieces: text a
    token does not add to), so stop strings span tokens and begin inside them."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("abc"[t % 3] * (t % 4) for t in ids)


def reference_stop(pieces: list[str], stop: list[str], include: bool) -> tuple[str, str | None]:
    """The plain rule on the whole text: after each piece, the stop string whose match ends in
    that piece and starts first (list order breaks ties); (text, stop string) at the end."""
    text = ""
    for piece in pieces:
        text += piece
        found = [(text.find(s, max(0, len(text) - len(piece) - len(s) + 1)), k, s)
                 for k, s in enumerate(stop) if s and piece]
        found = [f for f in found if f[0] != -1]
        if found:
            index, _, s = min(found)
            return text[:index + len(s)] if include else text[:index], s
    return text, None


@pytest.mark.parametrize("seed", range(6))
def test_stop_strings_and_holdback_match_the_whole_text_rule(seed):
    """Streamed text with stop strings of several lengths, over tokens of 0-3 characters, equals
    the whole-text rule (reference_stop); no delta ever shows part of a stop string that later
    completes, and every streamed prefix is a prefix of the final text."""
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(1, VOCAB, 3)]
    expected = greedy_tokens(prompt, 60)
    full = PieceTokenizer().decode(expected)
    stop = ["".join(rng.choice(list("abc"), int(rng.integers(1, 5)))) for _ in range(3)]
    if len(full) > 12:        # one stop string surely in the text, starting mid-way
        at = int(rng.integers(3, len(full) - 6))
        stop[0] = full[at:at + int(rng.integers(2, 6))]
    for include in (False, True):
        want, want_stop = reference_stop([PieceTokenizer().decode([t]) for t in expected], stop, include)
        engine, _ = make_engine(tokenizer=PieceTokenizer())
        engine.add_request("s", prompt, SamplingParams(temperature=0.0, max_tokens=60, stop=stop, ignore_eos=True,
                                                       include_stop_str_in_output=include))
        streamed, final = "", None
        while engine.has_unfinished_requests():
            for out in engine.step():
                streamed += out.outputs[0].text if out.outputs else ""
                assert want.startswith(streamed), (streamed, want)
                if out.finished:
                    final = out.outputs[0]
        assert streamed == want
        assert final.stop_reason == want_stop
        assert final.finish_reason == ("stop" if want_stop is not None else "length")


def test_final_only_requests_get_one_output_equal_to_their_folded_deltas():
    """RequestOutputKind.FINAL_ONLY: nothing while a request runs, then one output holding what
    the DELTA run's deltas fold into (n > 1, stop strings, logprobs, length and EOS stops); an
    aborted one also ends with its single output."""
    from lite_llm.sampling_params import RequestOutputKind
    expected = greedy_tokens([1, 2, 3], 30)
    stop = text_of(expected)[8:11]
    cases = [("stop", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=30, stop=[stop], ignore_eos=True)),
             ("n3", [4, 5, 6, 7], SamplingParams(temperature=0.9, n=3, seed=5, max_tokens=12, logprobs=2)),
             ("eos", [9, 8], SamplingParams(temperature=0.0, max_tokens=40)),
             ("len", [2, 2, 2], SamplingParams(temperature=0.7, seed=1, max_tokens=7, stop=["zz"]))]
    results = {}
    for kind in (RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY):
        engine, _ = make_engine(tokenizer=CharTokenizer(), eos_token_ids=(3,))
        for rid, prompt, params in cases:
            engine.add_request(rid, prompt, params.replace(output_kind=kind))
        deltas: dict[str, list[RequestOutput]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                deltas.setdefault(out.request_id, []).append(out)
        results[kind] = {rid: fold(outs) for rid, outs in deltas.items()}
        if kind is RequestOutputKind.FINAL_ONLY:
            assert all(len(outs) == 1 and outs[0].finished for outs in deltas.values())
        else:
            assert max(len(outs) for outs in deltas.values()) > 1
    delta, final = results[RequestOutputKind.DELTA], results[RequestOutputKind.FINAL_ONLY]
    assert delta.keys() == final.keys() == {rid for rid, _, _ in cases}
    for rid in delta:
        assert final[rid].outputs == delta[rid].outputs, rid
        assert final[rid].finished and final[rid].metrics.finished_time is not None
    assert delta["stop"].outputs[0].stop_reason == stop and len(delta["n3"].outputs) == 3
    engine, _ = make_engine(tokenizer=CharTokenizer())
    engine.add_request("a", [1, 2], SamplingParams(max_tokens=50, ignore_eos=True,
                                                   output_kind=RequestOutputKind.FINAL_ONLY))
    assert [engine.step() for _ in range(4)] == [[]] * 4
    (out,) = engine.abort_request("a")
    assert out.finished and out.outputs[0].finish_reason == "abort" and len(out.outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="final")


def test_logprobs_carry_ranks_and_decoded_tokens():
    engine, _ = make_engine(tokenizer=CharTokenizer())
    engine.add_request("lp", [4, 5], SamplingParams(temperature=0.0, max_tokens=3, logprobs=1,
                                                   ignore_eos=True))
    comp = run_all(engine)["lp"].outputs[0]
    assert len(comp.logprobs) == 3
    for tok, entry in zip(comp.token_ids, comp.logprobs):
        assert list(entry)[0] == tok and entry[tok].rank == 1
        assert entry[tok].decoded_token == text_of([tok])
    assert comp.cumulative_logprob == pytest.approx(sum(d[t].logprob for t, d in zip(comp.token_ids,
                                                                                    comp.logprobs)))
    assert comp.text == text_of(comp.token_ids)


# ---- AsyncEngine --------------------------------------------------------------------------


class GatedRunner(FakeRunner):
    """A FakeRunner whose steps wait for permits, so tests decide when the engine moves on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cond = threading.Condition()
        self._permits = 0          # steps allowed to start; -1: no gate any more
        self.threads: set[int] = set()

    def execute(self, sched_out):
        with self._cond:
            while self._permits == 0:
                self._cond.wait()
            if self._permits > 0:
                self._permits -= 1
        self.threads.add(threading.get_ident())
        return super().execute(sched_out)

    def open(self, n: int | None = None):
        """Let n more steps run (all of them from now on if n is None)."""
        with self._cond:
            self._permits = -1 if n is None else self._permits + n
            self._cond.notify_all()


def make_async(gated: bool = False, max_queue=None, hook=None, **overrides):
    cfg = dict(max_num_seqs=8, max_num_batched_tokens=256, block_size=4, num_blocks=512,
               max_model_len=2000, seed=3)
    cfg.update(overrides)
    config = EngineConfig(**cfg)
    runner = (GatedRunner if gated else FakeRunner)(config.num_blocks, config.block_size, VOCAB)
    engine = LLMEngine(runner, CharTokenizer(), config)
    ae = AsyncEngine(engine, max_queue=max_queue, on_engine_thread_start=hook)
    ae.start()
    return ae, runner


def collect(stream) -> list[RequestOutput]:
    stream.timeout = STREAM_TIMEOUT
    return list(stream)


def test_async_streams_deltas_that_add_up_to_the_sync_output():
    hook_threads = []
    ae, runner = make_async(gated=True, hook=lambda: hook_threads.append(threading.get_ident()))
    runner.open()
    reqs = [(f"a{i}", [i + 1] * (3 + i), SamplingParams(n=1 + i % 2, temperature=0.5, seed=i,
                                                        max_tokens=5 + 3 * i, ignore_eos=True))
            for i in range(6)]
    results: dict[str, list[RequestOutput]] = {}

    def client(rid, prompt, params):
        results[rid] = collect(ae.add_request(rid, prompt, params))

    threads = [threading.Thread(target=client, args=r) for r in reqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ae.shutdown(grace_seconds=STREAM_TIMEOUT)
    assert not ae.is_alive
    assert runner.threads == set(hook_threads) and len(hook_threads) == 1   # one engine thread
    sync, _ = make_engine(tokenizer=CharTokenizer(), max_num_seqs=8, num_blocks=512, max_model_len=2000)
    for rid, prompt, params in reqs:
        sync.add_request(rid, prompt, params)
    final = run_all(sync)
    for rid, prompt, params in reqs:
        deltas = results[rid]
        assert deltas[-1].finished and not any(d.finished for d in deltas[:-1])
        for comp in final[rid].outputs:
            parts = [c for d in deltas for c in d.outputs if c.index == comp.index]
            assert sum((c.token_ids for c in parts), []) == comp.token_ids
            assert "".join(c.text for c in parts) == comp.text == text_of(comp.token_ids)
            assert parts[-1].finish_reason == "length"
            assert all(c.finish_reason is None for c in parts[:-1])
    stats = ae.stats()
    assert stats.request_success_total == {"length": sum(p.n for _, _, p in reqs)}
    assert stats.kv_cache_usage == 0.0


def test_async_abort_from_another_thread_frees_blocks():
    ae, runner = make_async(gated=True)
    stream = ae.add_request("long", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1000, ignore_eos=True))
    stream.timeout = STREAM_TIMEOUT
    runner.open(1)
    first = next(stream)
    assert len(first.outputs[0].token_ids) == 1 and not first.finished
    assert ae.stats().kv_cache_usage > 0 and ae.stats().num_running == 1
    aborter = threading.Thread(target=ae.abort, args=("long",))
    aborter.start()
    aborter.join()
    runner.open()
    rest = list(stream)
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    assert ae.engine.kv_cache_manager.num_free_blocks == 512    # freed, nothing leaked
    ae.shutdown()
    assert ae.stats().request_success_total == {"abort": 1} and ae.stats().kv_cache_usage == 0.0


def test_async_queue_limit_and_shutdown_aborts_in_flight():
    ae, runner = make_async(gated=True, max_queue=2, max_num_seqs=1)
    first = ae.add_request("r0", [1, 2, 3], SamplingParams(max_tokens=1000, ignore_eos=True))
    first.timeout = STREAM_TIMEOUT
    runner.open(1)
    next(first)                         # r0 runs; the engine now waits inside its next step
    waiting = [ae.add_request(f"r{i}", [1, 2], SamplingParams(max_tokens=3, ignore_eos=True))
               for i in (1, 2)]
    with pytest.raises(QueueFullError):
        ae.add_request("r3", [1, 2], SamplingParams())
    with pytest.raises(ValueError):
        ae.add_request("r1", [1, 2], SamplingParams())          # id in use
    stopper = threading.Thread(target=ae.shutdown, args=(0.0,))
    stopper.start()
    while ae.accepting:    # shutdown() stops accepting before it waits for the engine thread
        threading.Event().wait(0.001)
    with pytest.raises(EngineShutdownError):
        ae.add_request("late", [1], SamplingParams())
    runner.open()
    stopper.join()
    assert not ae.is_alive
    for stream in [first, *waiting]:
        stream.timeout = STREAM_TIMEOUT
        outs = list(stream)
        assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert ae.engine.kv_cache_manager.num_free_blocks == 512


def test_async_shutdown_with_grace_lets_requests_finish():
    ae, _ = make_async()
    stream = ae.add_request("g", [7, 8], SamplingParams(max_tokens=20, ignore_eos=True))
    ae.shutdown(grace_seconds=STREAM_TIMEOUT)
    stream.timeout = STREAM_TIMEOUT
    outs = list(stream)
    assert outs[-1].outputs[0].finish_reason == "length"
    assert sum(len(c.token_ids) for o in outs for c in o.outputs) == 20


def test_async_engine_failure_reaches_streams():
    class Broken(FakeRunner):
        def execute(self, sched_out):
            raise RuntimeError("kernel exploded")

    engine = LLMEngine(Broken(64, 4), None, EngineConfig(num_blocks=64, block_size=4))
    ae = AsyncEngine(engine)
    ae.start()
    stream = ae.add_request("x", [1, 2], SamplingParams())
    stream.timeout = STREAM_TIMEOUT
    with pytest.raises(EngineDeadError) as info:
        next(stream)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert not ae.is_alive
    with pytest.raises(EngineDeadError):
        ae.add_request("y", [1, 2], SamplingParams())


def test_failing_thread_start_hook_is_reported_by_start():
    engine, _ = make_engine()

    def hook():
        raise OSError("cannot bind threads")

    with pytest.raises(EngineDeadError) as info:
        AsyncEngine(engine, on_engine_thread_start=hook).start()
    assert isinstance(info.value.__cause__, OSError)


def test_step_and_latency_stats_live_in_the_engine_and_metrics_render_them():
    from prometheus_client.parser import text_string_to_metric_families

    from lite_llm.server.metrics import ServerMetrics
    engine, runner = make_engine()
    runner.step_cost = (1e-6, 1000)                # the runner's kernel seconds and bytes per step
    for i in range(3):
        engine.add_request(f"r{i}", [5, 6, 7 + i], SamplingParams(max_tokens=4, ignore_eos=True))
    run_all(engine)
    stats = engine.stats()
    assert stats.num_steps_total == runner.num_steps == stats.step_python.count == stats.step_kernel.count
    assert len(stats.recent_steps) == runner.num_steps
    assert all(s.kernel_seconds == 1e-6 and s.python_seconds > 0 for s in stats.recent_steps)
    assert stats.itl.count == 3 * (4 - 1)           # every token after a request's first
    assert stats.queue_time.count == stats.ttft.count == 3
    assert stats.step_bytes_read_total == 1000 * runner.num_steps
    assert stats.achieved_bandwidth == pytest.approx(1000 / 1e-6)
    text = ServerMetrics("m", {"num_threads": 2}).render(stats)
    samples = {(s.name, s.labels.get("le")): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("lite_llm:inter_token_latency_seconds_count", None)] == 9
    assert samples[("lite_llm:step_python_seconds_count", None)] == runner.num_steps
    assert samples[("lite_llm:step_kernel_seconds_bucket", "1e-05")] == runner.num_steps
    assert samples[("lite_llm:request_queue_time_seconds_count", None)] == 3
    assert samples[("lite_llm:decode_memory_bandwidth_bytes_per_second", None)] == pytest.approx(1e9)
    assert "lite_llm:num_threads" in {fam.name for fam in text_string_to_metric_families(text)}
    assert "lite_llm:kernel_info" in ServerMetrics("m").render(None)   # a failed engine still scrapes
