"""Fair admission: one request (or one HTTP request's many prompts and samples, an "owner")
cannot keep another's request waiting for its whole job.

An LLMEngine over the KV-checking FakeRunner: a big request takes every slot (max_num_seqs)
or the KV cache, then a small one arrives; the small one's first token must come within a
step or two (the steps are counted, not timed), the big one must still be running then, and
every output must be what the request gives alone (the fake's tokens are a pure function of
a sequence's tokens, so preemption by recompute changes nothing a client sees).
"""
from __future__ import annotations

import numpy as np
import pytest
from fake_runner import FakeRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler import check_invariants, new_scheduler, run_step

from lite_llm.engine.engine import EngineConfig, LLMEngine
from lite_llm.engine.request import Request
from lite_llm.outputs import fold
from lite_llm.sampling_params import SamplingParams

VOCAB = 50
MAX_STEPS = 60          # far more than fair admission needs; far less than the big jobs take


def make_engine(**overrides) -> LLMEngine:
    cfg = dict(max_num_seqs=8, max_num_batched_tokens=256, block_size=4, num_blocks=1024,
               max_model_len=512, seed=7)
    cfg.update(overrides)
    config = EngineConfig(**cfg)
    runner = FakeRunner(config.num_blocks, config.block_size, VOCAB, config.max_num_batched_tokens,
                        config.max_num_seqs)
    return LLMEngine(runner, None, config)


def prompt(seed: int, length: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, VOCAB, length)]


def big_params(n: int, max_tokens: int = 400) -> SamplingParams:
    return SamplingParams(n=n, max_tokens=max_tokens, temperature=0.8, seed=11, ignore_eos=True)


SMALL = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


class Recorder:
    """Steps an engine, folding each request's deltas and noting the step of its first token."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.num_steps = 0
        self.deltas: dict[str, list] = {}
        self.first_token_step: dict[str, int] = {}
        self.finished_step: dict[str, int] = {}

    def step(self) -> None:
        self.num_steps += 1
        for out in self.engine.step():
            self.deltas.setdefault(out.request_id, []).append(out)
            if any(c.token_ids for c in out.outputs):
                self.first_token_step.setdefault(out.request_id, self.num_steps)
            if out.finished:
                self.finished_step[out.request_id] = self.num_steps

    def steps_until_first_token(self, rid: str, max_steps: int = MAX_STEPS) -> int | None:
        """Steps from now to rid's first token (None if not within max_steps)."""
        start = self.num_steps
        while rid not in self.first_token_step and self.num_steps - start < max_steps:
            self.step()
        return self.first_token_step[rid] - start if rid in self.first_token_step else None

    def run_to_end(self) -> dict:
        while self.engine.has_unfinished_requests():
            self.step()
        kv = self.engine.kv_cache_manager
        kv.block_pool.check()
        assert kv.num_free_blocks == kv.num_blocks and not kv.block_tables    # nothing leaked
        return {rid: fold(outs) for rid, outs in self.deltas.items()}


def alone(rid: str, ids: list[int], params: SamplingParams, max_model_len: int = 512) -> list:
    """A request's completions' tokens when it runs by itself on a roomy engine."""
    rec = Recorder(make_engine(max_num_seqs=64, num_blocks=4096, max_model_len=max_model_len))
    rec.engine.add_request(rid, ids, params)
    out = rec.run_to_end()[rid]
    return sorted((c.index, c.token_ids, c.finish_reason) for c in out.outputs)


def tokens_of(out) -> list:
    return sorted((c.index, c.token_ids, c.finish_reason) for c in out.outputs)


def running_by_owner(engine: LLMEngine) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in engine.scheduler.running:
        counts[r.owner] = counts.get(r.owner, 0) + 1
    return counts


def test_small_request_starts_while_one_request_holds_every_slot():
    """A request with n = max_num_seqs holds all 8 slots for 400 steps; a 4-token request that
    arrives then gets its first token within 2 steps, not after the big one's 400."""
    engine = make_engine()
    rec = Recorder(engine)
    big_ids = prompt(1, 20)
    engine.add_request("big", big_ids, big_params(8))
    for _ in range(3):
        rec.step()
    assert engine.scheduler.num_running == 8 and not engine.scheduler.waiting
    engine.add_request("small", prompt(2, 6), SMALL)
    steps = rec.steps_until_first_token("small")
    assert steps is not None and steps <= 2, f"small's first token after {steps} steps"
    while "small" not in rec.finished_step:
        rec.step()
    assert "big" not in rec.finished_step
    outs = rec.run_to_end()
    assert tokens_of(outs["big"]) == alone("big", big_ids, big_params(8))
    assert tokens_of(outs["small"]) == alone("small", prompt(2, 6), SMALL)
    assert outs["big"].metrics.num_preemptions >= 1     # the slot came from the big one


def test_an_owners_many_requests_share_its_slots():
    """One HTTP request's 16 prompts (16 engine requests of one owner) fill all 8 slots; another
    owner's request with n=4 gets its first token within 2 steps and half the slots, the fair
    share, within 5 (one preemption a step). Were each prompt its own owner (one sequence
    each), n=4 would be the richest and wait."""
    engine = make_engine()
    rec = Recorder(engine)
    for i in range(16):
        engine.add_request(f"a-{i}", prompt(10 + i, 12), big_params(1, 200), owner="http-a")
    for _ in range(2):
        rec.step()
    assert running_by_owner(engine) == {"http-a": 8}
    engine.add_request("b", prompt(3, 9), big_params(4, 50), owner="http-b")
    steps = rec.steps_until_first_token("b")
    assert steps is not None and steps <= 2, f"b's first token after {steps} steps"
    for _ in range(3):
        rec.step()
    assert running_by_owner(engine) == {"http-a": 4, "http-b": 4}
    preempted = engine.scheduler.num_preemptions_total
    for _ in range(20):            # balanced: nobody is preempted for fairness any more
        rec.step()
    assert engine.scheduler.num_preemptions_total == preempted
    assert running_by_owner(engine) == {"http-a": 4, "http-b": 4}
    outs = rec.run_to_end()
    assert tokens_of(outs["b"]) == alone("b", prompt(3, 9), big_params(4, 50))
    assert tokens_of(outs["a-5"]) == alone("a-5", prompt(15, 12), big_params(1, 200))


def test_small_request_starts_when_the_kv_cache_is_what_is_full():
    """Slots are free but one request's sequences hold the whole KV cache: the small request
    takes blocks preempted from it within 3 steps."""
    engine = make_engine(num_blocks=48, max_model_len=192)
    rec = Recorder(engine)
    big_ids = prompt(4, 36)
    engine.add_request("big", big_ids, big_params(4, 300))
    while engine.kv_cache_manager.num_free_blocks > 2:
        rec.step()
    assert engine.scheduler.num_running >= 3
    engine.add_request("small", prompt(5, 20), SMALL)
    steps = rec.steps_until_first_token("small")
    assert steps is not None and steps <= 3, f"small's first token after {steps} steps"
    assert "big" not in rec.finished_step
    outs = rec.run_to_end()
    assert tokens_of(outs["small"]) == alone("small", prompt(5, 20), SMALL)
    assert tokens_of(outs["big"]) == alone("big", big_ids, big_params(4, 300), max_model_len=192)


@pytest.mark.parametrize("big_priority,small_priority,starts", [(0, 0, True), (1, 0, True), (0, 1, False)])
def test_priority_policy_comes_before_fairness(big_priority, small_priority, starts):
    """Under the priority policy fairness never preempts a more important sequence: a small
    request of lower priority (a higher value) waits for the big one's slots."""
    engine = make_engine(scheduling_policy="priority")
    rec = Recorder(engine)
    engine.add_request("big", prompt(6, 10), big_params(8, 100), priority=big_priority)
    for _ in range(3):
        rec.step()
    engine.add_request("small", prompt(7, 5), SMALL, priority=small_priority)
    steps = rec.steps_until_first_token("small", max_steps=20)
    if starts:
        assert steps is not None and steps <= 2, f"small's first token after {steps} steps"
    else:
        assert steps is None and engine.scheduler.num_preemptions_total == 0
    outs = rec.run_to_end()
    assert tokens_of(outs["small"]) == alone("small", prompt(7, 5), SMALL)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.integers(1, 30), st.integers(1, 20)),
    st.tuples(st.just("step"), st.integers(1, 4)),
    st.tuples(st.just("abort"), st.integers(0, 60))), min_size=6, max_size=40),
    num_blocks=st.integers(6, 40), max_seqs=st.integers(1, 6), budget=st.integers(1, 48),
    policy=st.sampled_from(["fcfs", "priority"]))
def test_random_owners_keep_invariants(ops, num_blocks, max_seqs, budget, policy):
    """Requests of three owners arrive, run and are aborted at random: the scheduler's own
    invariants hold after every step, its per-owner counts match its queues, and nothing is
    lost (every request finishes)."""
    sched, runner = new_scheduler(num_blocks, 4, budget, max_seqs, policy=policy)
    added = []
    for op in ops:
        if op[0] == "add":
            _, owner, length, max_tokens = op
            rid = f"r{len(added)}"
            ids = prompt(len(added), min(length, sched.max_model_len))
            sched.add_request(Request(rid, ids, SamplingParams(max_tokens=max_tokens),
                                      seed=0, priority=len(added) % 2, max_tokens=max_tokens,
                                      owner=f"owner-{owner}"))
            added.append(rid)
        elif op[0] == "step":
            for _ in range(op[1]):
                run_step(sched, runner)
                check_invariants(sched)
                check_owner_counts(sched)
        elif added:
            sched.finish_requests(added[op[1] % len(added)], _aborted())
            check_owner_counts(sched)
    for _ in range(20_000):
        if not sched.has_unfinished_requests():
            break
        run_step(sched, runner)
        check_invariants(sched)
        check_owner_counts(sched)
    assert not sched.has_unfinished_requests()
    assert not sched.owners


def check_owner_counts(sched) -> None:
    running: dict[str, int] = {}
    for r in sched.running:
        running[r.owner] = running.get(r.owner, 0) + 1
    waiting: dict[str, list] = {}
    for r in sched.waiting:
        waiting.setdefault(r.owner, []).append(r)
    assert set(sched.owners) == set(running) | set(waiting)
    for name, owner in sched.owners.items():
        assert owner.num_running == running.get(name, 0)
        assert list(owner.waiting) == waiting.get(name, [])   # each owner's in the queue's order


def _aborted():
    from lite_llm.engine.request import RequestStatus
    return RequestStatus.FINISHED_ABORTED


def test_small_request_is_not_starved_of_tokens_by_a_long_prefill():
    """A slot is free, but another owner's sequence is prefilling a long prompt, which takes
    what the token budget leaves after the decodes for several steps: a waiting owner poorer
    by two keeps a part of the budget for its own prefill."""
    engine = make_engine(max_num_batched_tokens=64)
    rec = Recorder(engine)
    for i in range(6):
        engine.add_request(f"big-{i}", prompt(20 + i, 10), big_params(1, 200), owner="big")
    engine.add_request("big-long", prompt(30, 480), big_params(1, 20), owner="big")
    while engine.scheduler.num_running < 7:
        rec.step()
    prefill_left = sum(r.num_tokens - r.num_computed_tokens for r in engine.scheduler.running)
    assert prefill_left > 5 * 64
    engine.add_request("small", prompt(8, 10), SMALL)
    steps = rec.steps_until_first_token("small")
    assert steps is not None and steps <= 2, f"small's first token after {steps} steps"
    assert not rec.finished_step
    outs = rec.run_to_end()
    assert engine.scheduler.num_preemptions_total == 0     # the free slot was enough
    assert tokens_of(outs["small"]) == alone("small", prompt(8, 10), SMALL)
    assert tokens_of(outs["big-long"]) == alone("big-long", prompt(30, 480), big_params(1, 20))


def running_by_client(engine: LLMEngine) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in engine.scheduler.running:
        client = r.owner.partition("|")[0]
        counts[client] = counts.get(client, 0) + 1
    return counts


def test_a_client_with_many_requests_gets_one_clients_share():
    """One client opens 20 requests of one sequence each ("A|r0".."A|r19"): 8 run, 12 wait. A
    request of another client gets its first token within 2 steps and, as more of its requests
    come, the clients settle at half the slots each. Were each request its own client, the
    newcomer would be the 13th waiting request of equals and wait for A's."""
    engine = make_engine()
    rec = Recorder(engine)
    a_ids = {f"a-{i}": prompt(40 + i, 10) for i in range(20)}
    for rid, ids in a_ids.items():
        engine.add_request(rid, ids, big_params(1, 150), owner=f"10.0.0.1|{rid}")
    for _ in range(2):
        rec.step()
    assert running_by_client(engine) == {"10.0.0.1": 8} and len(engine.scheduler.waiting) == 12
    engine.add_request("b-0", prompt(5, 7), SMALL, owner="10.0.0.2|b-0")
    steps = rec.steps_until_first_token("b-0")
    assert steps is not None and steps <= 2, f"b-0's first token after {steps} steps"
    for i in range(1, 6):
        engine.add_request(f"b-{i}", prompt(5 + i, 7), big_params(1, 100), owner=f"10.0.0.2|b-{i}")
    for _ in range(8):
        rec.step()
    assert running_by_client(engine) == {"10.0.0.1": 4, "10.0.0.2": 4}
    outs = rec.run_to_end()
    for rid, ids in a_ids.items():
        assert tokens_of(outs[rid]) == alone(rid, ids, big_params(1, 150))
    assert tokens_of(outs["b-0"]) == alone("b-0", prompt(5, 7), SMALL)


def test_within_a_client_one_request_does_not_hold_back_its_others():
    """One client's big request (n=8) holds all 8 slots; the same client's small request still
    gets its first token within 2 steps (the second level: owners of one client)."""
    engine = make_engine()
    rec = Recorder(engine)
    big_ids = prompt(1, 20)
    engine.add_request("big", big_ids, big_params(8), owner="10.0.0.1|big")
    for _ in range(3):
        rec.step()
    assert engine.scheduler.num_running == 8
    engine.add_request("small", prompt(2, 6), SMALL, owner="10.0.0.1|small")
    steps = rec.steps_until_first_token("small")
    assert steps is not None and steps <= 2, f"small's first token after {steps} steps"
    outs = rec.run_to_end()
    assert tokens_of(outs["big"]) == alone("big", big_ids, big_params(8))
    assert tokens_of(outs["small"]) == alone("small", prompt(2, 6), SMALL)
