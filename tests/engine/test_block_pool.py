"""BlockPool and KVCacheManager: free list order, ref counts, prefix-cache hits and eviction."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_llm.engine.block_pool import BlockPool, hash_block_tokens
from lite_llm.engine.kv_cache import KVCacheManager
from lite_llm.engine.request import Request
from lite_llm.sampling_params import SamplingParams


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=100), seed=0)


def test_free_list_is_lru_and_cached_blocks_survive_until_evicted():
    pool = BlockPool(4)
    a, b, c, d = pool.allocate(4)
    assert pool.num_free_blocks == 0 and pool.usage == 1.0
    pool.cache_block(b, b"h-b" * 4)
    pool.free([c, a, b, d])                       # freed order = eviction order
    assert [blk.block_id for blk in pool.free_queue] == [c.block_id, a.block_id, b.block_id, d.block_id]
    assert pool.get_cached_block(b"h-b" * 4) is b
    pool.touch([b])                               # a hit takes it out of the free list
    assert b.ref_cnt == 1 and pool.num_free_blocks == 3
    pool.check()
    pool.free([b])                                # now b is the most recently freed
    got = pool.allocate(3)
    assert [blk.block_id for blk in got] == [c.block_id, a.block_id, d.block_id]
    assert pool.get_cached_block(b"h-b" * 4) is b
    pool.allocate(1)                              # evicting b drops its hash
    assert pool.get_cached_block(b"h-b" * 4) is None and b.block_hash is None
    pool.check()


def test_freed_blocks_are_reused_before_never_used_ones():
    """The cache's pages become resident as blocks are first written: allocation takes a freed
    block (evicting its cached content) before a never-used one, so the blocks ever used (the
    resident KV memory) follow the peak of concurrent use, not the number of requests served."""
    pool = BlockPool(100)
    assert pool.num_touched_blocks == 0 and pool.num_free_blocks == 100
    peak = 0
    for i in range(50):                           # 50 requests, at most 3 blocks each at once
        blocks = pool.allocate(3)
        pool.cache_block(blocks[0], f"req-{i}".encode())
        peak = max(peak, pool.num_touched_blocks)
        pool.free(blocks[::-1])
        pool.check()
    assert peak == pool.num_touched_blocks == 3 and pool.num_free_blocks == 100
    freed = [b.block_id for b in pool.free_queue]
    assert sorted(freed) == [0, 1, 2]
    assert [b.block_id for b in pool.allocate(5)] == freed + [3, 4]   # freed (LRU) first, then new ones
    assert pool.num_touched_blocks == 5
    pool.check()


def test_duplicate_content_stays_private_and_double_free_is_caught():
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    pool.cache_block(a, b"same" * 4)
    pool.cache_block(b, b"same" * 4)
    assert pool.get_cached_block(b"same" * 4) is a and b.block_hash is None
    pool.free([a, b])
    with pytest.raises(AssertionError):
        pool.free([a])
    pool.check()


def test_check_detects_a_broken_invariant():
    pool = BlockPool(3)
    (a,) = pool.allocate(1)
    pool.check()
    a.ref_cnt = 0                                 # held by nobody, yet not in the free list
    with pytest.raises(AssertionError):
        pool.check()


def test_hash_depends_on_parent_and_tokens():
    h1 = hash_block_tokens(None, [1, 2, 3, 4])
    assert h1 == hash_block_tokens(None, [1, 2, 3, 4])
    assert h1 != hash_block_tokens(None, [1, 2, 3, 5])
    assert hash_block_tokens(h1, [1, 2, 3, 4]) != h1


def test_prefix_hit_never_covers_the_last_prompt_token():
    mgr = KVCacheManager(num_blocks=8, block_size=4)
    first = make_request("a", list(range(8)))     # two full blocks
    assert mgr.allocate_slots(first, 8) is not None
    first.num_computed_tokens = 8
    mgr.free(first)
    same = make_request("b", list(range(8)))
    hits, num_hit = mgr.get_computed_blocks(same)
    assert num_hit == 4 and len(hits) == 1        # the block with token 7 is recomputed
    longer = make_request("c", list(range(9)))
    hits, num_hit = mgr.get_computed_blocks(longer)
    assert num_hit == 8
    table = mgr.allocate_slots(longer, 1, hits)   # a request without blocks: its whole table
    assert table == mgr.block_tables["c"] and table[:2] == [b.block_id for b in hits] and len(table) == 3
    assert all(mgr.block_pool.blocks[b].ref_cnt == 1 for b in table)
    mgr.block_pool.check()


def test_blocks_of_a_request_preempted_before_computing_are_unpublished():
    mgr = KVCacheManager(num_blocks=8, block_size=4)
    req = make_request("a", list(range(10)))
    mgr.allocate_slots(req, 10)                   # published at allocation...
    assert len(mgr.block_pool.cached) == 2
    mgr.free(req)                                 # ...but num_computed_tokens is still 0
    assert not mgr.block_pool.cached
    mgr.block_pool.check()


def test_caching_off_never_hits():
    mgr = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = make_request("a", list(range(9)))
    mgr.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    mgr.free(a)
    assert mgr.get_computed_blocks(make_request("b", list(range(9)))) == ([], 0)
    assert not mgr.block_pool.cached


def check_manager(mgr: KVCacheManager, num_blocks: int) -> None:
    mgr.block_pool.check()
    owners: dict[int, int] = {}
    for table in mgr.block_tables.values():
        assert len(table) == len(set(table))
        for b in table:
            owners[b] = owners.get(b, 0) + 1
    for block in mgr.block_pool.blocks:           # ref count = number of tables holding it
        assert block.ref_cnt == owners.get(block.block_id, 0)
    assert mgr.num_free_blocks + len(owners) == num_blocks


# op: (kind, request slot, amount); prompts draw from a tiny alphabet so prefixes repeat
ops_strategy = st.lists(st.tuples(st.sampled_from(["grow", "grow", "free", "new"]),
                                  st.integers(0, 5), st.integers(1, 12)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops_strategy, prefix_len=st.integers(0, 12))
def test_random_allocations_keep_ref_counts_and_never_leak(ops, prefix_len):
    num_blocks, bs = 24, 4
    mgr = KVCacheManager(num_blocks=num_blocks, block_size=bs)
    live: dict[int, Request] = {}
    counter = 0
    for kind, slot, amount in ops:
        req = live.get(slot)
        if kind == "new" and req is None:
            counter += 1
            tokens = [7] * prefix_len + [slot, amount] * (amount // 2 + 1)
            req = make_request(f"r{counter}", tokens)
            hits, num_hit = mgr.get_computed_blocks(req)
            table = mgr.allocate_slots(req, req.num_tokens - num_hit, hits)
            if table is not None:
                assert table == mgr.block_tables[req.request_id]   # new: the delta is the whole table
                req.num_computed_tokens = req.num_tokens   # as if its step ran
                live[slot] = req
        elif kind == "grow" and req is not None:
            for i in range(amount):
                req.append_output_token((slot * 31 + i) % 5)
            before = list(mgr.block_tables[req.request_id])
            new_ids = mgr.allocate_slots(req, amount)
            if new_ids is None:
                assert mgr.block_tables[req.request_id] == before   # a failed allocation changes nothing
                del live[slot]
                mgr.free(req)                     # preempted
            else:
                assert mgr.block_tables[req.request_id] == before + new_ids   # the delta appends
                assert len(before + new_ids) * bs >= req.num_tokens
                req.num_computed_tokens = req.num_tokens
        elif kind == "free" and req is not None:
            del live[slot]
            mgr.free(req)
        check_manager(mgr, num_blocks)
    for req in live.values():
        mgr.free(req)
    check_manager(mgr, num_blocks)
    assert mgr.num_free_blocks == num_blocks and mgr.usage == 0.0
