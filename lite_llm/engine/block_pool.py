"""BlockPool: the KV cache's blocks, their ref counts, free list and prefix-cache map.

A block holds KV for `block_size` consecutive tokens of one sequence. A block is either
in use (ref_cnt > 0: held by that many block tables) or free (ref_cnt == 0: in the free
list, or never used yet). A full block may carry a content hash; while it does, it is in
`cached` and a new request with the same prefix can take it again, even from the free list,
until allocation evicts it (free list head = least recently freed = evicted first).

    free list (intrusive, doubly linked):  head <-> b5 <-> b1 <-> b8 <-> tail
                                                  ^ next allocation takes b5 (LRU)
    never used:                            b9 b10 b11 ...   taken only when the list is empty

Allocation takes a block some request used before whenever there is one: the cache's pages
are only made resident as blocks are first written, so the resident KV memory follows the
peak of concurrent use instead of growing to the whole cache over a server's life (prefix-
cache hits live in what that peak touched).
Block tables per request live in kv_cache.py; token hashing policy lives there too.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

try:    # hashlib's own BLAKE2, without hashlib loading OpenSSL (~3.5 MiB resident) for nothing
    from _blake2 import blake2b
except ImportError:                      # a Python built without it: hashlib's fallback
    from hashlib import blake2b


def hash_block_tokens(parent_hash: bytes | None, token_ids: Sequence[int], extra: bytes = b"") -> bytes:
    """Content hash of a full block: blake2b(parent hash, token ids, extra), stable across
    processes. extra: the hashes of the images whose placeholder tokens the block holds."""
    h = blake2b(digest_size=16)
    h.update(parent_hash if parent_hash is not None else b"\0" * 16)
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    if extra:
        h.update(extra)
    return h.digest()


class KVBlock:
    """One KV block: id, ref count, content hash, and its links in the free list."""
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, hashed={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list through KVBlock.prev_free/next_free: O(1) popleft, append, remove."""

    def __init__(self, blocks: Iterable[KVBlock]):
        self._head = KVBlock(-1)              # sentinels: no None checks on the hot path
        self._tail = KVBlock(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free_blocks

    def popleft(self) -> KVBlock:
        block = self._head.next_free
        assert block is not self._tail, "popleft from an empty free list"
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"{block} is not in the free list"
        prev.next_free, nxt.prev_free = nxt, prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVBlock) -> None:
        assert block.prev_free is None and block.next_free is None, f"{block} is already free"
        last = self._tail.prev_free
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self.num_free_blocks += 1

    def __iter__(self):
        block = self._head.next_free
        while block is not self._tail:
            yield block
            block = block.next_free


class BlockPool:
    """All KV blocks of the cache: allocate, share (touch), free, and the prefix-cache map."""

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(())
        self.never_used = self.blocks[::-1]      # a stack: block 0 is taken first
        self.cached: dict[bytes, KVBlock] = {}   # content hash -> the block holding that content

    @property
    def num_free_blocks(self) -> int:
        """Blocks no table holds (cached ones included: allocation may evict them)."""
        return self.free_queue.num_free_blocks + len(self.never_used)

    @property
    def num_touched_blocks(self) -> int:
        """Blocks some request has used: the high-water mark of the cache's resident memory."""
        return self.num_blocks - len(self.never_used)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by at least one request, 0..1."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_cached_block(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash)

    def allocate(self, num_blocks: int) -> list[KVBlock]:
        """num_blocks fresh blocks (ref_cnt 1): freed ones first, evicting the least recently freed
        first, then never-used ones."""
        assert num_blocks <= self.num_free_blocks, f"{num_blocks} blocks asked, {self.num_free_blocks} free"
        out = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft() if self.free_queue.num_free_blocks else self.never_used.pop()
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """One more table holds each block (prefix-cache hit); a free one leaves the free list."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """One table fewer holds each block; pass them tail first so a sequence's last blocks,
        the least likely to be shared, are evicted before its first ones."""
        for block in blocks:
            assert block.ref_cnt > 0, f"double free of {block}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_block(self, block: KVBlock, block_hash: bytes) -> None:
        """Publish a full block's content hash; the first block with given content wins."""
        assert block.ref_cnt > 0 and block.block_hash is None, f"cannot cache {block}"
        if not self.enable_caching or block_hash in self.cached:
            return                             # a duplicate stays private and unhashed
        block.block_hash = block_hash
        self.cached[block_hash] = block

    def uncache_block(self, block: KVBlock) -> None:
        """Forget a block's content (its KV was never written, e.g. preempted before running)."""
        self._evict(block)

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            assert self.cached.get(block.block_hash) is block, f"{block} hash not in the map"
            del self.cached[block.block_hash]
            block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; only possible when no block is in use."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        return True

    def check(self) -> None:
        """Verify every invariant of the pool; raises AssertionError naming the broken one."""
        free_ids = [b.block_id for b in self.free_queue]
        assert len(free_ids) == len(set(free_ids)) == self.free_queue.num_free_blocks, \
            "free list has duplicates or a wrong count"
        fresh = [b.block_id for b in self.never_used]
        assert not set(fresh) & set(free_ids), "a never-used block is in the free list"
        assert all(b.ref_cnt == 0 and b.block_hash is None for b in self.never_used), "a never-used block was used"
        free_ids += fresh
        prev = self.free_queue._head
        for block in self.free_queue:
            assert block.prev_free is prev, f"broken back link at {block}"
            prev = block
        assert self.free_queue._tail.prev_free is prev, "broken tail link"
        free_set = set(free_ids)
        for block in self.blocks:
            assert block.ref_cnt >= 0, f"negative ref count: {block}"
            in_free = block.block_id in free_set
            assert in_free == (block.ref_cnt == 0), f"free list membership != (ref_cnt == 0): {block}"
            if not in_free:
                assert block.prev_free is None and block.next_free is None, f"stale links: {block}"
            if block.block_hash is not None:
                assert self.cached.get(block.block_hash) is block, f"hashed block not in map: {block}"
        for block_hash, block in self.cached.items():
            assert block.block_hash == block_hash, f"map entry disagrees with {block}"
        assert self.enable_caching or not self.cached, "cache map filled with caching off"

