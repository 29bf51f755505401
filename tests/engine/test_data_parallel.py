"""Data parallel's front-end pieces without processes: the prefix/load router, the per-replica
thread plans, merged stats and the per-replica /metrics series (the replicas themselves are
tested over real HTTP in tests/server/test_data_parallel.py)."""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lite_llm import cpu
from lite_llm.engine.async_engine import EngineDeadError
from lite_llm.engine.data_parallel import PrefixRouter, replica_plans
from lite_llm.engine.kv_cache import KVCacheManager
from lite_llm.engine.request import Request
from lite_llm.engine.stats import EngineStats, HistogramAccumulator, TTFT_BUCKETS, merge_stats
from lite_llm.sampling_params import SamplingParams
from lite_llm.server.metrics import ServerMetrics


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def prompt(tag: int, num_tokens: int) -> list[int]:
    return [tag * 1000 + i for i in range(num_tokens)]


def test_router_hashes_are_the_prefix_caches_own_block_hashes():
    tokens = prompt(1, 4 * 5 + 3)
    mgr = KVCacheManager(num_blocks=16, block_size=4)
    req = Request("r", tokens, SamplingParams(max_tokens=1), seed=0)
    mgr.get_computed_blocks(req)                 # hashes the request's full blocks
    assert PrefixRouter(2, block_size=4).block_hashes(tokens) == req.block_hashes
    assert len(req.block_hashes) == 5
    assert PrefixRouter(2, block_size=4, max_blocks=2).block_hashes(tokens) == req.block_hashes[:2]


def test_a_repeated_prefix_goes_back_to_its_replica_not_round_robin():
    router = PrefixRouter(2, block_size=4)
    a, b = prompt(1, 16), prompt(2, 16)
    served = []
    for tokens in (a, b, b[:12] + [7, 7, 7, 7], a[:12] + [9, 9]):    # idle replicas every time
        hashes = router.block_hashes(tokens)
        replica = router.choose(hashes, [0, 0])
        router.record(hashes, replica)
        served.append(replica)
    assert served[0] != served[1]                       # idle: taken in turn
    assert served[2] == served[1] and served[3] == served[0]   # turn order would give the reverse


def test_load_wins_over_a_prefix_hit_past_the_imbalance_limit():
    router = PrefixRouter(2, block_size=4, max_imbalance=2)
    hashes = router.block_hashes(prompt(1, 8))
    router.record(hashes, 0)
    assert router.choose(hashes, [2, 0]) == 0           # 2 more in flight: still worth the cache
    assert router.choose(hashes, [3, 0]) == 1           # 3 more: the idle replica
    assert router.choose(router.block_hashes(prompt(5, 8)), [3, 1]) == 1   # no hit: least loaded


def test_remembered_prefixes_age_out_and_are_bounded():
    clock = Clock()
    router = PrefixRouter(2, block_size=4, ttl=10.0, capacity=3, clock=clock)
    hashes = router.block_hashes(prompt(1, 20))        # 5 blocks
    router.record(hashes, 1)
    assert router.cached_on(hashes) == (1, 3)           # 3 kept: the leading ones, a chain's start
    short = router.block_hashes(prompt(2, 8))
    router.record(short, 1)
    assert router.cached_on(hashes) == (1, 1)           # two newer blocks pushed out blocks 1 and 2
    assert router.cached_on(short) == (1, 2)
    clock.now = 11.0
    assert router.cached_on(short) == (None, 0)
    assert router.choose(short, [0, 1]) == 0


def test_dead_replicas_are_never_chosen():
    router = PrefixRouter(3, block_size=4)
    hashes = router.block_hashes(prompt(1, 8))
    router.record(hashes, 0)
    assert router.choose(hashes, [None, 5, 2]) == 2
    router.forget(0)
    assert router.cached_on(hashes) == (None, 0)
    with pytest.raises(EngineDeadError, match="no data-parallel replica"):
        router.choose(hashes, [None, None, None])


def two_node_topology() -> cpu.Topology:
    cores = tuple(cpu.Core((c,), 0, c, c // 2) for c in range(4))
    nodes = (cpu.NumaNode(0, (0, 1), 0, 0), cpu.NumaNode(1, (2, 3), 0, 0))
    return cpu.Topology(online=(0, 1, 2, 3), cores=cores, nodes=nodes, affinity=(0, 1, 2, 3),
                        cgroup_cpus=None, cgroup_quota=None)


def test_replicas_get_a_numa_node_each_under_auto_and_their_own_lists_when_given():
    topo = two_node_topology()
    plan = replica_plans(2, topo, bind="auto")
    assert [r.cpus for r in plan.ranks] == [(0, 1), (2, 3)]
    assert [r.node for r in plan.ranks] == [0, 1]
    plan = replica_plans(2, topo, bind="3|1")
    assert [r.cpus for r in plan.ranks] == [(3,), (1,)]
    assert [r.cpus for r in replica_plans(4, topo, bind="auto").ranks] == [(0,), (1,), (2,), (3,)]


def test_a_bind_list_count_other_than_the_replica_count_is_refused_with_the_fix():
    topo = two_node_topology()
    with pytest.raises(ValueError) as e:
        replica_plans(2, topo, bind="0-3")
    msg = str(e.value)
    assert "lists 1 CPU list(s)" in msg and "--data-parallel-size is 2" in msg
    assert "'0-1|2-3'" in msg and "--data-parallel-size 1" in msg
    with pytest.raises(ValueError, match="lists 3 CPU list"):
        replica_plans(2, topo, bind="0|1|2")
    with pytest.raises(ValueError, match="--data-parallel-size 5: .*5 ranks need at least 5 physical cores"):
        replica_plans(5, topo, bind="auto")


def test_replicas_of_tensor_parallel_groups_get_their_ranks_lists():
    from lite_llm.engine.data_parallel import replica_bind
    topo = two_node_topology()
    plan = replica_plans(2, topo, bind="auto", tensor_parallel_size=2)
    assert [r.cpus for r in plan.ranks] == [(0,), (1,), (2,), (3,)]
    assert [replica_bind(plan, i, 2) for i in range(2)] == [("0|1", [0, 1]), ("2|3", [2, 3])]
    plan = replica_plans(2, topo, bind="3|2|1|0", tensor_parallel_size=2)
    assert replica_bind(plan, 1, 2) == ("1|0", [0, 1])
    with pytest.raises(ValueError, match=r"lists 2 CPU list\(s\) but --data-parallel-size 2 x "
                                         r"--tensor-parallel-size 2 is 4 ranks.*'0\|1\|2\|3'"):
        replica_plans(2, topo, bind="0-1|2-3", tensor_parallel_size=2)
    assert replica_bind(replica_plans(2, topo, bind="nobind", tensor_parallel_size=2), 1, 2) == ("nobind", None)


def stats_with(**kw) -> EngineStats:
    ttft = HistogramAccumulator(TTFT_BUCKETS)
    for v in kw.pop("ttfts", ()):
        ttft.observe(v)
    return EngineStats(ttft=ttft.snapshot(), **kw)


def test_merged_stats_add_up_the_replicas():
    a = stats_with(num_running=2, prefix_cache_hits=128, generation_tokens_total=10,
                   request_success_total={"stop": 1}, kv_cache_usage=0.5, ttfts=[0.003, 0.3])
    b = stats_with(num_running=1, prefix_cache_hits=0, generation_tokens_total=5,
                   request_success_total={"stop": 2, "length": 1}, kv_cache_usage=0.1, ttfts=[0.05])
    m = merge_stats([a, b])
    assert (m.num_running, m.prefix_cache_hits, m.generation_tokens_total) == (3, 128, 15)
    assert m.request_success_total == {"stop": 3, "length": 1}
    assert m.kv_cache_usage == pytest.approx(0.3)
    assert m.ttft.count == 3 and m.ttft.sum == pytest.approx(0.353)
    assert m.ttft.counts == tuple(x + y for x, y in zip(a.ttft.counts, b.ttft.counts))


def test_metrics_show_one_series_per_live_replica_under_the_engine_label():
    a = stats_with(num_running=2, prefix_cache_hits=256, ttfts=[0.01])
    b = stats_with(num_running=1, prefix_cache_hits=0)
    text = ServerMetrics("m", {"num_threads": 2}).render(None, [a, None, b])
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, s.labels.get("engine"), s.labels.get("le"), s.labels.get("finished_reason"))] = s.value
    assert samples[("lite_llm:num_requests_running", "0", None, None)] == 2
    assert samples[("lite_llm:num_requests_running", "2", None, None)] == 1
    assert ("lite_llm:num_requests_running", "1", None, None) not in samples    # dead: no series
    assert samples[("lite_llm:prefix_cache_hits_total", "0", None, None)] == 256
    assert samples[("lite_llm:time_to_first_token_seconds_count", "0", None, None)] == 1
    assert samples[("lite_llm:time_to_first_token_seconds_count", "2", None, None)] == 0
    assert samples[("lite_llm:request_success_total", "2", None, "stop")] == 0
    assert text.count("# TYPE lite_llm:time_to_first_token_seconds histogram") == 1
    assert text.count("# TYPE lite_llm:num_requests_running gauge") == 1
    single = ServerMetrics("m").render(a)               # one engine: no engine label at all
    assert 'engine="' not in single and "lite_llm:num_requests_running{" in single


def test_a_replicas_request_failures_cross_the_pipe_as_their_kind():
    import pickle
    from lite_llm.engine.async_engine import EngineShutdownError
    from lite_llm.engine.data_parallel import _ERRORS, _error_wire
    dead = EngineDeadError("the engine thread failed")
    dead.__cause__ = MemoryError("out of memory")
    for error, kind, message in [(ValueError("bad grammar"), "invalid", "bad grammar"),
                                 (EngineShutdownError("not accepting"), "shutdown", "not accepting"),
                                 (dead, "dead", "the engine thread failed: MemoryError: out of memory")]:
        wire = pickle.loads(pickle.dumps(_error_wire(error)))
        assert wire == (kind, message)
        assert type(_ERRORS[wire[0]](wire[1])) is type(error)
