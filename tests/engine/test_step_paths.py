"""The compiled step paths against the Python reference they follow, on a tiny random llama
through a real ModelRunner and its own tokenizer. Every step takes one path, schedule ->
execute -> update -> outputs; its per-sequence parts run compiled (the scheduler's decode
chunks, _step.schedule_decodes; the runner's plain step, ModelRunner._execute_plain; the
update, detokenizing and outputs, _step.plain_step / make_outputs) or as the Python code
they follow (Scheduler.compiled_decodes = False, ModelRunner.plain_fast_path = False,
LLMEngine.batched_decode = False): the one step the spec describes.

Both engines get the same requests arriving over the first steps and abort the same ones at
the same steps. The workloads make steady decode batches form and break again and again:
requests finish at different steps (max_tokens, EOS, stop token ids), 16-token blocks fill
at different steps (the compiled scheduler allocates the next one), a short pool preempts,
more requests than max_num_seqs wait while the batch is full, and requests the compiled
paths hand back to the Python code (logprobs, stop strings, n > 1, min_tokens) join now and
then. Every step's outputs, its size and bytes read, the stats and the freed KV must be the
same step for step.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_checkpoint_path
from test_step_batched import mixed_requests, plain_outputs

from lite_llm.engine import _step
from lite_llm.engine.engine import EngineConfig, LLMEngine
from lite_llm.engine.runner import ModelRunner
from lite_llm.model.loader import load_model
from lite_llm.sampling_params import RequestOutputKind, SamplingParams

_LOADED = {}


PATHS = {   # (Scheduler.compiled_decodes, LLMEngine.batched_decode, ModelRunner.plain_fast_path)
    "compiled": (True, True, True),
    "compiled step, general runner": (True, True, False),
    "reference": (False, False, False),
}


def make_engine(path: str = "compiled", **overrides) -> LLMEngine:
    """An engine on the tiny llama whose step takes the given PATHS entry."""
    ckpt = str(tiny_checkpoint_path("llama"))
    if ckpt not in _LOADED:
        _LOADED[ckpt] = load_model(ckpt, dtype="float32", progress=False)
    loaded = _LOADED[ckpt]
    cfg = dict(max_num_seqs=16, max_num_batched_tokens=128, block_size=16, num_blocks=256, max_model_len=96,
               seed=3, eos_token_ids=tuple(loaded.config.eos_token_ids))
    cfg.update(overrides)
    config = EngineConfig(**cfg)
    runner = ModelRunner(loaded, num_blocks=config.num_blocks, block_size=config.block_size,
                         max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
                         num_threads=2)
    engine = LLMEngine(runner, loaded.tokenizer, config)
    engine.scheduler.compiled_decodes, engine.batched_decode, runner.plain_fast_path = PATHS[path]
    return engine


def plain_requests(tokenizer, num: int, seed: int):
    """What the compiled paths take: greedy and seeded draws, penalties, stop token ids, EOS, DELTA and
    FINAL_ONLY, different lengths (so finishes and full blocks fall on different steps)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(num):
        prompt = [int(t) for t in rng.integers(3, 300, int(rng.integers(1, 14)))]
        params = dict(max_tokens=int(rng.integers(2, 48)), seed=200 + i,
                      temperature=(0.0, 0.8, 1.2)[i % 3], ignore_eos=i % 4 != 0)
        if i % 5 == 1:
            params.update(stop_token_ids=[int(t) for t in rng.integers(3, 300, 6)])
        if i % 5 == 2:
            params.update(repetition_penalty=1.3, frequency_penalty=0.4, top_k=40)
        if i % 5 == 3:
            params.update(output_kind=RequestOutputKind.FINAL_ONLY, top_p=0.8)
        out.append((f"p{i}", prompt, SamplingParams(**params)))
    return out


def run(path: str, requests, abort_at: dict[int, list[str]], lazy: bool = False, **overrides):
    """Every step's outputs as plain values, the stats the paths must agree on, and the steps
    the runner's plain path ran."""
    engine = make_engine(path, **overrides)
    waiting = list(requests)
    steps, counts = [], []
    for step in range(10_000):
        while waiting and len(waiting) > len(requests) - 3 * (step + 1):   # arrivals over the first steps
            rid, prompt, params = waiting.pop(0)
            engine.add_request(rid, prompt, params)
        outs = engine.step(lazy=lazy)
        if step in abort_at:
            outs += engine.abort_request(abort_at[step])
        steps.append(plain_outputs(outs, counts))
        if not waiting and not engine.has_unfinished_requests():
            break
    kv = engine.kv_cache_manager
    kv.block_pool.check()
    assert kv.num_free_blocks == kv.num_blocks
    s = engine.stats()
    stats = (s.generation_tokens_total, s.prompt_tokens_total, s.itl.count,   # (latencies are timings)
             dict(s.request_success_total), s.num_preempted_total, s.step_python.count, s.step_kernel.count,
             s.step_bytes_read_total, [(r.num_seqs, r.num_tokens, r.bytes_read) for r in s.recent_steps])
    return steps, stats, engine.runner.plain_steps + engine.runner.steady_steps, engine.steady_steps


def check_same(path: str, requests, abort_at, lazy=False, **config):
    """path's steps, stats and freed KV equal the reference's, step for step; returns the
    reference's steps and stats, and the plain steps path's runner ran."""
    ref_steps, ref_stats, ref_plain, ref_steady = run("reference", requests, abort_at, lazy, **config)
    steps, stats, plain, _ = run(path, requests, abort_at, lazy, **config)
    assert ref_plain == 0 and ref_steady == 0
    for i, (got, want) in enumerate(zip(steps, ref_steps)):
        assert got == want, f"step {i} differs"
    assert len(steps) == len(ref_steps)
    assert stats == ref_stats
    return ref_steps, ref_stats, plain


@pytest.mark.parametrize("path", ["compiled", "compiled step, general runner"])
@pytest.mark.parametrize("config", [{}, dict(num_blocks=20), dict(max_num_seqs=6)],
                         ids=["roomy", "preempting", "queue-while-full"])
def test_plain_workload_follows_the_reference(config, path):
    """Plain requests only: steady decode batches most of the time, broken by finishes,
    aborts, full blocks, preemption and arrivals."""
    tok = make_engine().tokenizer
    requests = plain_requests(tok, 30, 0)
    abort_at = {5: ["p3", "p7"], 14: ["p12", "p20"], 30: ["p25"]}
    ref_steps, ref_stats, plain = check_same(path, requests, abort_at, **config)
    finishes = {c[3] for step in ref_steps for o in step for c in o[2] if c[3]}
    assert {"length", "abort"} <= finishes
    if path == "compiled":
        assert plain >= len(ref_steps) // 2, f"the plain runner path ran {plain} of {len(ref_steps)} steps"
    if "num_blocks" in config:
        assert ref_stats[4] > 0, "the pool must preempt"


def test_requests_the_compiled_paths_hand_back():
    """Logprobs, stop strings, n > 1 and min_tokens requests join the plain ones."""
    tok = make_engine().tokenizer
    requests = plain_requests(tok, 16, 1) + mixed_requests(tok, 16, 2) + plain_requests(tok, 16, 3)
    requests = [(f"{rid}-{i}", prompt, params) for i, (rid, prompt, params) in enumerate(requests)]
    _, _, plain = check_same("compiled", requests, {})
    assert plain > 0


def test_lazy_outputs():
    """step(lazy=True) leaves PendingOutputs that materialize to the reference's outputs."""
    tok = make_engine().tokenizer
    requests = plain_requests(tok, 12, 4)
    _, _, plain = check_same("compiled", requests, {}, lazy=True)
    assert plain > 10


def test_compiled_scheduler_allocates_the_next_block():
    """A steady batch whose 16-token blocks fill: _step.schedule_decodes hands each sequence its
    new block in its chunk (the Python loop's allocate_slots), and the chunks are exactly
    the reference scheduler's, step by step."""
    tok = make_engine().tokenizer
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    engines = {path: make_engine(path) for path in ("compiled", "reference")}
    for engine in engines.values():
        for i in range(4):
            engine.add_request(f"r{i}", tok.encode("a b c", add_special_tokens=False) + [i + 3] * (i + 1), params)
    seen_new_blocks = 0
    for _ in range(44):
        outs = {}
        for path, engine in engines.items():
            sched_out = engine.scheduler.schedule()
            outs[path] = [(c.request.request_id, c.start, c.num_new_tokens, list(c.new_block_ids), c.sample, c.is_new)
                          for c in sched_out.chunks]
            if sched_out.chunks:
                engine.scheduler.update_from_output(sched_out, engine.runner.execute(sched_out).sampled)
        assert outs["compiled"] == outs["reference"]
        seen_new_blocks += sum(1 for c in outs["compiled"] if c[3] and not c[5])
    assert seen_new_blocks >= 4, "blocks must fill during decoding"


def test_stats_twins_match_the_python_ones():
    """_step.add_itl and _step.record_step (the compiled step's) against StatsCollector.add_itl and
    StatsCollector.record_step, values on bucket bounds included."""
    from lite_llm.engine.stats import STEP_BUCKETS, TPOT_BUCKETS, StatsCollector, StepRecord
    rng = np.random.default_rng(0)
    a, b = StatsCollector(), StatsCollector()
    for _ in range(200):
        now = float(rng.uniform(1, 2))
        itl = {now - float(rng.choice(TPOT_BUCKETS + (rng.uniform(0, 100),))): int(rng.integers(1, 5))
               for _ in range(int(rng.integers(1, 4)))}
        a.add_itl(itl, now)
        _step.add_itl(b, itl, now)
        rec = StepRecord(3, 4, float(rng.choice(STEP_BUCKETS)), float(rng.uniform(0, 3)), int(rng.integers(0, 99)))
        a.record_step(rec)
        _step.record_step(b, rec)
    for name in ("itl", "step_python", "step_kernel"):
        ha, hb = getattr(a, name).snapshot(), getattr(b, name).snapshot()
        assert ha.counts == hb.counts and ha.count == hb.count and ha.sum == pytest.approx(hb.sum, rel=1e-12)
    assert (a.generation_tokens_total, a.num_steps_total, a.step_bytes_read_total, list(a.recent_steps)) == \
        (b.generation_tokens_total, b.num_steps_total, b.step_bytes_read_total, list(b.recent_steps))


def test_fair_admission_breaks_a_steady_batch():
    """Six plain sequences of one owner hold every slot, decoding steadily; a request of another
    owner arrives: its slot comes from a preemption, its first token within 2 steps, and every
    step's outputs are the reference's."""
    tok = make_engine().tokenizer
    prompt = tok.encode("The quick brown fox", add_special_tokens=False)
    small_prompt = tok.encode("Hello", add_special_tokens=False)
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)

    def run_fair(path: str):
        engine = make_engine(path, max_num_seqs=6)
        for i in range(6):
            engine.add_request(f"big-{i}", prompt + [i + 3], params, owner="big")
        steps, counts = [], []
        for _ in range(8):
            steps.append(plain_outputs(engine.step(), counts))
        engine.add_request("small", small_prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        first = None
        for step in range(1, 200):
            outs = plain_outputs(engine.step(), counts)
            steps.append(outs)
            if first is None and any(o[0] == "small" and o[2] and o[2][0][2] for o in outs):
                first = step
            if not engine.has_unfinished_requests():
                break
        assert not engine.has_unfinished_requests()
        return steps, first, engine.scheduler.num_preemptions_total

    steps, first, preempted = run_fair("compiled")
    assert first is not None and first <= 2, f"the small request's first token after {first} steps"
    assert preempted >= 1
    assert (steps, first) == run_fair("reference")[:2]


@pytest.mark.parametrize("config", [{}, dict(num_blocks=14), dict(max_num_seqs=5)],
                         ids=["roomy", "full-kv", "queue-while-full"])
def test_compiled_paths_follow_the_python_reference_step_by_step(config):
    """Every compiled path at once against the Python reference alone, over one workload:
    arrivals over the first steps, aborts, stop token ids, EOS and length limits, a pool so
    short that sequences are preempted and wait for room, and requests the compiled paths hand
    back to the reference (logprobs, stop strings, n > 1, min_tokens). Each step's outputs, its
    size and bytes read, and the stats must be the same step for step."""
    tok = make_engine().tokenizer
    requests = plain_requests(tok, 14, 6) + mixed_requests(tok, 8, 7) + plain_requests(tok, 14, 8)
    requests = [(f"{rid}-{i}", prompt, params) for i, (rid, prompt, params) in enumerate(requests)]
    abort_at = {4: [requests[2][0], requests[20][0]], 11: [requests[9][0]], 25: [requests[30][0]]}
    ref_steps, ref_stats, plain = check_same("compiled", requests, abort_at, **config)
    assert plain > 0
    finishes = {c[3] for step in ref_steps for o in step for c in o[2] if c[3]}
    assert {"length", "abort", "stop"} <= finishes
    if "num_blocks" in config:
        assert ref_stats[4] > 0, "the pool must preempt"


def test_a_steady_batch_takes_the_compiled_steady_step():
    """Once the same sequences decode one token each, step after step, the scheduler marks the
    steps steady, the runner repeats its bound step (_batch.SteadyDecode) and the engine runs the
    next ones as one compiled call (_step.SteadyStep: without schedule() or execute() frames)
    for nearly all of them; the reference scheduler's steps (Scheduler.compiled_decodes =
    False) are marked the same, and the reference engine never takes the compiled step."""
    tok = make_engine().tokenizer
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    engines = {path: make_engine(path) for path in ("compiled", "reference")}
    marks = {path: [] for path in engines}
    compiled_steps = {path: 0 for path in engines}
    for path, engine in engines.items():
        for i in range(4):
            engine.add_request(f"r{i}", tok.encode("a b c", add_special_tokens=False) + [i + 3], params)
        schedule = engine.scheduler.schedule

        def spy(schedule=schedule, out=marks[path]):
            sched_out = schedule()
            out.append(sched_out.steady)
            return sched_out
        engine.scheduler.schedule = spy
        while engine.has_unfinished_requests():
            seen = len(marks[path])
            engine.step()
            if len(marks[path]) == seen:       # no schedule() frame: the compiled steady step ran
                marks[path].append(True)
                compiled_steps[path] += 1
    assert marks["compiled"] == marks["reference"]
    assert compiled_steps["compiled"] >= 35 and compiled_steps["reference"] == 0
    assert engines["compiled"].runner.steady_steps >= 36 and engines["reference"].runner.steady_steps == 0


def test_the_compiled_steady_step_follows_the_python_step():
    """The engine's compiled steady step (LLMEngine.compiled_steady) against the same engine
    running those steps through schedule() -> execute() -> finish_plain: the same outputs,
    stats and freed KV step for step, on workloads whose steady batches form and break (arrivals,
    aborts, finishes, full blocks, preemption)."""
    tok = make_engine().tokenizer
    requests = plain_requests(tok, 10, 21) + plain_requests(tok, 10, 22)
    requests = [(f"{rid}-{i}", prompt, params) for i, (rid, prompt, params) in enumerate(requests)]
    abort_at = {6: [requests[3][0]], 30: [requests[12][0]]}
    for config in ({}, dict(num_blocks=14)):
        results = {}
        for compiled in (True, False):
            LLMEngine.compiled_steady = compiled
            try:
                results[compiled] = run("compiled", requests, abort_at, **config)
            finally:
                LLMEngine.compiled_steady = True
        assert results[True][3] >= 10 and results[False][3] == 0
        assert results[True][0] == results[False][0]
        assert results[True][1] == results[False][1]
