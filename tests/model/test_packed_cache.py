"""Packed weights kept between starts (lite_llm/model/packed_cache.py): an entry maps back to
exactly the PackedModel packing gives, a second start maps it and generates the same tokens and
logprobs, and a changed checkpoint, a different dtype, a damaged entry, the cache turned off
or a full disk each fall back to packing."""
from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest

from lite_llm import LLM, SamplingParams
from lite_llm._kernels import kernels
from lite_llm._kernels.packed import PackedModel
from lite_llm.model import packed_cache
from lite_llm.model.loader import default_model_path, load_model
from lite_llm.model.pack import pack_checkpoint

GREEDY = SamplingParams(temperature=0, max_tokens=6, logprobs=3)


def same_array(x: np.ndarray, y: np.ndarray, name: str) -> None:
    assert isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape, name
    assert x.tobytes() == y.tobytes(), name
    assert y.ctypes.data % 64 == 0 and y.flags.writeable, name


def same_model(a: PackedModel, b: PackedModel) -> None:
    assert list(a.matrices) == list(b.matrices) and list(a.vectors) == list(b.vectors)
    assert a.vocab_first_row == b.vocab_first_row
    for name, m in a.matrices.items():
        got = b.matrices[name]
        assert m.shape == got.shape and m.parts == got.parts, name
        assert [type(v) for p in m.parts for v in p] == [type(v) for p in got.parts for v in p], name
        same_array(m.data, got.data, name)
        assert (m.bias is None) == (got.bias is None), name
        if m.bias is not None:
            same_array(m.bias, got.bias, name + ".bias")
    for name, v in a.vectors.items():
        same_array(v, b.vectors[name], name)


@pytest.mark.parametrize("which", ["gguf", "bf16", "fp8"])
def test_an_entry_maps_back_to_exactly_the_packed_tensors(which, tiny_checkpoint, tmp_path):
    """Block-format panels (the default model's Q4_1 and Q8_0), bf16 panels, FP8 panels, biases
    and fp32 vectors, with their shapes and block parts, byte for byte."""
    if which == "gguf":
        loaded = load_model(default_model_path(), progress=False)
    elif which == "fp8":
        from model.test_fp8 import write_fp8
        write_fp8(tiny_checkpoint("qwen3", hidden_size=256, head_dim=32), tmp_path / "fp8", "block")
        loaded = load_model(str(tmp_path / "fp8"), dtype="bfloat16", progress=False)
        tmp_path = tmp_path / "cache"
        tmp_path.mkdir()
    else:
        loaded = load_model(str(tiny_checkpoint("qwen2")), dtype="bfloat16", progress=False)
    packed = pack_checkpoint(loaded, loaded.dtype, 2)
    key, inputs = packed_cache.key_of(loaded, loaded.dtype, None, None, kernels)
    packed_cache.save(key, inputs, packed, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [key + ".bin", key + ".json"]
    if which == "bf16":
        assert any(m.bias is not None for m in packed.matrices.values())    # Qwen2's qkv bias
    if which == "fp8":
        assert packed.matrices["layers.0.gate_up"].formats == ("F8_E4M3",)
    same_model(packed, packed_cache.load(key, str(tmp_path)))


def test_a_second_start_maps_the_kept_weights_and_generates_the_same(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LITE_LLM_PACKED_CACHE", str(tmp_path))
    prompts = ["The capital of France is", "def add(a, b):"]
    first = LLM()
    runner = first.llm_engine.runner
    assert not runner.packed.mapped
    want = first.generate(prompts, GREEDY)
    runner.packed.kept.join()
    first.shutdown()
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".bin")]) == 1
    with caplog.at_level(logging.INFO, logger="lite_llm"):
        second = LLM()
    assert second.llm_engine.runner.packed.mapped and second.llm_engine.runner.packed.kept is None
    assert "packed weights mapped from" in caplog.text
    got = second.generate(prompts, GREEDY)
    second.shutdown()
    for w, g in zip(want, got):
        assert w.outputs[0].token_ids == g.outputs[0].token_ids
        assert w.outputs[0].logprobs == g.outputs[0].logprobs


def test_a_changed_checkpoint_or_dtype_is_another_entry(tiny_checkpoint, tmp_path):
    src = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("llama"), src)
    loaded = load_model(str(src), dtype="float32", progress=False)
    key, _ = packed_cache.key_of(loaded, "float32", None, None, kernels)
    assert packed_cache.key_of(loaded, "float32", None, None, kernels)[0] == key
    assert packed_cache.key_of(loaded, "bfloat16", None, None, kernels)[0] != key
    assert packed_cache.key_of(loaded, "float32", "q8_0", None, kernels)[0] != key
    weights = src / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert packed_cache.key_of(loaded, "float32", None, None, kernels)[0] != key


def test_a_new_entry_removes_the_entries_it_supersedes(tiny_checkpoint, tmp_path, caplog):
    """The same checkpoint path, dtype, quantization, rank and kernel module: an older version of
    the file's entry goes once the new one is written; another dtype or checkpoint stays."""
    src, other = tmp_path / "model", tmp_path / "other"
    shutil.copytree(tiny_checkpoint("llama"), src)
    shutil.copytree(tiny_checkpoint("llama"), other)
    cache = tmp_path / "cache"
    tensors = PackedModel(vectors={"x": np.ones(4, np.float32)})

    def keep(path, dtype):
        loaded = load_model(str(path), dtype=dtype, progress=False)
        key, inputs = packed_cache.key_of(loaded, dtype, None, None, kernels)
        packed_cache.save(key, inputs, tensors, str(cache))
        return key

    old, bf16, elsewhere = keep(src, "float32"), keep(src, "bfloat16"), keep(other, "float32")
    assert len(os.listdir(cache)) == 6
    weights = src / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    with caplog.at_level(logging.INFO, logger="lite_llm"):
        new = keep(src, "float32")
    assert new != old
    assert sorted(os.listdir(cache)) == sorted(f"{k}.{ext}" for k in (new, bf16, elsewhere) for ext in ("bin", "json"))
    assert f"{old} removed: superseded by {new}" in caplog.text


def test_an_entry_of_other_inputs_under_the_same_name_is_not_used(tmp_path, caplog):
    """Entry names are checksums: the index's inputs are compared whole before anything is mapped."""
    packed_cache.save("feed", {"files": ["a"]}, PackedModel(vectors={"x": np.ones(4, np.float32)}), str(tmp_path))
    assert packed_cache.load("feed", str(tmp_path), {"files": ["a"]}).vectors["x"].tolist() == [1, 1, 1, 1]
    with caplog.at_level(logging.WARNING, logger="lite_llm"):
        assert packed_cache.load("feed", str(tmp_path), {"files": ["b"]}) is None
    assert "another checkpoint" in caplog.text


def test_a_damaged_entry_is_packed_again_with_a_warning(tiny_checkpoint, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LITE_LLM_PACKED_CACHE", str(tmp_path / "cache"))
    path = str(tiny_checkpoint("llama"))
    first = LLM(path, dtype="float32", kv_cache_space=0.01)
    want = first.generate(["hello world"], GREEDY)[0].outputs[0]
    first.llm_engine.runner.packed.kept.join()
    first.shutdown()
    (bin_path,) = (tmp_path / "cache").glob("*.bin")
    with open(bin_path, "r+b") as fh:
        fh.truncate(bin_path.stat().st_size - 4096)
    with caplog.at_level(logging.WARNING, logger="lite_llm"):
        second = LLM(path, dtype="float32", kv_cache_space=0.01)
    assert not second.llm_engine.runner.packed.mapped
    assert "not used" in caplog.text and "packing again" in caplog.text and bin_path.name in caplog.text
    got = second.generate(["hello world"], GREEDY)[0].outputs[0]
    second.llm_engine.runner.packed.kept.join()      # the entry is written whole again
    second.shutdown()
    assert got.token_ids == want.token_ids and got.logprobs == want.logprobs
    third = LLM(path, dtype="float32", kv_cache_space=0.01)
    assert third.llm_engine.runner.packed.mapped
    third.shutdown()


def test_off_or_a_full_disk_keeps_nothing(tiny_checkpoint, tmp_path, monkeypatch, caplog):
    path = str(tiny_checkpoint("llama"))
    monkeypatch.setenv("LITE_LLM_PACKED_CACHE", "off")
    llm = LLM(path, dtype="float32", kv_cache_space=0.01)
    assert llm.llm_engine.runner.packed.kept is None
    llm.shutdown()
    monkeypatch.setenv("LITE_LLM_PACKED_CACHE", str(tmp_path))
    monkeypatch.setattr(packed_cache.shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(1, 1, 0))
    with caplog.at_level(logging.INFO, logger="lite_llm"):
        llm = LLM(path, dtype="float32", kv_cache_space=0.01)
        llm.llm_engine.runner.packed.kept.join()
    llm.shutdown()
    assert "packed weights not kept" in caplog.text and "GB free" in caplog.text
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".bin", ".json"))]


def test_a_writer_killed_mid_write_leaves_nothing_read_and_its_files_are_removed(tmp_path):
    orphan = tmp_path / ".0123abcd.999999999.1.bin"     # no such process
    orphan.write_bytes(b"partial")
    mine = tmp_path / f".0123abcd.{os.getpid()}.1.bin"   # a live writer's
    mine.write_bytes(b"partial")
    assert packed_cache.load("0123abcd", str(tmp_path)) is None
    packed_cache.save("4567ef", {}, PackedModel(vectors={"x": np.arange(3, dtype=np.float32)}), str(tmp_path))
    assert not orphan.exists() and mine.exists()
    assert packed_cache.load("4567ef", str(tmp_path)).vectors["x"].tolist() == [0, 1, 2]


def test_an_entry_of_the_previous_format_is_packed_again_and_removed(tiny_checkpoint, tmp_path, monkeypatch,
                                                                     caplog):
    """An entry of format 1 (flat "<name>.weight" / ".shape" / ".parts" tensors) for the same
    checkpoint is neither found under the new key nor read under its own: the load packs again,
    and writing the new entry removes the old one."""
    import json

    from lite_llm.model.pack import packed_weights
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("LITE_LLM_PACKED_CACHE", str(cache))
    loaded = load_model(str(tiny_checkpoint("llama")), dtype="float32", progress=False)
    key, inputs = packed_cache.key_of(loaded, "float32", None, None, kernels)
    assert inputs["format"] == packed_cache.FORMAT == 2
    old = dict(inputs, format=1)
    (cache / "00c0ffee.bin").write_bytes(b"\0" * 16)
    (cache / "00c0ffee.json").write_text(json.dumps({
        "format": 1, "bytes": 16, "inputs": old, "order": ["final_norm.weight"],
        "arrays": [["final_norm.weight", "<f4", [4], 0]], "other": {}}))
    with caplog.at_level(logging.WARNING, logger="lite_llm"):
        assert packed_cache.load("00c0ffee", str(cache), old) is None
    assert "format 1" in caplog.text
    found = packed_weights(loaded, "float32", 2, None)
    assert not found.mapped and found.model.matrices["layers.0.qkv"].shape[1] == loaded.config.dim
    found.keep()
    found.kept.join()
    assert sorted(os.listdir(cache)) == [key + ".bin", key + ".json"]
    loaded.release()


def _thp_enabled() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            return "[never]" not in fh.read()
    except OSError:
        return False


def test_an_entry_is_mapped_in_2mb_pages_where_the_system_allows(tmp_path, caplog):
    """A decode step streams every weight: on 4 KB pages that evicts every other translation from
    the TLB. The writer leaves no 4 KB pages of the entry in the page cache and the reader asks
    for 2 MB ones, so a mapped entry is (nearly) all 2 MB pages where transparent huge pages
    and the file system allow, which the load's log line says; a copy written the plain way and
    left in the page cache is mapped in 4 KB pages on the same file system (the comparison the
    test stands on: the drop is what makes the difference)."""
    loaded = load_model(default_model_path(), progress=False)
    packed = pack_checkpoint(loaded, loaded.dtype, 2)
    key, inputs = packed_cache.key_of(loaded, loaded.dtype, None, None, kernels)
    packed_cache.save(key, inputs, packed, str(tmp_path))
    with caplog.at_level(logging.INFO, logger="lite_llm"):
        model = packed_cache.load(key, str(tmp_path))
    same_model(packed, model)
    first = next(iter(model.matrices.values())).data
    share = packed_cache.huge_page_share(first.ctypes.data)
    assert share is not None and f"{share:.0%} in 2 MB pages" in caplog.text
    plain = tmp_path / "plain.bin"
    with open(tmp_path / (key + ".bin"), "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)            # its pages stay in the page cache as written
    size = os.path.getsize(plain)
    import mmap
    with open(plain, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    mm.madvise(mmap.MADV_HUGEPAGE)
    view = np.frombuffer(mm, np.uint8)
    view[::4096].sum()                          # fault every page in
    plain_share = packed_cache.huge_page_share(view.ctypes.data)
    assert share >= plain_share
    if _thp_enabled() and plain_share < 0.5:
        # this system maps file pages in 2 MB where they were read as such: the entry must be
        assert share >= 0.9, (share, plain_share)
