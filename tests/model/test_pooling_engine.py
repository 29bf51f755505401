"""Pooling requests on the generation engine (engine.py / engine/pooling.py): a pooling model's
requests are Requests of the same Scheduler, run by a runner behind the step contract
(RunnerOutput.pooled), on the one AsyncEngine thread; its rows against an independent run."""
from __future__ import annotations

import numpy as np
import pytest

from lite_llm.engine.args import EngineArgs
from lite_llm.engine.assemble import build_engine
from lite_llm.engine.pooling import PoolingClient, PoolItem

PROMPTS = [[5, 17, 99, 3, 250], [8], list(range(40, 59)), list(range(60, 97)), [300, 7, 7]]


def _client(path: str, **kw) -> PoolingClient:
    built = build_engine(EngineArgs(path, dtype="float32", runner="pooling", progress=False,
                                    pooler_config={"pooling_type": kw.pop("pooling_type"), "normalize": False}, **kw))
    return PoolingClient(built.engine, built.tokenizer, built.pooling)


@pytest.mark.parametrize("arch,pooling_type", [("bert", "MEAN"), ("bert", "CLS"), ("qwen3_base", "LAST")])
def test_engine_rows_equal_the_old_pooling_engine(tiny_checkpoint, arch, pooling_type):
    from lite_llm.pooling import build_pooling_engine
    path = str(tiny_checkpoint(arch, **({"head_dim": 16} if arch == "qwen3_base" else {})))
    items = [PoolItem(np.array(p, np.int32)) for p in PROMPTS]
    old, _, _ = build_pooling_engine(path, dtype="float32", progress=False,
                                     pooler_config={"pooling_type": pooling_type, "normalize": False})
    try:
        want = old.pool(items)
    finally:
        old.shutdown()
    client = _client(path, pooling_type=pooling_type)
    try:
        got = client.pool(items)
        assert not client.engine.engine.has_unfinished_requests()
    finally:
        client.shutdown()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
