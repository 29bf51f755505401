"""The compiled step paths against the Python reference they follow, on a tiny random llama
through a real ModelRunner and its own tokenizer:
- the steady decode lane (_step.DecodeLane: a batch of plain decodes stepped by one compiled
  call, without a SchedulerOutput, chunks or SampleResults) against the step path it bypasses
  (LLMEngine.decode_lanes = False);
- every compiled path at once (the lane, _step.plain_step / make_outputs and the runner's
  _execute_plain) against the Python reference alone (LLMEngine.batched_decode = False,
  decode_lanes = False, ModelRunner.plain_fast_path = False): the one step the spec describes.

Both engines get the same requests arriving over the first steps and abort the same ones at
the same steps. The workloads make the lane start and end again and again: requests finish
at different steps (max_tokens, EOS, stop token ids), 16-token blocks fill at different steps
(the lane allocates the next one), a short pool preempts, more requests than max_num_seqs
wait while the batch is full, and requests the lane cannot take (logprobs, stop strings,
n > 1, min_tokens) join now and then. Every step's outputs, the stats both must agree on and
the freed KV must be identical, and the lane must have run most decode steps.
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


PATHS = {   # (decode_lanes, batched_decode, plain_fast_path)
    "compiled": (True, True, True),
    "step path": (False, True, True),
    "reference": (False, False, False),
}


def make_engine(lanes: bool | str, **overrides) -> LLMEngine:
    """lanes: True / False (the lane or not, over the compiled step path), or a key of PATHS."""
    path = str(tiny_checkpoint_path("llama"))
    if path not in _LOADED:
        _LOADED[path] = load_model(path, dtype="float32", progress=False)
    loaded = _LOADED[path]
    cfg = dict(max_num_seqs=16, max_num_batched_tokens=128, block_size=16, num_blocks=256, max_model_len=96,
               seed=3, eos_token_ids=tuple(loaded.config.eos_token_ids))
    cfg.update(overrides)
    config = EngineConfig(**cfg)
    runner = ModelRunner(loaded, num_blocks=config.num_blocks, block_size=config.block_size,
                         max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
                         num_threads=2)
    engine = LLMEngine(runner, loaded.tokenizer, config)
    lanes, batched, plain = PATHS[lanes] if isinstance(lanes, str) else (lanes, True, True)
    engine.decode_lanes, engine.batched_decode, runner.plain_fast_path = lanes, batched, plain
    return engine


def plain_requests(tokenizer, num: int, seed: int):
    """What the lane takes: greedy and seeded draws, penalties, stop token ids, EOS, DELTA and
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


def run(lanes: bool | str, requests, abort_at: dict[int, list[str]], lazy: bool = False, **overrides):
    """Every step's outputs as plain values, the stats both paths must agree on, and the steps
    the lane ran."""
    engine = make_engine(lanes, **overrides)
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
    return steps, stats, engine.decode_lane_steps


@pytest.mark.parametrize("config", [{}, dict(num_blocks=20), dict(max_num_seqs=6)],
                         ids=["roomy", "preempting", "queue-while-full"])
def test_lane_gives_the_step_paths_outputs(config):
    tok = make_engine(False).tokenizer
    requests = plain_requests(tok, 30, 0)
    abort_at = {5: ["p3", "p7"], 14: ["p12", "p20"], 30: ["p25"]}
    ref_steps, ref_stats, ref_lane = run(False, requests, abort_at, **config)
    steps, stats, lane_steps = run(True, requests, abort_at, **config)
    assert ref_lane == 0
    finishes = {c[3] for step in ref_steps for o in step for c in o[2] if c[3]}
    assert {"length", "abort"} <= finishes
    assert stats == ref_stats
    assert steps == ref_steps
    assert lane_steps >= len(steps) // 3, f"the lane ran {lane_steps} of {len(steps)} steps"
    if "num_blocks" in config:
        assert ref_stats[4] > 0, "the pool must preempt"


def test_lane_with_requests_it_cannot_take():
    """Logprobs, stop strings, n > 1 and min_tokens requests join the plain ones: the lane
    ends when they arrive and forms again once they leave; the outputs stay the step path's."""
    tok = make_engine(False).tokenizer
    requests = plain_requests(tok, 16, 1) + mixed_requests(tok, 16, 2) + plain_requests(tok, 16, 3)
    requests = [(f"{rid}-{i}", prompt, params) for i, (rid, prompt, params) in enumerate(requests)]
    ref_steps, ref_stats, _ = run(False, requests, {})
    steps, stats, lane_steps = run(True, requests, {})
    assert stats == ref_stats
    assert steps == ref_steps
    assert lane_steps > 0


def test_lane_lazy_outputs():
    """step(lazy=True) in the lane leaves PendingOutputs that materialize to the step path's."""
    tok = make_engine(False).tokenizer
    requests = plain_requests(tok, 12, 4)
    ref_steps, ref_stats, _ = run(False, requests, {}, lazy=True)
    steps, stats, lane_steps = run(True, requests, {}, lazy=True)
    assert (steps, stats) == (ref_steps, ref_stats) and lane_steps > 10


def test_lane_forms_and_steps():
    """The lane forms after the first decode step (the prefill's chunks are not one token
    each) and its step gives every sequence one more token."""
    tok = make_engine(False).tokenizer
    requests = plain_requests(tok, 8, 5)
    engine = make_engine(True)
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    engine.step()                     # the prefill step
    assert engine.decode_lane is None
    for _ in range(8):                # decode steps on the step path until one qualifies (none finishes)
        engine.step()
        if engine.decode_lane is not None:
            break
    assert isinstance(engine.decode_lane, _step.DecodeLane) and engine.decode_lane_steps == 0
    lane = engine.decode_lane
    running = list(engine.scheduler.running)
    before = [list(r.output_token_ids) for r in running]
    engine.step()
    assert engine.decode_lane_steps == 1 and lane.num_steps == 1
    for request, b in zip(running, before):
        assert request.output_token_ids[:-1] == b and request.num_computed_tokens == request.num_tokens - 1


def test_stats_twins_match_the_python_ones():
    """_step.add_itl and _step.record_step (the lane's) against StatsCollector.add_itl and
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


@pytest.mark.parametrize("lanes", [True, False])
def test_a_request_fair_admission_starts_ends_the_lane(lanes):
    """Six plain sequences of one owner hold every slot, stepped by the lane; a request of another
    owner arrives: the lane ends for it (its slot comes from a preemption, not a free one), its
    first token comes within 2 steps, and every step's outputs are those of the step path."""
    tok = make_engine(False).tokenizer
    prompt = tok.encode("The quick brown fox", add_special_tokens=False)
    small_prompt = tok.encode("Hello", add_special_tokens=False)
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)

    def run_fair(lanes: bool):
        engine = make_engine(lanes, max_num_seqs=6)
        for i in range(6):
            engine.add_request(f"big-{i}", prompt + [i + 3], params, owner="big")
        steps, counts = [], []
        for _ in range(8):
            steps.append(plain_outputs(engine.step(), counts))
        lane_steps = engine.decode_lane_steps
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
        return steps, first, lane_steps, engine.decode_lane_steps, engine.scheduler.num_preemptions_total

    steps, first, lane_before, lane_total, preempted = run_fair(lanes)
    assert first is not None and first <= 2, f"the small request's first token after {first} steps"
    assert preempted >= 1
    if lanes:
        assert lane_before > 0 and lane_total > lane_before + 20    # the lane formed again afterwards
        ref_steps, ref_first, _, _, _ = run_fair(False)
        assert (steps, first) == (ref_steps, ref_first)


@pytest.mark.parametrize("config", [{}, dict(num_blocks=14), dict(max_num_seqs=5)],
                         ids=["roomy", "full-kv", "queue-while-full"])
def test_compiled_paths_follow_the_python_reference_step_by_step(config):
    """Every compiled path at once against the Python reference alone, over one workload:
    arrivals over the first steps, aborts, stop token ids, EOS and length limits, a pool so
    short that sequences are preempted and wait for room, and requests the compiled paths hand
    back to the reference (logprobs, stop strings, n > 1, min_tokens). Each step's outputs, its
    size and bytes read, and the stats must be the same step for step."""
    tok = make_engine(False).tokenizer
    requests = plain_requests(tok, 14, 6) + mixed_requests(tok, 8, 7) + plain_requests(tok, 14, 8)
    requests = [(f"{rid}-{i}", prompt, params) for i, (rid, prompt, params) in enumerate(requests)]
    abort_at = {4: [requests[2][0], requests[20][0]], 11: [requests[9][0]], 25: [requests[30][0]]}
    ref_steps, ref_stats, ref_lane = run("reference", requests, abort_at, **config)
    steps, stats, lane_steps = run("compiled", requests, abort_at, **config)
    assert ref_lane == 0 and lane_steps > 0
    finishes = {c[3] for step in ref_steps for o in step for c in o[2] if c[3]}
    assert {"length", "abort", "stop"} <= finishes
    for i, (got, want) in enumerate(zip(steps, ref_steps)):
        assert got == want, f"step {i} differs"
    assert len(steps) == len(ref_steps)
    assert stats == ref_stats
    if "num_blocks" in config:
        assert ref_stats[4] > 0, "the pool must preempt"
