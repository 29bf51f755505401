"""Packed weights kept on disk, so the next start maps them instead of packing again.

Packing a checkpoint (model/pack.pack_checkpoint) writes every weight into fresh memory in
the kernels' panel layouts: for an 8B Q4_K_M file that is 4.5 GB of first-touch page faults,
which on a VM cost more than the packing itself. The PackedModel (_kernels/packed.py) of one (checkpoint,
dtype, quantization, tensor-parallel rank, kernel build) is written once, after the engine is
ready, as two files under LITE_LLM_PACKED_CACHE (default <user cache>/lite_llm/packed):

    <key>.bin    every array, each at a 4096-byte offset (page-aligned, so cache-line aligned)
    <key>.json   the index: the format, the key's inputs, each array's dtype, shape and offset,
                 and the model: each matrix's name, shape, parts and arrays (panels, bias), each
                 vector's name and array, the LM head's first vocabulary row

A later start with the same key maps <key>.bin copy-on-write (MAP_PRIVATE): the arrays are
the page cache's own pages, read about as fast as huge-page-backed anonymous memory on the
machine measured (BENCHMARKS.md: within its run-to-run spread, at the low end for an 8B),
shared by every process that maps them (data-parallel replicas hold the weights once), and
never written by the kernels. The key is a checksum of the checkpoint's files (path, size,
modification time), the engine dtype, the quantization, the rank, the model config and the
kernel module file (a rebuilt kernel may pack differently); the index keeps those inputs and
they are compared whole before mapping, so a stale entry is never used. An entry that does
not read back as its index says is ignored with a warning and packed again.
An entry of another FORMAT is never read: the format is one of the key's inputs (and an index of
another format is refused), so a new engine packs again and its entry supersedes the old one.
An entry supersedes the older entries of its slot (the same checkpoint paths, dtype,
quantization, rank and kernel module path: a changed file or a rebuilt kernel), which are
removed once it is written, so edits and upgrades do not pile up copies of a model on disk.
`LITE_LLM_PACKED_CACHE=off` turns it off.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import mmap
import os
import re
import shutil
import threading
import time
import zlib

import numpy as np

from lite_llm import config as _config
from lite_llm._kernels.packed import PackedMatrix, PackedModel, Part
from lite_llm.model.gguf import split_shards

log = logging.getLogger("lite_llm")

FORMAT = 2      # 2: a typed PackedModel (matrices with shapes and parts, vectors); 1: flat named tensors
ALIGN = 4096
_MADV_POPULATE_READ = 22     # Linux 5.14+: map the cached pages in one call


def source_files(source: str) -> list[list]:
    """(path, size, mtime_ns) of the checkpoint's files: the file itself (with every shard of a
    split GGUF model: found by name before links resolve, a hub cache's blobs have none), or every
    file of a directory (weights, config, anything a loader might read)."""
    if os.path.isfile(source):
        paths = [os.path.realpath(p) for p in split_shards(source) or [source]]
    else:
        source = os.path.realpath(source)
        paths = sorted(os.path.join(source, n) for n in os.listdir(source) if os.path.isfile(os.path.join(source, n)))
    return [[p, st.st_size, st.st_mtime_ns] for p, st in ((p, os.stat(p)) for p in paths)]


def key_of(loaded, dtype: str, quantization: str | None, shard, kernels) -> tuple[str, dict] | None:
    """(hex key, its inputs) of this load, or None when the checkpoint is not files on disk."""
    source = getattr(loaded, "source", None)
    if not source or not os.path.exists(source):
        return None
    cfg = loaded.config if shard is None else shard.config
    so = getattr(kernels, "__file__", None) or ""
    inputs = {"format": FORMAT, "files": source_files(source), "dtype": dtype, "quantization": quantization,
              "rank": None if shard is None else [shard.rank, shard.size],
              "config": repr(dataclasses.asdict(cfg)) if dataclasses.is_dataclass(cfg) else repr(cfg),
              "kernels": source_files(so)[0] if so else None}
    inputs = json.loads(json.dumps(inputs, sort_keys=True, default=str))    # as the index keeps them
    data = json.dumps(inputs, sort_keys=True).encode()
    # two checksums name the entry (no hashlib: it loads OpenSSL into every start); load()
    # compares the whole inputs, so names that collide only miss
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}", inputs


def _layout(model: PackedModel) -> tuple[list, dict, int]:
    """(arrays [(array, offset)], the index's description of the model, total bytes). The index
    names each array by its position in `arrays`."""
    arrays, offset = [], 0

    def place(array: np.ndarray) -> int:
        nonlocal offset
        array = np.ascontiguousarray(array)
        arrays.append((array, offset))
        offset += -(-array.nbytes // ALIGN) * ALIGN
        return len(arrays) - 1

    matrices = [[name, list(m.shape), [list(p) for p in m.parts], place(m.data),
                 None if m.bias is None else place(m.bias)] for name, m in model.matrices.items()]
    vectors = [[name, place(v)] for name, v in model.vectors.items()]
    return arrays, {"matrices": matrices, "vectors": vectors, "vocab_first_row": int(model.vocab_first_row)}, offset


def _model_of(index: dict, arrays: list[np.ndarray]) -> PackedModel:
    """The PackedModel an index describes, over its mapped arrays."""
    model = PackedModel(vocab_first_row=int(index["vocab_first_row"]))
    for name, shape, parts, data, bias in index["matrices"]:
        model.matrices[name] = PackedMatrix(arrays[data], (int(shape[0]), int(shape[1])),
                                            tuple(Part(str(p[0]), *map(int, p[1:])) for p in parts),
                                            None if bias is None else arrays[bias])
    for name, at in index["vectors"]:
        model.vectors[name] = arrays[at]
    return model


def load(key: str, directory: str, inputs: dict | None = None) -> PackedModel | None:
    """The PackedModel of `key` mapped from `directory`, or None (absent, of another format,
    made from other inputs than `inputs` when given, or unreadable: the caller packs)."""
    index_path, bin_path = os.path.join(directory, key + ".json"), os.path.join(directory, key + ".bin")
    if not os.path.exists(index_path):
        return None
    start = time.perf_counter()
    try:
        with open(index_path) as fh:
            index = json.load(fh)
        if index.get("format") != FORMAT:
            raise ValueError(f"format {index.get('format')!r}, this engine reads {FORMAT}")
        if inputs is not None and index.get("inputs") != inputs:
            raise ValueError("made from another checkpoint or setting under the same name")
        size = os.path.getsize(bin_path)
        if size != index["bytes"]:
            raise ValueError(f"{bin_path} holds {size} bytes, its index says {index['bytes']}")
        arrays = []
        share = None
        if size:
            mm = _map(bin_path, size)
            share = huge_page_share(_address(mm))
            for dtype, shape, offset in index["arrays"]:
                count = int(np.prod(shape)) if shape else 1
                arrays.append(np.frombuffer(mm, np.dtype(dtype), count, offset).reshape(shape))
        model = _model_of(index["model"], arrays)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        log.warning("packed weights %s not used (%s): packing again", bin_path, e)
        return None
    log.info("packed weights mapped from %s (%.1f MB%s) in %.2f s", bin_path, size / 1e6,
             "" if share is None else f", {share:.0%} in 2 MB pages", time.perf_counter() - start)
    return model


def _map(path: str, size: int) -> mmap.mmap:
    """path mapped copy-on-write, asked for 2 MB pages and brought into the page tables: a decode
    step streams every weight, and on 4 KB pages it walks the page tables every 4 KB and evicts
    every other translation from the TLB (2 MB pages: 3-7 % more decode tokens/s measured on the
    1.1B Q4_K_M and 135M models, BENCHMARKS.md)."""
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    for advice in (getattr(mmap, "MADV_HUGEPAGE", None), _MADV_POPULATE_READ):
        if advice is not None:
            try:
                mm.madvise(advice)
            except (OSError, ValueError):
                pass     # older kernels: 4 KB pages, mapped as the first step reads them
    return mm


def _address(mm: mmap.mmap) -> int:
    view = np.frombuffer(mm, np.uint8)
    return view.ctypes.data


def _drop_cached(path: str) -> None:
    """Drop path's clean, unmapped pages from the page cache, so the next read brings it in anew."""
    if hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def huge_page_share(address: int) -> float | None:
    """The share of the resident bytes of the mapping holding `address` that 2 MB page-table
    entries map (file or anonymous), from /proc/self/smaps; None where the system does not say."""
    try:
        with open("/proc/self/smaps") as fh:
            text = fh.read()
    except OSError:
        return None
    rss = huge = 0
    inside = False
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if " " in key:                   # a mapping's first line: "start-end perms offset ..."
            if inside:
                break
            lo, _, hi = key.partition(" ")[0].partition("-")
            inside = int(lo, 16) <= address < int(hi, 16)
        elif inside and key in ("Rss", "FilePmdMapped", "AnonHugePages"):
            kb = int(rest.split()[0])
            if key == "Rss":
                rss = kb
            else:
                huge += kb
    return huge / rss if inside and rss else None


def _remove_orphans(directory: str) -> None:
    """Temporary files of writers whose process is gone (killed mid-write)."""
    for name in os.listdir(directory):
        m = re.fullmatch(r"\.[0-9a-f]+\.(\d+)\.\d+\.(bin|json)", name)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
        except OSError:
            pass


def _slot(inputs: dict) -> tuple:
    """What an entry is for, apart from the versions of its inputs: the checkpoint's paths, the
    dtype, quantization and rank, and the kernel module's path."""
    kernels = inputs.get("kernels")
    return (tuple(f[0] for f in inputs.get("files") or ()), inputs.get("dtype"), inputs.get("quantization"),
            repr(inputs.get("rank")), kernels[0] if kernels else None)


def _remove_superseded(key: str, inputs: dict, directory: str) -> None:
    """Entries of the same slot as (key, inputs) made from other versions of its inputs."""
    slot = _slot(inputs)
    for name in os.listdir(directory):
        m = re.fullmatch(r"([0-9a-f]+)\.json", name)
        if not m or m.group(1) == key:
            continue
        index_path = os.path.join(directory, name)
        try:
            with open(index_path) as fh:
                other = json.load(fh).get("inputs")
            if not isinstance(other, dict) or _slot(other) != slot:
                continue
            bin_path = os.path.join(directory, m.group(1) + ".bin")
            size = os.path.getsize(bin_path) if os.path.exists(bin_path) else 0
            for path in (index_path, bin_path):
                if os.path.exists(path):
                    os.unlink(path)
        except (OSError, ValueError, AttributeError, TypeError):
            continue
        log.info("packed weights %s removed: superseded by %s (%.1f MB freed)", os.path.join(directory, m.group(1)),
                 key, size / 1e6)


def save(key: str, inputs: dict, model: PackedModel, directory: str) -> None:
    """Write the PackedModel under `key` (temporary names, then renamed: a reader sees a whole
    entry or none). Skipped, with a log line, when the disk is short of room."""
    arrays, described, total = _layout(model)
    os.makedirs(directory, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < total + (1 << 30):
        log.info("packed weights not kept in %s: %.1f GB free, %.1f GB needed beside 1 GiB of room",
                 directory, free / 1e9, total / 1e9)
        return
    _remove_orphans(directory)
    start = time.perf_counter()
    tmp = f".{key}.{os.getpid()}.{threading.get_ident()}"
    bin_tmp, index_tmp = os.path.join(directory, tmp + ".bin"), os.path.join(directory, tmp + ".json")
    try:
        with open(bin_tmp, "wb") as fh:
            for array, offset in arrays:
                fh.seek(offset)
                fh.write(memoryview(array.reshape(-1).view(np.uint8)))
            fh.truncate(total)
            fh.flush()
            os.fsync(fh.fileno())
        # the written pages leave the page cache (clean after the sync): the first start that maps
        # the entry reads it anew, into 2 MB pages where the file system allows (see _map), instead
        # of finding the 4 KB pages the writes left
        _drop_cached(bin_tmp)
        index = {"format": FORMAT, "bytes": total, "inputs": inputs,
                 "arrays": [[array.dtype.str, list(array.shape), offset] for array, offset in arrays],
                 "model": described}
        with open(index_tmp, "w") as fh:
            json.dump(index, fh)
        os.replace(bin_tmp, os.path.join(directory, key + ".bin"))
        os.replace(index_tmp, os.path.join(directory, key + ".json"))
    except OSError as e:
        log.warning("packed weights not kept in %s: %s", directory, e)
        for path in (bin_tmp, index_tmp):
            try:
                os.unlink(path)
            except OSError:
                pass
        return
    log.info("packed weights kept in %s (%.1f MB, %.1f s): the next start maps them",
             os.path.join(directory, key + ".bin"), total / 1e6, time.perf_counter() - start)
    _remove_superseded(key, inputs, directory)


class PackedWeights:
    """The PackedModel of one load and its cache entry: `model` mapped from the cache at
    construction when it has the entry (`mapped`), else None until the caller packs and hands
    it over (packed(), model/pack.py does); `kept` is the thread writing a new entry (None when
    mapped, or when the cache is off), started by keep()."""

    def __init__(self, loaded, dtype: str, quantization: str | None, shard, kernels):
        self.directory = _config.packed_cache_dir()
        found = key_of(loaded, dtype, quantization, shard, kernels) if self.directory else None
        self.key, self.inputs = found if found else (None, None)
        self.kept: threading.Thread | None = None
        self.model: PackedModel | None = load(self.key, self.directory, self.inputs) if self.key else None
        self.mapped = self.model is not None

    def packed(self, model: PackedModel) -> None:
        """The freshly packed model of this load (the cache had none): keep() writes it."""
        self.model = model

    def keep(self) -> None:
        """Write a freshly packed entry in the background (the engine starts serving meanwhile)."""
        if self.key is None or self.mapped or self.model is None:
            return
        self.kept = threading.Thread(target=save, args=(self.key, self.inputs, self.model, self.directory),
                                     name="lite_llm-packed-cache", daemon=True)
        self.kept.start()
