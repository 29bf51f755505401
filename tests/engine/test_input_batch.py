"""The persistent batch's sampler path: the compiled sampler fed from InputBatch's per-slot rows
(views or gathered rows, penalty contexts read from the token rows, min_tokens bans) samples
exactly what Sampler.sample gives from scratch, step after step, with slots freed and reused.
The step arrays themselves are checked against a from-scratch rebuild in test_scheduler.py."""
from __future__ import annotations

import numpy as np

from lite_llm.engine.input_batch import InputBatch
from lite_llm.engine.request import Request
from lite_llm.engine.sampler import Sampler
from lite_llm.sampling_params import SamplingParams

EOS = 2
VOCAB = 97

PARAMS = [SamplingParams(temperature=0.0),
          SamplingParams(temperature=0.9, top_k=7, repetition_penalty=1.3, seed=1),
          SamplingParams(temperature=0.7, top_p=0.8, frequency_penalty=0.6, presence_penalty=0.4, logprobs=3),
          SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=[5, 6], min_p=0.05),
          SamplingParams(temperature=0.0, repetition_penalty=0.8, min_tokens=2, ignore_eos=True, logprobs=0)]


def test_sampling_from_the_batch_rows_matches_sampling_from_scratch():
    rng = np.random.default_rng(0)
    batch = InputBatch(max_num_seqs=6, max_model_len=64, block_size=16, eos_token_ids=(EOS,))
    sampler = Sampler(VOCAB, (EOS,), num_threads=2)
    live: dict[int, Request] = {}
    counter = 0
    kinds = {"prefix": 0, "gathered": 0, "banned": 0}
    for step in range(60):
        # requests leave and arrive, so slots get reused and the sampled slots are not 0..R-1
        if live and rng.random() < 0.25:
            slot = int(rng.choice(list(live)))
            batch.remove(live.pop(slot).request_id)
        while len(live) < 6 and rng.random() < 0.5:
            counter += 1
            prompt = rng.integers(3, VOCAB, int(rng.integers(1, 12))).tolist()
            req = Request(f"r{counter}", prompt, PARAMS[counter % len(PARAMS)], seed=counter * 31,
                          eos_token_ids=(EOS,))
            for t in rng.integers(0, VOCAB, int(rng.integers(0, 3))).tolist():   # a resumed request
                req.append_output_token(t)
            live[batch.add(req, [counter % 40])] = req
        if not live:
            continue
        slots = [s for s in live if rng.random() < 0.8] or list(live)
        rng.shuffle(slots)
        is_prefix = sorted(slots) == list(range(len(slots))) and slots == sorted(slots)
        requests = [live[s] for s in slots]
        logits = rng.standard_normal((len(slots), VOCAB)).astype(np.float32) * 3
        want = sampler.sample(logits.copy(), requests)
        arrays = batch.sampling_arrays(np.array(slots, np.int32), is_prefix)
        got = sampler.run(logits.copy(), *arrays)
        kinds["prefix" if is_prefix else "gathered"] += 1
        kinds["banned"] += len(arrays[3]) > 0
        assert got == want, f"step {step}"
        batch.append_sampled(np.array(slots, np.int32), np.array([r.token_id for r in got], np.int32))
        for req, res in zip(requests, got):
            req.append_output_token(res.token_id)
            if req.num_tokens >= 60:
                slot = batch.slot_of[req.request_id]
                batch.remove(req.request_id)
                del live[slot]
    assert min(kinds.values()) > 0, kinds      # views, gathered rows and bans all exercised
    for slot, req in live.items():       # the rows hold exactly the requests' tokens
        n = batch.num_tokens[slot]
        assert batch.token_ids[slot, :n].tolist() == req.all_token_ids


def test_step_gather_rejects_chunks_outside_the_batch_and_appends_match_the_rows():
    """StepBuffers (the engine's gather/append path): a chunk reaching past its row or block
    table is refused with an error naming it; append_step adds each sampling row's token to its
    slot's row as append_sampled does."""
    import pytest
    from lite_llm.engine.scheduler import ScheduledChunk, SchedulerOutput
    batch = InputBatch(max_num_seqs=4, max_model_len=32, block_size=8, eos_token_ids=(EOS,), max_num_batched_tokens=64)
    req = Request("a", list(range(10, 20)), SamplingParams(temperature=0.0), seed=0)
    a = batch.prepare(SchedulerOutput([ScheduledChunk(req, 0, 10, [3, 5], True, True)], 10))
    np.testing.assert_array_equal(a.token_ids, list(range(10, 20)))
    np.testing.assert_array_equal(a.slot_mapping, [3 * 8 + p for p in range(8)] + [5 * 8, 5 * 8 + 1])
    batch.append_step(np.array([77], np.int32))
    assert batch.num_tokens[0] == 11 and batch.token_ids[0, 10] == 77
    with pytest.raises(ValueError, match="1 rows"):
        batch.append_step(np.array([1, 2], np.int32))
    with pytest.raises(ValueError, match="chunk 0"):        # positions 30..33: past the row of 33
        batch.prepare(SchedulerOutput([ScheduledChunk(req, 30, 4, [], True)], 4))
