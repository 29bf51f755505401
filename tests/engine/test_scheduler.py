"""Scheduler property tests: random add/step/abort sequences keep every invariant.

After every operation: the block pool is consistent, each block's ref count equals the
number of block tables holding it, waiting (and preempted) requests hold no blocks, running
ones hold enough for their computed tokens; each step keeps the token budget and
max_num_seqs, and the FakeRunner proves every scheduled token has a valid slot and every
context it reads holds the right tokens. When all requests end, every block is free.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from fake_runner import FakeRunner, check_batch_rows, check_step_arrays
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_llm.engine.kv_cache import KVCacheManager
from lite_llm.engine.request import Request, RequestStatus
from lite_llm.engine.scheduler import Scheduler
from lite_llm.sampling_params import SamplingParams

EOS = 0


def check_invariants(sched: Scheduler) -> None:
    kv = sched.kv_cache_manager
    kv.block_pool.check()
    owners: dict[int, int] = {}
    for table in kv.block_tables.values():
        assert len(table) == len(set(table)), "block twice in one table"
        for b in table:
            owners[b] = owners.get(b, 0) + 1
    for block in kv.block_pool.blocks:
        assert block.ref_cnt == owners.get(block.block_id, 0), f"{block} vs {owners.get(block.block_id)}"
    assert kv.num_free_blocks + len(owners) == kv.num_blocks
    assert set(kv.block_tables) == {r.request_id for r in sched.running}
    for req in sched.waiting:
        assert req.status == RequestStatus.WAITING and req.request_id not in kv.block_tables
    for req in sched.running:
        assert req.status == RequestStatus.RUNNING
        assert len(kv.block_tables[req.request_id]) * kv.block_size >= req.num_computed_tokens
        assert req.num_computed_tokens < req.num_tokens
    assert set(kv.room) == set(kv.block_tables)
    for rid, room in kv.room.items():
        # the decode fast path skips allocate_slots up to room tokens: there, the call has
        # nothing to do (a stand-in with nothing else to read fails if it goes further)
        table = list(kv.block_tables[rid])
        assert kv.allocate_slots(SimpleNamespace(request_id=rid, num_computed_tokens=room - 1), 1) == []
        assert kv.block_tables[rid] == table
    ids = [r.request_id for r in sched.running] + [r.request_id for r in sched.waiting]
    assert sorted(ids) == sorted(sched.requests), "a request is lost or queued twice"
    assert len(sched.running) <= sched.max_num_seqs


def run_step(sched: Scheduler, runner: FakeRunner) -> list[Request]:
    out = sched.schedule()
    assert out.num_tokens <= sched.max_num_batched_tokens
    assert len(out.chunks) <= sched.max_num_seqs
    kv = sched.kv_cache_manager
    for chunk in out.chunks:
        table = kv.block_tables[chunk.request.request_id]
        if chunk.is_new:
            assert chunk.new_block_ids == table
        else:
            assert table[len(table) - len(chunk.new_block_ids):] == chunk.new_block_ids
    results = runner.execute(out).sampled if out.chunks else []
    if out.chunks:
        check_step_arrays(runner.batch, runner.last_arrays, runner.last_sampling, out, kv.block_tables)
    sampled = sched.update_from_output(out, results)
    # the batch holds every running request (and finished ones until the next step runs)
    assert {r.request_id for r in sched.running} <= set(runner.batch.slot_of)
    assert set(runner.batch.slot_of) - {r.request_id for r in sched.running} <= \
        set(sched.pending_removal_ids)
    check_batch_rows(runner.batch, [r for r in sched.running if r.request_id in runner.batch.slot_of])
    return [r for r, _ in sampled]


def new_scheduler(num_blocks: int, block_size: int, budget: int, max_seqs: int,
                  max_model_len: int = 200, policy: str = "fcfs", caching: bool = True):
    kv = KVCacheManager(num_blocks, block_size, caching)
    sched = Scheduler(kv, max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                      max_model_len=min(max_model_len, num_blocks * block_size), policy=policy)
    runner = FakeRunner(num_blocks, block_size, vocab_size=40,
                        max_num_batched_tokens=budget, max_num_seqs=max_seqs)
    return sched, runner


op = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 30), st.integers(0, 3)),
    st.tuples(st.just("step"), st.integers(1, 3)),
    st.tuples(st.just("abort"), st.integers(0, 100)),
    st.tuples(st.just("reuse"), st.integers(0, 100)),     # a new request under a finished one's id
)

# sampling parameters the runner's per-slot sampler arrays must carry (picked by prefix_kind)
PARAMS = [dict(temperature=0.0),
          dict(temperature=0.8, top_k=5, repetition_penalty=1.2, frequency_penalty=0.5),
          dict(temperature=0.0, min_tokens=4, stop_token_ids=[3], presence_penalty=0.3),
          dict(temperature=1.0, top_p=0.9, logprobs=2, ignore_eos=True, min_tokens=2)]


@settings(max_examples=120, deadline=None)
@given(ops=st.lists(op, min_size=8, max_size=40), num_blocks=st.integers(4, 40),
       block_size=st.sampled_from([1, 2, 4, 8]), budget=st.integers(1, 64),
       max_seqs=st.integers(1, 6), caching=st.booleans(),
       policy=st.sampled_from(["fcfs", "priority"]))
def test_random_operations_keep_invariants(ops, num_blocks, block_size, budget, max_seqs,
                                           caching, policy):
    run_random_ops(ops, num_blocks, block_size, budget, max_seqs, caching, policy)


def run_random_ops(ops, num_blocks, block_size, budget, max_seqs, caching, policy):
    sched, runner = new_scheduler(num_blocks, block_size, budget, max_seqs, policy=policy,
                                  caching=caching)
    all_requests: list[Request] = []
    for item in ops:
        if item[0] == "add":
            _, prompt_len, max_tokens, prefix_kind = item
            # shared prefixes (prefix_kind picks one of a few) make prefix-cache hits common
            prompt = [prefix_kind + 1] * min(prompt_len, 12) + list(range(5, 5 + prompt_len))[12:]
            prompt = prompt[:min(prompt_len, sched.max_model_len)]
            req = Request(f"r{len(all_requests)}", prompt,
                          SamplingParams(max_tokens=max_tokens, **{
                              **PARAMS[prefix_kind],
                              "min_tokens": min(PARAMS[prefix_kind].get("min_tokens", 0), max_tokens)}),
                          seed=len(all_requests) * 7919, eos_token_ids=(EOS,), priority=prefix_kind,
                          max_tokens=max_tokens)
            all_requests.append(req)
            sched.add_request(req)
        elif item[0] == "reuse":
            old = all_requests[item[1] % len(all_requests)] if all_requests else None
            if old is not None and old.request_id not in sched.requests:
                req = Request(old.request_id, (old.prompt_token_ids[::-1] + [1])[:sched.max_model_len],
                              SamplingParams(max_tokens=3, temperature=0.0), seed=1,
                              eos_token_ids=(EOS,), max_tokens=3)
                all_requests.append(req)
                sched.add_request(req)
        elif item[0] == "step":
            for _ in range(item[1]):
                run_step(sched, runner)
                check_invariants(sched)
        else:
            if all_requests:
                victim = all_requests[item[1] % len(all_requests)]
                free_before = sched.kv_cache_manager.num_free_blocks
                # blocks come back at once, but shared ones (a prefix-cache hit of another
                # running request) stay with their other owners
                kv = sched.kv_cache_manager
                own = sum(kv.block_pool.blocks[b].ref_cnt == 1 for b in kv.block_tables.get(victim.request_id, []))
                sched.finish_requests(victim.request_id, RequestStatus.FINISHED_ABORTED)
                assert sched.kv_cache_manager.num_free_blocks == free_before + own
        check_invariants(sched)
    for _ in range(2000):                      # drain: everything must finish on its own
        if not sched.has_unfinished_requests():
            break
        run_step(sched, runner)
        check_invariants(sched)
    assert not sched.has_unfinished_requests()
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == num_blocks and not kv.block_tables
    for req in all_requests:
        assert req.is_finished
        if req.finish_reason != "abort":
            assert req.num_output_tokens <= req.max_tokens
            assert req.num_tokens <= sched.max_model_len + 1
    return sched, runner


def test_random_stress_preempts_hits_and_chunks():
    """Denser random runs than hypothesis draws: proves the invariants hold while preemption,
    prefix hits and chunked prefill actually happen."""
    rng = np.random.default_rng(1234)
    num_preempted = num_hits = num_partial = 0
    for _ in range(30):
        ops = []
        for _ in range(int(rng.integers(20, 60))):
            kind = rng.choice(["add", "add", "step", "step", "step", "abort"])
            if kind == "add":
                ops.append(("add", int(rng.integers(1, 40)), int(rng.integers(1, 30)),
                            int(rng.integers(0, 3))))
            elif kind == "step":
                ops.append(("step", int(rng.integers(1, 4))))
            else:
                ops.append(("abort", int(rng.integers(0, 100))))
        sched, runner = run_random_ops(
            ops, num_blocks=int(rng.integers(6, 30)), block_size=int(rng.choice([1, 2, 4])),
            budget=int(rng.integers(4, 64)), max_seqs=int(rng.integers(2, 8)), caching=True,
            policy=str(rng.choice(["fcfs", "priority"])))
        num_preempted += sched.num_preemptions_total
        num_hits += sched.kv_cache_manager.prefix_cache_hits
        num_partial += runner.num_partial_prefills
    assert num_preempted > 0 and num_hits > 0 and num_partial > 0


def test_preempts_most_recent_first_and_requeues_at_front():
    # 6 blocks of 2 tokens; each request's prompt needs 2 blocks and grows by one per step
    sched, runner = new_scheduler(num_blocks=6, block_size=2, budget=64, max_seqs=8)
    reqs = [Request(f"r{i}", [i + 1] * 4, SamplingParams(max_tokens=20, temperature=0.0), seed=0,
                    max_tokens=20) for i in range(3)]
    for r in reqs:
        sched.add_request(r)
    run_step(sched, runner)
    assert [r.request_id for r in sched.running] == ["r0", "r1", "r2"]
    run_step(sched, runner)                    # 3 decode tokens need 3 more blocks: none free
    assert [r.request_id for r in sched.running] == ["r0", "r1"]
    assert sched.waiting[0] is reqs[2] and reqs[2].num_preemptions == 1
    assert reqs[2].num_computed_tokens == 0 and sched.num_preemptions_total == 1
    check_invariants(sched)


def test_request_that_can_never_fit_is_aborted_not_hung():
    # a scheduler whose max_model_len exceeds the cache (the engine caps it; this one not)
    kv = KVCacheManager(num_blocks=2, block_size=2)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=100)
    runner = FakeRunner(2, 2, max_model_len=100)
    big = Request("big", list(range(1, 8)), SamplingParams(max_tokens=5), seed=0, max_tokens=5)
    sched.add_request(big)
    out = sched.schedule()
    assert not out.chunks and big.finish_reason == "abort"
    assert out.aborted == [big] and not sched.has_unfinished_requests()
    assert not sched.schedule().aborted
    grows = Request("grows", [1, 2, 3], SamplingParams(max_tokens=50), seed=0, max_tokens=50)
    sched.add_request(grows)
    for _ in range(10):
        if not sched.has_unfinished_requests():
            break
        run_step(sched, runner)
    assert grows.finish_reason == "abort" and grows.num_output_tokens == 2   # 4 slots filled
    assert kv.num_free_blocks == 2
    check_invariants(sched)


def test_chunked_prefill_respects_budget_and_samples_only_at_the_end():
    sched, runner = new_scheduler(num_blocks=64, block_size=4, budget=8, max_seqs=4)
    req = Request("long", list(range(1, 21)), SamplingParams(max_tokens=2, temperature=0.0),
                  seed=0, max_tokens=2)
    sched.add_request(req)
    starts = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        starts.append([(c.start, c.num_new_tokens, c.sample) for c in out.chunks])
        sched.update_from_output(out, runner.execute(out).sampled)
    assert starts == [[(0, 8, False)], [(8, 8, False)], [(16, 4, True)], [(20, 1, True)]]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_admission_order(policy):
    sched, runner = new_scheduler(num_blocks=64, block_size=4, budget=100, max_seqs=1,
                                  policy=policy)
    for i, prio in enumerate([2, 0, 1]):
        sched.add_request(Request(f"r{i}", [9, i], SamplingParams(max_tokens=1), seed=0,
                                  priority=prio, arrival_time=float(i), max_tokens=1))
    order = []
    while sched.has_unfinished_requests():
        order += [r.request_id for r in run_step(sched, runner)]
    assert order == (["r0", "r1", "r2"] if policy == "fcfs" else ["r1", "r2", "r0"])


def test_pooling_requests_are_never_split_across_steps():
    """A pooling request (engine.py, PoolingParams) takes its whole prompt in one step or waits for
    a step with room (FCFS: later ones wait behind it); a generation prompt in the same spot
    would be chunked. Finishing a step's requests frees every block."""
    sched = Scheduler(KVCacheManager(num_blocks=32, block_size=4, enable_prefix_caching=False), max_num_seqs=8,
                      max_num_batched_tokens=10, max_model_len=10)

    def pool(rid: str, n: int) -> Request:
        r = Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=1), 0, max_tokens=0)
        r.pooling = True
        sched.add_request(r)
        return r

    steps = []
    for rid, n in (("a", 6), ("b", 6), ("c", 3), ("d", 10)):
        pool(rid, n)
    while sched.has_unfinished_requests():
        out = sched.schedule()
        assert out.chunks, "a waiting pooling request never fit"
        assert all(c.start == 0 and c.num_new_tokens == c.request.num_tokens for c in out.chunks)
        assert out.num_tokens <= 10
        steps.append([c.request.request_id for c in out.chunks])
        check_invariants(sched)
        sched.finish_requests([c.request.request_id for c in out.chunks], RequestStatus.FINISHED_STOPPED)
        assert sched.kv_cache_manager.num_free_blocks == 32
    assert steps == [["a"], ["b", "c"], ["d"]]
    # the same spot for a generation prompt: chunked to the budget's 4 remaining tokens
    pool("e", 6)
    sched.add_request(Request("f", list(range(1, 7)), SamplingParams(max_tokens=1), 0))
    out = sched.schedule()
    assert [(c.request.request_id, c.num_new_tokens) for c in out.chunks] == [("e", 6), ("f", 4)]
