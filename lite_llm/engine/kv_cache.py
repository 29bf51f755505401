"""KVCacheManager: each request's block table, slot allocation and prefix-cache lookups.

The manager decides WHICH blocks hold a request's KV; the runner owns the KV arrays
themselves ([num_blocks, block_size, ...] per layer) and only sees block ids.

    block table:  [ b7 | b2 | b9 | b4 ]        block_size = 4
    tokens:       [0-3 |4-7 |8-11|12-13 . .]   num_computed_tokens = 14
    slot of token t = table[t // block_size] * block_size + t % block_size

Prefix caching: every full block gets hash(parent block hash, its token ids), prompt and
output blocks alike, and is published in the pool's map as soon as it is allocated for
tokens that this step computes. A later request (even one admitted in the same step, which
then reads KV another sequence of the same step writes) takes such blocks instead of
computing them. A request preempted before its step ran unpublishes what it never computed.
A LongRoPE model turns a sequence longer than its original context with other factors than a
shorter one (lite_llm/model/rope.py): the first block of such a sequence is keyed on that too,
and a sequence whose keys were turned short holds at most that context (room) until the
scheduler recomputes it.
"""
from __future__ import annotations

from lite_llm.engine.block_pool import BlockPool, KVBlock, hash_block_tokens
from lite_llm.engine.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.block_pool = BlockPool(num_blocks, enable_prefix_caching)
        self._blocks: dict[str, list[KVBlock]] = {}      # request id -> its blocks, in order
        self.block_tables: dict[str, list[int]] = {}     # request id -> block ids, same order
        self._num_hashed: dict[str, int] = {}            # leading blocks already published
        # request id -> the token count (computed + new + lookahead) its blocks hold with nothing
        # to allocate or publish: a decode step within it needs no allocate_slots call
        self.room: dict[str, int] = {}
        self.prefix_cache_queries = 0                    # tokens looked up
        self.prefix_cache_hits = 0                       # tokens found
        # LongRoPE: sequences longer than this turn their tokens with the long factors (0: no
        # switch; the runner's rope_switch, set by the engine); the requests whose blocks hold
        # keys turned by the long factors
        self.rope_switch = 0
        self.rope_long: set[str] = set()

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of the KV cache held by requests, 0..1 (cached-but-free blocks count free)."""
        return self.block_pool.usage

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Cached blocks holding a prefix of request's tokens, and how many tokens they cover.

        At most (num_tokens - 1) // block_size blocks: the last token is always computed,
        since its logits give the next token.
        """
        if not self.enable_prefix_caching:
            return [], 0
        if self.rope_switch and request.num_prompt_tokens <= self.rope_switch < request.num_tokens:
            request.block_hashes.clear()    # hashed while it was short: its blocks now hold long keys
        self._hash_full_blocks(request, request.num_tokens)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup in the hit-rate stats (failed admissions retry)."""
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_tokens
            self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVBlock] = (), num_lookahead_tokens: int = 0
                       ) -> list[int] | None:
        """Make room for num_new_tokens more KV entries of request; None if the pool is short.

        new_computed_blocks: prefix-cache hits (from get_computed_blocks) for a request
        being admitted; they sit before the new tokens. num_lookahead_tokens: slots past the
        new tokens for speculative tokens (drafts the step verifies, a draft model's next
        drafts); they are never published for prefix caching (their tokens are not the
        request's yet), and what a rejected draft wrote there is overwritten when the real
        token at that position is computed. Returns the ids appended to the request's block
        table (hits first): the delta the runner applies to its copy.
        """
        rid = request.request_id
        blocks = self._blocks.get(rid)
        if self.rope_switch and blocks and rid not in self.rope_long \
                and request.num_computed_tokens + num_new_tokens + num_lookahead_tokens > self.rope_switch:
            return None     # short keys, a longer sequence: the scheduler recomputes it (Scheduler._restart)
        if blocks and not new_computed_blocks:
            # a running request whose blocks already hold the new tokens (most decode steps)
            end = request.num_computed_tokens + num_new_tokens
            if end + num_lookahead_tokens <= len(blocks) * self.block_size and (
                    not self.enable_prefix_caching or end // self.block_size <= self._num_hashed[rid]):
                return []
        assert not new_computed_blocks or not blocks, "cache hits only for a request without blocks"
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        end = num_computed + num_new_tokens
        num_held = (len(blocks) if blocks else 0) + len(new_computed_blocks)
        num_new_blocks = max(0, -(-(end + num_lookahead_tokens) // self.block_size) - num_held)
        # hits sitting in the free list stop being free once touched
        num_free_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks + num_free_hits > self.block_pool.num_free_blocks:
            return None
        if blocks is None:
            blocks = self._blocks[rid] = []
            self.block_tables[rid] = []
            self._num_hashed[rid] = 0
            if self.rope_switch and request.num_tokens > self.rope_switch:
                self.rope_long.add(rid)
        table = self.block_tables[rid]
        num_before = len(table)
        if new_computed_blocks:
            self.block_pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            table.extend(b.block_id for b in new_computed_blocks)
            self._num_hashed[rid] = len(new_computed_blocks)
        if num_new_blocks:
            new_blocks = self.block_pool.allocate(num_new_blocks)
            blocks.extend(new_blocks)
            table.extend(b.block_id for b in new_blocks)
        if self.enable_prefix_caching and end // self.block_size > self._num_hashed[rid]:
            self._publish_full_blocks(request, end)
        if blocks:   # the early return's condition above, solved for end
            room = len(blocks) * self.block_size
            self.room[rid] = min(room, (self._num_hashed[rid] + 1) * self.block_size - 1) \
                if self.enable_prefix_caching else room
            if self.rope_switch and rid not in self.rope_long:
                self.room[rid] = min(self.room[rid], self.rope_switch)
        return table[num_before:] if len(table) > num_before else []

    def free(self, request: Request) -> None:
        """Release request's blocks (tail first). Blocks it published beyond its computed
        tokens never got their KV written: they are unpublished first."""
        rid = request.request_id
        blocks = self._blocks.pop(rid, None)
        if blocks is None:
            return
        del self.block_tables[rid]
        self.room.pop(rid, None)
        self.rope_long.discard(rid)
        num_hashed = self._num_hashed.pop(rid)
        for blk in range(request.num_computed_tokens // self.block_size, num_hashed):
            block = blocks[blk]
            if block.block_hash is not None:
                # published by this request in the step it is leaving: nobody else holds it
                assert block.ref_cnt == 1, f"unwritten cached {block} is shared"
                self.block_pool.uncache_block(block)
        self.block_pool.free(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def _hash_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Extend request.block_hashes over every full block of its first num_tokens tokens."""
        hashes = request.block_hashes
        token_ids = request.all_token_ids
        bs = self.block_size
        mm = request.mm     # image placeholders are keyed on their image, not on their ids alone
        for blk in range(len(hashes), num_tokens // bs):
            extra = mm.block_key(blk * bs, (blk + 1) * bs) if mm is not None else b""
            if blk == 0 and self.rope_switch and request.num_tokens > self.rope_switch:
                extra += b"longrope"
            hashes.append(hash_block_tokens(hashes[-1] if hashes else request.lora_salt,
                                            token_ids[blk * bs:(blk + 1) * bs], extra))

    def _publish_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Publish the blocks that are full once the first num_tokens tokens are computed."""
        rid = request.request_id
        num_full = num_tokens // self.block_size
        start = self._num_hashed[rid]
        if num_full <= start:
            return
        self._hash_full_blocks(request, num_tokens)
        blocks = self._blocks[rid]
        for blk in range(start, num_full):
            self.block_pool.cache_block(blocks[blk], request.block_hashes[blk])
        self._num_hashed[rid] = num_full
