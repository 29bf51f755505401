"""Tensor parallel over the ranks of one machine (one rank per NUMA node, or per bind list).

Rank 0 is the engine's own process: the scheduler, the sampler and the LM head stay there.
Every other rank is a worker process (`python -m lite_llm.engine.tp`) started by TPGroup,
bound to its rank's cores (and its node's memory where libnuma is present), holding its shard:

    attention   query heads split evenly; KV heads split evenly, or, when there are fewer KV
                heads than ranks, each rank holds the one KV head its query heads use
                (replicated, as vLLM does); qkv rows (and bias) of those heads, o columns
    MLP         gate/up (or fc1) rows of features f0..f1 of ffn_dim, down (fc2) columns;
                a mixture of experts: the same cut of every expert (and of a shared expert's
                own width), the router on every rank (each routes its tokens alike)
    row-split   o and down biases on rank 0 only (the all-reduce adds every rank's share)
    KV cache    its KV heads, same blocks as rank 0 (the block tables are rank 0's)
    embedding   the whole table on every rank (each rank gathers its tokens' rows)
    LM head     vocabulary-parallel: rows v0..v1 of V/N on each rank (cut from the embedding
                when they are tied); each rank writes its columns of the step's logits rows
                into the segment's logits area, which is rank 0's logits array: the sampler
                runs on rank 0 once every rank has arrived

One step: rank 0 copies the step's flat arrays into the segment's step area and bumps the
step number; each worker, waiting on it, runs the same ONE compiled forward() call with its
shard. A vision-language model's images are encoded on rank 0 alone (its runner's vision tower);
the step's image rows, one per image token, travel in the step area with the token each replaces,
its multimodal RoPE positions and its attention positions (Gemma 3's image tokens). Inside it, the outputs of o and down are summed over ranks through the segment's slots
(src/tp_shm.h): two all-reduces per layer, no Python between them.

    segment:  header (arrive flags, step number, abort word) | step area | slots [2][N][T E] |
              logits [R, V]
    step area: params int64[8] | token_ids [T] | positions [T] | slot_mapping [T] int64 |
               tok_seq [T] | block_tables [max_num_seqs, max_blocks] | logits_rows [R] | rope_rows [T] |
               (a model taking images) embed_src [T] | rope_pos [T, 3] | attn_pos [T] |
               mm_embeds [T, E] float32

A worker that dies is seen by rank 0's monitor thread (it waits on the process): it sets the
abort word, so every spinning wait returns, and the engine raises naming the rank. Workers
stop when rank 0 does (they watch their parent) or when it sets the abort word at close().

What does not live here: the plan of cores per rank (lite_llm/cpu.py), the all-reduce
(src/tp_shm.h, _kernels/tp.pxi), packing (model/pack.py).
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import mmap
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace

import numpy as np

from lite_llm import cpu
from lite_llm.config import env
from lite_llm.model.gguf import TENSOR_TYPES
from lite_llm.model.loader import load_model
from lite_llm.model.weights import StoredPart
from lite_llm.multimodal import takes_images

log = logging.getLogger("lite_llm")

ABORT_RANK_DIED, ABORT_SHUTDOWN = 1, 2
_STEP_WORD, _ABORT_WORD = 64 * 8, 65 * 8       # uint64 index of the header's step and abort lines
_NUM_PARAMS = 8                                # T, num block-table rows, max_blocks, R, then 1 / 0: the
                                               # step has embed_src (and mm_embeds), rope_pos, attn_pos, rope_rows
DEFAULT_TIMEOUT = 60.0         # seconds one all-reduce may wait for the other ranks (LITE_LLM_TP_TIMEOUT)
START_TIMEOUT = 600.0


# ----------------------------------------------------------------------------- sharding

def check_tensor_parallel(cfg, size: int) -> None:
    """A clear ValueError unless a model of config `cfg` splits over `size` ranks."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size={size}: must be >= 1")
    if size == 1:
        return
    problems = []
    if cfg.num_heads % size:
        problems.append(f"{cfg.num_heads} attention heads do not split over {size} ranks")
    hkv = cfg.num_kv_heads
    if hkv % size and size % hkv:
        problems.append(f"{hkv} KV heads neither split over {size} ranks nor divide them (to be replicated)")
    if cfg.ffn_dim % size:
        what = "each expert's MLP width" if getattr(cfg, "num_experts", 0) else "MLP width"
        problems.append(f"{what} {cfg.ffn_dim} does not split over {size} ranks")
    if getattr(cfg, "shared_ffn_dim", 0) % size:
        problems.append(f"shared expert width {cfg.shared_ffn_dim} does not split over {size} ranks")
    if getattr(cfg, "is_hybrid", False):
        problems.append("its recurrent layers' state (short convolutions, Mamba2) is not split over ranks")
    if getattr(cfg, "first_dense_layers", 0) and getattr(cfg, "num_experts", 0):
        # the cuts below follow the experts' width; a dense layer before them has its own
        problems.append(f"its first {cfg.first_dense_layers} dense MLP layer(s) before the experts are not split "
                        "over ranks")
    if problems:
        raise ValueError(f"{cfg.architecture}: tensor_parallel_size={size} is not possible: "
                         + "; ".join(problems) + " (choose a size that divides them)")


def _heads(cfg, rank: int, size: int) -> tuple[int, int, int, int, int, int]:
    """(h0, h1, kv0, kv1, f0, f1): the query heads, KV heads and MLP features rank `rank` holds."""
    hq = cfg.num_heads // size
    hkv = cfg.num_kv_heads
    if hkv >= size:
        kv0, kv1 = rank * (hkv // size), (rank + 1) * (hkv // size)
    else:                       # replicated: the one KV head this rank's query heads read
        kv0 = rank * hkv // size
        kv1 = kv0 + 1
    f = cfg.ffn_dim // size
    return rank * hq, (rank + 1) * hq, kv0, kv1, rank * f, (rank + 1) * f


def rank_config(cfg, rank: int, size: int):
    """The ModelConfig of rank `rank`'s shard: its heads, KV heads and MLP width (of every
    expert, and of a shared expert)."""
    h0, h1, kv0, kv1, f0, f1 = _heads(cfg, rank, size)
    extra = {"shared_ffn_dim": cfg.shared_ffn_dim // size} if getattr(cfg, "shared_ffn_dim", 0) else {}
    return dataclasses.replace(cfg, num_heads=h1 - h0, num_kv_heads=kv1 - kv0, ffn_dim=f1 - f0, **extra)


def vocab_range(cfg, rank: int, size: int) -> tuple[int, int]:
    """The vocabulary rows (v0, v1) of the LM head rank `rank` holds."""
    return rank * cfg.vocab_size // size, (rank + 1) * cfg.vocab_size // size


def describe_rank(cfg, rank: int, size: int) -> str:
    """What rank `rank` holds, for the start-up log and info."""
    h0, h1, kv0, kv1, f0, f1 = _heads(cfg, rank, size)
    v0, v1 = vocab_range(cfg, rank, size)
    rep = " (replicated)" if cfg.num_kv_heads < size else ""
    return (f"query heads {h0}-{h1 - 1} of {cfg.num_heads}, KV heads {kv0}-{kv1 - 1} of "
            f"{cfg.num_kv_heads}{rep}, MLP features {f0}-{f1 - 1} of {cfg.ffn_dim}, "
            f"embedding, LM head rows {v0}-{v1 - 1} of {cfg.vocab_size}")


def _cut(name: str, cfg, rank: int, size: int):
    """How rank `rank` cuts tensor `name`: "all", "none", ("rows", [(r0, r1), ...]) or
    ("cols", c0, c1) (of a 2-D weight; its bias is on rank 0 only)."""
    if size == 1:
        return "all"
    base = name[: -len(".weight")] if name.endswith(".weight") else name
    base = base[: -len(".bias")] if base.endswith(".bias") else base
    kind = base.rsplit(".", 1)[-1]
    if base == "lm_head" and not name.endswith(".bias"):
        return "rows", [vocab_range(cfg, rank, size)]
    if not base.startswith("layers."):
        return "all"
    h0, h1, kv0, kv1, f0, f1 = _heads(cfg, rank, size)
    D, H, Hkv, F = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.ffn_dim
    if ".shared." in base:     # a shared expert: features of its own width (an expert's: F)
        F = cfg.shared_ffn_dim
        f0, f1 = rank * F // size, (rank + 1) * F // size
    if kind == "qkv":          # rows: q heads, then k heads, then v heads
        return "rows", [(h0 * D, h1 * D), ((H + kv0) * D, (H + kv1) * D), ((H + Hkv + kv0) * D, (H + Hkv + kv1) * D)]
    if kind == "sinks":        # one per query head (gpt-oss)
        return "rows", [(h0, h1)]
    if kind == "gate_up":      # rows: gate then up
        return "rows", [(f0, f1), (F + f0, F + f1)]
    if kind == "up":
        return "rows", [(f0, f1)]
    if kind in ("o", "down"):  # row-parallel: columns of the input
        return ("cols", h0 * D, h1 * D) if kind == "o" else ("cols", f0, f1)
    return "all"


def shard_tensor(name: str, arr: np.ndarray, cfg, rank: int, size: int) -> np.ndarray | None:
    """Rank `rank`'s part of canonical tensor `name` (a whole [N, K] weight or a vector), or
    None when the rank holds none of it (the LM head off rank 0, row-split biases off rank 0)."""
    cut = _cut(name, cfg, rank, size)
    if cut == "all":
        return arr
    if cut == "none":
        return None
    if cut[0] == "rows":
        return np.ascontiguousarray(np.concatenate([arr[r0:r1] for r0, r1 in cut[1]]))
    if arr.ndim == 1:          # a row-split bias: once, on rank 0 (the all-reduce adds every share)
        return arr if rank == 0 else None
    return np.ascontiguousarray(arr[:, cut[1]:cut[2]])


def shard_rows(name: str, t, cfg, rank: int, size: int):
    """Rank `rank`'s part of 2-D weight `name` not read yet (a model.weights.StackedRows), as a
    StackedRows over the same stored rows, or None (the LM head off rank 0), cut as
    shard_tensor cuts a whole array. Block-quantized parts stay blocks: a column-parallel weight
    (qkv, gate/up) keeps whole rows; a row-parallel one (o, down) keeps whole blocks of each row
    when its column range falls on block boundaries, else it is read dequantized. Rows kept
    whole keep their place in the file (StoredPart), so the shard packs straight from the
    mapping as a whole weight does."""
    cut = _cut(name, cfg, rank, size)
    if cut == "all":
        return t
    if cut == "none":
        return None
    if cut[0] == "rows":
        return _row_ranges(t, cut[1])
    return _column_range(t, cut[1], cut[2])


def _row_ranges(t, ranges: list[tuple[int, int]]):
    """StackedRows `t` cut to the given row ranges, in order: one part per piece of a stored
    part a range covers (a fused gate/up part becomes its gate piece and its up piece)."""
    def cut(reader, a0):
        return lambda r0, r1: reader(a0 + r0, a0 + r1)

    def cut_stored(sp, a0, a1, rows):
        if sp is None:
            return None
        row_bytes = sp.nbytes // rows
        return StoredPart(view=lambda: sp.view()[a0 * row_bytes:a1 * row_bytes], nbytes=(a1 - a0) * row_bytes,
                          type_name=sp.type_name, perm=sp.perm, release=sp.release)

    parts, blocks, stored = [], [], []
    for r0, r1 in ranges:
        start = 0
        for i, (rows, reader) in enumerate(t.parts):
            a0, a1 = max(r0, start) - start, min(r1, start + rows) - start
            if a0 < a1:
                parts.append((a1 - a0, cut(reader, a0)))
                b = t.blocks[i] if t.blocks else None
                blocks.append(None if b is None else (b[0], cut(b[1], a0)))
                stored.append(cut_stored(t.stored[i] if t.stored else None, a0, a1, rows))
            start += rows
    return replace(t, parts=tuple(parts), blocks=tuple(blocks), stored=tuple(stored))


def _column_range(t, c0: int, c1: int):
    """StackedRows `t` cut to columns c0..c1 of every row; a block-quantized part stays in
    blocks when c0 and c1 are whole blocks of its type."""
    per_type = {name: (elements, nbytes) for name, elements, nbytes in TENSOR_TYPES.values()}

    def cut(reader):
        return lambda r0, r1: np.ascontiguousarray(reader(r0, r1)[:, c0:c1])

    def cut_blocks(b):
        if b is None:
            return None
        if b[0] == "F8_E4M3":       # FP8 rows: ceil(K / 128) float32 scales, then K bytes
            if c0 % 128 or (c1 % 128 and c1 != t.cols):
                return None
            head = -(-t.cols // 128) * 4

            def fp8(r0, r1, read=b[1]):
                raw = read(r0, r1)
                return np.concatenate([raw[:, c0 // 128 * 4:-(-c1 // 128) * 4], raw[:, head + c0:head + c1]], axis=1)
            return b[0], fp8
        elements, nbytes = per_type[b[0]]
        if c0 % elements or c1 % elements:
            return None
        lo, hi = c0 // elements * nbytes, c1 // elements * nbytes
        return b[0], lambda r0, r1: np.ascontiguousarray(b[1](r0, r1)[:, lo:hi])

    blocks = tuple(cut_blocks(b) for b in t.blocks) if t.blocks else None
    if blocks is not None and any(b is None for b in blocks):
        blocks = None          # one dequantized part: the whole weight runs in the engine dtype
    return replace(t, parts=tuple((rows, cut(reader)) for rows, reader in t.parts), cols=c1 - c0,
                   blocks=blocks, stored=None)


class RankShard:
    """What packing (model/pack.pack_checkpoint) needs of a tensor-parallel rank: its config,
    each tensor's part and its LM head's first vocabulary row."""

    def __init__(self, cfg, rank: int, size: int):
        check_tensor_parallel(cfg, size)
        self.full, self.rank, self.size = cfg, rank, size
        self.config = rank_config(cfg, rank, size)

    def weight(self, name: str, t):
        """A 2-D weight not read yet (StackedRows): shard_rows."""
        return shard_rows(name, t, self.full, self.rank, self.size)

    def tensor(self, name: str, arr: np.ndarray):
        """A vector (or a table read whole): shard_tensor."""
        return shard_tensor(name, arr, self.full, self.rank, self.size)

    def head_of_embedding(self, t):
        """This rank's LM head rows cut from the embedding (StackedRows) the two share: the
        whole table stays for gathering the tokens' rows."""
        return _row_ranges(t, [vocab_range(self.full, self.rank, self.size)])

    @property
    def first_vocab_row(self) -> int:
        """The first vocabulary row of this rank's LM head (PackedModel.vocab_first_row)."""
        return vocab_range(self.full, self.rank, self.size)[0]


# ----------------------------------------------------------------------------- segment

@dataclasses.dataclass(frozen=True)
class SegmentLayout:
    size: int
    max_tokens: int
    max_rows: int               # block-table rows (max_num_seqs)
    max_blocks: int
    dim: int
    max_logit_rows: int = 0     # logits rows a step may ask for (the workspace's max_rows)
    vocab: int = 0
    images: bool = False        # the step area has the image arrays

    def _offsets(self):
        from lite_llm._kernels import kernels     # here, not at the top: libgomp (see _serve)
        header, slot_bytes = kernels.tp_segment_bytes(self.size, self.max_tokens * self.dim)
        at, out = header, {}
        for key, dtype, count in (("params", np.int64, _NUM_PARAMS), ("token_ids", np.int32, self.max_tokens),
                                  ("positions", np.int32, self.max_tokens),
                                  ("slot_mapping", np.int64, self.max_tokens),
                                  ("tok_seq", np.int32, self.max_tokens),
                                  ("block_tables", np.int32, self.max_rows * self.max_blocks),
                                  ("logits_rows", np.int32, self.max_logit_rows),
                                  ("rope_rows", np.int32, self.max_tokens),
                                  *((("embed_src", np.int32, self.max_tokens), ("rope_pos", np.int32, 3 * self.max_tokens),
                                     ("attn_pos", np.int32, self.max_tokens),
                                     ("mm_embeds", np.float32, self.max_tokens * self.dim)) if self.images else ())):
            out[key] = (at, dtype, count)
            at = -(-(at + count * np.dtype(dtype).itemsize) // 64) * 64
        logits_at = -(-(at + slot_bytes) // 4096) * 4096
        out["logits"] = (logits_at, np.float32, self.max_logit_rows * self.vocab)
        return out, at, logits_at + self.max_logit_rows * self.vocab * 4

    @property
    def slots_offset(self) -> int:
        return self._offsets()[1]

    @property
    def nbytes(self) -> int:
        return self._offsets()[2]

    def views(self, buf) -> dict[str, np.ndarray]:
        offsets = self._offsets()[0]
        out = {k: np.frombuffer(buf, dtype, count, at) for k, (at, dtype, count) in offsets.items()}
        out["header"] = np.frombuffer(buf, np.uint64, offsets["params"][0] // 8, 0)
        out["logits"] = out["logits"].reshape(self.max_logit_rows, self.vocab)
        if self.images:
            out["rope_pos"] = out["rope_pos"].reshape(self.max_tokens, 3)
            out["mm_embeds"] = out["mm_embeds"].reshape(self.max_tokens, self.dim)
        return out


def allreduce_timeout() -> float:
    """LITE_LLM_TP_TIMEOUT seconds (default 60), checked."""
    text = env("TP_TIMEOUT", str(DEFAULT_TIMEOUT))
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"LITE_LLM_TP_TIMEOUT={text!r}: a positive number of seconds")
    return value


def _comm(buf, layout: SegmentLayout, rank: int, parent: int = 0):
    from lite_llm._kernels import kernels     # here, not at the top: libgomp (see _serve)
    return kernels.TPComm(buf, rank, layout.size, layout.max_tokens * layout.dim, layout.slots_offset,
                          allreduce_timeout(), parent)


# ----------------------------------------------------------------------------- rank 0

class TensorParallelError(RuntimeError):
    """A rank failed: the message names it and why."""


class TPGroup:
    """Rank 0's side: the shared segment, the worker processes and their monitor.

    plan: the ThreadPlan with one RankPlan per rank. worker_args: what a worker needs to load
    its shard and size its buffers like rank 0 (model source, dtype, max_model_len, num_blocks,
    block_size, max_num_batched_tokens, max_num_seqs, kv_cache_dtype, disable_sliding_window).
    on_failure(message): called from the monitor thread when a worker dies unasked."""

    def __init__(self, plan: cpu.ThreadPlan, cfg, worker_args: dict, max_blocks: int, on_failure=None,
                 images: bool = False):
        self.size = len(plan.ranks)
        self.layout = SegmentLayout(self.size, worker_args["max_num_batched_tokens"], worker_args["max_num_seqs"],
                                    max_blocks, cfg.dim, logit_rows(worker_args), cfg.vocab_size, images)
        fd, self.path = tempfile.mkstemp(prefix="lite_llm_tp_", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        try:
            os.ftruncate(fd, self.layout.nbytes)
            self._mm = mmap.mmap(fd, self.layout.nbytes)
        finally:
            os.close(fd)
        self.views = self.layout.views(self._mm)
        self.comm = _comm(self._mm, self.layout, 0)
        self.failure: str | None = None
        self.on_failure = on_failure
        self._closing = False
        self._step = 0
        self.ranks: list[dict] = [{"rank": 0, "pid": os.getpid(), "holds": describe_rank(cfg, 0, self.size)}]
        self.procs: list[subprocess.Popen] = []
        self._pipes: list[int] = []
        atexit.register(self.close)
        try:
            for rank in range(1, self.size):
                self._spawn(rank, plan, worker_args)
        except BaseException:
            self.close()
            raise

    def _spawn(self, rank: int, plan: cpu.ThreadPlan, worker_args: dict) -> None:
        r = plan.ranks[rank]
        read_fd, write_fd = os.pipe()
        args = dict(worker_args, rank=rank, size=self.size, segment=self.path, hello_fd=write_fd,
                    parent=os.getpid(), layout=dataclasses.asdict(self.layout),
                    plan={"mode": plan.mode, "machine_nodes": list(plan.machine_nodes),
                          "cpus": list(r.cpus), "node": r.node, "num_threads": r.num_threads,
                          "reserved": list(r.reserved), "memory_nodes": list(r.memory_nodes)})
        proc = subprocess.Popen([sys.executable, "-m", "lite_llm.engine.tp", json.dumps(args)],
                                pass_fds=(write_fd,), stdin=subprocess.DEVNULL)
        os.close(write_fd)
        self.procs.append(proc)
        self._pipes.append(read_fd)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Each worker's hello (binding report, what it holds) or a TensorParallelError; then the
        segment's name is unlinked (every rank has it mapped) and the monitor starts."""
        deadline = time.monotonic() + timeout
        for i, (proc, fd) in enumerate(zip(self.procs, self._pipes)):
            rank, data = i + 1, b""
            while not data.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TensorParallelError(f"tensor parallel rank {rank} (pid {proc.pid}) did not start "
                                              f"within {timeout:.0f} s")
                ready, _, _ = select.select([fd], [], [], min(left, 0.5))
                if ready:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        code = proc.wait()
                        raise TensorParallelError(f"tensor parallel rank {rank} (pid {proc.pid}) failed to start "
                                                  f"({_exit_text(code)}); its error is printed above")
                    data += chunk
            self.ranks.append(json.loads(data))
            os.close(fd)
        self._pipes = []
        os.unlink(self.path)
        self.path = None
        for rank, proc in enumerate(self.procs, 1):
            threading.Thread(target=self._watch, args=(rank, proc), name=f"lite_llm-tp-watch-{rank}",
                             daemon=True).start()

    def _watch(self, rank: int, proc: subprocess.Popen) -> None:
        code = proc.wait()
        if self._closing:
            return
        self.failure = (f"tensor parallel rank {rank} (pid {proc.pid}) exited ({_exit_text(code)}); "
                        f"the engine cannot run without it")
        self.comm.set_abort(ABORT_RANK_DIED)
        log.error("%s", self.failure)
        if self.on_failure is not None:
            self.on_failure(self.failure)

    def broadcast(self, token_ids, positions, slot_mapping, tok_seq, block_tables, logits_rows,
                  mm: tuple = (None, None, None, None), rope_rows: np.ndarray | None = None) -> np.ndarray:
        """Put one step's arrays in the step area and release the workers on it. Returns the
        step's logits array [R, V]: the segment's, where every rank writes its columns. mm: the
        step's (image rows [M, E], embed_src [T], rope_pos [T, 3], attn_pos [T]) as
        VisionRunner.step_inputs gives them; the image rows go as one row per image token.
        rope_rows: [T] RoPE table rows (LongRoPE, ModelRunner.rope_rows) or None."""
        if self.failure:
            raise TensorParallelError(self.failure)
        T, R = len(token_ids), len(logits_rows)
        rows = int(tok_seq.max()) + 1 if T else 0      # the block-table rows the step reads
        mb = block_tables.shape[1]
        v = self.views
        if R > self.layout.max_logit_rows:
            raise ValueError(f"{R} logits rows: the tensor-parallel segment holds {self.layout.max_logit_rows}")
        v["params"][:4] = (T, rows, mb, R)
        v["logits_rows"][:R] = logits_rows
        v["token_ids"][:T] = token_ids
        v["positions"][:T] = positions
        v["slot_mapping"][:T] = slot_mapping
        v["tok_seq"][:T] = tok_seq
        v["block_tables"][:rows * mb] = block_tables[:rows].reshape(-1)
        self._put_images(T, *mm)
        v["params"][7] = rope_rows is not None
        if rope_rows is not None:
            v["rope_rows"][:T] = rope_rows
        self._step += 1
        self.comm.publish_step(self._step)
        return v["logits"][:R]

    def _put_images(self, T: int, mm_embeds, embed_src, rope_pos, attn_pos) -> None:
        v = self.views
        given = (embed_src is not None, rope_pos is not None, attn_pos is not None)
        if any(given) and not self.layout.images:
            raise ValueError("image inputs under tensor parallel need a group started for a model that takes images")
        v["params"][4:7] = given
        if embed_src is not None:
            src = v["embed_src"][:T]
            src[:] = embed_src
            used = np.flatnonzero(src >= 0)
            v["mm_embeds"][used] = mm_embeds[src[used]]    # the row token t takes, at row t
            src[used] = used
        if rope_pos is not None:
            v["rope_pos"][:T] = rope_pos
        if attn_pos is not None:
            v["attn_pos"][:T] = attn_pos

    def raise_failure(self, error: BaseException) -> None:
        """Re-raise a failed forward() with the rank that caused it, when known."""
        deadline = time.monotonic() + 2.0     # the monitor may be a moment behind the spin
        while self.failure is None and time.monotonic() < deadline:
            time.sleep(0.01)
        raise TensorParallelError(self.failure or str(error)) from error

    def close(self) -> None:
        """Stop the workers (abort word: their waits return) and drop the segment."""
        if self._closing:
            return
        self._closing = True
        self.comm.set_abort(ABORT_SHUTDOWN)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for fd in self._pipes:
            os.close(fd)
        self._pipes = []
        if self.path:
            os.unlink(self.path)
            self.path = None

    def describe(self) -> list[str]:
        """One line per rank: pid, cores, binding and what it holds."""
        lines = []
        for r in self.ranks:
            where = f", {r['binding']}" if r.get("binding") else ""
            lines.append(f"tensor parallel rank {r['rank']} (pid {r['pid']}{where}): {r['holds']}")
        return lines


def start_group(loaded, plan: cpu.ThreadPlan, *, num_blocks: int, block_size: int, max_num_batched_tokens: int,
                max_num_seqs: int, kv_cache_dtype: str | None = "auto", disable_sliding_window: bool = False,
                quantization: str | None = None, on_failure=None, batch_invariant: bool = False) -> TPGroup:
    """Check the model splits over the plan's ranks, then start the workers (they load their
    shards while rank 0 loads its own; TPGroup.wait_ready() once rank 0 is loaded)."""
    check_tensor_parallel(loaded.config, len(plan.ranks))
    args = {"source": loaded.source, "dtype": loaded.dtype, "max_model_len": loaded.max_model_len,
            "num_blocks": num_blocks, "block_size": block_size, "max_num_batched_tokens": max_num_batched_tokens,
            "max_num_seqs": max_num_seqs, "kv_cache_dtype": kv_cache_dtype,
            "disable_sliding_window": disable_sliding_window, "quantization": quantization,
            "batch_invariant": batch_invariant}
    return TPGroup(plan, loaded.config, args, -(-max(loaded.max_model_len, 1) // block_size), on_failure,
                   takes_images(loaded))


def logit_rows(args: dict) -> int:
    """Logits rows one step may ask for: the runner's workspace rows (runner.py)."""
    return max(args["max_num_seqs"], args["max_num_batched_tokens"])


def check_plan(plan: cpu.ThreadPlan, tensor_parallel_size: int, bind: str) -> None:
    """A bind spec must list exactly one CPU list per rank: never a silently idle half-machine."""
    n = len(plan.ranks)
    if n == tensor_parallel_size:
        return
    if n > tensor_parallel_size:
        fix = (f"pass --tensor-parallel-size {n} (tensor_parallel_size={n}) to use every listed rank, or list "
               f"{tensor_parallel_size} rank(s) in LITE_LLM_CPU_OMP_THREADS_BIND")
    else:
        fix = (f"list {tensor_parallel_size} CPU lists separated by '|' in LITE_LLM_CPU_OMP_THREADS_BIND "
               f"(e.g. 0-47|48-95), or pass --tensor-parallel-size {n}")
    raise ValueError(f"LITE_LLM_CPU_OMP_THREADS_BIND={bind!r} plans {n} rank(s) but tensor_parallel_size is "
                     f"{tensor_parallel_size}: {fix}")


def _exit_text(code: int) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# ----------------------------------------------------------------------------- worker

def _worker(args: dict) -> int:
    rank, size = args["rank"], args["size"]
    p = args["plan"]
    plan = cpu.ThreadPlan(p["mode"], (cpu.RankPlan(cpus=tuple(p["cpus"]), node=p["node"],
                                                   num_threads=p["num_threads"], reserved=tuple(p["reserved"]),
                                                   memory_nodes=tuple(p["memory_nodes"])),),
                          (), tuple(p["machine_nodes"]))
    if plan.mode != "nobind":   # every thread so far (imports start some) off rank 0's CPUs
        for tid in map(int, os.listdir("/proc/self/task")):
            try:
                os.sched_setaffinity(tid, set(p["cpus"]) | set(p["reserved"]))
            except OSError:
                pass    # a thread that ended meanwhile
    cpu.configure_openmp_env()
    layout = SegmentLayout(**args["layout"])
    with open(args["segment"], "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), layout.nbytes)
    views = layout.views(mm)
    comm = _comm(mm, layout, rank, parent=args["parent"])
    result: dict = {}

    def run():   # on its own thread: binding from the main thread would be reported as a problem
        try:
            result["code"] = _serve(args, plan, comm, views)
        except BaseException as e:  # noqa: BLE001 - told to rank 0 through the abort word
            log.exception("tensor parallel rank %d failed", rank)
            comm.set_abort(ABORT_RANK_DIED)
            result["code"] = 1
            result["error"] = e

    t = threading.Thread(target=run, name=f"lite_llm-tp-rank-{rank}")
    t.start()
    t.join()
    return result["code"]


def _serve(args: dict, plan: cpu.ThreadPlan, comm, views: dict) -> int:
    # the kernels (and the runner, which imports them) load here, not at the top: libgomp reads
    # its environment once, as it loads, and cpu.configure_openmp_env() sets it first
    from lite_llm import _kernels
    from lite_llm.engine.runner import ModelRunner

    rank, size = args["rank"], args["size"]
    report = cpu.apply_plan(plan)
    loaded = load_model(args["source"], dtype=args["dtype"], max_model_len=args["max_model_len"],
                        skip_tokenizer_init=True, progress=False)
    runner = ModelRunner(loaded, num_blocks=args["num_blocks"], block_size=args["block_size"],
                         max_num_batched_tokens=args["max_num_batched_tokens"], max_num_seqs=args["max_num_seqs"],
                         num_threads=plan.num_threads, disable_sliding_window=args["disable_sliding_window"],
                         kv_cache_dtype=args["kv_cache_dtype"], quantization=args["quantization"],
                         shard=RankShard(loaded.config, rank, size), batch_invariant=args["batch_invariant"])
    hello = {"rank": rank, "pid": os.getpid(), "cpus": list(report.planned), "observed": list(report.observed),
             "ok": report.ok, "memory": report.memory, "binding": "; ".join(report.describe()),
             "holds": describe_rank(loaded.config, rank, size) + f"; {runner.weight_bytes / 2**20:.1f} MB of "
                      f"weights, KV cache {runner.kv_cache_bytes / 2**20:.1f} MB",
             "weight_bytes": runner.weight_bytes, "kv_cache_bytes": runner.kv_cache_bytes}
    os.write(args["hello_fd"], (json.dumps(hello) + "\n").encode())
    os.close(args["hello_fd"])
    kernels, model, ws, nt = runner.kernels, runner.model, runner.workspace, runner.num_threads
    last = 0
    while True:
        step = comm.wait_step(last)
        if step < 0:
            if int(views["header"][_ABORT_WORD]) == ABORT_SHUTDOWN:
                return 0
            why = _kernels.kernels.TP_FAILURES.get(-step, "stopped")
            sys.stderr.write(f"tensor parallel rank {rank}: the group stopped ({why})\n")
            return 1
        last = step
        T, rows, mb, R, has_src, has_rope, has_attn, has_rows = (int(x) for x in views["params"][:8])
        kernels.forward(model, ws, views["token_ids"][:T], views["positions"][:T], views["slot_mapping"][:T],
                        views["tok_seq"][:T], views["block_tables"][:rows * mb].reshape(rows, mb),
                        views["logits_rows"][:R], views["logits"][:R], nt, tp=comm,
                        attn_positions=views["attn_pos"][:T] if has_attn else None,
                        mm_embeds=views["mm_embeds"][:T] if has_src else None,
                        embed_src=views["embed_src"][:T] if has_src else None,
                        rope_pos=views["rope_pos"][:T] if has_rope else None,
                        rope_rows=views["rope_rows"][:T] if has_rows else None)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s lite_llm tp: %(message)s")
    sys.exit(_worker(json.loads(sys.argv[1])))
