"""Pooling requests on the generation engine (engine.py, engine/pooling.py): a pooling model's
inputs are Requests of the same Scheduler, run behind the step contract (RunnerOutput.pooled) on
the one AsyncEngine thread, so concurrent callers' inputs share steps (one caller's inputs
arrive together); an engine serves one kind
of request; the engine's figures count pooling requests."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from lite_llm.engine.args import EngineArgs
from lite_llm.engine.assemble import build_engine
from lite_llm.engine.engine import EngineConfig, LLMEngine
from lite_llm.engine.pooling import PoolingClient, PoolItem
from lite_llm.model.pooler import PoolingInputError
from lite_llm.sampling_params import PoolingParams, SamplingParams

PROMPTS = [[5, 17, 99, 3, 250], [8], list(range(40, 59)), list(range(60, 97)), [300, 7, 7]]


def _built(path: str, pooling_type: str):
    return build_engine(EngineArgs(path, dtype="float32", runner="pooling", progress=False,
                                   pooler_config={"pooling_type": pooling_type, "normalize": False}))


@pytest.fixture(scope="module")
def bert(tiny_checkpoint):
    built = _built(str(tiny_checkpoint("bert")), "MEAN")
    yield built
    built.engine.shutdown(0.0)


def test_concurrent_callers_share_a_step_and_get_their_own_rows(bert):
    """While a step runs, two pool() calls arrive: their inputs join the next step together,
    each call with its own rows, equal to those of its inputs pooled alone."""
    client = PoolingClient(bert.engine, bert.tokenizer, bert.pooling)
    runner = bert.engine.engine.runner
    alone = [client.pool([PoolItem(np.array(p, np.int32))])[0] for p in PROMPTS]
    steps, added = [], []
    execute, add_request = runner.execute, bert.engine.add_request

    def spy(sched_out, *a):
        steps.append(sorted(len(c.request.prompt_token_ids) for c in sched_out.chunks))
        return execute(sched_out, *a)

    def counted(*a, **kw):
        stream = add_request(*a, **kw)
        added.append(a[0])
        return stream

    runner.execute, bert.engine.add_request = spy, counted
    lock = threading.Lock()
    bert.engine.step_lock = lock          # held here: the engine thread waits before its step
    parts = (PROMPTS[:2], PROMPTS[2:4], PROMPTS[4:])
    got: dict[int, list] = {}

    def call(k: int) -> threading.Thread:
        t = threading.Thread(target=lambda: got.__setitem__(k, client.pool([PoolItem(np.array(p, np.int32))
                                                                           for p in parts[k]])))
        t.start()
        return t

    def wait_for(what) -> None:
        for _ in range(2000):
            if what():
                return
            threading.Event().wait(0.005)
        raise AssertionError("the engine never got there")

    try:
        with lock:
            callers = [call(0)]
            wait_for(lambda: bert.engine.stats().num_waiting == 2)     # taken in: its step waits
            callers += [call(1), call(2)]
            wait_for(lambda: len(added) == len(PROMPTS))
        for t in callers:
            t.join(30)
    finally:
        del bert.engine.add_request
        runner.execute = execute
    assert steps == [sorted(len(p) for p in parts[0]), sorted(len(p) for p in parts[1] + parts[2])]
    for g, w in zip(got[0] + got[1] + got[2], alone):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
    stats = bert.engine.stats()
    assert stats.request_success_total.get("stop", 0) >= 2 * len(PROMPTS)
    assert stats.prompt_tokens_total >= 2 * sum(len(p) for p in PROMPTS)
    assert not bert.engine.engine.has_unfinished_requests()


def test_an_engine_serves_one_kind_of_request(bert):
    client = PoolingClient(bert.engine, bert.tokenizer, bert.pooling)
    with pytest.raises(ValueError, match="'pooling' runner: it embeds, classifies and scores; it cannot generate"):
        bert.engine.add_request("gen", [5, 6, 7], SamplingParams(max_tokens=2))
    with pytest.raises(PoolingInputError, match="token_type_ids has 2 entries for 3 prompt tokens"):
        client.pool([PoolItem(np.array([5, 6, 7], np.int32), np.array([0, 1], np.int32))])
    generating = LLMEngine(None, None, EngineConfig(num_blocks=16, block_size=4, vocab_size=50))
    with pytest.raises(ValueError, match="'generate' runner: it cannot embed"):
        generating.add_request("pool", [1, 2, 3], PoolingParams())
    assert client.pool([PoolItem(np.array([5, 6, 7], np.int32))])[0].shape == (64,)   # still serving
